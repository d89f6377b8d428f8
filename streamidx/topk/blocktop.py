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


def _insert(vals, idx, v, vi):
  """Sorted levels (f32 and i32 [8, 128] each) with one more vreg of entries
  inserted (higher indices than every kept one: it loses every tie)."""
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


def _scan(buf, lv, li, first, *, levels: int, chunks: int, chunk: int,
          lane_rows: bool):
  """Inserts a tile of 8 rows from entry `first` into the levels lv, li
  ([levels * 8, 8, 128]), in index order. buf: f32[chunks, 8, chunk], level
  l of unit u (blocks u * 128 + lane of the 8 rows) at l * 8 + u; or
  (lane_rows) f32[chunks, 8, chunk / 128, 128], level l of row u (its
  blocks sublane * 128 + lane) at l * 8 + u (`_rows_to_units`)."""
  lane = _iota((SUBLANES, LANES), 1)
  block = _iota((SUBLANES, LANES), 0) * LANES + lane
  for u in range(UNITS):
    def body(c, carry, u=u):
      vals, idx = carry
      for j in range(chunk // BLOCKS):  # static: 8 inserts interleave
        if lane_rows:  # row u's entries j * 1024 + block
          v, at = buf[c, u, j * SUBLANES:(j + 1) * SUBLANES, :], block
        else:  # the 8 rows' entries j * 1024 + u * 128 + lane
          col = j * BLOCKS + u * LANES
          v, at = buf[c, :, col:col + LANES], u * LANES + lane
        v = v + 0.0  # -0.0 -> +0.0; flushes subnormals
        vals, idx = _insert(vals, idx, v, first + c * chunk + j * BLOCKS + at)
      return vals, idx
    init = (tuple(lv[l * UNITS + u] for l in range(levels)),
            tuple(li[l * UNITS + u] for l in range(levels)))
    vals, idx = lax.fori_loop(0, chunks, body, init)
    for l in range(levels):
      lv[l * UNITS + u] = vals[l]
      li[l * UNITS + u] = idx[l]


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
_UNROLL = 4  # loop steps a trip of `_round` (they overlap: fewer bundles)


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
  """The (key, index) of the k-th best of the entries, i32[8, 1] each, bit
  by bit: the key, then the index among the entries of that key."""
  sign = jnp.int32(-2**31)

  def key_bit(i, ans):  # ans: the key's bits so far, sign bit flipped
    cand = ans | lax.shift_left(jnp.int32(1), 31 - i)
    found = _total([kk >= (cand ^ sign) for kk in keys])
    return jnp.where(found >= k, cand, ans)

  zero = jnp.zeros((SUBLANES, 1), jnp.int32)
  key = lax.fori_loop(0, 32, key_bit, zero) ^ sign
  need = k - _total([kk > key for kk in keys])
  ties = [kk == key for kk in keys]

  def index_bit(i, ans):  # ans: the largest with fewer than `need` below
    cand = ans + lax.shift_left(jnp.int32(1), idx_bits - 1 - i)
    below = _total([t & (ii < cand) for t, ii in zip(ties, idx)])
    return jnp.where(below < need, cand, ans)

  return key, lax.fori_loop(0, idx_bits, index_bit, zero)


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
  positions. bufs: two pairs of (key, word) buffers i32[N + 9, 8, 128],
  empty from vreg n on. Returns (the pair now holding their keys and
  indices in its first `width` vregs, -inf's key and `_NO_INDEX` past them;
  how many are live a row, i32[8, 1]).

  Each one's move is its position less its slot (the exclusive prefix count
  of the live); it moves in rounds, the move's lowest bit first, so no two
  ever meet. What moves is its key and one word: the index's high bits
  (index // 1024; the low bits, its block, follow from where it started:
  slot + move), a live bit and the move. A round reads one pair of buffers
  and writes the other (`_round`)."""
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
  big = ck.shape[0] - _CHUNK - 1  # positions moved: vregs [0, big)
  for b in range(sb):
    _round(bufs[b % 2], bufs[1 - b % 2], b, big)
  ck, cw = bufs[sb % 2]

  def decode(v, c):
    w = cw[v]
    start = v * LANES + lane + (w & (alive - 1))  # where it came from
    block = start & (BLOCKS - 1)  # position mod 1,024: unit * 128 + lane
    live = (w & alive) != 0
    ck[v] = jnp.where(live, ck[v], _DEAD)
    cw[v] = jnp.where(live, ((w >> (sb + 1)) << _BLOCK_BITS) | block, _NO_INDEX)
    return c

  _loop(width, decode)
  return bufs[sb % 2], total


def _round(src, dst, b: int, big: int):
  """Round b of `_compact`: position p of dst takes position p + 2**b of
  src where that one moves by bit b, and is empty where its own entry
  moves; 8 vregs a loop step over [0, big) (src: empty vregs from `big`
  on). Bits 2**b = 128 m take vreg v + m; bits under 128 take vreg v,
  lanes l + 2**b, and the lanes past 128 from vreg v + 1 (each vreg rolled
  by 128 - 2**b once: lane l holds lane l + 2**b)."""
  (sk, sw), (dk, dw) = src, dst
  bit = 1 << b

  def merge(v, tk, tw):
    w = sw[pl.ds(v, _CHUNK)]
    take = (tw & bit) != 0  # a dead word (0) never moves
    dk[pl.ds(v, _CHUNK)] = jnp.where(take, tk, sk[pl.ds(v, _CHUNK)])
    dw[pl.ds(v, _CHUNK)] = jnp.where(take, tw, jnp.where((w & bit) != 0, 0, w))

  if bit >= LANES:
    def step(c, carry):
      v = pl.multiple_of(c * _CHUNK, _CHUNK)
      a = pl.ds(jnp.minimum(v + bit // LANES, big), _CHUNK)
      merge(v, sk[a], sw[a])
      return carry

    lax.fori_loop(0, big // _CHUNK, step, 0, unroll=_UNROLL)
    return

  hi = _iota((1, SUBLANES, LANES), 2) >= LANES - bit

  def roll(x):
    return pltpu.roll(x, LANES - bit, 2)

  def step(c, first):  # first: vregs v of sk and sw, rolled
    v = pl.multiple_of(c * _CHUNK, _CHUNK)
    nxt = pl.ds(v + 1, _CHUNK)
    rk, rw = roll(sk[nxt]), roll(sw[nxt])  # vregs v + 1 ... v + 8
    rk0 = jnp.concatenate([first[0], rk[:-1]])
    rw0 = jnp.concatenate([first[1], rw[:-1]])
    merge(v, jnp.where(hi, rk, rk0), jnp.where(hi, rw, rw0))
    return rk[-1:], rw[-1:]

  lax.fori_loop(0, big // _CHUNK, step, (roll(sk[0:1]), roll(sw[0:1])),
                unroll=_UNROLL)


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
            idx_bits):
  """The k winners of 8 rows from their levels: out_ref i32[8, k rounded up
  to 128], flag_ref i32[8, 128] (1: the row's check failed)."""
  n = keep * UNITS
  width = capacity(k) // LANES
  bound = bound_levels(k, keep) * UNITS
  key, index = _kth([_key(lv[v]) for v in range(bound)],
                    [li[v] for v in range(bound)], k, idx_bits)
  for ck, cw in ((k0, w0), (k1, w1)):  # empty past the candidates
    rest = pl.ds(n, ck.shape[0] - n)
    ck[rest] = jnp.full((ck.shape[0] - n, SUBLANES, LANES), _DEAD, jnp.int32)
    cw[rest] = jnp.zeros((ck.shape[0] - n, SUBLANES, LANES), jnp.int32)
  _mark(lv, li, k0, w0, key, index, n)
  (ck, cw), total = _compact(li, ((k0, w0), (k1, w1)), n, width)
  _bitonic(ck, cw, width)
  out, kth_key, kth_idx = _winners(ck, cw, k, width)
  for o, got in enumerate(out):
    out_ref[:, o * LANES:(o + 1) * LANES] = got
  dropped = _total([_before(_key(lv[n + u]), li[n + u], kth_key,
                            kth_idx) for u in range(UNITS)])
  bad = (dropped > 0) | (total > width * LANES)
  flag_ref[...] = jnp.broadcast_to(jnp.where(bad, 1, 0), (SUBLANES, LANES))


def finish_scratch(keep: int, k: int) -> list:
  """The finish's VMEM scratch: two pairs of key and word buffers, i32[N +
  9, 8, 128] each (N: the candidate or capacity vregs)."""
  big = max(keep * UNITS, capacity(k) // LANES) + _CHUNK + 1
  return [pltpu.VMEM((big, SUBLANES, LANES), jnp.int32)] * 4


def _key(v):
  """The order key of kept values, -0.0 and subnormals as 0."""
  return base.order_key(jnp.where(jnp.abs(v) < _TINY, 0.0, v))


def _levels(lv, li, vals_ref, idx_ref):
  """The levels themselves (`block_candidates`)."""
  vals_ref[...] = lv[...]
  idx_ref[...] = li[...]


# -- the kernel ---------------------------------------------------------------


def _kernel(x_hbm, *refs, keep, tile, tiles, finish, outputs, lane_rows):
  """Grid step g: rows [8g, 8g + 8) of x_hbm f32[T, N] (lane_rows: f32[T,
  W / 128, 128], its first tiles * tile entries read). refs: the outputs in
  HBM, then the scratch: buf (two tiles), its DMA semaphores, the levels lv,
  li, each output's block in VMEM, their semaphores, the finish's scratch."""
  out_hbm, (buf, sem, lv, li) = refs[:outputs], refs[outputs:outputs + 4]
  out_vmem = refs[outputs + 4:2 * outputs + 4]
  out_sem, extra = refs[2 * outputs + 4], refs[2 * outputs + 5:]
  g = pl.program_id(0)
  rows = pl.ds(pl.multiple_of(g * SUBLANES, SUBLANES), SUBLANES)
  chunk = chunk_for(tile)
  chunks = tile // chunk

  def copies(b, slot):
    w = chunk // LANES if lane_rows else chunk  # a DMA's columns of x_hbm
    return [pltpu.make_async_copy(
        x_hbm.at[rows, pl.ds(pl.multiple_of((b * chunks + c) * w, w), w)],
        buf.at[slot, c], sem.at[slot]) for c in range(chunks)]

  lv[...] = jnp.full(lv.shape, -jnp.inf, jnp.float32)
  li[...] = jnp.full(li.shape, _NO_INDEX, jnp.int32)
  for cp in copies(0, 0):
    cp.start()

  def step(b, carry):
    slot = b % 2
    if tiles > 1:
      @pl.when(b + 1 < tiles)
      def _():
        for cp in copies(b + 1, 1 - slot):
          cp.start()
    # one wait covers the tile's DMAs: they signal one semaphore
    pltpu.make_async_copy(buf.at[slot], buf.at[slot], sem.at[slot]).wait()
    _scan(buf.at[slot], lv, li, b * tile, levels=keep + 1, chunks=chunks,
          chunk=chunk, lane_rows=lane_rows)
    return carry

  lax.fori_loop(0, tiles, step, 0)
  if lane_rows:
    _rows_to_units(lv, li, keep + 1)
  finish(lv, li, *out_vmem, *extra)
  sends = [pltpu.make_async_copy(v, h.at[g], out_sem.at[i])
           for i, (v, h) in enumerate(zip(out_vmem, out_hbm))]
  for cp in sends:
    cp.start()
  for cp in sends:
    cp.wait()


def _call(scores, k: int, keep: int, tile: int, finish: bool,
          entries: int | None = None):
  """The kernel over scores f32[T, N] (or f32[T, W / 128, 128], taken as it
  is, its first N = `entries` read: `reads_lane_rows`): [G, ...] per output
  (G = T / 8 rounded up): the winners and flags, or (finish False) the
  levels."""
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
    fin = functools.partial(_finish, keep=keep, k=k, idx_bits=idx_bits)
    blocks = [((SUBLANES, -(-k // LANES) * LANES), jnp.int32),
              ((SUBLANES, LANES), jnp.int32)]
    extra = finish_scratch(keep, k)
  else:
    fin, extra = _levels, []
    blocks = [((levels * UNITS, SUBLANES, LANES), dt)
              for dt in (jnp.float32, jnp.int32)]
  hbm = pl.BlockSpec(memory_space=pltpu.HBM)
  return pl.pallas_call(
      functools.partial(_kernel, keep=keep, tile=tile, tiles=tiles,
                        finish=fin, outputs=len(blocks), lane_rows=lane_rows),
      grid=(groups,),
      in_specs=[hbm],
      out_specs=[hbm] * len(blocks),
      out_shape=[jax.ShapeDtypeStruct((groups, *shape), dt)
                 for shape, dt in blocks],
      scratch_shapes=[
          pltpu.VMEM((2, tile // chunk, SUBLANES, *buf), jnp.float32),
          pltpu.SemaphoreType.DMA((2,)),
          pltpu.VMEM((levels * UNITS, SUBLANES, LANES), jnp.float32),
          pltpu.VMEM((levels * UNITS, SUBLANES, LANES), jnp.int32),
          *[pltpu.VMEM(shape, dt) for shape, dt in blocks],
          pltpu.SemaphoreType.DMA((len(blocks),)), *extra],
      compiler_params=pltpu.CompilerParams(
          dimension_semantics=("parallel",)),
      interpret=modes.resolve_interpret(),
      name=(f"StreamIdxSelectBlocktop-keep_{keep}-tile_{tile}-k_{k}" if finish
            else f"StreamIdxBlocktopLevels-keep_{keep}-tile_{tile}"),
  )(x)


def block_candidates(scores, *, keep: int, tile: int):
  """The pass alone over scores f32[T, N]: (values f32[T, keep * 1024],
  indices, dropped values f32[T, 1024], dropped indices); column j * 1024 +
  p: the j-th best entry of block p (-inf, 2**31 - 1 where none)."""
  t = scores.shape[0]
  vals, idx = _call(scores, 1, keep, tile, finish=False)

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
  winners, flag = _call(scores, k, keep, tile, finish=True, entries=entries)
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
      t * base.sort_work(cap), t * n * (2 * keep + 5),
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
