"""StreamIndex top-k over the dense FP8 cache with a vector-lean KV loop.

The same cache as `streamidx.kernels.dense` (`streamidx.cache` "dense_fp8")::

    cache_values  u8[total_pages, page_size // 4, 4, head_dim]   e4m3 bytes
    cache_scales  u8[total_pages, R, L]      e8m0 bytes, R = page_size // L
                                             rounded up to 4 (zero rows)

or the same bytes a page in one array ("inline_fp8", the `inline`
variant: one DMA a page where the pair takes two; on the v5e the DMAs'
count is paid in a cache above about 0.9 GB, docs/chip.md)::

    cache_kv      u8[total_pages, page_size // 4 + 1, 4, 128]  the values,
                                             then a row of the scale bytes

and the same launches, grid and results, but its own pipeline: 32-bit word
loads, DMA issue and compute in one basic block, per-block work hoisted out
of the KV loop, e4m3b11fnuz instead of the compiler's FP8 conversion on
v5e/v5p/v6e (M10), e8m0 scales by their bits, one compare per score, the
fnuz factor 16 in the weights. Each is exact in the interpreter and pays in
the compiler's static schedule; docs/tpu.md ("The lean kernel's changes")
gives each one's bundles per KV page.

On the v5e (`DEEP_QUEUE_CHIPS`) and in the interpreter the token-mode KV
loop keeps two blocks' DMAs in flight (three KV buffers) and issues them
right after this block's wait, before its loads, so that they run under
all of its MXU work: each measured faster there at every decode shape
(docs/chip.md, the `late_issue` and `one_ahead` experiments). Other chips
keep one block ahead, issued after the loads (`deep_queue`).

`launch(..., ablate=...)` leaves pieces of its work out, fetches a KV block
in one DMA ("page_dma"), issues after this block's loads ("early_issue"),
or keeps one block in flight ("prefetch_2"; `ABLATIONS`, read at trace
time), to time each on a chip (`python -m streamidx.bench --ablate`);
empty, the default every entry point runs, the program is the same.
"""

from __future__ import annotations

import functools

import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from streamidx import cache as cache_lib
from streamidx import modes
from streamidx.kernels import block_max as block_max_lib
from streamidx.kernels import dense, tpu
from streamidx.semantics import LANES, align_to, causal_visible_bound, cdiv

KV_PACKING = cache_lib.DENSE_KV_PACKING
# The semaphore rows in the dense kernel's order (one table for the
# timeline, `lab.model.timeline`, whichever kernel ran).
SEMAPHORE_ROWS = dense.SEMAPHORE_ROWS
_KV, _Q, _OUT, _W, _SCALE, _MAX = range(len(SEMAPHORE_ROWS))
assert _MAX == block_max_lib.SEM_ROW
# Scalar-prefetch slots: sem_ids (bq, bkv, bo buffer) and bo_sz (rows in
# flight of each score buffer, -1 = none); with the block maxima, the
# hook's after them (`block_max.launch_kwargs`).
# What `ablate` can remove (with their waits; docs/chip.md): the scores'
# DMAs, the KV blocks' DMAs (values and scales), the scales' DMAs alone
# (half the descriptors, 1/129 of the bytes), the KV loop's compute, the
# KV loop's trips.
ABLATIONS = ("score_write", "kv_dma", "scale_dma", "compute", "kv_loop",
             "page_dma", "early_issue", "prefetch_2", "split_launch",
             "big_table", "narrow_pool", "gathered_scales")
