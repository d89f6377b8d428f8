"""The "blocktop" top-k method: a Pallas TensorCore pass keeping each small
block's best entries, then one sort of those candidates (no sort of the row).

Pass (one read of the f32[T, N] score buffer, no scatter): the row is seen
as vregs of [8, 128], each 1,024 consecutive entries; block p (p in [0,
1024)) is the entries at position p of every vreg, entry p, p + 1024, p +
2048, ... (N / 1024 of them, in index order). A grid step holds one row's
`tile` entries (tile / 1024 vregs); per block the pass keeps the `keep` best
entries by (score descending, index ascending), -0.0 and subnormals as 0,
in `keep` sorted [8, 128] levels, plus one more level: the best entry it
dropped. Each vreg is inserted by compare and select (a new entry has the
highest index so far, so it goes above the first level it beats and the
levels below shift down). The levels stay in the output block across a
row's tiles; the pass writes them once a row: candidates f32 and i32 [T,
keep * 1024], and the dropped [T, 1024]. Any 1,024 consecutive entries fall
in 1,024 different blocks, so a row whose visible entries are a short
prefix, or whose winners cluster in a window, spreads its winners over the
blocks as a long random row does.

Selection (XLA, on keep * 1,024 candidates a row): one two-key sort (key
descending, index ascending) gives the k best candidates. Exactness: when
no block's best dropped entry ranks before the k-th winner, every entry of
the top k is a candidate (a candidate outside the top k ranks after all of
it), and the result is the rule's. Otherwise (a block holding more than
`keep` of the top k: rare, `keep_for`) the batch is selected again by the
"sort" method, so the result is exact always; only the cost depends on it.
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
BLOCKS = SUBLANES * LANES  # blocks a row: the positions of a vreg
MAX_TILE = 65536  # entries of a row per grid step (64 vregs, 256 KiB)
_TINY = float(jnp.finfo(jnp.float32).tiny)
_NO_INDEX = 2**31 - 1  # the index of an empty level (ranks after every entry)
UNROLL = 8  # vregs per loop iteration: the compare-select chains interleave


def tile_for(n: int) -> int:
  """Entries of a row per grid step: `MAX_TILE`, or n rounded up to whole
  vregs (1,024 entries) when shorter."""
  return min(MAX_TILE, -(-n // BLOCKS) * BLOCKS)


def _overflow_probability(block: int, p: float, keep: int) -> float:
  """P(Binomial(block, p) > keep)."""
  below = sum(math.comb(block, j) * p**j * (1 - p)**(block - j)
              for j in range(keep + 1))
  return max(0.0, 1.0 - below)


def keep_for(n: int, k: int) -> int:
  """Candidates kept per block: the fewest (at least 2, at most the block's
  n / 1024 entries) that number at least k a row and for which, were the
  top k spread over the row at random, a row would hold a block with more
  of them with probability below 1e-4 (then the check sends the batch to
  "sort")."""
  block = -(-n // BLOCKS)
  p = min(1.0, k / max(1, n))
  for keep in range(2, block):
    if (BLOCKS * keep >= k
        and BLOCKS * _overflow_probability(block, p, keep) < 1e-4):
      return keep
  return block


def _whole_vregs(value) -> str | None:
  if value is None or (isinstance(value, int) and not isinstance(value, bool)
                       and value >= BLOCKS and value % BLOCKS == 0):
    return None
  return f"must be a positive multiple of {BLOCKS}"


def _insert(vals, idx, v, vi):
  """Sorted levels (f32 and i32 [8, 128] each) with one more vreg of entries
  inserted, entries with higher indices than every kept one (a new entry
  loses every tie)."""
  beats = [v > lv for lv in vals]
  # beats is monotone over the levels (False..False True..True): the new
  # entry goes to the first level it beats, the levels below shift down.
  new_v, new_i = [jnp.where(beats[0], v, vals[0])], [
      jnp.where(beats[0], vi, idx[0])]
  for lvl in range(1, len(vals)):
    new_v.append(jnp.where(beats[lvl - 1], vals[lvl - 1],
                           jnp.where(beats[lvl], v, vals[lvl])))
    new_i.append(jnp.where(beats[lvl - 1], idx[lvl - 1],
                           jnp.where(beats[lvl], vi, idx[lvl])))
  return tuple(new_v), tuple(new_i)


def _kernel(x_ref, v_ref, i_ref, *, keep, tile):
  """Grid step (r, b): tile b of row r, x_ref f32[tile / 128, 128]; the
  levels v_ref f32[(keep + 1) * 8, 128], i_ref i32[...] (level j at rows [8j,
  8j + 8); the last: the best dropped) stay resident over the row's tiles."""
  b = pl.program_id(1)
  span = (keep + 1) * SUBLANES

  @pl.when(b == 0)
  def _():
    v_ref[...] = jnp.full((span, LANES), -jnp.inf, jnp.float32)
    i_ref[...] = jnp.full((span, LANES), _NO_INDEX, jnp.int32)

  pos = (lax.broadcasted_iota(jnp.int32, (SUBLANES, LANES), 0) * LANES
         + lax.broadcasted_iota(jnp.int32, (SUBLANES, LANES), 1))
  first = b * tile + pos

  def body(c, carry):
    start = pl.multiple_of(c * SUBLANES, SUBLANES)
    v = x_ref[pl.ds(start, SUBLANES), :]
    v = jnp.where(jnp.abs(v) < _TINY, jnp.zeros_like(v), v)  # -0.0, subnormals
    return _insert(*carry, v, first + c * BLOCKS)

  levels = range(keep + 1)
  init = (tuple(v_ref[l * SUBLANES:(l + 1) * SUBLANES, :] for l in levels),
          tuple(i_ref[l * SUBLANES:(l + 1) * SUBLANES, :] for l in levels))
  n = tile // BLOCKS
  vals, idx = lax.fori_loop(0, n, body, init, unroll=min(UNROLL, n))
  for l in levels:
    v_ref[l * SUBLANES:(l + 1) * SUBLANES, :] = vals[l]
    i_ref[l * SUBLANES:(l + 1) * SUBLANES, :] = idx[l]


