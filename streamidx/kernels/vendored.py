# Vendored from vllm-project/tpu-inference @ 0641d9b (Apache-2.0)
# tpu_inference/kernels/experimental/deepseek_v4/indexer/streamindex_topk.py
# Local modification: `load_bkv` gains a static dtype branch so the same
# kernel serves both the DSv4 packed-FP8 cache format (uint8 records with
# inline e8m0 scales) and an unquantized bf16 cache (scale factor elided).
#
# Copyright 2026 Google LLC
#
# Licensed under the Apache License, Version 2.0 (the "License");
# you may not use this file except in compliance with the License.
# You may obtain a copy of the License at
#
#     http://www.apache.org/licenses/LICENSE-2.0
#
# Unless required by applicable law or agreed to in writing, software
# distributed under the License is distributed on an "AS IS" BASIS,
# WITHOUT WARRANTIES OR CONDITIONS OF ANY KIND, either express or implied.
# See the License for the specific language governing permissions and
# limitations under the License.
#
# streamidx: the local modifications (M1-Mn, each marked `# streamidx (M<n>)`
# where it happens) are listed in LEDGER.md, beside this file.
"""TPU-Friendly StreamIndex Top-K kernel."""

import enum
import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from streamidx import semantics
# streamidx (M10, M11, M15): the project's TPU helpers, shared with the other
# kernel bodies.
from streamidx.kernels import tpu
# streamidx (M21): the block-max output's hook (M16), shared with them.
from streamidx.kernels import block_max as block_max_lib
# streamidx (M6): the shared rules come from streamidx.semantics.
from streamidx.semantics import align_to, causal_visible_bound, cdiv

Enum = enum.Enum


def get_dtype_bitwidth(dtype):
  return jax.dtypes.itemsize_bits(dtype)


def get_dtype_packing(dtype):
  bits = get_dtype_bitwidth(dtype)
  return 32 // bits


class MlaCase(Enum):
  """Represents the different cases for MLA.

  - DECODE: Sequences are in decode-only mode (q_len = 1).
  - PREFILL: Sequences are in prefill-only mode (q_len > 1, static).
  - MIXED: Sequences can be a mix of prefill and decode (q_len > 1, dynamic).
  """

  DECODE = 0
  PREFILL = 1
  MIXED = 2

  @property
  def symbol(self):
    return {
        MlaCase.DECODE: "d",
        MlaCase.PREFILL: "p",
        MlaCase.MIXED: "m",
    }[self]


# streamidx (M6): the MlaCase of each launch of `semantics.token_launches`.
_MLA_CASE = {
    "decode": MlaCase.DECODE,
    "decode_rest": MlaCase.DECODE,
    "prefill": MlaCase.PREFILL,
    "mixed": MlaCase.MIXED,
}


