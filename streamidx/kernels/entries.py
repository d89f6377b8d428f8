"""The public entry points: the drop-in signatures, each building one call.

    streamindex_topk / streamindex_page_topk              the vendored body
    streamindex_topk_dense / streamindex_page_topk_dense  the dense FP8 body
    streamindex_topk_lean / streamindex_page_topk_lean    its vector-lean body
    streamindex_topk_inline            the lean body over the inline FP8 cache
    streamindex_topk_fp4 / streamindex_page_topk_fp4      the MXFP4 body

Each is a `driver.Entry`: a kernel body in token or page mode with its cache
layout's signature (the vendored function's for the one-array caches, the dense
one for the pairs, fp4 without `num_cores`), whose defaults are `TopkCall`'s /
`PageCall`'s fields (a spell function is its signature and docstring:
`Entry.bind` builds the call). `ENTRIES` is the one table of bodies x modes.
"""

from __future__ import annotations

import dataclasses
import functools

from streamidx.call import PageCall, TopkCall
from streamidx.kernels import block_max, dense, driver, fp4, lean, vendored

T, P = TopkCall, PageCall  # the defaults below are their fields'

# The extra output every body writes on request (token mode).
BLOCK_MAX = driver.Output(block_max.NAME, block_max.buffer)
VENDORED = driver.KernelBody("vendored", vendored.run_topk_kernel,
                             ("fp8", "bf16"), (BLOCK_MAX,))
DENSE = driver.KernelBody("dense", dense.launch, ("dense_fp8",), (BLOCK_MAX,))
LEAN = driver.KernelBody("lean", lean.launch, ("dense_fp8",), (BLOCK_MAX,),
                         kv_slots=lean.kv_slots)
FP4 = driver.KernelBody("fp4", fp4.launch, ("mxfp4",), (BLOCK_MAX,))
# The lean body over the inline FP8 cache: a page's values and scales in
# one DMA (`streamidx.kernels.lean`; token mode).
INLINE = driver.KernelBody("inline", lean.launch, ("inline_fp8",),
                           (BLOCK_MAX,), kv_slots=lean.kv_slots)


def lean_without(removed) -> driver.KernelBody:
  """The lean body with `removed` (`lean.ABLATIONS`) left out of its
  launches: what `lab.bench.ablate` times and `lab.schedule --ablate`
  counts; empty, `LEAN`."""
  if not removed:
    return LEAN
  return dataclasses.replace(LEAN, launch=functools.partial(
      lean.launch, ablate=frozenset(removed)))


