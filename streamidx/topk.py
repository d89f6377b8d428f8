"""The top-k stage: indices of the k largest masked scores of each row.

Every token kernel (and its reference) ends with `select_topk(scores, k,
method)` over its f32[T, N] score buffer; `TOPK_METHODS` lists the methods
(docs/topk-methods.md describes and compares them; "approx" is the one that
is not exact on a TPU).

Output contract, the same for every exact method (and the reference): i32[T,
k]; row t holds the min(k, #{s: scores[t, s] > -inf}) entries with the
largest scores, ties at the k-th score going to the lowest indices, ordered
by score descending then index ascending; the rest of the row is -1 (N < k
pads with -inf columns, as the vendored kernel does). `canonical_zero` maps
-0.0 and subnormals to +0.0 first, so no backend's ordering of them can split
a tie. Rows holding a NaN score get unspecified indices (the value rules
reject the non-finite inputs that make them).
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
from jax import lax

__all__ = [
    "TOPK_METHODS", "EXACT_TOPK_METHODS", "FUSED_TOPK_METHODS",
    "KERNEL_OUTPUTS",
    "KERNEL_TOPK_METHODS", "FUSED_BLOCK_WIDTH", "DEFAULT_TOPK_METHOD",
    "APPROX_RECALL_TARGET", "check_topk_method", "canonical_zero", "order_key",
    "select_topk", "scores_at", "chunk_size_for", "block_size_for",
    "fused_block_size_for",
]

TOPK_METHODS = ("sort", "top_k", "chunked", "blockmax", "fused_blockmax",
                "radix", "approx")
EXACT_TOPK_METHODS = tuple(m for m in TOPK_METHODS if not m.startswith("approx"))
# Methods that need more than the score buffer from the scoring kernel, and
# the kernel outputs each reads, in the order the kernel writes them: a
# kernel body takes one only if it emits them all
# (`kernels.driver.KernelBody.emits`, `extra_outputs`).
KERNEL_OUTPUTS = {"fused_blockmax": ("block_max",)}
FUSED_TOPK_METHODS = tuple(KERNEL_OUTPUTS)
# The methods every token kernel takes: they select from the score buffer.
KERNEL_TOPK_METHODS = tuple(m for m in TOPK_METHODS
                            if m not in FUSED_TOPK_METHODS)
# Entries per block maximum the fused kernel writes: one 128-lane row.
FUSED_BLOCK_WIDTH = 128
DEFAULT_TOPK_METHOD = "sort"  # the vendored kernel's (docs/topk-methods.md: why)
APPROX_RECALL_TARGET = 0.95
RADIX_BITS = (1, 2, 4, 8)
_DEFAULT_RADIX_BITS = 4
_NEG_INF = float("-inf")


def check_topk_method(method, allowed=TOPK_METHODS) -> str:
  """Returns `method`, or raises ValueError naming the `allowed` ones (a
  kernel that writes no block maxima: `KERNEL_TOPK_METHODS`)."""
  if not isinstance(method, str) or method not in allowed:
    why = ""
    if method in FUSED_TOPK_METHODS:
      why = (f"; {method!r} reads the kernel outputs "
             f"{KERNEL_OUTPUTS[method]}, which only a kernel body emitting "
             f"them writes")
    raise ValueError(f"topk_method: must be one of {tuple(allowed)}{why} "
                     f"(got {method!r})")
  return method


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


_NEG_INF_KEY = -(2**31) + 2**23 - 1  # order_key(-inf)


def _pad_to(scores, n):
  if scores.shape[1] >= n:
    return scores
  return jnp.pad(scores, ((0, 0), (0, n - scores.shape[1])),
                 constant_values=_NEG_INF)


def _finish(vals, idx):
  """-1 where the score is -inf (invisible or padding)."""
  return jnp.where(vals == _NEG_INF, -1, idx).astype(jnp.int32)


def _order(keys, idx):
  """The k winners of each row by key descending, index ascending, with -1
  where the key is -inf's: i32[T, k]."""
  # ~key reverses the order of int32 without overflow.
  neg, idx = lax.sort((~keys, idx.astype(jnp.int32)), dimension=1,
                      num_keys=2)
  return jnp.where(~neg == _NEG_INF_KEY, -1, idx).astype(jnp.int32)


