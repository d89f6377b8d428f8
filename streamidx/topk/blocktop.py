"""The "blocktop" top-k method: one Pallas TensorCore kernel reads the
f32[T, N] score buffer once and writes each row's k winners i32[T, k] in the
rule's order (docs/topk-methods.md, "blocktop").

A grid step holds 8 rows, streamed in tiles of `tile` entries; block p (p
in [0, 1024)) of a row is its entries p, p + 1024, ... The pass keeps each
block's `keep` best entries and the best one it dropped; the finish finds
the bound (the k-th best of the first `bound_levels`), compacts the
candidates at or before it into `capacity(k)` slots and sorts them
(bitonic). Where a dropped entry ranks before the k-th winner or the
candidates overflow the slots, that row is selected again by one two-key
sort of the whole row (`fallback`, a few rows at a time).

The kernel also reads the scoring kernels' own buffer f32[T, W / 128, 128]
as it is (`reads_lane_rows`), the first N <= W entries of each row: a vreg
there is 1,024 consecutive entries of one row, the same 1,024 blocks, so the
pass runs a row at a time and its levels are transposed (rows <-> units)
before the finish; the driver then skips its relayout of the buffer to
f32[T, N] (an XLA copy, read and written) and its cut of the columns past N
(M24: a slice, another copy).
"""

from __future__ import annotations

import functools
import itertools
import math

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from streamidx import modes
from streamidx.topk import base

SUBLANES, LANES = 8, 128
BLOCKS = SUBLANES * LANES  # blocks a row: 8 vregs of 128 lanes
UNITS = BLOCKS // LANES  # vregs of a row group that make one row's blocks
MAX_TILE = 65536  # entries of a row per tile (8 rows: 2 MiB a buffer)
CHUNK = 8192  # entries of a row per DMA
_TINY = float(jnp.finfo(jnp.float32).tiny)
# What `kernel_call(..., ablate=...)` can leave out, to time the rest on a
# chip (`lab.bench.ablate_select`). Without the finish: the tiles' DMAs and
# their waits ("dma"), the pass's work on each tile ("scan"). With it, one
# of its steps: the bound's search ("bound": a bound every live candidate
# is at or before), the marking and compaction ("compact": the sort takes
# its buffers as they are), the sort ("sort"). The finish's steps run the
# same loops whatever the data, so what is left takes the time it takes.
PASS_ABLATIONS = ("dma", "scan")
FINISH_ABLATIONS = ("bound", "compact", "sort")
ABLATIONS = PASS_ABLATIONS + FINISH_ABLATIONS
# Chips of one TensorCore, whose grid runs in order: there the last tile's
# step starts the next grid step's first tile ("arbitrary"); where
# "parallel" splits the grid over a chip's cores (v4, v5p, v7x) each step
# starts its own. On the v5e, where each grid step fetched its first tile
# only when it began, the tiles' DMAs alone took 1.28x one read of the
# buffer at decode and prefill; with the prefetch 1.19x and 1.17x
# (`lab.bench.ablate_select`'s `reads_only`, docs/topk-methods.md).
PREFETCH_CHIPS = ("v5e", "v6e")
_NO_INDEX = 2**31 - 1  # the index of an empty level (ranks after every entry)
_DEAD = base.NEG_INF_KEY  # the key of an empty slot (-inf's)
_BLOCK_BITS = 10  # log2(BLOCKS): an index is its vreg number, then its block


