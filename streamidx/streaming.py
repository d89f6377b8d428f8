"""Streaming exact reference: `streamidx.ref`'s engine over chunks of entries.

The reference scores all of a sequence's entries in one chunk; this runs
the same loop with chunks of `chunk_entries` and a running top-k merge, so
a step holds Tc x (chunk + k), not Tc x entries (`one_chunk_temp_bytes`;
tests/test_streaming.py checks XLA's buffer assignment), and returns the
same indices, ties included (the proof is in `streamidx.ref`).
"""

from __future__ import annotations

import jax.numpy as jnp

from streamidx import cache as cache_lib
from streamidx import ref as ref_lib
from streamidx.call import PageCall, TopkCall

__all__ = [
    "DEFAULT_CHUNK_ENTRIES",
    "streamindex_topk_streaming",
    "streamindex_page_topk_streaming",
    "one_chunk_temp_bytes",
]

DEFAULT_CHUNK_ENTRIES = 4096


def one_chunk_temp_bytes(*, num_tokens: int, num_entries: int,
                         num_heads: int, head_dim: int, fmt: str, k: int,
                         chunk_bytes: int = ref_lib.DEFAULT_CHUNK_BYTES
                         ) -> tuple[int, int]:
  """(low, high): the one-chunk reference's temporary buffers, in bytes.

  One step holds W = Tc x `ref.step_bytes_per_row(num_entries, ...)` (Tc =
  `ref.rows_per_block`); XLA fuses part of it: (low, high) = (W / 2, W)
  (tests/test_streaming.py checks it against XLA's buffer assignment at the
  benchmark's shapes). The cache and the T x k result come on top; with
  chunks of C entries a step is C / E of W.
  """
  lkv = cache_lib.record_bytes(fmt, head_dim)
  tc = ref_lib.rows_per_block(num_tokens, num_entries, num_heads, head_dim,
                              lkv, chunk_bytes)
  w = tc * ref_lib.step_bytes_per_row(num_entries, num_heads, head_dim, lkv, k)
  return w // 2, w


def _positive_int(v) -> bool:
  return isinstance(v, int) and not isinstance(v, bool) and v > 0


def _check_chunks(chunk_entries, chunk_tokens, page_size=None):
  if not _positive_int(chunk_entries):
    raise ValueError(
        f"chunk_entries: must be a positive int (got {chunk_entries!r})")
  if chunk_tokens is not None and not _positive_int(chunk_tokens):
    raise ValueError(
        f"chunk_tokens: must be None or a positive int (got {chunk_tokens!r})")
  if page_size is not None and chunk_entries % page_size:
    raise ValueError(
        f"chunk_entries: must be a multiple of page_size ({page_size}) in page"
        f" mode, so that pages are pooled whole (got {chunk_entries})")


@ref_lib.jit_static_keywords
def streamindex_topk_streaming(
    q, indexer_weights, cache_kv, seq_lens, page_indices, cu_q_lens,
    distribution, *,
    k: int, compression_ratio: int, num_kv_pages_per_block=None,
    num_queries_per_block=None,
    vmem_limit_bytes=TopkCall.vmem_limit_bytes,
    decode_req_batch_size=TopkCall.decode_req_batch_size,
    causal_rule=TopkCall.causal_rule,
    sort_decode=TopkCall.sort_decode, chunk_entries: int = DEFAULT_CHUNK_ENTRIES,
    chunk_tokens: int | None = None,
    topk_method=TopkCall.topk_method,
    decode_q_len=TopkCall.decode_q_len,
):
  """Streaming twin of `streamindex_topk_ref`: the same i32[T, k] indices.

  Args: those of `streamindex_topk_ref` (drop-in arguments as in
  `streamidx.ref`), plus
    chunk_entries: sequence entries scored per scan step (static). Any
      positive int; it need not divide pages_per_seq * page_size, and is
      capped at it.
    chunk_tokens: query rows per block (static). None: the reference's
      blocks (`ref.rows_per_block`), so both score a row in the same program.
  """
  del num_kv_pages_per_block, num_queries_per_block, vmem_limit_bytes
  del decode_req_batch_size, sort_decode
  _check_chunks(chunk_entries, chunk_tokens)
  TopkCall(k, compression_ratio, causal_rule=causal_rule,
           topk_method=topk_method,
           decode_q_len=decode_q_len)  # the call's static rules, checked once
  return ref_lib._run(  # pylint: disable=protected-access
      q, indexer_weights, cache_kv, seq_lens, page_indices, cu_q_lens,
      distribution[2], k=k, compression_ratio=compression_ratio,
      causal_rule=causal_rule, chunk_entries=chunk_entries,
      chunk_tokens=chunk_tokens)[0]


@ref_lib.jit_static_keywords
def streamindex_page_topk_streaming(
    q, indexer_weights, cache_kv, seq_lens, page_indices, cu_q_lens,
    num_seqs, *,
    k_pages: int, compression_ratio=PageCall.compression_ratio,
    num_kv_pages_per_block=PageCall.num_kv_pages_per_block,
    num_queries_per_block=PageCall.num_queries_per_block,
    vmem_limit_bytes=PageCall.vmem_limit_bytes,
    causal_rule=PageCall.causal_rule,
    one_token_per_seq: bool = False,
    chunk_entries: int = DEFAULT_CHUNK_ENTRIES,
    chunk_tokens: int | None = None,
):
  """Streaming twin of `streamindex_page_topk_ref` (same arguments, plus
  `chunk_entries` and `chunk_tokens`): the same i32[T, k_pages] pages.

  `chunk_entries` must be a multiple of the page size (pages are pooled
  whole); it need not divide pages_per_seq * page_size.
  """
  del num_kv_pages_per_block, num_queries_per_block, vmem_limit_bytes
  _check_chunks(chunk_entries, chunk_tokens, cache_lib.cache_pages(cache_kv)[1])
  return ref_lib._run(  # pylint: disable=protected-access
      q, indexer_weights, cache_kv, seq_lens, page_indices, cu_q_lens,
      jnp.asarray(num_seqs, jnp.int32), k=k_pages,
      compression_ratio=compression_ratio, causal_rule=causal_rule,
      one_token_per_seq=one_token_per_seq, pool_pages=True,
      chunk_entries=chunk_entries, chunk_tokens=chunk_tokens)[0]
