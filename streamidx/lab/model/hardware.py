"""The hardware model: what each TPU generation offers, from
`data/tpu_specs.json`, each number with its source (`TpuSpec.sources`; None:
no public page gave it). The rates: docs/tpu.md.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any, Mapping

from streamidx import records

GENERATIONS: tuple[str, ...] = ("v4", "v5e", "v5p", "v6e", "v7x")

_FIELDS = ("tensorcores_per_chip", "jax_devices_per_chip", "hbm_capacity_bytes",
           "hbm_bandwidth_bytes_per_s", "vmem_bytes_per_tensorcore",
           "peak_bf16_flops", "peak_int8_ops", "peak_fp8_flops",
           "ici_bandwidth_bytes_per_s", "clock_hz")
_REQUIRED = _FIELDS[:6]  # int8/fp8 peaks, ICI bandwidth and the clock may be unpublished
_PEAK_FIELD = {"bf16": "peak_bf16_flops", "int8": "peak_int8_ops",
               "fp8": "peak_fp8_flops"}


def _share(x: float | None, n: float) -> float | None:
  return None if x is None else x / n


@dataclasses.dataclass(frozen=True)
class TpuSpec:
  """One TPU generation. Rates per second; bytes; None = not published.
  `sources[field]`: the citation of `field`'s value (for None, why it is
  missing); `as_published[field]`: the value as the source wrote it."""

  generation: str
  name: str
  device_kinds: tuple[str, ...]
  tensorcores_per_chip: int
  jax_devices_per_chip: int
  hbm_capacity_bytes: int
  hbm_bandwidth_bytes_per_s: float
  vmem_bytes_per_tensorcore: int
  peak_bf16_flops: float
  peak_int8_ops: float | None
  peak_fp8_flops: float | None
  ici_bandwidth_bytes_per_s: float | None
  clock_hz: float | None  # TensorCore clock: bundles -> seconds (static schedule)
  sources: Mapping[str, str]
  as_published: Mapping[str, str]

  def peak(self, dtype: str = "bf16") -> float | None:
    """Chip peak for matmuls in `dtype` ("bf16", "int8" or "fp8"); None if unpublished."""
    if dtype not in _PEAK_FIELD:
      raise ValueError(f"dtype must be one of {tuple(_PEAK_FIELD)}, got {dtype!r}")
    return getattr(self, _PEAK_FIELD[dtype])

  tensorcores_per_device = property(
      lambda self: self.tensorcores_per_chip // self.jax_devices_per_chip)

  # One TensorCore (a Pallas launch) and one JAX device (an XLA op): the
  # chip's rates split evenly (model assumption; docs/tpu.md).
  def kernel_peak(self, dtype: str = "bf16") -> float | None:
    return _share(self.peak(dtype), self.tensorcores_per_chip)

  def device_peak(self, dtype: str = "bf16") -> float | None:
    return _share(self.peak(dtype), self.jax_devices_per_chip)

  kernel_bandwidth = property(
      lambda self: self.hbm_bandwidth_bytes_per_s / self.tensorcores_per_chip)
  device_bandwidth = property(
      lambda self: self.hbm_bandwidth_bytes_per_s / self.jax_devices_per_chip)
  device_ici_bandwidth = property(lambda self: _share(  # None: unpublished
      self.ici_bandwidth_bytes_per_s, self.jax_devices_per_chip))

  def ridge_point(self, dtype: str = "bf16") -> float | None:
    """FLOPs per HBM byte above which a kernel is compute-bound (peak / bandwidth)."""
    return _share(self.peak(dtype), self.hbm_bandwidth_bytes_per_s)

  def short_cite(self, field: str) -> str:
    """'value as published (first URL of its source)', or the unsourced note."""
    import re  # pylint: disable=g-import-not-at-top
    if field not in self.sources:
      raise KeyError(f"{field!r} is not a sourced field; one of {_FIELDS}")
    src, pub = self.sources[field], self.as_published.get(field)
    if not pub:
      return src
    url = re.search(r"https?://[^\s,;)]+", src)
    return f"{pub} ({url.group(0) if url else src[:60]})"


def _fail(path, where, rule):
  raise ValueError(f"{path}: {where}: {rule}")


def _parse(doc: Mapping[str, Any], path) -> dict[str, TpuSpec]:
  sources = doc.get("sources")
  gens = doc.get("generations")
  if not isinstance(sources, dict) or not isinstance(gens, dict):
    _fail(path, "top level", "needs 'sources' and 'generations' objects")
  out = {}
  for gen, entry in gens.items():
    values, cites, pubs = {}, {}, {}
    for field in _FIELDS:
      item = entry.get(field)
      where = f"generations.{gen}.{field}"
      if not isinstance(item, dict) or "value" not in item:
        _fail(path, where, "missing (an object with 'value')")
      value = item["value"]
      if value is None:
        if field in _REQUIRED:
          _fail(path, where, "is required and may not be null")
        if not item.get("unsourced"):
          _fail(path, where, "a null value needs an 'unsourced' note")
        cites[field] = "unsourced: " + item["unsourced"]
      else:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
          _fail(path, where, f"value must be a positive number, got {value!r}")
        key = item.get("source")
        if key not in sources:
          _fail(path, where, f"source {key!r} is not in 'sources'")
        cites[field] = sources[key]
        pubs[field] = item.get("as_published", "")
      values[field] = value
    for field in ("tensorcores_per_chip", "jax_devices_per_chip",
                  "hbm_capacity_bytes", "vmem_bytes_per_tensorcore"):
      values[field] = int(values[field])
    if values["tensorcores_per_chip"] % values["jax_devices_per_chip"]:
      _fail(path, f"generations.{gen}", "tensorcores_per_chip must be a "
            "multiple of jax_devices_per_chip")
    out[gen] = TpuSpec(generation=gen, name=entry.get("name", gen),
                       device_kinds=tuple(entry.get("device_kinds", ())),
                       sources=cites, as_published=pubs, **values)
  missing = [g for g in GENERATIONS if g not in out]
  if missing:
    _fail(path, "generations", f"missing {missing}")
  return out


def load_specs(path: str | Path | None = None) -> dict[str, TpuSpec]:
  """{generation: TpuSpec} of the recorded TPU table (or the file `path`);
  ValueError names the field of a malformed entry."""
  if path is None:
    return _parse(records.load("tpu_specs"), records.path("tpu_specs"))
  path = Path(path)
  if not path.is_file():
    raise FileNotFoundError(f"TPU spec table not found at {path}")
  return _parse(json.loads(path.read_text(encoding="utf-8")), path)


def spec(generation: str) -> TpuSpec:
  """The TpuSpec of one generation ("v4", "v5e", "v5p", "v6e", "v7x")."""
  specs = load_specs()
  if generation not in specs:
    raise ValueError(f"generation must be one of {tuple(specs)}, got {generation!r}")
  return specs[generation]
