"""The "blocktop" top-k method: one Pallas TensorCore kernel reads the
f32[T, N] score buffer once and writes each row's k winners in the rule's
order; no sort of the row, no XLA sort (the full sort only where the
kernel's check fails).

Layout. A grid step holds 8 rows and streams them in tiles of `tile`
entries (double-buffered DMAs of [8, 8192]). A vreg is [8 rows, 128
entries]. Block p (p in [0, 1024)) of a row is its entries at p, p + 1024,
p + 2048, ... (N / 1024 of them, in index order): unit p // 128, lane p %
128.

Pass. Per block the kernel keeps the `keep` best entries by (score
descending, index ascending), -0.0 and subnormals as 0 (it adds 0.0 to
each score: -0.0 becomes +0.0, and XLA, on CPU and TPU, flushes
subnormals; the finish canonicalizes what it kept), in `keep` sorted
levels, plus one level more: the best entry it dropped. Each vreg is
inserted by compare and select (a new entry has the highest index so far,
so it goes above the first level it beats; the levels below shift down).
Any 1,024 consecutive entries fall in 1,024 different blocks, so a row
whose visible entries are a short prefix, or whose winners crowd a window,
spreads them over the blocks as a long random row does.

Finish, per 8 rows, on the keep x 1,024 candidates a row, in vregs:
1. The bound: the (key, index) of the k-th best entry of the first `bound`
   levels (`bound_levels`: 2k entries). k entries rank at or before it, so
   every winner does. Found bit by bit by counting: 32 counts for the
   order key, log2(N) for the index among its ties.
2. Compaction: the candidates ranking at or before the bound (708 = 1.4 x
   k in a random row of 262,144 entries at k 512; ties cannot inflate them:
   the bound is an entry, not a score) get their slot by an exclusive
   prefix count (on the MXU) and move there in log2(keep x 1,024) rounds
   of compare and select, the lowest bit of each one's move first (then
   no two ever meet; lane
   rotations for the moves under 128). The first `capacity(k)` slots (the
   power of two >= 2k, at least 128) go on.
3. A bitonic sort of those slots by (key descending, index ascending); the
   first k are the winners, -1 where none is visible.

Exactness. When no block's best dropped entry ranks before the k-th winner
and at most `capacity(k)` candidates rank at or before the bound, every
entry of the top k was a candidate and was sorted, and the result is the
rule's (a dropped entry of the top k would rank before the k-th winner
found). Otherwise the kernel flags the row, and the batch is selected again
by "sort": exact always, only the cost depends on it (`keep_for`).

Shapes: scores f32[T, N] -> i32[T, k]; the kernel pads T to a multiple of
8 and N to a multiple of `tile` with -inf.
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
  of 1,024 entries when shorter."""
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


