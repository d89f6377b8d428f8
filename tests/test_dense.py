"""The dense FP8 cache and its kernels (`streamidx.kernels.dense`).

- The format: the same e4m3 values and e8m0 exponents as the packed FP8
  record, in two arrays (the scales' rows padded to whole TPU tiles); 129 B
  of data per entry, 132 stored at page size 128.
- The kernel against the reference: the case matrix runs every registered
  variant (tests/test_kernel.py, `streamidx.lab.studies.cases`), the dense
  ones included; here, besides, the seed causal rule, sorted and given
  decode order, page mode, and random batches (the hypothesis profiles of
  tests/test_properties.py), tie-aware within the derived summation bound.
- Race-free under the interpreter's detector with poisoned scratch, scores
  within twice the summation bound of the reference's.
- Validation: static rules, value rules and the checkify entry point.
- The bytes it moves, counted from the DMAs the interpreter executes:
  head_dim + 1 per entry (the vendored kernel: 256).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import streamidx as si
from streamidx import cache, metrics, ref, semantics
from streamidx.lab.model import tiling, timeline

from streamidx.lab.studies import cases

from kernel_scores import KernelWithScores, assert_kernel_matches_reference
import test_properties as props
import tiers

BLOCKS = cases.blocks_for("dense")
K = cases.K_TESTS
NUM_HEADS = cases.NUM_HEADS
NUM_TOKENS = cases.NUM_TOKENS


def _dense_args(inp):
  """`inp`'s kernel arguments with the dense pair in place of cache_kv."""
  q, w, _, *rest = inp.args
  return (q, w, *si.pack_dense_fp8_cache(inp.keys), *rest)


def _dense_page_args(inp):
  q, w, _, *rest = inp.page_args
  return (q, w, *si.pack_dense_fp8_cache(inp.keys), *rest)


# ---------------------------------------------------------------------------
# The format.


