"""Named batches for the kernel-vs-reference matrix.

All cases share one set of static shapes (query rows, sequence slots,
page-table columns, page size, heads), so each (cache format, ratio, k,
causal rule) compiles the kernel once for the whole matrix. Sequence lengths
are given in compressed entries and scaled by the compression ratio, so every
case means the same thing at ratios 1, 2 and 4.
"""

from __future__ import annotations

import dataclasses

import streamidx as si

NUM_TOKENS = 48
MAX_NUM_SEQS = 10
PAGE_SIZE = 16
PAGES_PER_SEQ = 24  # 384 entries per sequence: 3 KV blocks of 128 (decode)
NUM_HEADS = 4
NUM_ENTRIES = PAGE_SIZE * PAGES_PER_SEQ
BLOCKS = dict(num_kv_pages_per_block=(8, 16, 8),
              num_queries_per_block=(1, 8, 8))
TOTAL_NUM_PAGES = 2 * MAX_NUM_SEQS * PAGES_PER_SEQ  # room for "fragmented"
# One k serves both regimes in every case: rows that see more than K entries
# (ranking matters) and rows that see fewer (the mask and -1 padding matter).
# k is static, so a single value also means a single compile per config.
K = 40
K_SMALL = 8


@dataclasses.dataclass(frozen=True)
class Case:
  """decode: entries per decode seq; prefill/mixed: (q_len, entries, extra).

  A sequence with `entries` compressed entries and `extra` trailing tokens
  has seq_len = entries * ratio + extra (extra < ratio keeps the count).
  """

  name: str
  decode: tuple = ()
  prefill: tuple = ()
  mixed: tuple = ()
  allocation: str = "contiguous"

  def batch(self, ratio: int) -> si.RaggedBatch:
    def seq_len(entries, extra=0):
      return entries * ratio + min(extra, ratio - 1)

    def pair(q, entries, extra=0):
      return (q, max(seq_len(entries, extra), q))

    return si.make_mixed_batch(
        decode=[max(seq_len(e), 1) for e in self.decode],
        prefill=[pair(*p) for p in self.prefill],
        mixed=[pair(*p) for p in self.mixed],
        page_size=PAGE_SIZE, compression_ratio=ratio, allocation=self.allocation,
        pages_per_seq=PAGES_PER_SEQ, max_num_seqs=MAX_NUM_SEQS,
        num_tokens=NUM_TOKENS, total_num_pages=TOTAL_NUM_PAGES,
        seed=len(self.name))


CASES = [
    Case("decode_only_full_batches", decode=(384, 5, 130, 300, 1, 64, 200, 383),
         allocation="fragmented"),
    Case("decode_only_with_remainder", decode=(50, 384, 7, 129, 256, 90)),
    Case("decode_only_fewer_than_batch", decode=(100, 3, 300),
         allocation="shuffled"),
    Case("prefill_only", prefill=((5, 40, 1), (13, 200, 3), (20, 384)),
         allocation="fragmented"),
    Case("mixed_only", mixed=((1, 100), (12, 300, 2), (0, 0), (2, 0, 1),
                              (9, 129))),
    Case("all_three_ranges",
         decode=(20, 384, 150, 2, 77), prefill=((7, 64, 1), (9, 260)),
         mixed=((1, 33), (12, 190, 3), (0, 0)), allocation="fragmented"),
    Case("prefill_and_decode_in_mixed_range",
         mixed=((1, 384), (16, 180, 1), (1, 5), (8, 8), (1, 0, 1)),
         allocation="shuffled"),
    Case("empty_and_tiny_sequences",
         decode=(0, 1, 0, 2), mixed=((0, 0), (0, 10), (1, 0), (3, 1, 1)),
         allocation="fragmented"),
]

CASE_IDS = [c.name for c in CASES]
