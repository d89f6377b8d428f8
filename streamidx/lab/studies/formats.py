"""Entry layouts in bytes: how one compressed key of `head_dim` values is laid
out in HBM, for the two layouts the vendored kernel reads (`KERNEL_LAYOUTS`,
`streamidx.cache.record_bytes`) and the denser ones other indexer kernels use.
"""

from __future__ import annotations

import dataclasses

from streamidx import cache as cache_lib

QUANT_BLOCK = 128  # values per scale in the FP8 layouts

# name: (label, cache format the kernel reads or None, scale bytes per
# QUANT_BLOCK values, where the layout comes from). In table order.
_LAYOUTS = {
    "fp8_packed": ("FP8 packed (vendored)", "fp8", 1,
                   "uint8 record: head_dim e4m3 bytes, one e8m0 scale byte, "
                   "zero padding to a multiple of 128 lanes"),
    "bf16": ("bf16", "bf16", 0, "head_dim bf16 values, no scale"),
    "fp8_f32_scale_apart": ("FP8 + f32 scale apart", None, 4,
                            "one f32 scale per 128 e4m3 values in its own "
                            "region of the page (DeepGEMM's paged indexer, "
                            "vLLM's indexer cache)"),
    "fp8_e8m0_scale_apart": ("FP8 + e8m0 scale apart (dense)", None, 1,
                             "one e8m0 byte per 128 e4m3 values kept apart: "
                             "the data of the dense_fp8 cache format (a TPU "
                             "pads its scale rows: "
                             "cache.dense_tpu_bytes_per_entry)"),
}
ENTRY_LAYOUTS: tuple[str, ...] = tuple(_LAYOUTS)
KERNEL_LAYOUTS: tuple[str, ...] = ("fp8_packed", "bf16")


@dataclasses.dataclass(frozen=True)
class EntryLayout:
  """The bytes of one entry: values, scales (0 for bf16), padding; whether
  the scale sits inside the record; the cache format the kernel reads (None
  if it cannot read this layout); a label for tables; its source."""

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
  """The `EntryLayout` called `name` at `head_dim` (a multiple of 128)."""
  if head_dim <= 0 or head_dim % QUANT_BLOCK:
    raise ValueError(f"head_dim must be a positive multiple of {QUANT_BLOCK}, "
                     f"got {head_dim}")
  if name not in _LAYOUTS:
    raise ValueError(f"layout must be one of {ENTRY_LAYOUTS}, got {name!r}")
  label, fmt, scale, note = _LAYOUTS[name]
  scale_bytes = scale * head_dim // QUANT_BLOCK
  if fmt is None:
    return EntryLayout(name, head_dim, scale_bytes, 0, False, None, label, note)
  total = cache_lib.record_bytes(fmt, head_dim)
  values = head_dim if scale else total  # bf16: the record is its values
  return EntryLayout(name, values, scale_bytes, total - values - scale_bytes,
                     True, fmt, label, note)


def bytes_per_entry(name: str, head_dim: int = 128) -> int:
  """Bytes one entry costs in HBM: 256, 256, 132, 129 at head_dim 128."""
  return entry_layout(name, head_dim).total_bytes
