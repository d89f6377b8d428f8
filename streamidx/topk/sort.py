""""sort": the vendored stage, `approx_max_k(recall_target=1.0)` (a full
sort on a TPU), with its ties at the k-th score made canonical: i32[T, k]."""

from __future__ import annotations

from jax import lax

from streamidx.topk import base


def select(scores, k, extra=None):
  del extra
  # The sort reads the scores as they are: its comparator (a > b, float
  # comparison) already ties -0.0, +0.0 and subnormals. It finds the right
  # scores, but leaves ties unordered, so it may hold other tied entries at
  # the k-th score than the lowest-index ones: `base.rule_top_k` counts the
  # ties and orders its k (and ranks again, by a two-key sort of the whole
  # row, each row where they straddle the k-th place).
  found = lax.approx_max_k(scores, k, recall_target=1.0)
  return base.finish(*base.rule_top_k(scores, k, found=found))


def cost(rows, entries, k):
  t, n = rows, entries
  buf = t * n * base.F32
  return base.TopkCost(
      "sort", 2 * buf, base.winners_bytes(t, k), 2, t * base.sort_work(n),
      t * n, "full sort of each row + one pass counting ties at the k-th "
      "score (a two-key sort of each row where they straddle it)")


METHOD = base.Method(
    name="sort", exact=True, select=select, cost=cost,
    doc="the vendored `approx_max_k(recall_target=1.0)` (a full sort), its "
    "ties at the k-th score made canonical")
