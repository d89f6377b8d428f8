"""The rules every kernel, reference, validator and model shares.

One home per rule: the vendored kernel (`streamidx/kernels/vendored.py`), the
references (`ref.py`, `streaming.py`), validation and the lab's models all
import these definitions; none of them restates one.

    CAUSAL_RULES, causal_visible_bound   which compressed entries a query sees
    CASES, normalize_per_case            per-case block sizes (decode, prefill,
                                         mixed), checked
    TokenLaunch, token_launches          the launches `streamindex_topk` makes
                                         for a distribution (i, j, n)
    decode_blocks, decode_order          length-sorted decode batching (the
    apply_decode_order,                  kernels' `sort_decode`): the order of
    restore_decode_rows                  the decode range, and its undoing
    cdiv, align_to, LANES                the integer helpers
    launch_scratch, scratch_vmem_bytes   a launch's VMEM scratch buffers (the
                                         kernel declares them from here) and
                                         their bytes as Mosaic tiles them

Vocabulary (the vendored kernel's own):
    ratio / compression_ratio  tokens per compressed KV entry; a sequence of
                               seq_len tokens has seq_len // ratio entries
    page_size                  compressed entries per cache page
    bkv_p / num_kv_pages_per_block   pages per KV block; bkv_sz = bkv_p * page_size
    bq_sz / num_queries_per_block    query rows per query block
    distribution = (i, j, n)   sequences [0, i) decode-only, [i, j)
                               chunked-prefill-only, [j, n) mixed
    decode_req_batch_size      decode sequences scored together per program

Every function here works on Python ints, NumPy and (where it says so) traced
JAX values alike, so the kernel can use it inside `jit`.
"""

from __future__ import annotations

import dataclasses
import numbers
from typing import Any

LANES = 128  # the TPU vector lane count: the kernel's row and score width
DEFAULT_VMEM_LIMIT_BYTES = 100 * 1024 * 1024  # the vendored kernel's default

CAUSAL_RULES = ("model", "seed")
DEFAULT_CAUSAL_RULE = CAUSAL_RULES[0]  # the model's rule (local modification M3)
CASES = ("decode", "prefill", "mixed")  # the order of per-case block sizes


def cdiv(a, b):
  """ceil(a / b) for non-negative a and positive b (ints or JAX integers)."""
  return (a + b - 1) // b


def align_to(x, a):
  """x rounded up to a multiple of a."""
  return cdiv(x, a) * a


def check_causal_rule(causal_rule) -> None:
  if causal_rule not in CAUSAL_RULES:
    raise ValueError(f"causal_rule: must be one of {CAUSAL_RULES} "
                     f"(got {causal_rule!r})")


def causal_visible_bound(q_pos, compression_ratio, causal_rule):
  """Exclusive upper bound on the compressed entries visible at `q_pos`.

  Entry s is causally visible to the query at absolute token position `q_pos`
  (`seq_len - q_len + i` for a sequence's i-th query) iff
  `s < causal_visible_bound(q_pos, ratio, rule)`:

    "model": (q_pos + 1) // ratio   only blocks complete at q_pos, as
                                    DeepSeek-V4 and vLLM do (the default);
    "seed":  q_pos // ratio + 1     the vendored kernel's `s <= q_pos // ratio`,
                                    which also admits the block holding the
                                    query's own future tokens.

  Works on Python ints, NumPy and JAX arrays. Decode rows
  (q_pos = seq_len - 1) agree under both rules whenever seq_len % ratio == 0.
  """
  if causal_rule == "model":
    return (q_pos + 1) // compression_ratio
  if causal_rule == "seed":
    return q_pos // compression_ratio + 1
  check_causal_rule(causal_rule)


def _is_int(v) -> bool:
  return isinstance(v, numbers.Integral) and not isinstance(v, bool)


