"""streamidx.lab.studies.parity: the case matrix, the parity check (and that it can fail),
page coverage, the causal-rule diff, boundary ties and the tie tolerance
(`comparison_atol`, the derived summation bound).

Only `test_case_runs_green` and the corruption tests run the kernel (two
compilations, shared through a module-level cache); the rest use the
reference or hand-made arrays.
"""

from __future__ import annotations

import dataclasses
import functools

import jax.numpy as jnp
import numpy as np
import pytest

import streamidx as si
from streamidx import metrics, ref
from streamidx.lab.studies import parity

import oracle

GREEN_CASES = ("all_at_once_r4_fp8_k8", "page_all_at_once_fp8_kp3")


@functools.lru_cache(maxsize=None)
def _outputs(name: str) -> parity.CaseOutputs:
  return parity.case_outputs(parity.case_by_name(name))


# ---------------------------------------------------------------------------
# The matrix.


@pytest.mark.parametrize("scope", parity.SCOPES)
def test_case_names_are_unique(scope):
  names = [c.name for c in parity.case_matrix(scope)]
  assert len(names) == len(set(names))


def test_cases_are_frozen_and_hashable():
  case = parity.case_matrix("ci")[0]
  with pytest.raises(dataclasses.FrozenInstanceError):
    case.k = 3  # type: ignore[misc]
  assert len({case, dataclasses.replace(case)}) == 1


@pytest.mark.parametrize("scope", parity.SCOPES)
def test_cases_of_a_scope_share_one_static_shape(scope):
  # One compilation per (format, ratio, k, rule, mode, heads), not per case.
  shapes = set()
  for case in parity.case_matrix(scope):
    b = case.batch()
    shapes.add((b.num_tokens, b.max_num_seqs, b.pages_per_seq,
                b.total_num_pages, b.page_size))
  assert len(shapes) == 1, shapes


def test_pairwise_matrix_covers_every_pair_of_axis_values():
  token = [c for c in parity.case_matrix("pairwise")
           if not c.page_mode and c.causal_rule == "model"
           and c.num_heads == parity.NUM_HEADS]
  axes = {"fmt": parity.FORMATS, "ratio": parity.RATIOS,
          "k": (parity.K_BELOW, parity.K_ABOVE),
          "dist": tuple(parity.DISTRIBUTIONS)}
  seen = [dict(fmt=c.fmt, ratio=c.compression_ratio, k=c.k,
               dist=c.name.split("_r")[0]) for c in token]
  names = list(axes)
  for i, a in enumerate(names):
    for b in names[i + 1:]:
      want = {(x, y) for x in axes[a] for y in axes[b]}
      got = {(s[a], s[b]) for s in seen}
      assert want <= got, f"{a} x {b}: missing {sorted(want - got)}"
  cases = parity.case_matrix("pairwise")
  assert any(c.causal_rule == "seed" for c in cases)
  assert {c.fmt for c in cases if c.page_mode} == set(parity.FORMATS)
  assert {c.k for c in cases if c.page_mode} == {parity.K_PAGES_BELOW,
                                                 parity.K_PAGES_ABOVE}


def test_full_matrix_is_the_product():
  token = {(c.fmt, c.compression_ratio, c.k, c.name.split("_r")[0])
           for c in parity.case_matrix("full")
           if not c.page_mode and c.causal_rule == "model"
           and c.num_heads == parity.NUM_HEADS}
  assert len(token) == (len(parity.FORMATS) * len(parity.RATIOS) * 2 *
                        len(parity.DISTRIBUTIONS))


def test_k_above_exceeds_every_visible_count_and_k_below_does_not():
  for case in parity.case_matrix("full"):
    b = case.batch()
    live = b.token_seq_ids() >= 0
    visible = case.visible(b)[live]
    if case.k in (parity.K_ABOVE, parity.K_PAGES_ABOVE):
      assert np.all(visible <= case.k), case.name
    else:
      assert np.any(visible > case.k), case.name


def test_every_launch_runs_in_the_all_at_once_and_ties_cases():
  for case in (parity.case_by_name("all_at_once_r4_fp8_k8"),
               parity.TIES_CASE):
    launches = case.launches()
    for part in ("decode[4]", "decode[1]", "prefill", "mixed"):
      assert part in launches, (case.name, launches)


def test_ci_cases_belong_to_the_pairwise_matrix():
  pairwise = {c.name for c in parity.case_matrix("pairwise")}
  assert set(parity.CI_CASES) <= pairwise


