"""Addressing and masks: where an entry lives, which entries a query sees.

Holds `locate_entry` (sequence-local entry -> physical page, row and slot of
the packed cache, through the page table and `streamidx.cache`'s packing)
and the causal visibility masks (`visibility_mask`, `causal_rule_difference`),
built on `streamidx.semantics.causal_visible_bound`, the one definition of
the causal rules that the kernel and the references use too.

Vocabulary is `streamidx.cache`'s (entry, page, record, kv_packing,
page_size_per_kv_packing) and `streamidx.batch`'s (distribution,
cu_q_lens). `locate_dense_entry` is `locate_entry` for the dense FP8 pair
(values and scales in two arrays), and `unmasked_row_scores` scores every
entry of a query row's sequence with the masks left out, to show what the
causal mask removes. Plain NumPy and the reference's arithmetic: no kernel
is built.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from streamidx import cache as cache_lib
from streamidx.semantics import causal_visible_bound, check_causal_rule

__all__ = [
    "EntryAddress",
    "locate_entry",
    "DenseEntryAddress",
    "locate_dense_entry",
    "unmasked_row_scores",
    "plant_key",
    "ChunkMasks",
    "prefill_chunk_masks",
    "batch_visibility",
    "returned_sets",
    "visibility_mask",
    "causal_rule_difference",
]


@dataclasses.dataclass(frozen=True)
class EntryAddress:
  """Where sequence-local entry `entry` of sequence `seq` lives.

  The record is `cache[physical_page, row, slot, :]`; in the 32-bit word at
  (physical_page, row, lane) it is the `slot`-th of `kv_packing` packed
  records (byte `slot` for FP8, half-word `slot` for bf16).
  """

  seq: int
  entry: int
  local_page: int
  offset_in_page: int
  physical_page: int
  row: int
  slot: int
  kv_packing: int

  @property
  def index(self) -> tuple[int, int, int]:
    return self.physical_page, self.row, self.slot


def locate_entry(batch, seq: int, entry: int, fmt: str = "fp8") -> EntryAddress:
  """Address of entry `entry` of sequence `seq` of a `RaggedBatch`.

  Uses `streamidx.cache.entry_location` on the sequence's page-table row.
  Raises if the sequence does not hold that entry.
  """
  if not 0 <= seq < batch.num_seqs:
    raise ValueError(f"seq must be in [0, {batch.num_seqs}), got {seq}")
  held = int(batch.num_entries[seq])
  if not 0 <= entry < held:
    raise ValueError(f"entry must be in [0, {held}) for sequence {seq} "
                     f"(seq_len {int(batch.seq_lens[seq])}, ratio "
                     f"{batch.compression_ratio}), got {entry}")
  page, row, slot = cache_lib.entry_location(entry, batch.page_table[seq],
                                             batch.page_size, fmt)
  return EntryAddress(seq, entry, entry // batch.page_size,
                      entry % batch.page_size, page, row, slot,
                      cache_lib.kv_packing(fmt))


@dataclasses.dataclass(frozen=True)
class DenseEntryAddress:
  """Where entry `entry` of sequence `seq` lives in the dense FP8 pair.

  Its e4m3 values are `cache_values[physical_page, row, slot, :]` (the FP8
  record's packing: 4 entries per 32-bit word), its e8m0 scale byte
  `cache_scales[physical_page, scale_row, scale_lane]` (L =
  `cache.dense_scale_lanes(page_size)` lanes per scale row).
  """

  seq: int
  entry: int
  physical_page: int
  row: int
  slot: int
  scale_row: int
  scale_lane: int

  @property
  def values_index(self) -> tuple[int, int, int]:
    return self.physical_page, self.row, self.slot

  @property
  def scale_index(self) -> tuple[int, int, int]:
    return self.physical_page, self.scale_row, self.scale_lane


def locate_dense_entry(batch, seq: int, entry: int) -> DenseEntryAddress:
  """`locate_entry` for the dense FP8 cache (`cache.pack_dense_fp8_cache`)."""
  a = locate_entry(batch, seq, entry, "fp8")  # same values packing, checks
  lanes = cache_lib.dense_scale_lanes(batch.page_size)
  return DenseEntryAddress(seq, entry, a.physical_page, a.row, a.slot,
                           a.offset_in_page // lanes, a.offset_in_page % lanes)


def _stored_keys(cache, head_dim: int, page_size: int):
  """NumPy: (values f32[pages, page_size, head_dim], scales f32[pages,
  page_size] or None) as the kernel reads them from any cache format."""
  import ml_dtypes  # pylint: disable=g-import-not-at-top

  def e4m3(u8):
    return u8.view(ml_dtypes.float8_e4m3fn).astype(np.float32)

  def e8m0(u8):
    return np.ldexp(np.float32(1), u8.astype(np.int32) - cache_lib.E8M0_BIAS)

  if isinstance(cache, (tuple, list)):  # the dense FP8 pair
    values, scales = (np.asarray(a) for a in cache)
    pages = values.shape[0]
    return (e4m3(values.reshape(pages, page_size, -1)[..., :head_dim]),
            e8m0(scales.reshape(pages, page_size)))
  flat = np.asarray(cache)
  flat = flat.reshape(flat.shape[0], page_size, flat.shape[-1])
  if flat.dtype == np.uint8:  # the packed FP8 record
    return (e4m3(flat[..., :head_dim]),
            e8m0(flat[..., cache_lib.padded_head_dim(head_dim)]))
  return flat[..., :head_dim].astype(np.float32), None


def unmasked_row_scores(inputs, row: int) -> np.ndarray:
  """f32[seq_len // ratio]: query row `row` against every entry of its
  sequence, the causal and length masks left out.

  Entry s of the row's sequence is scored with the reference's formula
  (`streamidx.ref.score_entries`: f32 dot, ReLU, weighted head sum, then the
  FP8 scale) from the cache's stored values and scales, whether or not the
  row may see it; in NumPy float32, so the sums may round in another order:
  on the entries the row sees it equals `streamidx.token_scores`' row within
  `metrics.summation_atol`. On the others it is the score the mask hides.

  Args:
    inputs: `streamidx.IndexerInputs` (any cache format).
    row: a query row of a sequence (not a padding row).
  """
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top

  b = inputs.batch
  seq = int(b.token_seq_ids()[row])
  if seq < 0:
    raise ValueError(f"row: must be a query row of a sequence (got {row}, "
                     "a padding row)")
  entries = int(b.num_entries[seq])
  values, scales = _stored_keys(inputs.cache, inputs.head_dim,
                                int(b.page_size))
  pages = np.asarray(b.page_table[seq, :int(b.num_pages_used[seq])])
  kv = values[pages].reshape(-1, values.shape[-1])[:entries]
  q = np.asarray(inputs.q[row].astype(jnp.float32))
  w = np.asarray(inputs.weights[row], np.float32)
  s = (np.maximum(q @ kv.T, 0) * w[:, None]).sum(axis=0)
  if scales is not None:
    s = s * scales[pages].reshape(-1)[:entries]
  return s.astype(np.float32)


def visibility_mask(q_positions, num_entries: int, compression_ratio: int,
                    causal_rule: str = "model", seq_len: int | None = None):
  """bool[T, num_entries]: which entries each query position may see.

  Args:
    q_positions: int[T] absolute positions of the query tokens.
    num_entries: columns (sequence-local compressed entries 0..E-1).
    compression_ratio: tokens per entry.
    causal_rule: "model" (entries complete at p: s < (p + 1) // ratio) or
      "seed" (s <= p // ratio), as `streamidx.semantics.causal_visible_bound`.
    seq_len: if given, also hide entries at or past seq_len // ratio (the
      kernel's length mask).
  """
  check_causal_rule(causal_rule)
  pos = np.asarray(q_positions, np.int64).reshape(-1)
  bound = causal_visible_bound(pos, compression_ratio, causal_rule)
  s = np.arange(num_entries)
  mask = s[None, :] < bound[:, None]
  if seq_len is not None:
    mask &= s[None, :] < seq_len // compression_ratio
  return mask


def causal_rule_difference(q_positions, num_entries: int,
                           compression_ratio: int, seq_len: int | None = None):
  """bool[T, E]: entries the seed's rule shows and the model's rule hides.

  The model's visible set is a subset of the seed's, so this is the whole
  difference: the block that holds the query's own (future) tokens.
  """
  seed = visibility_mask(q_positions, num_entries, compression_ratio, "seed",
                         seq_len)
  model = visibility_mask(q_positions, num_entries, compression_ratio, "model",
                          seq_len)
  return seed & ~model


def plant_key(inputs, seq: int, entry: int, row: int, *, norm: float = 64.0):
  """`inputs` with entry `entry` of sequence `seq` replaced by a key aligned
  with query row `row`: `norm * d / |d|`, d = sum_h w[row, h] q[row, h].

  That key scores far above every random one for `row`, so a kernel that
  reads the cache at the address `locate_entry` gives returns `entry` first
  for that row. The cache is repacked in `inputs.fmt`.
  """
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top

  addr = locate_entry(inputs.batch, seq, entry, "fp8")
  q = np.asarray(inputs.q[row].astype(jnp.float32))
  d = (np.asarray(inputs.weights[row])[:, None] * q).sum(0)
  keys = inputs.keys.at[addr.physical_page, addr.offset_in_page].set(
      jnp.asarray(norm * d / np.linalg.norm(d)))
  return dataclasses.replace(inputs, keys=keys).with_cache_format(inputs.fmt)


@dataclasses.dataclass(frozen=True)
class ChunkMasks:
  """The visibility of one prefill chunk's rows, over its last entries.

  masks[rule] and leak are bool[q_len, n_entries - first_entry]: column c is
  entry first_entry + c; leak marks the cells only the "seed" rule shows.
  """

  seq: int
  positions: np.ndarray
  seq_len: int
  n_entries: int
  first_entry: int
  masks: dict
  leak: np.ndarray

  @property
  def leak_rows(self) -> int:
    return int(self.leak.any(axis=1).sum())

  @property
  def leak_cells(self) -> int:
    return int(self.leak.sum())


def prefill_chunk_masks(batch, seq: int, *, window: int) -> ChunkMasks:
  """Both causal rules on the chunk of sequence `seq`, its last `window`
  entries (no cell left of the window differs: checked)."""
  ratio = int(batch.compression_ratio)
  lo, hi = int(batch.cu_q_lens[seq]), int(batch.cu_q_lens[seq + 1])
  seq_len = int(batch.seq_lens[seq])
  positions = batch.token_positions()[lo:hi]
  n = seq_len // ratio
  first = max(0, n - window)
  leak = causal_rule_difference(positions, n, ratio, seq_len=seq_len)
  if leak[:, :first].any():
    raise AssertionError("the rules differ left of the window")
  masks = {rule: visibility_mask(positions, n, ratio, rule,
                                 seq_len=seq_len)[:, first:]
           for rule in ("model", "seed")}
  return ChunkMasks(seq, positions, seq_len, n, first, masks, leak[:, first:])


def batch_visibility(batch, columns: int, causal_rule: str = "model"):
  """bool[T, columns]: each query row's visible entries under `causal_rule`
  (padding rows see nothing)."""
  seq_of, pos = batch.token_seq_ids(), batch.token_positions()
  out = np.zeros((batch.num_tokens, columns), bool)
  for r in np.flatnonzero(seq_of >= 0):
    out[r] = visibility_mask(pos[r:r + 1], columns, batch.compression_ratio,
                             causal_rule,
                             seq_len=int(batch.seq_lens[seq_of[r]]))[0]
  return out


def returned_sets(indices, columns: int):
  """bool[T, columns]: the entries each row of a top-k result holds (-1
  padding dropped)."""
  idx = np.asarray(indices)
  out = np.zeros((idx.shape[0], columns), bool)
  rows, cols = np.nonzero(idx >= 0)
  out[rows, idx[rows, cols]] = True
  return out
