"""Every kernel variant (interpreted on CPU) against its reference, by case.

The cases are the "tests" scope of the case matrix
(`streamidx.lab.studies.cases`): named batches x ratios x cache formats for
each token variant of `streamidx.VARIANTS`, page variants at ratio 1, driven
through `Variant.run` / `run_reference`; registering a variant adds its
cases here. Kernel and reference compute the same f32 sums, though XLA may
order them differently for the kernel's block shapes; the comparison is
tie-aware with `metrics.summation_atol`: identical index sets, or
differences only between entries whose scores agree within that bound,
derived from the arithmetic.
"""

import functools
import inspect

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import streamidx as si
from streamidx import metrics
from streamidx.lab.studies import cases

from kernel_scores import KernelWithScores, assert_kernel_matches_reference
import tiers

BLOCKS = cases.blocks_for("vendored")
K = cases.K_TESTS
NUM_TOKENS = cases.NUM_TOKENS
TEST_CASES = cases.case_matrix("tests")


@functools.lru_cache(maxsize=None)
def _inputs(batch_name: str, ratio: int, fmt: str) -> si.IndexerInputs:
  b = cases.BATCHES[batch_name].build(ratio)
  return si.make_inputs(b, num_heads=cases.NUM_HEADS, fmt=fmt, seed=ratio)


def _in_ci(case) -> bool:
  """CI: ratio 4 (DeepSeek-V4's) for every variant, format and causal rule,
  ratio 1 (no compression) for the vendored FP8 kernel and the page variants
  (GLM's ratio); each compile key is an interpreted kernel. The rest (ratio
  2, ratio 1 of the other token kernels) is the full tier (tests/tiers.py)."""
  if case.compression_ratio == 4:
    return True
  return case.compression_ratio == 1 and (
      case.mode == "page" or (case.variant, case.fmt) == ("vendored", "fp8"))


@pytest.mark.parametrize("case", tiers.split(TEST_CASES, _in_ci,
                                             ids=lambda c: c.name))
def test_variant_matches_reference(case):
  _assert_case_matches_reference(case)


# Speculative decoding (M17): gamma + 1 in {2, 3, 4} rows per decode
# sequence, every token variant and format. CI: the dense kernel at 4 rows
# (the vendored FP8 kernel at 2 rows runs under the race detector in
# test_races.py); the rest is the full tier.
@pytest.mark.parametrize("case", tiers.split(
    cases.mtp_cases(), lambda c: c.name.startswith("dense/mtp4"),
    ids=lambda c: c.name))
def test_speculative_decode_matches_reference(case):
  b = case.batch()
  assert (b.q_lens[:b.distribution[0]] == b.decode_q_len).all()
  decode = si.semantics.token_launches(  # batched MTP programs
      tuple(int(x) for x in b.distribution), 4, b.decode_q_len)[0]
  assert decode.end > decode.start and decode.seq_batch_size == 4
  assert decode.static_q_len == b.decode_q_len
  _assert_case_matches_reference(case)


# DeepSeek-V4-Flash's k = 512 (CI), V4-Pro's 1024 and V3.2's 2048 (full
# tier) at 64 heads x 128 dims, ratio 4, 128-entry pages.
@pytest.mark.parametrize("case", tiers.first(cases.production_cases(),
                                             ids=lambda c: c.name))
def test_production_topk_sizes_match_reference(case):
  b = case.batch()
  v = case.visible(b)[b.token_seq_ids() >= 0]
  assert (v > case.k).any() and (v < case.k).any()
  _assert_case_matches_reference(case)


def _assert_case_matches_reference(case):
  out = cases.case_outputs(case)
  assert out.got.shape == (NUM_TOKENS, case.k) and out.got.dtype == np.int32
  metrics.assert_topk_match(out.got, out.want, out.scores, label=case.name,
                            atol=case.atol(out.inputs))
  # Every row returns exactly min(k, visible) entries (or pages): the mask
  # is right.
  np.testing.assert_array_equal((out.got >= 0).sum(axis=1),
                                np.minimum(case.visible(out.inputs.batch),
                                           case.k))


def test_the_test_matrix_runs_every_variant_and_format():
  seen = {(c.variant, c.fmt, c.compression_ratio) for c in TEST_CASES}
  for name, v in si.VARIANTS.items():
    ratios = cases.RATIOS if v.mode == "token" else (1,)
    assert {(name, f, r) for f in v.cache_formats for r in ratios} <= seen


def test_the_ci_tier_runs_every_variant_format_and_causal_rule():
  """`make test`'s part of the matrix still has every variant, format,
  causal rule and batch, and a case without compression."""
  ci = [c for c in TEST_CASES if _in_ci(c)]
  assert {c.compression_ratio for c in ci} == {1, 4}
  for name, v in si.VARIANTS.items():
    for f in v.cache_formats:
      assert any(c.variant == name and c.fmt == f for c in ci), (name, f)
  assert {c.causal_rule for c in ci} == {c.causal_rule for c in TEST_CASES}
  assert {c.batch_name for c in ci} == {c.batch_name for c in TEST_CASES}


