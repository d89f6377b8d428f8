"""The top-k stage's contract: the tie rule, the method record, its options.

Output contract, the same for every exact method (and the reference): i32[T,
k]; row t holds the min(k, #{s: scores[t, s] > -inf}) entries with the
largest scores, ties at the k-th score going to the lowest indices, ordered
by score descending then index ascending; the rest of the row is -1.
`canonical_zero` maps -0.0 and subnormals to +0.0 first. Rows holding a NaN
score get unspecified indices.

No backend's top-k op is trusted with ties (`lax.top_k`'s order among equal
scores is not index-ascending on a TPU): `rule_top_k`, the rule's one exact
primitive, takes only the values such an op finds and makes the membership
and the order the rule's; tests/test_topk_exact.py checks every method with
a `lax.top_k` that breaks ties the other way. A method is a `Method` record
(its module under `streamidx.topk`, one entry in `registry`).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable, Mapping

import jax
import jax.numpy as jnp
from jax import lax

from streamidx.semantics import LANES, cdiv

NEG_INF = float("-inf")
F32 = I32 = 4


def canonical_zero(scores):
  """Every score that compares equal to 0 (-0.0, and subnormals, which XLA
  flushes on CPU and TPU) becomes +0.0, so ranking by bits agrees with
  ranking by float comparison."""
  return jnp.where(scores == 0, jnp.zeros_like(scores), scores)


def order_key(scores):
  """i32 image of f32 scores with the same order (a < b iff key(a) <
  key(b)): negative floats flip their 31 low bits. -0.0 and +0.0 map to -1
  and 0 (canonicalize zeros first for float equality)."""
  bits = lax.bitcast_convert_type(scores.astype(jnp.float32), jnp.int32)
  return jnp.where(bits < 0, bits ^ jnp.int32(0x7FFFFFFF), bits)


NEG_INF_KEY = -(2**31) + 2**23 - 1  # order_key(-inf)


def pad_to(scores, n):
  """scores f32[T, N] with -inf columns up to n (unchanged when N >= n)."""
  if scores.shape[1] >= n:
    return scores
  return jnp.pad(scores, ((0, 0), (0, n - scores.shape[1])),
                 constant_values=NEG_INF)


def score_of_key(keys):
  """The f32 scores of `order_key` images (its inverse)."""
  bits = jnp.where(keys < 0, keys ^ jnp.int32(0x7FFFFFFF), keys)
  return lax.bitcast_convert_type(bits, jnp.float32)


def finish(vals, idx):
  """-1 where the score is -inf (invisible or padding)."""
  return jnp.where(vals == NEG_INF, -1, idx).astype(jnp.int32)


def ranked(keys, ids, k: int):
  """Each row's first k (key, id) pairs by key descending, id ascending:
  (i32[T, k], i32[T, k]), a two-key sort of keys, ids i32[T, N >= k]."""
  # ~key reverses the order of int32 without overflow.
  neg, ids = lax.sort((~keys, ids.astype(jnp.int32)), dimension=1, num_keys=2)
  return ~neg[:, :k], ids[:, :k]


def order(keys, idx):
  """The k winners of each row by key descending, index ascending, with -1
  where the key is -inf's: i32[T, k]."""
  keys, idx = ranked(keys, idx, keys.shape[1])
  return jnp.where(keys == NEG_INF_KEY, -1, idx).astype(jnp.int32)


