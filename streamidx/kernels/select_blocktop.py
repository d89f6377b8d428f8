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

Selection (XLA, on T x N * keep / (tile / 128) candidates, or the second
round's fewer): one two-key sort (key descending, index ascending) gives the
k best candidates. Exactness: each round also keeps a block's best dropped
entry; when none ranks before the k-th winner, every entry of the top k is
a candidate, and the result is the rule's. Otherwise (a block holding more
than `keep` of the top k: rare on scores without structure, `keep_for`)
the batch is selected again by the "sort" method, so the result is exact
always; only the cost depends on it.
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


def _insert(vals, idx, v, vi, by_index):
  """`keep` sorted levels (f32 and i32 [8, 128] each) with one more vreg of
  entries inserted. by_index: compare by (score, index), for entries in any
  order; else by score, for entries with higher indices than every kept one
  (a new entry then loses every tie)."""
  if by_index:
    beats = [(v > lv) | ((v == lv) & (vi < li)) for lv, li in zip(vals, idx)]
  else:
    beats = [v > lv for lv in vals]
  # beats is monotone over the levels (False..False True..True): the new
  # entry goes to the first level it beats, the levels below shift down.
  new_v, new_i = [], []
  for lvl in range(len(vals)):
    if lvl == 0:
      new_v.append(jnp.where(beats[0], v, vals[0]))
      new_i.append(jnp.where(beats[0], vi, idx[0]))
    else:
      new_v.append(jnp.where(beats[lvl - 1], vals[lvl - 1],
                             jnp.where(beats[lvl], v, vals[lvl])))
      new_i.append(jnp.where(beats[lvl - 1], idx[lvl - 1],
                             jnp.where(beats[lvl], vi, idx[lvl])))
  return tuple(new_v), tuple(new_i)


def _empty(keep):
  return (tuple(jnp.full((SUBLANES, LANES), -jnp.inf, jnp.float32)
                for _ in range(keep)),
          tuple(jnp.full((SUBLANES, LANES), _NO_INDEX, jnp.int32)
                for _ in range(keep)))


def _store(ref, levels, first=0):
  for lvl, x in enumerate(levels):
    ref[:, (first + lvl) * LANES:(first + lvl + 1) * LANES] = x


