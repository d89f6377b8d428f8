"""Exact pure-JAX reference for the StreamIndex top-k kernels.

Each function takes the same arguments as its kernel, so a caller can swap
one for the other (block-size and VMEM arguments are accepted and ignored):

- `streamindex_topk_ref`       <-> `streamidx.streamindex_topk`
- `streamindex_page_topk_ref`  <-> `streamidx.streamindex_page_topk`
- `streamindex_topk_dense_ref` <-> `streamidx.streamindex_topk_dense`
- `streamindex_page_topk_dense_ref` <-> `streamidx.streamindex_page_topk_dense`

`cache_kv` may also be the dense FP8 pair `(cache_values, cache_scales)`
(`streamidx.cache.pack_dense_fp8_cache`): it decodes to the same e4m3 values
and scales as the packed "fp8" record of the same keys, and is scored alike.

Semantics, for the query at absolute position p of sequence b
(p = seq_len - q_len + i for its i-th query token):

    score[t, s] = sum_h w[t, h] * ReLU(q[t, h] . k[s])      (k dequantized)
    visible(s)  = s < seq_len // ratio  and  s < bound(p)
    bound(p)    = (p + 1) // ratio   ("model", default: complete blocks only)
                  p // ratio + 1     ("seed": the vendored kernel's rule)

Invisible entries score -inf; the top-k (exact: `topk_from_scores`, ties to
the lowest index, see `streamidx.topk`) returns -1 in their place. Rows that belong to no sequence (padding) are all -1.

Arithmetic follows the kernel's order: the dot product runs on the stored
values (e4m3 or bf16) with f32 accumulation, then ReLU, the weighted head
sum, and only then the FP8 record's power-of-two scale. XLA may still order
the f32 sums differently for the kernel's block shapes than here (seen: one
ulp), so kernel and reference are compared within
`metrics.summation_atol`, a bound derived from this arithmetic. Multiplying by a power of two is exact and
commutes with ReLU and the weighted sum, so this equals scoring dequantized
keys (barring f32 overflow/underflow), which the tests check against an
independent NumPy oracle.

Memory: the one-shot reference materializes the `[T, entries]` score matrix
and, per chunk of query tokens, that chunk's gathered keys; the chunk size is
picked to keep the latter near `chunk_bytes`.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from streamidx import cache as cache_lib
from streamidx import topk as topk_lib
from streamidx.semantics import DEFAULT_VMEM_LIMIT_BYTES, causal_visible_bound

__all__ = [
    "token_scores",
    "page_scores",
    "topk_from_scores",
    "streamindex_topk_ref",
    "streamindex_page_topk_ref",
    "streamindex_topk_dense_ref",
    "streamindex_page_topk_dense_ref",
]

_DEFAULT_CHUNK_BYTES = 256 * 1024 * 1024


def _token_rows(cu_q_lens, seq_lens, num_seqs, num_tokens, one_token_per_seq):
  """Per query row: (sequence id or -1, absolute position)."""
  t = jnp.arange(num_tokens, dtype=jnp.int32)
  if one_token_per_seq:
    max_num_seqs = seq_lens.shape[0]
    seq = jnp.where(t < jnp.minimum(num_seqs, max_num_seqs), t, -1)
    seq_c = jnp.clip(seq, 0, max_num_seqs - 1)
    pos = seq_lens[seq_c] - 1
    return seq, pos
  # Sequence b owns rows [cu_q_lens[b], cu_q_lens[b + 1]); among b < num_seqs.
  bounds = cu_q_lens[1:]
  seq = jnp.searchsorted(bounds, t, side="right").astype(jnp.int32)
  max_num_seqs = seq_lens.shape[0]
  seq_c = jnp.clip(seq, 0, max_num_seqs - 1)
  live = (seq < num_seqs) & (t >= cu_q_lens[seq_c]) & (t < cu_q_lens[seq_c + 1])
  q_len = cu_q_lens[seq_c + 1] - cu_q_lens[seq_c]
  pos = seq_lens[seq_c] - q_len + (t - cu_q_lens[seq_c])
  return jnp.where(live, seq, -1), pos


def score_entries(qt, wt, kv, scale):
  """One query row against a run of entries: the kernel's arithmetic order.

  Args:
    qt: [H, D] the row's queries (q's dtype).
    wt: f32[H] its indexer weights.
    kv: [E, D] stored key values (e4m3fn, bf16 or f32).
    scale: f32[E] the FP8 records' power-of-two scales, or None.

  Returns:
    f32[E] unmasked scores: dot in f32, ReLU, weighted head sum, then scale.
  """
  s = jnp.einsum("hd,ed->he", qt, kv, preferred_element_type=jnp.float32)
  s = jnp.maximum(s, 0.0)
  s = s * wt[:, None]
  s = s.sum(axis=0)
  if scale is not None:
    s = s * scale
  return s


def rows_per_batch(num_tokens: int, num_entries: int, num_heads: int,
                   head_dim: int,
                   chunk_bytes: int = _DEFAULT_CHUNK_BYTES) -> int:
  """Query rows the one-shot reference scores per `lax.map` batch."""
  per_token = num_entries * (head_dim * 4 + num_heads * 4)
  return int(max(1, min(num_tokens, chunk_bytes // max(per_token, 1))))


def _scores(q, indexer_weights, cache_kv, seq_lens, page_indices, cu_q_lens,
            num_seqs, *, compression_ratio, causal_rule, one_token_per_seq,
            chunk_bytes):
  num_tokens, num_heads, head_dim = q.shape
  max_num_seqs = seq_lens.shape[0]
  pages_per_seq = page_indices.shape[0] // max_num_seqs
  values, scales = cache_lib.unpack_cache_raw(cache_kv, head_dim)
  page_size = values.shape[1]
  num_entries = pages_per_seq * page_size
  table = page_indices.reshape(max_num_seqs, pages_per_seq)
  # The kernel clamps page indices to the cache; so does the gather here.
  table = jnp.clip(table, 0, values.shape[0] - 1)
  seq_values = values[table].reshape(max_num_seqs, num_entries, head_dim)
  seq_scales = (None if scales is None else
                scales[table].reshape(max_num_seqs, num_entries))
  # XLA:CPU (jax 0.10.2) miscompiles the per-token gather + dot below when
  # max_num_seqs == 1 and there are >= 256 entries (every score of a row
  # becomes its first column). The barrier keeps the gathered cache an
  # opaque operand; tests/test_reference.py pins the case.
  seq_values, seq_scales = jax.lax.optimization_barrier(
      (seq_values, seq_scales))

  seq_ids, positions = _token_rows(cu_q_lens, seq_lens, num_seqs, num_tokens,
                                   one_token_per_seq)
  weights = indexer_weights.astype(jnp.float32)
  entry = jnp.arange(num_entries, dtype=jnp.int32)

  def one_token(args):
    qt, wt, seq, pos = args
    seq_c = jnp.maximum(seq, 0)
    # `take`, not `seq_values[seq_c]`: with max_num_seqs == 1, XLA:CPU
    # (jax 0.10.2) also miscompiles the indexing gather in lax.map's
    # remainder batch (num_tokens % batch_size != 0), barrier or not.
    kv = jnp.take(seq_values, seq_c, axis=0)  # [E, D]
    scale = (None if seq_scales is None else
             jnp.take(seq_scales, seq_c, axis=0))
    s = score_entries(qt, wt, kv, scale)
    kv_len = seq_lens[seq_c] // compression_ratio
    bound = causal_visible_bound(pos, compression_ratio, causal_rule)
    mask = (entry < kv_len) & (entry < bound) & (seq >= 0)
    return jnp.where(mask, s, -jnp.inf)

  batch_size = rows_per_batch(num_tokens, num_entries, num_heads, head_dim,
                              chunk_bytes)
  return jax.lax.map(one_token, (q, weights, seq_ids, positions),
                     batch_size=batch_size)


def _pool_pages(scores, page_size):
  t, e = scores.shape
  return scores.reshape(t, e // page_size, page_size).max(axis=-1)


@functools.partial(
    jax.jit,
    static_argnames=("compression_ratio", "causal_rule", "chunk_bytes"))
def token_scores(q, indexer_weights, cache_kv, seq_lens, page_indices,
                 cu_q_lens, distribution, *, compression_ratio: int,
                 causal_rule: str = "model",
                 chunk_bytes: int = _DEFAULT_CHUNK_BYTES):
  """Masked scores f32[T, pages_per_seq * page_size]; -inf = not visible.

  Column s is sequence-local compressed entry s (the kernel's index space).
  """
  return _scores(q, indexer_weights, cache_kv, seq_lens, page_indices,
                 cu_q_lens, distribution[2],
                 compression_ratio=compression_ratio, causal_rule=causal_rule,
                 one_token_per_seq=False, chunk_bytes=chunk_bytes)


@functools.partial(
    jax.jit,
    static_argnames=("compression_ratio", "causal_rule", "one_token_per_seq",
                     "chunk_bytes"))
def page_scores(q, indexer_weights, cache_kv, seq_lens, page_indices,
                cu_q_lens, num_seqs, *, compression_ratio: int = 1,
                causal_rule: str = "model", one_token_per_seq: bool = False,
                chunk_bytes: int = _DEFAULT_CHUNK_BYTES):
  """Page-pooled scores f32[T, pages_per_seq]: max over each page's entries."""
  _, page_size = cache_lib.cache_pages(cache_kv)
  s = _scores(q, indexer_weights, cache_kv, seq_lens, page_indices, cu_q_lens,
              jnp.asarray(num_seqs, jnp.int32),
              compression_ratio=compression_ratio, causal_rule=causal_rule,
              one_token_per_seq=one_token_per_seq, chunk_bytes=chunk_bytes)
  return _pool_pages(s, page_size)


def topk_from_scores(scores, k: int, *, return_scores: bool = False):
  """Exact top-k indices i32[T, k] of masked scores, -1 where -inf.

  `streamidx.topk.select_topk(scores, k, "top_k")`: by score descending
  (-0.0 equals +0.0), equal scores by index ascending, -1 past the visible
  entries; every exact `topk_method` of the kernels returns the same.
  With `return_scores`, returns (indices, f32[T, k] their scores, -inf
  where the index is -1; `streamidx.topk.scores_at`).
  """
  idx = topk_lib.select_topk(scores, k, "top_k")
  return (idx, topk_lib.scores_at(scores, idx)) if return_scores else idx


@functools.partial(
    jax.jit,
    static_argnames=("k", "compression_ratio", "num_kv_pages_per_block",
                     "num_queries_per_block", "vmem_limit_bytes",
                     "decode_req_batch_size", "causal_rule", "topk_method",
                     "return_scores", "sort_decode"))
def streamindex_topk_ref(
    q,  # [max_num_tokens, num_q_heads, head_dim]
    indexer_weights,  # [max_num_tokens, num_q_heads]
    cache_kv,  # [total_num_pages, page_size_per_kv_packing, kv_packing, lkv_dim]
    seq_lens,  # i32[max_num_seqs]
    page_indices,  # i32[max_num_seqs * pages_per_seq]
    cu_q_lens,  # i32[max_num_seqs + 1]
    distribution,  # i32[3]
    *,
    k: int,
    compression_ratio: int,
    num_kv_pages_per_block=None,
    num_queries_per_block=None,
    vmem_limit_bytes: int = DEFAULT_VMEM_LIMIT_BYTES,
    decode_req_batch_size: int = 4,
    causal_rule: str = "model",
    topk_method: str = topk_lib.DEFAULT_TOPK_METHOD,
    return_scores: bool = False,
    sort_decode: bool = True,
):
  """Reference twin of `streamindex_topk`: i32[T, k] sequence-local entries.

  Block sizes, `vmem_limit_bytes`, `decode_req_batch_size` and `sort_decode`
  only shape the kernel's schedule; they are accepted for drop-in use and
  ignored. So is
  `topk_method` (checked against `streamidx.topk.TOPK_METHODS`): the
  reference always selects exactly (`topk_from_scores`), which is what every
  exact method returns and what "approx" is measured against. A float32
  cache (`cache.pack_cache(keys, "f32")`) is accepted too: the exact baseline.
  `return_scores=True` returns (indices, f32[T, k] scores), as the kernel.
  """
  del num_kv_pages_per_block, num_queries_per_block, vmem_limit_bytes
  del decode_req_batch_size, sort_decode
  topk_lib.check_topk_method(topk_method)
  s = token_scores(q, indexer_weights, cache_kv, seq_lens, page_indices,
                   cu_q_lens, distribution,
                   compression_ratio=compression_ratio,
                   causal_rule=causal_rule)
  return topk_from_scores(s, k, return_scores=return_scores)


@functools.partial(
    jax.jit,
    static_argnames=("k_pages", "compression_ratio", "num_kv_pages_per_block",
                     "num_queries_per_block", "vmem_limit_bytes",
                     "causal_rule", "one_token_per_seq", "return_scores"))
def streamindex_page_topk_ref(
    q,  # [max_num_tokens, num_q_heads, head_dim]
    indexer_weights,  # [max_num_tokens, num_q_heads]
    cache_kv,  # [total_pages, page_size_per_kv_packing, kv_packing, lkv]
    seq_lens,  # i32[max_num_seqs]
    page_indices,  # i32[max_num_seqs * pages_per_seq]
    cu_q_lens,  # i32[max_num_seqs + 1]
    num_seqs,  # i32[]
    *,
    k_pages: int,
    compression_ratio: int = 1,
    num_kv_pages_per_block: int = 128,
    num_queries_per_block: int = 512,
    vmem_limit_bytes=64 * 1024 * 1024,
    causal_rule: str = "model",
    one_token_per_seq: bool = False,
    return_scores: bool = False,
):
  """Reference twin of `streamindex_page_topk`: i32[T, k_pages] local pages.

  A page's score is the max of its entries' masked scores; pages with no
  visible entry are -inf and come back as -1.

  one_token_per_seq=False: the prefill/extend form, rows assigned to
  sequences by `cu_q_lens` (what the kernel computes). True: the decode form,
  row i is the single query (at position seq_len - 1) of sequence i, and
  `cu_q_lens` is ignored. Unlike the kernel, any `compression_ratio` works.
  `return_scores=True` returns (page ids, f32[T, k_pages] page scores).
  """
  del num_kv_pages_per_block, num_queries_per_block, vmem_limit_bytes
  s = page_scores(q, indexer_weights, cache_kv, seq_lens, page_indices,
                  cu_q_lens, num_seqs, compression_ratio=compression_ratio,
                  causal_rule=causal_rule,
                  one_token_per_seq=one_token_per_seq)
  return topk_from_scores(s, k_pages, return_scores=return_scores)


def streamindex_topk_dense_ref(q, indexer_weights, cache_values, cache_scales,
                               seq_lens, page_indices, cu_q_lens, distribution,
                               **static):
  """Reference twin of `streamindex_topk_dense`: the dense FP8 pair scored
  as `streamindex_topk_ref` scores the packed FP8 record (same keywords;
  `num_cores` shapes the kernel's grid only and is ignored)."""
  static.pop("num_cores", None)
  return streamindex_topk_ref(q, indexer_weights, (cache_values, cache_scales),
                              seq_lens, page_indices, cu_q_lens, distribution,
                              **static)


def streamindex_page_topk_dense_ref(q, indexer_weights, cache_values,
                                    cache_scales, seq_lens, page_indices,
                                    cu_q_lens, num_seqs, **static):
  """Reference twin of `streamindex_page_topk_dense` (keywords as
  `streamindex_page_topk_ref`; `num_cores` is ignored)."""
  static.pop("num_cores", None)
  return streamindex_page_topk_ref(q, indexer_weights,
                                   (cache_values, cache_scales), seq_lens,
                                   page_indices, cu_q_lens, num_seqs, **static)


def visible_counts(seq_lens, cu_q_lens, num_seqs, num_tokens, *,
                   compression_ratio: int, causal_rule: str = "model"):
  """NumPy helper: visible entries per query row (0 for padding rows)."""
  seq_lens = np.asarray(seq_lens)
  cu = np.asarray(cu_q_lens)
  out = np.zeros(num_tokens, np.int64)
  for b in range(int(num_seqs)):
    lo, hi = int(cu[b]), int(cu[b + 1])
    pos = seq_lens[b] - (hi - lo) + np.arange(hi - lo)
    bound = causal_visible_bound(pos, compression_ratio, causal_rule)
    out[lo:hi] = np.minimum(seq_lens[b] // compression_ratio, bound)
  return out