# "page_dma": each sequence's KV block fetched by one values DMA and one
# scales DMA from its first page on (kept inside the cache), not two per
# page: the same bytes only where the block's pages are consecutive (the
# records' tables are: `batch.make_batch`'s "contiguous" allocation) and
# the block ends inside the cache; an upper bound on what fewer, larger
# DMAs could give, not a kernel to ship.
# "early_issue": on `DEEP_QUEUE_CHIPS`, the DMAs issued right after this
# block's wait, before its loads (the buffer they fill was read the step
# before). Removed, after this block's loads: the order every chip ran
# until `records.LATE_ISSUE_UNTIL` and other chips still run (removing it
# there changes nothing). Compiled for v5e, that order issued them after
# 93% of the step's MXU ops, so a KV step cost its compute plus the DMAs'
# time; the early issue puts them ahead of all of it, for about 8% more
# bundles a step (docs/chip.md). On v5p, v6e and v7x the static schedule
# counts 12-22% more bundles a KV page for it at 3-8 pages a block, where
# it calls the kernel vector-bound (data/decode_schedule.json), and no
# chip has measured either order.
# "prefetch_2": on `DEEP_QUEUE_CHIPS` (token mode), three KV buffers, and
# each KV step issues the block two steps on (the traversal's: this query
# block's next KV block, the next query block's first, then the program
# `stride` on), so two blocks' DMAs are queued, with no gap between one
# block's arrival and the next one's issue; the first program issues the
# launch's first two blocks, and no block past the launch's last is
# fetched. Removed, one block ahead in two buffers: what the v5e ran until
# `records.PREFETCH_2_UNTIL` (removing it elsewhere changes nothing).
# "kv_loop" goes with it (no KV step would wait the first two blocks).
# Older records read in today's terms: `records.removed_now`.
DEEP_QUEUE_CHIPS = ("v5e",)
# "split_launch": like "page_dma" a change: the launch's programs run as
# `SPLIT_PARTS` launches of a quarter of them each (whole programs, the
# score buffers passed on), the same KV steps and bytes in four shorter
# launches. On the v5e a decode launch of 1,024 KV steps took 3.8 us a
# step where one of 256 took 3.0, the same work a step (docs/chip.md, the
# `--seqs` experiments): is it the launch's length? No: split, each
# quarter stepped as slowly (3.972 ms in all at 64 x 1M; 1.020 against
# 0.770 at 64 x 262,144).
SPLIT_PARTS = 4
# "big_table": the page table (a scalar-prefetch operand, in SMEM) given
# `BIG_TABLE_ROWS` times its rows, the extra ones never read: the same
# program and bytes with 64 x 1M's 557 KB table at 64 x 262,144's 139 KB
# (split launches took the slower step at 262,144 too: is it the table's
# size in SMEM? No: 0.779 ms against 0.770 at 64 x 262,144).
BIG_TABLE_ROWS = 4
# "narrow_pool": the page table's ids folded into the cache's first
# 1/`NARROW_POOL` of its pages (id % (total_pages // NARROW_POOL)), hoisted
# out of the kernel: the same program, DMAs and bytes over a quarter of the
# HBM address span, no memory more. One program stepped at 1.10x its HBM
# time at 64 x 262,144 (0.55 GB of cache; 16 x 1M as fast) and at 1.41x at
# 64 x 1M and 256 x 262,144 (2.2 GB): is it the span the DMAs touch
# (address translation, banks)? No: 3.919 ms against 3.919 at 64 x 1M, its
# reads alone 2.940 as the shipped kernel's; 0.764 against 0.770 at 64 x
# 262,144.
NARROW_POOL = 4
# "gathered_scales": the pages' scale tiles gathered by the page table
# before the launch (an XLA gather, in the launch's time) into u8[rows,
# page_width, R, L], so that a KV block's scales come in one DMA a
# sequence, not one a page: half the DMAs a step. At 64 x 1M (a 2.2 GB
# cache) the kernel without its scales' DMAs took 3.047 ms against 3.919
# (1.09x its HBM time against 1.41x), and in a cache of four times the
# pages 64 x 262,144 stepped as slowly as 64 x 1M (`wide_pool`,
# docs/chip.md): does a block's scales in one DMA keep that, paid for by
# the gather? No: the kernel took 3.129 ms at 64 x 1M, the gather 1.608.
# One DMA a page is the inline FP8 cache's (the `inline` variant, this
# body over one array; `bench --ablate`'s "inline_scales" times it).


def deep_queue(interpret, generation: str | None = None) -> bool:
  """Whether the KV loop issues right after the wait and keeps two blocks
  in flight: interpreted (it runs the v5e's kernel), or compiled for a
  chip of `DEEP_QUEUE_CHIPS` (`generation`, None: the one traced for,
  `modes.current_generation`)."""
  return interpret is not False or (
      (generation or modes.current_generation()) in DEEP_QUEUE_CHIPS)


def kv_slots(spec, generation: str | None = None) -> int:
  """The KV blocks a launch (`driver.Launch`) buffers: 3, two in flight, in
  token mode where `deep_queue`; else 2 (`driver.KernelBody.kv_slots`)."""
  deep = deep_queue(spec.interpret, generation)
  return 3 if deep and not spec.page_mode else 2


