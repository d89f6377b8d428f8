"""The "blocktop" top-k method: a Pallas TensorCore pass keeping each small
block's best entries, then one sort of those candidates (no sort of the row).

Pass (one read of the f32[T, N] score buffer, no scatter): a grid step holds
a tile of 8 rows x `tile` entries (tile / 128 vregs of [8, 128]); the
entries of one row at the same lane of the tile's vregs, tile / 128 of them
in index order, form a block. Per block the pass keeps its `keep` best
entries by (score descending, index ascending), -0.0 and subnormals as 0, in
registers: each vreg is inserted into `keep` sorted [8, 128] levels by
compare-and-select (a new entry has the highest index so far, so it goes
above the first level it beats and the levels below shift down). It writes
the candidates, f32 and i32 [T, N / tile * keep * 128].

Selection (XLA, on T x N * keep / (tile / 128) candidates): one two-key sort
(key descending, index ascending) gives the k best candidates. Exactness: an
entry a block dropped ranks after that block's `keep`-th candidate; when no
block's `keep`-th candidate ranks before the k-th winner, no dropped entry
is in the top k, and the result is the rule's. Otherwise (a block holding
more than `keep` of the top k: rare on scores without structure,
`keep_for`) the batch is selected again by the "sort" method, so the
result is exact always; only the cost depends on it.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from streamidx import modes
from streamidx.topk import base
from streamidx.topk import sort as sort_method

SUBLANES, LANES = 8, 128
MAX_TILE = 8192  # entries of a row per grid step (8 x 8192 f32: 256 KiB)
_TINY = float(jnp.finfo(jnp.float32).tiny)
_NO_INDEX = 2**31 - 1  # the index of an empty level (ranks after every entry)
UNROLL = 8  # vregs per loop iteration: the compare-select chains of 8 interleave


def tile_for(n: int) -> int:
  """Entries per row per grid step: `MAX_TILE`, or n rounded up to whole
  128-lane vregs when shorter."""
  return min(MAX_TILE, -(-n // LANES) * LANES)


def _overflow_probability(block: int, p: float, keep: int) -> float:
  """P(Binomial(block, p) > keep)."""
  below = sum(math.comb(block, j) * p**j * (1 - p)**(block - j)
              for j in range(keep + 1))
  return max(0.0, 1.0 - below)


def keep_for(n: int, k: int, tile: int | None = None) -> int:
  """Candidates kept per block: the fewest (at least 2, at most the block's
  entries) for which, were the top k spread over the row at random, a row
  would hold a block with more than that many of them with probability
  below 1e-4 (then the check sends the batch to "sort"), and the
  candidates number at least k."""
  tile = tile or tile_for(n)
  block = tile // LANES
  blocks = -(-n // tile) * LANES
  p = min(1.0, k / max(1, n))
  for keep in range(2, block):
    if (blocks * keep >= k
        and blocks * _overflow_probability(block, p, keep) < 1e-4):
      return keep
  return block


def _whole_vregs(value) -> str | None:
  if value is None or (isinstance(value, int) and not isinstance(value, bool)
                       and value >= LANES and value % LANES == 0):
    return None
  return f"must be a positive multiple of {LANES}"


def _kernel(*refs, keep, tile, indexed):
  """One tile: x_ref f32[8, tile] (and, `indexed`, xi_ref i32[8, tile]: the
  entries' indices; else entry c of the tile has index tile * b + c) ->
  v_ref f32[8, keep * 128] and i_ref i32[8, keep * 128], level j at lanes
  [j * 128, (j + 1) * 128)."""
  if indexed:
    x_ref, xi_ref, v_ref, i_ref = refs
  else:
    (x_ref, v_ref, i_ref), xi_ref = refs, None
  b = pl.program_id(1)
  first = b * tile + lax.broadcasted_iota(jnp.int32, (SUBLANES, LANES), 1)

  def body(c, carry):
    vals, idx = carry
    start = pl.multiple_of(c * LANES, LANES)
    v = x_ref[:, pl.ds(start, LANES)]
    if indexed:  # candidates of a round before: canonical, in any order
      vi = xi_ref[:, pl.ds(start, LANES)]
      beats = [(v > lv) | ((v == lv) & (vi < li)) for lv, li in zip(vals, idx)]
    else:  # scores in index order: a new entry loses every tie
      v = jnp.where(jnp.abs(v) < _TINY, jnp.zeros_like(v), v)  # -0.0, subnormals
      vi = first + c * LANES
      beats = [v > lv for lv in vals]
    # beats is monotone over the levels (False..False True..True): the new
    # entry goes to the first level it beats, the levels below shift down.
    new_v, new_i = [], []
    for lvl in range(keep):
      if lvl == 0:
        new_v.append(jnp.where(beats[0], v, vals[0]))
        new_i.append(jnp.where(beats[0], vi, idx[0]))
      else:
        new_v.append(jnp.where(beats[lvl - 1], vals[lvl - 1],
                               jnp.where(beats[lvl], v, vals[lvl])))
        new_i.append(jnp.where(beats[lvl - 1], idx[lvl - 1],
                               jnp.where(beats[lvl], vi, idx[lvl])))
    return tuple(new_v), tuple(new_i)

  init = (tuple(jnp.full((SUBLANES, LANES), -jnp.inf, jnp.float32)
                for _ in range(keep)),
          tuple(jnp.full((SUBLANES, LANES), _NO_INDEX, jnp.int32)
                for _ in range(keep)))
  vals, idx = lax.fori_loop(0, tile // LANES, body, init,
                            unroll=min(UNROLL, tile // LANES))
  for lvl in range(keep):
    v_ref[:, lvl * LANES:(lvl + 1) * LANES] = vals[lvl]
    i_ref[:, lvl * LANES:(lvl + 1) * LANES] = idx[lvl]


def block_candidates(scores, indices=None, *, keep: int, tile: int):
  """One round: (values f32[T, B * keep * 128], indices i32[...]) of scores
  f32[T, N] (with `indices` i32[T, N]: candidates of a round before, their
  entries' indices), B = cdiv(N, tile) tiles; at column (b * keep + j) *
  128 + l the j-th best entry of block (tile b, lane l) by (score desc,
  index asc), -inf and index 2**31 - 1 where it has fewer visible ones."""
  t, n = scores.shape
  rows = -(-t // SUBLANES) * SUBLANES
  tiles = -(-n // tile)
  pad = ((0, rows - t), (0, tiles * tile - n))
  args = [jnp.pad(scores.astype(jnp.float32), pad,
                  constant_values=base.NEG_INF)]
  if indices is not None:
    args.append(jnp.pad(indices, pad, constant_values=_NO_INDEX))
  width = keep * LANES
  in_spec = pl.BlockSpec((SUBLANES, tile), lambda r, b: (r, b))
  out_spec = pl.BlockSpec((SUBLANES, width), lambda r, b: (r, b))
  vals, idx = pl.pallas_call(
      functools.partial(_kernel, keep=keep, tile=tile,
                        indexed=indices is not None),
      grid=(rows // SUBLANES, tiles),
      in_specs=[in_spec] * len(args),
      out_specs=[out_spec, out_spec],
      out_shape=[jax.ShapeDtypeStruct((rows, tiles * width), jnp.float32),
                 jax.ShapeDtypeStruct((rows, tiles * width), jnp.int32)],
      compiler_params=pltpu.CompilerParams(
          dimension_semantics=("parallel", "parallel")),
      interpret=modes.resolve_interpret(),
      name=(f"StreamIdxSelectBlocktop{'Round' if indices is not None else ''}"
            f"-keep_{keep}-tile_{tile}"),
  )(*args)
  return vals[:t], idx[:t]


def plan(n: int, k: int, keep: int | None = None, tile: int | None = None,
         rounds: int | None = None) -> tuple[tuple[int, int], ...]:
  """The rounds: ((keep, tile), ...), the first over the n scores (`keep`,
  `tile` when given), each next over the candidates of the one before, while
  it at least halves them (at most `rounds`, default 2); every round keeps
  at least k candidates."""
  out, size = [], n
  while len(out) < (rounds or 2):
    t = (tile if not out and tile else tile_for(size))
    kp = min((keep if not out and keep else keep_for(size, k, t)), t // LANES)
    cand = -(-size // t) * kp * LANES
    if cand < k:
      raise ValueError(f"keep: {kp} candidates in each of the "
                       f"{-(-size // t) * LANES} blocks are fewer than k ({k})")
    if out and (rounds is None and 2 * cand > size):
      break
    out.append((kp, t))
    size = cand
    if kp == t // LANES:  # every entry is a candidate: nothing to prune
      break
  return tuple(out)


def select(scores, k, extra=None, *, keep=None, tile=None, rounds=None):
  """The k best of scores f32[T, N >= k]: i32[T, k] (module docstring)."""
  del extra
  vals, idx, lasts = scores, None, []
  for kp, t in plan(scores.shape[1], k, keep, tile, rounds):
    vals, idx = block_candidates(vals, idx, keep=kp, tile=t)
    if kp < t // LANES:  # this round's keep-th candidate of every block
      lasts.append((vals.reshape(vals.shape[0], -1, kp, LANES)[:, :, kp - 1],
                    idx.reshape(vals.shape[0], -1, kp, LANES)[:, :, kp - 1]))
  keys = base.order_key(vals)  # canonical already
  neg, cidx = lax.sort((~keys, idx), dimension=1, num_keys=2)
  win_key, win_idx = ~neg[:, :k], cidx[:, :k]
  out = jnp.where(win_key == base.NEG_INF_KEY, -1, win_idx).astype(jnp.int32)
  if not lasts:
    return out
  # A block whose keep-th candidate ranks before the k-th winner may have
  # dropped a winner: then the whole batch is selected by "sort".
  kth = win_key[:, k - 1, None, None]
  kth_i = win_idx[:, k - 1, None, None]
  before = [(base.order_key(lv) > kth)
            | ((base.order_key(lv) == kth) & (li < kth_i))
            for lv, li in lasts]
  overflow = functools.reduce(jnp.logical_or, [jnp.any(b) for b in before])
  return lax.cond(overflow, lambda: sort_method.select(scores, k),
                  lambda: out)


def cost(rows, entries, k, *, keep=None, tile=None, rounds=None):
  t, n = rows, entries
  rounds_ = plan(n, k, keep, tile, rounds)
  pair = base.F32 + base.I32
  read, written, size, scan = t * n * base.F32, 0, n, 0
  for kp, tl in rounds_:
    cand = -(-size // tl) * kp * LANES
    scan += t * size * (2 * kp + 3)
    written += t * cand * pair
    size = cand
  read += written  # each round's candidates are read by the next or the sort
  return base.TopkCost(
      "blocktop", read, written + base.winners_bytes(t, k), 1,
      t * base.sort_work(size), scan,
      "; ".join(f"keep {kp} of each block of {tl // LANES}"
                for kp, tl in rounds_) + f": {size} candidates a row, one "
      "sort of them")


METHOD = base.Method(
    name="blocktop", exact=True, select=select, cost=cost,
    doc="a Pallas pass keeping each block's best entries, then one sort of "
    "the candidates (the full sort where a block overflows)",
    options=(base.Option("keep", None, base.positive_int,
                         "candidates kept per block in the first round "
                         "(default `keep_for`)"),
             base.Option("tile", None, _whole_vregs,
                         "entries of a row per grid step of the first round, "
                         "a multiple of 128 (default `tile_for(N)`)"),
             base.Option("rounds", None, base.positive_int,
                         "at most this many rounds (default: 2 where the "
                         "second at least halves the candidates)")))