@pytest.mark.parametrize("page_size", [16, 128, 256])
def test_dense_cache_holds_the_fp8_record_bytes_in_entry_order(page_size):
  keys = jax.random.normal(jax.random.key(0), (5, page_size, 128)) * 3.0
  values, scales = si.pack_dense_fp8_cache(keys)
  lanes = 128 if page_size % 128 == 0 else page_size
  assert values.shape == (5, page_size // 4, 4, 128)
  # page_size // L rows, then zero rows to whole (4, 128) u8 tiles
  assert scales.shape == (5, 4, lanes) == (5, cache.dense_scale_rows(
      page_size), lanes)
  np.testing.assert_array_equal(scales[:, page_size // lanes:], 0)
  assert values.dtype == scales.dtype == jnp.uint8
  record = cache.pack_cache(keys, "fp8").reshape(5, page_size, 256)
  np.testing.assert_array_equal(values.reshape(5, page_size, 128),
                                record[..., :128])
  entry_scales = cache.entry_scale_bytes(scales, page_size)
  np.testing.assert_array_equal(entry_scales, record[..., 128])
  # Same quantization, so the two formats decode to identical keys.
  np.testing.assert_array_equal(cache.unpack_cache((values, scales)),
                                cache.unpack_cache(cache.pack_cache(keys, "fp8")))
  e4m3, exponents = cache.quantize_fp8(keys)
  np.testing.assert_array_equal(
      entry_scales.astype(np.int32) - 127, exponents)
  np.testing.assert_array_equal(
      jax.lax.bitcast_convert_type(values.reshape(5, page_size, 128),
                                   jnp.float8_e4m3fn).astype(jnp.float32),
      e4m3.astype(jnp.float32))


def test_dense_cache_bytes_per_entry():
  layout = cache.CACHE_FORMATS["dense_fp8"]
  assert layout.bytes_per_entry(128) == 129
  assert cache.CACHE_FORMATS["fp8"].bytes_per_entry(128) == 256
  assert layout.decodes_as == "fp8"
  # With the TPU's (4, 128) tiles of the scale rows.
  assert cache.dense_tpu_bytes_per_entry(128, 128) == 132
  assert cache.dense_tpu_bytes_per_entry(128, 256) == 130
  assert cache.dense_tpu_bytes_per_entry(128, 512) == 129
  # Stored as a TPU tiles it: the pair's arrays hold those 132.
  for page_size in (128, 256, 512):
    values, scales = si.pack_dense_fp8_cache(jnp.ones((2, page_size, 128)))
    assert ((values.nbytes + scales.nbytes) / (2 * page_size)
            == cache.dense_tpu_bytes_per_entry(128, page_size))


def test_dense_cache_rejects_pages_not_a_multiple_of_four():
  with pytest.raises(ValueError, match="multiple of 4"):
    si.pack_dense_fp8_cache(jnp.ones((2, 6, 128)))


# ---------------------------------------------------------------------------
# The kernel against the reference: the case matrix.


@functools.lru_cache(maxsize=None)
def _inputs(batch_name: str, ratio: int) -> si.IndexerInputs:
  return si.make_inputs(cases.BATCHES[batch_name].build(ratio),
                        num_heads=NUM_HEADS, fmt="fp8", seed=ratio)


def _check(inp, ratio, *, causal_rule="model", label="", **extra):
  kw = dict(k=K, compression_ratio=ratio, causal_rule=causal_rule, **BLOCKS,
            **extra)
  args = _dense_args(inp)
  got = jax.block_until_ready(si.streamindex_topk_dense(*args, **kw))
  want = si.streamindex_topk_dense_ref(*args, **kw)
  # The dense pair scores as the packed FP8 record of the same keys.
  np.testing.assert_array_equal(want, si.streamindex_topk_ref(*inp.args, **kw))
  scores = si.token_scores(*inp.args, compression_ratio=ratio,
                           causal_rule=causal_rule)
  assert got.shape == (NUM_TOKENS, K) and got.dtype == jnp.int32
  metrics.assert_topk_match(
      got, want, scores, label=label,
      atol=metrics.summation_atol(inp, compression_ratio=ratio,
                                  causal_rule=causal_rule))
  b = inp.batch
  visible = ref.visible_counts(b.seq_lens, b.cu_q_lens, b.num_seqs,
                               b.num_tokens, compression_ratio=ratio,
                               causal_rule=causal_rule)
  np.testing.assert_array_equal((np.asarray(got) >= 0).sum(axis=1),
                                np.minimum(visible, K))


def test_the_case_matrix_runs_the_dense_variants():
  seen = {(c.variant, c.fmt, c.compression_ratio)
          for c in cases.case_matrix("tests")}
  assert {("dense", "dense_fp8", r) for r in cases.RATIOS} <= seen
  assert ("dense_page", "dense_fp8", 1) in seen


# Full tier (tests/tiers.py): the case matrix runs the dense kernel under
# the seed's rule in CI (test_kernel.py, prefill_only at ratio 4).
@tiers.FULL
@pytest.mark.parametrize("case", ["prefill_only", "all_three_ranges"])
def test_dense_kernel_matches_reference_under_seed_causal_rule(case):
  _check(_inputs(case, 4), 4, causal_rule="seed", label=case)


@pytest.mark.parametrize("sort_decode", tiers.first([True, False]))
def test_dense_kernel_in_sorted_and_given_decode_order(sort_decode):
  case = "decode_only_full_batches"
  inp = _inputs(case, 4)
  # The case reorders: the sorted order computes fewer blocks.
  b = inp.batch
  order, given, best = semantics.decode_order(
      b.seq_lens, int(b.distribution[0]), compression_ratio=4,
      bkv_sz=BLOCKS["num_kv_pages_per_block"][0] * b.page_size,
      decode_req_batch_size=4)
  assert int(best) < int(given)
  # (True is the matrix's default: the same compiled kernel.)
  extra = {} if sort_decode else dict(sort_decode=False)
  _check(inp, 4, label=f"sort_decode={sort_decode}", **extra)


K_PAGES = 6


@functools.lru_cache(maxsize=None)
def _page_inputs(name):
  pairs = {"mixed": [(3, 40), (1, 200), (12, 300), (0, 3), (5, 64), (0, 0)],
           "one_long": [(7, 380)]}[name]
  b = si.make_batch(pairs, page_size=16, compression_ratio=1,
                    allocation="fragmented", max_num_seqs=8, num_tokens=32,
                    pages_per_seq=24, total_num_pages=96, seed=2)
  return si.make_inputs(b, num_heads=NUM_HEADS, fmt="fp8", seed=4)


@pytest.mark.parametrize("name", ["mixed", "one_long"])
def test_dense_page_kernel_matches_reference(name):
  inp = _page_inputs(name)
  kw = dict(k_pages=K_PAGES, num_queries_per_block=8)
  args = _dense_page_args(inp)
  got = jax.block_until_ready(si.streamindex_page_topk_dense(*args, **kw))
  want = si.streamindex_page_topk_dense_ref(*args, **kw)
  np.testing.assert_array_equal(
      want, si.streamindex_page_topk_ref(*inp.page_args, **kw))
  metrics.assert_topk_match(
      got, want, si.page_scores(*inp.page_args),
      atol=metrics.summation_atol(inp, compression_ratio=1, mode="page"))


# ---------------------------------------------------------------------------
# Random batches: test_properties' generator, the dense kernels.

DENSE_KERNELS = {"token": KernelWithScores("token", dense=True),
                 "page": KernelWithScores("page", dense=True)}
DENSE_EXAMPLES = {"token-fp8-r4": 15, "page-fp8": 8}
# CI: page mode (the token kernel's random batches are the full tier's; the
# vendored token kernel's run in CI in test_properties.py).
DENSE_CI = ("page-fp8",)


def _check_random(p, batch_kw, input_kw, ties, kernels=DENSE_KERNELS):
  """One random batch through `kernels` (the dense ones, or another body's
  over the same cache: tests/test_lean.py)."""
  b, inp = props.build(p, batch_kw, input_kw, ties)
  kw = p.kernel_kwargs()
  if p.mode == "token":
    args = _dense_args(inp)
    si.validate_topk_dense_inputs(*args, **kw)
    idx, scores = kernels["token"](*args, **kw)
    ref_idx = si.streamindex_topk_dense_ref(*args, **kw)
    ref_scores = ref.token_scores(*inp.args, compression_ratio=p.ratio,
                                  causal_rule=p.causal_rule)
    bound = metrics.summation_error_bound(inp, compression_ratio=p.ratio,
                                          causal_rule=p.causal_rule)
  else:
    args = _dense_page_args(inp)
    si.validate_page_topk_dense_inputs(*args, **kw)
    idx, scores = kernels["page"](*args, **kw)
    ref_idx = si.streamindex_page_topk_dense_ref(*args, **kw)
    ref_scores = ref.page_scores(*inp.page_args, causal_rule=p.causal_rule)
    bound = metrics.summation_error_bound(inp, compression_ratio=1,
                                          causal_rule=p.causal_rule,
                                          mode="page")
  assert_kernel_matches_reference(idx, scores, ref_idx, ref_scores,
                                  score_bound=bound, label=b.describe())


@pytest.mark.parametrize("name", tiers.split(list(DENSE_EXAMPLES),
                                             lambda n: n in DENSE_CI))
def test_dense_random_batches_match_reference(name):
  p = props.PROFILES[name]
  checked = []

  @settings(max_examples=DENSE_EXAMPLES[name], derandomize=True,
            database=None, deadline=None, print_blob=False,
            suppress_health_check=[HealthCheck.too_slow,
                                   HealthCheck.data_too_large])
  @given(data=st.data())
  def run(data):
    batch_kw, input_kw, ties = data.draw(props.batches(p), label="batch")
    _check_random(p, batch_kw, input_kw, ties)
    checked.append(ties)

  run()
  assert len(checked) >= DENSE_EXAMPLES[name]


# ---------------------------------------------------------------------------
# Races.


# Full tier: in CI the dense token kernel's race check runs on two
# simulated cores (test_dense_kernel_on_two_cores_is_race_free_and_unchanged).
@tiers.FULL
def test_dense_token_kernel_is_race_free(capsys):
  b = si.make_mixed_batch(decode=[37, 64, 100, 20, 9], prefill=[(13, 50)],
                          mixed=[(20, 90), (3, 600), (0, 40)], page_size=16,
                          compression_ratio=4, allocation="fragmented",
                          max_num_seqs=9, num_tokens=48, seed=3)
  inp = si.make_inputs(b, num_heads=4, fmt="fp8", seed=5)
  kw = dict(k=12, compression_ratio=4, num_kv_pages_per_block=8,
            num_queries_per_block=(1, 8, 8), decode_req_batch_size=2)
  args = _dense_args(inp)
  with si.race_check(uninitialized_memory="nan") as report:
    idx, scores = KernelWithScores("token", dense=True)(*args, **kw)
  assert report.launches == 4 and not report.races_found, report
  assert "RACE DETECTED" not in capsys.readouterr().out
  assert_kernel_matches_reference(
      idx, scores, si.streamindex_topk_dense_ref(*args, **kw),
      ref.token_scores(*inp.args, compression_ratio=4),
      score_bound=metrics.summation_error_bound(inp, compression_ratio=4))
  si.reset_interpreter_state()


# The dense FP8 cache's page kernels: the dense body in CI, the lean body
# (its own pipeline over the same cache) in the full tier.
@pytest.mark.parametrize("variant", tiers.first(["dense", "lean"]))
def test_dense_cache_page_kernel_is_race_free(variant, capsys):
  inp = _page_inputs("mixed")
  kw = dict(k_pages=3, num_queries_per_block=8)
  args = _dense_page_args(inp)
  with si.race_check(uninitialized_memory="nan") as report:
    idx, scores = KernelWithScores("page", variant=variant)(*args, **kw)
  assert report.launches == 1 and not report.races_found, report
  assert "RACE DETECTED" not in capsys.readouterr().out
  assert_kernel_matches_reference(
      idx, scores, si.streamindex_page_topk_dense_ref(*args, **kw),
      ref.page_scores(*inp.page_args),
      score_bound=metrics.summation_error_bound(inp, compression_ratio=1,
                                                mode="page"))
  si.reset_interpreter_state()


# ---------------------------------------------------------------------------
# Validation.


def _valid():
  inp = _inputs("all_three_ranges", 4)
  kw = dict(k=K, compression_ratio=4, **BLOCKS)
  return list(_dense_args(inp)), kw


@pytest.mark.parametrize("index,bad,match", [
    (2, lambda v: v.reshape(v.shape[0], -1, 2, v.shape[-1]),
     r"cache_values: axis 2 \(kv_packing\) must be 4"),
    (2, lambda v: v.astype(jnp.int8), r"cache_values: must be uint8"),
    (2, lambda v: v[..., :64], r"cache_values: last axis must be q's head_dim"),
    # the scale rows without their zero rows (the format before 2026-12-07)
    (3, lambda s: s[:, :1], r"cache_scales: shape must be \(\d+, 4, 16\)"),
    (3, lambda s: s[:-1], r"cache_scales: shape must be"),
    (3, lambda s: s.astype(jnp.float32), r"cache_scales: must be uint8"),
    (3, lambda s: s[:, 0], r"cache_scales: must have rank 3"),
])
def test_dense_kernel_static_rule(index, bad, match):
  args, kw = _valid()
  args[index] = bad(args[index])
  with pytest.raises(ValueError, match=match):
    si.streamindex_topk_dense(*args, **kw)
  with pytest.raises(ValueError, match=match):
    si.validate_topk_dense_inputs(*args, **kw)


def test_dense_kernel_rejects_a_non_bool_sort_decode():
  args, kw = _valid()
  with pytest.raises(ValueError, match=r"sort_decode: must be True or False"):
    si.streamindex_topk_dense(*args, sort_decode=1, **kw)
  with pytest.raises(ValueError, match=r"sort_decode: must be True or False"):
    si.streamindex_topk(*_inputs("all_three_ranges", 4).args,
                        sort_decode="yes", **kw)


def test_dense_value_rules_and_checked_entry():
  args, kw = _valid()
  si.validate_topk_dense_inputs(*args, **kw)  # valid
  pages = np.asarray(args[5]).copy()
  pages[3] = args[2].shape[0]  # one past the cache
  args[5] = jnp.asarray(pages)
  with pytest.raises(ValueError, match=r"page_indices: every slot must name"):
    si.validate_topk_dense_inputs(*args, **kw)
  err, idx = si.checked_streamindex_topk_dense(*args, **kw)
  assert "page_indices: every slot must name" in str(err.get())
  assert (np.asarray(idx) == -1).all()


def test_dense_checked_entry_runs_the_kernel_on_valid_input():
  args, kw = _valid()
  err, idx = si.checked_streamindex_topk_dense(*args, **kw)
  assert err.get() is None
  np.testing.assert_array_equal(idx, si.streamindex_topk_dense(*args, **kw))
  inp = _page_inputs("mixed")
  pkw = dict(k_pages=K_PAGES, num_queries_per_block=8)
  err, idx = si.checked_streamindex_page_topk_dense(*_dense_page_args(inp),
                                                    **pkw)
  assert err.get() is None
  np.testing.assert_array_equal(
      idx, si.streamindex_page_topk_dense(*_dense_page_args(inp), **pkw))


# ---------------------------------------------------------------------------
# Bytes moved, from the interpreter's DMAs.


def _kv_bytes(rec):
  """(cache bytes read by all KV DMAs, pages read)."""
  starts = [op.info for op in rec.ops if op.kind == "dma_start"
            and op.info["sem"] in ("kv", "kv_scale")]
  pages = sum(1 for i in starts if i["sem"] == "kv")
  return sum(i["nbytes"] for i in starts), pages


def test_dense_kernel_reads_its_stored_bytes_per_entry():
  """Values and the page's scale tile: 128 + 4 B an entry at page 128."""
  b = si.make_mixed_batch(decode=[1024, 700], page_size=128,
                          compression_ratio=4)
  inp = si.make_inputs(b, num_heads=8, fmt="fp8", seed=0)
  kw = dict(k=16, compression_ratio=4, num_kv_pages_per_block=(1, 1, 1),
            num_queries_per_block=(1, 8, 8), decode_req_batch_size=2)
  with timeline.record() as rec:
    jax.block_until_ready(si.streamindex_topk_dense(*_dense_args(inp), **kw))
  dense_bytes, dense_pages = _kv_bytes(rec)
  with timeline.record() as rec:
    jax.block_until_ready(si.streamindex_topk(*inp.args, **kw))
  vendored_bytes, vendored_pages = _kv_bytes(rec)
  # One decode program of 2 sequences, 2 blocks of one 128-entry page each.
  assert dense_pages == vendored_pages == 4
  assert dense_bytes == dense_pages * 128 * 132 == (
      dense_pages * 128 * cache.dense_tpu_bytes_per_entry(128, 128))
  assert vendored_bytes == vendored_pages * 128 * 256


# ---------------------------------------------------------------------------
# num_cores: a leading "parallel" grid axis (both TensorCores of a v5p).


@pytest.mark.parametrize("simulated_cores", tiers.split([1, 2], lambda c: c == 2))
def test_dense_kernel_on_two_cores_is_race_free_and_unchanged(
    simulated_cores, capsys):
  # Two cores of a v5p, or one chip running both cores' programs in turn
  # (then each core's prologue resets the pipeline state it inherits).
  b = si.make_mixed_batch(decode=[37, 900, 64, 100, 300, 500, 20],
                          prefill=[(20, 300)], mixed=[(1, 90), (9, 333),
                                                      (3, 50)],
                          page_size=16, compression_ratio=4,
                          allocation="fragmented", max_num_seqs=12,
                          num_tokens=48, seed=3)
  inp = si.make_inputs(b, num_heads=4, fmt="fp8", seed=1)
  kw = dict(k=8, compression_ratio=4, num_kv_pages_per_block=8,
            num_queries_per_block=(1, 8, 8), decode_req_batch_size=2)
  args = _dense_args(inp)
  one = np.asarray(si.streamindex_topk_dense(*args, **kw))
  with si.race_check(num_cores_or_threads=simulated_cores) as report:
    idx, scores = KernelWithScores("token", dense=True)(*args, num_cores=2,
                                                         **kw)
  assert report.launches == 4 and not report.races_found, report
  assert "RACE DETECTED" not in capsys.readouterr().out
  np.testing.assert_array_equal(idx, one)
  assert_kernel_matches_reference(
      idx, scores, si.streamindex_topk_dense_ref(*args, **kw),
      ref.token_scores(*inp.args, compression_ratio=4),
      score_bound=metrics.summation_error_bound(inp, compression_ratio=4))
  si.reset_interpreter_state()


def test_dense_page_kernel_on_two_cores_is_unchanged():
  inp = _page_inputs("mixed")
  kw = dict(k_pages=K_PAGES, num_queries_per_block=8)
  args = _dense_page_args(inp)
  with si.interpreter(num_cores_or_threads=2):
    got = si.streamindex_page_topk_dense(*args, num_cores=2, **kw)
  np.testing.assert_array_equal(got,
                                si.streamindex_page_topk_dense(*args, **kw))


@pytest.mark.parametrize("bad", [0, -1, 1.0, True])
def test_dense_kernel_rejects_a_bad_num_cores(bad):
  args, kw = _valid()
  with pytest.raises(ValueError, match=r"num_cores: must be a positive int"):
    si.streamindex_topk_dense(*args, num_cores=bad, **kw)
  with pytest.raises(ValueError, match=r"num_cores: must be a positive int"):
    si.validate_topk_dense_inputs(*args, num_cores=bad, **kw)


# ---------------------------------------------------------------------------
# The tiling model of the dense kernel (fmt="dense_fp8"): scratch and DMAs.


@pytest.mark.parametrize("variant", ["dense", "lean"])
def test_tiling_model_equals_dense_kernel_scratch_at_production_size(variant):
  b = si.make_mixed_batch(decode=[131072] * 8, prefill=[(300, 5000)],
                          mixed=[(1, 700), (40, 2048)], page_size=128,
                          compression_ratio=4)
  blocks = dict(num_kv_pages_per_block=(3, 2, 2),
                num_queries_per_block=(1, 128, 128))
  seq_lens, page_indices, cu_q_lens, distribution = b.kernel_arrays()
  sds = jax.ShapeDtypeStruct
  args = (sds((b.num_tokens, 64, 128), jnp.bfloat16),
          sds((b.num_tokens, 64), jnp.float32),
          sds((b.total_num_pages, 32, 4, 128), jnp.uint8),
          sds((b.total_num_pages, 4, 128), jnp.uint8),
          seq_lens, page_indices, cu_q_lens, distribution)
  declared = tiling.kernel_scratch(args, variant=variant, k=512,
                                   compression_ratio=4, **blocks)
  p = tiling.plan(b, fmt="dense_fp8", num_heads=64, variant=variant, **blocks)
  assert [d["case"] for d in declared] == ["decode", "decode", "prefill",
                                           "mixed"]
  for d, launch in zip(declared, p.launches):
    assert d["scratch"] == [(s, dt) for _, s, dt in launch.scratch]
  # Half the KV buffer of the vendored kernel's a block (132 vs 256 B per
  # entry: a page's scale tile is 4 rows); lean, interpreted as the v5e's,
  # buffers three blocks, not two.
  vendored = tiling.plan(b, fmt="fp8", num_heads=64, **blocks)
  dense_kv = tiling.scratch_bytes(p.launches[0].scratch)
  vendored_kv = tiling.scratch_bytes(vendored.launches[0].scratch)
  slots = {n: shape[0] for n, shape, _ in p.launches[0].scratch}["bkv_x2"]
  assert slots == (3 if variant == "lean" else 2)
  assert (dense_kv["bkv_x2"] + dense_kv["bscale_x2"]) * 256 * 2 == (
      vendored_kv["bkv_x2"] * 132 * slots)


def test_tiling_model_equals_the_dense_kernel_s_dmas_event_by_event():
  b = si.make_mixed_batch(decode=[37, 900, 64, 100, 300],
                          prefill=[(40, 800)], mixed=[(1, 90), (20, 333)],
                          page_size=16, compression_ratio=4,
                          allocation="fragmented", seed=3)
  inp = si.make_inputs(b, num_heads=4, fmt="fp8", seed=1)
  kw = dict(num_kv_pages_per_block=(8, 8, 16),
            num_queries_per_block=(1, 8, 16), decode_req_batch_size=2)
  with timeline.record() as rec:
    jax.block_until_ready(si.streamindex_topk_dense(
        *_dense_args(inp), k=8, compression_ratio=4, **kw))
  assert not rec.errors()
  p = tiling.plan(b, fmt="dense_fp8", num_heads=4, **kw)
  want = [e.key() for e in tiling.expected_dma_events(p)]
  assert [e.key() for e in rec.dma_events()] == want
  assert rec.allocations("vmem") == [[(s, d) for _, s, d in l.scratch]
                                     for l in p.executed]
  c = p.counts()
  starts = [e for e in tiling.expected_dma_events(p) if e.op == "start"]
  assert c["dma_kv"] == c["dma_kv_scale"] == sum(e.kind == "kv" for e in starts)
  assert c["dma_total"] == len(starts)
  assert c["bytes_kv"] == sum(e.nbytes for e in starts
                              if e.kind in ("kv", "kv_scale"))
  computes = [l for l in rec.lanes() if l["lane"] == "compute"]
  assert len(computes) == sum(l.num_steps for l in p.launches)
