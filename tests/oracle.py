"""A tiny NumPy loop oracle, independent of streamidx's kernel and reference.

It decodes the cache bytes itself (e4m3fn and e8m0 from their bit fields,
not through ml_dtypes or `streamidx.cache`), scores in float64 with plain
loops over tokens and entries, and selects top-k by sorting. Only for small
batches.
"""

from __future__ import annotations

import numpy as np


def decode_e4m3fn(byte: int) -> float:
  """e4m3fn: 1 sign, 4 exponent (bias 7), 3 mantissa bits; 0x7f/0xff NaN."""
  sign = -1.0 if byte & 0x80 else 1.0
  exp = (byte >> 3) & 0xF
  man = byte & 0x7
  if exp == 0xF and man == 0x7:
    return float("nan")
  if exp == 0:
    return sign * (man / 8.0) * 2.0**-6
  return sign * (1.0 + man / 8.0) * 2.0**(exp - 7)


_E4M3 = np.array([decode_e4m3fn(b) for b in range(256)])


def decode_keys(cache: np.ndarray, head_dim: int) -> np.ndarray:
  """Cache array -> float64 keys [pages, page_size, head_dim]."""
  cache = np.asarray(cache)
  pages, rows, packing, width = cache.shape
  flat = cache.reshape(pages, rows * packing, width)
  if cache.dtype == np.uint8:
    vals = _E4M3[flat[..., :head_dim]]
    scale = 2.0**(flat[..., head_dim].astype(np.float64) - 127.0)
    return vals * scale[..., None]
  return flat[..., :head_dim].astype(np.float64)


def visible_bound(pos: int, ratio: int, rule: str) -> int:
  if rule == "model":
    return (pos + 1) // ratio
  return pos // ratio + 1


def scores(q, w, cache, seq_lens, page_indices, cu_q_lens, num_seqs, *,
           ratio: int, rule: str = "model"):
  """float64 [T, pages_per_seq * page_size], -inf where not visible."""
  q = np.asarray(q, np.float64)
  w = np.asarray(w, np.float64)
  seq_lens = np.asarray(seq_lens)
  cu = np.asarray(cu_q_lens)
  t_rows, heads, head_dim = q.shape
  keys = decode_keys(cache, head_dim)
  page_size = keys.shape[1]
  max_seqs = seq_lens.shape[0]
  table = np.asarray(page_indices).reshape(max_seqs, -1)
  entries = table.shape[1] * page_size
  out = np.full((t_rows, entries), -np.inf)
  for b in range(int(num_seqs)):
    q_len = cu[b + 1] - cu[b]
    kv_len = seq_lens[b] // ratio
    for i in range(q_len):
      t = cu[b] + i
      pos = seq_lens[b] - q_len + i
      for s in range(min(kv_len, visible_bound(pos, ratio, rule))):
        k = keys[table[b, s // page_size], s % page_size]
        total = 0.0
        for h in range(heads):
          total += w[t, h] * max(0.0, float(q[t, h] @ k))
        out[t, s] = total
  return out


def pool_pages(s: np.ndarray, page_size: int) -> np.ndarray:
  t, e = s.shape
  return s.reshape(t, e // page_size, page_size).max(axis=-1)


def topk(s: np.ndarray, k: int) -> np.ndarray:
  """Indices of the k largest scores per row (lower index first on ties)."""
  out = np.full((s.shape[0], k), -1, np.int64)
  for r in range(s.shape[0]):
    order = sorted(range(s.shape[1]), key=lambda j: (-s[r, j], j))
    chosen = [j for j in order[:k] if s[r, j] > -np.inf]
    out[r, :len(chosen)] = chosen
  return out


def f32_error_bound(q, w, cache, head_dim: int) -> float:
  """A bound on |f32 score - exact score| for any entry of this batch.

  For queries with bf16 values (the tests' case: bf16, or bf16 cast to f32)
  the products with e4m3 or bf16 key values are exact in f32; summing D of
  them, then H weighted terms, in f32 loses at most (D + H + 2) units of
  roundoff relative to the sum of magnitudes. Not valid for queries with
  full f32 mantissas.
  """
  q = np.abs(np.asarray(q, np.float64))
  keys = np.abs(decode_keys(cache, head_dim))
  kmax = keys.max(initial=0.0)
  mag = (np.abs(np.asarray(w, np.float64))[..., None] * q).sum(axis=(1, 2))
  heads = q.shape[1]
  return float((head_dim + heads + 2) * 2.0**-24 * mag.max(initial=0.0) *
               kmax) * 1.01


def topk_rule(scores, k: int) -> np.ndarray:
  """The project's top-k rule, vectorized: i64[T, k] indices of f32 `scores`
  [T, N] by score descending, then index ascending, where -0.0 and
  subnormals count as 0 (XLA flushes subnormals); -1 after the visible
  (> -inf) entries, and past N when N < k."""
  x = np.asarray(scores, np.float32).astype(np.float64)
  x = np.where(np.abs(x) < np.finfo(np.float32).tiny, 0.0, x)
  t, n = x.shape
  index = np.broadcast_to(np.arange(n), (t, n))
  order = np.lexsort((index, -x), axis=-1)[:, :k]  # last key first
  chosen = np.where(np.take_along_axis(x, order, axis=1) > -np.inf, order, -1)
  out = np.full((t, k), -1, np.int64)
  out[:, :chosen.shape[1]] = chosen
  return out
