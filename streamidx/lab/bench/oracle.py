"""The benchmark's oracle: a plain loop over query rows, in float64, sharing
none of the reference's engine (why: docs/benchmarks.md, "The oracle").
"""

from __future__ import annotations

import jax
import numpy as np

from streamidx import cache as cache_lib
from streamidx import metrics, modes, ref
from streamidx.semantics import causal_visible_bound


def dequantize_cache(cache, head_dim: int) -> np.ndarray:
  """Cache array -> f32[total_pages, page_size, head_dim] keys, in NumPy."""
  with modes.on_host():
    return np.asarray(cache_lib.unpack_cache(np.asarray(cache), head_dim),
                      np.float32)


def f32_score_bound(q, indexer_weights, cache_kv) -> float:
  """Bound on |float32 score - exact score|, for any row and entry: the
  roundings of `metrics.summation_error_bound` (its derivation), from the
  arrays, its B bounded by max_t sum_h |w_th| sum_d |q_thd| * max|k|."""
  q = np.asarray(q)
  w = np.abs(np.asarray(indexer_weights, np.float64))
  num_heads, head_dim = q.shape[1], q.shape[2]
  kmax = float(np.abs(dequantize_cache(cache_kv, head_dim)).max(initial=0.0))
  mag = float((w * np.abs(q.astype(np.float64)).sum(axis=2)).sum(axis=1).max(initial=0.0))
  n = head_dim + num_heads - 1 + (head_dim if q.dtype == np.float32 else 0)
  return metrics._gamma(n) * mag * kmax  # pylint: disable=protected-access


def oracle_topk(q, indexer_weights, cache_kv, seq_lens, page_indices,
                cu_q_lens, distribution, *, k: int, compression_ratio: int,
                causal_rule: str = "model", return_scores: bool = False,
                rows=None):
  """Top-k entry ids i32[T, k] (-1 padding) of the kernel's positional
  arguments (any array type), like `streamindex_topk_ref`; `return_scores`:
  also the f64[T, pages_per_seq * page_size] masked scores (-inf hidden);
  `rows`: score only these query rows (the others stay -1 / -inf)."""
  q = np.asarray(np.asarray(q, np.float32), np.float64)
  w = np.asarray(indexer_weights, np.float64)
  seq_lens, cu = np.asarray(seq_lens), np.asarray(cu_q_lens)
  num_tokens, _, head_dim = q.shape
  keys = dequantize_cache(cache_kv, head_dim).astype(np.float64)
  table = np.clip(np.asarray(page_indices).reshape(seq_lens.shape[0], -1), 0,
                  keys.shape[0] - 1)
  num_entries = table.shape[1] * keys.shape[1]
  out = np.full((num_tokens, k), -1, np.int32)
  scores = np.full((num_tokens, num_entries), -np.inf)
  wanted = range(num_tokens) if rows is None else rows
  with modes.on_host(), jax.enable_x64(True):
    for b in range(int(np.asarray(distribution)[2])):
      lo, hi = int(cu[b]), int(cu[b + 1])
      kv = keys[table[b]].reshape(num_entries, head_dim)
      for t in (t for t in wanted if lo <= t < hi):
        pos = int(seq_lens[b]) - (hi - lo) + (t - lo)
        n = max(0, min(int(seq_lens[b]) // compression_ratio,
                       causal_visible_bound(pos, compression_ratio,
                                            causal_rule)))
        s = np.asarray(ref.score_entries(q[t], w[t], kv[:n], None))
        top = np.argsort(-s, kind="stable")[:k]  # lower id first on ties
        out[t, :len(top)] = top
        scores[t, :n] = s
  return (out, scores) if return_scores else out


def topk_rule(scores, k: int, rows_per_step: int = 64) -> np.ndarray:
  """The top-k rule (`streamidx.topk.base`) in NumPy, no JAX: i32[T, k],
  each row's entries by score descending, then index ascending, -0.0 and
  subnormals as 0, -1 after the visible (> -inf) entries and past N.

  scores: f32[T, N]. Per row: the k-th largest score (a partition), every
  entry above it and the lowest-index ones equal to it (a running count),
  those k in index order, then a stable sort by score descending. O(N) a
  row, `rows_per_step` rows at a time.
  """
  x = np.asarray(scores, np.float32)
  if np.isnan(x).any():
    raise ValueError("scores: the rule orders no NaN (the value rules "
                     "reject the inputs that make one)")
  t, n = x.shape
  m = min(k, n)
  out = np.full((t, k), -1, np.int32)
  if m == 0:
    return out
  for lo in range(0, t, rows_per_step):
    s = x[lo:lo + rows_per_step]
    s = np.where(np.abs(s) < np.finfo(np.float32).tiny, np.float32(0), s)
    kth = -np.partition(-s, m - 1, axis=1)[:, m - 1:m]
    above = s > kth
    tied = s == kth
    room = m - above.sum(axis=1, keepdims=True)
    take = above | tied
    crowded = np.nonzero(tied.sum(axis=1) > room[:, 0])[0]  # more ties than room
    if crowded.size:  # keep the lowest-index ones: a running count
      t = tied[crowded]
      take[crowded] = above[crowded] | (t & (np.cumsum(t, axis=1) <= room[crowded]))
    idx = np.nonzero(take)[1].reshape(len(s), m)  # m a row, index order
    vals = np.take_along_axis(s, idx, axis=1)
    top = np.take_along_axis(idx, np.argsort(-vals, axis=1, kind="stable"),
                             axis=1)
    visible = np.take_along_axis(s, top, axis=1) > -np.inf
    out[lo:lo + len(s), :m] = np.where(visible, top, -1)
  return out