def test_the_matrix_covers_rows_above_and_below_k():
  """k = K ranks (rows seeing more than K) and pads (rows seeing fewer)."""
  above = below = 0
  for case in TEST_CASES:
    if case.mode != "token" or case.causal_rule != "model" or case.fmt != "fp8":
      continue
    b = case.batch()
    v = case.visible(b)
    live = b.token_seq_ids() >= 0
    above += int((v[live] > case.k).sum())
    below += int((v[live] < case.k).sum())
  assert above > 50 and below > 50


@pytest.mark.parametrize("ratio", (2, 4))
@pytest.mark.parametrize("batch_name", cases.TEST_SEED_RULE_BATCHES)
def test_seed_rule_cases_exercise_the_rules_difference(batch_name, ratio):
  # The rules differ exactly on prefill rows with (p + 1) % ratio != 0 whose
  # leaked block is within the sequence: there the seed sees one entry more.
  # (The kernel runs these batches under the seed's rule in
  # test_variant_matches_reference.)
  b = cases.BATCHES[batch_name].build(ratio)
  pos = b.token_positions()
  seq = b.token_seq_ids()
  entries = np.where(seq >= 0, b.seq_lens[np.maximum(seq, 0)] // ratio, 0)
  leaks = (seq >= 0) & ((pos + 1) % ratio != 0) & (pos // ratio < entries)
  counts = {rule: si.ref.visible_counts(
      b.seq_lens, b.cu_q_lens, b.num_seqs, b.num_tokens,
      compression_ratio=ratio, causal_rule=rule) for rule in ("seed", "model")}
  np.testing.assert_array_equal(counts["seed"] - counts["model"],
                                leaks.astype(int))
  assert leaks.any(), "the case must exercise the difference"


def test_seed_rule_leaks_the_query_s_own_block():
  """A prefill query at p = 4k + 1 (ratio 4) sees block k only under "seed"."""
  b = si.make_batch([(8, 64)], page_size=16, compression_ratio=4,
                    distribution=(0, 1, 1), pages_per_seq=cases.PAGES_PER_SEQ,
                    max_num_seqs=cases.MAX_NUM_SEQS, num_tokens=NUM_TOKENS,
                    total_num_pages=cases.TOTAL_NUM_PAGES)
  inp = si.make_inputs(b, num_heads=cases.NUM_HEADS, fmt="bf16")
  kw = dict(k=K, compression_ratio=4, **BLOCKS)
  model = np.asarray(si.streamindex_topk(*inp.args, **kw))
  seed = np.asarray(si.streamindex_topk(*inp.args, causal_rule="seed", **kw))
  # Query i is at p = 56 + i; entries up to (p + 1) // 4 - 1 are complete.
  for i in range(8):
    p = 56 + i
    assert set(model[i][model[i] >= 0]) == set(range((p + 1) // 4))
    assert set(seed[i][seed[i] >= 0]) == set(range(p // 4 + 1))


def test_page_mode_equals_pooled_token_scores():
  """Page scores are the max of the token scores of each page."""
  inp = _inputs("all_three_ranges", 1, "fp8")
  tok = np.asarray(si.token_scores(*inp.args, compression_ratio=1))
  pages = np.asarray(si.page_scores(*inp.page_args))
  ps = inp.batch.page_size
  np.testing.assert_array_equal(
      pages, tok.reshape(tok.shape[0], -1, ps).max(axis=-1))


def test_kernel_scores_within_the_summation_bound_of_the_reference():
  """The kernel's own score matrix, not just its indices: within twice the
  derived summation bound of the reference's (tests/kernel_scores.py)."""
  inp = _inputs("all_three_ranges", 4, "fp8")
  kw = dict(k=K, compression_ratio=4, **BLOCKS)
  idx, scores = KernelWithScores("token")(*inp.args, **kw)
  assert_kernel_matches_reference(
      idx, scores, si.streamindex_topk_ref(*inp.args, **kw),
      si.token_scores(*inp.args, compression_ratio=4),
      score_bound=metrics.summation_error_bound(inp, compression_ratio=4),
      label="all_three_ranges r4 fp8")


def test_decode_req_batch_size_does_not_change_results():
  inp = _inputs("decode_only_with_remainder", 4, "fp8")
  outs = [np.asarray(si.streamindex_topk(
      *inp.args, k=K, compression_ratio=4, decode_req_batch_size=bs,
      **BLOCKS)) for bs in (1, 4)]
  scores = si.token_scores(*inp.args, compression_ratio=4)
  atol = metrics.summation_atol(inp, compression_ratio=4)
  metrics.assert_topk_match(outs[0], outs[1], scores, atol=atol)


def test_block_sizes_do_not_change_results():
  # (The base call is the case matrix's kernel: compiled once per process.)
  inp = _inputs("all_three_ranges", 4, "bf16")
  base = np.asarray(si.streamindex_topk(*inp.args, k=K,
                                        compression_ratio=4, **BLOCKS))
  other = np.asarray(si.streamindex_topk(
      *inp.args, k=K, compression_ratio=4, num_kv_pages_per_block=24,
      num_queries_per_block=(1, 3, 16)))
  scores = si.token_scores(*inp.args, compression_ratio=4)
  atol = metrics.summation_atol(inp, compression_ratio=4)
  metrics.assert_topk_match(other, base, scores, atol=atol)


def test_padding_rows_are_all_minus_one():
  inp = _inputs("prefill_only", 1, "fp8")
  got = np.asarray(si.streamindex_topk(*inp.args, k=K,
                                       compression_ratio=1, **BLOCKS))
  pad = inp.batch.token_seq_ids() < 0
  assert pad.any()
  assert (got[pad] == -1).all()


# ---- Drop-in for the seed: jit, eval_shape, shard_map, modes -------------


SEED_KWARGS = dict(k=K, compression_ratio=4, **BLOCKS,
                   vmem_limit_bytes=100 * 1024 * 1024, decode_req_batch_size=4)


def test_public_functions_keep_the_jit_methods():
  # The public functions build one call description and run the one jitted
  # driver (an interpreted call returns a finished result, see
  # streamidx.kernels.driver); `lower`, `trace` and `eval_shape` are the
  # driver's for the same arguments.
  inp = _inputs("all_three_ranges", 4, "fp8")
  abstract = [jax.ShapeDtypeStruct(a.shape, a.dtype) for a in inp.args]
  traced = si.streamindex_topk.trace(*abstract, **SEED_KWARGS)
  assert traced.out_info.shape == (NUM_TOKENS, K)
  assert si.streamindex_topk.__name__ == "streamindex_topk"
  assert list(inspect.signature(si.streamindex_topk).parameters)[:3] == [
      "q", "indexer_weights", "cache_kv"]


def test_eval_shape_with_seed_keyword_arguments():
  inp = _inputs("all_three_ranges", 4, "fp8")
  abstract = [jax.ShapeDtypeStruct(a.shape, a.dtype) for a in inp.args]
  out = jax.eval_shape(si.streamindex_topk, *abstract, **SEED_KWARGS)
  assert out.shape == (NUM_TOKENS, K) and out.dtype == jnp.int32
  out = jax.eval_shape(si.streamindex_page_topk,
                       *[jax.ShapeDtypeStruct(a.shape, a.dtype)
                         for a in inp.page_args], k_pages=3)
  assert out.shape == (NUM_TOKENS, 3)


def test_jit_of_a_caller_and_lowering():
  inp = _inputs("all_three_ranges", 4, "fp8")

  @jax.jit
  def caller(*args):
    return si.streamindex_topk(*args, **SEED_KWARGS) + 0

  np.testing.assert_array_equal(
      caller(*inp.args), si.streamindex_topk(*inp.args, **SEED_KWARGS))
  lowered = si.streamindex_topk.lower(*inp.args, **SEED_KWARGS)
  assert lowered.out_info.shape == (NUM_TOKENS, K)


def test_shard_map_over_a_mesh():
  inp = _inputs("all_three_ranges", 4, "fp8")
  mesh = jax.make_mesh((1,), ("x",))
  spec = jax.sharding.PartitionSpec()

  def body(*args):
    return si.streamindex_topk(*args, **SEED_KWARGS)

  f = jax.shard_map(body, mesh=mesh, in_specs=(spec,) * 7, out_specs=spec,
                    check_vma=False)
  np.testing.assert_array_equal(
      jax.jit(f)(*inp.args), si.streamindex_topk(*inp.args, **SEED_KWARGS))


def test_forced_interpreter_retraces_and_never_reuses_the_other_mode():
  inp = _inputs("decode_only_fewer_than_batch", 4, "fp8")
  kw = SEED_KWARGS
  base = si.streamindex_topk(*inp.args, **kw)  # default (auto) mode
  points = []

  def record(token, grid_point, core_index):
    # The interpreter threads an ordering token through the recorder.
    points.append((grid_point, core_index))
    return token

  with si.interpreter(grid_point_recorder=record):
    forced = si.streamindex_topk(*inp.args, **kw)
  assert points, "the forced-mode call must trace anew with its own params"
  n = len(points)
  again = si.streamindex_topk(*inp.args, **kw)
  assert len(points) == n, "the default mode must not reuse the forced trace"
  np.testing.assert_array_equal(base, forced)
  np.testing.assert_array_equal(base, again)


def test_mode_resolution(monkeypatch):
  from streamidx import modes
  assert modes.kernel_mode() == "interpreted"  # CPU
  monkeypatch.setattr(modes, "on_tpu", lambda: True)
  assert modes.resolve_interpret() is False
  assert modes.kernel_mode() == "compiled"
  with si.interpreter(detect_races=True):
    params = modes.resolve_interpret()
    assert params is not False and params.detect_races
  assert modes.resolve_interpret() is False
  si.set_interpreter(dma_execution_mode="eager")
  try:
    assert modes.resolve_interpret().dma_execution_mode == "eager"
  finally:
    si.set_interpreter(False)
  assert modes.resolve_interpret() is False