def _scores_kernel(
    # Prefetch
    seq_lens_ref,  # [max_num_seqs]
    page_indices_ref,  # [max_num_seqs * pages_per_seq]
    cu_q_lens_ref,  # [max_num_seqs + 1]
    q_rows_ref,  # [max_num_seqs] streamidx (M13): first q row of each slot
    start_end_seq_idx_ref,  # [2] (start_seq_idx, end_seq_idx)
    sem_ids_ref,  # [3] (bq_sem_idx, bkv_sem_idx, bo_sem_idx)
    bo_sz_ref,  # [2] row count of each output buffer's in-flight DMA (-1 = none)
    # Input
    q_hbm_ref,  # [max_num_tokens, num_q_heads, head_dim]
    indexer_weights_hbm_ref,  # [max_num_tokens, num_q_heads]
    cache_kv_hbm_ref,  # [total_num_pages, page_size_per_kv_packing, kv_packing, lkv_dim]
    scores_in_hbm_ref,  # aliased to the output
    # Output
    scores_hbm_ref,  # [max_num_tokens, num_sublanes_total, 128]
    # Scratch
    bkv_x2_ref,  # [2, bkv_buf_sz_per_kv_packing, kv_packing, lkv_dim]
    bq_x2_ref,  # [2, bq_sz, num_q_heads, head_dim]
    bq_weights_x2_ref,  # [2, bq_sz, num_q_heads]
    scores_block_x2_ref,  # [2, bq_sz, num_sublanes_bkv, 128]
    sems,  # [4, 2]
    *,
    compression_ratio: int,
    static_q_len: int,
    bkv_p: int,
    bq_sz: int,
    seq_batch_size: int,
    page_pool_size: int | None = None,
    num_bkv_max: int | None = None,
    causal_rule: str,  # streamidx (M3)
    interpreted: bool = False,  # streamidx (M2)
    widen_fp8: bool = False,  # streamidx (M10)
    pool_by_lane_segments: bool = False,  # streamidx (M15)
    num_cores: int = 1,  # streamidx (M16)
    layout=None,  # streamidx (M16)
    block_max=None,  # streamidx (M16)
):
  _, num_q_heads, head_dim = q_hbm_ref.shape
  lkv_dim = cache_kv_hbm_ref.shape[-1]
  total_num_pages, page_size_per_kv_packing, kv_packing, _ = cache_kv_hbm_ref.shape
  max_num_seqs = seq_lens_ref.shape[0]
  num_page_indices = page_indices_ref.shape[0]
  assert num_page_indices % max_num_seqs == 0
  pages_per_seq = num_page_indices // max_num_seqs

  # Validate against the KV dtype.
  kv_dtype = cache_kv_hbm_ref.dtype
  assert get_dtype_packing(kv_dtype) == kv_packing
  # streamidx (M18): a layout that packs more entries per 32-bit word of a
  # row group (MXFP4: 8, two e2m1 codes per byte) says how many.
  kv_packing = getattr(layout, "kv_packing", kv_packing)
  assert head_dim % 128 == 0

  bkv_sz_per_kv_packing = bkv_p * page_size_per_kv_packing
  bkv_sz = bkv_sz_per_kv_packing * kv_packing
  num_sublanes_bkv = bkv_sz // 128

  start_seq_idx = start_end_seq_idx_ref[0]
  end_seq_idx = start_end_seq_idx_ref[1]
  batch_start_seq_idx = start_seq_idx + pl.program_id(0) * seq_batch_size
  batch_end_seq_idx = batch_start_seq_idx + seq_batch_size - 1
  # streamidx (M16): num_cores > 1, a leading "parallel" grid axis; core c
  # runs programs c, c + num_cores, ... (a step past the launch's programs
  # does nothing), each core its own pipeline.
  stride = seq_batch_size
  first_program = batch_start_seq_idx == start_seq_idx
  last_program = batch_end_seq_idx == end_seq_idx - 1
  active = True
  if num_cores > 1:
    num_programs = (end_seq_idx - start_seq_idx) // seq_batch_size
    program = pl.program_id(1) * num_cores + pl.program_id(0)
    active = program < num_programs
    batch_start_seq_idx = start_seq_idx + jnp.maximum(
        0, jnp.minimum(program, num_programs - 1)) * seq_batch_size
    stride = num_cores * seq_batch_size
    first_program = active & (pl.program_id(1) == 0)
    last_program = active & (batch_start_seq_idx + stride >= end_seq_idx)

  q_lens = []
  kv_lens = []
  seq_lens = []
  for batch_idx in range(seq_batch_size):
    q_start = cu_q_lens_ref[batch_start_seq_idx + batch_idx]
    q_end = cu_q_lens_ref[batch_start_seq_idx + batch_idx + 1]
    q_len = q_end - q_start
    q_lens.append(q_len)
    seq_len = seq_lens_ref[batch_start_seq_idx + batch_idx]
    seq_lens.append(seq_len)
    # streamidx (M8): entries past the page table are invisible.
    kv_len = jnp.minimum(seq_len // compression_ratio,
                         pages_per_seq * page_size_per_kv_packing * kv_packing)
    kv_lens.append(kv_len)

  def wait_send_scores(bo_sem_idx):
    # Wait for the output buffer's previous DMA (if any) before reusing it.
    old_sz = bo_sz_ref[bo_sem_idx]

    # streamidx (M7): only a DMA that moved rows is waited for (none is
    # started for zero rows).
    @pl.when(old_sz > 0)
    def _():
      dst = scores_block_x2_ref.at[bo_sem_idx, pl.ds(0, seq_batch_size * old_sz)]
      _async_copy(dst, dst, sems.at[2, bo_sem_idx, 0], wait=True)

  def start_send_scores(bo_sem_idx, sz, token_start, bkv_idx):
    # All sequences in the batch have the same sz. Issue a single DMA for the
    # entire batch.
    bo_sz_ref[bo_sem_idx] = sz
    sublane_start = bkv_idx * num_sublanes_bkv
    _async_copy(
        scores_block_x2_ref.at[bo_sem_idx, pl.ds(0, seq_batch_size * sz)],
        scores_hbm_ref.at[
            pl.ds(token_start, seq_batch_size * sz),
            pl.ds(sublane_start, num_sublanes_bkv),
        ],
        sems.at[2, bo_sem_idx, 0],
        wait=False,
    )

  def start_send_page_scores(bo_sem_idx, sz, token_start):
    # Page mode: one DMA per bq block covering ALL page columns (the
    # accumulator already holds the max over every bkv block).
    bo_sz_ref[bo_sem_idx] = sz
    num_page_sublanes = scores_hbm_ref.shape[1]
    _async_copy(
        scores_block_x2_ref.at[bo_sem_idx, pl.ds(0, seq_batch_size * sz)],
        scores_hbm_ref.at[
            pl.ds(token_start, seq_batch_size * sz),
            pl.ds(0, num_page_sublanes),
        ],
        sems.at[2, bo_sem_idx, 0],
        wait=False,
    )

  def _async_copy(src, dst, sem, wait):
    cp = pltpu.make_async_copy(src, dst, sem)
    if wait:
      cp.wait()
    else:
      cp.start()

  def _fetch_bkv(seq_idx, bkv_idx, bkv_sem_idx, *, wait=False):
    # streamidx (M16): a `layout` (another cache layout) addresses pages by
    # index, as the interpreter does (M2).
    by_index = interpreted or layout is not None
    if not by_index:
      reshaped_cache_hbm_ref = cache_kv_hbm_ref.reshape(
          total_num_pages * page_size_per_kv_packing,
          kv_packing,
          lkv_dim,
      )
      max_hbm_pages = reshaped_cache_hbm_ref.shape[0]
    for batch_idx in range(seq_batch_size):
      sem = sems.at[0, bkv_sem_idx, batch_idx]
      bkv_vmem_ref = bkv_x2_ref.at[bkv_sem_idx, batch_idx]
      kv_p_start = bkv_idx * bkv_p
      page_indices_offset = (seq_idx + batch_idx) * pages_per_seq + kv_p_start
      # streamidx (M7): a sequence without queries (q_len 0) fetches no KV.
      # Start and wait test the same predicate.
      has_queries = (cu_q_lens_ref[seq_idx + batch_idx + 1]
                     > cu_q_lens_ref[seq_idx + batch_idx])
      if not wait:

        def _start_fetch_page(
            i,
            carry,
            page_indices_offset=page_indices_offset,
            bkv_vmem_ref=bkv_vmem_ref,
            sem=sem,
        ):
          page_idx = jnp.minimum(page_indices_offset + i, num_page_indices - 1)
          if by_index:
            # streamidx (M2): the same page, addressed by index instead of
            # through the reshaped row view, with the same clamp.
            safe_page = jnp.minimum(page_indices_ref[page_idx],
                                    total_num_pages - 1)
            src = cache_kv_hbm_ref.at[safe_page]
          else:
            safe_page_offset = jnp.minimum(
                page_indices_ref[page_idx] * page_size_per_kv_packing,
                jnp.maximum(0, max_hbm_pages - page_size_per_kv_packing),
            )
            src = reshaped_cache_hbm_ref.at[
                pl.ds(safe_page_offset, page_size_per_kv_packing)
            ]
          _async_copy(
              src,
              bkv_vmem_ref.at[
                  pl.ds(i * page_size_per_kv_packing, page_size_per_kv_packing)
              ],
              sem,
              wait=False,
          )
          if layout is not None:  # streamidx (M16): the layout's other arrays
            layout.start_page(safe_page, i, bkv_sem_idx, batch_idx)
          return carry

        @pl.when(has_queries)
        def _start_fetch_block(_start_fetch_page=_start_fetch_page):
          if bkv_p > 64:
            # Large page blocks (page mode, bkv_p=128): a python-unrolled
            # per-page DMA loop bloats the Mosaic program and costs ~40s
            # of compile per kernel instance (measured v7x, T=8192); a
            # fori_loop compiles in <1s with identical steady-state
            # performance (DMA issue rate is not the bottleneck).
            lax.fori_loop(0, bkv_p, _start_fetch_page, None, unroll=False)
          else:
            # Keep the merged decode path (bkv_p<=64) byte-identical.
            for i in range(bkv_p):
              _start_fetch_page(i, None)
      else:

        @pl.when(has_queries)
        def _wait_fetch_block(bkv_vmem_ref=bkv_vmem_ref, sem=sem):
          dma_bkv_sz = bkv_p * page_size_per_kv_packing
          dst_kv = bkv_vmem_ref.at[pl.ds(0, dma_bkv_sz)]
          _async_copy(src=dst_kv, dst=dst_kv, sem=sem, wait=True)
          if layout is not None:  # streamidx (M16)
            layout.wait_block(bkv_sem_idx, batch_idx)

  def _fetch_bq(seq_idx, bq_idx, bq_sem_idx, *, wait=False):
    for batch_idx in range(seq_batch_size):
      sem = sems.at[1, bq_sem_idx, batch_idx]
      weights_sem = sems.at[3, bq_sem_idx, batch_idx]
      bq_vmem_ref = bq_x2_ref.at[bq_sem_idx, batch_idx]
      bq_weights_vmem_ref = bq_weights_x2_ref.at[bq_sem_idx, batch_idx]
      q_len_start = cu_q_lens_ref[seq_idx + batch_idx] + bq_idx * bq_sz
      curr_q_end = cu_q_lens_ref[seq_idx + batch_idx + 1]
      sz = jnp.maximum(0, jnp.minimum(bq_sz, curr_q_end - q_len_start))
      # streamidx (M13): the slot's sequence's rows (q_rows_ref is
      # cu_q_lens[:-1] unless the decode range is reordered).
      q_src_start = q_rows_ref[seq_idx + batch_idx] + bq_idx * bq_sz

      # streamidx (M7): no zero-row DMA (a sequence without queries); start
      # and wait test the same predicate.
      @pl.when(sz > 0)
      def _(sem=sem, weights_sem=weights_sem, bq_vmem_ref=bq_vmem_ref,
            bq_weights_vmem_ref=bq_weights_vmem_ref, q_src_start=q_src_start,
            sz=sz):
        if not wait:
          _async_copy(
              q_hbm_ref.at[pl.ds(q_src_start, sz)],
              bq_vmem_ref.at[pl.ds(0, sz)],
              sem,
              wait=False,
          )
          _async_copy(
              indexer_weights_hbm_ref.at[pl.ds(q_src_start, sz)],
              bq_weights_vmem_ref.at[pl.ds(0, sz)],
              weights_sem,
              wait=False,
          )
        else:
          dst = bq_vmem_ref.at[pl.ds(0, sz)]
          _async_copy(dst, dst, sem, wait=True)
          dst_w = bq_weights_vmem_ref.at[pl.ds(0, sz)]
          _async_copy(dst_w, dst_w, weights_sem, wait=True)

  def start_fetch_bkv(seq_idx, bkv_idx, bkv_sem_idx):
    _fetch_bkv(seq_idx, bkv_idx, bkv_sem_idx)

  def wait_fetch_bkv(seq_idx, bkv_idx, bkv_sem_idx):
    _fetch_bkv(seq_idx, bkv_idx, bkv_sem_idx, wait=True)

  def start_fetch_bq(seq_idx, bq_idx, bq_sem_idx):
    return _fetch_bq(seq_idx, bq_idx, bq_sem_idx)

  def wait_fetch_bq(seq_idx, bq_idx, bq_sem_idx):
    return _fetch_bq(seq_idx, bq_idx, bq_sem_idx, wait=True)

  def load_bq(bq_sem_idx):
    data = bq_x2_ref.at[bq_sem_idx, :, :bq_sz][...].reshape(
        seq_batch_size, bq_sz * num_q_heads, head_dim
    )
    bqs = []
    for batch_idx in range(seq_batch_size):
      bqs.append(data[batch_idx])
    return bqs

  def load_bq_weights(bq_sem_idx):
    data = bq_weights_x2_ref.at[bq_sem_idx, :, :bq_sz][...]
    bq_weights = []
    for batch_idx in range(seq_batch_size):
      bq_weights.append(data[batch_idx])
    return bq_weights

  def load_bkv(bkv_sem_idx):
    bkvs = []
    bkv_scales = []
    for batch_idx in range(seq_batch_size):
      bkv = bkv_x2_ref.at[bkv_sem_idx, batch_idx, :bkv_sz_per_kv_packing][...]
      flat_bkv = bkv.reshape(-1, bkv.shape[-1])
      if hasattr(layout, "load_kv"):  # streamidx (M18): the layout unpacks
        fp8_val, scale_val = layout.load_kv(flat_bkv, bkv_sem_idx, batch_idx)
        bkvs.append(fp8_val)
        bkv_scales.append(scale_val)
      elif bkv.dtype == jnp.uint8:
        # Unpack quantized values and scales from the DSv4 FP8 cache
        # format.
        fp8_val = flat_bkv[:, :head_dim]
        fp8_val = pltpu.bitcast(fp8_val, jnp.float8_e4m3fn)
        # streamidx (M10): widened to bf16 in `compute_scores`, per chunk.
        if layout is None:
          scale_val = pltpu.bitcast(
              flat_bkv[:, head_dim : head_dim + 1].T, jnp.float8_e8m0fnu
          ).astype(jnp.bfloat16)
        else:  # streamidx (M16): the scales from the layout's own buffer
          scale_val = layout.load_scales(bkv_sem_idx, batch_idx)
        # NOTE: Do NOT multiply the scales here. Return them
        # separately.
        bkvs.append(fp8_val.reshape(bkv_sz, head_dim))
        bkv_scales.append(scale_val)
      else:
        # Unquantized (e.g. bf16) cache: keys are stored directly as
        # [*, head_dim] records, no scale factor.
        bkvs.append(flat_bkv[:, :head_dim].reshape(bkv_sz, head_dim))
        bkv_scales.append(None)
    return bkvs, bkv_scales

  def process():
    # num_bkv is determined by the longest sequence length in the batch.
    kv_len_max = jnp.max(jnp.array(kv_lens))
    num_bkv = jnp.maximum(1, cdiv(kv_len_max, bkv_sz))
    # streamidx (M7): a grid step whose sequences have no queries runs a
    # single (empty) bkv step; it only prefetches the next sequence's blocks.
    has_queries = functools.reduce(jnp.logical_or, [q > 0 for q in q_lens])
    num_bkv = jnp.where(has_queries, num_bkv, 1)
    if static_q_len is None:
      assert seq_batch_size == 1
      num_bq = jnp.maximum(1, cdiv(q_lens[0], bq_sz))
    else:
      # streamidx (M17): batched decode with static_q_len = gamma + 1 rows
      # per sequence (speculative decoding) holds all of them in one query
      # block, so the batch's score rows are contiguous (see below).
      assert seq_batch_size == 1 or bq_sz == static_q_len
      num_bq = jnp.maximum(1, cdiv(static_q_len, bq_sz))

    def get_next_bq_ids(seq_idx, bq_idx, bq_sem_idx):
      next_bq_idx = bq_idx + 1
      is_last_bq = next_bq_idx == num_bq
      next_bq_idx = lax.select(is_last_bq, 0, next_bq_idx)
      next_seq_idx = lax.select(is_last_bq, seq_idx + stride, seq_idx)  # streamidx (M16)
      next_bq_sem_idx = lax.select(bq_sem_idx == 0, 1, 0)
      return next_seq_idx, next_bq_idx, next_bq_sem_idx

    def get_next_bkv_ids(seq_idx, bq_idx, bkv_idx, bkv_sem_idx):
      next_bkv_idx = bkv_idx + 1
      is_last_bkv = next_bkv_idx == num_bkv
      next_bkv_idx = lax.select(is_last_bkv, 0, next_bkv_idx)
      next_bq_idx = lax.select(is_last_bkv, bq_idx + 1, bq_idx)
      is_last_bq = next_bq_idx == num_bq
      next_bq_idx = lax.select(is_last_bq, 0, next_bq_idx)
      next_seq_idx = lax.select(is_last_bq, seq_idx + stride, seq_idx)  # streamidx (M16)
      next_bkv_sem_idx = lax.select(bkv_sem_idx == 0, 1, 0)
      return next_seq_idx, next_bq_idx, next_bkv_idx, next_bkv_sem_idx

    def compute_scores(
        bq_vec,
        bkv_vec,
        scale_val_vec,
        bq_weights_vec,
        bq_visible_end_vec,
        bkv_idx,
    ):
      assert len(bq_vec) == seq_batch_size
      assert len(bkv_vec) == seq_batch_size
      assert len(scale_val_vec) == seq_batch_size
      assert len(bq_weights_vec) == seq_batch_size
      assert len(bq_visible_end_vec) == seq_batch_size
      ret = []
      for batch_idx in range(seq_batch_size):
        bq = bq_vec[batch_idx].reshape(-1, head_dim)
        bkv = bkv_vec[batch_idx]
        scale_val = scale_val_vec[batch_idx]
        bq_weights = bq_weights_vec[batch_idx]
        bq_visible_end = bq_visible_end_vec[batch_idx]
        def head_sum(bkv, dot=None):
          s = jnp.einsum(
              "nd,md->nm",
              bq,
              bkv,
              preferred_element_type=jnp.float32,
          ) if dot is None else dot(bq, bkv)  # streamidx (M18)
          s = s.reshape(-1, num_q_heads, s.shape[-1])
          s = jnp.maximum(s, 0.0)
          s = s * bq_weights.astype(jnp.float32)[:, :, None]
          return s.sum(axis=1)

        if hasattr(layout, "scaled_dot"):
          # streamidx (M18): the layout's scales apply inside the dot (one
          # per group of values, not per entry). M19: the tile as unpacked
          # (the layout widens it), `dot_chunk` entries at a time if set
          # (rows of the tile and of its scales, entries on their axis 0).
          step = getattr(layout, "dot_chunk", None)
          part = lambda a, c: a if step is None else a[c:c + step]
          s_summed = jnp.concatenate([head_sum(part(bkv, c), functools.partial(
              layout.scaled_dot, part(scale_val, c)))
              for c in range(0, bkv.shape[0], step or bkv.shape[0])], axis=-1)
          scale_val = None
        elif widen_fp8 and bkv.dtype == jnp.float8_e4m3fn:
          # streamidx (M10): exact, e4m3fn is a subset of bf16. Widened
          # and scored WIDEN_CHUNK entries at a time, so that v4's 16 MiB
          # of VMEM holds a page-mode block (8192 entries) of FP8 keys.
          s_summed = jnp.concatenate([
              head_sum(bkv[c:c + tpu.WIDEN_CHUNK].astype(jnp.bfloat16))
              for c in range(0, bkv.shape[0], tpu.WIDEN_CHUNK)], axis=-1)
        else:
          s_summed = head_sum(bkv)
        if scale_val is not None:
          s_summed = s_summed * scale_val
        k_span = bkv_idx * bkv_sz + lax.broadcasted_iota(jnp.int32, s_summed.shape, 1)
        valid_mask = k_span < kv_lens[batch_idx]
        # streamidx (M3): `k_span < visible_end`; for causal_rule="seed"
        # visible_end = q_pos // ratio + 1, i.e. the seed's
        # `k_span <= q_pos // ratio`.
        causal_mask = k_span < bq_visible_end[:, None]
        mask = jnp.logical_and(valid_mask, causal_mask)
        s_summed = jnp.where(mask, s_summed, -jnp.inf)
        if block_max is not None:  # streamidx (M16)
          block_max.put(batch_idx, s_summed, bkv_idx)
        if page_pool_size is not None:
          # Page mode: max-pool token scores within each page. Columns
          # are linear (compressed) kv positions, and bkv_sz is a whole
          # number of pages, so pooling groups are exact pages.
          cols_per_page = page_pool_size // compression_ratio
          if pool_by_lane_segments:
            ret.append(tpu.pool_pages_by_lane_segments(s_summed, cols_per_page))
          else:
            ret.append(s_summed.reshape(-1, bkv_p, cols_per_page).max(axis=-1))
        else:
          ret.append(s_summed.reshape(-1, num_sublanes_bkv, 128))
      return jnp.concatenate(ret, axis=0)

    def bq_visible_ends(bq_idx):
      # streamidx (M3): the seed built `q_pos // compression_ratio` here.
      ends = []
      for batch_idx in range(seq_batch_size):
        q_pos = (
            seq_lens[batch_idx]
            - q_lens[batch_idx]
            + bq_idx * bq_sz
            + jnp.arange(bq_sz, dtype=jnp.int32)
        )
        ends.append(
            causal_visible_bound(q_pos, compression_ratio, causal_rule))
      return ends

    def compute_with_bq(bq_idx, _):
      bq_sem_idx = sem_ids_ref[0]
      next_seq_idx, next_bq_idx, next_bq_sem_idx = get_next_bq_ids(
          batch_start_seq_idx, bq_idx, bq_sem_idx
      )

      # Prefetch next bq
      @pl.when(next_seq_idx < end_seq_idx)
      def prefetch_next_bq():
        sem_ids_ref[0] = next_bq_sem_idx
        start_fetch_bq(next_seq_idx, next_bq_idx, next_bq_sem_idx)

      bq_visible_end_vec = bq_visible_ends(bq_idx)

      # Wait for cur bq if not ready yet
      wait_fetch_bq(batch_start_seq_idx, bq_idx, bq_sem_idx)
      bq_vec = load_bq(bq_sem_idx)
      bq_weights_vec = load_bq_weights(bq_sem_idx)

      # streamidx (M17): if seq_batch_size > 1, every sequence of the batch
      # has static_q_len rows (validate's "decode_q_len" rule) and bq_sz ==
      # static_q_len, so sz is static_q_len for all of them and their rows
      # are the contiguous range token_start + [0, seq_batch_size * sz), in
      # the order compute_scores concatenates them; each row keeps its own
      # causal bound (bq_visible_ends: row p sees s < (p + 1) // ratio).
      token_start = cu_q_lens_ref[batch_start_seq_idx] + bq_idx * bq_sz
      curr_q_end = cu_q_lens_ref[batch_start_seq_idx + 1]
      sz = jnp.maximum(0, jnp.minimum(bq_sz, curr_q_end - token_start))
      if block_max is not None:  # streamidx (M16)
        block_max.acquire(sz)

      def compute_with_bkv(bkv_idx, _):
        bkv_sem_idx = sem_ids_ref[1]
        next_seq_idx, _, next_bkv_idx, next_bkv_sem_idx = get_next_bkv_ids(
            batch_start_seq_idx, bq_idx, bkv_idx, bkv_sem_idx
        )

        # Prefetch next bkv
        @pl.when(next_seq_idx < end_seq_idx)
        def prefetch_next_bkv():
          sem_ids_ref[1] = next_bkv_sem_idx
          start_fetch_bkv(next_seq_idx, next_bkv_idx, next_bkv_sem_idx)

        # Wait for cur bkv
        wait_fetch_bkv(batch_start_seq_idx, bkv_idx, bkv_sem_idx)

        # streamidx (M7): a bq block without query rows (a sequence with
        # q_len 0) computes nothing and sends nothing.
        @pl.when(sz > 0)
        def compute_and_send():
          bkv_vec, scale_val_vec = load_bkv(bkv_sem_idx)
          scores = compute_scores(
              bq_vec,
              bkv_vec,
              scale_val_vec,
              bq_weights_vec,
              bq_visible_end_vec,
              bkv_idx,
          )

          # Double-buffered vreg -> VMEM -> HBM: reuse a buffer only after its
          # previous DMA has drained, so the HBM write overlaps the next
          # compute.
          bo_sem_idx = sem_ids_ref[2]
          wait_send_scores(bo_sem_idx)
          scores_block_x2_ref[bo_sem_idx, ...] = scores
          start_send_scores(bo_sem_idx, sz, token_start, bkv_idx)
          sem_ids_ref[2] = lax.select(bo_sem_idx == 0, 1, 0)

      lax.fori_loop(0, num_bkv, compute_with_bkv, None, unroll=False)
      if block_max is not None:  # streamidx (M16)
        block_max.send(sz, token_start)

    def compute_with_bq_paged(bq_idx, _):
      # Page-mode twin of compute_with_bq: pooled page scores accumulate in
      # a fori carry ([rows, num_bkv_max, bkv_p], untouched blocks stay
      # -inf) and are written back with ONE DMA per bq block — no
      # [T, max_kv] token-score materialization ever reaches HBM.
      bq_sem_idx = sem_ids_ref[0]
      next_seq_idx, next_bq_idx, next_bq_sem_idx = get_next_bq_ids(
          batch_start_seq_idx, bq_idx, bq_sem_idx
      )

      @pl.when(next_seq_idx < end_seq_idx)
      def prefetch_next_bq():
        sem_ids_ref[0] = next_bq_sem_idx
        start_fetch_bq(next_seq_idx, next_bq_idx, next_bq_sem_idx)

      bq_visible_end_vec = bq_visible_ends(bq_idx)

      wait_fetch_bq(batch_start_seq_idx, bq_idx, bq_sem_idx)
      bq_vec = load_bq(bq_sem_idx)
      bq_weights_vec = load_bq_weights(bq_sem_idx)

      token_start = cu_q_lens_ref[batch_start_seq_idx] + bq_idx * bq_sz
      curr_q_end = cu_q_lens_ref[batch_start_seq_idx + 1]
      sz = jnp.maximum(0, jnp.minimum(bq_sz, curr_q_end - token_start))

      assert bkv_p == 128, "page mode requires bkv_p == 128 (one lane row per block)"

      # Acquire the output buffer up-front: wait_send_scores waits on the
      # DMA issued for this buffer TWO bq iterations ago (buffers
      # alternate), so the -inf fill below can never race an in-flight
      # read. Each bkv block then stores its pooled lane-row [rows, 128]
      # at sublane index bkv_idx; untouched trailing blocks (dynamic
      # num_bkv < num_bkv_max, which only sizes the output layout) stay
      # -inf and are masked to -1 after top_k.
      bo_sem_idx = sem_ids_ref[2]

      # streamidx (M7): a bq block without query rows (a sequence with
      # q_len 0) acquires, computes and sends nothing.
      @pl.when(sz > 0)
      def acquire_output():
        wait_send_scores(bo_sem_idx)
        scores_block_x2_ref[bo_sem_idx, ...] = jnp.full(
            scores_block_x2_ref.shape[1:], -jnp.inf, dtype=jnp.float32
        )

      def compute_with_bkv_paged(bkv_idx, _):
        bkv_sem_idx = sem_ids_ref[1]
        next_seq_idx, _u, next_bkv_idx, next_bkv_sem_idx = get_next_bkv_ids(
            batch_start_seq_idx, bq_idx, bkv_idx, bkv_sem_idx
        )

        @pl.when(next_seq_idx < end_seq_idx)
        def prefetch_next_bkv():
          sem_ids_ref[1] = next_bkv_sem_idx
          start_fetch_bkv(next_seq_idx, next_bkv_idx, next_bkv_sem_idx)

        wait_fetch_bkv(batch_start_seq_idx, bkv_idx, bkv_sem_idx)

        @pl.when(sz > 0)  # streamidx (M7)
        def compute_and_store():
          bkv_vec, scale_val_vec = load_bkv(bkv_sem_idx)
          page_scores = compute_scores(
              bq_vec,
              bkv_vec,
              scale_val_vec,
              bq_weights_vec,
              bq_visible_end_vec,
              bkv_idx,
          )
          # [rows, 128] — one pooled lane row per block
          scores_block_x2_ref[bo_sem_idx, :, bkv_idx, :] = page_scores

        return None

      lax.fori_loop(0, num_bkv, compute_with_bkv_paged, None, unroll=False)

      @pl.when(sz > 0)  # streamidx (M7)
      def send_output():
        start_send_page_scores(bo_sem_idx, sz, token_start)

      sem_ids_ref[2] = lax.select(bo_sem_idx == 0, 1, 0)

    if page_pool_size is None:
      lax.fori_loop(0, num_bq, compute_with_bq, None, unroll=False)
    else:
      lax.fori_loop(0, num_bq, compute_with_bq_paged, None, unroll=False)

  ### ------- Kernel start ------- ###

  @pl.when(first_program)  # streamidx (M16)
  def prologue():
    if num_cores > 1:  # streamidx (M16): the previous core's state
      for i in range(sem_ids_ref.shape[0]):
        sem_ids_ref[i] = 0
      for i in range(bo_sz_ref.shape[0]):
        bo_sz_ref[i] = -1
    start_fetch_bq(batch_start_seq_idx, 0, 0)  # streamidx (M16)
    start_fetch_bkv(batch_start_seq_idx, 0, 0)

  if num_cores > 1:  # streamidx (M16)
    pl.when(active)(process)
  else:
    process()

  @pl.when(last_program)  # streamidx (M16)
  def epilogue():
    for i in range(2):
      wait_send_scores(i)
      if block_max is not None:  # streamidx (M16)
        block_max.wait(i)

  ### ------- Kernel end ------- ###


