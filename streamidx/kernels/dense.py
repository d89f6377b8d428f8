"""StreamIndex top-k over the dense FP8 cache (129 B per entry, not 256).

The vendored kernel (`streamidx/kernels/vendored.py`) reads the packed FP8
record: 128 e4m3 bytes, one e8m0 scale byte and 127 bytes of padding per
entry, because its cache has one array whose rows are whole 128-lane
records. This kernel reads the same values and scales from two arrays
(`streamidx.cache.pack_dense_fp8_cache`)::

    cache_values  u8[total_pages, page_size // 4, 4, head_dim]   e4m3 bytes
    cache_scales  u8[total_pages, page_size // L, L]             e8m0 bytes

so a KV block costs two DMAs per page (values, scales) and moves head_dim + 1
bytes per entry. Everything else is the vendored kernel's (its local modifications included:
M3 causal rules, M4 the chunked-prefill launch, M7 no DMA for a sequence
without queries, M8 entries past the page table invisible, M9
`return_scores`, M10 bf16 widening on v4, M11 the VMEM check, M12
`topk_method`, M13 length-sorted decode, M14 no empty launches): the same launches
(`semantics.token_launches`), double-buffered query, KV and score blocks
carried across the programs of a launch, the same arithmetic order (the dot
on the stored e4m3 values in f32, ReLU, the weighted head sum, then the
entry's power-of-two scale, exact), the same masks and causal rules, the
same final top-k, and the vendored wrapper's clamps (page-table slots past
the table to its last slot, pages past the cache to the last page). It also
has the streamidx options of the vendored kernel: `causal_rule`,
`sort_decode` (length-sorted decode batching) and no launch for an empty
range.

Differences from the vendored body, all from the layout:
- the KV block of each sequence is two VMEM buffers, values
  `[bkv_p * page_size // 4, 4, head_dim]` and scales `[bkv_p, page_size //
  L, L]`, each page DMA'd by indexing the leading (untiled) dimension of the
  HBM array, compiled and interpreted alike (no `ref.reshape`);
- the scales come as lanes (entry order) already: no transpose of a record
  column, one bitcast + convert of bkv_sz bytes per block;
- the semaphore array has a fifth row for the scale DMAs and a sixth for
  the block maxima (`sems[(kv, q, out, w, kv_scale, block_max), slot,
  batch_idx]`).

A selection fused into the scoring (`topk_method="fused_blockmax"`, token
mode; `streamidx.topk`): each launch also writes the maximum of every
128-lane row of its scores (128 entries, aligned with every KV block) into a
second output, f32[max_num_tokens, G, 128] (lane l of row g: score row
128 g + l; G = cdiv(score rows, 128), one more where a KV block's maxima can
straddle two rows of maxima), 1/128 of the score buffer. A query block's
maxima collect in a VMEM buffer (`bmax_x2`, double-buffered like page
mode's pooled rows) over its KV loop and go to HBM in one DMA after it: a
DMA writes whole 128-lane rows, and a KV block holds only a few maxima. The
selection then reads the maxima instead of the buffer for its first stage.

`launch` is this body's one `pallas_call` (token or page mode), which the
driver (`streamidx.kernels.driver`) makes per launch; the entry points are
`streamidx.streamindex_topk_dense` / `streamindex_page_topk_dense`.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from streamidx import cache as cache_lib
from streamidx import semantics
from streamidx import topk
from streamidx.kernels import tpu
from streamidx.semantics import LANES, causal_visible_bound, cdiv

__all__ = ["launch", "block_max_rows", "SEMAPHORE_ROWS"]

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


def _dense_kernel(
    # Scalar prefetch
    seq_lens_ref,  # i32[max_num_seqs] (slot order)
    page_indices_ref,  # i32[max_num_seqs * pages_per_seq] (slot order)
    cu_q_lens_ref,  # i32[max_num_seqs + 1]
    q_rows_ref,  # i32[max_num_seqs]: first query row of each slot's sequence
    range_ref,  # i32[2]: (start_seq_idx, end_seq_idx) of the launch
    sem_ids_ref,  # i32[4]: current (bq, bkv, bo, bmax) double-buffer slots
    bo_sz_ref,  # i32[4]: rows of each output slot's DMA in flight (-1: none):
    #   score slots 0, 1, then block-max slots 0, 1
    # Inputs (HBM)
    q_hbm_ref,  # [max_num_tokens, num_q_heads, head_dim]
    weights_hbm_ref,  # f32[max_num_tokens, num_q_heads]
    values_hbm_ref,  # u8[total_pages, page_size // 4, 4, head_dim]
    scales_hbm_ref,  # u8[total_pages, page_size // L, L]
    *refs,
    compression_ratio: int,
    static_q_len: int | None,
    bkv_p: int,
    bq_sz: int,
    seq_batch_size: int,
    causal_rule: str,
    page_pool: bool,
    num_cores: int,
    bf16_dot: bool,
    block_max: bool = False,
    segment_pool: bool = False,
):
  """One program: `seq_batch_size` consecutive slots of the launch's range.

  Loops over the query blocks of its slots and, for each, the KV blocks of
  its longest sequence; prefetches the next (query block, KV block), also
  across programs, so a core's first program starts the first fetches
  (prologue) and its last drains the score DMAs (epilogue).

  num_cores > 1: the grid is (num_cores, programs per core), the first axis
  "parallel"; core c runs programs c, c + num_cores, ... of the launch (a
  sorted decode range interleaves long and short programs over the cores),
  each core its own pipeline over its own scratch and prefetch state, which
  its prologue resets (a chip with one TensorCore runs the cores' programs
  one after another). num_cores == 1 is the vendored one-axis grid.

  refs, after the cache (HBM), then scratch:
    scores_in_hbm_ref    aliased to scores_hbm_ref
    [bmax_in_hbm_ref]    block_max only: aliased to bmax_hbm_ref
    scores_hbm_ref       f32[max_num_tokens, num_score_sublanes, 128]
    [bmax_hbm_ref]       block_max only: f32[max_num_tokens, G, 128], lane
                         l of row g the maximum of score row 128 g + l
                         (entries [128 (128 g + l), +128))
    bkv_x2_ref           u8[2, B, bkv_p * page_size // 4, 4, head_dim]
    bscale_x2_ref        u8[2, B, bkv_p, page_size // L, L]
    bq_x2_ref            [2, B, bq_sz, num_q_heads, head_dim]
    bw_x2_ref            f32[2, B, bq_sz, num_q_heads]
    bo_x2_ref            f32[2, B * bq_sz, num_sublanes_bkv, 128]
                         (page: [2, bq_sz, S, 128])
    [bmax_x2_ref]        block_max only: f32[2, B * bq_sz, G, 128], one query
                         block's maxima, sent once per query block
    sems                 DMA[6, 2, B]

  block_max (token mode): also write the maximum of every 128-lane row of
  the scores (`streamidx.topk`'s "fused_blockmax" reads them).
  """
  if block_max:
    (scores_in_hbm_ref, bmax_in_hbm_ref, scores_hbm_ref, bmax_hbm_ref,
     bkv_x2_ref, bscale_x2_ref, bq_x2_ref, bw_x2_ref, bo_x2_ref, bmax_x2_ref,
     sems) = refs
    del bmax_in_hbm_ref  # aliased: bmax_hbm_ref is the same buffer
  else:
    (scores_in_hbm_ref, scores_hbm_ref, bkv_x2_ref, bscale_x2_ref, bq_x2_ref,
     bw_x2_ref, bo_x2_ref, sems) = refs
  del scores_in_hbm_ref  # aliased: scores_hbm_ref is the same buffer
  b_sz = seq_batch_size
  _, num_q_heads, head_dim = q_hbm_ref.shape
  total_pages, rows_per_page, _, _ = values_hbm_ref.shape
  page_size = rows_per_page * KV_PACKING
  num_page_indices = page_indices_ref.shape[0]
  pages_per_seq = num_page_indices // seq_lens_ref.shape[0]
  bkv_sz = bkv_p * page_size
  num_sublanes_bkv = bkv_sz // LANES

  start_seq_idx = range_ref[0]
  end_seq_idx = range_ref[1]
  num_programs = (end_seq_idx - start_seq_idx) // b_sz
  if num_cores == 1:
    program = pl.program_id(0)
    first = program == 0
  else:
    program = pl.program_id(1) * num_cores + pl.program_id(0)
    first = pl.program_id(1) == 0
  # A core's grid row may end past the launch's programs: such a step does
  # nothing (its metadata reads stay inside the arrays).
  active = program < num_programs
  batch_start = start_seq_idx + jnp.maximum(
      0, jnp.minimum(program, num_programs - 1)) * b_sz
  stride = num_cores * b_sz  # slots from this program to the core's next

  q_lens, seq_lens, kv_lens = [], [], []
  for b in range(b_sz):
    q_lens.append(cu_q_lens_ref[batch_start + b + 1]
                  - cu_q_lens_ref[batch_start + b])
    seq_lens.append(seq_lens_ref[batch_start + b])
    # Entries past the page table are invisible (the vendored M8).
    kv_lens.append(jnp.minimum(seq_lens[-1] // compression_ratio,
                               pages_per_seq * page_size))

  def copy(src, dst, sem, *, wait):
    cp = pltpu.make_async_copy(src, dst, sem)
    if wait:
      cp.wait()
    else:
      cp.start()

  # -- query blocks -----------------------------------------------------------

  def fetch_bq(seq_idx, bq_idx, slot, *, wait):
    for b in range(b_sz):
      start = cu_q_lens_ref[seq_idx + b] + bq_idx * bq_sz
      sz = jnp.maximum(0, jnp.minimum(bq_sz, cu_q_lens_ref[seq_idx + b + 1]
                                      - start))
      src_row = q_rows_ref[seq_idx + b] + bq_idx * bq_sz

      # No zero-row DMA (a sequence without queries), as the vendored
      # kernel's M7: start and wait test the same predicate.
      @pl.when(sz > 0)
      def _(b=b, sz=sz, src_row=src_row):
        q_dst = bq_x2_ref.at[slot, b, pl.ds(0, sz)]
        w_dst = bw_x2_ref.at[slot, b, pl.ds(0, sz)]
        if wait:
          copy(q_dst, q_dst, sems.at[_Q, slot, b], wait=True)
          copy(w_dst, w_dst, sems.at[_W, slot, b], wait=True)
        else:
          copy(q_hbm_ref.at[pl.ds(src_row, sz)], q_dst,
               sems.at[_Q, slot, b], wait=False)
          copy(weights_hbm_ref.at[pl.ds(src_row, sz)], w_dst,
               sems.at[_W, slot, b], wait=False)

  # -- KV blocks: one values DMA and one scales DMA per page ------------------

  def fetch_bkv(seq_idx, bkv_idx, slot, *, wait):
    for b in range(b_sz):
      values_vmem = bkv_x2_ref.at[slot, b]
      scales_vmem = bscale_x2_ref.at[slot, b]
      value_sem = sems.at[_KV, slot, b]
      scale_sem = sems.at[_SCALE, slot, b]
      # A sequence without queries fetches no KV (M7): start and wait test
      # the same predicate.
      has_queries = (cu_q_lens_ref[seq_idx + b + 1]
                     > cu_q_lens_ref[seq_idx + b])
      if wait:

        @pl.when(has_queries)
        def _(values_vmem=values_vmem, scales_vmem=scales_vmem,
              value_sem=value_sem, scale_sem=scale_sem):
          copy(values_vmem, values_vmem, value_sem, wait=True)
          copy(scales_vmem, scales_vmem, scale_sem, wait=True)

        continue
      offset = (seq_idx + b) * pages_per_seq + bkv_idx * bkv_p

      def start_page(i, carry, offset=offset, values_vmem=values_vmem,
                     scales_vmem=scales_vmem, value_sem=value_sem,
                     scale_sem=scale_sem):
        # The vendored clamps: table slot, then physical page.
        slot_idx = jnp.minimum(offset + i, num_page_indices - 1)
        page = jnp.minimum(page_indices_ref[slot_idx], total_pages - 1)
        copy(values_hbm_ref.at[page],
             values_vmem.at[pl.ds(i * rows_per_page, rows_per_page)],
             value_sem, wait=False)
        copy(scales_hbm_ref.at[page], scales_vmem.at[i], scale_sem,
             wait=False)
        return carry

      @pl.when(has_queries)
      def _(start_page=start_page):
        if bkv_p > 64:  # page mode's 128-page blocks: a loop, not 128 copies
          lax.fori_loop(0, bkv_p, start_page, None, unroll=False)
        else:
          for i in range(bkv_p):
            start_page(i, None)

  def load_bkv(slot, b):
    """(e4m3 values [bkv_sz, head_dim], f32 scales [1, bkv_sz]) of slot b."""
    raw = bkv_x2_ref[slot, b].reshape(bkv_sz, head_dim)
    values = pltpu.bitcast(raw, jnp.float8_e4m3fn)
    if bf16_dot:  # v4 (the vendored M10); exact: e4m3 values are bf16 values
      values = values.astype(jnp.bfloat16)
    scale_bytes = bscale_x2_ref[slot, b].reshape(1, bkv_sz)
    scales = pltpu.bitcast(scale_bytes, jnp.float8_e8m0fnu)
    return values, scales.astype(jnp.bfloat16).astype(jnp.float32)

  # -- scores ------------------------------------------------------------------

  def visible_ends(bq_idx):
    ends = []
    for b in range(b_sz):
      q_pos = (seq_lens[b] - q_lens[b] + bq_idx * bq_sz
               + jnp.arange(bq_sz, dtype=jnp.int32))
      ends.append(causal_visible_bound(q_pos, compression_ratio, causal_rule))
    return ends

  def block_scores(bq, weights, values, scales, visible_end, kv_len, bkv_idx):
    """Masked f32 scores [bq_sz, bkv_sz] of one query block x one KV block."""
    s = jnp.einsum("nd,md->nm", bq.reshape(-1, head_dim), values,
                   preferred_element_type=jnp.float32)
    s = jnp.maximum(s.reshape(bq_sz, num_q_heads, bkv_sz), 0.0)
    s = (s * weights.astype(jnp.float32)[:, :, None]).sum(axis=1)
    s = s * scales
    k_span = bkv_idx * bkv_sz + lax.broadcasted_iota(jnp.int32, s.shape, 1)
    mask = (k_span < kv_len) & (k_span < visible_end[:, None])
    return jnp.where(mask, s, -jnp.inf)

  def wait_send(slot):
    old = bo_sz_ref[slot]

    @pl.when(old > 0)  # no DMA was started for zero rows
    def _():
      dst = bo_x2_ref.at[slot, pl.ds(0, b_sz * old)]
      copy(dst, dst, sems.at[_OUT, slot, 0], wait=True)

  def start_send(slot, sz, token_start, col):
    bo_sz_ref[slot] = sz
    num_cols = bo_x2_ref.shape[2]
    copy(bo_x2_ref.at[slot, pl.ds(0, b_sz * sz)],
         scores_hbm_ref.at[pl.ds(token_start, b_sz * sz),
                           pl.ds(col, num_cols)],
         sems.at[_OUT, slot, 0], wait=False)

  # -- block maxima (block_max): one query block's row of maxima in VMEM,
  # sent whole once its KV loop ends (a DMA writes whole 128-lane rows) ------

  def wait_send_max(slot):
    old = bo_sz_ref[2 + slot]

    @pl.when(old > 0)
    def _():
      dst = bmax_x2_ref.at[slot, pl.ds(0, b_sz * old)]
      copy(dst, dst, sems.at[_MAX, slot, 0], wait=True)

  def start_send_max(slot, sz, token_start):
    bo_sz_ref[2 + slot] = sz
    copy(bmax_x2_ref.at[slot, pl.ds(0, b_sz * sz)],
         bmax_hbm_ref.at[pl.ds(token_start, b_sz * sz)],
         sems.at[_MAX, slot, 0], wait=False)

  def put_block_max(slot, b, s, bkv_idx):
    """The maxima of the num_sublanes_bkv 128-lane rows of `s` (f32[bq_sz,
    bkv_sz], sequence b's scores for KV block bkv_idx) into their lanes of
    the block-max buffer: score rows bkv_idx * num_sublanes_bkv + i, at
    most two 128-lane rows of maxima (loaded, selected into, stored)."""
    first = bkv_idx * num_sublanes_bkv
    maxima = [s[:, i * LANES:(i + 1) * LANES].max(axis=1, keepdims=True)
              for i in range(num_sublanes_bkv)]
    lane = lax.broadcasted_iota(jnp.int32, (bq_sz, LANES), 1)
    rows = pl.ds(b * bq_sz, bq_sz)
    for g in range(_block_max_span(num_sublanes_bkv)):
      g_row = first // LANES + g
      row = bmax_x2_ref[slot, rows, g_row, :]
      for i, m in enumerate(maxima):
        row = jnp.where(lane == first + i - g_row * LANES, m, row)
      bmax_x2_ref[slot, rows, g_row, :] = row

  # -- the loops ---------------------------------------------------------------

  kv_len_max = kv_lens[0]
  for kv in kv_lens[1:]:
    kv_len_max = jnp.maximum(kv_len_max, kv)
  num_bkv = jnp.maximum(1, cdiv(kv_len_max, bkv_sz))
  # A program whose sequences have no queries runs one (empty) KV step: it
  # only prefetches the next program's blocks (M7).
  has_queries = q_lens[0] > 0
  for q_len in q_lens[1:]:
    has_queries = has_queries | (q_len > 0)
  num_bkv = jnp.where(has_queries, num_bkv, 1)
  if static_q_len is None:
    num_bq = jnp.maximum(1, cdiv(q_lens[0], bq_sz))
  else:
    num_bq = max(1, cdiv(static_q_len, bq_sz))

  def next_ids(bq_idx, bkv_idx):
    """(seq, bq, bkv) after this step; seq moves to the next program."""
    last_bkv = bkv_idx + 1 == num_bkv
    nbkv = lax.select(last_bkv, 0, bkv_idx + 1)
    nbq = lax.select(last_bkv, bq_idx + 1, bq_idx)
    last_bq = nbq == num_bq
    nseq = lax.select(last_bq, batch_start + stride, batch_start)
    return nseq, lax.select(last_bq, 0, nbq), nbkv

  def with_bq(bq_idx, _):
    bq_slot = sem_ids_ref[0]
    nseq, nbq, _ = next_ids(bq_idx, num_bkv - 1)

    @pl.when(nseq < end_seq_idx)
    def _():
      sem_ids_ref[0] = 1 - bq_slot
      fetch_bq(nseq, nbq, 1 - bq_slot, wait=False)

    ends = visible_ends(bq_idx)
    fetch_bq(batch_start, bq_idx, bq_slot, wait=True)
    bqs = [bq_x2_ref[bq_slot, b] for b in range(b_sz)]
    weights = [bw_x2_ref[bq_slot, b] for b in range(b_sz)]
    token_start = cu_q_lens_ref[batch_start] + bq_idx * bq_sz
    sz = jnp.maximum(0, jnp.minimum(bq_sz, cu_q_lens_ref[batch_start + 1]
                                    - token_start))
    if page_pool:
      # Page mode: the pooled row of every KV block goes into one output
      # buffer, sent once per query block; acquire it before filling it
      # (a query block without rows acquires, computes and sends nothing).
      bo_slot = sem_ids_ref[2]

      @pl.when(sz > 0)
      def _():
        wait_send(bo_slot)
        bo_x2_ref[bo_slot, ...] = jnp.full(bo_x2_ref.shape[1:], -jnp.inf,
                                           jnp.float32)
    if block_max:
      # The query block's maxima, filled over its KV loop and sent after it
      # (as page mode's pooled rows); acquire the slot first.
      bmax_slot = sem_ids_ref[3]

      @pl.when(sz > 0)
      def _():
        wait_send_max(bmax_slot)
        bmax_x2_ref[bmax_slot, ...] = jnp.full(bmax_x2_ref.shape[1:],
                                               -jnp.inf, jnp.float32)

    def with_bkv(bkv_idx, _):
      bkv_slot = sem_ids_ref[1]
      nseq, _, nbkv = next_ids(bq_idx, bkv_idx)

      @pl.when(nseq < end_seq_idx)
      def _():
        sem_ids_ref[1] = 1 - bkv_slot
        fetch_bkv(nseq, nbkv, 1 - bkv_slot, wait=False)

      fetch_bkv(batch_start, bkv_idx, bkv_slot, wait=True)

      # A query block without rows computes and sends nothing (M7).
      @pl.when(sz > 0)
      def _():
        out = []
        for b in range(b_sz):
          values, scales = load_bkv(bkv_slot, b)
          s = block_scores(bqs[b], weights[b], values, scales, ends[b],
                           kv_lens[b], bkv_idx)
          if page_pool:
            # Max-pool each page (ratio 1: a page is page_size columns);
            # by lane segments where the chip cannot split lanes (M15).
            if segment_pool:
              out.append(tpu.pool_pages_by_lane_segments(s, page_size))
            else:
              out.append(s.reshape(bq_sz, bkv_p, page_size).max(axis=-1))
          else:
            out.append(s.reshape(bq_sz, num_sublanes_bkv, LANES))
            if block_max:
              put_block_max(bmax_slot, b, s, bkv_idx)
        if page_pool:
          bo_x2_ref[bo_slot, :, bkv_idx, :] = out[0]
        else:
          out_slot = sem_ids_ref[2]
          wait_send(out_slot)
          bo_x2_ref[out_slot, ...] = jnp.concatenate(out, axis=0)
          start_send(out_slot, sz, token_start, bkv_idx * num_sublanes_bkv)
          sem_ids_ref[2] = 1 - out_slot

    lax.fori_loop(0, num_bkv, with_bkv, None, unroll=False)
    if page_pool:

      @pl.when(sz > 0)
      def _():
        start_send(bo_slot, sz, token_start, 0)

      sem_ids_ref[2] = 1 - bo_slot
    if block_max:

      @pl.when(sz > 0)
      def _():
        start_send_max(bmax_slot, sz, token_start)
        sem_ids_ref[3] = 1 - bmax_slot

  @pl.when(active & first)
  def _prologue():
    if num_cores > 1:  # the previous core's state, on a one-core chip
      for i in range(_NUM_SEM_IDS):
        sem_ids_ref[i] = 0
      for i in range(_NUM_BO_SZ):
        bo_sz_ref[i] = -1
    fetch_bq(batch_start, 0, 0, wait=False)
    fetch_bkv(batch_start, 0, 0, wait=False)

  @pl.when(active)
  def _program():
    lax.fori_loop(0, num_bq, with_bq, None, unroll=False)

  @pl.when(active & (batch_start + stride >= end_seq_idx))
  def _epilogue():
    for slot in range(2):
      wait_send(slot)
      if block_max:
        wait_send_max(slot)


def launch(q, weights, cache, scores, bmax, prefetch, *, start, end,
           seq_batch_size, static_q_len, bq_sz, bkv_p, num_queries_per_block,
           case, call, interpret, segment_pool=False):
  """One `pallas_call` over slots [start, end), `seq_batch_size` per program
  (`streamidx.kernels.driver.KernelBody.launch`).

  bmax: None, or the block-max buffer f32[max_num_tokens, G, 128] (token
  mode): the call then also writes the maxima of its score rows there and
  returns (scores, bmax).
  """
  del num_queries_per_block
  cache_values, cache_scales = cache
  block_max = bmax is not None
  page_pool = case == "page"
  num_cores, vmem_limit_bytes = call.num_cores, call.vmem_limit_bytes
  name = (f"StreamIdxDensePageTC-bq_{bq_sz}-bkvp_{bkv_p}" if page_pool else
          f"StreamIdxDenseTC-{case}-bq_{bq_sz}-bkvp_{bkv_p}"
          + ("-bmax" if block_max else ""))
  _, num_q_heads, head_dim = q.shape
  _, rows_per_page, _, _ = cache_values.shape
  _, scale_rows, scale_lanes = cache_scales.shape
  page_size = rows_per_page * KV_PACKING
  b = seq_batch_size
  out_sublanes = scores.shape[1] if page_pool else bkv_p * page_size // LANES
  # The vendored launch's buffers (`semantics.launch_scratch`, lkv_dim =
  # head_dim) and the scale buffer after the values'.
  scratch = list(semantics.launch_scratch(
      seq_batch_size=b, bq_sz=bq_sz, bkv_p=bkv_p,
      page_size_per_kv_packing=rows_per_page, kv_packing=KV_PACKING,
      lkv_dim=head_dim, cache_dtype=jnp.uint8, num_q_heads=num_q_heads,
      head_dim=head_dim, q_dtype=q.dtype, weights_dtype=weights.dtype,
      num_out_sublanes=out_sublanes))
  scratch.insert(1, ("bscale_x2", (2, b, bkv_p, scale_rows, scale_lanes),
                     jnp.dtype(jnp.uint8)))
  if block_max:
    scratch.append(("bmax_x2", (2, b * bq_sz, bmax.shape[1], LANES),
                    jnp.dtype(jnp.float32)))
  if interpret is False:  # the vendored M11 check
    tpu.check_launch_vmem(
        scratch, case=name, vmem_limit_bytes=vmem_limit_bytes,
        blocks=(f"num_kv_pages_per_block={bkv_p}, query rows per block "
                f"{bq_sz}, {b} sequence(s) per program"))
  scratch_shapes = [pltpu.VMEM(shape, dtype) for _, shape, dtype in scratch]
  scratch_shapes.append(pltpu.SemaphoreType.DMA((len(SEMAPHORE_ROWS), 2, b)))
  seq_lens, page_indices, cu_q_lens, q_rows = prefetch
  scalars = (seq_lens, page_indices, cu_q_lens, q_rows,
             jnp.stack([jnp.asarray(start, jnp.int32),
                        jnp.asarray(end, jnp.int32)]),
             jnp.zeros((_NUM_SEM_IDS,), jnp.int32),
             jnp.full((_NUM_BO_SZ,), -1, jnp.int32))
  hbm = pl.BlockSpec(memory_space=pltpu.HBM)
  num_programs = (jnp.asarray(end, jnp.int32) - start) // b
  if num_cores == 1:
    grid, semantics_ = (num_programs,), ("arbitrary",)
  else:
    grid = (num_cores, cdiv(num_programs, num_cores))
    semantics_ = ("parallel", "arbitrary")
  kernel = pl.pallas_call(
      functools.partial(
          _dense_kernel, compression_ratio=call.compression_ratio,
          static_q_len=static_q_len, bkv_p=bkv_p, bq_sz=bq_sz,
          seq_batch_size=b, causal_rule=call.causal_rule, page_pool=page_pool,
          num_cores=num_cores, bf16_dot=tpu.widen_fp8_for_mxu(interpret),
          block_max=block_max, segment_pool=segment_pool),
      grid_spec=pltpu.PrefetchScalarGridSpec(
          num_scalar_prefetch=len(scalars),
          in_specs=[hbm] * (6 if block_max else 5),
          out_specs=[hbm, hbm] if block_max else hbm,
          grid=grid,
          scratch_shapes=scratch_shapes),
      compiler_params=pltpu.CompilerParams(
          dimension_semantics=semantics_,
          vmem_limit_bytes=vmem_limit_bytes,
          disable_bounds_checks=True),
      out_shape=(
          (jax.ShapeDtypeStruct(scores.shape, jnp.float32),
           jax.ShapeDtypeStruct(bmax.shape, jnp.float32)) if block_max
          else jax.ShapeDtypeStruct(scores.shape, jnp.float32)),
      input_output_aliases=(
          {len(scalars) + 4: 0, len(scalars) + 5: 1} if block_max
          else {len(scalars) + 4: 0}),
      name=name,
      interpret=interpret,
  )
  outputs = (scores, bmax) if block_max else (scores,)
  return jax.named_scope(name)(kernel)(*scalars, q, weights, cache_values,
                                       cache_scales, *outputs)