def test_unknown_scope_and_name_are_rejected():
  with pytest.raises(ValueError, match="scope"):
    parity.case_matrix("everything")
  with pytest.raises(KeyError, match="no_such_case"):
    parity.case_by_name("no_such_case")


def test_total_num_pages_too_small_is_rejected():
  case = dataclasses.replace(parity.case_by_name("all_at_once_r1_fp8_k8"),
                             total_num_pages=3)
  with pytest.raises(ValueError, match="total_num_pages"):
    case.batch()


# ---------------------------------------------------------------------------
# Parity, and that the check can fail.


@pytest.mark.parametrize("name", GREEN_CASES)
def test_case_runs_green(name):
  case = parity.case_by_name(name)
  out = _outputs(name)
  atol = case.atol(out.inputs)
  row = parity.compare_case(case, out.got, out.want, out.scores, atol=atol,
                            b=out.inputs.batch)
  assert row.ok and row.sets_agree, row.detail
  assert row.atol == atol > 0
  assert row.max_score_diff == 0.0
  assert row.rows == parity.NUM_TOKENS
  assert row.rows_k_over_visible > 0  # some rows are padded with -1


def _corrupt_swap_for_worse(got, scores):
  """Replaces one selected entry by a visible entry that scores less."""
  got = got.copy()
  for r in range(got.shape[0]):
    sel = got[r][got[r] >= 0]
    vis = np.flatnonzero(np.isfinite(scores[r]))
    worse = [e for e in vis if e not in sel
             and scores[r, e] < scores[r, sel].min()]
    if len(sel) and worse:
      got[r, 0] = worse[0]
      return got
  raise AssertionError("no row to corrupt")


def _corrupt_drop(got, scores):
  del scores
  got = got.copy()
  r = int(np.flatnonzero((got >= 0).sum(axis=1) > 1)[0])
  got[r, 0] = -1
  return got


def _corrupt_repeat(got, scores):
  del scores
  got = got.copy()
  r = int(np.flatnonzero((got >= 0).sum(axis=1) > 1)[0])
  got[r, 1] = got[r, 0]
  return got


def _corrupt_invisible(got, scores):
  got = got.copy()
  for r in range(got.shape[0]):
    invisible = np.flatnonzero(~np.isfinite(scores[r]))
    if (got[r] >= 0).any() and len(invisible):
      got[r, 0] = invisible[0]
      return got
  raise AssertionError("no row to corrupt")


@pytest.mark.parametrize("corrupt", [_corrupt_swap_for_worse, _corrupt_drop,
                                     _corrupt_repeat, _corrupt_invisible],
                         ids=["swap_for_worse", "drop", "repeat",
                              "invisible"])
@pytest.mark.parametrize("name", GREEN_CASES)
def test_corrupted_kernel_output_is_reported_as_disagreement(name, corrupt):
  case = parity.case_by_name(name)
  out = _outputs(name)
  bad = corrupt(out.got, out.scores)
  row = parity.compare_case(case, bad, out.want, out.scores, atol=0.0,
                            b=out.inputs.batch)
  assert not row.ok and not row.sets_agree
  assert row.rows_mismatched == 1 and row.detail.startswith("row ")


def test_run_case_reports_a_corrupted_kernel_fn():
  # Through `run_case`'s own kernel hook (the reference stands in for the
  # kernel, so nothing compiles).
  case = parity.TIES_CASE
  row = parity.run_case(case, kernel_fn=lambda inp: _corrupt_swap_for_worse(
      np.asarray(case.run_reference(inp)), np.asarray(case.scores(inp))))
  assert not row.ok and row.rows_mismatched == 1


def test_swapping_tied_entries_is_accepted_as_a_tie():
  case = parity.TIES_CASE
  inp = case.inputs()
  scores = np.asarray(case.scores(inp))
  want = np.asarray(case.run_reference(inp))
  ties = parity.boundary_ties(scores, case.k)
  assert len(ties.tied_rows) > 0
  got = want.copy()
  r = int(ties.tied_rows[0])
  kth = np.sort(scores[r][np.isfinite(scores[r])])[::-1][case.k - 1]
  kept = [e for e in got[r] if e >= 0 and scores[r, e] == kth]
  spare = [e for e in np.flatnonzero(scores[r] == kth) if e not in got[r]]
  got[r, list(got[r]).index(kept[0])] = spare[0]
  row = parity.compare_case(case, got, want, scores, atol=0.0, b=inp.batch)
  assert row.ok and not row.sets_agree
  assert row.differing_positions == row.tied_positions == 2


# ---------------------------------------------------------------------------
# Tie tolerance.