# A byte's e4m3fn value = its e4m3b11fnuz value * 16 (bias 11 against 7).
FNUZ_SCALE = 16.0


def fp8_mode(interpret) -> str:
  """How the e4m3 keys reach the MXU on the chip traced for: "widen" (v4:
  bf16 by chunks, M10), "native" (v7x: the compiler's e4m3 conversion) or
  "fnuz" (v5e, v5p, v6e and the interpreter: bitcast to e4m3b11fnuz)."""
  if tpu.widen_fp8_for_mxu(interpret):
    return "widen"
  if interpret is not False:
    return "fnuz"
  info = tpu.target_tpu_info()
  return "native" if info is not None and info.generation >= 7 else "fnuz"


def _kernel_refs(*refs, block_max: bool, num_sublanes_bkv: int,
                 one_array: bool, **kwargs):
  """`_kernel` with the block-max hook (`streamidx.kernels.block_max`) when
  `block_max`: its buffer after the scores, its scratch before `sems`;
  over the inline cache (`one_array`), None for the scales and their
  buffer."""
  refs, hook = block_max_lib.split_refs(
      refs, num_prefetch=7, num_inputs=4 - one_array, emits=block_max,
      seq_batch_size=kwargs["seq_batch_size"], bq_sz=kwargs["bq_sz"],
      num_sublanes_bkv=num_sublanes_bkv)
  if one_array:  # sc_hbm after kv_hbm, bsc after bkv
    refs.insert(10, None)
    refs.insert(14, None)
  _kernel(*refs, hook=hook, **kwargs)