def scores_at(scores, idx):
  """f32[T, k]: each selected entry's score as the selection compared it
  (-0.0 and subnormals as +0.0), -inf where the index is -1."""
  got = jnp.take_along_axis(scores.astype(jnp.float32), jnp.maximum(idx, 0),
                            axis=1)
  return jnp.where(idx >= 0, canonical_zero(got), _NEG_INF)


# -- sizes the model picks (streamidx.lab.model.topk explains them) --------


def _pow2_at_least(x: int) -> int:
  return 1 << max(0, math.ceil(math.log2(max(1, x))))


def _sort_work(n: int) -> float:
  """Compare-exchanges of a bitonic sorting network on n (padded to 2^p)."""
  if n <= 1:
    return 0.0
  p = math.ceil(math.log2(n))
  return (1 << p) / 2 * p * (p + 1) / 2


def chunk_size_for(n: int, k: int) -> int:
  """The "chunked" method's chunk: a power of two >= k minimizing
  (n / c) sorts of c plus one sort of the (n / c) * k candidates
  (bitonic compare-exchanges; `streamidx.lab.model.topk`)."""
  best = None
  c = _pow2_at_least(k)
  while True:
    chunks = -(-n // c)
    work = chunks * _sort_work(c) + _sort_work(chunks * min(k, c))
    if best is None or work < best[0]:
      best = (work, c)
    if chunks == 1:
      break
    c *= 2
  return best[1]


def block_size_for(n: int, k: int) -> int:
  """The "blockmax" method's block: a power of two in [128, 1024] (whole
  128-lane rows: a narrower block pads each to 128 lanes in a TPU's layout)
  minimizing a sort of the n / b block maxima plus one of the k * b
  candidates; n (one block) when no such block leaves more than k blocks:
  the method is then one `top_k`."""
  best = None
  for p in range(7, 11):
    b = 1 << p
    blocks = -(-n // b)
    if blocks <= k:
      break
    work = _sort_work(blocks) + _sort_work(k * b)
    if best is None or work < best[0]:
      best = (work, b)
  return max(1, n) if best is None else best[1]


def fused_block_size_for(n: int, k: int,
                         width: int = FUSED_BLOCK_WIDTH) -> int:
  """The "fused_blockmax" method's block: `block_size_for(n, k)` as a
  multiple of `width`, the entries per maximum the kernel writes (so a block
  is whole maxima)."""
  return max(width, block_size_for(n, k) // width * width)


# -- the methods ------------------------------------------------------------


def _top_k(scores, k):
  vals, idx = lax.top_k(canonical_zero(scores), k)
  return _finish(vals, idx)


def _chunked(scores, k, chunk_size):
  t, n = scores.shape
  c = int(chunk_size)
  chunks = -(-n // c)
  if chunks == 1:
    return _top_k(scores, k)
  x = _pad_to(canonical_zero(scores), chunks * c).reshape(t, chunks, c)
  kc = min(k, c)
  vals, local = lax.top_k(x, kc)  # [T, chunks, kc], ties: lowest index first
  glob = local + (jnp.arange(chunks, dtype=jnp.int32) * c)[None, :, None]
  # Candidates in chunk order, each chunk's in (score desc, index asc) order:
  # among equal scores, candidate position order is global index order, so
  # the second top_k's tie rule (lowest position) is the global one.
  vals, pos = lax.top_k(vals.reshape(t, chunks * kc), k)
  idx = jnp.take_along_axis(glob.reshape(t, chunks * kc), pos, axis=1)
  return _finish(vals, idx)


def _blockmax_select(scores, block_max, k, b):
  """The second stage of "blockmax" and "fused_blockmax": i32[T, k].

  scores: f32[T, N]; block_max: f32[T, blocks], blocks = cdiv(N, b) > k, the
  maximum of entries [j * b, (j + 1) * b) of each row. The k best blocks by
  (maximum desc, block index asc), then one `top_k` over their entries:
  exact, ties included (docs/topk-methods.md, "Why blockmax is exact").
  """
  t, n = scores.shape
  blocks = block_max.shape[1]
  # Zeros of both signs tie (canonical_zero is monotone: the maximum of the
  # canonical scores is the canonical maximum).
  _, best = lax.top_k(canonical_zero(block_max), k)  # ties: lowest block first
  best = jnp.sort(best, axis=1)
  x = _pad_to(scores, blocks * b).reshape(t, blocks, b)  # no copy: N = blocks * b
  cand = canonical_zero(
      jnp.take_along_axis(x, best[:, :, None], axis=1))  # [T, k, b]
  vals, pos = lax.top_k(cand.reshape(t, k * b), k)
  idx = jnp.take_along_axis(best, pos // b, axis=1) * b + pos % b
  return _finish(vals, idx)


def _blockmax(scores, k, block_size, block_max=None, width=None):
  """"blockmax" / "fused_blockmax": blocks of `block_size` (a multiple of
  `width`, default `block_size`) ranked by the maxima of `width`-entry
  blocks, f32[T, >= cdiv(N, width)] (the kernel's; computed from `scores`
  when None)."""
  width = width or block_size
  t, n = scores.shape
  b = int(block_size)
  blocks = -(-n // b)
  if blocks <= k:
    return _top_k(scores, k)
  rows = -(-n // width)
  if block_max is None:
    block_max = _pad_to(scores, rows * width).reshape(t, rows, width).max(2)
  m = block_max[:, :rows].astype(jnp.float32)
  g = b // width
  if g > 1:  # blocks of g maxima: the maximum of the maxima
    m = _pad_to(m, blocks * g).reshape(t, blocks, g).max(axis=2)
  return _blockmax_select(scores, m, k, b)


def _kth_largest_key(keys, k, radix_bits):
  """Per row, the k-th largest key (i32[T]), by digit histograms.

  Works on the unsigned image (key ^ 2**31, same order) from the most
  significant digit down: each pass counts, among the entries that match the
  digits found so far, those with each digit value or more, and keeps the
  largest digit value whose count still reaches the rank sought.
  """
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


def _take_at_threshold(keys, kth, k):
  """The k entries above `kth` plus the lowest-index ones equal to it,
  ordered by key descending, index ascending: i32[T, k]."""
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
  return _order(jnp.take_along_axis(keys, idx, axis=1), idx)


def _radix(scores, k, radix_bits):
  keys = order_key(canonical_zero(scores))
  return _take_at_threshold(keys, _kth_largest_key(keys, k, radix_bits), k)


def _sort(scores, k):
  # The sort reads the scores as they are: its comparator (a > b, float
  # comparison) already ties -0.0, +0.0 and subnormals.
  vals, idx = lax.approx_max_k(scores, k, recall_target=1.0)
  keys = order_key(canonical_zero(scores))
  win = order_key(canonical_zero(vals))
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
                  lambda: _order(win, idx),
                  lambda: _top_k(scores, k))


def _approx(scores, k, recall_target):
  vals, idx = lax.approx_max_k(scores, k, recall_target=recall_target)
  return _order(order_key(canonical_zero(vals)), idx)


@functools.partial(jax.jit, static_argnames=(
    "k", "method", "chunk_size", "block_size", "radix_bits", "recall_target",
    "block_max_width"))
def select_topk(scores, k: int, method: str = DEFAULT_TOPK_METHOD, *,
                chunk_size: int | None = None, block_size: int | None = None,
                radix_bits: int = _DEFAULT_RADIX_BITS,
                recall_target: float = APPROX_RECALL_TARGET,
                block_max=None, block_max_width: int = FUSED_BLOCK_WIDTH):
  """Top-k indices of masked scores: i32[T, k], -1 where the score is -inf.

  scores: f32[T, N] masked scores (-inf: not visible; any float dtype,
    compared as f32); k: entries per row (N < k pads with -1); method: one
    of `TOPK_METHODS`. Per method: chunk_size ("chunked", default
    `chunk_size_for(N, k)`), block_size ("blockmax", "fused_blockmax":
    default `block_size_for(N, k)`; fused: a multiple of `block_max_width`),
    radix_bits ("radix": one of `RADIX_BITS`, 32 / radix_bits passes),
    recall_target ("approx", in (0, 1)), block_max ("fused_blockmax":
    f32[T, >= cdiv(N, w)], column j the maximum of scores[:, j * w:(j + 1) *
    w], w = block_max_width, as the fused kernel writes it; None: computed
    from `scores`). Returns i32[T, k], identical for every exact method
    (module docstring).
  """
  check_topk_method(method)
  if not isinstance(k, int) or isinstance(k, bool) or k < 1:
    raise ValueError(f"k: must be a positive int (got {k!r})")
  if getattr(scores, "ndim", None) != 2:
    raise ValueError(f"scores: must be a 2-D array [T, N] "
                     f"(got shape {getattr(scores, 'shape', None)})")
  if not jnp.issubdtype(scores.dtype, jnp.floating):
    raise ValueError(f"scores: must be floating point (got {scores.dtype})")
  if radix_bits not in RADIX_BITS:
    raise ValueError(f"radix_bits: must be one of {RADIX_BITS} "
                     f"(got {radix_bits!r})")
  if not 0.0 < recall_target < 1.0 and method == "approx":
    raise ValueError(f"recall_target: must be in (0, 1) (got {recall_target!r})")
  for name, v in (("chunk_size", chunk_size), ("block_size", block_size),
                  ("block_max_width", block_max_width)):
    if v is not None and (not isinstance(v, int) or v < 1):
      raise ValueError(f"{name}: must be a positive int (got {v!r})")
  if block_max is not None:
    if method != "fused_blockmax":
      raise ValueError(f"block_max: only for method 'fused_blockmax' "
                       f"(got method {method!r})")
    need = -(-scores.shape[1] // block_max_width)
    if (getattr(block_max, "ndim", None) != 2
        or block_max.shape[0] != scores.shape[0]
        or block_max.shape[1] < need):
      raise ValueError(
          f"block_max: must be f32[T, >= cdiv(N, block_max_width)] = "
          f"[{scores.shape[0]}, >= {need}] (got shape "
          f"{getattr(block_max, 'shape', None)})")
  if (method == "fused_blockmax" and block_size is not None
      and block_size % block_max_width):
    raise ValueError(f"block_size: must be a multiple of block_max_width "
                     f"({block_max_width}) for 'fused_blockmax' "
                     f"(got {block_size})")
  n = max(scores.shape[1], k)
  run = {
      "sort": lambda x: _sort(x, k), "top_k": lambda x: _top_k(x, k),
      "chunked": lambda x: _chunked(x, k, chunk_size or chunk_size_for(n, k)),
      "blockmax": lambda x: _blockmax(x, k, block_size or block_size_for(n, k)),
      "fused_blockmax": lambda x: _blockmax(
          x, k, block_size or fused_block_size_for(n, k, block_max_width),
          block_max, block_max_width),
      "radix": lambda x: _radix(x, k, radix_bits),
      "approx": lambda x: _approx(x, k, recall_target)}[method]
  # The scope names the stage's ops in profiles (op metadata), whatever
  # XLA fuses them into.
  with jax.named_scope(f"select_topk_{method}"):
    return run(_pad_to(scores.astype(jnp.float32), k))
