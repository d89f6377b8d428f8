""""chunked": each chunk of `chunk_size` entries keeps its top-k, then one
top-k of the candidates, both by the rule (`base.rule_top_k`): i32[T, k]."""

from __future__ import annotations

import jax.numpy as jnp

from streamidx.topk import base, top_k


def chunk_size_for(n: int, k: int) -> int:
  """The chunk: a power of two >= k minimizing (n / c) sorts of c plus one
  sort of the (n / c) * k candidates (bitonic compare-exchanges)."""
  best = None
  c = base.pow2_at_least(k)
  while True:
    chunks = -(-n // c)
    work = chunks * base.sort_work(c) + base.sort_work(chunks * min(k, c))
    if best is None or work < best[0]:
      best = (work, c)
    if chunks == 1:
      break
    c *= 2
  return best[1]


def select(scores, k, extra=None, *, chunk_size=None):
  del extra
  t, n = scores.shape
  c = int(chunk_size or chunk_size_for(n, k))
  chunks = -(-n // c)
  if chunks == 1:
    return base.top_k(scores, k)
  x = base.pad_to(scores, chunks * c).reshape(t * chunks, c)
  kc = min(k, c)
  # Each chunk's k by the rule: every entry of the row's top k is among its
  # chunk's (the rule is a total order); then the rule over the candidates,
  # by their global ids.
  vals, local = base.rule_top_k(x, kc)  # [T * chunks, kc]
  glob = (local.reshape(t, chunks, kc)
          + (jnp.arange(chunks, dtype=jnp.int32) * c)[None, :, None])
  return base.top_k(vals.reshape(t, chunks * kc), k,
                    ids=glob.reshape(t, chunks * kc))


def cost(rows, entries, k, *, chunk_size=None):
  t, n = rows, entries
  c = chunk_size or chunk_size_for(n, k)
  chunks = -(-n // c)
  cand = chunks * min(k, c)
  if chunks == 1:
    return top_k.cost(rows, entries, k)
  pair = base.F32 + base.I32
  return base.TopkCost(
      "chunked", bytes_read=t * n * base.F32 + t * cand * pair,
      bytes_written=t * cand * pair + base.winners_bytes(t, k), passes=1,
      sort_work=t * (chunks * base.sort_work(c) + base.sort_work(cand)),
      scan_ops=0, detail=f"{chunks} chunks of {c}: top-{min(k, c)} each, "
      f"then top-{k} of {cand} candidates")


METHOD = base.Method(
    name="chunked", exact=True, select=select, cost=cost,
    doc="each chunk's top-k, then one top-k of the candidates",
    options=(base.Option(
        "chunk_size", "entries per chunk (default `chunk_size_for(N, k)`)"),))