def _kernel(x_ref, *refs, keep, tile, second):
  """Grid step (r, b): rows 8r.., tile b of x_ref f32[8, tile]. A round
  keeps keep + 1 levels: the last is the best entry it drops.

  second None: writes the tile's candidates, v_ref f32[8, keep * 128] and
  i_ref i32[8, keep * 128] (level j at lanes [j * 128, (j + 1) * 128)), and
  the best dropped entries dv_ref / di_ref [8, 128].
  second (keep2, group): collects the candidates in VMEM (cv_ref, ci_ref
  [tiles, 8, keep * 128]) and writes the best dropped ones, dv_ref / di_ref
  [8, 128]; the row group's last step runs the second round over them
  (blocks: lane l of `group` tiles' levels) into v_ref / i_ref [8, groups *
  keep2 * 128] and its best dropped ones, dv2_ref / di2_ref [8, groups *
  128].
  """
  b = pl.program_id(1)
  first = b * tile + lax.broadcasted_iota(jnp.int32, (SUBLANES, LANES), 1)

  def body(c, carry):
    start = pl.multiple_of(c * LANES, LANES)
    v = x_ref[:, pl.ds(start, LANES)]
    v = jnp.where(jnp.abs(v) < _TINY, jnp.zeros_like(v), v)  # -0.0, subnormals
    return _insert(*carry, v, first + c * LANES, by_index=False)

  vals, idx = lax.fori_loop(0, tile // LANES, body, _empty(keep + 1),
                            unroll=min(UNROLL, tile // LANES))
  if second is None:
    v_ref, i_ref, dv_ref, di_ref = refs
    _store(v_ref, vals[:keep])
    _store(i_ref, idx[:keep])
  else:
    v_ref, i_ref, dv_ref, di_ref, dv2_ref, di2_ref, cv_ref, ci_ref = refs
    for lvl in range(keep):
      cv_ref[b, :, lvl * LANES:(lvl + 1) * LANES] = vals[lvl]
      ci_ref[b, :, lvl * LANES:(lvl + 1) * LANES] = idx[lvl]
  dv_ref[...] = vals[keep]
  di_ref[...] = idx[keep]
  if second is None:
    return
  keep2, group = second
  tiles = cv_ref.shape[0]

  @pl.when(b == tiles - 1)
  def _():
    def body2(t, carry):
      for lvl in range(keep):
        carry = _insert(*carry, cv_ref[t, :, lvl * LANES:(lvl + 1) * LANES],
                        ci_ref[t, :, lvl * LANES:(lvl + 1) * LANES],
                        by_index=True)
      return carry

    for g in range(-(-tiles // group)):
      vals2, idx2 = lax.fori_loop(g * group, min(tiles, (g + 1) * group),
                                  body2, _empty(keep2 + 1))
      _store(v_ref, vals2[:keep2], g * keep2)
      _store(i_ref, idx2[:keep2], g * keep2)
      _store(dv2_ref, vals2[keep2:], g)
      _store(di2_ref, idx2[keep2:], g)


def block_candidates(scores, *, keep: int, tile: int, second=None):
  """The pass over scores f32[T, N], B = cdiv(N, tile) tiles: (values,
  indices, dropped values, dropped indices[, the second round's dropped
  values, indices]).

  second None: values f32[T, B * keep * 128], indices i32[...]; at column
  (b * keep + j) * 128 + l the j-th best entry of block (tile b, lane l) by
  (score desc, index asc), -inf and index 2**31 - 1 where it has fewer
  visible ones; dropped [T, B * 128]: each block's best entry not kept.
  second (keep2, group): values and indices of the second round [T,
  cdiv(B, group) * keep2 * 128], the j-th best of block (tile group g, lane
  l) of the first round's candidates at column (g * keep2 + j) * 128 + l;
  the first round's dropped [T, B * 128], the second's [T, cdiv(B, group)
  * 128].
  """
  t, n = scores.shape
  rows = -(-t // SUBLANES) * SUBLANES
  tiles = -(-n // tile)
  x = jnp.pad(scores.astype(jnp.float32), ((0, rows - t), (0, tiles * tile - n)),
              constant_values=base.NEG_INF)

  def pair(width, per_tile):
    spec = pl.BlockSpec((SUBLANES, width),
                        (lambda r, b: (r, b)) if per_tile else (lambda r, b: (r, 0)))
    cols = width * (tiles if per_tile else 1)
    return [spec, spec], [jax.ShapeDtypeStruct((rows, cols), jnp.float32),
                          jax.ShapeDtypeStruct((rows, cols), jnp.int32)]

  if second is None:
    pairs = [pair(keep * LANES, True), pair(LANES, True)]
    scratch, semantics = [], ("parallel", "parallel")
  else:
    keep2, group = second
    groups = -(-tiles // group)
    pairs = [pair(groups * keep2 * LANES, False), pair(LANES, True),
             pair(groups * LANES, False)]
    scratch = [pltpu.VMEM((tiles, SUBLANES, keep * LANES), jnp.float32),
               pltpu.VMEM((tiles, SUBLANES, keep * LANES), jnp.int32)]
    semantics = ("parallel", "arbitrary")  # the last tile reads them all
  out = pl.pallas_call(
      functools.partial(_kernel, keep=keep, tile=tile, second=second),
      grid=(rows // SUBLANES, tiles),
      in_specs=[pl.BlockSpec((SUBLANES, tile), lambda r, b: (r, b))],
      out_specs=[s for specs, _ in pairs for s in specs],
      out_shape=[s for _, shapes in pairs for s in shapes],
      scratch_shapes=scratch,
      compiler_params=pltpu.CompilerParams(dimension_semantics=semantics),
      interpret=modes.resolve_interpret(),
      name=(f"StreamIdxSelectBlocktop-keep_{keep}-tile_{tile}"
            + ("" if second is None else
               f"-keep2_{second[0]}-group_{second[1]}")),
  )(x)
  return tuple(o[:t] for o in out)


def plan(n: int, k: int, keep: int | None = None, tile: int | None = None,
         rounds: int | None = None):
  """(keep, tile, second): the first round keeps `keep` of each block of
  tile / 128 entries; second, None or (keep2, group): the second round
  keeps keep2 of each block of `group` tiles' candidates of one lane (about
  as many as a first-round block), where it at least halves them (`rounds`
  1: never; 2: where it keeps fewer than all). Each round keeps at least k
  candidates a row."""
  tile = tile or tile_for(n)
  keep = min(keep or keep_for(n, k, tile), tile // LANES)
  tiles = -(-n // tile)
  cand = tiles * keep * LANES
  if cand < k:
    raise ValueError(f"keep: {keep} candidates in each of the "
                     f"{tiles * LANES} blocks are fewer than k ({k})")
  if keep == tile // LANES or (rounds or 2) < 2:
    return keep, tile, None
  group = max(1, min(tiles, (tile // LANES) // keep))
  block = group * keep
  keep2 = min(keep_for(cand, k, block * LANES), block)
  cand2 = -(-tiles // group) * keep2 * LANES
  if keep2 == block or cand2 < k or (rounds is None and 2 * cand2 > cand):
    return keep, tile, None
  return keep, tile, (keep2, group)


def _before(vals, idx, kth, kth_i):
  """Where a candidate ranks before the k-th winner (kth: its key)."""
  keys = base.order_key(vals)
  return (keys > kth) | ((keys == kth) & (idx < kth_i))


def select(scores, k, extra=None, *, keep=None, tile=None, rounds=None):
  """The k best of scores f32[T, N >= k]: i32[T, k] (module docstring)."""
  del extra
  keep, tile, second = plan(scores.shape[1], k, keep, tile, rounds)
  vals, idx, *dropped = block_candidates(scores, keep=keep, tile=tile,
                                         second=second)
  keys = base.order_key(vals)  # canonical already
  neg, cidx = lax.sort((~keys, idx), dimension=1, num_keys=2)
  win_key, win_idx = ~neg[:, :k], cidx[:, :k]
  res = jnp.where(win_key == base.NEG_INF_KEY, -1, win_idx).astype(jnp.int32)
  # A dropped entry ranking before the k-th winner belongs in the top k:
  # then the whole batch is selected by "sort". Otherwise every entry of the
  # top k is a candidate (a candidate outside it ranks after all of it).
  kth, kth_i = win_key[:, k - 1:k], win_idx[:, k - 1:k]
  overflow = jnp.any(_before(jnp.concatenate(dropped[0::2], axis=1),
                             jnp.concatenate(dropped[1::2], axis=1),
                             kth, kth_i))
  return lax.cond(overflow, lambda: sort_method.select(scores, k),
                  lambda: res)


def cost(rows, entries, k, *, keep=None, tile=None, rounds=None):
  t, n = rows, entries
  keep, tile, second = plan(n, k, keep, tile, rounds)
  tiles = -(-n // tile)
  pair = base.F32 + base.I32
  cand = tiles * keep * LANES
  scan = t * n * (2 * keep + 5)  # keep + 1 levels: the best dropped too
  detail = f"keep {keep} of each block of {tile // LANES}"
  written = 0
  if second is not None:
    keep2, group = second
    scan += t * cand * (4 * keep2 + 7)
    cand = -(-tiles // group) * keep2 * LANES
    written += t * -(-tiles // group) * LANES * pair  # its best dropped
    detail += f", then {keep2} of each block of {group * keep} (in VMEM)"
  written += t * (cand + tiles * LANES) * pair  # + round 1's best dropped
  return base.TopkCost(
      "blocktop", t * n * base.F32 + written, written + base.winners_bytes(t, k),
      1, t * base.sort_work(cand), scan,
      f"one pass: {detail}; one sort of the {cand} candidates a row")


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
             base.Option("rounds", None, base.one_of((None, 1, 2)),
                         "1: one round; 2: a second round in VMEM where it "
                         "prunes (default: where it halves the candidates)")))
