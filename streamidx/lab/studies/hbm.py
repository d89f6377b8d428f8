"""HBM arithmetic: the bytes one decode token moves in one indexer layer.

Holds `decode_step_bytes` / `decode_step_table`: per context length and
entry layout (`streamidx.lab.studies.formats`), the cache read, the query
and weight read and the f32 score round trip of `streamindex_topk`.
A model from byte counts, not a measurement: notebook 02's HBM table.

- decode step: one new token per sequence. The indexer then scores every
  visible entry of its sequence once, in each layer that has an indexer.
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

from streamidx.lab.studies.formats import ENTRY_LAYOUTS, bytes_per_entry

__all__ = [
    "SCORE_BYTES_PER_COLUMN",
    "DecodeStepBytes",
    "decode_step_bytes",
    "decode_step_table",
]

# The kernel's f32 score buffer, per column and query row: XLA writes the
# -inf fill, the kernel writes the scores, the top-k reads them (3 x 4 B).
SCORE_BYTES_PER_COLUMN = 3 * 4


@dataclasses.dataclass(frozen=True)
class DecodeStepBytes:
  """HBM bytes one decode token moves in one indexer layer.

  Attributes:
    context: tokens in the sequence.
    entries: compressed entries visible to the new token (context // ratio).
    layout: the entry layout's name.
    cache_bytes: entries * bytes_per_entry: the cache read, which is also
      what the sequence's index cache occupies in that layer.
    query_bytes: the token's queries (bf16) and weights (f32).
    score_bytes: the f32 score round trip (`SCORE_BYTES_PER_COLUMN` per
      entry; the kernel's padded columns make the real figure slightly
      larger). A property of `streamindex_topk`, not of the layout.
  """

  context: int
  entries: int
  layout: str
  cache_bytes: int
  query_bytes: int
  score_bytes: int

  @property
  def total_bytes(self) -> int:
    return self.cache_bytes + self.query_bytes + self.score_bytes


def decode_step_bytes(context: int, layout: str, *, num_heads: int = 64,
                      head_dim: int = 128, compression_ratio: int = 4,
                      q_itemsize: int = 2) -> DecodeStepBytes:
  """HBM traffic of one decode token in one indexer layer (DeepSeek-V4 sizes
  by default: 64 heads, head_dim 128, compression ratio 4)."""
  if context < 0:
    raise ValueError(f"context must be >= 0, got {context}")
  if compression_ratio <= 0:
    raise ValueError(f"compression_ratio must be positive, got "
                     f"{compression_ratio}")
  entries = context // compression_ratio
  return DecodeStepBytes(
      context=int(context),
      entries=int(entries),
      layout=layout,
      cache_bytes=int(entries * bytes_per_entry(layout, head_dim)),
      query_bytes=int(num_heads * head_dim * q_itemsize + num_heads * 4),
      score_bytes=int(entries * SCORE_BYTES_PER_COLUMN),
  )


def decode_step_table(contexts: Sequence[int], layouts: Sequence[str] = ENTRY_LAYOUTS,
                      **kwargs) -> list[DecodeStepBytes]:
  """`decode_step_bytes` for every (context, layout), contexts outermost."""
  return [decode_step_bytes(c, name, **kwargs) for c in contexts
          for name in layouts]
