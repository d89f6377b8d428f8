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
fused into the scoring (`_BlockMax`, `topk_method="fused_blockmax"`: the
maxima of every 128-lane score row in a second output, the body's
"block_max", f32[max_num_tokens, G, 128], `block_max_rows`;
docs/topk-methods.md).

`launch` is this variant's one `pallas_call` (token or page mode), which the
driver (`streamidx.kernels.driver`) makes per launch; the entry points are
`streamidx.streamindex_topk_dense` / `streamindex_page_topk_dense`.
"""

from __future__ import annotations

import functools

import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from streamidx import cache as cache_lib
from streamidx import topk
from streamidx.kernels import tpu, vendored
from streamidx.semantics import LANES, cdiv

__all__ = ["launch", "block_max_rows", "block_max_buffer", "SEMAPHORE_ROWS"]

# e4m3 bytes per 32-bit word: the dense cache layout's (streamidx.cache).
KV_PACKING = cache_lib.DENSE_KV_PACKING
# First axis of the semaphore scratch: what each row guards.
SEMAPHORE_ROWS = ("kv", "q", "out", "w", "kv_scale", "block_max")
_KV, _Q, _OUT, _W, _SCALE, _MAX = range(len(SEMAPHORE_ROWS))
# Scalar-prefetch slots: sem_ids (bq, bkv, bo, block-max) and bo_sz (rows in
# flight of the two score slots, then of the two block-max slots).
_NUM_SEM_IDS, _NUM_BO_SZ = 4, 4
assert topk.FUSED_BLOCK_WIDTH == LANES  # one maximum per 128-lane score row


def _block_max_span(num_sublanes_bkv):
  """128-lane rows of maxima one KV block's num_sublanes_bkv maxima can
  touch: they start at a multiple of num_sublanes_bkv, so they straddle a
  row boundary unless one width divides the other."""
  if LANES % num_sublanes_bkv == 0 or num_sublanes_bkv % LANES == 0:
    return cdiv(num_sublanes_bkv, LANES)
  return num_sublanes_bkv // LANES + 2


def block_max_rows(num_sublanes: int, kv_blocks) -> int:
  """G, the 128-lane rows of the block-max output for a score buffer of
  `num_sublanes` 128-lane rows per query row: cdiv(num_sublanes, 128), plus
  one where a KV block's maxima can straddle into a row past them (that row
  stays -inf)."""
  extra = max(_block_max_span(n) - cdiv(n, LANES) for n in kv_blocks)
  return cdiv(num_sublanes, LANES) + extra


def block_max_buffer(num_tokens: int, num_sublanes: int, kv_blocks):
  """The block-max output before the launches: -inf f32[num_tokens, G, 128]
  (G: `block_max_rows`; the driver's `Output` "block_max" buffer)."""
  return jnp.full((num_tokens, block_max_rows(num_sublanes, kv_blocks), LANES),
                  -jnp.inf, jnp.float32)


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


class _BlockMax:
  """The vendored pipeline's `block_max` hook (M16, token mode): the
  maximum of every 128-lane score row collects in `bmax_x2_ref` [2, B *
  bq_sz, G, 128] over a query block's KV loop and goes to `bmax_hbm_ref`
  in one DMA after it (a DMA writes whole 128-lane rows; a KV block holds
  only a few maxima). Slot `sem_ids[3]`, rows in flight `bo_sz[2 + slot]`,
  semaphore row "block_max"."""

  def __init__(self, bmax_hbm_ref, bmax_x2_ref, sems, sem_ids_ref, bo_sz_ref,
               *, seq_batch_size, bq_sz, num_sublanes_bkv):
    self.hbm, self.vmem, self.sems = bmax_hbm_ref, bmax_x2_ref, sems
    self.sem_ids, self.bo_sz = sem_ids_ref, bo_sz_ref
    self.b_sz, self.bq_sz, self.n = seq_batch_size, bq_sz, num_sublanes_bkv
    self.slot = None

  def wait(self, slot):
    old = self.bo_sz[2 + slot]

    @pl.when(old > 0)  # no DMA was started for zero rows (M7)
    def _():
      dst = self.vmem.at[slot, pl.ds(0, self.b_sz * old)]
      pltpu.make_async_copy(dst, dst, self.sems.at[_MAX, slot, 0]).wait()

  def acquire(self, sz):
    self.slot = slot = self.sem_ids[3]

    @pl.when(sz > 0)
    def _():
      self.wait(slot)
      self.vmem[slot, ...] = jnp.full(self.vmem.shape[1:], -jnp.inf,
                                      jnp.float32)

  def put(self, b, s, bkv_idx):
    """The maxima of the 128-lane rows of `s` (f32[bq_sz, bkv_sz], sequence
    b's scores for KV block bkv_idx): score rows bkv_idx * n + i, at most
    two 128-lane rows of maxima (loaded, selected into, stored)."""
    first = bkv_idx * self.n
    maxima = [s[:, i * LANES:(i + 1) * LANES].max(axis=1, keepdims=True)
              for i in range(self.n)]
    lane = lax.broadcasted_iota(jnp.int32, (self.bq_sz, LANES), 1)
    rows = pl.ds(b * self.bq_sz, self.bq_sz)
    for g in range(_block_max_span(self.n)):
      g_row = first // LANES + g
      row = self.vmem[self.slot, rows, g_row, :]
      for i, m in enumerate(maxima):
        row = jnp.where(lane == first + i - g_row * LANES, m, row)
      self.vmem[self.slot, rows, g_row, :] = row

  def send(self, sz, token_start):
    slot = self.slot

    @pl.when(sz > 0)
    def _():
      self.bo_sz[2 + slot] = sz
      pltpu.make_async_copy(
          self.vmem.at[slot, pl.ds(0, self.b_sz * sz)],
          self.hbm.at[pl.ds(token_start, self.b_sz * sz)],
          self.sems.at[_MAX, slot, 0]).start()
      self.sem_ids[3] = 1 - slot


def _dense_kernel(*refs, block_max: bool, **kwargs):
  """The vendored `_scores_kernel` over the dense layout's refs: scalar
  prefetch (7), q, weights, values, scales (HBM), the aliased score buffer
  [and block-max buffer], their outputs, then the scratch: bkv_x2,
  bscale_x2, bq_x2, bw_x2, bo_x2 [, bmax_x2], sems DMA[6, 2, B]."""
  scalars, (q, weights, values, scales), rest = refs[:7], refs[7:11], refs[11:]
  if block_max:
    (scores_in, _, scores, bmax, bkv_x2, bscale_x2, bq_x2, bw_x2, bo_x2,
     bmax_x2, sems) = rest
  else:
    scores_in, scores, bkv_x2, bscale_x2, bq_x2, bw_x2, bo_x2, sems = rest
  hook = None
  if block_max:
    hook = _BlockMax(bmax, bmax_x2, sems, scalars[5], scalars[6],
                     seq_batch_size=kwargs["seq_batch_size"],
                     bq_sz=kwargs["bq_sz"],
                     num_sublanes_bkv=bkv_x2.shape[2] * KV_PACKING // LANES)
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
  block_max = "block_max" in spec.outputs
  scores = outputs[0]
  page_pool = spec.page_mode
  call, b, bq_sz, bkv_p = spec.call, spec.seq_batch_size, spec.bq_sz, spec.bkv_p
  num_cores = call.num_cores
  scratch = tpu.pair_scratch(
      q, weights, scores, cache_values, cache_scales.shape[1:],
      seq_batch_size=b, bq_sz=bq_sz, bkv_p=bkv_p, page_size=spec.page_size,
      page_mode=page_pool)
  if block_max:  # its buffer: after the scores, in `spec.outputs`' order
    bmax = outputs[1 + spec.outputs.index("block_max")]
    scratch.append(("bmax_x2", (2, b * bq_sz, bmax.shape[1], LANES),
                    jnp.dtype(jnp.float32)))
  kernel = functools.partial(
      _dense_kernel, block_max=block_max,
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