def rule_top_k(scores, k: int, ids=None, found=None):
  """The rule's k winners of each row: (their scores f32[T, k], canonical;
  their ids i32[T, k]), by score descending, id ascending (a -inf score's
  id is any; `finish` makes it -1). scores: f32[T, N >= k]; ids: i32[T, N]
  (None: the column); found: (values, positions) [T, k] holding each row's
  k largest scores (None: `lax.top_k`). Only found's values are trusted:
  a row whose ties at the k-th score straddle the k-th place is ranked
  again by a two-key sort of its whole row (`again`: those rows alone).
  """
  x = canonical_zero(scores)
  t, n = x.shape
  vals, pos = lax.top_k(x, k) if found is None else found
  keys = order_key(x)
  win = order_key(canonical_zero(vals))
  kth = jnp.min(win, axis=1)
  taken = jnp.sum(win == kth[:, None], axis=1, dtype=jnp.int32)
  tied = jnp.sum(keys == kth[:, None], axis=1, dtype=jnp.int32)
  straddle = (taken != tied) & (kth != NEG_INF_KEY)
  if ids is None:
    win_ids = pos
    ids = lax.broadcasted_iota(jnp.int32, (t, n), 1)
  else:
    win_ids = jnp.take_along_axis(ids, pos, axis=1)
  keys, ids = again(ranked(win, win_ids, k), straddle,
                    lambda rows: ranked(keys[rows], ids[rows], k))
  return score_of_key(keys), ids


# Rows `again` redoes at once: one program of [AGAIN_ROWS, N], looped over
# the flagged rows, whatever T is.
AGAIN_ROWS = 8


def again(result, flagged, redo, rows: int = AGAIN_ROWS):
  """`result` (arrays [T, ...], a tuple or one) with each row flagged in
  bool[T] replaced by `redo`'s: redo(i32[r] row ids) -> the same arrays'
  [r, ...] rows, `rows` rows a loop trip over the flagged ones, skipped by a
  `lax.cond` when none is (a batch with one flagged row redoes `rows` rows,
  not T)."""
  t = flagged.shape[0]
  r = min(rows, t)
  if r == 0:
    return result

  def redo_flagged():  # inside the cond: no row flagged, no argsort run
    order = jnp.argsort(~flagged, stable=True)  # the flagged rows first
    order = jnp.concatenate([order, order[:-t % r]])  # whole trips of r rows

    def trip(i, out):
      ids = lax.dynamic_slice_in_dim(order, i * r, r)
      new = redo(ids)
      keep = flagged[ids]
      return jax.tree.map(
          lambda o, v: o.at[ids].set(jnp.where(
              keep.reshape((r,) + (1,) * (v.ndim - 1)), v, o[ids])), out, new)

    return lax.fori_loop(0, cdiv(jnp.sum(flagged), r), trip, result)

  return lax.cond(jnp.any(flagged), redo_flagged, lambda: result)


def sort_top_k(scores, k: int):
  """The rule's k winners of each row by one two-key sort of the whole row
  (no tie check to run: the sort orders every tie): i32[T, k], -1 where the
  score is -inf."""
  t, n = scores.shape
  keys, ids = ranked(order_key(canonical_zero(scores)),
                     lax.broadcasted_iota(jnp.int32, (t, n), 1), k)
  return finish(score_of_key(keys), ids)


def top_k(scores, k: int, ids=None):
  """`rule_top_k`'s ids, -1 where the score is -inf: i32[T, k]."""
  return finish(*rule_top_k(scores, k, ids))