def normalize_per_case(value, name: str) -> tuple[int, int, int]:
  """A positive int or a (decode, prefill, mixed) triple -> three ints.

  The kernels take `num_kv_pages_per_block` and `num_queries_per_block` in
  this form. A NumPy integer is refused: the vendored kernel tells an int
  from a triple with `isinstance(v, int)`, and jit's static arguments must
  hash alike. Raises `ValueError("<name>: <rule> (got ...)")`.
  """
  if isinstance(value, numbers.Integral) and not isinstance(value, (int, bool)):
    raise ValueError(
        f"{name}: must be a Python int or a (decode, prefill, mixed) tuple; "
        f"a NumPy integer is not accepted, pass int(...) "
        f"(got {type(value).__name__} {value})")
  if _is_int(value):
    if value <= 0:
      raise ValueError(f"{name}: must be a positive int (got {value!r})")
    return (int(value),) * 3
  if isinstance(value, (tuple, list)) and len(value) == 3:
    for i, x in enumerate(value):
      if not _is_int(x) or x <= 0:
        raise ValueError(f"{name}[{i}]: must be a positive int (got {x!r})")
    return tuple(int(x) for x in value)
  raise ValueError(
      f"{name}: must be a positive int or a (decode, prefill, mixed) tuple of "
      f"three positive ints (got {value!r})")


@dataclasses.dataclass(frozen=True)
class TokenLaunch:
  """One `pallas_call` of `streamindex_topk`: which sequences, how batched.

  Attributes:
    case: "decode" (batched), "decode_rest" (the remainder of the decode range
      that does not fill a batch), "prefill" or "mixed".
    start, end: the sequences [start, end) it covers (ints, or traced int32
      when built from a traced `distribution`).
    seq_batch_size: sequences per program (`decode_req_batch_size` for the
      batched decode launch, else 1).
    static_q_len: the call's `decode_q_len` for the decode launches (1, or
      gamma + 1 rows per sequence under speculative decoding); None where
      each sequence's q_len comes from `cu_q_lens`.
    block_case: index into the per-case block sizes (0 decode, 1 prefill,
      2 mixed): the decode launches use the decode sizes.
  """

  case: str
  start: Any
  end: Any
  seq_batch_size: int
  static_q_len: int | None
  block_case: int

  def bq_sz(self, num_queries_per_block: int) -> int:
    """Query rows per block: static_q_len where q_len is static (M17: all
    rows of a decode sequence in one block, whatever num_queries_per_block,
    so a batch's score rows are one contiguous range)."""
    if self.static_q_len is None:
      return num_queries_per_block
    return self.static_q_len


def token_launches(distribution, decode_req_batch_size: int,
                   decode_q_len: int = 1) -> tuple[TokenLaunch, ...]:
  """The four launches `streamindex_topk` makes, in its order.

  With distribution (i, j, n), d = decode_req_batch_size and Q =
  decode_q_len (1, or gamma + 1 under speculative decoding):

    1. decode:       [0, i // d * d), d sequences per program, q_len Q;
    2. decode_rest:  [i // d * d, i), one sequence per program, q_len Q;
    3. prefill:      [i, j), one per program, dynamic q_len, prefill blocks
                     (local modification M4: the seed sent these to decode);
    4. mixed:        [j, n), one per program, dynamic q_len.

  `distribution` may be a traced int32[3]; the bounds are then traced too.
  Every launch exists even when its range is empty (a grid of 0 programs).
  """
  i, j, n = distribution[0], distribution[1], distribution[2]
  d = decode_req_batch_size
  decode_end = i // d * d
  return (
      TokenLaunch("decode", 0, decode_end, d, decode_q_len, 0),
      TokenLaunch("decode_rest", decode_end, i, 1, decode_q_len, 0),
      TokenLaunch("prefill", i, j, 1, None, 1),
      TokenLaunch("mixed", j, n, 1, None, 2),
  )


# ---------------------------------------------------------------------------
# VMEM scratch of one launch (local modification M11).


def _dtype(dtype):
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top

  return jnp.dtype(dtype)