def test_comparison_atol_is_the_summation_atol_and_small():
  case = parity.case_by_name("all_at_once_r4_fp8_k8")
  inp = case.inputs()
  atol = case.atol(inp)
  assert atol == parity.comparison_atol(
      inp, compression_ratio=4) == parity.accumulation_atol(
          inp, compression_ratio=4) == metrics.summation_atol(
              inp, compression_ratio=4)
  scores = np.asarray(case.scores(inp))
  largest = np.abs(scores[np.isfinite(scores)]).max()
  # A tolerance, not a waiver: a fraction of a percent of the scores. (The
  # worst-case bound is about 2e-4 of the largest score for these Gaussian
  # inputs at D = 128, H = 8.)
  assert 0 < atol < 1e-3 * largest


def _f32_query_inputs(case):
  """`case`'s batch with float32 queries that bf16 cannot hold."""
  inp = si.make_inputs(case.batch(), num_heads=case.num_heads,
                       head_dim=case.head_dim, fmt=case.fmt, seed=case.seed,
                       q_dtype=jnp.float32)
  q = np.asarray(inp.q)
  assert np.any(q != np.asarray(inp.q.astype(jnp.bfloat16), np.float32))
  return inp


@pytest.mark.parametrize("q_dtype", ["bf16", "f32"])
@pytest.mark.parametrize("fmt", ["fp8", "bf16"])
def test_summation_error_bound_bounds_the_f32_reference_error(fmt, q_dtype):
  # Row by row, the f32 reference is within `summation_error_bound` of a
  # float64 evaluation (tests/oracle.py) of the same (quantized) keys, on
  # every visible entry: the bound the tie tolerance (4x its max) rests on.
  case = dataclasses.replace(parity.case_by_name("all_at_once_r2_bf16_k8"),
                             fmt=fmt)
  inp = case.inputs() if q_dtype == "bf16" else _f32_query_inputs(case)
  bound = metrics.summation_error_bound(
      inp, compression_ratio=case.compression_ratio)
  b = inp.batch
  exact = oracle.scores(np.asarray(inp.q, np.float32), inp.weights, inp.cache,
                        b.seq_lens, b.page_indices, b.cu_q_lens, b.num_seqs,
                        ratio=case.compression_ratio)
  got = np.asarray(case.scores(inp), np.float64)
  fin = np.isfinite(exact)
  assert np.array_equal(fin, np.isfinite(got))
  err = np.where(fin, np.abs(got - np.where(fin, exact, 0.0)), 0.0)
  assert bound.shape == (b.num_tokens,)
  over = np.argwhere(err > bound[:, None])
  assert not len(over), f"error beyond the bound at (row, entry) {over[:5]}"
  assert err.max() > 0  # the reference does round: the check is not vacuous
  assert np.all(bound[fin.any(axis=1)] > 0)


def test_comparison_atol_counts_float32_query_products_on_cpu():
  # f32 queries: the D products q * k round too, n = 2D + H - 1 roundings
  # instead of D + H - 1, so the tolerance grows.
  case = parity.case_by_name("all_at_once_r4_fp8_k8")
  inp = case.inputs()
  inp32 = dataclasses.replace(inp, q=inp.q.astype(jnp.float32))
  atol32 = parity.comparison_atol(inp32, compression_ratio=4)
  assert atol32 == metrics.summation_atol(inp32, compression_ratio=4)
  d, h, u = case.head_dim, case.num_heads, 2.0**-24

  def gamma(n):
    return n * u / (1 - n * u)

  ratio = atol32 / parity.comparison_atol(inp, compression_ratio=4)
  assert ratio == pytest.approx(gamma(2 * d + h - 1) / gamma(d + h - 1),
                                rel=1e-9)


def test_comparison_atol_refuses_float32_queries_off_cpu(monkeypatch):
  # Off CPU (a TPU), a default-precision matmul rounds f32 queries to bf16:
  # no summation bound covers that, so they are refused; bf16 ones are not.
  case = parity.case_by_name("all_at_once_r4_fp8_k8")
  inp = case.inputs()
  inp32 = dataclasses.replace(inp, q=inp.q.astype(jnp.float32))
  monkeypatch.setattr(parity.jax, "default_backend", lambda: "tpu")
  with pytest.raises(ValueError, match="bf16 queries"):
    parity.comparison_atol(inp32, compression_ratio=4)
  with pytest.raises(ValueError, match="bf16 queries"):
    parity.accumulation_atol(inp32, compression_ratio=4)
  assert parity.comparison_atol(inp, compression_ratio=4) > 0


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
