"""The rules every kernel, reference, validator and model shares (one home
each): causal visibility, per-case block sizes, the launches of
`streamindex_topk`, the length-sorted decode order (`sort_decode`), a
launch's VMEM scratch, the integer helpers; on Python ints, NumPy and
(where it says so) traced JAX values. Vocabulary: docs/semantics.md.
"""

from __future__ import annotations

import dataclasses
import numbers
from typing import Any

import jax.numpy as jnp

LANES = 128  # the TPU vector lane count: the kernel's row and score width
DEFAULT_VMEM_LIMIT_BYTES = 100 * 1024 * 1024  # the vendored kernel's default
PAGE_VMEM_LIMIT_BYTES = 64 * 1024 * 1024  # its page-mode default

CAUSAL_RULES = ("model", "seed")
DEFAULT_CAUSAL_RULE = CAUSAL_RULES[0]  # the model's rule (local modification M3)
CASES = ("decode", "prefill", "mixed")  # the order of per-case block sizes


def cdiv(a, b):
  """ceil(a / b) for non-negative a and positive b (ints or JAX integers)."""
  return (a + b - 1) // b


def align_to(x, a):
  """x rounded up to a multiple of a."""
  return cdiv(x, a) * a


def mib(n: int) -> str:
  """Bytes as the VMEM rules' messages write them: "1.50 MiB"."""
  return f"{n / 2**20:.2f} MiB"


def check_causal_rule(causal_rule) -> None:
  if causal_rule not in CAUSAL_RULES:
    raise ValueError(f"causal_rule: must be one of {CAUSAL_RULES} "
                     f"(got {causal_rule!r})")


def causal_visible_bound(q_pos, compression_ratio, causal_rule):
  """Entry s is causally visible to the query at absolute position `q_pos`
  iff s < this bound: "model" (q_pos + 1) // ratio (DeepSeek-V4's, vLLM's),
  "seed" q_pos // ratio + 1 (the vendored s <= q_pos // ratio)."""
  if causal_rule == "model":
    return (q_pos + 1) // compression_ratio
  if causal_rule == "seed":
    return q_pos // compression_ratio + 1
  check_causal_rule(causal_rule)


def _is_int(v) -> bool:
  return isinstance(v, numbers.Integral) and not isinstance(v, bool)


def normalize_per_case(value, name: str) -> tuple[int, int, int]:
  """A positive int or a (decode, prefill, mixed) triple -> three ints. A
  NumPy integer is refused (the vendored kernel tests `isinstance(v, int)`)."""
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
  """One `pallas_call` of `streamindex_topk`: which sequences, how batched."""

  case: str  # "decode" (batched), "decode_rest" (unbatched), "prefill", "mixed"
  start: Any  # the sequences [start, end) (ints, or traced int32)
  end: Any
  seq_batch_size: int  # sequences per program
  static_q_len: int | None  # decode launches: decode_q_len; None: from cu_q_lens
  block_case: int  # index into the per-case block sizes (0, 1, 2)

  def bq_sz(self, num_queries_per_block: int) -> int:
    """Query rows per block: static_q_len where q_len is static (M17: all
    rows of a decode sequence in one block, whatever num_queries_per_block,
    so a batch's score rows are one contiguous range)."""
    if self.static_q_len is None:
      return num_queries_per_block
    return self.static_q_len


def token_launches(distribution, decode_req_batch_size: int,
                   decode_q_len: int = 1) -> tuple[TokenLaunch, ...]:
  """The four launches `streamindex_topk` makes, in its order, for
  distribution (i, j, n) (maybe traced), d = decode_req_batch_size, Q =
  decode_q_len: decode [0, i // d * d) d sequences a program, decode_rest
  [i // d * d, i) one, q_len Q; prefill [i, j) (M4) and mixed [j, n) one
  sequence a program, dynamic q_len."""
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


_dtype = jnp.dtype


def score_rows(mode: str, pages_per_seq: int, page_size: int,
               num_kv_pages_per_block) -> int:
  """128-lane rows of one query row's f32 score buffer: token mode, the
  page table's columns in whole KV blocks of each case's
  num_kv_pages_per_block (a triple), the widest; page mode, the pooled page
  maxima, pages_per_seq in whole KV blocks and 128-lane rows."""
  if mode == "token":
    return max(align_to(pages_per_seq, p) * page_size // LANES
               for p in num_kv_pages_per_block)
  bkv_p = num_kv_pages_per_block
  return align_to(cdiv(pages_per_seq, bkv_p) * bkv_p, LANES) // LANES


def launch_scratch(*, seq_batch_size: int, bq_sz: int, bkv_p: int,
                   page_size_per_kv_packing: int, kv_packing: int,
                   lkv_dim: int, cache_dtype, num_q_heads: int, head_dim: int,
                   q_dtype, weights_dtype, num_out_sublanes: int,
                   scale_block: tuple[int, ...] | None = None,
                   kv_slots: int = 2):
  """((name, shape, dtype), ...): the VMEM scratch of one launch, in
  `_scores_kernel`'s order (the DMA semaphores are not VMEM).
  `num_out_sublanes`: 128-lane score rows per query row (bkv_sz // 128 in token
  mode, the pooled page columns // 128 in page mode). scale_block: a page's
  scales in a two-array cache layout (dense FP8, MXFP4), whose double buffer
  "bscale_x2" u8[2, B, bkv_p, *scale_block] follows the values'.
  kv_slots: the KV blocks (values and scales) buffered, 3 where two are in
  flight (`driver.KernelBody.kv_slots`)."""
  b = seq_batch_size
  scales = (() if scale_block is None else (
      ("bscale_x2", (kv_slots, b, bkv_p, *scale_block), _dtype("uint8")),))
  return (
      ("bkv_x2", (kv_slots, b, bkv_p * page_size_per_kv_packing, kv_packing,
                  lkv_dim),
       _dtype(cache_dtype)),
      *scales,
      ("bq_x2", (2, b, bq_sz, num_q_heads, head_dim), _dtype(q_dtype)),
      ("bq_weights_x2", (2, b, bq_sz, num_q_heads), _dtype(weights_dtype)),
      ("scores_block_x2", (2, b * bq_sz, num_out_sublanes, LANES),
       _dtype("float32")),
  )