def block_candidates(scores, *, keep: int, tile: int):
  """The pass over scores f32[T, N]: (values f32[T, keep * 1024], indices
  i32[...], dropped values f32[T, 1024], dropped indices i32[...]). Column
  j * 1024 + p: the j-th best entry of block p by (score desc, index asc),
  -inf and index 2**31 - 1 where it has fewer visible ones; dropped column
  p: the best entry block p did not keep."""
  t, n = scores.shape
  tiles = -(-n // tile)
  x = jnp.pad(scores.astype(jnp.float32), ((0, 0), (0, tiles * tile - n)),
              constant_values=base.NEG_INF).reshape(t, -1, LANES)
  span = (keep + 1) * SUBLANES
  out_spec = pl.BlockSpec((None, span, LANES), lambda r, b: (r, 0, 0))
  vals, idx = pl.pallas_call(
      functools.partial(_kernel, keep=keep, tile=tile),
      grid=(t, tiles),
      in_specs=[pl.BlockSpec((None, tile // LANES, LANES),
                             lambda r, b: (r, b, 0))],
      out_specs=[out_spec, out_spec],
      out_shape=[jax.ShapeDtypeStruct((t, span, LANES), jnp.float32),
                 jax.ShapeDtypeStruct((t, span, LANES), jnp.int32)],
      compiler_params=pltpu.CompilerParams(
          dimension_semantics=("parallel", "arbitrary")),
      interpret=modes.resolve_interpret(),
      name=f"StreamIdxSelectBlocktop-keep_{keep}-tile_{tile}",
  )(x)
  vals, idx = vals.reshape(t, -1), idx.reshape(t, -1)
  cut = keep * BLOCKS
  return vals[:, :cut], idx[:, :cut], vals[:, cut:], idx[:, cut:]


def plan(n: int, k: int, keep: int | None = None,
         tile: int | None = None) -> tuple[int, int]:
  """(keep, tile) for rows of n entries, checked: at least k candidates."""
  tile = tile or tile_for(n)
  keep = keep or keep_for(n, k)
  if BLOCKS * keep < k:
    raise ValueError(f"keep: {keep} candidates in each of the {BLOCKS} "
                     f"blocks are fewer than k ({k})")
  return keep, tile


def _before(vals, idx, kth, kth_i):
  """Where an entry ranks before the k-th winner (kth: its key)."""
  keys = base.order_key(vals)
  return (keys > kth) | ((keys == kth) & (idx < kth_i))


def select(scores, k, extra=None, *, keep=None, tile=None):
  """The k best of scores f32[T, N >= k]: i32[T, k] (module docstring)."""
  del extra
  keep, tile = plan(scores.shape[1], k, keep, tile)
  vals, idx, drop_v, drop_i = block_candidates(scores, keep=keep, tile=tile)
  keys = base.order_key(vals)  # canonical already
  neg, cidx = lax.sort((~keys, idx), dimension=1, num_keys=2)
  win_key, win_idx = ~neg[:, :k], cidx[:, :k]
  res = jnp.where(win_key == base.NEG_INF_KEY, -1, win_idx).astype(jnp.int32)
  if keep >= -(-scores.shape[1] // BLOCKS):  # every entry is a candidate
    return res
  # A dropped entry ranking before the k-th winner belongs in the top k:
  # then the whole batch is selected by "sort".
  overflow = jnp.any(_before(drop_v, drop_i, win_key[:, k - 1:k],
                             win_idx[:, k - 1:k]))
  return lax.cond(overflow, lambda: sort_method.select(scores, k),
                  lambda: res)


def cost(rows, entries, k, *, keep=None, tile=None):
  t, n = rows, entries
  keep, tile = plan(n, k, keep, tile)
  cand = keep * BLOCKS
  pair = base.F32 + base.I32
  written = t * (cand + BLOCKS) * pair  # candidates and the best dropped
  return base.TopkCost(
      "blocktop", t * n * base.F32 + written,
      written + base.winners_bytes(t, k), 1, t * base.sort_work(cand),
      t * n * (2 * keep + 5),
      f"one pass keeping {keep} of each of {BLOCKS} blocks of "
      f"{-(-n // BLOCKS)} entries; one sort of the {cand} candidates a row")


METHOD = base.Method(
    name="blocktop", exact=True, select=select, cost=cost,
    doc="a Pallas pass keeping each block's best entries, then one sort of "
    "the candidates (the full sort where a block overflows)",
    options=(base.Option("keep", None, base.positive_int,
                         "candidates kept per block (default `keep_for`)"),
             base.Option("tile", None, _whole_vregs,
                         "entries of a row per grid step, a multiple of "
                         "1,024 (default `tile_for(N)`)")))