def launch_scratch(
    *,
    seq_batch_size: int,
    bq_sz: int,
    bkv_p: int,
    page_size_per_kv_packing: int,
    kv_packing: int,
    lkv_dim: int,
    cache_dtype,
    num_q_heads: int,
    head_dim: int,
    q_dtype,
    weights_dtype,
    num_out_sublanes: int,
):
  """The VMEM scratch buffers of one launch, in `_scores_kernel`'s order.

  Returns ((name, shape, dtype), ...) for bkv_x2 (the KV block double
  buffer), bq_x2 (query block), bq_weights_x2 (indexer weights) and
  scores_block_x2 (f32 scores on their way to HBM; `num_out_sublanes`
  128-lane rows per query row: bkv_sz // 128 in token mode, the pooled page
  columns // 128 in page mode). The DMA semaphores are not VMEM.
  """
  b = seq_batch_size
  return (
      ("bkv_x2", (2, b, bkv_p * page_size_per_kv_packing, kv_packing, lkv_dim),
       _dtype(cache_dtype)),
      ("bq_x2", (2, b, bq_sz, num_q_heads, head_dim), _dtype(q_dtype)),
      ("bq_weights_x2", (2, b, bq_sz, num_q_heads), _dtype(weights_dtype)),
      ("scores_block_x2", (2, b * bq_sz, num_out_sublanes, LANES),
       _dtype("float32")),
  )


