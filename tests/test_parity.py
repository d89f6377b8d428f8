"""streamidx.lab.studies.parity: notebook 05's studies: page coverage, the
causal-rule diff, boundary ties and approx_max_k (references and hand-made
arrays only; no kernel runs here).
"""

from __future__ import annotations

import numpy as np
import pytest

import streamidx as si
from streamidx import ref
from streamidx.lab.studies import parity

import oracle


# ---------------------------------------------------------------------------
# Page coverage.


def test_page_coverage_on_a_hand_checked_example():
  token_topk = np.array([[0, 5, 9, -1], [-1, -1, -1, -1], [3, 2, -1, -1]])
  page_topk = np.array([[0, 2], [0, -1], [1, -1]])
  scores = np.zeros((3, 12))
  scores[0, [0, 5, 9]] = [4.0, 3.0, 1.0]
  scores[2, [3, 2]] = [2.0, 2.0]
  cov = parity.page_coverage(token_topk, page_topk, 4, scores)
  # Row 0: entries 0 (page 0), 5 (page 1), 9 (page 2); pages 0 and 2 kept.
  # Row 1 has no tokens and is skipped. Row 2: entries 3, 2 in page 0, not 1.
  np.testing.assert_array_equal(cov.rows, [0, 2])
  np.testing.assert_allclose(cov.per_row_count, [2 / 3, 0.0])
  np.testing.assert_allclose(cov.per_row_mass, [5 / 8, 0.0])
  assert cov.count == pytest.approx(1 / 3)
  assert cov.mass == pytest.approx(5 / 16)


def test_page_coverage_rejects_negative_scores():
  with pytest.raises(ValueError, match="scores"):
    parity.page_coverage(np.array([[0]]), np.array([[0]]), 4,
                         np.array([[-1.0, 0, 0, 0]]))


@pytest.mark.parametrize("page_size", [16, 32])
def test_page_coverage_is_one_when_k_pages_covers_every_page(page_size):
  b = si.make_batch([(4, 256), (3, 200)], page_size=page_size,
                    compression_ratio=1, allocation="fragmented")
  inp = si.make_inputs(b, num_heads=4, fmt="fp8")
  scores = ref.token_scores(*inp.args, compression_ratio=1)
  token_topk = ref.topk_from_scores(scores, 64)
  page_topk = si.streamindex_page_topk_ref(*inp.page_args,
                                           k_pages=b.pages_per_seq)
  cov = parity.page_coverage(token_topk, page_topk, page_size, scores)
  assert cov.count == cov.mass == 1.0
  assert len(cov.rows) == b.num_query_tokens
  # One page fewer than needed leaves something out.
  fewer = si.streamindex_page_topk_ref(*inp.page_args, k_pages=1)
  assert parity.page_coverage(token_topk, fewer, page_size, scores).count < 1


# ---------------------------------------------------------------------------
# The causal rule.


def _causal_inputs(ratio):
  # Trailing incomplete blocks (seq_len % ratio != 0) and a from-scratch
  # prefill; two sequences.
  b = si.make_mixed_batch(prefill=[(2 * ratio + 3, 9 * ratio + 1),
                                   (3 * ratio, 3 * ratio)],
                          page_size=16, compression_ratio=ratio)
  return si.make_inputs(b, num_heads=4, fmt="fp8")


