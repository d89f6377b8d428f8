"""StreamIndex top-k over the MXFP4 cache (68 B per entry at head_dim 128).

The cache (`streamidx.cache.pack_mxfp4_cache`) holds e2m1 codes two per byte
and one e8m0 exponent per 32 values, in two arrays::

    cache_values  u8[total_pages, page_size // 8, 4, head_dim]  row i of a
                  page: entry i's codes (low nibbles), entry i + page_size/2's
                  (high nibbles)
    cache_scales  u8[total_pages, head_dim // 32, page_size]     e + 127

The pipeline is the vendored kernel's body; this module supplies the layout
hooks (M16, M18, M19 in `kernels/LEDGER.md`):

- DMA: the values in the vendored cache's form, 8 entries per 4 rows
  (`kv_packing = 8`); each page's scales a second DMA, as the dense layout's.
- Unpack (`load_kv`): code c becomes the e4m3 byte (c & 7) << 2 | (c & 8)
  << 4, c's value times 2**-6 exactly, with three integer ops per word; a
  page's two nibble halves join along sublanes.
- Scores (`scaled_dot`): a scale per 32 values cannot multiply the head sum
  (the ReLU comes between). Token mode from TPU v5: the query block, times
  2**6, masked to each group's lanes, one matmul per group scaled by its
  2**e (its scales as lanes; pages narrower than a lane row joined along
  sublanes and transposed: Mosaic rejects that lane join) and summed before
  the ReLU. Page mode, and token mode before v5: the keys e2m1 x 2**e in
  bf16 (exact for e >= -125), one matmul, 1024 entries at a time (M19).
"""

from __future__ import annotations

import functools

import jax.numpy as jnp
from jax import lax
from jax.experimental.pallas import tpu as pltpu

from streamidx import cache as cache_lib
from streamidx.kernels import dense, tpu
from streamidx.semantics import LANES

ENTRIES_PER_BYTE = 2  # two e2m1 codes a byte
KV_PACKING = 4 * ENTRIES_PER_BYTE  # entries per 32-bit word of a row group
E4M3_OFFSET = 64.0  # e4m3 of the moved code bits = e2m1 value * 2**-6
_GROUP = cache_lib.MXFP4_GROUP


def _e4m3(nibbles):
  """u32 words of four e2m1 codes (one per byte) -> the e4m3 of each code's
  value * 2**-6 (sign bit 3 -> 7, exponent and mantissa bits 2-0 -> 4-2)."""
  word = ((nibbles & jnp.uint32(0x07070707)) << 2) | (
      (nibbles & jnp.uint32(0x08080808)) << 4)
  return pltpu.bitcast(word, jnp.float8_e4m3fn)


class _Mxfp4Pages(dense._TwoArrayPages):
  """The MXFP4 layout's part of the vendored pipeline (M16, M18, M19)."""

  kv_packing = KV_PACKING

  def __init__(self, scales_hbm_ref, bscale_x2_ref, sems, *, page_size,
               scale_keys):
    super().__init__(scales_hbm_ref, bscale_x2_ref, sems)
    self.page_size, self.scale_keys = page_size, scale_keys
    # M19: the scaled keys scored 1024 entries at a time (v4's VMEM, spills)
    self.dot_chunk = tpu.WIDEN_CHUNK if scale_keys else None

  def load_kv(self, flat, slot, b):
    """u8[bkv_p * page_size // 2, D] value rows -> the e4m3 tile [bkv_sz, D]
    in entry order and its f32 scales: [G, bkv_sz] (lanes: entries), or
    with `scale_keys` [bkv_sz, G] x 2**6 (sublanes: entries)."""
    words = pltpu.bitcast(flat, jnp.uint32)
    lo = _e4m3(words & jnp.uint32(0x0F0F0F0F))
    hi = _e4m3((words >> 4) & jnp.uint32(0x0F0F0F0F))
    half, width = self.page_size // 2, flat.shape[-1]
    tile = jnp.concatenate([lo.reshape(-1, half, width),
                            hi.reshape(-1, half, width)], axis=1)
    raw = self.vmem[slot, b]  # u8[bkv_p, G, page_size]
    scales = pltpu.bitcast(raw, jnp.float8_e8m0fnu).astype(
        jnp.bfloat16).astype(jnp.float32)
    tile = tile.reshape(-1, width)
    if self.scale_keys or self.page_size % LANES:
      # each page's [G, page_size] transposed, the pages stacked along
      # sublanes: [bkv_sz, G] (a page narrower than a lane row cannot join
      # another's lanes: module docstring, "Scores")
      rows = jnp.swapaxes(scales, 1, 2).reshape(-1, raw.shape[1])
      if self.scale_keys:
        return tile, rows * E4M3_OFFSET
      return tile, rows.T  # [G, bkv_sz]: one transpose, no lane join
    return tile, jnp.concatenate(  # whole lane rows join along lanes
        [scales[:, g, :].reshape(1, -1) for g in range(raw.shape[1])], 0)

  def scaled_dot(self, scales, bq, bkv):
    """sum_g 2**e_g (q_g . code values_g): f32[n, m] for bq [n, D], the e4m3
    tile bkv [m, D] and `load_kv`'s scales (module docstring: "Scores")."""
    if self.scale_keys:
      lane_group = lax.broadcasted_iota(jnp.int32, bkv.shape, 1) // _GROUP
      expanded = scales[:, :1]
      for g in range(1, scales.shape[1]):
        expanded = jnp.where(lane_group == g, scales[:, g:g + 1], expanded)
      keys = (bkv.astype(jnp.float32) * expanded).astype(jnp.bfloat16)
      return jnp.einsum("nd,md->nm", bq, keys,
                        preferred_element_type=jnp.float32)
    lane_group = lax.broadcasted_iota(jnp.int32, bq.shape, 1) // _GROUP
    out = None
    for g in range(scales.shape[0]):
      # group g's lanes of the query block, times 2**6: a product with a
      # 0 / 2**6 mask (a select of the block against 0 does not lower on
      # v6e and v7x under 8 heads: "Not implemented: Sublane broadcast")
      mask = jnp.where(lane_group == g, E4M3_OFFSET, 0.0).astype(bq.dtype)
      s = jnp.einsum("nd,md->nm", bq * mask, bkv,
                     preferred_element_type=jnp.float32) * scales[g:g + 1]
      out = s if out is None else out + s
    return out


def launch(spec, *arrays):
  """This body's launch: the dense body's (`dense.pair_launch`: scores, and
  with "block_max" in `spec.outputs` the maxima of its score rows) over the
  MXFP4 layout, its keys scaled in page mode and before TPU v5 (M19)."""
  layout = functools.partial(
      _Mxfp4Pages, page_size=spec.page_size,
      scale_keys=spec.page_mode or tpu.widen_fp8_for_mxu(spec.interpret))
  return dense.pair_launch(spec, *arrays, kind="Fp4", layout=layout)
