"""Roofline model of one indexer call: bytes, FLOPs, and the time bound per TPU.

One call (`streamindex_topk` or `streamindex_page_topk`) runs three stages,
one after another:

  "fill"    XLA: the f32 score buffer `[T, cols]` is set to -inf (it is then
            aliased into the kernel, so unwritten columns stay -inf).
  "kernel"  Pallas: scores every KV block the launches of `streamidx.lab.model.tiling`
            visit; writes f32 scores per block (token mode) or pooled page
            scores per query block (page mode).
  "topk"    XLA: top-k over the score buffer, then -1 where the score is -inf.

For each stage, the model counts bytes read and written in HBM and MXU FLOPs
as the kernel EXECUTES them (decode-batch blocks past a short sequence's end
included; `useful_*` counts only what the visible entries need), and bounds
its time as in the scaling book's roofline:

  T_mem  = bytes / HBM bandwidth        T_math = FLOPs / peak
  bound  = max(T_mem, T_math)           intensity = FLOPs / bytes

with the rates of `streamidx.lab.model.hardware`: one TensorCore's share for the kernel
(its grid is "arbitrary": a launch runs on one TensorCore), one JAX device's
for the XLA stages. The bound of a call is the sum of its stages' bounds.

Not modeled (so a measured time is above the bound): per-grid-step and
per-DMA overheads, DMA issue latency, the VPU work (ReLU, weighting, head sum,
masking: counted in `vpu_ops`, not in the bound, since no public VPU rate
exists), the top-k's comparisons (its bound is its memory traffic only), the
small XLA ops that pad q and cast the weights, and launch gaps.

Matmul precision: the kernel multiplies the query block (bf16 in streamidx)
with the KV block (e4m3 values or bf16) with f32 accumulation; the model uses
the chip's bf16 peak (`matmul_dtype="bf16"`). Production DeepSeek-V4 feeds FP8
queries; `matmul_dtype="fp8"` shows that case where an FP8 peak is published.
"""

from __future__ import annotations

import dataclasses
from typing import Mapping, Sequence

from streamidx.lab.model import hardware
from streamidx.lab.model import tiling

__all__ = ["StageCost", "Bound", "costs", "bounds", "predict", "PageBound",
           "page_bound", "page_bounds"]

@dataclasses.dataclass(frozen=True)
class StageCost:
  """HBM traffic and MXU work of one stage. Bytes and FLOPs are totals."""

  name: str  # "fill", "kernel" or "topk"
  unit: str  # "tensorcore" (one TensorCore) or "device" (one JAX device)
  bytes_read: Mapping[str, int]
  bytes_written: Mapping[str, int]
  flops: int  # MXU
  vpu_ops: int = 0  # elementwise work, reported only
  useful_flops: int = 0
  useful_bytes: int = 0

  @property
  def bytes(self) -> int:
    return sum(self.bytes_read.values()) + sum(self.bytes_written.values())

  @property
  def intensity(self) -> float:
    """FLOPs per HBM byte."""
    return self.flops / self.bytes if self.bytes else 0.0


@dataclasses.dataclass(frozen=True)
class Bound:
  """Seconds: T_mem, T_math and their max, one stage on one generation."""

  stage: str
  generation: str
  t_mem: float
  t_math: float
  bandwidth: float  # bytes/s used
  peak: float | None  # FLOP/s used (None: no MXU work)

  @property
  def bound(self) -> float:
    return max(self.t_mem, self.t_math)

  @property
  def limiter(self) -> str:
    return "memory" if self.t_mem >= self.t_math else "compute"


def costs(p: tiling.Plan, *, k: int) -> list[StageCost]:
  """The three stages' costs for the call `p` (a `tiling.plan`) with top-`k`."""
  g = p.geometry
  t = g.num_tokens
  cols = p.num_score_cols
  counts = p.counts()
  moved = {kind: counts[f"bytes_{kind}"] for kind in ("q", "w", "out")}
  # The cache as a TPU stores it: the dense format's scale tiles included.
  moved["kv"] = counts["hbm_bytes_kv"]
  # Scalar prefetch: every launch copies seq_lens, the page table, cu_q_lens,
  # q_rows (M13) and three small arrays into SMEM.
  per_launch = 4 * (g.max_num_seqs + g.max_num_seqs * g.pages_per_seq
                    + g.max_num_seqs + 1 + g.max_num_seqs + 2 + 3 + 2)
  flops = vpu = 0
  for launch in p.launches:
    for pr in launch.programs:
      rows = launch.bq_sz * g.num_q_heads
      per_step = 2 * rows * g.head_dim * launch.bkv_sz
      n = pr.num_bq * pr.num_bkv * len(pr.seqs)
      flops += n * per_step
      vpu += n * (3 * rows * launch.bkv_sz + 4 * launch.bq_sz * launch.bkv_sz)
  # Useful work: each query row against the entries of its sequence.
  useful_flops = useful_kv = 0
  for s, q_len in enumerate(p.q_lens):
    entries = p.seq_lens[s] // p.compression_ratio
    useful_flops += 2 * q_len * g.num_q_heads * g.head_dim * entries
    useful_kv += entries * g.record_bytes
  kernel = StageCost(
      "kernel", "tensorcore",
      bytes_read={"kv_cache": moved["kv"], "q": moved["q"],
                  "weights": moved["w"],
                  "page_table_etc": per_launch * sum(1 for l in p.launches if l.grid)},
      bytes_written={"scores": moved["out"]},
      flops=flops, vpu_ops=vpu, useful_flops=useful_flops,
      useful_bytes=useful_kv)
  fill = StageCost("fill", "device", bytes_read={},
                   bytes_written={"scores": t * cols * 4}, flops=0)
  select_cols = cols if p.mode == "token" else g.pages_per_seq
  topk = StageCost(
      "topk", "device",
      bytes_read={"scores": t * select_cols * 4, "top_values_indices": t * k * 8},
      bytes_written={"top_values_indices": t * k * 8, "indices": t * k * 4},
      flops=0)
  return [fill, kernel, topk]