@pytest.mark.parametrize("ratio", [2, 4])
def test_causal_diff_finds_exactly_the_rows_whose_bound_differs(ratio):
  inp = _causal_inputs(ratio)
  b = inp.batch
  d = parity.causal_rule_diff(inp, k=64, compression_ratio=ratio)  # k > all
  pos = b.token_positions()
  seq = b.token_seq_ids()
  kv_len = b.seq_lens[np.maximum(seq, 0)] // ratio
  want = (seq >= 0) & ((pos + 1) % ratio != 0) & (pos // ratio < kv_len)
  assert want.any() and (~want & (seq >= 0)).any()
  np.testing.assert_array_equal(d.bound_differs, want)
  np.testing.assert_array_equal(d.leaked_entry, np.where(want, pos // ratio, -1))
  # k above every visible count: each such row gains exactly the leaked entry.
  np.testing.assert_array_equal(d.selection_differs, want)
  np.testing.assert_array_equal(d.entries_changed, want.astype(int))
  np.testing.assert_array_equal(d.leaked_selected, want)
  assert d.rows_changed == int(want.sum())


@pytest.mark.parametrize("ratio", [2, 4])
def test_causal_diff_with_small_k_changes_only_rows_whose_bound_differs(ratio):
  inp = _causal_inputs(ratio)
  d = parity.causal_rule_diff(inp, k=2, compression_ratio=ratio)
  assert not np.any(d.selection_differs & ~d.bound_differs)
  assert np.all(d.entries_changed <= 1)
  # The seed's top-k differs from the model's exactly when it took the leak.
  np.testing.assert_array_equal(d.selection_differs, d.leaked_selected)
  assert np.all((d.leaked_rank >= 0) == d.leaked_selected)
  assert np.all((d.leaked_mass > 0) <= d.leaked_selected)
  assert np.all(d.leaked_mass <= 1.0)


# ---------------------------------------------------------------------------
# Ties and approx_max_k.


def test_boundary_ties_on_hand_checked_rows():
  scores = np.array([[5.0, 3.0, 3.0, 3.0, 1.0, -np.inf],
                     [4.0, 3.0, 2.0, 1.0, 0.0, 0.0],
                     [2.0, 0.0, 0.0, -np.inf, -np.inf, -np.inf]])
  t = parity.boundary_ties(scores, 2)
  # Row 0: 2nd (3) == 3rd (3); row 1: 3 > 2; row 2: 0 == 0 (a ReLU tie).
  np.testing.assert_array_equal(t.tied_rows, [0, 2])
  assert t.rows == 3 and t.zero_tied_rows == 1
  np.testing.assert_array_equal(t.group_sizes, [3, 2])
  np.testing.assert_array_equal(t.slots, [1, 1])


@pytest.mark.parametrize("selection, kind", [
    ([0, 1], "lowest_index"), ([0, 3], "highest_index"), ([2, 0], "other"),
    ([4, 0], "not_a_tie_member")])
def test_tie_breaks_names_the_choice(selection, kind):
  # Entries 1, 2, 3 tie at 3.0 for the one slot left after entry 0.
  scores = np.array([[5.0, 3.0, 3.0, 3.0, 1.0, -np.inf]])
  t = parity.boundary_ties(scores, 2)
  counts = parity.tie_breaks(np.array([selection]), scores, t)
  assert counts[kind] == 1 and sum(counts.values()) == 1, counts


def test_rows_seeing_k_or_fewer_entries_have_no_boundary():
  scores = np.array([[1.0, 1.0, -np.inf]])
  assert parity.boundary_ties(scores, 2).rows == 0


def test_approx_max_k_with_recall_one_is_top_k_on_cpu():
  rng = np.random.default_rng(0)
  scores = rng.standard_normal((4, 4096)).astype(np.float32)
  scores[:, ::7] = 0.0  # ties, too
  for k in (1, 64, 1000):
    a = parity.approx_topk_agreement(scores, k)
    assert a == {"values_equal": True, "indices_equal": True,
                 "sets_equal": True}, k


def test_tpu_approx_top_k_keeps_every_candidate_at_recall_one():
  n = 65536
  size = parity.approx_topk_reduction_size(n, 512, 1.0)
  if size is None:
    pytest.skip("this jaxlib does not expose XLA's ApproxTopK sizing")
  assert size == n
  assert parity.approx_topk_reduction_size(n, 64, 0.95) < n


# ---------------------------------------------------------------------------
# One sequence slot.


def test_reference_scores_one_sequence_slot_with_several_rows():
  # XLA:CPU (jaxlib 0.10.2) miscompiled the reference's batched dot here (the
  # per-token gather became a broadcast); streamidx/ref.py works around it.
  b = si.make_batch([(2, 4 * 256)], page_size=128, compression_ratio=4)
  inp = si.make_inputs(b, num_heads=8, fmt="bf16")
  got = np.asarray(ref.token_scores(*inp.args, compression_ratio=4))
  want = oracle.scores(np.asarray(inp.q, np.float32), inp.weights, inp.cache,
                       b.seq_lens, b.page_indices, b.cu_q_lens, b.num_seqs,
                       ratio=4)
  fin = np.isfinite(want)
  np.testing.assert_allclose(got[fin], want[fin], rtol=1e-4, atol=1e-3)


# ---------------------------------------------------------------------------
# Notebook 05's tables: the parity run, the causal summary, coverage, ties.


def _fake_run():
  from streamidx.lab.studies import cases
  names = ["vendored/decode_only_r1_fp8_k8", "vendored/decode_only_r1_bf16_k8",
           "dense/decode_only_r1_dense_fp8_k8", "dense/all_at_once_r2_dense_fp8_k8"]
  matrix = [cases.case_by_name(n) for n in names]

  def row(case, ties, ok=True):
    return cases.ParityRow(
        case=case.name, launches="", rows=48, rows_k_over_visible=0,
        max_score_diff=0.0, sets_agree=ties == 0, differing_positions=ties,
        tied_positions=ties, rows_mismatched=0 if ok else 1, atol=1e-3,
        detail="", seconds=1.0)
  rows = [row(matrix[0], 0), row(matrix[1], 2), row(matrix[2], 0),
          row(matrix[3], 0, ok=False)]
  return parity.ParityRun(tuple(matrix), tuple(rows), {}, 4.0)


def test_parity_run_summarizes_per_variant_and_side_by_side():
  run = _fake_run()
  assert [r.case for r in run.failures] == ["dense/all_at_once_r2_dense_fp8_k8"]
  s = run.summary()
  assert (s["cases"], s["failures"], s["tied_positions"]) == (4, 1, 2)
  by = {(r["variant"], r["format"]): r for r in run.by_variant()}
  assert by[("dense", "dense_fp8")]["cases"] == 2
  assert by[("dense", "dense_fp8")]["mismatched_rows"] == 1
  assert by[("vendored", "bf16")]["ties"] == 2
  table = run.side_by_side()
  assert len(table) == 2  # decode_only at ratio 1; all_at_once at ratio 2
  decode = next(r for r in table if r["batch"] == "decode_only")
  assert (decode["vendored fp8"], decode["vendored bf16"],
          decode["dense dense_fp8"]) == ("=", "= (2 ties)", "=")
  other = next(r for r in table if r["batch"] == "all_at_once")
  assert other["dense dense_fp8"] == "MISMATCH" and other["vendored fp8"] == ""


@pytest.mark.parametrize("ratio", [2, 4])
def test_causal_summary_counts_what_the_diff_found(ratio):
  inp = _causal_inputs(ratio)
  d = parity.causal_rule_diff(inp, k=2, compression_ratio=ratio)
  s = parity.causal_summary(d, inp.batch, compression_ratio=ratio)
  assert s["rows_bound_differs"] == int(d.bound_differs.sum())
  assert s["rows_bound_differs"] <= s["rows_incomplete_block"] <= s["live_rows"]
  assert s["rows_changed"] == d.rows_changed
  assert len(s["leaked_ranks"]) == s["leaked_selected_rows"]
  assert sum(p["rows_bound_differs"] for p in s["per_sequence"]) == s["rows_bound_differs"]
  assert [p["q_len"] for p in s["per_sequence"]] == list(inp.batch.q_lens[:2])


def test_page_coverage_study_is_complete_when_the_budget_holds_every_entry():
  cov = parity.page_coverage_study(page_entries=64, page_rows=2, page_sizes=[16],
                                   budgets=[16, 62], num_heads=2)
  assert cov["fp8"]["count"].shape == (2, 1)
  # At a budget of 62 of 64 entries the top 3 of 4 pages hold most of it.
  assert cov["f32"]["count"][1, 0] >= cov["f32"]["count"][0, 0]
  assert np.all((cov["fp8"]["mass"] >= 0) & (cov["fp8"]["mass"] <= 1))


def test_approx_and_tie_rows_name_each_k_and_format():
  scores = np.array([[3.0, 1.0, 1.0, 0.0], [2.0, 2.0, 1.0, 0.5]], np.float32)
  rows = parity.approx_rows(np.array([[3.0, 1.0, 2.0, 0.0]], np.float32), [1, 2])
  assert [(r["recall_target"], r["k"]) for r in rows] == [(1.0, 1), (1.0, 2), (0.95, 1), (0.95, 2)]
  assert all(r["sets_equal"] for r in rows)
  ties = parity.tie_rate_rows({"a": scores}, [1, 2])
  # k=1: row 1 ties (2 == 2); k=2: row 0 ties (1 == 1).
  assert ties == [dict(format="a", tied=2, of_row_k_pairs=4)]
  sizing = parity.tpu_sizing_rows([1024], [16])
  assert sizing[0]["n"] == 1024 and set(sizing[0]) == {"n", "k", "kept_at_1.0", "kept_at_0.95"}


def test_page_coverage_rows_put_each_budget_and_page_size_beside_random_pages():
  cov = {f: {m: np.array([[0.5, 0.25]]) for m in ("count", "mass")} for f in ("fp8", "f32")}
  rows = parity.page_coverage_rows(cov, [16, 32], [64], page_entries=1024)
  assert [(r["page_size"], r["pages"], r["k_pages"]) for r in rows] == [(16, 64, 4), (32, 32, 2)]
  assert rows[1]["fp8_count"] == "0.2500" and rows[0]["random"] == "0.0625"


def _results(**changes):
  out = dict(
      machine="cpu", kernel_mode="interpret", backend="cpu",
      parity=dict(summary=dict(cases=4, scope="ci", compilations=2, rows=32, identical_cases=3,
                               differing_positions=2, max_score_diff=0.0, max_atol=1e-5)),
      races=[dict(case="a", races_found=False)],
      long_kernel_check=dict(rows=8, identical=7, tied=1, seconds=1.0),
      causal=dict(k=16, rows_changed=5, live_rows=48, rows_bound_differs=30,
                  leaked_mass_mean=0.1, leaked_mass_max=0.2),
      page_coverage=dict(entries=1024, quote=dict(budget=64, page_size=16, count=0.5, mass=0.6)),
      approx_max_k=dict(identical_here=True, sizing_available=True, keeps_all_at_recall_1=True),
      ties=dict(long_batch=[dict(format="fp8", tied=0, of_row_k_pairs=48)],
                ties_case=dict(name="t", tied_rows=3, rows=8, kernel=dict(kept_lowest_index=3),
                               reference=dict(kept_lowest_index=3))),
      notebook_seconds=12.0)
  out.update(changes)
  return out


def test_answer_markdown_states_parity_races_and_the_long_context_check():
  by_variant = [dict(variant="vendored", format="fp8", cases=4, ties=2)]
  text = parity.answer_markdown(_results(), by_variant=by_variant, race_skip=None, k=64, max_entries=4096)
  assert "every variant matched the exact reference on all 4 cases** of the 'ci' matrix" in text
  assert "none found on 1 cases (a)" in text
  assert "top-64 on all 8 rows of sequences up to 4096 entries (1 rows differing only by ties)" in text
  assert "changes the top-16 of\n  5 of 48 query rows" in text
  assert "random pages:\n  6.2%" in text and "kept lowest index 3" in text
  text = parity.answer_markdown(_results(races=[], long_kernel_check=None), by_variant=by_variant,
                                race_skip="no internals", k=64, max_entries=4096)
  assert "not run (no internals)" in text and "kernel not run (long_kernel_check=False)" in text
