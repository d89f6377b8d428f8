""""sort": the vendored stage, `approx_max_k(recall_target=1.0)` (a full
sort on a TPU), with its ties at the k-th score made canonical: i32[T, k]."""

from __future__ import annotations

import jax.numpy as jnp
from jax import lax

from streamidx.topk import base


def select(scores, k, extra=None):
  del extra
  # The sort reads the scores as they are: its comparator (a > b, float
  # comparison) already ties -0.0, +0.0 and subnormals.
  vals, idx = lax.approx_max_k(scores, k, recall_target=1.0)
  keys = base.order_key(base.canonical_zero(scores))
  win = base.order_key(base.canonical_zero(vals))
  kth = jnp.min(win, axis=1)
  # The sort found the right scores; at the k-th score its comparator
  # (a > b) leaves ties unordered, so it may hold other tied entries than
  # the lowest-index ones. One pass counts the ties: where it took them
  # all, its set is the canonical one (ordered here); otherwise (ties
  # straddle the k-th place in some row) the batch is selected again by
  # `lax.top_k`, whose tie rule is the canonical one.
  ties_taken = jnp.sum(win == kth[:, None], axis=1, dtype=jnp.int32)
  ties_all = jnp.sum(keys == kth[:, None], axis=1, dtype=jnp.int32)
  return lax.cond(jnp.all(ties_taken == ties_all),
                  lambda: base.order(win, idx),
                  lambda: base.top_k(scores, k))


def cost(rows, entries, k):
  t, n = rows, entries
  buf = t * n * base.F32
  return base.TopkCost(
      "sort", 2 * buf, base.winners_bytes(t, k), 2, t * base.sort_work(n),
      t * n, "full sort of each row + one pass counting ties at the k-th "
      "score (a lax.top_k again where they straddle it)")


METHOD = base.Method(
    name="sort", exact=True, select=select, cost=cost,
    doc="the vendored `approx_max_k(recall_target=1.0)` (a full sort), its "
    "ties at the k-th score made canonical")
