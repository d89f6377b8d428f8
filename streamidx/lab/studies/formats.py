"""Entry formats in bytes: how one compressed key is laid out in HBM.

Holds the entry layouts (`ENTRY_LAYOUTS`: the two the vendored kernel reads,
`KERNEL_LAYOUTS`, and the denser ones other indexer kernels use, for
comparison) and the bytes each costs (`entry_layout`, `bytes_per_entry`).
The kernel's layouts take their byte counts from `streamidx.cache`
(`record_bytes`), not from a formula of their own. HBM traffic per decode
step is in `streamidx.lab.studies.hbm`; where an entry lives and which
entries a query sees, in `streamidx.lab.studies.addressing`.

Vocabulary is `streamidx.cache`'s (entry, page, record, kv_packing). Terms
defined here:

- entry layout: how one entry's bytes are laid out in HBM: value bytes,
  scale bytes, padding, and whether the scale sits inside the record.

Plain Python (no kernel is built), so a notebook can tabulate production
sizes instantly.
"""

from __future__ import annotations

import dataclasses

from streamidx import cache as cache_lib
from streamidx.semantics import cdiv

__all__ = [
    "EntryLayout",
    "ENTRY_LAYOUTS",
    "KERNEL_LAYOUTS",
    "QUANT_BLOCK",
    "entry_layout",
    "entry_layouts",
    "bytes_per_entry",
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
        "FP8 packed (vendored)",
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
        name, head_dim, blocks, 0, False, None, "FP8 + e8m0 scale apart (dense)",
        "head_dim e4m3 bytes plus one e8m0 byte per 128 values, the scales "
        "kept apart: the densest layout with the vendored record's scales, the "
        "data of the dense_fp8 cache format (streamidx.cache; a TPU pads its "
        "scale rows, cache.dense_tpu_bytes_per_entry)")
  raise ValueError(f"layout must be one of {ENTRY_LAYOUTS}, got {name!r}")


def entry_layouts(head_dim: int = 128) -> dict[str, EntryLayout]:
  """All `ENTRY_LAYOUTS` at `head_dim`, in table order."""
  return {name: entry_layout(name, head_dim) for name in ENTRY_LAYOUTS}


def bytes_per_entry(name: str, head_dim: int = 128) -> int:
  """Bytes one entry costs in HBM: 256, 256, 132, 129 at head_dim 128."""
  return entry_layout(name, head_dim).total_bytes
