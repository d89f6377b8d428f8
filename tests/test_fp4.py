"""The MXFP4 variant beyond the case matrix: races, bytes moved, value rules.

Its parity with the reference over the case matrix is tests/test_kernel.py's
(registry-driven); its v4 code, tests/test_v4_paths.py's.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import streamidx as si
from streamidx import cache, metrics
from streamidx.lab.model import tiling, timeline
from streamidx.lab.studies import cases, costs

import tiers
from test_races import race_log  # noqa: F401  (the fixture: every launch's detector)


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
  moved = costs.bytes_moved("fp4", inp, k=24, compression_ratio=ratio,
                            **cases.blocks_for("fp4"))
  assert moved["bytes_per_entry"] == 68 == cache.CACHE_FORMATS[
      "mxfp4"].bytes_per_entry(128)
  t = moved["totals"]
  assert t["bytes"]["kv"] == 64 * moved["entries_fetched"]
  assert t["bytes"]["kv_scale"] == 4 * moved["entries_fetched"]


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