def _scan(buf, lv, li, first, *, levels: int, chunks: int, chunk: int):
  """Inserts a tile (buf: f32[chunks, 8, chunk], entries first, first + 1,
  ... of 8 rows) into the levels lv, li (f32 and i32 [levels * 8, 8, 128]:
  level l of unit u at l * 8 + u), unit by unit, in index order."""
  lane = lax.broadcasted_iota(jnp.int32, (SUBLANES, LANES), 1)
  for u in range(UNITS):
    def body(c, carry, u=u):
      vals, idx = carry
      for j in range(chunk // BLOCKS):  # static: 8 inserts interleave
        col = j * BLOCKS + u * LANES
        v = buf[c, :, col:col + LANES] + 0.0  # -0.0 -> +0.0; flushes subnormals
        vals, idx = _insert(vals, idx, v, first + c * chunk + col + lane)
      return vals, idx
    init = (tuple(lv[l * UNITS + u] for l in range(levels)),
            tuple(li[l * UNITS + u] for l in range(levels)))
    vals, idx = lax.fori_loop(0, chunks, body, init)
    for l in range(levels):
      lv[l * UNITS + u] = vals[l]
      li[l * UNITS + u] = idx[l]


# -- the finish -------------------------------------------------------------


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
  """The (key, index) of the k-th best of the entries, i32[8, 1] each: the
  key bit by bit (the largest with at least k entries at or above it), then
  the index among the entries of that key."""
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


def _compact(keys, idx, live, width: int):
  """The live entries (position v * 128 + l: vreg v, lane l) moved, in
  order, to the first positions: `width` vregs of keys (-inf's key where
  none) and of indices, and how many are live a row, i32[8, 1].

  Each one's move is its position less its slot (the exclusive prefix count
  of the live); it moves in rounds, the move's lowest bit first, so no two
  ever meet. What moves is its key and one word: the index's high bits
  (index // 1024; the low bits, its block, follow from where it started:
  slot + move), a live bit and the move."""
  lane = lax.broadcasted_iota(jnp.int32, (SUBLANES, LANES), 1)
  n = max(len(keys), width)
  sb = _move_bits(len(keys), width)
  alive = 1 << sb
  # The prefix counts on the MXU: [live of every vreg] @ [j <= i | 1]
  # gives each lane the live at or before it in its vreg, and the vreg's
  # total (0 and 1 in bf16, summed in f32: exact).
  ones = [jnp.where(m, 1.0, 0.0).astype(jnp.bfloat16) for m in live]
  row = lax.broadcasted_iota(jnp.int32, (LANES, 2 * LANES), 0)
  col = lax.broadcasted_iota(jnp.int32, (LANES, 2 * LANES), 1)
  tri = jnp.where((row <= col) | (col >= LANES), 1.0, 0.0).astype(
      jnp.bfloat16)
  counts = jnp.dot(jnp.concatenate(ones, axis=0), tri,
                   preferred_element_type=jnp.float32).astype(jnp.int32)
  before = jnp.zeros((SUBLANES, LANES), jnp.int32)  # live in earlier vregs
  ks, ws = [], []
  for v, m in enumerate(live):
    c = counts[v * SUBLANES:(v + 1) * SUBLANES]
    incl, vreg_total = c[:, :LANES], c[:, LANES:]
    move = v * LANES + lane - (before + incl - jnp.where(m, 1, 0))
    before = before + vreg_total
    ks.append(keys[v])
    high = (idx[v] >> _BLOCK_BITS) << (sb + 1)
    ws.append(jnp.where(m, high | alive | move, 0))
  total = before[:, :1]
  empty = jnp.zeros((SUBLANES, LANES), jnp.int32)
  ks, ws = ks + [empty] * (n - len(ks)), ws + [empty] * (n - len(ws))
  for b in range(sb):
    bit = 1 << b
    moves = [(w & bit) != 0 for w in ws]  # a dead word (0) never moves
    if bit >= LANES:  # whole vregs: vreg v + m moves to v
      m = bit // LANES
      src = [(ks[v + m], ws[v + m], moves[v + m]) if v + m < n else None
             for v in range(n)]
    else:  # lane l of vreg v takes position l + bit: vreg v or v + 1
      hi = lane >= LANES - bit
      rk = [pltpu.roll(k_, LANES - bit, 1) for k_ in ks]
      rw = [pltpu.roll(w, LANES - bit, 1) for w in ws]
      src = []
      for v in range(n):
        sk = jnp.where(hi, rk[v + 1], rk[v]) if v + 1 < n else rk[v]
        sw = jnp.where(hi, rw[v + 1] if v + 1 < n else 0, rw[v])
        src.append((sk, sw, (sw & bit) != 0))
    for v in range(n):
      stay = jnp.where(moves[v], 0, ws[v])  # moved out: the slot is dead
      if src[v] is not None:
        sk, sw, take = src[v]
        ks[v] = jnp.where(take, sk, ks[v])
        ws[v] = jnp.where(take, sw, stay)
      else:
        ws[v] = stay
  out_k, out_i = [], []
  for v in range(width):
    w = ws[v]
    start = v * LANES + lane + (w & (alive - 1))  # where it came from
    block = start & (BLOCKS - 1)  # position mod 1,024: unit * 128 + lane
    live_v = (w & alive) != 0
    out_k.append(jnp.where(live_v, ks[v], _DEAD))
    out_i.append(jnp.where(live_v, ((w >> (sb + 1)) << _BLOCK_BITS) | block,
                           _NO_INDEX))
  return out_k, out_i, total


def _bitonic(keys, idx, scratch=None):
  """Sorts the positions v * 128 + l of the vregs keys, idx (lists of
  i32[8, 128]) by key descending, index ascending, each row: a bitonic
  network. With `scratch` (two VMEM refs of [vregs, 8, 128]) each step
  loops over the vregs there instead of unrolling them: the same network,
  a graph the interpreter can still compile at 4,096 slots."""
  K, I = list(keys), list(idx)
  lane = lax.broadcasted_iota(jnp.int32, (SUBLANES, LANES), 1)
  nv = len(K)
  if scratch is not None:
    sk, si = scratch
    for v in range(nv):
      sk[v], si[v] = K[v], I[v]
  size = 2
  while size <= nv * LANES:
    d = size // 2
    while d >= 1:
      if d >= LANES and scratch is None:  # pairs of whole vregs
        dv = d // LANES
        for v in range(nv):
          if v & dv:
            continue
          w = v + dv
          first = _before(K[v], I[v], K[w], I[w])
          if (v * LANES) & size:  # an ascending run
            first = ~first
          K[v], K[w] = (jnp.where(first, K[v], K[w]),
                        jnp.where(first, K[w], K[v]))
          I[v], I[w] = (jnp.where(first, I[v], I[w]),
                        jnp.where(first, I[w], I[v]))
      elif d >= LANES:  # the same, a loop over the pairs
        def pair(j, c, dv=d // LANES, size=size):
          v = (j // dv) * 2 * dv + j % dv
          w = v + dv
          ka, ia, kb, ib = sk[v], si[v], sk[w], si[w]
          first = _before(ka, ia, kb, ib) ^ _ascending(lane, v, size)
          sk[v], sk[w] = jnp.where(first, ka, kb), jnp.where(first, kb, ka)
          si[v], si[w] = jnp.where(first, ia, ib), jnp.where(first, ib, ia)
          return c
        lax.fori_loop(0, nv // 2, pair, 0, unroll=8)
      else:  # partners d lanes apart in one vreg
        lower = (lane & d) == 0

        def step(k_, i_, want, d=d, lower=lower):
          pk = jnp.where(lower, pltpu.roll(k_, LANES - d, 1),
                         pltpu.roll(k_, d, 1))
          pi = jnp.where(lower, pltpu.roll(i_, LANES - d, 1),
                         pltpu.roll(i_, d, 1))
          keep = ~(_before(k_, i_, pk, pi) ^ want)
          return jnp.where(keep, k_, pk), jnp.where(keep, i_, pi)

        if scratch is None:
          for v in range(nv):
            if size < LANES:
              want = ~(lower ^ ((lane & size) == 0))
            else:
              want = ~lower if (v * LANES) & size else lower
            K[v], I[v] = step(K[v], I[v], want)
        else:
          def one(v, c, size=size, lower=lower, step=step):
            if size < LANES:
              want = ~(lower ^ ((lane & size) == 0))
            else:
              want = lower ^ _ascending(lane, v, size)
            sk[v], si[v] = step(sk[v], si[v], want)
            return c
          lax.fori_loop(0, nv, one, 0, unroll=8)
      d //= 2
    size *= 2
  if scratch is not None:
    K, I = [sk[v] for v in range(nv)], [si[v] for v in range(nv)]
  return K, I


def _ascending(lane, v, size):
  """A mask, everywhere v's run of `size` is ascending (v: a loop index)."""
  return (lane * 0 + ((v * LANES) & size)) != 0


# Slots a finish sorts unrolled; more loop over VMEM (`_bitonic`).
UNROLLED_SLOTS = 2048


def _finish(lv, li, out_ref, flag_ref, *scratch, keep, k, idx_bits):
  """The k winners of 8 rows from their levels (module docstring): out_ref
  i32[8, k rounded up to 128 lanes], flag_ref i32[8, 128] (1: the row's
  check failed)."""
  n = keep * UNITS
  keys = [_key(lv[v]) for v in range(n)]
  idx = [li[v] for v in range(n)]
  bound = bound_levels(k, keep) * UNITS
  key, index = _kth(keys[:bound], idx[:bound], k, idx_bits)
  live = [(kk > _DEAD) & ~_before(key, index, kk, ii)
          for kk, ii in zip(keys, idx)]
  width = capacity(k) // LANES
  K, I, total = _compact(keys, idx, live, width)
  K, I = _bitonic(K, I, scratch or None)
  for v in range(-(-k // LANES)):
    out_ref[:, v * LANES:(v + 1) * LANES] = jnp.where(K[v] > _DEAD, I[v], -1)
  v, l = divmod(k - 1, LANES)
  kth_key, kth_idx = K[v][:, l:l + 1], I[v][:, l:l + 1]
  dropped = _total([_before(_key(lv[n + u]), li[n + u], kth_key,
                            kth_idx) for u in range(UNITS)])
  bad = (dropped > 0) | (total > width * LANES)
  flag_ref[...] = jnp.broadcast_to(jnp.where(bad, 1, 0), (SUBLANES, LANES))


def _key(v):
  """The order key of kept values, -0.0 and subnormals as 0."""
  return base.order_key(jnp.where(jnp.abs(v) < _TINY, 0.0, v))


def _levels(lv, li, vals_ref, idx_ref):
  """The levels themselves (`block_candidates`)."""
  vals_ref[...] = lv[...]
  idx_ref[...] = li[...]


# -- the kernel ---------------------------------------------------------------


def _kernel(x_hbm, *refs, keep, tile, tiles, finish, outputs):
  """Grid step g: rows [8g, 8g + 8) of x_hbm f32[T, N] (HBM). refs: the
  outputs in HBM ([G, ...] each), then the scratch: buf f32[2, tile /
  chunk, 8, chunk] (two tiles), its DMA semaphores, the levels lv, li
  (`_scan`), each output's block in VMEM, their semaphores, and the
  finish's own scratch (`_bitonic`'s, past `UNROLLED_SLOTS`). The grid
  step writes its outputs by DMA, so the grid loop has no pipeline stage."""
  out_hbm, (buf, sem, lv, li) = refs[:outputs], refs[outputs:outputs + 4]
  out_vmem = refs[outputs + 4:2 * outputs + 4]
  out_sem, extra = refs[2 * outputs + 4], refs[2 * outputs + 5:]
  g = pl.program_id(0)
  rows = pl.ds(pl.multiple_of(g * SUBLANES, SUBLANES), SUBLANES)
  chunk = min(CHUNK, tile)
  chunks = tile // chunk

  def copies(b, slot):
    return [pltpu.make_async_copy(
        x_hbm.at[rows, pl.ds(pl.multiple_of(b * tile + c * chunk, chunk),
                             chunk)],
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
          chunk=chunk)
    return carry

  lax.fori_loop(0, tiles, step, 0)
  finish(lv, li, *out_vmem, *extra)
  sends = [pltpu.make_async_copy(v, h.at[g], out_sem.at[i])
           for i, (v, h) in enumerate(zip(out_vmem, out_hbm))]
  for cp in sends:
    cp.start()
  for cp in sends:
    cp.wait()


def _call(scores, k: int, keep: int, tile: int, finish: bool):
  """The kernel over scores f32[T, N]: [G, ...] per output (G = T / 8
  rounded up): the winners and flags, or (finish False) the levels."""
  t, n = scores.shape
  tiles = -(-n // tile)
  groups = -(-t // SUBLANES)
  x = jnp.pad(scores.astype(jnp.float32),
              ((0, groups * SUBLANES - t), (0, tiles * tile - n)),
              constant_values=base.NEG_INF)
  levels = keep + 1
  chunk = min(CHUNK, tile)
  if finish:
    idx_bits = max(1, (tiles * tile - 1).bit_length())
    fin = functools.partial(_finish, keep=keep, k=k, idx_bits=idx_bits)
    blocks = [((SUBLANES, -(-k // LANES) * LANES), jnp.int32),
              ((SUBLANES, LANES), jnp.int32)]
    width = capacity(k) // LANES
    extra = ([pltpu.VMEM((width, SUBLANES, LANES), jnp.int32)] * 2
             if capacity(k) > UNROLLED_SLOTS else [])
  else:
    fin, extra = _levels, []
    blocks = [((levels * UNITS, SUBLANES, LANES), dt)
              for dt in (jnp.float32, jnp.int32)]
  hbm = pl.BlockSpec(memory_space=pltpu.HBM)
  return pl.pallas_call(
      functools.partial(_kernel, keep=keep, tile=tile, tiles=tiles,
                        finish=fin, outputs=len(blocks)),
      grid=(groups,),
      in_specs=[hbm],
      out_specs=[hbm] * len(blocks),
      out_shape=[jax.ShapeDtypeStruct((groups, *shape), dt)
                 for shape, dt in blocks],
      scratch_shapes=[
          pltpu.VMEM((2, tile // chunk, SUBLANES, chunk), jnp.float32),
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
  indices i32[...], dropped values f32[T, 1024], dropped indices i32[...]).
  Column j * 1024 + p: the j-th best entry of block p by (score desc, index
  asc), -inf and index 2**31 - 1 where it has fewer visible ones; dropped
  column p: the best entry block p did not keep."""
  t = scores.shape[0]
  vals, idx = _call(scores, 1, keep, tile, finish=False)

  def rows(a):  # [G, levels * 8 units, 8 rows, 128] -> [T, levels * 1024]
    g = a.shape[0]
    a = a.reshape(g, keep + 1, UNITS, SUBLANES, LANES).transpose(0, 3, 1, 2, 4)
    return a.reshape(g * SUBLANES, -1)[:t]

  vals, idx = base.canonical_zero(rows(vals)), rows(idx)
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
  # A moving entry's word: index // 1024, a live bit and its move (31 bits).
  vregs = -(-(-(-n // tile) * tile) // BLOCKS)
  if (vregs - 1).bit_length() + 1 + _move_bits(keep * UNITS,
                                               capacity(k) // LANES) > 31:
    raise ValueError(f"scores: rows of {n} entries with keep {keep} and k "
                     f"{k} do not fit blocktop's 31-bit word")
  return keep, tile


def block_select(scores, k: int, *, keep: int, tile: int):
  """The kernel: (winners i32[T, k], whether the row's check failed
  bool[T])."""
  t = scores.shape[0]
  winners, flag = _call(scores, k, keep, tile, finish=True)
  winners = winners.reshape(-1, winners.shape[-1])
  return winners[:t, :k], flag.reshape(-1, LANES)[:t, 0] != 0


def select(scores, k, extra=None, *, keep=None, tile=None):
  """The k best of scores f32[T, N >= k]: i32[T, k] (module docstring)."""
  del extra
  keep, tile = plan(scores.shape[1], k, keep, tile)
  winners, bad = block_select(scores, k, keep=keep, tile=tile)
  return lax.cond(jnp.any(bad), lambda: sort_method.select(scores, k),
                  lambda: winners)


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
    "candidates that can win (the full sort where its check fails)",
    options=(base.Option("keep", None, base.positive_int,
                         "candidates kept per block (default `keep_for`)"),
             base.Option("tile", None, _whole_vregs,
                         "entries of a row per tile, a multiple of 1,024 "
                         "(default `tile_for(N)`)")))
