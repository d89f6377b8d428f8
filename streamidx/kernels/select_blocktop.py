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
`keep_for`) the batch is selected again by `lax.top_k`, whose tie rule is
the project's, so the result is exact always; only the cost depends on it.
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

SUBLANES, LANES = 8, 128
MAX_TILE = 8192  # entries of a row per grid step (8 x 8192 f32: 256 KiB)
_TINY = float(jnp.finfo(jnp.float32).tiny)
_NO_INDEX = 2**31 - 1  # the index of an empty level (ranks after every entry)


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
  below 1e-4 (then the check sends the batch to `lax.top_k`), and the
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


def _kernel(x_ref, v_ref, i_ref, *, keep, tile):
  """One tile: x_ref f32[8, tile] -> v_ref f32[8, keep * 128] and i_ref
  i32[8, keep * 128], level j at lanes [j * 128, (j + 1) * 128)."""
  j = pl.program_id(1)
  first = j * tile + lax.broadcasted_iota(jnp.int32, (SUBLANES, LANES), 1)

  def body(c, carry):
    vals, idx = carry
    start = pl.multiple_of(c * LANES, LANES)
    v = x_ref[:, pl.ds(start, LANES)]
    v = jnp.where(jnp.abs(v) < _TINY, jnp.zeros_like(v), v)  # -0.0, subnormals
    vi = first + c * LANES
    beats = [v > level for level in vals]  # monotone: False..False True..True
    new_v, new_i = [], []
    for lvl in range(keep):
      if lvl == 0:
        new_v.append(jnp.where(beats[0], v, vals[0]))
        new_i.append(jnp.where(beats[0], vi, idx[0]))
      else:  # above inserted: shift down; at the insertion: the new entry
        new_v.append(jnp.where(beats[lvl - 1], vals[lvl - 1],
                               jnp.where(beats[lvl], v, vals[lvl])))
        new_i.append(jnp.where(beats[lvl - 1], idx[lvl - 1],
                               jnp.where(beats[lvl], vi, idx[lvl])))
    return tuple(new_v), tuple(new_i)

  init = (tuple(jnp.full((SUBLANES, LANES), -jnp.inf, jnp.float32)
                for _ in range(keep)),
          tuple(jnp.full((SUBLANES, LANES), _NO_INDEX, jnp.int32)
                for _ in range(keep)))
  vals, idx = lax.fori_loop(0, tile // LANES, body, init)
  for lvl in range(keep):
    v_ref[:, lvl * LANES:(lvl + 1) * LANES] = vals[lvl]
    i_ref[:, lvl * LANES:(lvl + 1) * LANES] = idx[lvl]


def block_candidates(scores, *, keep: int, tile: int):
  """The pass: (values f32[T, B * keep * 128], indices i32[...]) of scores
  f32[T, N], B = cdiv(N, tile) tiles; for tile b, level j, lane l (at column
  (b * keep + j) * 128 + l) the j-th best entry of the block of lane l, -inf
  and index 2**31 - 1 where the block has fewer visible entries."""
  t, n = scores.shape
  rows = -(-t // SUBLANES) * SUBLANES
  tiles = -(-n // tile)
  x = jnp.pad(scores.astype(jnp.float32),
              ((0, rows - t), (0, tiles * tile - n)),
              constant_values=base.NEG_INF)
  width = keep * LANES
  out_spec = pl.BlockSpec((SUBLANES, width), lambda r, b: (r, b))
  vals, idx = pl.pallas_call(
      functools.partial(_kernel, keep=keep, tile=tile),
      grid=(rows // SUBLANES, tiles),
      in_specs=[pl.BlockSpec((SUBLANES, tile), lambda r, b: (r, b))],
      out_specs=[out_spec, out_spec],
      out_shape=[jax.ShapeDtypeStruct((rows, tiles * width), jnp.float32),
                 jax.ShapeDtypeStruct((rows, tiles * width), jnp.int32)],
      compiler_params=pltpu.CompilerParams(
          dimension_semantics=("parallel", "parallel")),
      interpret=modes.resolve_interpret(),
      name=f"StreamIdxSelectBlocktop-keep_{keep}-tile_{tile}",
  )(x)
  return vals[:t], idx[:t]


def select(scores, k, extra=None, *, keep=None, tile=None):
  """The k best of scores f32[T, N >= k]: i32[T, k] (module docstring)."""
  del extra
  t, n = scores.shape
  tile = tile or tile_for(n)
  keep = min(keep or keep_for(n, k, tile), tile // LANES)
  if -(-n // tile) * LANES * keep < k:
    raise ValueError(f"keep: {keep} candidates in each of the "
                     f"{-(-n // tile) * LANES} blocks are fewer than k ({k})")
  vals, idx = block_candidates(scores, keep=keep, tile=tile)
  keys = base.order_key(vals)  # already canonical
  neg, cidx = lax.sort((~keys, idx), dimension=1, num_keys=2)
  win_key, win_idx = ~neg[:, :k], cidx[:, :k]
  out = jnp.where(win_key == base.NEG_INF_KEY, -1, win_idx).astype(jnp.int32)
  if keep == tile // LANES:  # every entry is a candidate
    return out
  # The keep-th candidate of every block against the k-th winner.
  last = keys.reshape(t, -1, keep, LANES)[:, :, keep - 1]
  last_i = idx.reshape(t, -1, keep, LANES)[:, :, keep - 1]
  kth, kth_i = win_key[:, k - 1, None, None], win_idx[:, k - 1, None, None]
  before = (last > kth) | ((last == kth) & (last_i < kth_i))
  return lax.cond(jnp.any(before), lambda: base.top_k(scores, k),
                  lambda: out)


def cost(rows, entries, k, *, keep=None, tile=None):
  t, n = rows, entries
  tile = tile or tile_for(n)
  keep = min(keep or keep_for(n, k, tile), tile // LANES)
  cand = -(-n // tile) * keep * LANES
  pair = base.F32 + base.I32
  return base.TopkCost(
      "blocktop", t * n * base.F32 + t * cand * pair,
      t * cand * pair + base.winners_bytes(t, k), 1,
      t * base.sort_work(cand), t * n * (2 * keep + 3),
      f"one pass keeping the {keep} best of each block of {tile // LANES} "
      f"entries ({cand} candidates a row), one sort of the candidates")


METHOD = base.Method(
    name="blocktop", exact=True, select=select, cost=cost,
    doc="a Pallas pass keeping each block's best entries, then one sort of "
    "the candidates (a full top_k where a block overflows)",
    options=(base.Option("keep", None, base.positive_int,
                         "candidates kept per block (default `keep_for`)"),
             base.Option("tile", None, _whole_vregs,
                         "entries of a row per grid step, a multiple of 128 "
                         "(default `tile_for(N)`)")))