def _packed_token(
    body, q, indexer_weights, cache_kv, seq_lens, page_indices, cu_q_lens,
    distribution, *, k, compression_ratio, num_kv_pages_per_block=None,
    num_queries_per_block=None, vmem_limit_bytes=T.vmem_limit_bytes,
    decode_req_batch_size=T.decode_req_batch_size, causal_rule=T.causal_rule,
    topk_method=T.topk_method, return_scores=T.return_scores,
    sort_decode=T.sort_decode, skip_empty_launches=T.skip_empty_launches,
    decode_q_len=T.decode_q_len, physical_slots=T.physical_slots):
  """StreamIndex Top-K retrieval.

  Args:
    q: concatenated all sequences' queries.
    indexer_weights: concatenated all sequences' indexer weights.
    cache_kv: the current kv cache.
    seq_lens: the length of each sequence in the kv cache (uncompressed).
    page_indices: flattened page indices look-up table by (seq_id, page_id).
      The kernel silently clamps an index past the cache to the last page;
      `streamidx.validate_topk_inputs` rejects such tables.
    cu_q_lens: the cumulative sum of the effective query lengths. Similar to
      kv_lens, only the first num_seqs+1 values are valid.
    distribution: (i, j, k) represents that sequences[0:i] are decode-only,
      sequences[i:j] are chunked-prefill-only, and sequences[j:k] are mixed.
      The k is also the total number of sequences.
    k: Number of top-K elements to retrieve.
    compression_ratio: KV cache compression ratio.
    num_kv_pages_per_block: number of kv pages to be processed in one block in
      the pallas kernel. This is a tuple of (decode, prefill, mixed) cases.
      streamidx: None takes the block-size table's row for this chip
      (`streamidx.block_sizes`; `.call(...).block_source` names it).
    num_queries_per_block: number of queries to be processed in one block in
      the pallas kernel. This is a tuple of (decode, prefill, mixed) cases.
    vmem_limit_bytes: the vmem limit for the pallas kernel.
    causal_rule: streamidx (M3). "model" (default): entry s is visible to
      the query at position p iff s < (p + 1) // ratio; "seed": the vendored
      s <= p // ratio (docs/semantics.md).
    topk_method: streamidx (M12). One of `streamidx.topk.TOPK_METHODS`;
      None: the chip's default (`streamidx.topk.defaults`;
      `.call(...).topk_source` says why); every exact method returns the
      same indices (docs/topk-methods.md).
    return_scores: streamidx (M9). True: return (indices, f32[T, k] scores),
      -inf where the index is -1.
    sort_decode: streamidx (M13). True (default): score the decode range
      length-sorted, rows returned in the caller's order.
    skip_empty_launches: streamidx (M14). True (default): a launch whose
      range is empty is not made (`lax.cond`).
    decode_q_len: streamidx (M17): query rows of every decode sequence, 1 or
      gamma + 1 under speculative decoding (`next_n` in vLLM).
    physical_slots: streamidx (M22). True: physical cache slots in place of
      the entry indices (`streamidx.cache.physical_slots`).

  Returns:
    Top-K indices (in compressed space): i32[T, k], by score descending,
    equal scores by index ascending, -1 past the visible entries.
  """


def _packed_page(
    body, q, indexer_weights, cache_kv, seq_lens, page_indices, cu_q_lens,
    num_seqs, *, k_pages, compression_ratio=P.compression_ratio,
    num_kv_pages_per_block=P.num_kv_pages_per_block,
    num_queries_per_block=P.num_queries_per_block,
    vmem_limit_bytes=P.vmem_limit_bytes, causal_rule=P.causal_rule,
    return_scores=P.return_scores,
    skip_empty_launches=P.skip_empty_launches,
    physical_slots=P.physical_slots):
  """Page-level lightning-indexer top-k (prefill/extend form).

  Pallas twin of ``ref.streamindex_page_topk_ref(one_token_per_seq=False)``:
  scores are max-pooled to page granularity inside the kernel (only
  ``[T, pages_per_seq]`` ever reaches HBM), then a ``top_k`` over pages.

  streamidx (M23): num_kv_pages_per_block None or 128; num_queries_per_block
  None takes the block-size table's row (`streamidx.blocks.page_query_rows`),
  any size within `streamidx.blocks`' bounds. compression_ratio 1 only.
  return_scores (M9), physical_slots (M22: physical pages) as in token mode.

  Returns:
    i32[T, k_pages] seq-local page ids per query token; -1 for padding.
  """


def _pair_token(
    body, q, indexer_weights, cache_values, cache_scales, seq_lens, page_indices,
    cu_q_lens, distribution, *, k, compression_ratio,
    num_kv_pages_per_block=None, num_queries_per_block=None,
    vmem_limit_bytes=T.vmem_limit_bytes,
    decode_req_batch_size=T.decode_req_batch_size, causal_rule=T.causal_rule,
    topk_method=T.topk_method, return_scores=T.return_scores,
    sort_decode=T.sort_decode, num_cores=T.num_cores,
    skip_empty_launches=T.skip_empty_launches, decode_q_len=T.decode_q_len,
    physical_slots=T.physical_slots):
  """StreamIndex top-k over the dense FP8 cache: i32[max_num_tokens, k].

  Arguments and result as `streamidx.streamindex_topk`, with the dense FP8
  pair (`streamidx.pack_dense_fp8_cache(keys)`: cache_values u8[total_pages,
  page_size // 4, 4, head_dim], cache_scales u8[total_pages, R, L]:
  page_size // L rows, zero rows to R, a multiple of 4) in place of
  `cache_kv`; num_cores: each launch's programs split over this many
  TensorCores (2: both cores of a v4 or v5p chip), same indices.
  """


