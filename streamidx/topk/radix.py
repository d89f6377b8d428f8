""""radix": radix select on the order-preserving int32 image of the scores
(no sort of the row), then the take at the k-th key: i32[T, k]."""

from __future__ import annotations

import jax.numpy as jnp
from jax import lax

from streamidx.topk import base

RADIX_BITS = (1, 2, 4, 8)


def kth_largest_key(keys, k, radix_bits):
  """Per row, the k-th largest key (i32[T]), by digit histograms of the
  unsigned image (key ^ 2**31), most significant digit first."""
  t, _ = keys.shape
  ukey = lax.bitcast_convert_type(keys ^ jnp.int32(-2**31), jnp.uint32)
  bins = 1 << radix_bits
  thresholds = jnp.arange(1, bins, dtype=jnp.uint32)
  prefix = jnp.zeros((t,), jnp.uint32)
  need = jnp.full((t,), k, jnp.int32)  # rank sought among matching entries
  for shift in range(32 - radix_bits, -1, -radix_bits):
    if shift + radix_bits < 32:
      match = (ukey >> (shift + radix_bits)) == prefix[:, None]
    else:
      match = jnp.ones(ukey.shape, bool)
    digit = (ukey >> shift) & jnp.uint32(bins - 1)
    # ge[t, j] = #{matching entries with digit >= j + 1}
    ge = jnp.sum((digit[:, :, None] >= thresholds) & match[:, :, None],
                 axis=1, dtype=jnp.int32)
    chosen = jnp.sum(ge >= need[:, None], axis=1, dtype=jnp.int32)  # digit
    above = jnp.where(chosen < bins - 1,
                      jnp.take_along_axis(
                          jnp.pad(ge, ((0, 0), (0, 1))),
                          chosen[:, None], axis=1)[:, 0], 0)
    need = need - above
    prefix = (prefix << radix_bits) | chosen.astype(jnp.uint32)
  return lax.bitcast_convert_type(prefix, jnp.int32) ^ jnp.int32(-2**31)


def take_at_threshold(keys, kth, k):
  """The k entries above `kth` (i32[T]) plus the lowest-index ones equal to
  it, ordered by key descending, index ascending: i32[T, k]."""
  t, n = keys.shape
  greater = keys > kth[:, None]
  equal = keys == kth[:, None]
  room = k - jnp.sum(greater, axis=1, dtype=jnp.int32)
  tie_rank = jnp.cumsum(equal, axis=1, dtype=jnp.int32) - 1
  take = greater | (equal & (tie_rank < room[:, None]))
  slot = jnp.where(take, jnp.cumsum(take, axis=1, dtype=jnp.int32) - 1, k)
  rows = jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32)[:, None], (t, n))
  cols = jnp.broadcast_to(jnp.arange(n, dtype=jnp.int32)[None, :], (t, n))
  idx = jnp.zeros((t, k), jnp.int32).at[rows, slot].set(
      cols, mode="drop")  # slot k: not taken, dropped
  return base.order(jnp.take_along_axis(keys, idx, axis=1), idx)


# Entries (rows x N) one step of the row loop selects from. The histogram
# passes and the take hold about 32 bytes of temporaries an entry: every row
# of a prefill chunk at once (2,048 x 262,144) needs 16.5 GB of HBM, more
# than a v5e has (15.75 GiB); 2**24 entries a step keep them near 0.5 GiB.
STEP_ENTRIES = 2**24


def select(scores, k, extra=None, *, radix_bits=4):
  del extra
  keys = base.order_key(base.canonical_zero(scores))
  t, n = keys.shape
  rows = max(1, STEP_ENTRIES // n)

  def step(block):
    return take_at_threshold(block, kth_largest_key(block, k, radix_bits), k)

  if rows >= t:
    return step(keys)
  steps = -(-t // rows)
  keys = jnp.pad(keys, ((0, steps * rows - t), (0, 0)),
                 constant_values=base.NEG_INF_KEY)
  out = lax.map(step, keys.reshape(steps, rows, n))
  return out.reshape(steps * rows, k)[:t]


def cost(rows, entries, k, *, radix_bits=4):
  t, n = rows, entries
  buf = t * n * base.F32
  r = int(radix_bits)
  p = 32 // r
  # p histogram passes; the take: count above/equal (1 read), tie ranks
  # and slots (cumsums: 1 read, 1 write of i32), the scatter (1 read).
  return base.TopkCost(
      "radix", (p + 3) * buf, buf + base.winners_bytes(t, k), p + 3,
      t * base.sort_work(k), t * n * (p * ((1 << r) - 1) + 4),
      f"{p} histogram passes of {1 << r} bins, then the take "
      f"(count, cumulative ranks, scatter) and a sort of the {k} winners")


METHOD = base.Method(
    name="radix", exact=True, select=select, cost=cost,
    doc="radix select on the order-preserving int32 image, then the take",
    options=(base.Option("radix_bits", "bits a digit (32 / radix_bits passes)",
                         4, base.one_of(RADIX_BITS)),))