def prepare_q_inputs(
    q: jax.Array,  # [max_num_tokens, actual_num_q_heads, actual_head_dim],
):
  _, actual_num_q_heads, actual_head_dim = q.shape
  q_packing = get_dtype_packing(q.dtype)
  num_q_heads = align_to(actual_num_q_heads, q_packing)
  head_dim = align_to(actual_head_dim, 128)
  q = jnp.pad(
      q,
      (
          (0, 0),
          (0, num_q_heads - actual_num_q_heads),
          (0, head_dim - actual_head_dim),
      ),
      constant_values=0,
  )
  return q


def prepare_index_weights(
    index_weights: jax.Array,  # [max_num_tokens, actual_num_q_heads],
    q_dtype,
):
  _, actual_num_q_heads = index_weights.shape
  index_weights = index_weights.astype(jnp.float32)
  num_q_heads = align_to(actual_num_q_heads, get_dtype_packing(q_dtype))
  index_weights = jnp.pad(
      index_weights,
      (
          (0, 0),
          (0, num_q_heads - actual_num_q_heads),
      ),
      constant_values=0,
  )
  return index_weights


def prepare_outputs(out):
  if out.ndim == 3:
    out = out.reshape(out.shape[0], -1)
  return out

# streamidx (M6, M14): the wrapper (validation, launches, decode order,
# selection) is `streamidx.kernels.driver`'s, shared with the other kernel
# bodies; upstream's `run_topk_kernel`, moved out of `streamindex_topk`, is
# the one launch of this body, for token and page mode alike. The drop-in
# entry points are `streamidx.streamindex_topk` / `streamindex_page_topk`.
# streamidx (M20): its static arguments come as one record, `spec` (a
# `driver.Launch`). streamidx (M21): it writes the scores, and with
# "block_max" in `spec.outputs` (token mode) the block maxima too, through
# the M16 hook (`_scores_kernel_with_block_max`).
def _scores_kernel_with_block_max(*refs, num_sublanes_bkv, **kwargs):
  """streamidx (M21): `_scores_kernel` with the `block_max.BlockMax` hook:
  refs as `_scores_kernel`'s, with the block-max buffer after the scores
  (aliased input and output) and its scratch "bmax_x2" before `sems`, whose
  row `block_max.SEM_ROW` it uses."""
  refs, hook = block_max_lib.split_refs(
      refs, num_prefetch=7, num_inputs=3, emits=True,
      seq_batch_size=kwargs["seq_batch_size"], bq_sz=kwargs["bq_sz"],
      num_sublanes_bkv=num_sublanes_bkv)
  _scores_kernel(*refs, block_max=hook, **kwargs)


