"""HBM arithmetic: the bytes one decode token moves in one indexer layer.

Holds `decode_step_bytes` / `decode_step_table`: per context length and
entry layout (`streamidx.lab.studies.formats`), the cache read, the query
and weight read and the f32 score round trip of `streamindex_topk`.
A model from byte counts, not a measurement: notebook 02's HBM table.
`decode_step_by_format` sets the cache formats side by side at one decode
step of a batch (the tiling model's KV blocks, the roofline's bound per TPU
generation), vendored packed FP8, dense FP8 and bf16.

- decode step: one new token per sequence. The indexer then scores every
  visible entry of its sequence once, in each layer that has an indexer.
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

from streamidx import cache as cache_lib
from streamidx.lab.studies.formats import ENTRY_LAYOUTS, bytes_per_entry

__all__ = [
    "SCORE_BYTES_PER_COLUMN",
    "DecodeStepBytes",
    "decode_step_bytes",
    "decode_step_table",
    "FORMAT_VARIANTS",
    "stored_bytes_per_entry",
    "decode_step_by_format",
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


# ---------------------------------------------------------------------------
# The cache formats side by side at one decode step (issue 13): the tiling
# model's KV blocks and the roofline's bound per TPU generation.

# (cache format, kernel variant that reads it), in table order.
FORMAT_VARIANTS: tuple[tuple[str, str], ...] = (
    ("fp8", "vendored"), ("dense_fp8", "dense"), ("bf16", "vendored"))


def stored_bytes_per_entry(fmt: str, head_dim: int = 128,
                           page_size: int = 128) -> int:
  """HBM bytes one entry occupies as a TPU stores the cache format `fmt`.

  The packed formats: the record (`cache.record_bytes`); "dense_fp8": the
  values plus the scale rows padded to (4, 128) tiles
  (`cache.dense_tpu_bytes_per_entry`: 132 B at head_dim 128, page 128).
  """
  if fmt == "dense_fp8":
    return cache_lib.dense_tpu_bytes_per_entry(head_dim, page_size)
  return cache_lib.record_bytes(fmt, head_dim)


def decode_step_by_format(batch_size: int = 64, context_tokens: int = 131072,
                          *, num_heads: int = 64, head_dim: int = 128,
                          page_size: int = 128, compression_ratio: int = 4,
                          k: int = 512,
                          formats: Sequence[tuple[str, str]] = FORMAT_VARIANTS,
                          generations: Sequence[str] | None = None
                          ) -> list[dict]:
  """One decode step of `batch_size` sequences per cache format and TPU.

  A model, not a measurement: the launches, KV blocks and DMAs of
  `streamidx.lab.model.tiling.plan` (block sizes from the block-size table
  for each generation, `streamidx.block_sizes`), and the bound
  max(T_mem, T_math) per stage of `streamidx.lab.model.roofline` with the
  rates of `streamidx.lab.model.hardware` (data/tpu_specs.json; the kernel
  gets one TensorCore's share of HBM bandwidth). Defaults: DeepSeek-V4's
  indexer (64 heads, head_dim 128, ratio 4, top-512) at 64 x 128K tokens.

  Returns one dict per (format, generation), formats outermost: fmt,
  variant, generation, bkv_p (the table's KV pages per block), data_bytes
  (per entry, what the DMAs move: `CACHE_FORMATS[fmt].bytes_per_entry`),
  stored_bytes (per entry, `stored_bytes_per_entry`), kv_bytes (the cache
  bytes the step reads, whole KV blocks), step_bytes (every stage's HBM
  bytes), kernel_us and step_us (the kernel stage's and the whole call's
  bound, microseconds), limiter (the kernel stage's: "memory" or "compute").
  """
  from streamidx import batch as batch_lib  # pylint: disable=g-import-not-at-top
  from streamidx.lab.model import hardware, roofline, tiling  # pylint: disable=g-import-not-at-top

  if batch_size < 1 or context_tokens < compression_ratio:
    raise ValueError(f"batch_size >= 1 and context_tokens >= compression_ratio"
                     f" required (got {batch_size}, {context_tokens})")
  b = batch_lib.make_mixed_batch(decode=[context_tokens] * batch_size,
                                 page_size=page_size,
                                 compression_ratio=compression_ratio)
  generations = hardware.GENERATIONS if generations is None else generations
  rows = []
  for fmt, variant in formats:
    for gen in generations:
      p = tiling.plan(b, fmt=fmt, num_heads=num_heads, head_dim=head_dim,
                      variant=variant, generation=gen)
      stages = roofline.costs(p, k=k)
      pred = roofline.predict(p, k=k, generations=[gen])[gen]
      kernel = next(x for x in pred["bounds"] if x.stage == "kernel")
      rows.append(dict(
          fmt=fmt, variant=variant, generation=gen,
          bkv_p=p.launches[0].bkv_p,
          data_bytes=cache_lib.CACHE_FORMATS[fmt].bytes_per_entry(head_dim),
          stored_bytes=stored_bytes_per_entry(fmt, head_dim, page_size),
          kv_bytes=int(p.counts()["hbm_bytes_kv"]),
          step_bytes=int(sum(s.bytes for s in stages)),
          kernel_us=pred["kernel"] * 1e6, step_us=pred["total"] * 1e6,
          limiter=kernel.limiter))
  return rows
