"""Exact pure-JAX reference for the StreamIndex top-k kernels.

Each function takes its kernel's arguments, so either can stand in for the other
(`streamindex_topk_ref` <-> `streamidx.streamindex_topk`); schedule arguments
(block sizes, `vmem_limit_bytes`, `decode_req_batch_size`, `sort_decode`) are
accepted and ignored, `topk_method` and `decode_q_len` checked and otherwise
ignored; kernel-only options (`call.KERNEL_ONLY`) are not arguments. `cache_kv`:
any packed cache (float32 too: the exact baseline), the dense FP8 pair or the
MXFP4 pair (its dequantized keys). Row t (sequence b, position p) scores entry s
by `score_entries` where s < seq_len // ratio and s <
`semantics.causal_visible_bound(p, ratio, causal_rule)`, else -inf (-1 in the
top-k); padding rows are all -1; a page scores its entries' max.

One engine (`_run`) computes everything here and in `streamidx.streaming`:

    for each block of Tc query rows (`rows_per_block`)          (lax.map)
      running = (-inf, -1) * k                                   [Tc, k]
      for each chunk of C entries (here C = all E of them)      (lax.scan)
        gather the chunk's records through the page table       [Tc, C, lkv]
        unpack (`cache.unpack_cache_raw`), score, mask          [Tc, C]
        running = rule_top_k(concat(running, chunk), k, ids)    [Tc, k + C]

The indices are the rule's over the whole row, ties included: the merge is
`topk.base.rule_top_k` with the candidates' ids, which ranks by (score
desc, id asc), and an element of the top k of (prefix + chunk) is in the
prefix's top k or in the chunk (tests/test_streaming.py).
"""

from __future__ import annotations

import inspect

import jax
import jax.numpy as jnp
from jax import lax
import numpy as np

from streamidx import cache as cache_lib
from streamidx import topk as topk_lib
from streamidx.call import PageCall, TopkCall, check_bool
from streamidx.semantics import (cdiv, causal_visible_bound, check_causal_rule,
                                 row_sequences)

DEFAULT_CHUNK_BYTES = 256 * 1024 * 1024


def jit_static_keywords(fn):
  """`jax.jit` with every keyword-only argument static (the call's config)."""
  names = [p.name for p in inspect.signature(fn).parameters.values()
           if p.kind is p.KEYWORD_ONLY]
  return jax.jit(fn, static_argnames=names)


def score_entries(qt, wt, kv, scale):
  """[E] unmasked scores of one query row, in the kernel's arithmetic order:
  dot of qt [H, D] with the stored values kv [E, D], ReLU, weighted sum over
  wt [H], then scale [E] (the FP8 power-of-two scales; None: 1). Float32
  accumulation (float64 where an input is float64), the products of float32
  inputs at full precision (a TPU's default rounds them to bf16 first)."""
  f32, f64 = jnp.dtype(jnp.float32), jnp.dtype(jnp.float64)
  acc = jnp.float64 if f64 in {jnp.dtype(x.dtype) for x in (qt, wt, kv)} else f32
  full = {jnp.dtype(qt.dtype), jnp.dtype(kv.dtype)} & {f32, f64}
  s = jnp.einsum("hd,ed->he", qt, kv, preferred_element_type=acc,
                 precision=lax.Precision.HIGHEST if full else None)
  s = jnp.maximum(s, 0.0) * wt.astype(acc)[:, None]
  s = s.sum(axis=0)
  return s if scale is None else s * scale


def step_bytes_per_row(entries: int, num_heads: int, head_dim: int,
                       lkv: int, k: int = 0) -> int:
  """Bytes one query row adds to a step over `entries` entries: records,
  unpacked and widened values, per-head scores, scores, scale, mask, merge
  candidates (value, id)."""
  return entries * (lkv + 5 * head_dim + 4 * num_heads + 20) + 16 * k


