"""The MXFP4 variant beyond the case matrix: races, bytes moved, value rules.

Its parity with the reference over the case matrix is tests/test_kernel.py's
(registry-driven); its v4 code, tests/test_v4_paths.py's.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import streamidx as si
from streamidx import cache, metrics
from streamidx.lab.model import tiling, timeline
from streamidx.lab.studies import cases, costs

import tiers


def _inputs(mode, seed=3):
  ratio = 4 if mode == "token" else 1
  b = cases.BATCHES["all_three_ranges"].build(ratio)
  return si.make_inputs(b, num_heads=cases.NUM_HEADS, fmt="mxfp4",
                        seed=seed), ratio


@pytest.mark.parametrize("name", tiers.first(["fp4", "fp4_page"]))
def test_fp4_kernel_has_no_race_on_poisoned_memory(name, race_log):
  v = si.VARIANTS[name]
  inp, ratio = _inputs(v.mode)
  k = 24 if v.mode == "token" else 5
  static = cases.blocks_for(v)
  with si.interpreter(detect_races=True, uninitialized_memory="nan"):
    got = jax.block_until_ready(v.run(inp, k=k, compression_ratio=ratio,
                                      **static))
  assert race_log and not any(s.races_found for s in race_log)
  assert not si.races_found()
  want = v.run_reference(inp, k=k, compression_ratio=ratio, **static)
  metrics.assert_topk_match(
      got, want, v.scores(inp, compression_ratio=ratio), label=name,
      atol=metrics.summation_atol(inp, compression_ratio=ratio, mode=v.mode))


@tiers.FULL
def test_fp4_moves_68_bytes_per_entry():
  """Counted from the interpreter's DMAs: 64 value bytes and 4 scale bytes
  per entry at head_dim 128 (no padding in a DMA's bytes)."""
  inp, ratio = _inputs("token")
  _, rec = costs.run_recorded("fp4", inp, k=24, compression_ratio=ratio,
                              **cases.blocks_for("fp4"))
  moved = costs.recorded_bytes(rec, page_size=int(inp.batch.page_size))
  assert moved["bytes_per_entry"] == 68 == cache.CACHE_FORMATS[
      "mxfp4"].bytes_per_entry(128)
  t = moved["totals"]
  assert t["bytes"]["kv"] == 64 * moved["entries_fetched"]
  assert t["bytes"]["kv_scale"] == 4 * moved["entries_fetched"]


# Pages narrower than a lane row: the group path's scales join along
# sublanes and transpose (kernels/fp4.py, "Scores"); 16-entry pages are the
# case matrix's (tests/test_kernel.py). One or two heads: the masked query
# block under 8 heads, which compiles as a product with a 0 / 2**6 mask.
@pytest.mark.parametrize("page_size,num_heads", tiers.first(
    [(32, 2), (8, 1), (64, 4)]))
def test_fp4_kernel_matches_the_reference_at_small_pages(page_size,
                                                         num_heads):
  b = si.make_mixed_batch(decode=[300, 517], prefill=[(9, 200)],
                          mixed=[(5, 120)], page_size=page_size,
                          compression_ratio=4, allocation="fragmented")
  inp = si.make_inputs(b, num_heads=num_heads, fmt="mxfp4", seed=7)
  v = si.VARIANTS["fp4"]
  pages = 128 // page_size  # one 128-entry KV block per case
  static = dict(num_kv_pages_per_block=pages,
                num_queries_per_block=(1, 8, 8))
  got = v.run(inp, k=24, compression_ratio=4, **static)
  want = v.run_reference(inp, k=24, compression_ratio=4, **static)
  metrics.assert_topk_match(
      got, want, v.scores(inp, compression_ratio=4), label=f"page {page_size}",
      atol=metrics.summation_atol(inp, compression_ratio=4))


def _args(inp, ratio, values=None, scales=None):
  v = si.VARIANTS["fp4"]
  args = list(v.args(inp))
  args[2] = args[2] if values is None else values
  args[3] = args[3] if scales is None else scales
  return v, args, v.static(inp, k=24, compression_ratio=ratio,
                           **cases.blocks_for(v))


def _first_seen(inp):
  """(physical page, slot) of an entry sequence 0 (decode, with a query)
  sees: its first entry."""
  return int(inp.batch.page_table[0, 0]), 0


@pytest.mark.parametrize("byte", [0, 255])
def test_value_rules_reject_a_scale_byte_the_kernel_cannot_apply(byte):
  inp, ratio = _inputs("token")
  page, slot = _first_seen(inp)
  scales = np.asarray(inp.cache[1]).copy()
  scales[page, 2, slot] = byte  # group 2 of entry 0: 2**-127 (flushed), NaN
  v, args, static = _args(inp, ratio, scales=jnp.asarray(scales))
  with pytest.raises(ValueError, match=f"cache_kv: every FP8 record .MXFP4: "
                     f"32-value group.*scale byte {byte}"):
    v.validate(*args, **static)


@tiers.FULL
def test_checkify_twin_rejects_a_nan_scale_byte():
  inp, ratio = _inputs("token")
  page, slot = _first_seen(inp)
  scales = np.asarray(inp.cache[1]).copy()
  scales[page, 1, slot] = 255
  v, args, static = _args(inp, ratio, scales=jnp.asarray(scales))
  err, idx = v.checked(*args, **static)
  with pytest.raises(ValueError, match="scale byte 255"):
    err.throw()
  assert (np.asarray(idx) == -1).all()


def test_value_rules_reject_products_out_of_float32_range():
  """e2m1 has no NaN code, but 6 * 2**127 is past float32: the dot rule."""
  inp, ratio = _inputs("token")
  page, slot = _first_seen(inp)
  scales, values = np.asarray(inp.cache[1]).copy(), np.asarray(inp.cache[0]).copy()
  scales[page, 0, slot] = 254
  values.reshape(values.shape[0], -1, values.shape[-1])[page, slot, 0] = 0x7
  v, args, static = _args(inp, ratio, values=jnp.asarray(values),
                          scales=jnp.asarray(scales))
  with pytest.raises(ValueError, match="q: each head's dot product"):
    v.validate(*args, **static)


def test_page_mode_refuses_a_kv_block_it_cannot_unpack_in_vmem():
  """streamidx.blocks.check_page_kv_block: 128 pages of 256 entries at
  head_dim 256 (8 Mi values; v6e: 114.19 MiB of 64 MiB of scoped VMEM)."""
  spec = jax.ShapeDtypeStruct
  keys = spec((4, 256, 256), jnp.float32)
  values, scales = jax.eval_shape(si.pack_mxfp4_cache, keys)
  args = (spec((8, 2, 256), jnp.bfloat16), spec((8, 2), jnp.float32),
          values, scales, spec((2,), jnp.int32), spec((4,), jnp.int32),
          spec((3,), jnp.int32), spec((), jnp.int32))
  with pytest.raises(ValueError, match=r"^cache_values: page mode over the "
                     r"MXFP4 cache .* \(got 128 x 256 x 256 = 8388608\)"):
    jax.eval_shape(functools.partial(si.streamindex_page_topk_fp4,
                                     k_pages=1), *args)
  keys = spec((4, 256, 128), jnp.float32)  # 4 Mi values: accepted
  values, scales = jax.eval_shape(si.pack_mxfp4_cache, keys)
  si.streamindex_page_topk_fp4.call(
      args[0].update(shape=(8, 2, 128)), args[1], values, scales, *args[4:],
      k_pages=1)


def test_static_checks_name_the_mxfp4_arrays():
  inp, ratio = _inputs("token")
  v, args, static = _args(inp, ratio, scales=inp.cache[1][:, :3])
  with pytest.raises(ValueError, match="cache_scales"):
    v.validate(*args, **static)
  v, args, static = _args(inp, ratio, scales=inp.cache[1].astype(jnp.int8))
  with pytest.raises(ValueError, match="cache_scales: must be uint8"):
    v.validate(*args, **static)


def test_tiling_model_equals_the_fp4_kernel_s_dmas_and_scratch():
  """The tiling model (lab.model.tiling) of the fp4 launches: the scratch
  every launch declares (traced) and, in the full tier, every DMA the
  interpreter executes, event by event."""
  inp, ratio = _inputs("token")
  blocks = cases.blocks_for("fp4")
  p = tiling.plan(inp.batch, fmt="mxfp4", num_heads=cases.NUM_HEADS,
                  variant="fp4", **blocks)
  args = si.VARIANTS["fp4"].args(inp)
  declared = tiling.kernel_scratch(args, variant="fp4", k=24,
                                   compression_ratio=ratio, **blocks)
  assert [d["scratch"] for d in declared] == [
      [(s, dt) for _, s, dt in l.scratch] for l in p.launches]
  assert p.counts()["bytes_kv"] == 68 * inp.batch.page_size * p.counts()["dma_kv"]
  if not tiers.in_full_tier():
    return
  with timeline.record() as rec:
    jax.block_until_ready(si.streamindex_topk_fp4(
        *args, k=24, compression_ratio=ratio, **blocks))
  assert not rec.errors()
  assert [e.key() for e in rec.dma_events()] == [
      e.key() for e in tiling.expected_dma_events(p)]
