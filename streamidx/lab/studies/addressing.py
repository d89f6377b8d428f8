"""Addressing and masks: where an entry lives, which entries a query sees.

Holds `locate_entry` (sequence-local entry -> physical page, row and slot of
the packed cache, through the page table and `streamidx.cache`'s packing)
and the causal visibility masks (`visibility_mask`, `causal_rule_difference`),
built on `streamidx.semantics.causal_visible_bound`, the one definition of
the causal rules that the kernel and the references use too.

Vocabulary is `streamidx.cache`'s (entry, page, record, kv_packing,
page_size_per_kv_packing) and `streamidx.batch`'s (distribution,
cu_q_lens). Plain NumPy: no kernel is built.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from streamidx import cache as cache_lib
from streamidx.semantics import causal_visible_bound, check_causal_rule

__all__ = [
    "EntryAddress",
    "locate_entry",
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
