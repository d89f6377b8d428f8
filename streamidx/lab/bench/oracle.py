"""A plain NumPy top-k, the baseline the benchmark times next to JAX.

What a reader would write first: decode the cache to float32 keys, then for
each query row score its visible entries with one matrix product and pick
the top k by sorting. No JAX arithmetic, no chunking, float32 throughout. It
is only for shapes small enough to loop over in Python (`streamidx.bench`
skips it above a work limit).

The cache is decoded by `streamidx.cache.unpack_cache` (on the host CPU:
e4m3 values times their power-of-two scale, exact in float32), the causal
bound is `streamidx.semantics.causal_visible_bound`; the scoring and the
top-k are NumPy's own. It is not the tests' oracle (`tests/oracle.py`
decodes FP8 from its bit fields and scores in float64, independently of
this package). Its scores differ from the reference's by float32 rounding
only (the scale is applied to the keys before the dot, and NumPy sums in its
own order), so the benchmark compares its indices tie-aware with a tolerance
it reports.
"""

from __future__ import annotations

import contextlib

import numpy as np

from streamidx.semantics import causal_visible_bound

__all__ = ["dequantize_cache", "oracle_topk", "f32_score_bound"]


def _on_host():
  """Eager JAX on the host CPU (the oracle never touches an accelerator)."""
  import jax  # pylint: disable=g-import-not-at-top
  try:
    return jax.default_device(jax.local_devices(backend="cpu")[0])
  except RuntimeError:  # no CPU backend in this process (JAX_PLATFORMS)
    return contextlib.nullcontext()


def dequantize_cache(cache, head_dim: int) -> np.ndarray:
  """Cache array -> f32[total_pages, page_size, head_dim] keys, in NumPy.

  FP8 (uint8 records): e4m3fn values times 2**(scale byte - 127); bf16:
  the values widened to float32 (`streamidx.cache.unpack_cache`).
  """
  from streamidx import cache as cache_lib  # pylint: disable=g-import-not-at-top
  with _on_host():
    return np.asarray(cache_lib.unpack_cache(np.asarray(cache), head_dim),
                      np.float32)


def _visible(seq_len, q_len, i, ratio, causal_rule):
  bound = causal_visible_bound(seq_len - q_len + i, ratio, causal_rule)
  return max(0, min(seq_len // ratio, bound))


def f32_score_bound(q, indexer_weights, cache_kv) -> float:
  """Bound on |float32 score - exact score|, for any row and entry.

  A score is sum_h w_h * ReLU(sum_d q_hd k_d). The products q_hd k_d are
  exact in float32 (a bf16 or f32 query times an e4m3 or bf16 key value,
  then a power-of-two scale; exact for bf16 queries, within one rounding
  for f32 ones); summing head_dim of them, weighting, and summing num_heads
  terms in float32, in any order, loses at most (head_dim + num_heads + 2)
  units of roundoff 2**-24 relative to the sum of magnitudes
  sum_h |w_h| sum_d |q_hd| |k_d| <= max_t sum_h |w_th| sum_d |q_thd| * max|k|.
  Two float32 implementations (the reference and this oracle) therefore
  differ by at most twice this.
  """
  q = np.abs(np.asarray(q, np.float64))
  w = np.abs(np.asarray(indexer_weights, np.float64))
  num_heads, head_dim = q.shape[1], q.shape[2]
  kmax = float(np.abs(dequantize_cache(cache_kv, head_dim)).max(initial=0.0))
  mag = float((w * q.sum(axis=2)).sum(axis=1).max(initial=0.0))
  return (head_dim + num_heads + 2) * 2.0**-24 * mag * kmax * 1.01


def oracle_topk(q, indexer_weights, cache_kv, seq_lens, page_indices,
                cu_q_lens, distribution, *, k: int, compression_ratio: int,
                causal_rule: str = "model", return_scores: bool = False,
                rows=None):
  """Top-k entry ids i32[T, k] (-1 padding), like `streamindex_topk_ref`.

  Takes the kernel's positional arguments (any array type). With
  `return_scores`, also the f32[T, pages_per_seq * page_size] masked scores
  (-inf where not visible). `rows`: score only these query rows (the others
  stay -1 / -inf), for spot checks of large batches.
  """
  q = np.asarray(q, np.float32)
  w = np.asarray(indexer_weights, np.float32)
  seq_lens = np.asarray(seq_lens)
  cu = np.asarray(cu_q_lens)
  num_seqs = int(np.asarray(distribution)[2])
  num_tokens, _, head_dim = q.shape
  keys = dequantize_cache(cache_kv, head_dim)
  total_pages, page_size, _ = keys.shape
  table = np.clip(np.asarray(page_indices).reshape(seq_lens.shape[0], -1), 0,
                  total_pages - 1)
  num_entries = table.shape[1] * page_size
  out = np.full((num_tokens, k), -1, np.int32)
  scores = (np.full((num_tokens, num_entries), -np.inf, np.float32)
            if return_scores else None)
  wanted = None if rows is None else set(int(r) for r in rows)
  for b in range(num_seqs):
    lo, hi = int(cu[b]), int(cu[b + 1])
    if hi == lo or (wanted is not None and not wanted & set(range(lo, hi))):
      continue
    kv = keys[table[b]].reshape(num_entries, head_dim)
    for i in range(hi - lo):
      t = lo + i
      if wanted is not None and t not in wanted:
        continue
      n = _visible(int(seq_lens[b]), hi - lo, i, compression_ratio,
                   causal_rule)
      if n == 0:
        continue
      s = w[t] @ np.maximum(q[t] @ kv[:n].T, 0.0)  # f32[n]
      top = np.argsort(-s, kind="stable")[:k]  # lower id first on ties
      out[t, :len(top)] = top
      if return_scores:
        scores[t, :n] = s
  return (out, scores) if return_scores else out