def tile_for(n: int) -> int:
  """Entries of a row per tile: `MAX_TILE`, or n rounded up to whole vregs
  of 1,024 entries when shorter (to whole `CHUNK`s past one: a chunk of 8
  vregs, `chunk_for`)."""
  step = BLOCKS if n <= CHUNK else CHUNK
  return min(MAX_TILE, -(-n // step) * step)


def chunk_for(tile: int) -> int:
  """Entries of a row per DMA (and per trip of the pass): the tile, up to
  `CHUNK`; past it the largest power of two <= `CHUNK` dividing the tile,
  so the chunks cover it."""
  return tile if tile <= CHUNK else math.gcd(tile, CHUNK)


def _overflow_probability(block: int, p: float, keep: int) -> float:
  """P(Binomial(block, p) > keep)."""
  below = sum(math.comb(block, j) * p**j * (1 - p)**(block - j)
              for j in range(keep + 1))
  return max(0.0, 1.0 - below)


def keep_for(n: int, k: int) -> int:
  """Candidates kept per block: the fewest (>= 2) that number at least k a
  row and overflow (top k spread at random) with probability below 1e-4."""
  block = -(-n // BLOCKS)
  p = min(1.0, k / max(1, n))
  for keep in range(2, block):
    if (BLOCKS * keep >= k
        and BLOCKS * _overflow_probability(block, p, keep) < 1e-4):
      return keep
  return block


def capacity(k: int) -> int:
  """Slots sorted a row: the power of two >= 2k, at least one vreg's 128."""
  return max(LANES, 1 << (2 * k - 1).bit_length())


def bound_levels(k: int, keep: int) -> int:
  """Levels whose k-th best entry bounds the winners: 2k entries."""
  return min(keep, -(-2 * k // BLOCKS))


def _whole_vregs(value) -> str | None:
  if value is None or (isinstance(value, int) and not isinstance(value, bool)
                       and value >= BLOCKS and value % BLOCKS == 0):
    return None
  return f"must be a positive multiple of {BLOCKS}"


# -- the pass -----------------------------------------------------------------
#
# A block's entries arrive 4 vregs at a time (`GROUP`: entries j .. j + 3 of
# every block, index ascending) and meet in a tournament: (0, 1) and (2, 3),
# then the two winners and the two losers. Its 4 places: the group's best,
# the winners' loser (its second), the losers' winner (its third), the
# losers' loser (its last). Two groups in a row (8 vregs, the first's indices
# the lower) meet once more: their bests, the winner to list 0, the loser to
# list 1. Each list (`AHEAD`: the best, the bests'
# loser, the seconds, thirds, lasts) keeps the best entries it is dealt,
# sorted, the shorter the more of its group rank before them
# (`list_lengths`), and after the last tile `_merge` makes the lists the
# block's levels: at keep 7, 8 vregs go through 32 levels of lists where
# each went through 8, 64 (5 vector ops a level, 45 the two tournaments and
# their bests' match).

GROUP = 4  # vregs of a block that meet in one tournament
AHEAD = (0, 1, 1, 1, 3)  # entries of its group certainly before each list's
LIST_OF = (0, 2, 3, 4)  # the list of each place of a tournament (unpaired)
_SWEEP_LEVELS = 22  # levels of lists a loop over chunks carries (`_sweeps`)
_PASS_UNROLL = 4  # chunks a trip of that loop (fewer copies of its carry)


def list_lengths(levels: int) -> tuple[int, ...]:
  """Entries kept by each list for a block's best `levels` (keep + 1, the
  best dropped included): levels // (AHEAD + 1); list 0's, `levels`, are
  the lists' first levels, then lists 1 .. 4.

  A list's entries come one from each of its groups: list 1's (the bests'
  loser, 1 before it: the winner) from pairs of groups; lists 2, 3, 4 (a
  tournament's second, third, last: 1, 1, 3 before them) from groups of 4;
  list 0 (0 before it) from pairs, a chunk's last group where unpaired, and
  its last vregs (fewer than 4, each entry a group of its own).
  Enough: let e, of list p (a = AHEAD[p]), rank r < levels in its block,
  q entries of list p before it. Each of those q and e has a entries of
  its own group certainly before it (so before e), all distinct (a group
  each): (q + 1)(a + 1) - 1 <= r, so q + 1 <= levels // (a + 1), and e is
  among its list's that many best."""
  return tuple(levels // (a + 1) for a in AHEAD)


def _merge_skip(p: int, i: int) -> int:
  """The levels `_merge` need not compare the i-th entry of list p (p >= 1)
  with: (i + 1)(AHEAD[p] + 1) - 1, those certainly before it.

  The entries certainly before an entry of list p are of lists below p (a
  bests' loser: its winner, list 0; a second: its group's best, list 0 or
  1; a third: its pair's winner, a best or second; a last: the other 3).
  The merge starts from list 0 and inserts lists 1, 2, ... in turn, each
  best first, keeping the `levels` best of the entries merged so far (U),
  sorted. (a) An entry y of a list q below p missing from U ranks after
  `levels` of U: U dropped it (then it holds `levels` before it), or y's
  list did, holding levels // (A + 1) entries before y (A = AHEAD[q]), each
  with A of its group before it, and y has A of its own: at least `levels`
  entries before y, all distinct (a group each), of list q or below, each in
  U or (by induction on q) after `levels` of U. (b) When x, the i-th of list
  p, goes in, the i before it in its list and the AHEAD[p] of each of their
  i + 1 groups before them and x are (i + 1)(AHEAD[p] + 1) - 1 = skip
  distinct entries before x, each in U or after `levels` of U (a), and skip
  < levels (i < list_lengths(levels)[p]): U's best `skip` rank before x,
  which goes below them."""
  return (i + 1) * (AHEAD[p] + 1) - 1


def _shift_in(vals, idx, v, vi, beats, skip: int = 0):
  """Sorted levels (f32 and i32 [8, 128] each) with v, vi inserted at the
  first level it beats (beats[l]: masks, monotone over the levels, False
  .. False True .. True; the first `skip` False, not read); the levels
  below shift down, the last one out."""
  new_v, new_i = list(vals[:skip]), list(idx[:skip])
  for lvl in range(skip, len(vals)):
    above_v, above_i = (v, vi) if lvl == skip else (
        jnp.where(beats[lvl - 1], vals[lvl - 1], v),
        jnp.where(beats[lvl - 1], idx[lvl - 1], vi))
    new_v.append(jnp.where(beats[lvl], above_v, vals[lvl]))
    new_i.append(jnp.where(beats[lvl], above_i, idx[lvl]))
  return tuple(new_v), tuple(new_i)


def _insert(vals, idx, v, vi):
  """Sorted levels (f32 and i32 [8, 128] each) with one more vreg of entries
  inserted (higher indices than every kept one: it loses every tie)."""
  return _shift_in(vals, idx, v, vi, [v > lv for lv in vals])


def _sweeps(lengths) -> list[tuple[int, int]]:
  """The lists [lo, hi) each loop over a tile's chunks deals to: in turn,
  as many as keep at most `_SWEEP_LEVELS` levels (list 0 alone where it
  keeps more). A loop carries its lists' levels in registers (a value and
  an index vreg a level, of 64 vregs); more would spill (a few do: the
  loop still issues 4 vector ops a bundle), and each loop does its
  tournaments again (45 vector ops, of 190 or more a pair of groups): at
  keep 7 one loop (22 levels), at keep 13 two (14 + 7; 7 + 7 + 3)."""
  out, lo = [], 0
  for p in range(1, len(lengths) + 1):
    if p == len(lengths) or sum(lengths[lo:p + 1]) > _SWEEP_LEVELS:
      out.append((lo, p))
      lo = p
  return out


def pass_ops(levels: int) -> float:
  """Vector compares and selects of the pass per vreg of entries (so per
  entry), chunks of whole pairs of groups: a pair's inserts (5m - 2 ops into
  a list of m levels: lists 0 and 1 once, the others twice) and each loop's
  exchanges (5 ops; `_sweeps`: a loop does again those its lists need)."""
  lengths = list_lengths(levels)
  inserts = (1, 1, 2, 2, 2)
  # exchanges a pair of groups makes, by kind, and the kinds each list needs
  count = {"pairs": 4, "winners": 2, "losers": 2, "bests": 1}
  needs = ({"pairs", "winners", "bests"}, {"pairs", "winners", "bests"},
           {"pairs", "winners"}, {"pairs", "losers"}, {"pairs", "losers"})
  ops = sum(d * (5 * m - 2) for d, m in zip(inserts, lengths) if m)
  for lo, hi in _sweeps(lengths):
    kinds = set().union(*(needs[p] for p in range(lo, hi) if lengths[p]))
    ops += 5 * sum(count[x] for x in kinds)
  return ops / (2 * GROUP)


def _exchange(a, ia, b, ib):
  """(winner, its index, loser, its index) of a and b, a's index the lower:
  one compare, a tie to a."""
  m = b > a
  return (jnp.where(m, b, a), jnp.where(m, ib, ia),
          jnp.where(m, a, b), jnp.where(m, ia, ib))


def _tournament(v, vi):
  """The 4 places (value, index: best, second, third, last) of 4 vregs of
  entries v, vi of the same blocks, indices ascending. Each exchange has
  the lower indices on its left: (0, 1), (2, 3), then the winners and the
  losers, each time one of (0, 1) left of one of (2, 3)."""
  w0, iw0, l0, il0 = _exchange(v[0], vi[0], v[1], vi[1])
  w1, iw1, l1, il1 = _exchange(v[2], vi[2], v[3], vi[3])
  best, ibest, second, isecond = _exchange(w0, iw0, w1, iw1)
  third, ithird, last, ilast = _exchange(l0, il0, l1, il1)
  return (best, ibest), (second, isecond), (third, ithird), (last, ilast)


def _scan(buf, lv, li, first, *, levels: int, chunks: int, chunk: int,
          lane_rows: bool, empty: bool = False):
  """Deals a tile of 8 rows from entry `first`, in index order, to the
  lists in lv, li ([sum(list_lengths(levels)) * 8, 8, 128]): a chunk's
  vregs in groups of 4 (`_tournament`), two in a row paired (their bests'
  match: lists 0 and 1), a last one unpaired (its best to list 0); its
  last vregs (fewer than 4) one at a time to list 0. buf: f32[chunks, 8,
  chunk], list level l of unit u (blocks u * 128 + lane of the 8 rows) at
  l * 8 + u; or (lane_rows) f32[chunks, 8, chunk / 128, 128], level l of
  row u (its blocks sublane * 128 + lane) at l * 8 + u (`_rows_to_units`).
  An index in li is the entry's less its block (a multiple of 1,024, one
  scalar a vreg), the block added by `_merge`: the lists and the merge
  compare indices of one block alone. empty: the first tile, the lists
  empty (-inf, `_NO_INDEX`) and not read from lv, li."""
  lengths = list_lengths(levels)
  nv = chunk // BLOCKS
  for u, (lo, hi) in itertools.product(range(UNITS), _sweeps(lengths)):
    at = sum(lengths[:lo])  # the sweep's lists: levels [at, top)
    top = sum(lengths[:hi])

    def body(c, carry, u=u, lo=lo, hi=hi, at=at):
      vals, idx = list(carry[0]), list(carry[1])

      def entries(j):  # vreg j of chunk c and its indices
        if lane_rows:  # row u's entries j * 1024 + block
          v = buf[c, u, j * SUBLANES:(j + 1) * SUBLANES, :]
        else:  # the 8 rows' entries j * 1024 + u * 128 + lane
          col = j * BLOCKS + u * LANES
          v = buf[c, :, col:col + LANES]
        # -0.0 -> +0.0; flushes subnormals. The index less its block: one
        # scalar a vreg (`_merge` adds the block)
        return v + 0.0, jnp.full((SUBLANES, LANES),
                                 first + c * chunk + j * BLOCKS, jnp.int32)

      def deal(p, v, vi):  # into list p
        s = slice(sum(lengths[:p]) - at, sum(lengths[:p + 1]) - at)
        vals[s], idx[s] = _insert(vals[s], idx[s], v, vi)

      def group(g):
        got = [entries(g + q) for q in range(GROUP)]
        return _tournament([e[0] for e in got], [e[1] for e in got])

      def deal_all(dealt):
        for p, e in dealt:
          if lo <= p < hi and lengths[p]:
            deal(p, *e)

      pairs = nv // (2 * GROUP) * 2 * GROUP  # static: they interleave
      for g in range(0, pairs, 2 * GROUP):
        a, b = group(g), group(g + GROUP)  # a's indices the lower
        w, iw, l, il = _exchange(*a[0], *b[0])
        deal_all([(0, (w, iw)), (1, (l, il))] + [
            (LIST_OF[q], x[q]) for q in range(1, GROUP) for x in (a, b)])
      for g in range(pairs, nv - nv % GROUP, GROUP):
        deal_all(list(zip(LIST_OF, group(g))))
      if lo == 0:
        for j in range(nv - nv % GROUP, nv):
          deal(0, *entries(j))
      return tuple(vals), tuple(idx)

    if empty:
      init = tuple((jnp.full((SUBLANES, LANES), x, dt),) * (top - at)
                   for x, dt in ((-jnp.inf, jnp.float32),
                                 (_NO_INDEX, jnp.int32)))
    else:
      init = (tuple(lv[l * UNITS + u] for l in range(at, top)),
              tuple(li[l * UNITS + u] for l in range(at, top)))
    vals, idx = lax.fori_loop(0, chunks, body, init,
                              unroll=math.gcd(chunks, _PASS_UNROLL))
    for l in range(at, top):
      lv[l * UNITS + u] = vals[l - at]
      li[l * UNITS + u] = idx[l - at]


def _merge(lv, li, levels: int, lane_rows: bool):
  """The lists in lv, li (`_scan`) merged into each block's `levels` best,
  sorted by (value descending, index ascending), at levels [0, levels)
  (list 0's, and its layout). Across lists an entry may
  rank before one of lower index: each insert compares both keys, from
  level `_merge_skip` on. Each live index then gets its block added (`_scan`
  keeps it less its block; lane_rows: the blocks of `_scan`'s row layout).
  """
  lengths = list_lengths(levels)
  lane = _iota((SUBLANES, LANES), 1)
  for u in range(UNITS):
    block = (_iota((SUBLANES, LANES), 0) if lane_rows else u) * LANES + lane
    vals = tuple(lv[l * UNITS + u] for l in range(levels))
    idx = tuple(li[l * UNITS + u] for l in range(levels))
    at = levels
    for p in range(1, len(AHEAD)):
      for i in range(lengths[p]):
        v, vi = lv[(at + i) * UNITS + u], li[(at + i) * UNITS + u]
        skip = _merge_skip(p, i)
        beats = [None] * skip + [_before(v, vi, vals[l], idx[l])
                                 for l in range(skip, levels)]
        vals, idx = _shift_in(vals, idx, v, vi, beats, skip)
      at += lengths[p]
    for l in range(levels):
      lv[l * UNITS + u] = vals[l]
      li[l * UNITS + u] = jnp.where(idx[l] == _NO_INDEX, idx[l],
                                    idx[l] + block)


def _rows_to_units(lv, li, levels: int):
  """The lane-rows pass's levels (row t's level l at l * 8 + t, sublane u:
  blocks u * 128 + lane) in the finish's layout (unit u's at l * 8 + u,
  sublane t: row t)."""
  for ref in (lv, li):
    for l in range(levels):
      group = pl.ds(l * UNITS, UNITS)
      ref[group] = jnp.swapaxes(ref[group], 0, 1)


# -- the finish: each step a loop over vregs of VMEM, so its program hardly
# grows with k.

_CHUNK = 8  # vregs a loop step of `_round` holds (`_bitonic`: twice as many)
_LANE_BITS = 7  # log2(LANES): a move's bits that `_round` spends
_UNROLL = 4  # loop steps a trip of `_round` (they overlap: fewer bundles)
RADIX_BITS = 4  # bits of the bound a round of `_kth` finds
COMPACT_PATHS = 3  # candidate counts a block may hold that compact alone


def _total(masks):
  """How many of the masks' entries are set, a row: f32[8, 1]."""
  terms = [jnp.where(m, 1.0, 0.0) for m in masks]
  while len(terms) > 1:  # a tree: no long chain of dependent adds
    terms = [a + b for a, b in zip(terms[::2], terms[1::2])] + (
        [terms[-1]] if len(terms) % 2 else [])
  return jnp.sum(terms[0], axis=1, keepdims=True)


def _before(ka, ia, kb, ib):
  """Where (key a, index a) ranks before (key b, index b)."""
  return (ka > kb) | ((ka == kb) & (ia < ib))


def _kth(keys, idx, k: int, idx_bits: int):
  """The (key, index) of the k-th best of the entries, i32[8, 1] each,
  `RADIX_BITS` bits a round from the highest (the first round the bits
  left over): the key's, then the index's among the entries of that key.
  A round counts, a row, the entries at or past each way to extend the
  bits so far (2**RADIX_BITS - 1 counts, each a cross-lane sum); its digit
  is how many of them reach k. The sums of a round do not wait on each
  other, so a round waits for the cross-lane unit once, where a bit at a
  time waited once a bit."""
  sign = jnp.int32(-2**31)

  def rounds(bits, digit):  # digit(ans, shift, width) -> i32[8, 1]
    first = bits % RADIX_BITS or RADIX_BITS
    shift = bits - first
    ans = lax.shift_left(digit(jnp.zeros((SUBLANES, 1), jnp.int32), shift,
                               first), shift)

    def step(r, ans):  # the digit at shift - RADIX_BITS * (r + 1)
      at = shift - RADIX_BITS * (r + 1)
      return ans | lax.shift_left(digit(ans, at, RADIX_BITS), at)
    return lax.fori_loop(0, shift // RADIX_BITS, step, ans)

  def extend(ans, shift, width):  # ans with each nonzero digit at shift
    return [ans | lax.shift_left(jnp.int32(d), shift)
            for d in range(1, 1 << width)]

  def key_digit(ans, shift, width):  # ans: the key's bits, sign bit flipped
    found = [_total([kk >= (c ^ sign) for kk in keys])
             for c in extend(ans, shift, width)]
    return sum(jnp.where(f >= k, 1, 0) for f in found)

  key = rounds(32, key_digit) ^ sign
  need = k - _total([kk > key for kk in keys])
  ties = [kk == key for kk in keys]

  def index_digit(ans, shift, width):  # the largest with fewer than `need` below
    below = [_total([t & (ii < c) for t, ii in zip(ties, idx)])
             for c in extend(ans, shift, width)]
    return sum(jnp.where(b < need, 1, 0) for b in below)

  def last_tie():  # each row needs all its entries of that key: the last
    return jnp.max(functools.reduce(jnp.maximum, [
        jnp.where(t, ii, -1) for t, ii in zip(ties, idx)]), axis=1,
                   keepdims=True)

  # The search over the indices only where a row holds more entries of the
  # key than it needs (ties; rare where scores are distinct).
  return key, lax.cond(jnp.any(_total(ties) > need),
                       lambda: rounds(idx_bits, index_digit), last_tie)


def _move_bits(candidate_vregs: int, width: int) -> int:
  """Bits of a move in `_compact`: positions up to max(candidates, slots)."""
  return max(1, (max(candidate_vregs, width) * LANES - 1).bit_length())


def _loop(n: int, body, carry=0):
  """`body(v, carry)` for v in [0, n), unrolled by 8 where 8 divides n."""
  return lax.fori_loop(0, n, body, carry, unroll=8 if n % 8 == 0 else 1)


def _iota(shape, axis):
  return lax.broadcasted_iota(jnp.int32, shape, axis)


def _mark(lv, li, ck, cw, key, index, n: int):
  """Candidate vreg v in [0, n): its order key to ck[v], whether it ranks
  at or before the bound (key, index) to cw[v]."""

  def body(v, c):
    kk = _key(lv[v])
    ck[v] = kk
    cw[v] = jnp.where((kk > _DEAD) & ~_before(key, index, kk, li[v]), 1, 0)
    return c

  _loop(n, body)


def _compact(li, bufs, n: int, width: int):
  """The live entries of vregs [0, n) of bufs[0] (keys, words: 1 where
  live; position v * 128 + l: vreg v, lane l) moved, in order, to the first
  positions. bufs: two pairs of (key, word) buffers i32[N + 8, 8, 128]
  (`finish_scratch`). Returns how many are live a row, i32[8, 1]; the pair
  `bufs[_slots_pair(width)]` holds their keys and indices in its first
  `width` vregs, -inf's key and `_NO_INDEX` past them.

  Each one's move is its position less its slot (the exclusive prefix count
  of the live), in rounds, the move's lowest bit first, so no two ever meet.
  Its word (the index's high bits, index // 1024; a live bit; the move)
  moves lanes first (`_round`, bits 1 .. 64); then its key is fetched from
  where it started (`_fetch`), the pair moves whole vregs by the bits below
  128 * spread (`_vreg_round`; none where the slots are one chunk of 8
  vregs), and each slot vreg takes, lane by lane, the one entry bound for
  it (`_gather`), its index's low bits (the block) following from where it
  started: slot + move."""
  (ck, cw), lane = bufs[0], _iota((SUBLANES, LANES), 1)
  sb = _move_bits(n, width)
  alive = 1 << sb
  # The prefix counts on the MXU: [live of every vreg] @ [j <= i | 1]
  # gives each lane the live at or before it in its vreg, and the vreg's
  # total (0 and 1 in bf16, summed in f32: exact), held in the other pair
  # of buffers until the first round.
  ones = jnp.where(cw[0:n] != 0, 1.0, 0.0).reshape(n * SUBLANES, LANES)
  row, col = _iota((LANES, 2 * LANES), 0), _iota((LANES, 2 * LANES), 1)
  tri = jnp.where((row <= col) | (col >= LANES), 1.0, 0.0)
  counts = jnp.dot(ones.astype(jnp.bfloat16), tri.astype(jnp.bfloat16),
                   preferred_element_type=jnp.float32).astype(jnp.int32)
  incl, tot = bufs[1]
  incl[0:n] = counts[:, :LANES].reshape(n, SUBLANES, LANES)
  tot[0:n] = counts[:, LANES:].reshape(n, SUBLANES, LANES)

  def word(v, before):  # before: the live in earlier vregs
    m = cw[v] != 0
    move = v * LANES + lane - (before + incl[v] - jnp.where(m, 1, 0))
    high = (li[v] >> _BLOCK_BITS) << (sb + 1)
    cw[v] = jnp.where(m, high | alive | move, 0)
    return before + tot[v]

  total = _loop(n, word, jnp.zeros((SUBLANES, LANES), jnp.int32))[:, :1]
  words = [bufs[0][1], bufs[1][1]]
  for ref in words:  # the rounds read vregs past n
    ref[pl.ds(n, _CHUNK)] = jnp.zeros((_CHUNK, SUBLANES, LANES), jnp.int32)
  for b in range(_LANE_BITS):
    _round(words[b % 2], words[1 - b % 2], b, n)
  _fetch(ck, words[1], bufs[1][0], n)
  spread = _spread(width)
  for r in range(spread.bit_length() - 1):
    _vreg_round(bufs[1 - r % 2], bufs[r % 2], r, n)
  out = _slots_pair(width)
  _gather(bufs[1 - out], bufs[out], n, width, sb, spread)
  return total


def _spread(width: int) -> int:
  """Vregs `_gather` strides over: a chunk's where the slots are wider."""
  return _CHUNK if width > _CHUNK else 1


def _slots_pair(width: int) -> int:
  """The pair of `_compact`'s bufs its slots end in (one per vreg round)."""
  return (_spread(width).bit_length() - 1) % 2


def _live_levels(cw, keep: int):
  """The most candidates any block of the 8 rows holds at or before the
  bound (marks cw, `_mark`), a scalar: a block's levels are in order, so
  its marked ones are its first, and no level past that many holds one."""
  per_unit = [functools.reduce(jnp.add, [cw[l * UNITS + u] for l in range(keep)])
              for u in range(UNITS)]
  return jnp.max(functools.reduce(jnp.maximum, per_unit))


def _compact_live(li, bufs, keep: int, width: int):
  """`_compact` over the vregs of the levels that hold a candidate
  (`_live_levels`), rounded up to one of the last `COMPACT_PATHS` counts
  (each its own compiled path: the loops keep their static trips): the
  compaction's work (its cross-lane moves most) is in proportion to the
  vregs it reads. Returns (the pair holding the slots, how many are live
  a row)."""
  counts = list(range(max(1, keep - COMPACT_PATHS + 1), keep + 1))
  live = _live_levels(bufs[0][1], keep)
  path = sum(jnp.where(live > c, 1, 0) for c in counts[:-1])
  total = lax.switch(path, [functools.partial(_compact, li, bufs, c * UNITS,
                                              width) for c in counts])
  return bufs[_slots_pair(width)], total


def _fetch(keys, sw, dk, n: int):
  """The keys of the entries of words sw after `_round` (each a whole
  number of vregs from its slot now), fetched from where they started in
  keys (lanes l + its lane move, of vreg v or v + 1: two lane gathers) to
  dk[0:n] (dead: any key)."""
  lane = _iota((1, SUBLANES, LANES), 2)

  def body(v, c):
    at = lane + (sw[pl.ds(v, 1)] & (LANES - 1))
    src = at & (LANES - 1)
    dk[pl.ds(v, 1)] = jnp.where(at < LANES, _lane_gather(keys[pl.ds(v, 1)], src),
                                _lane_gather(keys[pl.ds(v + 1, 1)], src))
    return c

  _loop(n, body)


def _vreg_round(src, dst, r: int, n: int):
  """Move bit 128 * 2**r of `_compact` (after `_round`): vreg v of dst
  takes vreg v + 2**r of src where its entry moves by that bit, and is
  empty where its own entry does (src: vregs [n, n + 8) empty words)."""
  (sk, sw), (dk, dw) = src, dst
  bit, m = LANES << r, 1 << r

  def step(c, carry):
    v = pl.multiple_of(c * _CHUNK, _CHUNK)
    a, here = pl.ds(v + m, _CHUNK), pl.ds(v, _CHUNK)
    tw, w = sw[a], sw[here]
    take = (tw & bit) != 0  # a dead word (0) never moves
    dk[here] = jnp.where(take, sk[a], sk[here])
    dw[here] = jnp.where(take, tw, jnp.where((w & bit) != 0, 0, w))
    return carry

  lax.fori_loop(0, n // _CHUNK, step, 0, unroll=_UNROLL)


def _gather(src, dst, n: int, width: int, sb: int, spread: int):
  """The last step of `_compact`: slot vreg w of dst (w < width) takes, lane
  by lane, the entry of src's vregs w, w + spread, ... (< n) whose move
  (its word's bits from 128 * spread to 2**sb; the lower ones are spent)
  leads to vreg w, at most one (the slots are distinct), and decodes it:
  its key and index, or -inf's key and `_NO_INDEX` where none is live. 8
  slot vregs a loop over src, in registers: source v serves those of them
  congruent to it mod spread."""
  (sk, sw), (dk, dw) = src, dst
  alive = 1 << sb
  lane = _iota((SUBLANES, LANES), 1)
  shift = _LANE_BITS + spread.bit_length() - 1
  for w0 in range(0, width, _CHUNK):
    g = min(_CHUNK, width - w0)

    def body(q, acc, w0=w0, g=g):
      ks, ws = list(acc[0]), list(acc[1])
      for i in range(spread):
        v = w0 + q * spread + i
        k, w = sk[v], sw[v]
        to = v - (((w & (alive - 1)) >> shift) * spread)  # slot vreg (dead: v)
        for j in range(i, g, spread):
          m = to == w0 + j
          ks[j], ws[j] = jnp.where(m, k, ks[j]), jnp.where(m, w, ws[j])
      return tuple(ks), tuple(ws)

    empty = (tuple(jnp.full((SUBLANES, LANES), _DEAD, jnp.int32)
                   for _ in range(g)),
             tuple(jnp.zeros((SUBLANES, LANES), jnp.int32) for _ in range(g)))
    trips = -(-(n - w0) // spread) if w0 < n else 0
    ks, ws = (lax.fori_loop(0, trips, body, empty, unroll=math.gcd(trips, 8))
              if trips else empty)
    for j in range(g):
      w, v = ws[j], w0 + j
      start = v * LANES + lane + (w & (alive - 1))  # where it came from
      block = start & (BLOCKS - 1)  # position mod 1,024: unit * 128 + lane
      live = (w & alive) != 0
      dk[v] = jnp.where(live, ks[j], _DEAD)
      dw[v] = jnp.where(live, ((w >> (sb + 1)) << _BLOCK_BITS) | block,
                        _NO_INDEX)


def _round(sw, dw, b: int, n: int):
  """Round b < 7 of `_compact`, on the words: position p of dw takes
  position p + 2**b of sw where that one moves by bit b, and is empty where
  its own entry moves; 8 vregs a loop step over [0, n) (sw: vreg n empty).
  Vreg v takes lanes l + 2**b, and the lanes past 128 from vreg v + 1 (each
  vreg rolled by 128 - 2**b once: lane l holds lane l + 2**b)."""
  bit = 1 << b
  hi = _iota((1, SUBLANES, LANES), 2) >= LANES - bit

  def roll(x):
    return pltpu.roll(x, LANES - bit, 2)

  def step(c, first):  # first: vreg v of sw, rolled
    v = pl.multiple_of(c * _CHUNK, _CHUNK)
    rw = roll(sw[pl.ds(v + 1, _CHUNK)])  # vregs v + 1 ... v + 8
    tw = jnp.where(hi, rw, jnp.concatenate([first, rw[:-1]]))
    w = sw[pl.ds(v, _CHUNK)]
    take = (tw & bit) != 0  # a dead word (0) never moves
    dw[pl.ds(v, _CHUNK)] = jnp.where(take, tw, jnp.where((w & bit) != 0, 0, w))
    return rw[-1:]

  lax.fori_loop(0, n // _CHUNK, step, roll(sw[0:1]), unroll=_UNROLL)


def _lane_gather(x, lanes):
  """x[c, s, lanes[c, s, l]] of [ch, 8, 128] arrays (one vreg's as a 2-D
  gather: Mosaic takes no [1, 8, 128] one)."""
  if x.shape[0] == 1:
    return jnp.take_along_axis(x[0], lanes[0], 1,
                               mode="promise_in_bounds")[None]
  return jnp.take_along_axis(x, lanes, 2, mode="promise_in_bounds")


def _bitonic(sk, si, nv: int):
  """Sorts the entries of sk[0:nv], si[0:nv] (i32[8, 128] vregs of VMEM) by key
  descending, index ascending, each row: a bitonic network whose position p is
  lane p // nv of vreg p % nv (rank r lands there). Per stage (runs of `size`
  positions sorted, a static loop), from the farthest partners down: those >= nv
  apart are in one vreg, d / nv lanes apart (a loop over them, each a lane
  gather of lane l ^ d / nv); those < nv apart are vregs apart, compared and
  selected whole. The vregs go through registers in chunks of up to 16, all
  stages at once when one chunk holds them."""
  ch = min(2 * _CHUNK, nv)
  shape = (ch, SUBLANES, LANES)
  lane = _iota(shape, 2)

  def descending(v, size):  # where the run of `size` sorts reversed
    return ((lane * nv + v + _iota(shape, 0)) & size) != 0

  def exchange(ka, ia, kb, ib, flip):  # (a, b) in order, reversed on flip
    first = _before(ka, ia, kb, ib) ^ flip
    return (jnp.where(first, ka, kb), jnp.where(first, ia, ib),
            jnp.where(first, kb, ka), jnp.where(first, ib, ia))

  def lanes(v, ks, is_, size):  # partners d >= nv apart: d / nv lanes
    def step(t, c):
      k_, i_ = c
      e = lax.shift_right_logical(jnp.int32(size // 2 // nv), t)
      partner = lane ^ e
      pk, pi = _lane_gather(k_, partner), _lane_gather(i_, partner)
      keep = ~(_before(k_, i_, pk, pi) ^ ((lane & e) == 0)
               ^ descending(v, size))
      return jnp.where(keep, k_, pk), jnp.where(keep, i_, pi)

    steps = (size // 2 // nv).bit_length()
    return lax.fori_loop(0, steps, step, (ks, is_)) if steps else (ks, is_)

  def near(v, ks, is_, size):  # partners d < min(size, ch) vregs apart
    flip = descending(v, size)
    ks, is_ = [ks[j] for j in range(ch)], [is_[j] for j in range(ch)]
    d = min(size, ch) // 2
    while d:
      for j in range(ch):
        if not j & d:
          ks[j], is_[j], ks[j + d], is_[j + d] = exchange(
              ks[j], is_[j], ks[j + d], is_[j + d], flip[j])
      d //= 2
    return jnp.stack(ks), jnp.stack(is_)

  def passes(stages):  # [(size, what)] in registers, chunk by chunk
    def body(v):
      ks, is_ = sk[pl.ds(v, ch)], si[pl.ds(v, ch)]
      for size, what in stages:
        ks, is_ = what(v, ks, is_, size)
      sk[pl.ds(v, ch)], si[pl.ds(v, ch)] = ks, is_

    if nv == ch:
      body(0)
    else:
      _loop(nv // ch, lambda c, x: body(pl.multiple_of(c * ch, ch)) or x)

  todo = []
  for s in range(1, (nv * LANES).bit_length()):
    size = 1 << s
    todo += [(size, lanes)]
    if min(size, nv) // 2 >= ch:  # partners >= ch vregs apart: two chunks
      passes(todo)
      todo = []
      d = min(size, nv) // 2
      while d >= ch:
        for c in range(nv // (2 * ch)):
          v = (c * ch // d) * 2 * d + c * ch % d
          a, b = pl.ds(v, ch), pl.ds(v + d, ch)
          sk[a], si[a], sk[b], si[b] = exchange(
              sk[a], si[a], sk[b], si[b], descending(v, size))
        d //= 2
    todo += [(size, near)]
  passes(todo)


def _winners(sk, si, k: int, nv: int):
  """The first k ranks of `_bitonic`'s order (rank r: lane r // nv of vreg r
  % nv): their indices (-1: empty) as k / 128 vregs, and the k-th's key and
  index, i32[8, 1] each."""
  lane = _iota((SUBLANES, LANES), 1)
  out = []
  for o in range(-(-k // LANES)):
    rank = o * LANES + lane
    first = o * LANES % nv  # the vregs [first, first + min(nv, 128))

    def take(t, got, rank=rank, first=first):
      v = first + t
      g = jnp.take_along_axis(jnp.where(sk[v] > _DEAD, si[v], -1), rank // nv,
                              1, mode="promise_in_bounds")
      return jnp.where(rank % nv == v, g, got)

    out.append(_loop(min(nv, LANES), take,
                     jnp.full((SUBLANES, LANES), -1, jnp.int32)))
  v, l = (k - 1) % nv, (k - 1) // nv
  return out, sk[v][:, l:l + 1], si[v][:, l:l + 1]


def _finish(lv, li, out_ref, flag_ref, k0, w0, k1, w1, *, keep, k,
            idx_bits, ablate=frozenset()):
  """The k winners of 8 rows from their levels: out_ref i32[8, k rounded up
  to 128], flag_ref i32[8, 128] (1: the row's check failed). ablate:
  `FINISH_ABLATIONS` left out (its winners are then not the rule's)."""
  n = keep * UNITS
  width = capacity(k) // LANES
  bound = bound_levels(k, keep) * UNITS
  if "bound" in ablate:  # -inf's key, no index: every live one before it
    key = jnp.full((SUBLANES, 1), _DEAD, jnp.int32)
    index = jnp.full((SUBLANES, 1), _NO_INDEX, jnp.int32)
  else:
    key, index = _kth([_key(lv[v]) for v in range(bound)],
                      [li[v] for v in range(bound)], k, idx_bits)
  if "compact" in ablate:
    (ck, cw), total = (k0, w0), jnp.zeros((SUBLANES, 1), jnp.int32)
  else:
    _mark(lv, li, k0, w0, key, index, n)
    (ck, cw), total = _compact_live(li, ((k0, w0), (k1, w1)), keep, width)
  if "sort" not in ablate:
    _bitonic(ck, cw, width)
  out, kth_key, kth_idx = _winners(ck, cw, k, width)
  for o, got in enumerate(out):
    out_ref[:, o * LANES:(o + 1) * LANES] = got
  dropped = _total([_before(_key(lv[n + u]), li[n + u], kth_key,
                            kth_idx) for u in range(UNITS)])
  bad = (dropped > 0) | (total > width * LANES)
  flag_ref[...] = jnp.broadcast_to(jnp.where(bad, 1, 0), (SUBLANES, LANES))


def finish_scratch(keep: int, k: int) -> list:
  """The finish's VMEM scratch: two pairs of key and word buffers, i32[N,
  8, 128] each (N: the candidate vregs and 8 more, or the capacity's)."""
  big = max(keep * UNITS + _CHUNK, capacity(k) // LANES)
  return [pltpu.VMEM((big, SUBLANES, LANES), jnp.int32)] * 4


def _key(v):
  """The order key of kept values, -0.0 and subnormals as 0."""
  return base.order_key(jnp.where(jnp.abs(v) < _TINY, 0.0, v))


def _levels(lv, li, vals_ref, idx_ref):
  """The levels themselves (`block_candidates`), lv and li's first."""
  vals_ref[...] = lv[0:vals_ref.shape[0]]
  idx_ref[...] = li[0:idx_ref.shape[0]]


# -- the kernel ---------------------------------------------------------------


def _kernel(x_hbm, *refs, keep, tile, tiles, finish, outputs, lane_rows,
            ahead, ablate=frozenset()):
  """Grid step g: rows [8g, 8g + 8) of x_hbm f32[T, N] (lane_rows: f32[T,
  W / 128, 128], its first tiles * tile entries read). refs: the outputs in
  HBM, then the scratch: buf (two tiles), its DMA semaphores, the levels lv,
  li (the lists, `_scan`; after `_merge`, the levels first), each
  output's block in VMEM, their semaphores, the finish's scratch. ahead:
  the grid runs in order on one core, and its last tile's step starts the
  next step's first tile, which lands under the merge and finish (tile i
  of the grid's in buffer i % 2); else each step starts its own. ablate
  (`PASS_ABLATIONS`): the tiles' DMAs and waits ("dma") or the pass's work on
  them ("scan") left out, to time the rest on a chip."""
  out_hbm, (buf, sem, lv, li) = refs[:outputs], refs[outputs:outputs + 4]
  out_vmem = refs[outputs + 4:2 * outputs + 4]
  out_sem, extra = refs[2 * outputs + 4], refs[2 * outputs + 5:]
  g = pl.program_id(0)
  chunk = chunk_for(tile)
  chunks = tile // chunk

  def start(group, b, slot):  # tile b of rows [8 group, 8 group + 8)
    rows = pl.ds(pl.multiple_of(group * SUBLANES, SUBLANES), SUBLANES)
    w = chunk // LANES if lane_rows else chunk  # a DMA's columns of x_hbm
    for c in range(chunks):
      pltpu.make_async_copy(
          x_hbm.at[rows, pl.ds(pl.multiple_of((b * chunks + c) * w, w), w)],
          buf.at[slot, c], sem.at[slot]).start()

  dma = "dma" not in ablate
  first = (g * tiles) % 2 if ahead else 0  # this step's first tile's buffer
  if dma and ahead:
    pl.when(g == 0)(lambda: start(0, 0, 0))
  elif dma:
    start(g, 0, 0)

  def step(b, carry):  # b: 0 (the first tile, its lists empty) or traced
    slot = (first + b) % 2
    if tiles > 1 and dma:
      pl.when(b + 1 < tiles)(lambda: start(g, b + 1, 1 - slot))
    if ahead and dma:  # the next step's first, into the buffer read before
      pl.when(jnp.logical_and(b + 1 == tiles, g + 1 < pl.num_programs(0)))(
          lambda: start(g + 1, 0, 1 - slot))
    if dma:  # one wait covers the tile's DMAs: they signal one semaphore
      pltpu.make_async_copy(buf.at[slot], buf.at[slot], sem.at[slot]).wait()
    if "scan" not in ablate:
      _scan(buf.at[slot], lv, li, b * tile, levels=keep + 1, chunks=chunks,
            chunk=chunk, lane_rows=lane_rows, empty=isinstance(b, int))
    return carry

  step(0, 0)  # its lists start empty in registers: lv, li unread, no fill
  lax.fori_loop(1, tiles, step, 0)
  _merge(lv, li, keep + 1, lane_rows)
  if lane_rows:
    _rows_to_units(lv, li, keep + 1)
  finish(lv, li, *out_vmem, *extra)
  sends = [pltpu.make_async_copy(v, h.at[g], out_sem.at[i])
           for i, (v, h) in enumerate(zip(out_vmem, out_hbm))]
  for cp in sends:
    cp.start()
  for cp in sends:
    cp.wait()


def kernel_call(scores, k: int, keep: int, tile: int, finish: bool,
          entries: int | None = None, ablate=frozenset()):
  """The kernel over scores f32[T, N] (or f32[T, W / 128, 128], taken as it
  is, its first N = `entries` read: `reads_lane_rows`): [G, ...] per output
  (G = T / 8 rounded up): the winners and flags, or (finish False) the
  levels; ablate: `ABLATIONS` left out, `PASS_ABLATIONS` without the
  finish, `FINISH_ABLATIONS` with it (the outputs are then not the pass's
  levels, not the rule's winners)."""
  if not set(ablate) <= set(FINISH_ABLATIONS if finish else PASS_ABLATIONS):
    raise ValueError(f"ablate: a subset of {PASS_ABLATIONS} without the "
                     f"finish, of {FINISH_ABLATIONS} with it (got "
                     f"{sorted(ablate)}, finish {finish})")
  t, n = scores.shape[0], entries or _entries(scores)
  tiles = -(-n // tile)
  groups = -(-t // SUBLANES)
  lane_rows = scores.ndim == 3
  x = scores.astype(jnp.float32)
  if not lane_rows:  # (lane rows: whole groups and tiles, nothing to pad)
    x = jnp.pad(x, ((0, groups * SUBLANES - t), (0, tiles * tile - n)),
                constant_values=base.NEG_INF)
  levels = keep + 1
  chunk = chunk_for(tile)
  buf = (chunk // LANES, LANES) if lane_rows else (chunk,)
  if finish:
    idx_bits = max(1, (tiles * tile - 1).bit_length())
    fin = functools.partial(_finish, keep=keep, k=k, idx_bits=idx_bits,
                            ablate=frozenset(ablate))
    blocks = [((SUBLANES, -(-k // LANES) * LANES), jnp.int32),
              ((SUBLANES, LANES), jnp.int32)]
    extra = finish_scratch(keep, k)
  else:
    fin, extra = _levels, []
    blocks = [((levels * UNITS, SUBLANES, LANES), dt)
              for dt in (jnp.float32, jnp.int32)]
  hbm = pl.BlockSpec(memory_space=pltpu.HBM)
  interpret = modes.resolve_interpret()
  ahead = (interpret is not False
           or modes.current_generation() in PREFETCH_CHIPS)
  return pl.pallas_call(
      functools.partial(_kernel, keep=keep, tile=tile, tiles=tiles,
                        finish=fin, outputs=len(blocks), lane_rows=lane_rows,
                        ahead=ahead,
                        ablate=frozenset(ablate) & set(PASS_ABLATIONS)),
      grid=(groups,),
      in_specs=[hbm],
      out_specs=[hbm] * len(blocks),
      out_shape=[jax.ShapeDtypeStruct((groups, *shape), dt)
                 for shape, dt in blocks],
      scratch_shapes=[
          pltpu.VMEM((2, tile // chunk, SUBLANES, *buf), jnp.float32),
          pltpu.SemaphoreType.DMA((2,)),
          *[pltpu.VMEM((sum(list_lengths(levels)) * UNITS, SUBLANES, LANES),
                       dt) for dt in (jnp.float32, jnp.int32)],
          *[pltpu.VMEM(shape, dt) for shape, dt in blocks],
          pltpu.SemaphoreType.DMA((len(blocks),)), *extra],
      compiler_params=pltpu.CompilerParams(
          dimension_semantics=("arbitrary" if ahead else "parallel",)),
      interpret=interpret,
      name=(f"StreamIdxSelectBlocktop-keep_{keep}-tile_{tile}-k_{k}" if finish
            else f"StreamIdxBlocktopLevels-keep_{keep}-tile_{tile}"),
  )(x)


def block_candidates(scores, *, keep: int, tile: int):
  """The pass alone over scores f32[T, N]: (values f32[T, keep * 1024],
  indices, dropped values f32[T, 1024], dropped indices); column j * 1024 +
  p: the j-th best entry of block p (-inf, 2**31 - 1 where none)."""
  t = scores.shape[0]
  vals, idx = kernel_call(scores, 1, keep, tile, finish=False)

  def rows(a):  # [G, levels * 8 units, 8 rows, 128] -> [T, levels * 1024]
    g = a.shape[0]
    a = a.reshape(g, keep + 1, UNITS, SUBLANES, LANES).transpose(0, 3, 1, 2, 4)
    return a.reshape(g * SUBLANES, -1)[:t]

  vals, idx = base.canonical_zero(rows(vals)), rows(idx)
  cut = keep * BLOCKS
  return vals[:, :cut], idx[:, :cut], vals[:, cut:], idx[:, cut:]


def _entries(scores) -> int:
  """N of scores f32[T, N] or f32[T, N / 128, 128]."""
  return scores.shape[1] * (LANES if scores.ndim == 3 else 1)


def reads_lane_rows(rows: int, entries: int, k: int) -> bool:
  """Whether `select` (default options) takes the scoring kernels' buffer
  f32[rows, entries / 128, 128] as it is: whole groups of 8 rows, whole
  tiles of entries (nothing to pad: a pad would be the copy it saves), at
  least k entries."""
  return (rows % SUBLANES == 0 and entries >= k and entries % LANES == 0
          and entries % tile_for(entries) == 0)


def plan(n: int, k: int, keep: int | None = None,
         tile: int | None = None) -> tuple[int, int]:
  """(keep, tile) for rows of n entries, checked: at least k candidates."""
  tile = tile or tile_for(n)
  keep = keep or keep_for(n, k)
  if BLOCKS * keep < k:
    raise ValueError(f"keep: {keep} candidates in each of the {BLOCKS} "
                     f"blocks are fewer than k ({k})")
  # A moving entry's word: index // 1024, a live bit and its move (31 bits).
  vregs = -(-(-(-n // tile) * tile) // BLOCKS)
  if (vregs - 1).bit_length() + 1 + _move_bits(keep * UNITS,
                                               capacity(k) // LANES) > 31:
    raise ValueError(f"scores: rows of {n} entries with keep {keep} and k "
                     f"{k} do not fit blocktop's 31-bit word")
  return keep, tile


def block_select(scores, k: int, *, keep: int, tile: int,
                 entries: int | None = None):
  """The kernel: (winners i32[T, k], whether the row's check failed
  bool[T]); entries: of the kernels' f32[T, W / 128, 128], as `select`."""
  t = scores.shape[0]
  winners, flag = kernel_call(scores, k, keep, tile, finish=True, entries=entries)
  winners = winners.reshape(-1, winners.shape[-1])
  return winners[:t, :k], flag.reshape(-1, LANES)[:t, 0] != 0


def select(scores, k, extra=None, *, keep=None, tile=None, entries=None):
  """The k best of scores f32[T, N >= k] (or of the first N = `entries` of
  each row of the kernels' f32[T, W / 128, 128] where `reads_lane_rows`;
  None: N = W): i32[T, k] (module docstring)."""
  del extra
  n = entries or _entries(scores)
  keep, tile = plan(n, k, keep, tile)
  if scores.ndim == 3 and not (reads_lane_rows(scores.shape[0], n, k)
                               and n % tile == 0 and n <= _entries(scores)):
    raise ValueError(f"scores: f32[T, W / 128, 128] needs whole groups of "
                     f"{SUBLANES} rows and tiles of entries, at most W "
                     f"(`reads_lane_rows`; got shape {scores.shape}, entries "
                     f"{n}, tile {tile})")
  if scores.shape[0] == 0:  # no row: no kernel (its grid would be empty)
    return jnp.zeros((0, k), jnp.int32)
  winners, bad = block_select(scores, k, keep=keep, tile=tile, entries=n)
  return fallback(scores, k, winners, bad, n)


def fallback(scores, k, winners, bad, entries=None):
  """`winners` i32[T, k] with each row flagged in `bad` bool[T] selected
  again by `base.sort_top_k` (one two-key sort of the row's first
  `entries`, None: all; it orders every tie, so no tie check compiles
  beside it), those rows alone (`base.again`: `base.AGAIN_ROWS` a loop
  trip, none where no row is flagged)."""
  def redo(rows):
    x = scores[rows]
    return base.sort_top_k(x.reshape(x.shape[0], -1)[:, :entries], k)

  return base.again(winners, bad, redo)


def cost(rows, entries, k, *, keep=None, tile=None):
  t, n = rows, entries
  keep, tile = plan(n, k, keep, tile)
  cap = capacity(k)
  return base.TopkCost(
      "blocktop", t * n * base.F32, t * k * base.I32, 1,
      t * base.sort_work(cap), t * n * pass_ops(keep + 1),
      f"one pass keeping {keep} of each of {BLOCKS} blocks of "
      f"{-(-n // BLOCKS)} entries; in the kernel, a bitonic sort of the "
      f"{cap} best-placed of its {keep * BLOCKS} candidates a row")


METHOD = base.Method(
    name="blocktop", exact=True, select=select, cost=cost,
    doc="a Pallas kernel keeping each block's best entries and sorting the "
    "candidates that can win (a two-key sort of the row where its check fails)",
    lane_rows=reads_lane_rows,
    options=(base.Option("keep",
                         "candidates kept per block (default `keep_for`)"),
             base.Option("tile", "entries of a row per tile, a multiple of "
                         "1,024 (default `tile_for(N)`)", rule=_whole_vregs)))