def scores_at(scores, idx):
  """f32[T, k]: each selected entry's score as the selection compared it
  (-0.0 and subnormals as +0.0), -inf where the index is -1; scores
  f32[T, N] or the kernels' f32[T, N / 128, 128] (`Method.lane_rows`)."""
  at = jnp.maximum(idx, 0)
  if scores.ndim == 3:  # entry i: lane row i // 128, lane i % 128
    rows = jnp.arange(idx.shape[0])[:, None]
    got = scores[rows, at // LANES, at % LANES].astype(jnp.float32)
  else:
    got = jnp.take_along_axis(scores.astype(jnp.float32), at, axis=1)
  return jnp.where(idx >= 0, canonical_zero(got), NEG_INF)


def pow2_at_least(x: int) -> int:
  return 1 << max(0, math.ceil(math.log2(max(1, x))))


def sort_work(n: int) -> float:
  """Compare-exchanges of a bitonic sorting network on n (padded to 2^p)."""
  if n <= 1:
    return 0.0
  p = math.ceil(math.log2(n))
  return (1 << p) / 2 * p * (p + 1) / 2


# -- the cost model's record ----------------------------------------------


@dataclasses.dataclass(frozen=True)
class TopkCost:
  """What one method moves and compares for one shape. Bytes are totals
  (docs/topk-methods.md, "The model")."""

  method: str
  bytes_read: int
  bytes_written: int
  passes: float  # full reads of the f32 score buffer
  sort_work: float  # compare-exchanges (bitonic network), all rows
  scan_ops: float  # element comparisons outside sorts, all rows
  detail: str
  bytes = property(lambda c: c.bytes_read + c.bytes_written)


def winners_bytes(rows: int, k: int) -> int:
  """Values + indices of the k winners of every row, and the output."""
  return rows * k * (F32 + 2 * I32)


# -- options ----------------------------------------------------------------


def positive_int(value) -> str | None:
  if value is None or (isinstance(value, int) and not isinstance(value, bool)
                       and value >= 1):
    return None
  return "must be a positive int"


@dataclasses.dataclass(frozen=True)
class Option:
  """One option of one method: its default (None: the method picks one for
  the shape) and `rule(value)`, the rule a value breaks or None (default:
  None or a positive int)."""

  name: str
  doc: str
  default: Any = None
  rule: Callable[[Any], str | None] = positive_int


def one_of(values):
  def rule(value):
    return None if value in values else f"must be one of {tuple(values)}"
  return rule


def open_unit(value) -> str | None:
  ok = isinstance(value, (int, float)) and 0.0 < value < 1.0
  return None if ok else "must be in (0, 1)"


# -- the method record ---------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Method:
  """One top-k method. select: (scores f32[T, N >= k], k, extra, **options)
  -> i32[T, k] (options complete); needs: None, or the name of the extra
  output it reads from the scoring kernel ("block_max": f32[T, >= cdiv(N,
  w)], column j the maximum of scores[:, j * w:(j + 1) * w]); extra_ref:
  (scores, **options) -> that output (what a kernel must equal); cost:
  (rows, entries, k, **options) -> TopkCost."""

  name: str
  exact: bool
  select: Callable
  cost: Callable
  doc: str
  needs: str | None = None
  extra_ref: Callable | None = None
  options: Mapping[str, Option] = dataclasses.field(default_factory=dict)
  # (rows, entries, k) -> whether select, default options, also takes the
  # scoring kernels' buffer f32[T, N / 128, 128] as it is (no relayout).
  lane_rows: Callable | None = None

  def __post_init__(self):
    if (self.needs is None) != (self.extra_ref is None):
      raise ValueError(f"{self.name}: needs and extra_ref go together")
    object.__setattr__(self, "options",
                       {o.name: o for o in self.options.values()}
                       if isinstance(self.options, Mapping)
                       else {o.name: o for o in self.options})

  def reads_as_written(self, rows: int, entries: int, k: int) -> bool:
    """Whether select takes the scoring kernels' buffer f32[rows, W / 128,
    128] as it is, reading the first `entries` <= W of each row (the
    columns past them, M24's cut, unread): a `lane_rows` method whose rule
    holds at `entries`."""
    return self.lane_rows is not None and self.lane_rows(rows, entries, k)

  def resolve(self, options: Mapping[str, Any]) -> dict:
    """`options` checked against this method's and completed with their
    defaults; ValueError naming the option and the rule otherwise."""
    unknown = sorted(set(options) - set(self.options))
    if unknown:
      raise ValueError(
          f"{unknown[0]}: not an option of topk_method {self.name!r} (its "
          f"options: {tuple(self.options) or 'none'})")
    out = {}
    for name, opt in self.options.items():
      value = options.get(name, opt.default)
      why = opt.rule(value)
      if why:
        raise ValueError(f"{name}: {why} (got {value!r})")
      out[name] = value
    return out
