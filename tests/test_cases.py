"""streamidx.lab.studies.cases: the case matrix, the parity check (and that it
can fail) and the tie tolerance (`comparison_atol`, the derived summation
bound).

Only `test_case_runs_green` and the corruption tests run a kernel (one
compilation per variant, shared through a module-level cache); the rest use
the reference or hand-made arrays. The kernel tests' own scope of the matrix
runs in tests/test_kernel.py.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools

import jax.numpy as jnp
import numpy as np
import pytest

import streamidx as si
from streamidx import metrics
from streamidx.lab.studies import cases

import oracle

GREEN_CASES = ("vendored/all_at_once_r4_fp8_k8",
               "vendored_page/all_at_once_r1_fp8_k3")


@functools.lru_cache(maxsize=None)
def _outputs(name: str) -> cases.CaseOutputs:
  return cases.case_outputs(cases.case_by_name(name))


# ---------------------------------------------------------------------------
# The matrix.


@pytest.mark.parametrize("scope", cases.SCOPES)
def test_case_names_are_unique(scope):
  names = [c.name for c in cases.case_matrix(scope)]
  assert len(names) == len(set(names))


def test_a_name_means_one_case_in_every_scope():
  by_name = {}
  for scope in cases.SCOPES:
    for c in cases.case_matrix(scope):
      assert by_name.setdefault(c.name, c) == c, c.name


@pytest.mark.parametrize("scope", cases.SCOPES)
def test_every_scope_runs_every_variant_and_each_of_its_formats(scope):
  got = {(c.variant, c.fmt) for c in cases.case_matrix(scope)}
  want = {(name, f) for name, v in si.VARIANTS.items() for f in v.cache_formats}
  if scope == "ci":  # one case per variant
    assert {v for v, _ in got} == set(si.VARIANTS)
  else:
    assert got == want
  for c in cases.case_matrix(scope):
    assert c.mode == "token" or c.compression_ratio == 1, c.name


def test_cases_are_frozen_and_hashable():
  case = cases.case_matrix("ci")[0]
  with pytest.raises(dataclasses.FrozenInstanceError):
    case.k = 3  # type: ignore[misc]
  assert len({case, dataclasses.replace(case)}) == 1


@pytest.mark.parametrize("scope", cases.SCOPES)
def test_cases_of_a_scope_share_one_static_shape(scope):
  # One compilation per `Case.compile_key`, not per case.
  shapes = set()
  for case in cases.case_matrix(scope):
    b = case.batch()
    shapes.add((b.num_tokens, b.max_num_seqs, b.pages_per_seq,
                b.total_num_pages, b.page_size))
  assert len(shapes) == 1, shapes


def _model_rule_cases(scope, mode):
  return [c for c in cases.case_matrix(scope)
          if c.mode == mode and c.causal_rule == "model"
          and c.num_heads == cases.NUM_HEADS]


@pytest.mark.parametrize("name", sorted(si.VARIANTS))
def test_pairwise_matrix_covers_every_pair_of_axis_values(name):
  v = si.VARIANTS[name]
  token = [c for c in _model_rule_cases("pairwise", v.mode)
           if c.variant == name]
  if v.mode == "token":
    axes = {"fmt": v.cache_formats, "ratio": cases.RATIOS,
            "k": (cases.K_BELOW, cases.K_ABOVE),
            "batch": cases.DISTRIBUTIONS}
  else:
    axes = {"fmt": v.cache_formats,
            "k": (cases.K_PAGES_BELOW, cases.K_PAGES_ABOVE),
            "batch": cases.PAGE_DISTRIBUTIONS}
  seen = [dict(fmt=c.fmt, ratio=c.compression_ratio, k=c.k,
               batch=c.batch_name) for c in token]
  names = list(axes)
  for i, a in enumerate(names):
    assert set(axes[a]) == {s[a] for s in seen}, a
    for b in names[i + 1:]:
      if v.mode == "page" and {a, b} == {"fmt", "k"}:
        continue  # two page groups: each format, each k_pages, not each pair
      want = {(x, y) for x in axes[a] for y in axes[b]}
      got = {(s[a], s[b]) for s in seen}
      assert want <= got, f"{a} x {b}: missing {sorted(want - got)}"
  if v.mode == "token":
    assert any(c.causal_rule == "seed" and c.variant == name
               for c in cases.case_matrix("pairwise"))


def test_full_matrix_is_the_product():
  for name, v in si.VARIANTS.items():
    got = {(c.fmt, c.compression_ratio, c.k, c.batch_name)
           for c in _model_rule_cases("full", v.mode) if c.variant == name}
    if v.mode == "token":
      want = set(itertools.product(v.cache_formats, cases.RATIOS,
                                   (cases.K_BELOW, cases.K_ABOVE),
                                   cases.DISTRIBUTIONS))
    else:
      want = set(itertools.product(v.cache_formats, (1,),
                                   (cases.K_PAGES_BELOW, cases.K_PAGES_ABOVE),
                                   cases.PAGE_DISTRIBUTIONS))
    assert got == want, name


def test_k_above_exceeds_every_visible_count_and_k_below_does_not():
  for case in cases.case_matrix("full"):
    b = case.batch()
    live = b.token_seq_ids() >= 0
    visible = case.visible(b)[live]
    if case.k in (cases.K_ABOVE, cases.K_PAGES_ABOVE):
      assert np.all(visible <= case.k), case.name
    else:
      assert np.any(visible > case.k), case.name


def test_k_above_exceeds_the_kernels_score_columns():
  case = cases.case_by_name("vendored/all_at_once_r1_fp8_k8")
  assert cases.K_ABOVE > case.plan().num_score_cols


def test_every_launch_runs_in_the_all_at_once_and_ties_cases():
  for case in (cases.case_by_name("vendored/all_at_once_r4_fp8_k8"),
               cases.TIES_CASE):
    launches = case.launches()
    for part in ("decode[4]", "decode[1]", "prefill", "mixed"):
      assert part in launches, (case.name, launches)


def test_launches_are_the_tiling_plans():
  case = cases.case_by_name("vendored/all_at_once_r4_fp8_k8")
  p = case.plan()
  assert [l.grid for l in p.launches] == [1, 1, 2, 2]
  assert case.launches() == "decode[4] x1, decode[1] x1, prefill x2, mixed x2"
  page = cases.case_by_name("vendored_page/all_at_once_r1_fp8_k3")
  assert page.launches() == f"page x{page.batch().num_seqs}"


def test_ci_cases_belong_to_the_pairwise_matrix():
  pairwise = {c.name for c in cases.case_matrix("pairwise")}
  assert set(cases.CI_CASES) <= pairwise


def test_test_blocks_are_small_enough_to_run_several_blocks():
  # The point of TEST_BLOCKS: the test batches cross KV and query blocks.
  steps = {"bkv": 0, "bq": 0}
  for name in cases.TEST_BATCHES:
    case = cases.case_by_name(f"vendored/{name}_r1_fp8_k{cases.K_TESTS}")
    for _, pr in case.plan().programs():
      steps["bkv"] += pr.num_bkv > 1
      steps["bq"] += pr.num_bq > 1
  assert steps["bkv"] > 5 and steps["bq"] > 2, steps


def test_unknown_scope_and_name_are_rejected():
  with pytest.raises(ValueError, match="scope"):
    cases.case_matrix("everything")
  with pytest.raises(KeyError, match="no_such_case"):
    cases.case_by_name("no_such_case")


def test_a_batch_longer_than_the_shared_shape_is_rejected():
  too_long = cases.Batch("too_long", decode=(cases.NUM_ENTRIES + 1,))
  with pytest.raises(ValueError, match="pages_per_seq"):
    too_long.build(1)


# ---------------------------------------------------------------------------
# Parity, and that the check can fail.


@pytest.mark.parametrize("name", GREEN_CASES)
def test_case_runs_green(name):
  case = cases.case_by_name(name)
  out = _outputs(name)
  atol = case.atol(out.inputs)
  row = cases.compare_case(case, out.got, out.want, out.scores, atol=atol,
                            b=out.inputs.batch)
  assert row.ok and row.sets_agree, row.detail
  assert row.atol == atol > 0
  assert row.max_score_diff == 0.0
  assert row.rows == cases.NUM_TOKENS
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
  case = cases.case_by_name(name)
  out = _outputs(name)
  bad = corrupt(out.got, out.scores)
  row = cases.compare_case(case, bad, out.want, out.scores, atol=0.0,
                            b=out.inputs.batch)
  assert not row.ok and not row.sets_agree
  assert row.rows_mismatched == 1 and row.detail.startswith("row ")


def test_case_outputs_run_a_given_kernel_fn_whose_corruption_is_reported():
  # Through `case_outputs`' own kernel hook (the reference stands in for the
  # kernel, so nothing compiles).
  case = cases.TIES_CASE
  out = cases.case_outputs(case, kernel_fn=lambda inp: _corrupt_swap_for_worse(
      np.asarray(case.run_reference(inp)), np.asarray(case.scores(inp))))
  row = cases.compare_case(case, out.got, out.want, out.scores,
                           atol=case.atol(out.inputs), b=out.inputs.batch)
  assert not row.ok and row.rows_mismatched == 1


def test_swapping_tied_entries_is_accepted_as_a_tie():
  case = cases.TIES_CASE
  inp = case.inputs()
  scores = np.asarray(case.scores(inp))
  want = np.asarray(case.run_reference(inp))
  ordered = -np.sort(-scores, axis=1)
  tied = np.flatnonzero((ordered[:, case.k - 1] == ordered[:, case.k])  # k-th == (k+1)-th, visible
                        & np.isfinite(ordered[:, case.k]))
  assert len(tied) > 0
  got = want.copy()
  r = int(tied[0])
  kth = ordered[r, case.k - 1]
  kept = [e for e in got[r] if e >= 0 and scores[r, e] == kth]
  spare = [e for e in np.flatnonzero(scores[r] == kth) if e not in got[r]]
  got[r, list(got[r]).index(kept[0])] = spare[0]
  row = cases.compare_case(case, got, want, scores, atol=0.0, b=inp.batch)
  assert row.ok and not row.sets_agree
  assert row.differing_positions == row.tied_positions == 2


# ---------------------------------------------------------------------------
# Tie tolerance.


def test_comparison_atol_is_the_summation_atol_and_small():
  case = cases.case_by_name("vendored/all_at_once_r4_fp8_k8")
  inp = case.inputs()
  atol = case.atol(inp)
  assert atol == cases.comparison_atol(
      inp, compression_ratio=4) == metrics.summation_atol(
          inp, compression_ratio=4)
  scores = np.asarray(case.scores(inp))
  largest = np.abs(scores[np.isfinite(scores)]).max()
  # A tolerance, not a waiver: a fraction of a percent of the scores. (The
  # worst-case bound is about 2e-4 of the largest score for these Gaussian
  # inputs at D = 128, H = 4.)
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
  case = dataclasses.replace(
      cases.case_by_name("vendored/all_at_once_r2_bf16_k8"), fmt=fmt)
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


def test_summation_error_bound_covers_products_flushed_below_f32_normals():
  # bf16 keys near 1e-37 are valid inputs, but their products with the
  # queries and weights fall below 2**-126, which XLA flushes to zero: the
  # f32 reference then misses the float64 scores by ~3e-38, beyond the
  # roundoff term alone (~1e-40). `metrics.flush_error_bound` is the term
  # that covers it; ranked on those scores, the top-k matches the float64
  # one within `summation_atol`.
  case = dataclasses.replace(
      cases.case_by_name("vendored/all_at_once_r2_bf16_k8"), k=64)
  inp = case.inputs()
  inp = dataclasses.replace(inp, keys=inp.keys * 1e-37).with_cache_format(
      "bf16")
  b, ratio = inp.batch, case.compression_ratio
  exact = oracle.scores(np.asarray(inp.q, np.float32), inp.weights, inp.cache,
                        b.seq_lens, b.page_indices, b.cu_q_lens, b.num_seqs,
                        ratio=ratio)
  got = np.asarray(si.token_scores(*inp.args, compression_ratio=ratio),
                   np.float64)
  fin = np.isfinite(exact)
  err = np.where(fin, np.abs(got - np.where(fin, exact, 0.0)), 0.0)
  bound = metrics.summation_error_bound(inp, compression_ratio=ratio)
  flush = metrics.flush_error_bound(inp)
  assert np.any(err > (bound - flush)[:, None])  # roundoff alone misses it
  assert np.all(err <= bound[:, None])
  idx = si.streamindex_topk_ref(*inp.args, k=case.k, compression_ratio=ratio)
  assert metrics.compare_topk(
      idx, oracle.topk(exact, case.k), exact,
      atol=metrics.summation_atol(inp, compression_ratio=ratio)).ok


def test_comparison_atol_counts_float32_query_products_on_cpu():
  # f32 queries: the D products q * k round too, n = 2D + H - 1 roundings
  # instead of D + H - 1, so the tolerance grows.
  case = cases.case_by_name("vendored/all_at_once_r4_fp8_k8")
  inp = case.inputs()
  inp32 = dataclasses.replace(inp, q=inp.q.astype(jnp.float32))
  atol32 = cases.comparison_atol(inp32, compression_ratio=4)
  assert atol32 == metrics.summation_atol(inp32, compression_ratio=4)
  d, h, u = case.head_dim, case.num_heads, 2.0**-24

  def gamma(n):
    return n * u / (1 - n * u)

  ratio = atol32 / cases.comparison_atol(inp, compression_ratio=4)
  assert ratio == pytest.approx(gamma(2 * d + h - 1) / gamma(d + h - 1),
                                rel=1e-9)


def test_comparison_atol_refuses_float32_queries_off_cpu(monkeypatch):
  # Off CPU (a TPU), a default-precision matmul rounds f32 queries to bf16:
  # no summation bound covers that, so they are refused; bf16 ones are not.
  case = cases.case_by_name("vendored/all_at_once_r4_fp8_k8")
  inp = case.inputs()
  inp32 = dataclasses.replace(inp, q=inp.q.astype(jnp.float32))
  monkeypatch.setattr(cases.jax, "default_backend", lambda: "tpu")
  with pytest.raises(ValueError, match="bf16 queries"):
    cases.comparison_atol(inp32, compression_ratio=4)
  assert cases.comparison_atol(inp, compression_ratio=4) > 0