def run_topk_kernel(spec, q, prepared_indexer_weights, cache, prefetch, start,
                    end, outputs):
  """streamidx: one `pallas_call` over sequences [start, end) (token mode), or
  over the page-mode grid (`case` "page"); returns the scores [and, M21, the
  block maxima]."""
  scores = outputs[0]
  block_max = block_max_lib.NAME in spec.outputs  # streamidx (M21)
  (cache_kv,) = cache
  seq_batch_size, static_q_len, bq_sz, bkv_p, case, interpret = (
      spec.seq_batch_size, spec.static_q_len, spec.bq_sz, spec.bkv_p,
      spec.case, spec.interpret)
  seq_lens, page_indices = prefetch[:2]
  _, num_q_heads, head_dim = q.shape
  lkv_dim = cache_kv.shape[-1]
  _, page_size_per_kv_packing, kv_packing, _ = cache_kv.shape
  page_size = spec.page_size  # streamidx (M20)
  pages_per_seq = page_indices.shape[0] // seq_lens.shape[0]
  page_mode = case == "page"
  num_sublanes_total = scores.shape[1]

  # Only support batching for decode sequences.
  # streamidx (M17): with speculative decoding too, static_q_len = gamma + 1
  # (the seed's TODO); `_scores_kernel` asserts its one-query-block rule.
  if seq_batch_size > 1:
    assert static_q_len is not None

  num_sublanes_bkv = bkv_p * page_size // 128
  # streamidx (M11): the scratch, declared once and checked.
  scratch = semantics.launch_scratch(
      seq_batch_size=seq_batch_size, bq_sz=bq_sz, bkv_p=bkv_p,
      page_size_per_kv_packing=page_size_per_kv_packing,
      kv_packing=kv_packing, lkv_dim=lkv_dim, cache_dtype=cache_kv.dtype,
      num_q_heads=num_q_heads, head_dim=head_dim, q_dtype=q.dtype,
      weights_dtype=prepared_indexer_weights.dtype,
      num_out_sublanes=num_sublanes_total if page_mode else num_sublanes_bkv)

  # streamidx (M20): upstream's scope name, spelled by `tpu.launch_name`
  # (M21: "-block_max" after it when the launch writes the maxima).
  scope_name = tpu.launch_name("", case, bq_sz, bkv_p, spec.outputs)
  if page_mode:
    page_kwargs = dict(page_pool_size=page_size,
                       num_bkv_max=cdiv(pages_per_seq, bkv_p),
                       pool_by_lane_segments=spec.segment_pool)  # streamidx (M15)
  else:
    page_kwargs = {}
  kernel_fn = _scores_kernel
  if block_max:  # streamidx (M21)
    kernel_fn = functools.partial(_scores_kernel_with_block_max,
                                  num_sublanes_bkv=num_sublanes_bkv)
  kernel = functools.partial(
      kernel_fn,
      compression_ratio=spec.compression_ratio,
      static_q_len=static_q_len,
      bq_sz=bq_sz,
      bkv_p=bkv_p,
      seq_batch_size=seq_batch_size,
      causal_rule=spec.causal_rule,
      interpreted=interpret is not False,
      widen_fp8=tpu.widen_fp8_for_mxu(interpret),  # streamidx (M10)
      **page_kwargs,
  )
  # streamidx: the pallas_call setup every kernel body shares (scratch and
  # semaphores, scalar prefetch, grid, HBM operands, the aliased output);
  # streamidx (M21): the block maxima's scratch and slots, when written.
  return tpu.pallas_launch(
      kernel, spec, name=scope_name, prefetch=prefetch, start=start, end=end,
      **block_max_lib.launch_kwargs(spec, outputs, scratch, num_sem_rows=4),
      inputs=(q, prepared_indexer_weights, cache_kv), outputs=outputs,
      case="page" if page_mode else _MLA_CASE[case].name.lower(),
      blocks=(f"num_kv_pages_per_block={bkv_p}, num_queries_per_block="
              f"{spec.num_queries_per_block} (bq {bq_sz}), {seq_batch_size} "
              f"sequence(s) per program"))
