"""StreamIndex top-k over the dense FP8 cache (129 B per entry, not 256).

The packed FP8 record's values and scales in two arrays
(`streamidx.cache.pack_dense_fp8_cache`), two DMAs per page. The pipeline
is the vendored kernel's own body (`vendored._scores_kernel`); this module
supplies what differs through its hooks (M16): the layout (`_TwoArrayPages`:
each page's scales a second DMA into their own buffer) and `num_cores` (a
leading "parallel" grid axis).
"""

from __future__ import annotations

import functools

import jax.numpy as jnp
from jax.experimental.pallas import tpu as pltpu

from streamidx import cache as cache_lib
from streamidx.kernels import block_max as block_max_lib
from streamidx.kernels import tpu, vendored
from streamidx.semantics import LANES

KV_PACKING = cache_lib.DENSE_KV_PACKING  # e4m3 bytes per 32-bit word
# The semaphore scratch's rows: the vendored body's four, then the scales'
# and the block maxima's (the hook's, M21).
SEMAPHORE_ROWS = ("kv", "q", "out", "w", "kv_scale", "block_max")
_KV, _Q, _OUT, _W, _SCALE, _MAX = range(len(SEMAPHORE_ROWS))
assert _MAX == block_max_lib.SEM_ROW


class _TwoArrayPages:
  """The dense layout's part of the vendored pipeline (its `layout` hook,
  M16): each page's scales are a second DMA, from `scales_hbm_ref` into
  `bscale_x2_ref` [2, B, bkv_p, R, L] on semaphore row "kv_scale" (a
  whole tile: a DMA cannot take part of one), and their first `rows` (the
  page's page_size // L, the rest zero) load as lanes (entry order)."""

  def __init__(self, scales_hbm_ref, bscale_x2_ref, sems, *, rows=None):
    self.hbm, self.vmem, self.sems = scales_hbm_ref, bscale_x2_ref, sems
    self.rows = rows

  def start_page(self, page, i, slot, b):
    pltpu.make_async_copy(self.hbm.at[page], self.vmem.at[slot, b, i],
                          self.sems.at[_SCALE, slot, b]).start()

  def wait_block(self, slot, b):
    dst = self.vmem.at[slot, b]
    pltpu.make_async_copy(dst, dst, self.sems.at[_SCALE, slot, b]).wait()

  def load_scales(self, slot, b):
    """bf16[1, bkv_sz] (e8m0 values, exact in bf16)."""
    raw = self.vmem[slot, b, :, :self.rows]
    scales = pltpu.bitcast(raw.reshape(1, raw.size), jnp.float8_e8m0fnu)
    return scales.astype(jnp.bfloat16)


def _pair_kernel(*refs, layout, block_max: bool, num_sublanes_bkv: int,
                 **kwargs):
  """The vendored `_scores_kernel` over a two-array layout's refs: scalar
  prefetch (7), q, weights, values, scales (HBM), the aliased score buffer
  [and block-max buffer], their outputs, then the scratch: bkv_x2,
  bscale_x2, bq_x2, bw_x2, bo_x2 [, bmax_x2], sems DMA[5 or 6, 2, B];
  `layout(scales, bscale_x2, sems)` its M16 hook."""
  refs, hook = block_max_lib.split_refs(
      refs, num_prefetch=7, num_inputs=4, emits=block_max,
      seq_batch_size=kwargs["seq_batch_size"], bq_sz=kwargs["bq_sz"],
      num_sublanes_bkv=num_sublanes_bkv)
  scalars, (q, weights, values, scales), rest = refs[:7], refs[7:11], refs[11:]
  scores_in, scores, bkv_x2, bscale_x2, bq_x2, bw_x2, bo_x2, sems = rest
  vendored._scores_kernel(
      *scalars, q, weights, values, scores_in, scores, bkv_x2, bq_x2, bw_x2,
      bo_x2, sems, layout=layout(scales, bscale_x2, sems), block_max=hook,
      **kwargs)


def pair_launch(spec, q, weights, cache, prefetch, start, end, outputs, *,
                kind: str, layout, **kernel_kwargs):
  """One `pallas_call` of the vendored pipeline over a two-array cache
  (values, scales), slots [start, end) (`KernelBody.launch`). kind: its
  launch name's; layout: `(scales_hbm, bscale_x2, sems) ->` its M16 layout
  hook; kernel_kwargs: `_scores_kernel`'s others."""
  cache_values, cache_scales = cache
  page_pool, page_size = spec.page_mode, spec.page_size
  b, bq_sz, bkv_p = spec.seq_batch_size, spec.bq_sz, spec.bkv_p
  scratch = tpu.pair_scratch(
      q, weights, outputs[0], cache_values, cache_scales.shape[1:],
      seq_batch_size=b, bq_sz=bq_sz, bkv_p=bkv_p, page_size=page_size,
      page_mode=page_pool)
  kernel = functools.partial(
      _pair_kernel, layout=layout,
      block_max=block_max_lib.NAME in spec.outputs,
      num_sublanes_bkv=bkv_p * page_size // LANES,
      compression_ratio=spec.compression_ratio,
      static_q_len=spec.static_q_len, bkv_p=bkv_p, bq_sz=bq_sz,
      seq_batch_size=b, causal_rule=spec.causal_rule,
      interpreted=spec.interpret is not False, **kernel_kwargs,
      **(dict(page_pool_size=page_size,
              pool_by_lane_segments=spec.segment_pool) if page_pool else {}))
  return tpu.pallas_launch(
      kernel, spec, name=tpu.launch_name(kind, spec.case, bq_sz, bkv_p,
                                         spec.outputs),
      prefetch=prefetch, start=start, end=end,
      **block_max_lib.launch_kwargs(spec, outputs, scratch,
                                    num_sem_rows=_MAX),
      inputs=(q, weights, cache_values, cache_scales), outputs=outputs,
      num_cores=kernel_kwargs.get("num_cores", 1))


def launch(spec, *arrays):
  """This body's launch (`pair_launch`): the dense layout's scale DMA, the
  call's `num_cores`, M10's widening on v4."""
  layout = functools.partial(
      _TwoArrayPages, rows=cache_lib.dense_scale_data_rows(spec.page_size))
  return pair_launch(spec, *arrays, kind="Dense", layout=layout,
                     num_cores=spec.num_cores,
                     widen_fp8=tpu.widen_fp8_for_mxu(spec.interpret))