def _pair_page(
    body, q, indexer_weights, cache_values, cache_scales, seq_lens, page_indices,
    cu_q_lens, num_seqs, *, k_pages, compression_ratio=P.compression_ratio,
    num_kv_pages_per_block=P.num_kv_pages_per_block,
    num_queries_per_block=P.num_queries_per_block,
    vmem_limit_bytes=P.vmem_limit_bytes, causal_rule=P.causal_rule,
    return_scores=P.return_scores, num_cores=P.num_cores,
    skip_empty_launches=P.skip_empty_launches,
    physical_slots=P.physical_slots):
  """Page-level top-k over the dense FP8 cache: i32[max_num_tokens, k_pages].

  Arguments and result as `streamidx.streamindex_page_topk`, with the dense
  FP8 pair in place of `cache_kv`; `num_cores` as `streamindex_topk_dense`'s.
  """


# The one table of kernel bodies x modes: each entry point, its body, mode
# and signature (`streamidx.variants` registers them by body and mode).
Entry = driver.Entry
streamindex_topk = Entry(_packed_token, VENDORED, "token", "streamindex_topk")
streamindex_page_topk = Entry(_packed_page, VENDORED, "page",
                              "streamindex_page_topk")
streamindex_topk_dense = Entry(_pair_token, DENSE, "token",
                               "streamindex_topk_dense")
streamindex_page_topk_dense = Entry(_pair_page, DENSE, "page",
                                    "streamindex_page_topk_dense")
streamindex_topk_lean = Entry(
    _pair_token, LEAN, "token", "streamindex_topk_lean",
    """`streamindex_topk_dense` (same arguments and indices) with the
  vector-lean kernel body (`streamidx.kernels.lean`).""")
streamindex_page_topk_lean = Entry(
    _pair_page, LEAN, "page", "streamindex_page_topk_lean",
    """`streamindex_page_topk_dense` (same arguments and page ids) with the
  vector-lean kernel body (`streamidx.kernels.lean`).""")
streamindex_topk_inline = Entry(
    _packed_token, INLINE, "token", "streamindex_topk_inline",
    """StreamIndex top-k over the inline FP8 cache: i32[max_num_tokens, k].

  Arguments and result as `streamidx.streamindex_topk`, with the inline FP8
  array (`streamidx.pack_inline_fp8_cache(keys)`: u8[total_pages, page_size
  // 4 + 1, 4, 128], a page's e4m3 values then a row of its e8m0 bytes;
  head_dim <= 128, page_size <= 512) as `cache_kv`; the lean kernel body
  (`streamidx.kernels.lean`), one DMA a page.""")
streamindex_topk_fp4 = Entry(
    _pair_token, FP4, "token", "streamindex_topk_fp4",
    """StreamIndex top-k over the MXFP4 cache: i32[max_num_tokens, k].

  Arguments and result as `streamidx.streamindex_topk`, with the MXFP4 pair
  (`streamidx.pack_mxfp4_cache(keys)`: cache_values u8[total_pages,
  page_size // 8, 4, head_dim], cache_scales u8[total_pages, head_dim // 32,
  page_size]) in place of `cache_kv`.""", drop=("num_cores",))
streamindex_page_topk_fp4 = Entry(
    _pair_page, FP4, "page", "streamindex_page_topk_fp4",
    """Page-level top-k over the MXFP4 cache: i32[max_num_tokens, k_pages],
  `streamidx.streamindex_page_topk` with the MXFP4 pair in place of
  `cache_kv`.""", drop=("num_cores",))
ENTRIES = (streamindex_topk, streamindex_page_topk, streamindex_topk_dense,
           streamindex_page_topk_dense, streamindex_topk_lean,
           streamindex_page_topk_lean, streamindex_topk_inline,
           streamindex_topk_fp4, streamindex_page_topk_fp4)