def bounds(stage_costs: Sequence[StageCost], spec: hardware.TpuSpec, *,
           matmul_dtype: str = "bf16") -> list[Bound]:
  """Each stage's roofline bound on `spec`."""
  out = []
  for c in stage_costs:
    if c.unit == "tensorcore":
      bw, peak = spec.kernel_bandwidth, spec.kernel_peak(matmul_dtype)
    else:
      bw, peak = spec.device_bandwidth, spec.device_peak(matmul_dtype)
    if c.flops and peak is None:
      raise ValueError(f"{spec.generation}: no published {matmul_dtype} peak "
                       f"({spec.sources[hardware._PEAK_FIELD[matmul_dtype]]}); "  # pylint: disable=protected-access
                       "use matmul_dtype='bf16'")
    t_math = c.flops / peak if c.flops else 0.0
    out.append(Bound(c.name, spec.generation, c.bytes / bw, t_math, bw,
                     peak if c.flops else None))
  return out


def predict(p: tiling.Plan, *, k: int, generations: Sequence[str] | None = None,
            specs: Mapping[str, hardware.TpuSpec] | None = None,
            matmul_dtype: str = "bf16") -> dict[str, dict]:
  """{generation: {"fill", "kernel", "topk", "total": seconds, "bounds": [...]}}."""
  specs = hardware.load_specs() if specs is None else specs
  generations = hardware.GENERATIONS if generations is None else generations
  sc = costs(p, k=k)
  out = {}
  for gen in generations:
    bs = bounds(sc, specs[gen], matmul_dtype=matmul_dtype)
    row = {b.stage: b.bound for b in bs}
    row["total"] = sum(b.bound for b in bs)
    row["bounds"] = bs
    out[gen] = row
  return out


# ---------------------------------------------------------------------------
# Per KV page: the HBM bound beside the compiled code's static schedule.


@dataclasses.dataclass(frozen=True)
class PageBound:
  """One KV page of a launch on one generation: HBM time vs scheduled compute.

  t_hbm: the page's bytes over one TensorCore's HBM bandwidth.
  bundles_per_page: the KV loop's static schedule (`streamidx.lab.schedule`),
  a bundle a cycle without stalls: bundles / clock bounds compute from below.
  With no published clock only the break-even clock is known (vector-bound
  below it).
  """

  generation: str
  launch: str
  fmt: str
  bundles_per_page: float
  binding_slot: str
  page_bytes: int
  t_hbm: float
  clock_hz: float | None

  @property
  def t_compute(self) -> float | None:
    return None if self.clock_hz is None else self.bundles_per_page / self.clock_hz

  @property
  def break_even_clock_hz(self) -> float:  # schedule time == HBM time
    return self.bundles_per_page / self.t_hbm

  @property
  def verdict(self) -> str:
    if self.clock_hz is None:
      return (f"vector-bound ({self.binding_slot}) below "
              f"{self.break_even_clock_hz / 1e9:.2f} GHz (no public clock)")
    if self.t_compute > self.t_hbm:
      return (f"vector-bound ({self.binding_slot}), "
              f"{self.t_compute / self.t_hbm:.1f}x the HBM time")
    return f"memory-bound, compute {self.t_compute / self.t_hbm:.0%} of HBM time"


def page_bound(generation: str, *, bundles_per_page: float, page_bytes: int,
               binding_slot: str = "", launch: str = "", fmt: str = "",
               specs: Mapping[str, hardware.TpuSpec] | None = None) -> PageBound:
  """The HBM and static-schedule bounds of one KV page on `generation`."""
  spec = hardware.spec(generation, specs)
  return PageBound(generation, launch, fmt, float(bundles_per_page),
                   binding_slot, int(page_bytes),
                   page_bytes / spec.kernel_bandwidth, spec.clock_hz)


def page_bounds(schedules, *, head_dim: int = 128,
                specs: Mapping[str, hardware.TpuSpec] | None = None
                ) -> list[PageBound]:
  """`page_bound` of each `schedule.LaunchSchedule` with a KV loop; a page's
  bytes as a TPU stores them (`cache.record_bytes`; dense FP8:
  `cache.dense_tpu_bytes_per_entry`; MXFP4: 68 B at head_dim 128 from
  128-entry pages, see `cache.pack_mxfp4_cache`)."""
  from streamidx import cache as cache_lib  # pylint: disable=g-import-not-at-top

  def entry_bytes(fmt, page_size):
    if fmt == "dense_fp8":
      return cache_lib.dense_tpu_bytes_per_entry(head_dim, page_size)
    if fmt == "mxfp4":  # scale rows pad to 128 lanes below 128-entry pages
      width = cache_lib.padded_head_dim(head_dim)
      return width // 2 + width // 32 * max(page_size, 128) / page_size
    return cache_lib.record_bytes(fmt, head_dim)

  out = []
  for s in schedules:
    if s.kv is None:
      continue
    slot, _ = s.kv.binding_slot
    out.append(page_bound(
        s.generation, bundles_per_page=s.kv.bundles_per_page,
        page_bytes=s.page_size * entry_bytes(s.fmt, s.page_size),
        binding_slot=slot, launch=s.case, fmt=s.fmt, specs=specs))
  return out