def _kernel(seq_lens_ref, pages_ref, cu_q_ref, q_rows_ref, start_end_ref,
            ids_ref, bo_sz_ref, q_hbm, w_hbm, kv_hbm, sc_hbm, scores_in,
            scores_hbm, bkv, bsc, bq, bw, bo, sems, *, compression_ratio,
            static_q_len, bkv_p, bq_sz, seq_batch_size, causal_rule,
            page_width, max_kv_len, fp8, num_cores, page_cols,
            segment_pool, interpreted, early, hook=None, ablate=frozenset()):
  """One program: `seq_batch_size` sequences, their query blocks x KV blocks.

  Scalar prefetch: seq_lens [S], pages [(S + stride) * page_width] (clamped,
  padded), cu_q_lens [S + 1], q_rows [S], (start, end), sem_ids [3, or 4
  with `hook`], bo_sz [2, or 4]. kv_hbm: the dense pair's values (sc_hbm
  its scales) or the inline cache u8[pages, rows + 1, 4, D] (sc_hbm None).
  Scratch: bkv u8[2, B, N, 4, D] (inline: bkv_p (rows + 1) rows), bsc
  u8[2, B, bkv_p, rows, L] (inline: None), bq [2, B, bq, H, D], bw
  f32[2, B, bq, H], bo f32[2, B * bq, sublanes, 128], sems DMA[5, or 6 with `hook`, 2, B]
  (column 0: one wait covers the program's sequences); two blocks ahead
  ("prefetch_2"), bkv, bsc and sems have 3 slots. hook: the block maxima's
  (`block_max.BlockMax`, token mode), or None. early: the DMAs issued
  before this block's loads ("early_issue"). ablate: a subset of
  `ABLATIONS`, the pieces left out.
  """
  del scores_in  # aliased to scores_hbm
  b_sz = seq_batch_size
  _, num_heads, head_dim = q_hbm.shape
  gathered = "gathered_scales" in ablate  # sc_hbm u8[rows, page_width, R, L]
  # kv_hbm u8[pages, rows + 1, 4, D]: a page's values, then its scale row
  inline = sc_hbm is None
  # the cache's pages (not when gathered)
  kv_hbm_pages = (sc_hbm if sc_hbm is not None else kv_hbm).shape[0]
  rows_per_page = (kv_hbm.shape[0] // kv_hbm_pages if "page_dma" in ablate
                   else kv_hbm.shape[1] - inline)
  page_rows = rows_per_page + inline  # a page's rows in kv_hbm and bkv
  bkv_sz = bkv_p * rows_per_page * KV_PACKING
  # a page's scale rows loaded (the rest of its tile zero)
  scale_rows = cache_lib.dense_scale_data_rows(rows_per_page * KV_PACKING)
  page_mode = page_cols is not None
  start, end = start_end_ref[0], start_end_ref[1]
  if num_cores == 1:
    seq0 = start + pl.program_id(0) * b_sz
    stride, active = b_sz, True
    first = pl.program_id(0) == 0
    last = pl.program_id(0) == pl.num_programs(0) - 1
  else:  # core c: programs c, c + num_cores, ... (as the dense kernel, M16)
    num_programs = (end - start) // b_sz
    program = pl.program_id(1) * num_cores + pl.program_id(0)
    active = program < num_programs
    seq0 = start + jnp.clip(program, 0, num_programs - 1) * b_sz
    stride = num_cores * b_sz
    first = active & (pl.program_id(1) == 0)
    last = active & (seq0 + stride >= end)

  kv_slots = bkv.shape[0]  # KV buffers: 3 two blocks ahead (`launch`)

  def lengths(seq):
    """Query rows, tokens and KV entries of the program's sequences at seq."""
    q_lens = [cu_q_ref[seq + b + 1] - cu_q_ref[seq + b] for b in range(b_sz)]
    seq_lens = [seq_lens_ref[seq + b] for b in range(b_sz)]
    kv_lens = [jnp.minimum(s // compression_ratio, max_kv_len)
               for s in seq_lens]
    return q_lens, seq_lens, kv_lens

  def counts(q_lens, kv_lens):
    """(KV blocks, query blocks) of a program: its KV steps a query block,
    its query blocks."""
    kv_max = functools.reduce(jnp.maximum, kv_lens)
    has_queries = functools.reduce(jnp.logical_or, [q > 0 for q in q_lens])
    num_bkv = jnp.where(has_queries, jnp.maximum(1, cdiv(kv_max, bkv_sz)), 1)
    num_bq = (jnp.maximum(1, cdiv(q_lens[0], bq_sz)) if static_q_len is None
              else cdiv(static_q_len, bq_sz))
    return num_bkv, num_bq

  def kv_after(seq, bq_idx, bkv_idx, num_bkv, num_bq):
    """(seq, bq_idx, bkv_idx) of the KV step after this one of a program of
    num_bkv x num_bq steps: the next KV block, the next query block's
    first, or the first of the program `stride` on ("prefetch_2")."""
    nbkv = jnp.where(bkv_idx + 1 == num_bkv, 0, bkv_idx + 1)
    nbq = jnp.where(nbkv == 0, bq_idx + 1, bq_idx)
    on = nbq == num_bq
    return jnp.where(on, seq + stride, seq), jnp.where(on, 0, nbq), nbkv

  q_lens, seq_lens, kv_lens = lengths(seq0)
  scored = 0 if "compute" in ablate else b_sz  # sequences the KV loop scores

  def kv_copies(seq, bkv_idx, slot):
    """The DMAs of one KV block: values and scales of each page."""
    if "kv_dma" in ablate:
      return
    base = seq * page_width + bkv_idx * bkv_p
    if "page_dma" in ablate:  # kv_hbm: u8[total_pages * rows, 4, D]
      for b in range(b_sz):
        p = jnp.minimum(pages_ref[base + b * page_width],
                        max(kv_hbm_pages - bkv_p, 0))
        pltpu.make_async_copy(
            kv_hbm.at[pl.ds(p * rows_per_page, bkv_p * rows_per_page)],
            bkv.at[slot, b], sems.at[_KV, slot, 0]).start()
        pltpu.make_async_copy(sc_hbm.at[pl.ds(p, bkv_p)], bsc.at[slot, b],
                              sems.at[_SCALE, slot, 0]).start()
      return
    for b in range(b_sz):
      if gathered and "scale_dma" not in ablate:  # the block's, in one
        pltpu.make_async_copy(sc_hbm.at[seq + b, pl.ds(bkv_idx * bkv_p, bkv_p)],
                              bsc.at[slot, b], sems.at[_SCALE, slot, 0]).start()

      def page(i, carry, b=b):
        p = pages_ref[base + b * page_width + i]
        pltpu.make_async_copy(
            kv_hbm.at[p], bkv.at[slot, b, pl.ds(i * page_rows, page_rows)],
            sems.at[_KV, slot, 0]).start()
        if "scale_dma" not in ablate and not gathered and not inline:
          pltpu.make_async_copy(sc_hbm.at[p], bsc.at[slot, b, i],
                                sems.at[_SCALE, slot, 0]).start()
        return carry
      if bkv_p > 64:  # page mode's 128-page blocks: a rolled loop compiles fast
        lax.fori_loop(0, bkv_p, page, None, unroll=8)
      else:
        for i in range(bkv_p):
          page(i, None)

  def wait_kv(slot):  # one wait per buffer covers all pages of all sequences
    if "kv_dma" in ablate:
      return
    waits = [(_KV, bkv)] + ([] if "scale_dma" in ablate or inline
                            else [(_SCALE, bsc)])
    for row, ref in waits:
      dst = ref.at[slot]
      pltpu.make_async_copy(dst, dst, sems.at[row, slot, 0]).wait()

  def q_copies(seq, bq_idx, slot, *, wait):
    for b in range(b_sz):
      row0 = cu_q_ref[seq + b] + bq_idx * bq_sz
      sz = jnp.clip(cu_q_ref[seq + b + 1] - row0, 0, bq_sz)
      src = q_rows_ref[seq + b] + bq_idx * bq_sz

      @pl.when(sz > 0)  # no zero-row DMA (M7)
      def _(b=b, sz=sz, src=src):
        for row, hbm, ref in ((_Q, q_hbm, bq), (_W, w_hbm, bw)):
          dst = ref.at[slot, b, pl.ds(0, sz)]
          cp = pltpu.make_async_copy(dst if wait else hbm.at[pl.ds(src, sz)],
                                     dst, sems.at[row, slot, 0])
          cp.wait() if wait else cp.start()

  def wait_send(slot):
    if "score_write" in ablate:
      return
    old = bo_sz_ref[slot]

    @pl.when(old > 0)  # no DMA was started for zero rows (M7)
    def _():
      dst = bo.at[slot, pl.ds(0, b_sz * old)]
      pltpu.make_async_copy(dst, dst, sems.at[_OUT, slot, 0]).wait()

  def send(slot, sz, row0, sublane0, sublanes):
    bo_sz_ref[slot] = sz
    if "score_write" in ablate:
      return
    pltpu.make_async_copy(
        bo.at[slot, pl.ds(0, b_sz * sz)],
        scores_hbm.at[pl.ds(row0, b_sz * sz), pl.ds(sublane0, sublanes)],
        sems.at[_OUT, slot, 0]).start()

  def keys_of(slot, b):
    """bf16[bkv_sz, D] (fnuz: the keys / 16) and f32[1, bkv_sz] scales."""
    if interpreted:  # the interpreter has no ref bitcast: the same words
      raw = bkv[slot, b]
      every = pltpu.bitcast(raw.reshape(-1, raw.shape[-1]), jnp.uint32)
      rows = lambda lo, n: every[lo:lo + n]
    else:
      view = bkv.at[slot, b].bitcast(jnp.uint32)  # u32[N, 1, D]
      ref = view.reshape(view.shape[0], view.shape[2])
      rows = lambda lo, n: ref[pl.ds(lo, n)]
    if inline:  # page i: rows i * page_rows on, then its scale row, whose
      # byte c of word l is entry 128 c + l's (`cache.pair_to_inline`)
      page_size = rows_per_page * KV_PACKING
      parts = [(rows((i + 1) * page_rows - 1, 1) >> 8 * c) & 0xFF
               for i in range(bkv_p) for c in range(cdiv(page_size, LANES))]
      if page_size % LANES == 0:  # whole 128-lane rows: one per part
        bits = jnp.concatenate(parts, axis=0).reshape(1, bkv_sz)
      else:  # below 128: the page's lanes of its one part
        bits = jnp.concatenate([p[:, :page_size] for p in parts], axis=1)
      bits = bits << 23
      words = jnp.concatenate(
          [rows(i * page_rows, rows_per_page) for i in range(bkv_p)], axis=0)
    else:
      words = rows(0, bkv_p * rows_per_page)
    keys = pltpu.bitcast(words, jnp.float8_e4m3b11fnuz if fp8 == "fnuz"
                         else jnp.float8_e4m3fn)
    if not inline:
      raw = bsc[slot, b, :, :scale_rows]
      bits = raw.reshape(1, raw.size).astype(jnp.uint32) << 23
    return keys, lax.bitcast_convert_type(bits, jnp.float32)

  def head_sum(q, keys, wcol):
    """f32[bq, n] = sum_h w * ReLU(q . k) for n keys, 128 lanes at a time."""
    keys = keys.astype(jnp.bfloat16)
    s = lax.dot_general(q, keys, (((1,), (1,)), ((), ())),
                        preferred_element_type=jnp.float32)
    s = jnp.maximum(s, 0.0)
    return jnp.concatenate(
        [(s[:, c:c + LANES] * wcol).reshape(bq_sz, num_heads, LANES).sum(1)
         for c in range(0, s.shape[1], LANES)], axis=1)

  def scores_of(q, wcol, keys, scales, visible, bkv_idx):
    if fp8 == "widen":  # M10: chunks, so that v4's VMEM holds a page block
      s = jnp.concatenate(
          [head_sum(q, keys[c:c + tpu.WIDEN_CHUNK], wcol)
           for c in range(0, bkv_sz, tpu.WIDEN_CHUNK)], axis=1)
    else:
      s = head_sum(q, keys, wcol)
    s = s * scales  # visible: min(causal bound, kv_len) per query row
    k_span = lax.broadcasted_iota(jnp.int32, s.shape, 1)
    return jnp.where(k_span < (visible - bkv_idx * bkv_sz)[:, None], s,
                     -jnp.inf)

  def process():
    num_bkv, num_bq = counts(q_lens, kv_lens)
    if "kv_loop" in ablate:
      num_bkv = 0
    if kv_slots == 3:  # the next program's, for the block two steps on
      nseq = seq0 + stride  # past the end: no DMA, any program's counts
      q_next, _, kv_next = lengths(jnp.where(nseq < end, nseq, seq0))
      next_bkv, next_bq = counts(q_next, kv_next)

    def copies_two_on(bq_idx, bkv_idx, slot):
      """"prefetch_2": the DMAs of the block two KV steps on, into `slot`;
      none past the launch's end."""
      seq1, bq1, bkv1 = kv_after(seq0, bq_idx, bkv_idx, num_bkv, num_bq)
      here = seq1 == seq0
      seq2, _, bkv2 = kv_after(seq1, bq1, bkv1,
                               jnp.where(here, num_bkv, next_bkv),
                               jnp.where(here, num_bq, next_bq))
      pl.when(seq2 < end)(lambda: kv_copies(seq2, bkv2, slot))

    def bq_step(bq_idx, _):
      qslot = ids_ref[0]
      next_seq = jnp.where(bq_idx + 1 == num_bq, seq0 + stride, seq0)

      @pl.when(next_seq < end)
      def _():
        ids_ref[0] = 1 - qslot
        q_copies(next_seq, jnp.where(bq_idx + 1 == num_bq, 0, bq_idx + 1),
                 1 - qslot, wait=False)

      q_copies(seq0, bq_idx, qslot, wait=True)
      row0 = cu_q_ref[seq0] + bq_idx * bq_sz
      sz = jnp.clip(cu_q_ref[seq0 + 1] - row0, 0, bq_sz)
      qs, wcols, ends = [], [], []
      for b in range(b_sz):
        qs.append(bq[qslot, b].reshape(bq_sz * num_heads, head_dim))
        w = bw[qslot, b]  # f32[bq, H]: once per query block, across lanes
        if fp8 == "fnuz":
          w = w * FNUZ_SCALE
        wcols.append(jnp.broadcast_to(w[:, :, None], (bq_sz, num_heads, LANES))
                     .reshape(bq_sz * num_heads, LANES))
        q_pos = (seq_lens[b] - q_lens[b] + bq_idx * bq_sz
                 + lax.broadcasted_iota(jnp.int32, (bq_sz,), 0))
        ends.append(jnp.minimum(causal_visible_bound(
            q_pos, compression_ratio, causal_rule), kv_lens[b]))
      oslot = ids_ref[2]
      if hook is not None:
        hook.acquire(sz)
      if page_mode:
        @pl.when(sz > 0)
        def _():
          wait_send(oslot)
          bo[oslot] = jnp.full(bo.shape[1:], -jnp.inf, jnp.float32)

      def kv_step(bkv_idx, _):
        slot = ids_ref[1]
        if kv_slots == 2:
          nbkv = jnp.where(bkv_idx + 1 == num_bkv, 0, bkv_idx + 1)
          nbq = jnp.where(nbkv == 0, bq_idx + 1, bq_idx)
          nseq = jnp.where((nbkv == 0) & (nbq == num_bq), seq0 + stride, seq0)

        def issue():
          if kv_slots == 2:  # the next block, into the other buffer
            kv_copies(nseq, nbkv, 1 - slot)
          else:  # the one after it, into the buffer read the step before
            copies_two_on(bq_idx, bkv_idx, lax.rem(slot + 2, kv_slots))

        wait_kv(slot)
        if early:  # before the loads (docs/tpu.md)
          issue()
        blocks = [keys_of(slot, b) for b in range(scored)]
        if not early:
          issue()
        ids_ref[1] = 1 - slot if kv_slots == 2 else lax.rem(slot + 1, kv_slots)
        s = [scores_of(qs[b], wcols[b], *blocks[b], ends[b], bkv_idx)
             for b in range(scored)]
        if page_mode:
          s = s[0]
          pooled = (tpu.pool_pages_by_lane_segments(s, page_cols)
                    if segment_pool  # M15
                    else s.reshape(bq_sz, bkv_p, page_cols).max(axis=-1))
          @pl.when(sz > 0)  # without rows the buffer may be on its way out
          def _():
            bo[oslot, :, bkv_idx, :] = pooled
          return None
        o = ids_ref[2]

        @pl.when(sz > 0)  # the only guard in the loop (M7)
        def _():
          wait_send(o)
          for b in range(scored):
            for c in range(bkv_sz // LANES):
              bo[o, pl.ds(b * bq_sz, bq_sz), c, :] = s[b][:, c * LANES:
                                                         (c + 1) * LANES]
            if hook is not None:
              hook.put(b, s[b], bkv_idx)
          send(o, sz, row0, bkv_idx * (bkv_sz // LANES), bkv_sz // LANES)
          ids_ref[2] = 1 - o

      lax.fori_loop(0, num_bkv, kv_step, None)
      if hook is not None:
        hook.send(sz, row0)
      if page_mode:
        @pl.when(sz > 0)
        def _():
          send(oslot, sz, row0, 0, scores_hbm.shape[1])
        ids_ref[2] = 1 - oslot

    lax.fori_loop(0, num_bq, bq_step, None)

  @pl.when(first)
  def _():
    if num_cores > 1:  # the previous core's state
      for i in range(ids_ref.shape[0]):
        ids_ref[i] = 0
      for i in range(bo_sz_ref.shape[0]):
        bo_sz_ref[i] = -1
    q_copies(seq0, 0, 0, wait=False)
    kv_copies(seq0, 0, 0)
    if kv_slots == 3:  # "prefetch_2": and the block after it
      seq1, _, bkv1 = kv_after(seq0, 0, 0, *counts(q_lens, kv_lens))
      pl.when(seq1 < end)(lambda: kv_copies(seq1, bkv1, 1))

  if num_cores > 1:
    pl.when(active)(process)
  else:
    process()

  @pl.when(last)
  def _():
    if kv_slots == 2:
      wait_kv(ids_ref[1])  # the extra block past the launch's last
    for i in range(2):
      wait_send(i)
      if hook is not None:
        hook.wait(i)


def _split(spec, q, weights, cache, prefetch, start, end, outputs, *, ablate):
  """"split_launch": `launch` over `SPLIT_PARTS` consecutive ranges of whole
  programs of [start, end), each writing into the buffers the one before
  returned; an empty range launches nothing."""
  per = spec.seq_batch_size * spec.num_cores  # slots a program (or round)
  rounds = (end - start) // per
  bounds = [start + rounds * i // SPLIT_PARTS * per
            for i in range(SPLIT_PARTS)] + [end]
  bufs = tuple(outputs)
  for s, e in zip(bounds, bounds[1:]):
    def one(b, s=s, e=e):
      out = launch(spec, q, weights, cache, prefetch, s, e, b, ablate=ablate)
      return tuple(out) if isinstance(out, (tuple, list)) else (out,)
    bufs = lax.cond(e > s, one, lambda b: b, bufs)
  return bufs if len(bufs) > 1 else bufs[0]


def launch(spec, q, weights, cache, prefetch, start, end, outputs, *,
           ablate=frozenset()):
  """One `pallas_call` over slots [start, end), `spec.seq_batch_size` per
  program (`streamidx.kernels.driver.KernelBody.launch`); the scores, and
  with "block_max" in `spec.outputs` (token mode) the maxima of its score
  rows (`streamidx.kernels.block_max`). ablate: `ABLATIONS` to leave out
  (the module docstring; token mode)."""
  if (not set(ablate) <= set(ABLATIONS) or (ablate and spec.page_mode)
      or (ablate and len(cache) == 1)
      or ("kv_loop" in ablate and "prefetch_2" not in ablate)
      or {"gathered_scales", "page_dma"} <= set(ablate)):
    raise ValueError(f"ablate: a subset of {ABLATIONS}, token mode and "
                     f"the dense pair only, "
                     f"kv_loop only with prefetch_2, not both gathered_scales and "
                     f"page_dma (got {sorted(ablate)}, {spec.case})")
  if "split_launch" in ablate:
    return _split(spec, q, weights, cache, prefetch, start, end, outputs,
                  ablate=frozenset(ablate) - {"split_launch"})
  scores = outputs[0]
  block_max = block_max_lib.NAME in spec.outputs
  one_array = len(cache) == 1  # the inline cache
  values, scales = (cache[0], None) if one_array else cache
  page_mode, page_size = spec.page_mode, spec.page_size
  b, bq_sz, bkv_p = spec.seq_batch_size, spec.bq_sz, spec.bkv_p
  num_cores, ratio = spec.num_cores, spec.compression_ratio
  seq_lens, page_indices, cu_q_lens, q_rows = prefetch
  total_pages, _, pages_per_seq = cache_lib.page_geometry(
      cache, seq_lens, page_indices)
  max_num_seqs = seq_lens.shape[0]
  # Hoisted out of the KV loop: the table clamped to the cache, its rows
  # padded to whole KV blocks, and `stride` rows more for the prefetch past
  # the last program (page 0: a harmless fetch).
  width = align_to(pages_per_seq, bkv_p)
  table = jnp.clip(page_indices.reshape(max_num_seqs, pages_per_seq), 0,
                   total_pages - 1)
  if "narrow_pool" in ablate:
    table = table % max(1, total_pages // NARROW_POOL)
  table = jnp.pad(table, ((0, num_cores * b), (0, width - pages_per_seq)))
  if "big_table" in ablate:
    table = jnp.pad(table, ((0, (BIG_TABLE_ROWS - 1) * table.shape[0]), (0, 0)))
  scale_block = None if one_array else scales.shape[1:]
  if "gathered_scales" in ablate:  # whole tiles, the table's rows and width
    scales = scales[table]
  slots = 2 if "prefetch_2" in ablate else kv_slots(spec)
  scratch = tpu.pair_scratch(q, weights, scores, values, scale_block,
                             seq_batch_size=b, bq_sz=bq_sz, bkv_p=bkv_p,
                             page_size=page_size, page_mode=page_mode,
                             kv_slots=slots)
  kernel = functools.partial(
      _kernel_refs, block_max=block_max, one_array=one_array,
      num_sublanes_bkv=bkv_p * page_size // LANES,
      compression_ratio=ratio,
      static_q_len=spec.static_q_len, bkv_p=bkv_p, bq_sz=bq_sz,
      seq_batch_size=b, causal_rule=spec.causal_rule, page_width=width,
      max_kv_len=pages_per_seq * page_size, fp8=fp8_mode(spec.interpret),
      num_cores=num_cores,
      page_cols=page_size // ratio if page_mode else None,
      segment_pool=spec.segment_pool, interpreted=spec.interpret is not False,
      early=deep_queue(spec.interpret) and "early_issue" not in ablate,
      ablate=frozenset(ablate))
  return tpu.pallas_launch(
      kernel, spec, name=tpu.launch_name("Lean", spec.case, bq_sz, bkv_p,
                                         spec.outputs),
      **block_max_lib.launch_kwargs(spec, outputs, scratch, num_sem_rows=_MAX),
      prefetch=(seq_lens, table.reshape(-1), cu_q_lens, q_rows), start=start,
      end=end, inputs=(q, weights, values.reshape(-1, *values.shape[2:])
                       if "page_dma" in ablate else values,
                       *([] if one_array else [scales])),
      outputs=outputs,
      num_cores=num_cores, num_sem_slots=slots)
