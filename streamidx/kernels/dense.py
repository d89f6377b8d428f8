"""StreamIndex top-k over the dense FP8 cache (129 B per entry, not 256).

The vendored kernel reads the packed FP8 record (128 e4m3 bytes, one e8m0
scale byte, 127 bytes of padding per entry); this one reads the same values
and scales from two arrays (`streamidx.cache.pack_dense_fp8_cache`; shapes:
docs/cache-formats.md), two DMAs per page, head_dim + 1 bytes per entry. The
pipeline is the vendored kernel's own body (`vendored._scores_kernel`, local
modifications included); this module supplies only what differs, through
its hooks (M16, `kernels/LEDGER.md` describes each): the layout
(`_TwoArrayPages`: each page's scales a second DMA into their own buffer),
`num_cores` (a leading "parallel" grid axis) and, token mode, a selection
fused into the scoring (`block_max.BlockMax`, `topk_method="fused_blockmax"`:
the maxima of every 128-lane score row in a second output, "block_max",
f32[max_num_tokens, G, 128]; docs/topk-methods.md).

`launch` is this variant's one `pallas_call` (token or page mode), which the
driver (`streamidx.kernels.driver`) makes per launch; the entry points are
`streamidx.streamindex_topk_dense` / `streamindex_page_topk_dense`.
"""

from __future__ import annotations

import functools

import jax.numpy as jnp
from jax.experimental.pallas import tpu as pltpu

from streamidx import cache as cache_lib
from streamidx.kernels import block_max as block_max_lib
from streamidx.kernels import tpu, vendored
from streamidx.semantics import LANES

__all__ = ["launch", "SEMAPHORE_ROWS"]

# e4m3 bytes per 32-bit word: the dense cache layout's (streamidx.cache).
KV_PACKING = cache_lib.DENSE_KV_PACKING
# First axis of the semaphore scratch: what each row guards.
SEMAPHORE_ROWS = ("kv", "q", "out", "w", "kv_scale", "block_max")
_KV, _Q, _OUT, _W, _SCALE, _MAX = range(len(SEMAPHORE_ROWS))
# The vendored body's rows are the first four; with the block maxima, its
# row for them is this one too (M21).
assert _MAX == vendored._BLOCK_MAX_SEM_ROW  # pylint: disable=protected-access
# Scalar-prefetch slots: sem_ids (bq, bkv, bo, block-max) and bo_sz (rows in
# flight of the two score slots, then of the two block-max slots).
_NUM_SEM_IDS, _NUM_BO_SZ = block_max_lib.NUM_SEM_IDS, block_max_lib.NUM_BO_SZ


class _TwoArrayPages:
  """The dense layout's part of the vendored pipeline (its `layout` hook,
  M16): each page's scales are a second DMA, from `scales_hbm_ref` into
  `bscale_x2_ref` [2, B, bkv_p, page_size // L, L] on semaphore row
  "kv_scale", and they load as lanes (entry order) already."""

  def __init__(self, scales_hbm_ref, bscale_x2_ref, sems):
    self.hbm, self.vmem, self.sems = scales_hbm_ref, bscale_x2_ref, sems

  def start_page(self, page, i, slot, b):
    pltpu.make_async_copy(self.hbm.at[page], self.vmem.at[slot, b, i],
                          self.sems.at[_SCALE, slot, b]).start()

  def wait_block(self, slot, b):
    dst = self.vmem.at[slot, b]
    pltpu.make_async_copy(dst, dst, self.sems.at[_SCALE, slot, b]).wait()

  def load_scales(self, slot, b):
    """bf16[1, bkv_sz] (e8m0 values, exact in bf16)."""
    raw = self.vmem[slot, b]
    scales = pltpu.bitcast(raw.reshape(1, raw.size), jnp.float8_e8m0fnu)
    return scales.astype(jnp.bfloat16)


def _dense_kernel(*refs, block_max: bool, num_sublanes_bkv: int, **kwargs):
  """The vendored `_scores_kernel` over the dense layout's refs: scalar
  prefetch (7), q, weights, values, scales (HBM), the aliased score buffer
  [and block-max buffer], their outputs, then the scratch: bkv_x2,
  bscale_x2, bq_x2, bw_x2, bo_x2 [, bmax_x2], sems DMA[6, 2, B]."""
  refs, hook = block_max_lib.split_refs(
      refs, num_prefetch=7, num_inputs=4, emits=block_max, sem_row=_MAX,
      seq_batch_size=kwargs["seq_batch_size"], bq_sz=kwargs["bq_sz"],
      num_sublanes_bkv=num_sublanes_bkv)
  scalars, (q, weights, values, scales), rest = refs[:7], refs[7:11], refs[11:]
  scores_in, scores, bkv_x2, bscale_x2, bq_x2, bw_x2, bo_x2, sems = rest
  vendored._scores_kernel(
      *scalars, q, weights, values, scores_in, scores, bkv_x2, bq_x2, bw_x2,
      bo_x2, sems, layout=_TwoArrayPages(scales, bscale_x2, sems),
      block_max=hook, **kwargs)


def launch(spec, q, weights, cache, prefetch, start, end, outputs):
  """One `pallas_call` over slots [start, end), `spec.seq_batch_size` per
  program (`streamidx.kernels.driver.KernelBody.launch`): the scores, and
  with "block_max" in `spec.outputs` (token mode) the maxima of its score
  rows in the second buffer f32[max_num_tokens, G, 128]."""
  cache_values, cache_scales = cache
  block_max = block_max_lib.NAME in spec.outputs
  scores = outputs[0]
  page_pool = spec.page_mode
  call, b, bq_sz, bkv_p = spec.call, spec.seq_batch_size, spec.bq_sz, spec.bkv_p
  num_cores = call.num_cores
  scratch = tpu.pair_scratch(
      q, weights, scores, cache_values, cache_scales.shape[1:],
      seq_batch_size=b, bq_sz=bq_sz, bkv_p=bkv_p, page_size=spec.page_size,
      page_mode=page_pool)
  if block_max:  # its buffer: after the scores, in `spec.outputs`' order
    scratch.append(block_max_lib.scratch(
        outputs[1 + spec.outputs.index(block_max_lib.NAME)],
        seq_batch_size=b, bq_sz=bq_sz))
  kernel = functools.partial(
      _dense_kernel, block_max=block_max,
      num_sublanes_bkv=bkv_p * spec.page_size // LANES,
      compression_ratio=call.compression_ratio,
      static_q_len=spec.static_q_len, bkv_p=bkv_p, bq_sz=bq_sz,
      seq_batch_size=b, causal_rule=call.causal_rule,
      interpreted=spec.interpret is not False,
      widen_fp8=tpu.widen_fp8_for_mxu(spec.interpret), num_cores=num_cores,
      **(dict(page_pool_size=spec.page_size,
              pool_by_lane_segments=spec.segment_pool) if page_pool else {}))
  return tpu.pallas_launch(
      kernel, name=tpu.launch_name("Dense", spec.case, bq_sz, bkv_p,
                                   spec.outputs),
      scratch=scratch, num_sem_rows=len(SEMAPHORE_ROWS), prefetch=prefetch,
      start=start, end=end, seq_batch_size=b, num_sem_ids=_NUM_SEM_IDS,
      num_bo_sz=_NUM_BO_SZ, inputs=(q, weights, cache_values, cache_scales),
      outputs=outputs, call=call, interpret=spec.interpret,
      num_cores=num_cores, bkv_p=bkv_p, bq_sz=bq_sz)
