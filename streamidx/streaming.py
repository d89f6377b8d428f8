"""Streaming exact reference: top-k over KV chunks, for very long contexts.

The one-shot reference (`streamidx.ref`) gathers every sequence's whole
cache, materializes the `[T, entries]` score matrix and takes one `top_k`.
This module returns the same indices while keeping only a chunk of entries
alive at a time:

    for each block of `chunk_tokens` query rows:           (lax.map)
      running = (-inf, -1) * k                              [Tc, k]
      for each chunk of `chunk_entries` sequence entries:  (lax.scan)
        gather the chunk's records through the page table   [Tc, C, lkv]
        score them (same arithmetic as the one-shot)        [Tc, H, C] -> [Tc, C]
        running = top_k(concat(running, chunk), k)          [Tc, k + C] -> [Tc, k]

Memory therefore grows with `Tc x C x (4 H + lkv + ...)` per scan step
(`auto_chunk_tokens` keeps it near `DEFAULT_STEP_BYTES`) and `T x k` for
the result, not with `T x entries`: XLA's buffer assignment for it does not
grow with the sequence (tests/test_streaming.py), where the one-shot's
follows `one_shot_temp_bytes`.

Why the result is identical, ties included: `lax.top_k` breaks ties by the
lower position, and the one-shot reference's positions are entry ids, so it
selects by (score descending, entry id ascending), a total order. Chunks are
visited in increasing entry order, so every id in `running` is lower than
every id in the chunk; `running` is itself sorted by that order (it came out
of `top_k`); and the chunk's columns are in increasing id order. In
`concat(running, chunk)` position order therefore agrees with id order among
equal scores, and `top_k` of it selects by the same total order. An element
of the top k of (prefix + chunk) under a total order is in the top k of the
prefix or in the chunk, so by induction the final set and its order equal the
one-shot's. The tests check exact index equality, not only tie-aware parity.

Scores are bit-identical to `ref.token_scores` wherever XLA compiles the
same arithmetic for both: the chunk's records are unpacked by
`cache.unpack_cache_raw` (the same bit-exact conversions), `_score_entries`
is the one-shot's per-row arithmetic (dot on the stored values with f32
accumulation, ReLU, weighted head sum, then the FP8 scale), and query rows
are blocked the way the one-shot batches them (`_token_plan`): on CPU, XLA
was seen to round a one-row batch differently from a multi-row batch (by
~1e-5, with a one-sequence cache), so where the one-shot scores rows one at
a time this does too. The tests check exact index equality on the test
matrix; `streamidx.bench` reports, per shape, whether the indices are
identical or only agree within float32 rounding.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from streamidx import cache as cache_lib
from streamidx import ref as ref_lib
from streamidx import topk as topk_lib
from streamidx.semantics import (CAUSAL_RULES, DEFAULT_VMEM_LIMIT_BYTES, cdiv,
                              causal_visible_bound)

__all__ = [
    "DEFAULT_CHUNK_ENTRIES",
    "DEFAULT_STEP_BYTES",
    "streamindex_topk_streaming",
    "streamindex_page_topk_streaming",
    "auto_chunk_tokens",
    "one_shot_temp_bytes",
]

DEFAULT_CHUNK_ENTRIES = 4096
# Budget for one scan step's temporaries (sets `chunk_tokens` when None).
DEFAULT_STEP_BYTES = 64 * 1024 * 1024



_score_entries = ref_lib.score_entries  # one scorer for both references


def _step_bytes_per_token(chunk_entries, num_heads, head_dim, lkv, k):
  """Bytes one query row adds to a scan step (gather, scores, merge)."""
  return chunk_entries * (lkv          # gathered records
                          + head_dim   # unpacked stored values
                          + 4 * head_dim  # values widened for the dot
                          + 4 * num_heads  # [H, C] per-head scores
                          + 4 * 3      # scores, scale, mask
                          + 8) + 16 * k  # merge candidates (value, id)


def auto_chunk_tokens(num_tokens: int, num_heads: int, head_dim: int,
                      lkv: int, *, k: int,
                      chunk_entries: int = DEFAULT_CHUNK_ENTRIES,
                      step_bytes: int = DEFAULT_STEP_BYTES) -> int:
  """Query rows per block so one scan step stays near `step_bytes`."""
  per = _step_bytes_per_token(chunk_entries, num_heads, head_dim, lkv, k)
  return int(max(1, min(num_tokens, step_bytes // per)))


def _value_bytes(fmt: str) -> int:
  return {"fp8": 1, "bf16": 2, "f32": 4}[fmt]


def one_shot_temp_bytes(*, num_tokens: int, max_num_seqs: int,
                        pages_per_seq: int, page_size: int, total_pages: int,
                        head_dim: int, fmt: str,
                        chunk_bytes: int = ref_lib._DEFAULT_CHUNK_BYTES  # pylint: disable=protected-access
                        ) -> tuple[int, int]:
  """(low, high): the one-shot reference's temporary buffers, in bytes.

  With E = pages_per_seq * page_size entries per sequence, b the stored
  value's bytes (1 for FP8, 2 for bf16, 4 for f32) and s = 4 scale bytes
  per FP8 entry (0 otherwise), `ref._scores` holds at once

      U = total_pages * page_size * (head_dim * b + s)   FP8 only: values
                                                         and scales unpacked
                                                         from the records
      G = max_num_seqs * E * (head_dim * b + s)          the sequence-
                                                         gathered cache
      S = num_tokens * E * 4                             the score matrix

  plus one `lax.map` batch of per-row temporaries, which the reference
  sizes to at most `chunk_bytes` (256 MiB), and, depending on how XLA
  fuses it, a second [T, E] buffer for `top_k`:

      low = U + G + S        high = U + G + 2 S + chunk_bytes

  The cache itself (an input) comes on top. tests/test_streaming.py checks
  that XLA's buffer assignment (`memory_analysis().temp_size_in_bytes`)
  falls in [low, high] at the benchmark's shapes; at 64 sequences x 1M
  tokens the bracket is 4.19-4.50 GiB, dominated by U + G.
  """
  e = pages_per_seq * page_size
  per_entry = head_dim * _value_bytes(fmt) + (4 if fmt == "fp8" else 0)
  unpacked = total_pages * page_size * per_entry if fmt == "fp8" else 0
  gathered = max_num_seqs * e * per_entry
  scores = num_tokens * e * 4
  low = unpacked + gathered + scores
  return low, low + scores + chunk_bytes


def _check_chunks(chunk_entries, chunk_tokens, page_size=None):
  if (not isinstance(chunk_entries, int) or isinstance(chunk_entries, bool)
      or chunk_entries <= 0):
    raise ValueError(
        f"chunk_entries: must be a positive int (got {chunk_entries!r})")
  if chunk_tokens is not None and (
      not isinstance(chunk_tokens, int) or isinstance(chunk_tokens, bool)
      or chunk_tokens <= 0):
    raise ValueError(
        f"chunk_tokens: must be None or a positive int (got {chunk_tokens!r})")
  if page_size is not None and chunk_entries % page_size:
    raise ValueError(
        f"chunk_entries: must be a multiple of page_size ({page_size}) in page"
        f" mode, so that pages are pooled whole (got {chunk_entries})")


def _check_rule(causal_rule):
  if causal_rule not in CAUSAL_RULES:
    raise ValueError(f"causal_rule: must be one of {CAUSAL_RULES} (got "
                     f"{causal_rule!r})")


def _one_shot_batch(num_tokens: int, num_entries: int, num_heads: int,
                    head_dim: int) -> int:
  """Query rows the one-shot reference scores per `lax.map` batch."""
  return ref_lib.rows_per_batch(num_tokens, num_entries, num_heads, head_dim)


def _token_plan(num_tokens, num_entries, num_heads, head_dim, lkv, k, chunk,
                chunk_tokens):
  """[(rows, rows per block)]: how the query rows are blocked, in order.

  With `chunk_tokens` given: blocks of at most that many rows. Otherwise
  the blocks mirror how the one-shot reference batches its rows, because
  XLA on CPU was seen to round a batch of one row differently from a batch
  of several (by ~1e-5 of a score, on FP8 decode and prefill batches): where the
  one-shot scores one row at a time, so does this; where it batches, blocks
  have >= 2 rows, and a single remainder row the one-shot scores alone is
  scored alone here too.
  Block sizes are evened out so the last block pads as few rows as possible.
  """
  def blocks(rows, most):
    n = cdiv(rows, min(most, rows))
    return rows, cdiv(rows, n)

  if chunk_tokens is not None:
    return [blocks(num_tokens, chunk_tokens)]
  one_shot = _one_shot_batch(num_tokens, num_entries, num_heads, head_dim)
  if one_shot == 1:
    return [(num_tokens, 1)]
  most = max(2, auto_chunk_tokens(num_tokens, num_heads, head_dim, lkv, k=k,
                                  chunk_entries=chunk))
  if num_tokens % one_shot == 1:
    return [blocks(num_tokens - 1, most), (1, 1)]
  return [blocks(num_tokens, most)]


def _streaming_topk(q, indexer_weights, cache_kv, seq_lens, page_indices,
                    cu_q_lens, num_seqs, *, k, compression_ratio, causal_rule,
                    one_token_per_seq, chunk_entries, chunk_tokens,
                    pool_pages):
  """Top-k ids i32[T, k] (entries, or pages when `pool_pages`), -1 padding."""
  num_tokens, num_heads, head_dim = q.shape
  max_num_seqs = seq_lens.shape[0]
  pages_per_seq = page_indices.shape[0] // max_num_seqs
  total_pages, rows, packing, lkv = cache_kv.shape
  page_size = rows * packing
  num_entries = pages_per_seq * page_size
  # Entry t of physical page P is records[P, t] (`streamidx.cache`).
  records = cache_kv.reshape(total_pages, page_size, lkv)
  table = page_indices.reshape(max_num_seqs, pages_per_seq)
  # The kernel clamps page indices to the cache; so do both references.
  table = jnp.clip(table, 0, total_pages - 1)

  seq_ids, positions = ref_lib._token_rows(  # pylint: disable=protected-access
      cu_q_lens, seq_lens, num_seqs, num_tokens, one_token_per_seq)
  weights = indexer_weights.astype(jnp.float32)

  # A chunk longer than the sequence would only score padding.
  chunk = min(chunk_entries, num_entries)
  num_chunks = cdiv(num_entries, chunk)
  if pool_pages:
    out_ids_per_chunk = chunk // page_size
  else:
    out_ids_per_chunk = chunk
  plan = _token_plan(num_tokens, num_entries, num_heads, head_dim, lkv, k,
                     chunk, chunk_tokens)

  def token_block(args):
    qb, wb, seq, pos = args  # [Tc, H, D], f32[Tc, H], i32[Tc], i32[Tc]
    tc = qb.shape[0]
    seq_c = jnp.maximum(seq, 0)
    kv_len = seq_lens[seq_c] // compression_ratio
    bound = causal_visible_bound(pos, compression_ratio, causal_rule)
    rows_table = table[seq_c]  # [Tc, pages_per_seq]

    def step(carry, c):
      run_vals, run_ids = carry  # f32[Tc, k], i32[Tc, k]
      entry = c * chunk + jnp.arange(chunk, dtype=jnp.int32)  # [C]
      page = jnp.minimum(entry // page_size, pages_per_seq - 1)
      phys = rows_table[:, page]  # [Tc, C]
      rec = records[phys, (entry % page_size)[None, :]]  # [Tc, C, lkv]
      values, scales = cache_lib.unpack_cache_raw(
          rec.reshape(tc * chunk, 1, 1, lkv), head_dim)
      values = values.reshape(tc, chunk, head_dim)
      if scales is None:
        s = jax.vmap(lambda a, b, c_: _score_entries(a, b, c_, None))(
            qb, wb, values)
      else:
        s = jax.vmap(_score_entries)(qb, wb, values,
                                     scales.reshape(tc, chunk))
      # The one-shot mask, plus `entry < num_entries` for the last chunk's
      # padding (entries the one-shot matrix does not have).
      mask = ((entry[None, :] < kv_len[:, None])
              & (entry[None, :] < bound[:, None])
              & (seq >= 0)[:, None] & (entry < num_entries)[None, :])
      # -0.0 -> +0.0: scores tie as floats, as in `streamidx.topk`.
      s = topk_lib.canonical_zero(jnp.where(mask, s, -jnp.inf))
      if pool_pages:
        s = ref_lib._pool_pages(s, page_size)  # pylint: disable=protected-access
      ids = c * out_ids_per_chunk + jnp.arange(out_ids_per_chunk,
                                               dtype=jnp.int32)
      # Running first: its ids are all lower than the chunk's (see module
      # docstring), so position order is id order among equal scores.
      cand_vals = jnp.concatenate([run_vals, s], axis=1)
      cand_ids = jnp.concatenate(
          [run_ids, jnp.broadcast_to(ids, (tc, out_ids_per_chunk))], axis=1)
      vals, pos_ = jax.lax.top_k(cand_vals, k)
      return (vals, jnp.take_along_axis(cand_ids, pos_, axis=1)), None

    init = (jnp.full((tc, k), -jnp.inf, jnp.float32),
            jnp.full((tc, k), -1, jnp.int32))
    (vals, ids), _ = jax.lax.scan(step, init,
                                  jnp.arange(num_chunks, dtype=jnp.int32))
    return jnp.where(vals == -jnp.inf, -1, ids).astype(jnp.int32)

  outs = []
  start = 0
  for rows, tc in plan:
    # Query rows [start, start + rows) in blocks of tc (the last block padded).
    num_blocks = cdiv(rows, tc)
    pad = num_blocks * tc - rows

    def block(x, value, start=start, rows=rows, num_blocks=num_blocks,
              tc=tc, pad=pad):
      x = jax.lax.slice_in_dim(x, start, start + rows)
      x = jnp.pad(x, [(0, pad)] + [(0, 0)] * (x.ndim - 1),
                  constant_values=value)
      return x.reshape((num_blocks, tc) + x.shape[1:])

    out = jax.lax.map(token_block, (block(q, 0), block(weights, 0),
                                    block(seq_ids, -1), block(positions, 0)))
    outs.append(out.reshape(num_blocks * tc, k)[:rows])
    start += rows
  return outs[0] if len(outs) == 1 else jnp.concatenate(outs, axis=0)


@functools.partial(
    jax.jit,
    static_argnames=("k", "compression_ratio", "num_kv_pages_per_block",
                     "num_queries_per_block", "vmem_limit_bytes",
                     "decode_req_batch_size", "causal_rule", "chunk_entries",
                     "chunk_tokens", "topk_method", "sort_decode"))
def streamindex_topk_streaming(
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
    sort_decode: bool = True,
    chunk_entries: int = DEFAULT_CHUNK_ENTRIES,
    chunk_tokens: int | None = None,
    topk_method: str = topk_lib.DEFAULT_TOPK_METHOD,
):
  """Streaming twin of `streamindex_topk_ref`: the same i32[T, k] indices.

  Args: those of `streamindex_topk_ref` (block sizes, VMEM, decode batch and
  `topk_method` arguments are accepted and ignored: it selects exactly; so is
  `sort_decode`), plus
    chunk_entries: sequence entries scored per scan step (static). Any
      positive int; it need not divide pages_per_seq * page_size, and is
      capped at it.
    chunk_tokens: query rows per block (static). None: blocks that keep
      one scan step near `DEFAULT_STEP_BYTES` and mirror how the one-shot
      batches its rows (`_token_plan`), for bit-identical scores.
  """
  del num_kv_pages_per_block, num_queries_per_block, vmem_limit_bytes
  del decode_req_batch_size, sort_decode
  _check_chunks(chunk_entries, chunk_tokens)
  _check_rule(causal_rule)
  topk_lib.check_topk_method(topk_method)
  return _streaming_topk(
      q, indexer_weights, cache_kv, seq_lens, page_indices, cu_q_lens,
      distribution[2], k=k, compression_ratio=compression_ratio,
      causal_rule=causal_rule, one_token_per_seq=False,
      chunk_entries=chunk_entries, chunk_tokens=chunk_tokens,
      pool_pages=False)


@functools.partial(
    jax.jit,
    static_argnames=("k_pages", "compression_ratio", "num_kv_pages_per_block",
                     "num_queries_per_block", "vmem_limit_bytes",
                     "causal_rule", "one_token_per_seq", "chunk_entries",
                     "chunk_tokens"))
def streamindex_page_topk_streaming(
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
    chunk_entries: int = DEFAULT_CHUNK_ENTRIES,
    chunk_tokens: int | None = None,
):
  """Streaming twin of `streamindex_page_topk_ref`: i32[T, k_pages] pages.

  `chunk_entries` must be a multiple of the page size (pages are pooled
  whole); it need not divide pages_per_seq * page_size.
  """
  del num_kv_pages_per_block, num_queries_per_block, vmem_limit_bytes
  page_size = cache_kv.shape[1] * cache_kv.shape[2]
  _check_chunks(chunk_entries, chunk_tokens, page_size)
  _check_rule(causal_rule)
  return _streaming_topk(
      q, indexer_weights, cache_kv, seq_lens, page_indices, cu_q_lens,
      jnp.asarray(num_seqs, jnp.int32), k=k_pages,
      compression_ratio=compression_ratio, causal_rule=causal_rule,
      one_token_per_seq=one_token_per_seq, chunk_entries=chunk_entries,
      chunk_tokens=chunk_tokens, pool_pages=True)