def tiled_vmem_bytes(shape, dtype, tpu_generation: int = 5) -> int:
  """Bytes of a VMEM buffer as Mosaic tiles it: the minor dim padded to 128
  lanes, the second-minor to `pltpu`'s `infer_tiling` (the dtype's packing
  per 32-bit word, doubled up to 8 rows while the dim is larger; twice that
  before TPU v4); leading dims unpadded."""
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
# Length-sorted decode batching (`sort_decode`): each program of d decode
# sequences runs for the KV blocks of its longest one, so reordering the
# decode range changes only the blocks computed for nothing (docs/semantics.md).


def _batched_cost(blocks_in_order, num_decode, d: int):
  """Blocks computed by the decode launches for sequences in this order."""
  s = blocks_in_order.shape[0]
  grouped = num_decode // d * d
  slot = jnp.arange(s, dtype=jnp.int32)
  padded = jnp.pad(blocks_in_order, (0, (-s) % d)).reshape(-1, d)
  group = jnp.arange(padded.shape[0], dtype=jnp.int32)
  heads = jnp.where(group * d < grouped, padded.max(axis=1), 0)
  alone = jnp.where((slot >= grouped) & (slot < num_decode), blocks_in_order, 0)
  return d * jnp.sum(heads) + jnp.sum(alone)


def decode_order(seq_lens, num_decode, *, compression_ratio: int, bkv_sz: int,
                 decode_req_batch_size: int):
  """The order `sort_decode` scores the decode range [0, i) in
  (docs/semantics.md): (order i32[max_num_seqs], blocks_given i32[],
  blocks_sorted i32[]); slot j scores sequence order[j] (j itself past i
  and when nothing is gained). Candidate c (0 <= c <= i % d) of the
  sequences sorted longest first runs the c longest and the i % d - c
  shortest alone; the cheapest wins, the given order on ties. seq_lens and
  num_decode may be traced; bkv_sz is the decode KV block's entries.
  """
  d = int(decode_req_batch_size)
  seq_lens = jnp.asarray(seq_lens, jnp.int32)
  s = seq_lens.shape[0]
  n = jnp.clip(jnp.asarray(num_decode, jnp.int32), 0, s)
  slot = jnp.arange(s, dtype=jnp.int32)
  # The KV blocks each decode sequence needs (a program computes at least
  # one); 0 past i.
  blocks = jnp.where(slot < n, jnp.maximum(1, cdiv(
      jnp.maximum(seq_lens, 0) // compression_ratio, bkv_sz)), 0)
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
  """The kernel's metadata in slot order: (seq_lens i32[S], page_indices
  i32[S * pages_per_seq], q_rows i32[S]), slot j getting sequence order[j]'s
  length, page-table row and first query row. cu_q_lens is not permuted: it
  still gives each slot's query count (decode_q_len
  in the decode range) and score row (slot j's own)."""
  max_num_seqs = seq_lens.shape[0]
  pages_per_seq = page_indices.shape[0] // max_num_seqs
  table = page_indices.reshape(max_num_seqs, pages_per_seq)
  return (seq_lens[order], table[order].reshape(-1), cu_q_lens[:-1][order])


def row_sequences(cu_q_lens, num_seqs, num_tokens: int):
  """i32[num_tokens]: the sequence each query row belongs to, -1 for a
  padding row (sequence b < num_seqs owns rows [cu_q_lens[b], cu_q_lens[b +
  1])). JAX arrays, traced or not."""
  t = jnp.arange(num_tokens, dtype=jnp.int32)
  max_num_seqs = cu_q_lens.shape[0] - 1
  seq = jnp.searchsorted(cu_q_lens[1:], t, side="right").astype(jnp.int32)
  seq_c = jnp.clip(seq, 0, max_num_seqs - 1)
  live = ((seq < num_seqs) & (t >= cu_q_lens[seq_c])
          & (t < cu_q_lens[seq_c + 1]))
  return jnp.where(live, seq, -1)


def restore_decode_rows(rows, order, decode_q_len: int = 1):
  """`rows` (i32[T, k], slot order) in the caller's order: decode sequence b
  owns token rows [Q b, Q b + Q) (Q = decode_q_len), so rows [Q order[j],
  ...) get slot j's rows (the identity past the decode range)."""
  q = int(decode_q_len)
  m = min(rows.shape[0] // q, order.shape[0])
  inverse = jnp.argsort(order)[:m]
  src = (inverse[:, None] * q + jnp.arange(q)[None, :]).reshape(-1)
  return rows.at[:m * q].set(rows[src])