def rows_per_block(num_tokens: int, num_entries: int, num_heads: int,
                   head_dim: int, lkv: int,
                   chunk_bytes: int = DEFAULT_CHUNK_BYTES) -> int:
  """Query rows per block: a step over all `num_entries` near `chunk_bytes`."""
  per = step_bytes_per_row(num_entries, num_heads, head_dim, lkv)
  return int(max(1, min(num_tokens, chunk_bytes // max(per, 1))))


def _token_rows(cu_q_lens, seq_lens, num_seqs, num_tokens, one_token_per_seq):
  """Per query row: (sequence id or -1, absolute position)."""
  t = jnp.arange(num_tokens, dtype=jnp.int32)
  max_num_seqs = seq_lens.shape[0]
  if one_token_per_seq:
    seq = jnp.where(t < jnp.minimum(num_seqs, max_num_seqs), t, -1)
    return seq, seq_lens[jnp.clip(seq, 0, max_num_seqs - 1)] - 1
  seq = row_sequences(cu_q_lens, num_seqs, num_tokens)
  seq_c = jnp.maximum(seq, 0)
  q_len = cu_q_lens[seq_c + 1] - cu_q_lens[seq_c]
  pos = seq_lens[seq_c] - q_len + (t - cu_q_lens[seq_c])
  return seq, pos


def _entry_arrays(cache_kv):
  """Entry-major arrays (row P * page_size + t: entry t of page P): the
  packed cache [N, lkv], the dense pair's (or the inline array's) values
  [N, lanes], scales [N], or the MXFP4 pair's dequantized keys [N, lanes]."""
  if cache_lib.is_mxfp4(cache_kv):  # dequantized once, as f32 records
    keys = cache_lib.unpack_cache(cache_kv, cache_kv[0].shape[-1])
    return (keys.reshape(-1, keys.shape[-1]),)
  if cache_lib.is_inline(cache_kv):  # the same bytes as its pair
    cache_kv = cache_lib.inline_to_pair(cache_kv)
  if isinstance(cache_kv, (tuple, list)):
    values = jnp.asarray(cache_kv[0])
    page_size = cache_lib.cache_pages(cache_kv)[1]
    return (values.reshape(-1, values.shape[-1]),
            cache_lib.entry_scale_bytes(cache_kv[1], page_size).reshape(-1))
  cache_kv = jnp.asarray(cache_kv)
  return (cache_kv.reshape(-1, cache_kv.shape[-1]),)


def _unpack_entries(parts, head_dim):
  """Gathered `_entry_arrays` rows -> (values [N, D], f32 scales [N] | None)."""
  n = parts[0].shape[0]
  cache = parts[0].reshape(n, 1, 1, -1)
  if len(parts) == 2:
    cache = (cache, parts[1].reshape(n, 1, 1))
  values, scales = cache_lib.unpack_cache_raw(cache, head_dim)
  return values.reshape(n, head_dim), scales


def _run(q, indexer_weights, cache_kv, seq_lens, page_indices, cu_q_lens,
         num_seqs, *, compression_ratio, causal_rule, one_token_per_seq=False,
         pool_pages=False, k=None, chunk_entries=None, chunk_tokens=None,
         chunk_bytes=DEFAULT_CHUNK_BYTES, slots=False):
  """The engine (module docstring). k None: masked scores f32[T, E] (pooled:
  [T, pages_per_seq]); else (ids i32[T, k], their scores f32[T, k]); slots:
  the ids as `cache.physical_slots` (pooled: physical pages)."""
  check_causal_rule(causal_rule)
  num_tokens, num_heads, head_dim = q.shape
  max_num_seqs = seq_lens.shape[0]
  pages_per_seq = page_indices.shape[0] // max_num_seqs
  total_pages, page_size = cache_lib.cache_pages(cache_kv)
  num_entries = pages_per_seq * page_size
  parts = _entry_arrays(cache_kv)
  lkv = sum(int(np.prod(p.shape[1:])) * p.dtype.itemsize for p in parts)
  # The kernel clamps page indices to the cache; so does the gather here.
  table = jnp.clip(page_indices.reshape(max_num_seqs, pages_per_seq), 0,
                   total_pages - 1)
  seq_ids, positions = _token_rows(cu_q_lens, seq_lens, num_seqs, num_tokens,
                                   one_token_per_seq)
  weights = indexer_weights.astype(jnp.float32)
  chunk = min(chunk_entries or num_entries, num_entries)
  num_chunks = cdiv(num_entries, chunk)
  ids_per_chunk = chunk // page_size if pool_pages else chunk
  tc = chunk_tokens or rows_per_block(num_tokens, num_entries, num_heads,
                                      head_dim, lkv, chunk_bytes)
  tc = cdiv(num_tokens, cdiv(num_tokens, tc)) if num_tokens else 1  # even

  def chunk_scores(qb, wb, seq, pos, c):
    """f32[Tc, C] masked scores of chunk c (pooled: [Tc, C / page_size])."""
    entry = c * chunk + jnp.arange(chunk, dtype=jnp.int32)  # [C]
    # Past the last entry (a partial last chunk): the last entry's record,
    # masked below.
    flat = cache_lib.physical_slots(
        jnp.broadcast_to(jnp.minimum(entry, num_entries - 1), (tc, chunk)),
        table, seq, page_size).reshape(-1)
    # Records gathered per row, behind a barrier: XLA:CPU (jax 0.10.2)
    # miscompiled indexing a sequence's whole gathered cache per row
    # (tests/test_reference.py pins the shapes).
    gathered = jax.lax.optimization_barrier(tuple(p[flat] for p in parts))
    values, scales = _unpack_entries(gathered, head_dim)
    s = jax.vmap(score_entries)(
        qb, wb, values.reshape(tc, chunk, head_dim),
        None if scales is None else scales.reshape(tc, chunk))
    kv_len = seq_lens[jnp.maximum(seq, 0)] // compression_ratio
    bound = causal_visible_bound(pos, compression_ratio, causal_rule)
    mask = ((entry[None, :] < kv_len[:, None])
            & (entry[None, :] < bound[:, None])
            & (seq >= 0)[:, None] & (entry < num_entries)[None, :])
    s = jnp.where(mask, s, -jnp.inf)
    if pool_pages:
      s = s.reshape(tc, ids_per_chunk, page_size).max(axis=-1)
    return s

  def block(args):
    qb, wb, seq, pos = args  # [Tc, H, D], f32[Tc, H], i32[Tc], i32[Tc]
    if k is None:
      return chunk_scores(qb, wb, seq, pos, 0)

    def step(carry, c):
      s = chunk_scores(qb, wb, seq, pos, c)
      ids = c * ids_per_chunk + jnp.arange(ids_per_chunk, dtype=jnp.int32)
      vals = jnp.concatenate([carry[0], s], axis=1)
      cand = jnp.concatenate(
          [carry[1], jnp.broadcast_to(ids, (tc, ids_per_chunk))], axis=1)
      return topk_lib.base.rule_top_k(vals, k, ids=cand), None

    init = (jnp.full((tc, k), -jnp.inf, jnp.float32),
            jnp.full((tc, k), -1, jnp.int32))
    (vals, ids), _ = jax.lax.scan(step, init,
                                  jnp.arange(num_chunks, dtype=jnp.int32))
    ids = jnp.where(vals == -jnp.inf, -1, ids).astype(jnp.int32)
    if slots:  # the caller's page table, as given
      ids = cache_lib.physical_slots(
          ids, page_indices.reshape(max_num_seqs, pages_per_seq), seq,
          1 if pool_pages else page_size)
    return ids, vals

  num_blocks = cdiv(num_tokens, tc)

  def blocked(x, fill):
    pad = [(0, num_blocks * tc - num_tokens)] + [(0, 0)] * (x.ndim - 1)
    x = jnp.pad(x, pad, constant_values=fill)
    return x.reshape((num_blocks, tc) + x.shape[1:])

  out = jax.lax.map(block, (blocked(q, 0), blocked(weights, 0),
                            blocked(seq_ids, -1), blocked(positions, 0)))
  return jax.tree.map(
      lambda x: x.reshape((num_blocks * tc,) + x.shape[2:])[:num_tokens], out)


@jit_static_keywords
def token_scores(q, indexer_weights, cache_kv, seq_lens, page_indices,
                 cu_q_lens, distribution, *, compression_ratio: int,
                 causal_rule=TopkCall.causal_rule,
                 chunk_bytes: int = DEFAULT_CHUNK_BYTES):
  """Masked scores f32[T, pages_per_seq * page_size]; -inf = not visible.

  Column s is sequence-local compressed entry s (the kernel's index space).
  `chunk_bytes` sizes the row blocks (`rows_per_block`).
  """
  return _run(q, indexer_weights, cache_kv, seq_lens, page_indices, cu_q_lens,
              distribution[2], compression_ratio=compression_ratio,
              causal_rule=causal_rule, chunk_bytes=chunk_bytes)


@jit_static_keywords
def page_scores(q, indexer_weights, cache_kv, seq_lens, page_indices,
                cu_q_lens, num_seqs, *, compression_ratio: int = 1,
                causal_rule=TopkCall.causal_rule,
                one_token_per_seq: bool = False,
                chunk_bytes: int = DEFAULT_CHUNK_BYTES):
  """Page-pooled scores f32[T, pages_per_seq]: max over each page's entries."""
  return _run(q, indexer_weights, cache_kv, seq_lens, page_indices, cu_q_lens,
              jnp.asarray(num_seqs, jnp.int32),
              compression_ratio=compression_ratio, causal_rule=causal_rule,
              one_token_per_seq=one_token_per_seq, pool_pages=True,
              chunk_bytes=chunk_bytes)


def _check_chunks(chunk_entries, chunk_tokens, page_size=None):
  for name, v in (("chunk_entries", chunk_entries),
                  ("chunk_tokens", chunk_tokens)):
    if v is not None and (not isinstance(v, int) or isinstance(v, bool)
                          or v <= 0):
      raise ValueError(f"{name}: must be None or a positive int (got {v!r})")
  if page_size is not None and chunk_entries and chunk_entries % page_size:
    raise ValueError(
        f"chunk_entries: must be a multiple of page_size ({page_size}) in page"
        f" mode, so that pages are pooled whole (got {chunk_entries})")


def topk_from_scores(scores, k: int, *, return_scores: bool = False):
  """Exact top-k indices i32[T, k] of masked scores, -1 where -inf, by the
  rule (`streamidx.topk.base`, whatever `lax.top_k` does with ties):
  `streamidx.topk.select_topk(scores, k, "top_k")`, as every exact method.
  With `return_scores`: (indices, f32[T, k] `streamidx.topk.scores_at`)."""
  idx = topk_lib.select_topk(scores, k, "top_k")
  return (idx, topk_lib.scores_at(scores, idx)) if return_scores else idx


@jit_static_keywords
def streamindex_topk_ref(
    q, indexer_weights, cache_kv, seq_lens, page_indices, cu_q_lens,
    distribution, *, k: int, compression_ratio: int,
    num_kv_pages_per_block=None, num_queries_per_block=None,
    vmem_limit_bytes=TopkCall.vmem_limit_bytes,
    decode_req_batch_size=TopkCall.decode_req_batch_size,
    causal_rule=TopkCall.causal_rule, topk_method=TopkCall.topk_method,
    return_scores=TopkCall.return_scores, sort_decode=TopkCall.sort_decode,
    chunk_entries: int | None = None, chunk_tokens: int | None = None,
    decode_q_len=TopkCall.decode_q_len,
    physical_slots=TopkCall.physical_slots):
  """Reference twin of `streamindex_topk`: i32[T, k] sequence-local entries.

  q [T, H, D], indexer_weights [T, H], cache_kv (module docstring), seq_lens
  i32[S], page_indices i32[S * pages_per_seq], cu_q_lens i32[S + 1],
  distribution i32[3]; `return_scores`, `physical_slots` as the kernel's.
  chunk_entries (None: all of a sequence's) and chunk_tokens (None:
  `rows_per_block`): the streaming reference's; the indices are equal.
  """
  del num_kv_pages_per_block, num_queries_per_block, vmem_limit_bytes
  del decode_req_batch_size, sort_decode  # drop-in only (module docstring)
  _check_chunks(chunk_entries, chunk_tokens)
  TopkCall(k, compression_ratio, causal_rule=causal_rule,
           topk_method=topk_method, decode_q_len=decode_q_len,
           physical_slots=physical_slots)  # the call's static rules, once
  idx, scores = _run(q, indexer_weights, cache_kv, seq_lens, page_indices,
                     cu_q_lens, distribution[2], k=k,
                     compression_ratio=compression_ratio,
                     causal_rule=causal_rule, chunk_entries=chunk_entries,
                     chunk_tokens=chunk_tokens, slots=physical_slots)
  return (idx, scores) if return_scores else idx


@jit_static_keywords
def streamindex_page_topk_ref(
    q, indexer_weights, cache_kv, seq_lens, page_indices, cu_q_lens,
    num_seqs, *, k_pages: int, compression_ratio=PageCall.compression_ratio,
    num_kv_pages_per_block=PageCall.num_kv_pages_per_block,
    num_queries_per_block=PageCall.num_queries_per_block,
    vmem_limit_bytes=PageCall.vmem_limit_bytes,
    causal_rule=PageCall.causal_rule, one_token_per_seq: bool = False,
    return_scores=PageCall.return_scores, chunk_entries: int | None = None,
    chunk_tokens: int | None = None,
    physical_slots=PageCall.physical_slots):
  """Reference twin of `streamindex_page_topk`: i32[T, k_pages] local pages.

  Arguments as `streamindex_topk_ref`'s, num_seqs i32[] for distribution
  (chunk_entries a multiple of the page size). one_token_per_seq=True: the
  decode form, row i the single query (at seq_len - 1) of sequence i,
  `cu_q_lens` ignored (False: rows by `cu_q_lens`, as the kernel).
  """
  del num_kv_pages_per_block, num_queries_per_block, vmem_limit_bytes
  _check_chunks(chunk_entries, chunk_tokens, cache_lib.cache_pages(cache_kv)[1])
  check_bool("physical_slots", physical_slots)
  idx, scores = _run(q, indexer_weights, cache_kv, seq_lens, page_indices,
                     cu_q_lens, jnp.asarray(num_seqs, jnp.int32), k=k_pages,
                     compression_ratio=compression_ratio,
                     causal_rule=causal_rule,
                     one_token_per_seq=one_token_per_seq, pool_pages=True,
                     chunk_entries=chunk_entries, chunk_tokens=chunk_tokens,
                     slots=physical_slots)
  return (idx, scores) if return_scores else idx


def visible_counts(seq_lens, cu_q_lens, num_seqs, num_tokens, *,
                   compression_ratio: int, causal_rule=TopkCall.causal_rule):
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
