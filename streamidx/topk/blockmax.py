""""blockmax": the k best blocks of `block_size` entries by their maxima,
then one top-k of their entries: i32[T, k] (docs/topk-methods.md, "Why
blockmax is exact")."""

from __future__ import annotations

import jax.numpy as jnp

from streamidx.topk import base, top_k


def block_size_for(n: int, k: int) -> int:
  """The block: a power of two in [128, 1024] minimizing a sort of the n / b
  block maxima plus one of the k * b candidates; n (one `top_k`) when none
  leaves more than k blocks."""
  best = None
  for p in range(7, 11):
    b = 1 << p
    blocks = -(-n // b)
    if blocks <= k:
      break
    work = base.sort_work(blocks) + base.sort_work(k * b)
    if best is None or work < best[0]:
      best = (work, b)
  return max(1, n) if best is None else best[1]


def block_maxima(scores, width: int):
  """f32[T, cdiv(N, width)]: the maximum of each `width` entries of a row
  (-inf past the end)."""
  t, n = scores.shape
  rows = -(-n // width)
  return base.pad_to(scores, rows * width).reshape(t, rows, width).max(2)


def select_blocks(scores, block_max, k, b):
  """The second stage of "blockmax" and "fused_blockmax": i32[T, k], the k
  best blocks of scores f32[T, N] by their maxima block_max f32[T, cdiv(N,
  b) > k], then the k best of their entries, both by `base.rule_top_k`."""
  t, _ = scores.shape
  blocks = block_max.shape[1]
  # The k best blocks by the rule (maximum desc, block asc: zeros of both
  # signs tie, as the maximum of the canonical scores is the canonical
  # maximum), in block order: their entries' positions among the
  # candidates are in global index order, so the rule over the positions
  # is the rule over the entries.
  _, best = base.rule_top_k(block_max, k)
  best = jnp.sort(best, axis=1)
  x = base.pad_to(scores, blocks * b).reshape(t, blocks, b)
  cand = jnp.take_along_axis(x, best[:, :, None], axis=1)  # [T, k, b]
  vals, pos = base.rule_top_k(cand.reshape(t, k * b), k)
  idx = jnp.take_along_axis(best, pos // b, axis=1) * b + pos % b
  return base.finish(vals, idx)


def by_blocks(scores, k, block_size, block_max=None, width=None):
  """Blocks of `block_size` (a multiple of `width`, default `block_size`)
  ranked by the maxima of `width`-entry blocks, f32[T, >= cdiv(N, width)]
  (the kernel's; computed from `scores` when None)."""
  width = width or block_size
  t, n = scores.shape
  b = int(block_size)
  blocks = -(-n // b)
  if blocks <= k:
    return base.top_k(scores, k)
  rows = -(-n // width)
  if block_max is None:
    block_max = block_maxima(scores, width)
  m = block_max[:, :rows].astype(jnp.float32)
  g = b // width
  if g > 1:  # blocks of g maxima: the maximum of the maxima
    m = base.pad_to(m, blocks * g).reshape(t, blocks, g).max(axis=2)
  return select_blocks(scores, m, k, b)


def select(scores, k, extra=None, *, block_size=None):
  del extra
  return by_blocks(scores, k, block_size or block_size_for(scores.shape[1], k))


def cost(rows, entries, k, *, block_size=None):
  t, n = rows, entries
  b = block_size or block_size_for(n, k)
  blocks = -(-n // b)
  if blocks <= k:
    return top_k.cost(rows, entries, k)
  w = base.sort_work
  return base.TopkCost(
      "blockmax", bytes_read=t * (n + blocks + k * b) * base.F32,
      bytes_written=(t * blocks * base.F32 + t * k * base.I32
                     + base.winners_bytes(t, k)),
      passes=1 + k * b / n, sort_work=t * (w(blocks) + w(k) + w(k * b)),
      scan_ops=t * n, detail=f"max of {blocks} blocks of {b}, top-{k} "
      f"blocks, top-{k} of their {k * b} entries")


METHOD = base.Method(
    name="blockmax", exact=True, select=select, cost=cost,
    doc="the k best blocks by their maxima, then one top-k of their entries",
    options=(base.Option(
        "block_size", "entries per block (default `block_size_for(N, k)`)"),))
