"""The cache layout in numbers: bytes per entry, HBM per decode step,
causal visibility, and the launches the kernel makes for a batch.

Vocabulary is `streamidx.cache`'s (entry, page, record, kv_packing,
page_size_per_kv_packing) and `streamidx.batch`'s (distribution, cu_q_lens).
Terms defined here:

- entry layout: how one entry's bytes are laid out in HBM. The kernel reads
  two of them (`KERNEL_LAYOUTS`); the others are denser layouts other
  indexer kernels use, listed for comparison (`ENTRY_LAYOUTS`).
- decode step: one new token per sequence. The indexer then scores every
  visible entry of its sequence once, in each layer that has an indexer.
- launch: one `pallas_call` that `streamindex_topk` makes. It runs
  `grid` programs; program i scores sequences
  `start_seq + i * seq_batch_size ... + seq_batch_size - 1`.

Everything here is plain Python/NumPy (no kernel is built), so a notebook can
tabulate production sizes (1M-token contexts) instantly.
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

import numpy as np

from streamidx import cache as cache_lib
from streamidx.kernels.vendored import MlaCase
from streamidx.semantics import (CAUSAL_RULES, causal_visible_bound, cdiv,
                                 normalize_per_case)

__all__ = [
    "EntryLayout",
    "ENTRY_LAYOUTS",
    "KERNEL_LAYOUTS",
    "QUANT_BLOCK",
    "entry_layout",
    "entry_layouts",
    "bytes_per_entry",
    "SCORE_BYTES_PER_COLUMN",
    "DecodeStepBytes",
    "decode_step_bytes",
    "decode_step_table",
    "EntryAddress",
    "locate_entry",
    "visibility_mask",
    "causal_rule_difference",
    "Launch",
    "launch_plan",
    "program_sequences",
    "expected_grid_points",
    "ProgramWork",
    "program_work",
]

# Values per quantization block of the denser FP8 layouts (one scale each).
QUANT_BLOCK = 128

# Layout names, in the order tables list them.
ENTRY_LAYOUTS: tuple[str, ...] = ("fp8_packed", "bf16", "fp8_f32_scale_apart",
                                  "fp8_e8m0_scale_apart")
# The layouts `streamindex_topk` reads (cache formats "fp8" and "bf16").
KERNEL_LAYOUTS: tuple[str, ...] = ("fp8_packed", "bf16")



@dataclasses.dataclass(frozen=True)
class EntryLayout:
  """The bytes one entry (one compressed key of `head_dim` values) takes.

  Attributes:
    name: one of `ENTRY_LAYOUTS`.
    value_bytes: bytes of key values.
    scale_bytes: bytes of scales (0 for bf16).
    pad_bytes: bytes that carry nothing.
    scales_inline: whether the scale sits inside the record (True for the
      seed's packed FP8) or in a separate array / page region.
    cache_format: the `streamidx.cache` format the kernel reads, or None if
      the kernel cannot read this layout.
    label: a short human name for tables and plots.
    note: where the layout comes from.
  """

  name: str
  value_bytes: int
  scale_bytes: int
  pad_bytes: int
  scales_inline: bool
  cache_format: str | None
  label: str
  note: str

  @property
  def total_bytes(self) -> int:
    return self.value_bytes + self.scale_bytes + self.pad_bytes


def entry_layout(name: str, head_dim: int = 128) -> EntryLayout:
  """The `EntryLayout` called `name` at `head_dim`.

  The kernel's two layouts take their byte counts from `streamidx.cache`
  (`record_bytes`), not from a formula of their own.
  """
  if head_dim <= 0 or head_dim % QUANT_BLOCK:
    raise ValueError(f"head_dim must be a positive multiple of {QUANT_BLOCK}, "
                     f"got {head_dim}")
  blocks = cdiv(head_dim, QUANT_BLOCK)
  if name == "fp8_packed":
    total = cache_lib.record_bytes("fp8", head_dim)
    return EntryLayout(
        name, head_dim, 1, total - head_dim - 1, True, "fp8",
        "FP8 packed (seed)",
        "uint8 record: head_dim e4m3 bytes, one e8m0 scale byte, zero padding "
        "to a multiple of 128 lanes (streamidx.cache 'fp8')")
  if name == "bf16":
    total = cache_lib.record_bytes("bf16", head_dim)
    return EntryLayout(name, total, 0, 0, True, "bf16", "bf16",
                       "head_dim bf16 values, no scale (streamidx.cache 'bf16')")
  if name == "fp8_f32_scale_apart":
    return EntryLayout(
        name, head_dim, 4 * blocks, 0, False, None, "FP8 + f32 scale apart",
        "head_dim e4m3 bytes plus one float32 scale per 128 values, the "
        "scales kept in their own region of the page (the 132-byte layout of "
        "DeepGEMM's paged indexer kernels and vLLM's indexer cache)")
  if name == "fp8_e8m0_scale_apart":
    return EntryLayout(
        name, head_dim, blocks, 0, False, None, "FP8 + e8m0 scale apart",
        "head_dim e4m3 bytes plus one e8m0 byte per 128 values, the scales "
        "kept apart: the densest layout with the seed's scales")
  raise ValueError(f"layout must be one of {ENTRY_LAYOUTS}, got {name!r}")


def entry_layouts(head_dim: int = 128) -> dict[str, EntryLayout]:
  """All `ENTRY_LAYOUTS` at `head_dim`, in table order."""
  return {name: entry_layout(name, head_dim) for name in ENTRY_LAYOUTS}


def bytes_per_entry(name: str, head_dim: int = 128) -> int:
  """Bytes one entry costs in HBM: 256, 256, 132, 129 at head_dim 128."""
  return entry_layout(name, head_dim).total_bytes


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
  if causal_rule not in CAUSAL_RULES:
    raise ValueError(f"causal_rule must be one of {CAUSAL_RULES}, got "
                     f"{causal_rule!r}")
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


@dataclasses.dataclass(frozen=True)
class Launch:
  """One `pallas_call` of `streamindex_topk`, as the kernel wrapper makes it.

  Attributes:
    case: "decode", "prefill" or "mixed" (`MlaCase`, lower case).
    start_seq, end_seq: the sequences [start_seq, end_seq) it covers.
    seq_batch_size: sequences per program (`decode_req_batch_size` for the
      batched decode launch, else 1).
    static_q_len: 1 for the decode launches (one query row per sequence),
      None where each sequence's q_len comes from `cu_q_lens`.
    bkv_p: `num_kv_pages_per_block` of this case.
    num_queries_per_block: of this case.
    bq_sz: query rows per block: min(num_queries_per_block, static_q_len)
      if static, else num_queries_per_block.
  """

  case: str
  start_seq: int
  end_seq: int
  seq_batch_size: int
  static_q_len: int | None
  bkv_p: int
  num_queries_per_block: int
  bq_sz: int

  @property
  def grid(self) -> int:
    return (self.end_seq - self.start_seq) // self.seq_batch_size

  @property
  def name(self) -> str:
    """The kernel's `named_scope` / pallas_call name (profiles show it)."""
    symbol = MlaCase[self.case.upper()].symbol
    return f"StreamIdxTC-{symbol}-bq_{self.bq_sz}-bkvp_{self.bkv_p}"


def launch_plan(distribution, *, num_kv_pages_per_block,
                num_queries_per_block, decode_req_batch_size: int = 4
                ) -> list[Launch]:
  """The four launches `streamindex_topk` makes, in its order.

  Mirrors the wrapper in `streamidx/kernels/vendored.py`, local modification M4
  included. With distribution (i, j, n) and d = decode_req_batch_size:

    1. decode, batched:  [0, i // d * d), d sequences per program, q_len 1;
    2. decode remainder: [i // d * d, i), one sequence per program, q_len 1;
    3. prefill (M4):     [i, j), one per program, dynamic q_len, the prefill
                         block sizes (the seed sent these to the decode path);
    4. mixed:            [j, n), one per program, dynamic q_len.

  Every launch is made, even with an empty grid (0 programs). Block sizes are
  an int or a (decode, prefill, mixed) triple, as the kernel takes them.
  """
  d = np.asarray(distribution).reshape(-1)
  if d.shape != (3,):
    raise ValueError(f"distribution must be (i, j, n), got {distribution!r}")
  i, j, n = (int(x) for x in d)
  if not 0 <= i <= j <= n:
    raise ValueError(f"distribution must satisfy 0 <= i <= j <= n, got "
                     f"{(i, j, n)}")
  if isinstance(decode_req_batch_size, bool) or decode_req_batch_size < 1:
    raise ValueError(f"decode_req_batch_size must be >= 1, got "
                     f"{decode_req_batch_size!r}")
  bkv = normalize_per_case(num_kv_pages_per_block, "num_kv_pages_per_block")
  nq = normalize_per_case(num_queries_per_block, "num_queries_per_block")
  decode_batch_end = i // decode_req_batch_size * decode_req_batch_size

  def launch(case, c, start, end, batch, static_q_len):
    bq_sz = nq[c] if static_q_len is None else min(nq[c], static_q_len)
    return Launch(case, start, end, batch, static_q_len, bkv[c], nq[c], bq_sz)

  return [
      launch("decode", 0, 0, decode_batch_end, decode_req_batch_size, 1),
      launch("decode", 0, decode_batch_end, i, 1, 1),
      launch("prefill", 1, i, j, 1, None),
      launch("mixed", 2, j, n, 1, None),
  ]


def program_sequences(launch: Launch) -> list[tuple[int, ...]]:
  """The sequences each program of `launch` scores, program by program."""
  return [tuple(range(launch.start_seq + p * launch.seq_batch_size,
                      launch.start_seq + (p + 1) * launch.seq_batch_size))
          for p in range(launch.grid)]


def expected_grid_points(plan: Sequence[Launch]) -> list[tuple[int]]:
  """The grid points an interpreted run visits, launch after launch.

  What `InterpretParams(grid_point_recorder=...)` records for the plan:
  (0,), (1,), ... (grid - 1,) per launch; empty launches record nothing.
  """
  return [(p,) for launch in plan for p in range(launch.grid)]


@dataclasses.dataclass(frozen=True)
class ProgramWork:
  """One program of a launch and the blocks it loops over.

  num_bq: query blocks (bq_sz rows each); num_bkv: KV blocks of
  bkv_p * page_size entries, set by the longest sequence of the program.
  """

  launch: int
  program: int
  seqs: tuple[int, ...]
  q_rows: tuple[tuple[int, int], ...]  # [start, end) per sequence
  num_bq: int
  num_bkv: int

  @property
  def steps(self) -> int:
    return self.num_bq * self.num_bkv


def program_work(batch, plan: Sequence[Launch]) -> list[ProgramWork]:
  """For a `RaggedBatch`, every program of `plan` with its block counts,
  computed as the kernel's `process()` does.

  A decode launch (static_q_len 1) scores only the first query row of each
  of its sequences; `q_rows` lists the rows each program covers.
  """
  cu = batch.cu_q_lens
  kv_lens = batch.seq_lens // batch.compression_ratio
  out = []
  for li, launch in enumerate(plan):
    bkv_sz = launch.bkv_p * batch.page_size
    for p, seqs in enumerate(program_sequences(launch)):
      kv_len_max = int(max(kv_lens[s] for s in seqs))
      num_bkv = max(1, cdiv(kv_len_max, bkv_sz))
      if launch.static_q_len is None:
        q_len = int(cu[seqs[0] + 1] - cu[seqs[0]])
        num_bq = max(1, cdiv(q_len, launch.bq_sz))
        rows = ((int(cu[seqs[0]]), int(cu[seqs[0] + 1])),)
      else:
        num_bq = max(1, cdiv(launch.static_q_len, launch.bq_sz))
        rows = tuple((int(cu[s]), int(min(cu[s] + launch.static_q_len,
                                          cu[s + 1]))) for s in seqs)
      out.append(ProgramWork(li, p, seqs, rows, num_bq, num_bkv))
  return out