def tiled_vmem_bytes(shape, dtype, tpu_generation: int = 5) -> int:
  """Bytes of a VMEM buffer as Mosaic lays it out: the last two dims in tiles.

  The minor dim pads to 128 lanes; the second-minor to the sublane tiling
  Mosaic infers for the dtype (`pltpu`'s `infer_tiling`: the dtype's packing
  per 32-bit word, doubled up to 8 rows while the dim is larger; twice that
  before TPU v4). Leading dims are not padded.
  """
  shape = tuple(int(d) for d in shape)
  itemsize = _dtype(dtype).itemsize
  if len(shape) < 2:
    n = shape[0] if shape else 1
    return align_to(n * itemsize, 4 * LANES)
  packing = max(1, 4 // itemsize)
  tiling = (1 + int(tpu_generation < 4)) * packing
  while tiling < min(shape[-2], 8):
    tiling *= 2
  lead = 1
  for d in shape[:-2]:
    lead *= d
  return lead * align_to(shape[-2], tiling) * align_to(shape[-1], LANES) * itemsize


def scratch_vmem_bytes(scratch, tpu_generation: int = 5) -> int:
  """Total tiled VMEM bytes of a `launch_scratch` list."""
  return sum(tiled_vmem_bytes(shape, dtype, tpu_generation)
             for _, shape, dtype in scratch)


# ---------------------------------------------------------------------------
# Length-sorted decode batching (`sort_decode`).
#
# The batched decode launch groups the decode range [0, i) into consecutive
# programs of d = decode_req_batch_size sequences and runs each program for
# the KV blocks of its longest sequence; the last i % d sequences run alone
# (`token_launches`). Reordering the range before grouping changes only how
# many blocks are computed for nothing. The kernels permute the sequence
# metadata (`apply_decode_order`), score in that order, and put the caller's
# row order back on the top-k indices (`restore_decode_rows`).


def decode_blocks(seq_lens, num_decode, *, compression_ratio: int,
                  bkv_sz: int):
  """i32[max_num_seqs]: KV blocks each decode sequence needs; 0 past i.

  A sequence of seq_len tokens has seq_len // ratio entries and needs
  max(1, cdiv(entries, bkv_sz)) blocks of bkv_sz entries (a program always
  computes at least one). Traceable (JAX); NumPy inputs are accepted.
  """
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top

  seq_lens = jnp.asarray(seq_lens, jnp.int32)
  live = jnp.arange(seq_lens.shape[0], dtype=jnp.int32) < num_decode
  blocks = jnp.maximum(1, cdiv(jnp.maximum(seq_lens, 0) // compression_ratio,
                               bkv_sz))
  return jnp.where(live, blocks, 0)


def _batched_cost(blocks_in_order, num_decode, d: int):
  """Blocks computed by the decode launches for sequences in this order."""
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top

  s = blocks_in_order.shape[0]
  grouped = num_decode // d * d
  slot = jnp.arange(s, dtype=jnp.int32)
  padded = jnp.pad(blocks_in_order, (0, (-s) % d)).reshape(-1, d)
  group = jnp.arange(padded.shape[0], dtype=jnp.int32)
  heads = jnp.where(group * d < grouped, padded.max(axis=1), 0)
  alone = jnp.where((slot >= grouped) & (slot < num_decode), blocks_in_order,
                    0)
  return d * jnp.sum(heads) + jnp.sum(alone)


def decode_order(seq_lens, num_decode, *, compression_ratio: int, bkv_sz: int,
                 decode_req_batch_size: int):
  """The order `sort_decode` scores the decode range [0, i) in.

  Returns (order i32[max_num_seqs], blocks_given i32[], blocks_sorted i32[]):
  slot j of the decode launches scores sequence order[j] (order[j] = j for
  j >= i, and when nothing is gained), and the KV blocks the decode launches
  compute in the given order and in `order`.

  Candidates, all in O(max_num_seqs * d) vector work (no sequential loop):
  with the i sequences sorted by blocks, longest first (stable), and r = i %
  d of them to run alone, candidate c (0 <= c <= r) lets the c longest and
  the r - c shortest run alone and groups the rest consecutively (c = r is
  "ascending" with the longest alone, c = 0 "descending"). The cheapest
  candidate by the blocks computed wins; the given order wins ties, so the
  sorted order never computes more blocks than the given one.

  Args:
    seq_lens: i32[max_num_seqs] tokens per sequence (traced or concrete).
    num_decode: i, the length of the decode range (traced or concrete).
    compression_ratio, bkv_sz: the decode launch's ratio and entries per KV
      block (`num_kv_pages_per_block[0] * page_size`).
    decode_req_batch_size: d.
  """
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top

  d = int(decode_req_batch_size)
  seq_lens = jnp.asarray(seq_lens, jnp.int32)
  s = seq_lens.shape[0]
  n = jnp.clip(jnp.asarray(num_decode, jnp.int32), 0, s)
  blocks = decode_blocks(seq_lens, n, compression_ratio=compression_ratio,
                         bkv_sz=bkv_sz)
  slot = jnp.arange(s, dtype=jnp.int32)
  # Longest first; slots past i keep their place at the end (key 1 > -blocks).
  desc = jnp.argsort(jnp.where(slot < n, -blocks, 1), stable=True).astype(
      jnp.int32)
  r = n % d
  grouped = n - r
  best = slot
  best_cost = _batched_cost(blocks, n, d)
  given_cost = best_cost
  for c in range(d):
    pos = jnp.where(slot < grouped, slot + c,
                    jnp.where(slot < grouped + c, slot - grouped, slot))
    order = desc[jnp.clip(pos, 0, s - 1)]
    cost = _batched_cost(blocks[order], n, d)
    take = (c <= r) & (cost < best_cost)
    best = jnp.where(take, order, best)
    best_cost = jnp.where(take, cost, best_cost)
  return best, given_cost, best_cost


def apply_decode_order(order, seq_lens, page_indices, cu_q_lens):
  """The kernel's metadata in slot order.

  Returns (seq_lens i32[S], page_indices i32[S * pages_per_seq], q_rows
  i32[S]): slot j gets sequence order[j]'s length and page-table row, and
  q_rows[j] = cu_q_lens[order[j]], the first query row it reads. cu_q_lens
  itself is not permuted: it still gives each slot's query count
  (decode_q_len in the decode range) and the rows its scores are written
  to (slot j's own), so the decode launches' score rows are in slot order.
  """
  max_num_seqs = seq_lens.shape[0]
  pages_per_seq = page_indices.shape[0] // max_num_seqs
  table = page_indices.reshape(max_num_seqs, pages_per_seq)
  return (seq_lens[order], table[order].reshape(-1), cu_q_lens[:-1][order])


def restore_decode_rows(rows, order, decode_q_len: int = 1):
  """`rows` (top-k indices i32[T, k], slot order) back in the caller's order.

  Decode sequence b owns token rows [Q b, Q b + Q) (Q = decode_q_len rows
  each from row 0), so slot j's rows hold sequence order[j]'s results; rows
  [Q order[j], ...) get them back. Rows past the decode range are unchanged
  (order is the identity there).
  """
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top

  q = int(decode_q_len)
  m = min(rows.shape[0] // q, order.shape[0])
  inverse = jnp.argsort(order)[:m]
  src = (inverse[:, None] * q + jnp.arange(q)[None, :]).reshape(-1)
  return rows.at[:m * q].set(rows[src])
