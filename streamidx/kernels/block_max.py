"""The kernel output "block_max": the maximum of every 128-entry score row.

Every token-mode body writes it beside the scores when the selection reads it
(`topk_method="fused_blockmax"`): f32[max_num_tokens, G, 128] (`rows`, the -inf
`buffer`), maximum j of row t that of scores[t, 128 j:128 (j+1)]. The write is
one hook (`BlockMax`), which the vendored pipeline calls (M16, so the vendored,
dense and fp4 bodies get it) and the lean body calls from its own loop; a launch
takes its setup from `launch_kwargs` and the hook's refs from `split_refs`. The
hook's state, after a body's own: the slot `sem_ids[3]`, rows in flight `bo_sz[2
+ slot]`, semaphore row `SEM_ROW` (after a two-array layout's five), scratch
"bmax_x2" f32[2, B * bq_sz, G, 128], last.
"""

from __future__ import annotations

import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from streamidx import topk
from streamidx.semantics import LANES, cdiv

NAME = "block_max"
assert topk.FUSED_BLOCK_WIDTH == LANES  # one maximum per 128-lane score row
# The hook's scalar-prefetch slots, after a body's three sem_ids and two
# bo_sz: sem_ids[3], bo_sz[2], bo_sz[3]; its semaphore row.
NUM_SEM_IDS, NUM_BO_SZ = 4, 4
_SEM_ID, _BO_SZ = 3, 2
SEM_ROW = 5


def _span(num_sublanes_bkv):
  """128-lane rows of maxima one KV block's num_sublanes_bkv maxima can
  touch: they start at a multiple of num_sublanes_bkv, so they straddle a
  row boundary unless one width divides the other."""
  if LANES % num_sublanes_bkv == 0 or num_sublanes_bkv % LANES == 0:
    return cdiv(num_sublanes_bkv, LANES)
  return num_sublanes_bkv // LANES + 2


def rows(num_sublanes: int, kv_blocks) -> int:
  """G, the 128-lane rows of the block-max output for a score buffer of
  `num_sublanes` 128-lane rows per query row: cdiv(num_sublanes, 128), plus
  one where a KV block's maxima can straddle into a row past them (that row
  stays -inf)."""
  extra = max(_span(n) - cdiv(n, LANES) for n in kv_blocks)
  return cdiv(num_sublanes, LANES) + extra


def buffer(num_tokens: int, num_sublanes: int, kv_blocks):
  """The block-max output before the launches: -inf f32[num_tokens, G, 128]
  (G: `rows`; the driver's `Output` "block_max" buffer)."""
  return jnp.full((num_tokens, rows(num_sublanes, kv_blocks), LANES),
                  -jnp.inf, jnp.float32)


def launch_kwargs(spec, outputs, scratch, *, num_sem_rows: int) -> dict:
  """A body launch's scratch and scalar slots for `tpu.pallas_launch`: its
  own (3 sem_ids, 2 bo_sz), and with `NAME` in `spec.outputs` the hook's
  ("bmax_x2" last, semaphore rows through `SEM_ROW`)."""
  if NAME not in spec.outputs:
    return dict(scratch=list(scratch), num_sem_rows=num_sem_rows,
                num_sem_ids=3, num_bo_sz=2)
  out = outputs[1 + spec.outputs.index(NAME)]
  bmax_x2 = ("bmax_x2", (2, spec.seq_batch_size * spec.bq_sz, out.shape[1],
                         LANES), jnp.dtype(jnp.float32))
  return dict(scratch=[*scratch, bmax_x2], num_sem_rows=SEM_ROW + 1,
              num_sem_ids=NUM_SEM_IDS, num_bo_sz=NUM_BO_SZ)


def split_refs(refs, *, num_prefetch: int, num_inputs: int, emits: bool,
               seq_batch_size: int, bq_sz: int, num_sublanes_bkv: int):
  """A launch's kernel refs without the hook's, and the hook (None unless
  `emits`): refs are the scalar prefetch, the inputs, the aliased outputs
  (scores[, block_max]), the outputs, the scratch [, bmax_x2], the
  semaphores, as `tpu.pallas_launch` passes them."""
  if not emits:
    return list(refs), None
  refs = list(refs)
  first_out = num_prefetch + num_inputs
  bmax_hbm, bmax_x2, sems = refs[first_out + 3], refs[-2], refs[-1]
  sem_ids, bo_sz = refs[num_prefetch - 2], refs[num_prefetch - 1]
  del refs[first_out + 3], refs[first_out + 1]  # its output and its alias
  del refs[-2]
  return refs, BlockMax(bmax_hbm, bmax_x2, sems, sem_ids, bo_sz,
                        seq_batch_size=seq_batch_size,
                        bq_sz=bq_sz, num_sublanes_bkv=num_sublanes_bkv)


class BlockMax:
  """The hook (token mode): the maxima collect in `bmax_x2_ref` over a query
  block's KV loop and go to `bmax_hbm_ref` in one DMA after it. A body calls
  `acquire(sz)` before the KV loop of a query block of sz rows, `put(b,
  scores, bkv_idx)` for each KV block with rows, `send(sz, token_start)`
  after the loop and `wait(slot)` for both slots at its end."""

  def __init__(self, bmax_hbm_ref, bmax_x2_ref, sems, sem_ids_ref, bo_sz_ref,
               *, seq_batch_size, bq_sz, num_sublanes_bkv):
    self.hbm, self.vmem, self.sems = bmax_hbm_ref, bmax_x2_ref, sems
    self.sem_ids, self.bo_sz = sem_ids_ref, bo_sz_ref
    self.b_sz, self.bq_sz, self.n = seq_batch_size, bq_sz, num_sublanes_bkv
    self.slot = None

  def wait(self, slot):
    old = self.bo_sz[_BO_SZ + slot]

    @pl.when(old > 0)  # no DMA was started for zero rows (M7)
    def _():
      dst = self.vmem.at[slot, pl.ds(0, self.b_sz * old)]
      pltpu.make_async_copy(dst, dst, self.sems.at[SEM_ROW, slot, 0]).wait()

  def acquire(self, sz):
    self.slot = slot = self.sem_ids[_SEM_ID]

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
    rows_b = pl.ds(b * self.bq_sz, self.bq_sz)
    for g in range(_span(self.n)):
      g_row = first // LANES + g
      row = self.vmem[self.slot, rows_b, g_row, :]
      for i, m in enumerate(maxima):
        row = jnp.where(lane == first + i - g_row * LANES, m, row)
      self.vmem[self.slot, rows_b, g_row, :] = row

  def send(self, sz, token_start):
    slot = self.slot

    @pl.when(sz > 0)
    def _():
      self.bo_sz[_BO_SZ + slot] = sz
      pltpu.make_async_copy(
          self.vmem.at[slot, pl.ds(0, self.b_sz * sz)],
          self.hbm.at[pl.ds(token_start, self.b_sz * sz)],
          self.sems.at[SEM_ROW, slot, 0]).start()
      self.sem_ids[_SEM_ID] = 1 - slot
