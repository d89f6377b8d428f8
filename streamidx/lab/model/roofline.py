"""Roofline model of one indexer call: bytes, FLOPs, and the time bound per TPU.

The three stages ("fill", "kernel", "topk"), what each is charged, the rates
used and what is not modeled: docs/tpu.md, "The roofline model". `step_bound`
adds the vector unit from the compiler's static schedule; `indexer_step` is
one token-mode call of a named indexer geometry stage by stage, `dsv4_step`
the production DeepSeek-V4 decode step every notebook quotes.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Mapping, Sequence

import numpy as np

import streamidx as si
from streamidx import cache as cache_lib
from streamidx import records
from streamidx.lab import shapes as shapes_lib
from streamidx.lab.model import hardware
from streamidx.lab.model import tiling
from streamidx.lab.model import topk as topk_model


@dataclasses.dataclass(frozen=True)
class StageCost:
  """HBM traffic and MXU work of one stage. Bytes and FLOPs are totals."""

  name: str  # "fill", "kernel" or "topk"
  unit: str  # "tensorcore" (one TensorCore) or "device" (one JAX device)
  bytes_read: Mapping[str, int]
  bytes_written: Mapping[str, int]
  flops: int  # MXU
  useful_flops: int = 0
  useful_bytes: int = 0

  bytes = property(lambda self: sum(self.bytes_read.values())
                   + sum(self.bytes_written.values()))
  # FLOPs per HBM byte.
  intensity = property(lambda self: self.flops / self.bytes if self.bytes
                       else 0.0)


@dataclasses.dataclass(frozen=True)
class Bound:
  """Seconds: T_mem, T_math and their max, one stage on one generation."""

  stage: str
  generation: str
  t_mem: float
  t_math: float
  bandwidth: float  # bytes/s used
  peak: float | None  # FLOP/s used (None: no MXU work)

  bound = property(lambda self: max(self.t_mem, self.t_math))
  limiter = property(lambda self: "memory" if self.t_mem >= self.t_math
                     else "compute")


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
  # MXU: each step multiplies bq_sz * heads rows by bkv_sz entries per sequence.
  flops = sum(2 * l.bq_sz * g.num_q_heads * g.head_dim * l.bkv_sz
              * pr.num_bq * pr.num_bkv * len(pr.seqs)
              for l in p.launches for pr in l.programs)
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
      flops=flops, useful_flops=useful_flops, useful_bytes=useful_kv)
  fill = StageCost("fill", "device", bytes_read={},
                   bytes_written={"scores": t * cols * 4}, flops=0)
  select_cols = p.selected_cols
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
            matmul_dtype: str = "bf16") -> dict[str, dict]:
  """{generation: {"fill", "kernel", "topk", "total": seconds, "bounds": [...]}}."""
  specs = hardware.load_specs()
  generations = hardware.GENERATIONS if generations is None else generations
  sc = costs(p, k=k)
  out = {}
  for gen in generations:
    bs = bounds(sc, specs[gen], matmul_dtype=matmul_dtype)
    out[gen] = {**{b.stage: b.bound for b in bs},
                "total": sum(b.bound for b in bs), "bounds": bs}
  return out


# ---------------------------------------------------------------------------
# Per KV page: the HBM bound beside the compiled code's static schedule.


@dataclasses.dataclass(frozen=True)
class PageBound:
  """One KV page of a launch on one generation: HBM time (its bytes over one
  TensorCore's bandwidth) vs the KV loop's static schedule
  (`streamidx.lab.schedule`, a bundle a cycle without stalls)."""

  generation: str
  launch: str
  fmt: str
  bundles_per_page: float
  binding_slot: str
  page_bytes: int
  t_hbm: float
  clock_hz: float | None

  t_compute = property(lambda self: None if self.clock_hz is None
                       else self.bundles_per_page / self.clock_hz)
  # The clock at which the schedule's time equals the HBM time.
  break_even_clock_hz = property(lambda self: self.bundles_per_page
                                 / self.t_hbm)

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
               binding_slot: str = "", launch: str = "", fmt: str = "") -> PageBound:
  """The HBM and static-schedule bounds of one KV page on `generation`."""
  spec = hardware.spec(generation)
  return PageBound(generation, launch, fmt, float(bundles_per_page),
                   binding_slot, int(page_bytes),
                   page_bytes / spec.kernel_bandwidth, spec.clock_hz)


def page_bounds(schedules, *, head_dim: int = 128) -> list[PageBound]:
  """`page_bound` of each `schedule.LaunchSchedule` with a KV loop; a page's
  bytes as a TPU stores them (`cache.record_bytes`; dense FP8:
  `cache.dense_tpu_bytes_per_entry`; MXFP4: 68 B at head_dim 128 from
  128-entry pages, see `cache.pack_mxfp4_cache`)."""
  def entry_bytes(fmt, page_size):
    if fmt in ("dense_fp8", "inline_fp8"):  # the same bytes a page
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
        binding_slot=slot, launch=s.case, fmt=s.fmt))
  return out


# ---------------------------------------------------------------------------
# The step with the vector unit: HBM, MXU and static-schedule time, one call.

def recorded_bundles(variant: str, generation: str, fmt: str, *, bkv_p: int,
                     seq_batch_size: int, num_heads: int, head_dim: int,
                     page_size: int) -> dict | None:
  """The recorded decode row of this launch, or None (none recorded)."""
  doc = records.load("decode_schedule")
  if (num_heads, head_dim, page_size) != (doc["num_heads"], doc["head_dim"],
                                          doc["page_size"]):
    return None
  key = (variant, generation, fmt, bkv_p, seq_batch_size)
  return next((r for r in doc["rows"] if key == tuple(r[k] for k in (
      "variant", "generation", "fmt", "bkv_p", "seq_batch_size"))), None)


def max_published_clock_hz() -> float:
  """The fastest clock `data/tpu_specs.json` gives."""
  return max(s.clock_hz for s in hardware.load_specs().values() if s.clock_hz)


@dataclasses.dataclass(frozen=True)
class StepBound:
  """One call on one chip: the kernel's HBM, MXU and vector times (lower
  bounds, docs/tpu.md); the headline is the largest plus the XLA fill and
  top-k; without a clock, the break-even clock (vector-bound below it)."""

  generation: str
  variant: str
  fmt: str
  t_hbm: float  # the kernel's bytes / one TensorCore's bandwidth
  t_mxu: float  # its MXU FLOPs / one TensorCore's bf16 peak
  t_xla: float  # the fill and the top-k (HBM)
  kv_pages: int  # KV pages the decode launches fetch
  bundles_per_page: float | None  # None: no recorded row (`vector_note`)
  binding_slot: str
  clock_hz: float | None
  vector_note: str = ""
  blocks: str = ""  # the block-size row and its source
  # The step stage by stage (`step_stages`; dsv4_step fills them): when
  # given, the headline is their sum, each the larger of its bounds.
  stages: tuple = ()
  clock_source: str = ""

  # Scheduled bundles: two calls' vector times compare as these, clock or not.
  bundles = property(lambda self: None if self.bundles_per_page is None
                     else self.bundles_per_page * self.kv_pages)
  t_vector = property(lambda self: None if not (self.clock_hz and self.bundles)
                      else self.bundles / self.clock_hz)
  break_even_clock_hz = property(lambda self: self.bundles / self.t_hbm
                                 if self.bundles and self.t_hbm else None)

  @property
  def binding(self) -> str:
    """"HBM", "MXU" or "vector"; without a clock, "vector" when the
    break-even clock is above every published TPU clock."""
    known = {"HBM": self.t_hbm, "MXU": self.t_mxu, "vector": self.t_vector}
    unit = max((u for u in known if known[u] is not None), key=known.get)
    be = self.break_even_clock_hz
    return "vector" if be and self.t_vector is None and be > max_published_clock_hz() else unit

  @property
  def at_least(self) -> bool:
    """`total_s` is a floor: a stage has no count or no clock (staged), or
    the binding unit has no time (no clock)."""
    if self.stages:
      return not self.stages_complete
    return self.t_vector is None and self.binding == "vector"

  kernel_s = property(lambda self: max(
      t for t in (self.t_hbm, self.t_mxu, self.t_vector) if t is not None))
  total_s = property(lambda self: sum(st.bound for st in self.stages)
                     if self.stages else self.t_xla + self.kernel_s)

  # Every stage that runs compiled code has its bundles and a clock, or its
  # time measured alone.
  stages_complete = property(lambda self: not any(
      st.is_floor or not (st.clock_hz or st.t_chip is not None)
      for st in self.stages if not st.hbm_only))

  def share(self, name: str) -> float:
    """A stage's share of `total_s` (stages of that name summed)."""
    return sum(st.bound for st in self.stages if st.name == name) / self.total_s

  @property
  def verdict(self) -> str:
    slot = f" ({self.binding_slot})" if self.binding == "vector" else ""
    if self.t_vector is not None:
      return (f"{self.binding}-bound{slot}: the static schedule is "
              f"{self.t_vector / self.t_hbm:.2f}x the HBM time at {self.clock_hz / 1e9:.3g} GHz")
    if self.break_even_clock_hz is None:
      return f"{self.binding}-bound by HBM and MXU alone ({self.vector_note})"
    return (f"{'vector' if self.binding == 'vector' else 'HBM'}-bound{slot} unless the "
            f"clock exceeds {self.break_even_clock_hz / 1e9:.2f} GHz, the break-even clock "
            f"(no public clock; the published TPU clocks are at most "
            f"{max_published_clock_hz() / 1e9:.2f} GHz)")

  @property
  def sum_text(self) -> str:
    """'[at least ]9,120 us = fill 36 + scoring ... us': the total and the
    stages that round to 1 us or more (with `stages`)."""
    parts = " + ".join(f"{st.name} {st.bound * 1e6:,.0f}" for st in self.stages
                       if st.bound * 1e6 >= .5)
    return (f"{'at least ' if self.at_least else ''}{self.total_s * 1e6:,.0f} "
            f"us = {parts} us")


def step_bound(p: tiling.Plan, generation: str, *, variant: str, k: int,
               blocks: str = "", page: PageBound | None = None) -> StepBound:
  """`StepBound` of the plan `p` (of `variant`) on `generation`: `bounds`'s
  HBM and MXU terms and the recorded schedule of its decode launches, or
  `page` (a compiled `PageBound`) for every launch."""
  spec = hardware.spec(generation)
  stages = {b.stage: b for b in bounds(costs(p, k=k), spec)}
  g = p.geometry
  rows, pages, missing = set(), 0, []
  for l in p.executed:
    rec = (dict(bundles_per_page=page.bundles_per_page, binding_slot=page.binding_slot)
           if page else l.case.startswith("decode") and recorded_bundles(
        variant, generation, g.fmt, bkv_p=l.bkv_p, seq_batch_size=l.seq_batch_size,
        num_heads=g.num_q_heads, head_dim=g.head_dim, page_size=g.page_size))
    if not rec:
      missing.append(f"{l.label} bkv_p={l.bkv_p}")
      continue
    rows.add((rec["bundles_per_page"], rec["binding_slot"]))
    pages += l.num_steps * l.seq_batch_size * l.bkv_p
  if len(rows) > 1:
    raise ValueError(f"the decode launches have different schedules: {rows}")
  bpp, slot = next(iter(rows)) if rows else (None, "")
  note = "; ".join(([f"no recorded schedule for {', '.join(missing)}"] if missing else [])
                   + ([] if spec.clock_hz else ["no public clock"]))
  return StepBound(generation, variant, g.fmt, stages["kernel"].t_mem,
                   stages["kernel"].t_math,
                   stages["fill"].bound + stages["topk"].bound, pages, bpp,
                   slot, spec.clock_hz, note, blocks)


@dataclasses.dataclass(frozen=True)
class Stage:
  """One stage of the step on one chip: its HBM time (bytes / bandwidth),
  MXU time, and the bundles its compiled program executes (static
  schedule, `streamidx.lab.dump`; None: not compiled or not recorded) at
  `clock_hz`. Bundles are issue slots: DMA waits, stalls and SparseCore
  time are not in them. Where the chip's records measured what the
  bundles leave out (`kv_step_costs`), the scoring stage adds its grid
  steps' fixed cost (`t_steps`) and reads its bytes at the DMA rate
  measured (`t_dma`, in place of `t_hbm`) and runs its decode launches'
  bundles at the cycles a bundle measured (`stall`, `decode_stall`); where
  the chip measured the stage alone (`t_chip`: the selection,
  `selection_stages`), that time is the stage's, measured, not modelled."""

  name: str  # "fill", "scoring", "relayout", "selection", "copies"
  t_hbm: float
  bundles: int | None
  clock_hz: float | None
  t_mxu: float = 0.0
  detail: str = ""
  floor: bool = False  # bundles of part of the program only (a lower bound)
  t_steps: float = 0.0  # grid steps x the chip's measured cost of a step
  t_dma: float | None = None  # bytes at the chip's measured DMA rate
  t_chip: float | None = None  # measured alone on the chip (records)
  hbm_only: bool = False  # XLA's own data movement (fill, relayout): no bundles to count
  stall: float = 1.0  # the chip's time a bundle, in cycles (`decode_stall`)

  t_bundles = property(lambda self: None if self.bundles is None
                       or not self.clock_hz
                       else self.bundles * self.stall / self.clock_hz)
  t_bytes = property(lambda self: self.t_hbm if self.t_dma is None
                     else self.t_dma)
  # A lower bound: compiled code with no bundles or only part of them, and
  # no time measured for the stage alone.
  is_floor = property(lambda self: self.t_chip is None and not self.hbm_only
                      and (self.bundles is None or self.floor))

  @property
  def bound(self) -> float:
    if self.t_chip is not None:
      return self.t_chip
    return self.t_steps + max(self.t_bytes, self.t_mxu, self.t_bundles or 0.0)

  @property
  def limiter(self) -> str:
    if self.t_chip is not None:
      return "measured alone"
    if self.t_bundles is not None and self.t_bundles >= max(self.t_bytes, self.t_mxu):
      return "static schedule"
    return ("MXU" if self.t_mxu > self.t_bytes
            else "HBM" if self.t_dma is None else "DMA")

  def describe(self) -> str:
    b = ("not compiled" if self.bundles is None else
         f"{'at least ' if self.floor else ''}{self.bundles:,} bundles"
         + (f" x {self.stall:.2f} cycles" if self.stall != 1.0 else "")
         + (f" = {self.t_bundles * 1e6:,.0f} us" if self.t_bundles is not None else ""))
    extra = ((f"; DMA {self.t_dma * 1e6:,.0f} us" if self.t_dma is not None else "")
             + (f"; + grid steps {self.t_steps * 1e6:,.0f} us" if self.t_steps else ""))
    return (f"{self.name} {self.bound * 1e6:,.0f} us ({self.limiter}; HBM "
            f"{self.t_hbm * 1e6:,.0f} us, {b}{extra}"
            f"{'; ' + self.detail if self.detail else ''})")


@dataclasses.dataclass(frozen=True)
class KvStepCosts:
  """What a chip's scoring kernel costs beyond its bundles, measured: its
  block-size experiments (the chip records' "experiments" with nothing
  removed, `python -m streamidx.bench --ablate`: one kernel at one shape,
  `streamidx.blocks.EXPERIMENT_SHAPE`,
  its KV steps and bytes varied by the block size and decode batch) fitted
  by device time = kv_steps * step_s + bytes / dma_bandwidth (least
  squares, relative; step_s >= 0: where the fit would make it negative, as
  when the kernel's steps hide behind its reads, the bytes alone).
  docs/chip.md, "The model against the chip"."""

  chip: str
  step_s: float  # a KV grid step's fixed cost (DMA issue, waits, the step)
  dma_bandwidth: float  # bytes/s the kernel's page DMAs reach
  experiments: tuple[str, ...]
  worst: float  # the largest |fit / measured - 1| among them
  source: str  # the shape and kernel they ran


def kv_step_costs(chip: str) -> KvStepCosts | None:
  """`KvStepCosts` from `chip`'s experiments recorded at the block
  experiments' shape (`streamidx.blocks.EXPERIMENT_SHAPE`: at 64 x
  1,048,576 tokens the lean kernel's compute no longer overlaps its reads,
  docs/chip.md, which this fit's form cannot describe), or None (fewer
  than three with nothing removed: nothing measured to add)."""
  ex = [e for e in records.load("chip")["experiments"]
        if e["chip"] == chip and e["shape"] == si.blocks.EXPERIMENT_SHAPE
        and records.as_shipped(e)]
  if len(ex) < 3:
    return None
  a = np.array([[e["kv_steps"], e["hbm_bytes"]] for e in ex], float)
  y = np.array([e["device_s"] for e in ex])
  (step_s, per_byte), *_ = np.linalg.lstsq(a / y[:, None], np.ones(len(ex)),
                                           rcond=None)
  if step_s < 0:  # no cost a step is measurable (hidden): the bytes alone
    step_s = 0.0
    (per_byte,), *_ = np.linalg.lstsq(a[:, 1:] / y[:, None], np.ones(len(ex)),
                                      rcond=None)
  worst = float(np.abs(a @ (step_s, per_byte) / y - 1).max())
  return KvStepCosts(chip, float(step_s), float(1 / per_byte),
                     tuple(e["experiment"] for e in ex), worst,
                     ", ".join(sorted({f"{e['variant']} at {e['shape']}"
                                       for e in ex})))


@dataclasses.dataclass(frozen=True)
class LargeCache:
  """A chip's scoring kernel reading from a large cache, measured: the
  newest `wide_pool` experiment (the block experiments' shape, the cache
  at four times its pages) beside the newest shipped call there. Every
  experiment that ran today's kernel at the same blocks over the same
  format (`records.removed_now`, any shape or cache size) is called slow where its KV
  step is nearer `wide_pool`'s than the shipped call's; `min_bytes` is the
  smallest cache of the slow, `max_fast_bytes` the largest of the others
  (none when they overlap). There a KV DMA takes at least `dma_s`:
  `wide_pool`'s time less its KV steps at `KvStepCosts.step_s`, over its
  KV DMAs (a step's pages, times the format's arrays: one DMA each a
  page), so that a call's KV DMAs cost the larger of their bytes at the
  fast rate and their count at `dma_s` (the pair's two a page bound at
  64 x 1M, the inline cache's one not). docs/chip.md, "What the slow step
  follows"."""

  chip: str
  min_bytes: int  # caches of at least this many bytes step slowly
  max_fast_bytes: int  # the largest measured at the fast step
  dma_s: float  # seconds a KV DMA takes there, at least
  source: str


def large_cache(chip: str, costs: KvStepCosts | None) -> LargeCache | None:
  """`LargeCache` from `chip`'s experiments, or None (no `wide_pool` or
  shipped call at the experiments' shape, no `costs`, or slow and fast
  caches that overlap)."""
  def newest(name, rows):
    return next((e for e in reversed(rows) if e["experiment"] == name), None)
  at = records.chip_rows("experiments", chip=chip,
                         shape=si.blocks.EXPERIMENT_SHAPE)
  wide = newest("wide_pool", at)
  base = newest("baseline", [e for e in at if records.as_shipped(e)])
  if costs is None or wide is None or base is None:
    return None
  kernel = [e for e in records.chip_rows("experiments", chip=chip)
            if not records.removed_now(e["removed"], e["date"])
            and e["blocks"] == wide["blocks"] and e["variant"] == wide["variant"]
            and e["cache_format"] == wide["cache_format"]]
  def is_slow(e):
    return (abs(e["kv_step_s"] - wide["kv_step_s"])
            < abs(e["kv_step_s"] - base["kv_step_s"]))
  slow = [e["cache_bytes"] for e in kernel if is_slow(e)]
  fast = [e["cache_bytes"] for e in kernel if not is_slow(e)]
  if max(fast) >= min(slow):
    return None
  blocks = wide["blocks"]  # decode: every step a full batch's pages
  dmas = (wide["kv_steps"] * blocks["num_kv_pages_per_block"][0]
          * blocks["decode_req_batch_size"]
          * len(cache_lib.CACHE_FORMATS[wide["cache_format"]].arrays))
  dma_s = (wide["device_s"] - wide["kv_steps"] * costs.step_s) / dmas
  return LargeCache(chip, min(slow), max(fast), dma_s,
                    f"{wide['experiment']} at {wide['shape']}, {wide['date'][:10]}")


@dataclasses.dataclass(frozen=True)
class DecodeStall:
  """A chip's cycles a bundle in a decode KV loop, measured: the lean
  kernel's `compute_only` experiment (its reads and score writes removed)
  at `streamidx.blocks.EXPERIMENT_SHAPE`, its device time a KV step over
  the bundles of that program's KV loop at the clock (compiled for the
  chip without a TPU: data/decode_schedule.json "ablated", `python -m
  streamidx.lab.schedule --ablate`). Bundles are issue slots; what the
  loop waits beyond them (the MXU's results, the loop's branch) the count
  cannot see. docs/chip.md, "The model against the chip"."""

  chip: str
  factor: float  # device time a KV step / (its bundles / clock)
  kv_step_s: float
  kv_bundles: int
  source: str


def decode_stall(chip: str) -> DecodeStall | None:
  """`DecodeStall` from `chip`'s newest `compute_only` experiment at the
  experiments' shape whose program's KV loop is counted, or None."""
  ablated = records.load("decode_schedule").get("ablated", {"rows": []})
  for e in reversed(records.chip_rows("experiments", chip=chip,
                                      shape=si.blocks.EXPERIMENT_SHAPE,
                                      experiment="compute_only")):
    key = (e["variant"], chip, e["cache_format"],
           e["blocks"]["num_kv_pages_per_block"][0],
           e["blocks"]["decode_req_batch_size"],
           sorted(records.removed_now(e["removed"], e["date"])))
    rec = next((r for r in ablated["rows"] if key == tuple(r[k] for k in (
        "variant", "generation", "fmt", "bkv_p", "seq_batch_size",
        "ablate"))), None)
    if rec is not None:
      clock = hardware.spec(chip).clock_hz
      return DecodeStall(chip, e["kv_step_s"] * clock / rec["kv_bundles"],
                         e["kv_step_s"], rec["kv_bundles"],
                         f"{e['variant']} compute_only at {e['shape']}, "
                         f"{e['date'][:10]}")
  return None


# ---------------------------------------------------------------------------
# The records the step reads (data/step_schedule.json): the compiled launch
# modules and selection programs, counted by `streamidx.lab.dump`.

@dataclasses.dataclass(frozen=True)
class LaunchProgram:
  """The whole launch as compiled (the kernel, XLA's layout copies, the
  top-level program), its bundles as a function of its dynamic loops:
  `outside` once, per program `levels[0]`, per query block `levels[1]`
  (prefill), per KV step the last."""

  outside: int
  levels: tuple  # own bundles of each nested dynamic loop, outermost first
  calls: tuple  # (callee, bundles per call) of the module's other programs

  def executed(self, programs) -> int:
    """Bundles for `programs` (a `tiling.PlannedLaunch`'s)."""
    total = self.outside
    for pr in programs:
      if len(self.levels) == 2:
        total += self.levels[0] + pr.num_bq * pr.num_bkv * self.levels[1]
      else:
        total += self.levels[0] + pr.num_bq * (
            self.levels[1] + pr.num_bkv * self.levels[2])
    return total


# The fields that name a row of data/step_schedule.json's "selection" and
# "launches" (a launch's also its `compiled_shape`'s geometry).
SELECTION_KEY = ("chip", "method", "rows", "entries", "k")
LAUNCH_KEY = ("chip", "variant", "fmt", "case", "seq_batch_size", "bkv_p", "bq")


def selection_record(chip: str, method: str, rows: int, entries: int,
                     k: int) -> dict | None:
  """The recorded selection program (data/step_schedule.json), or None."""
  key = (chip, method, rows, entries, k)
  return next((r for r in records.load("step_schedule")["selection"]
               if key == tuple(r[f] for f in SELECTION_KEY)), None)


def launch_record(chip: str, variant: str, fmt: str, case: str,
                  seq_batch_size: int, bkv_p: int, bq: int, *,
                  geometry: shapes_lib.Indexer = shapes_lib.DSV4) -> dict | None:
  """The recorded launch module, compiled at a shape of indexer `geometry`
  (its `compiled_shape`, a `lab.shapes.COMPILE` name), or None."""
  key = (chip, variant, fmt, case, seq_batch_size, bkv_p, bq)
  return next((r for r in records.load("step_schedule")["launches"]
               if key == tuple(r[f] for f in LAUNCH_KEY)
               and _geometry(r["compiled_shape"]) == geometry), None)


def _geometry(shape: str) -> shapes_lib.Indexer:
  s = shapes_lib.COMPILE_BY_NAME[shape]
  return shapes_lib.Indexer(s.num_heads, s.head_dim, s.compression_ratio,
                        s.page_size)


def selection_stages(generation: str, method: str, rows: int, entries: int,
                     k: int, *, clock_hz: float | None,
                     compiled_entries: int | None = None) -> list[Stage]:
  """The selection (`select_topk(f32[rows, entries], k, method)` compiled:
  its bundles less the layout copies, the method's HBM bytes) and the
  layout copies in its program (their bundles and bytes, the SparseCore
  calls' too) on `generation`, from data/step_schedule.json (bundles None:
  no compile recorded); `compiled_entries`: the record to read when none is
  at `entries`. Where the chip records measured this selection alone (at
  `entries` or `compiled_entries`), one stage of that time (`t_chip`),
  its copies in it."""
  spec = hardware.spec(generation)
  rec = selection_record(generation, method, rows, entries, k)
  cost = topk_model.cost(method, rows, entries, k)
  note = ""
  if rec is None and compiled_entries and compiled_entries != entries:
    rec = selection_record(generation, method, rows, compiled_entries, k)
    note = f" (compiled at {compiled_entries} entries, the buffer has {entries})"
  measured = [m for e in {entries, compiled_entries or entries}
              for m in records.calls(chip=generation, mode="selection",
                                     method=method, rows=rows, entries=e, k=k)]
  if measured:  # the chip's own time for the selection alone, copies in
    m = measured[-1]
    return [Stage("selection", cost.bytes / spec.device_bandwidth,
                  rec and rec["bundles"], clock_hz, t_chip=m["device_s"],
                  detail=f"{method} at [{m['rows']}, {m['entries']}] measured "
                  f"alone on {generation} ({m['date'][:10]}, the chip records)")]
  if rec is None:
    return [Stage("selection", cost.bytes / spec.device_bandwidth, None, clock_hz,
                  detail=f"no recorded compile of {method} at [{rows}, {entries}]")]
  sc = (f", SparseCore calls {len(rec['sparsecore_calls'])} "
        f"({rec['sparsecore_hbm_bytes'] / 1e6:,.0f} MB moved, time not counted)"
        if rec["sparsecore_calls"] else "")
  return [Stage("selection", cost.bytes / spec.device_bandwidth,
                rec["bundles"] - rec["copy_bundles"], clock_hz,
                detail=f"{method}: sort {rec['sort_bundles']:,} bundles{note}"),
          Stage("copies", (rec["copy_hbm_bytes"] + rec["sparsecore_hbm_bytes"])
                / spec.device_bandwidth, rec["copy_bundles"], clock_hz,
                detail=f"layout copies in the selection's program{sc}")]


def step_stages(p: tiling.Plan, generation: str, *, variant: str, k: int,
                method: str, clock_hz: float | None,
                kv_floor: float | None = None) -> list[Stage]:
  """The step of plan `p` stage by stage: the fill (HBM), the scoring
  launches (each one's whole module, data/step_schedule.json; without a
  record, `kv_floor`: the KV loops alone, a floor), the score buffer's
  relayout (HBM), the selection and its copies (`selection_stages`)."""
  spec = hardware.spec(generation)
  st = {b.stage: b for b in bounds(costs(p, k=k), spec)}
  g = p.geometry
  bundles, notes = 0, []
  stall, stalled = decode_stall(generation), 0  # decode launches' bundles
  for l in p.executed:
    rec = launch_record(
        generation, variant, g.fmt, l.case, l.seq_batch_size, l.bkv_p, l.bq_sz,
        geometry=shapes_lib.Indexer(g.num_q_heads, g.head_dim,
                                    p.compression_ratio, g.page_size))
    if rec is None:
      notes.append(f"no recorded {l.label} launch")
      bundles = None
      continue
    n = LaunchProgram(rec["outside"], tuple(rec["levels"]), ()).executed(
        l.programs)
    notes.append(f"{l.label}: {n:,}")
    if bundles is not None:
      bundles += n
      stalled += n * l.case.startswith("decode")
  t = p.selected_cols
  rows = len(p.cu_q_lens) and p.cu_q_lens[-1]
  floor = bundles is None and kv_floor is not None
  if floor:
    bundles = stalled = int(kv_floor)
    notes.append("the KV loops alone (data/decode_schedule.json): a floor")
  chip, kernel = kv_step_costs(generation), st["kernel"]
  measured = {}  # what the chip's experiments add (`kv_step_costs`)
  if stall and bundles and stalled:
    notes.append(f"decode launches' bundles at {stall.factor:.2f} cycles "
                 f"each, measured ({stall.source})")
    measured["stall"] = (stalled * stall.factor + bundles - stalled) / bundles
  if chip:
    counts = p.counts()
    steps = counts["steps"]  # as the experiments counted theirs
    large = large_cache(generation, chip)
    t_dma = kernel.t_mem * kernel.bandwidth / chip.dma_bandwidth
    cache = g.cache_bytes
    notes.append(f"{steps:,} KV steps x {chip.step_s * 1e6:.3f} us and bytes "
                 f"at {chip.dma_bandwidth / 1e9:.0f} GB/s, measured "
                 f"({chip.source})")
    if large and cache >= large.min_bytes:
      dmas = counts["dma_kv"] + counts["dma_kv_scale"]
      t_dma = max(t_dma, dmas * large.dma_s)
      notes.append(f"a {cache / 1e9:.2f} GB cache, at least the "
                   f"{large.min_bytes / 1e9:.2f} GB measured at the large "
                   f"cache's step: {dmas:,} KV DMAs x at least "
                   f"{large.dma_s * 1e9:.1f} ns ({large.source})")
    elif large and cache > large.max_fast_bytes:
      notes.append(f"a {cache / 1e9:.2f} GB cache, between the largest "
                   f"measured at the fast step and the smallest at the slow")
    measured.update(t_steps=steps * chip.step_s, t_dma=t_dma)
  # The selection reads f32[T, E]; the kernels write f32[T, E / 128, 128], whose
  # (8, 128) tiles hold 8 x 128 entries of one row, not 8 rows: the driver's
  # reshape is an XLA copy of the buffer (the compiled call's HLO), read and
  # written, of the columns the selection reads; none where the method takes
  # the kernels' buffer as it is (`Method.reads_as_written`, as the driver).
  as_written = p.mode == "token" and si.topk.METHODS[method].reads_as_written(
      g.num_tokens, t, k)
  relayout = 0 if as_written else 2 * g.num_tokens * t * 4
  return ([Stage("fill", st["fill"].bound, None, clock_hz, hbm_only=True,
                 detail="XLA's -inf fill, HBM only"),
           Stage("scoring", kernel.t_mem, bundles, clock_hz,
                 t_mxu=kernel.t_math, detail="; ".join(notes), floor=floor,
                 **measured),
           Stage("relayout", relayout / spec.device_bandwidth, None, clock_hz,
                 hbm_only=True, detail="the score buffer f32[T, E / 128, 128] "
                 "copied to f32[T, E] for the selection, HBM only")]
          + selection_stages(generation, method, rows, t, k, clock_hz=clock_hz,
                             compiled_entries=max(p.seq_lens) // p.compression_ratio))


# The production DeepSeek-V4 decode step's index_topk: V4-Flash 512 (maxtext
# configs/models/deepseek4-284b.yml), V4-Pro 1024, the V3.2 report's 2048.
DSV4_MODELS = {"DeepSeek-V4-Flash": 512, "DeepSeek-V4-Pro": 1024,
               "DeepSeek-V3.2": 2048}


def indexer_step(generation: str, geometry: shapes_lib.Indexer, *, k: int,
                 variant: str = "vendored", batch: int = 64,
                 context_tokens: int = 131072, q_len: int = 1,
                 clock_hz: float | None = None,
                 method: str | None = None,
                 blocks: dict | None = None) -> StepBound:
  """One token-mode call of `geometry` (a `lab.shapes.Indexer`) keeping `k`
  entries per row, over `batch` decode sequences of `context_tokens`
  tokens (q_len > 1: prefill chunks of `q_len` queries) on `generation`,
  with `variant`'s block-size row (or `blocks`, the kernel's block-size
  keywords: a recorded call's) and first cache format. `stages`: the
  fill, the scoring, the selection (`method`; None: the vendored sort,
  whatever `topk.defaults` picks) and its copies, each by HBM bytes and by
  its compiled bundles at one clock (`clock_hz`; None: `clock(generation)`;
  0: none); the headline is their sum."""
  if k < 1:
    raise ValueError(f"k must be >= 1, got {k}")
  fmt = tiling.resolve_variant(variant).cache_formats[0]
  seqs = (dict(decode=[context_tokens] * batch) if q_len == 1
          else dict(prefill=[(q_len, context_tokens)] * batch))
  g = geometry
  b = si.make_mixed_batch(**seqs, page_size=g.page_size,
                          compression_ratio=g.compression_ratio)
  if blocks is None:
    row = si.block_sizes(variant, cache_format=fmt, num_heads=g.num_heads,
                         page_size=g.page_size, generation=generation)
    blocks, why = row.kwargs(), row.source.split(";")[0].split("(")[0].strip()
  else:
    why = "the call's own"
  p = tiling.plan(b, fmt=fmt, num_heads=g.num_heads, head_dim=g.head_dim,
                  variant=variant, generation=generation, **blocks)
  sb = step_bound(p, generation, variant=variant, k=k,
                  blocks=f"{generation} {variant} row: {blocks} ({why})")
  if clock_hz is None:
    clock_hz, source = clock(generation)
  else:
    source = "given" if clock_hz else "none"
  source = (f"{clock_hz / 1e9:.3f} GHz, {source}" if clock_hz else f"none ({source})")
  stages = step_stages(p, generation, variant=variant, k=k,
                       method=method or si.topk.VENDORED_TOPK_METHOD,
                       clock_hz=clock_hz or None, kv_floor=sb.bundles)
  return dataclasses.replace(sb, stages=tuple(stages), clock_source=source)


def dsv4_step(generation: str, variant: str = "vendored", *,
              model: str = "DeepSeek-V4-Flash", **step) -> StepBound:
  """The production step: `indexer_step` of DeepSeek-V4's indexer
  (`lab.shapes.DSV4`) with `model`'s k (`DSV4_MODELS`); `step`: its other
  keywords (batch, context_tokens, q_len, clock_hz, method)."""
  if model not in DSV4_MODELS:
    raise ValueError(f"model must be one of {tuple(DSV4_MODELS)}, got {model!r}")
  return indexer_step(generation, shapes_lib.DSV4, k=DSV4_MODELS[model],
                      variant=variant, **step)


# ---------------------------------------------------------------------------
# One clock per chip: the public one, else inferred from the one measurement
# named here (docs/tpu.md, "The clock": why these); the prediction of a
# measurement.
INFER_FROM = {"v7x": "sglang-jax-1642-dsv4-decode-b64-scoring",
              "v6e": "sglang-jax-1642-glm52-decode-b64-v6e-sort"}
@functools.lru_cache(maxsize=None)
def clock(chip: str) -> tuple[float | None, str]:
  """(Hz, where it comes from): the public clock, else the one inferred from
  `INFER_FROM[chip]` (`implied_clock`: its bundles / its measured time less
  its HBM-only stages), else
  None (docs/tpu.md, "The clock")."""
  spec = hardware.spec(chip)
  if spec.clock_hz:
    return spec.clock_hz, "public (data/tpu_specs.json)"
  name = INFER_FROM.get(chip)
  if name is None:
    return None, "no public clock, none inferred, docs/tpu.md"
  m = next(x for x in records.load("public_measurements")["measurements"]
           if x["id"] == name)
  parts, _ = measurement_stages(m, 0.0)
  hz = None if parts is None else implied_clock(parts, m["measured_s"])
  if hz is None:
    return None, f"{name} has no prediction to infer a clock from"
  return hz, f"inferred from {name}"


# Each measured model's indexer geometry, and what its measurements do not state.
GEOMETRY = {"DeepSeek-V4": shapes_lib.DSV4, "GLM-5.2": shapes_lib.GLM_TOKEN}
ASSUMED = {"GLM-5.2": (f"page size not stated ({shapes_lib.GLM_TOKEN.page_size}"
                       "-entry pages assumed, lab.shapes_lib.GLM_TOKEN)")}


def _step(m: dict, clock_hz: float):
  """`indexer_step` at a measurement's shape, geometry and k, or None."""
  if (m["model"] not in GEOMETRY or not m["rows"] or not m["context_tokens"]
      or not m["k"]):
    return None
  prefill = m["rows"] > 64
  return indexer_step(
      m["chip"], GEOMETRY[m["model"]], k=m["k"],
      context_tokens=m["context_tokens"],
      batch=1 if prefill else m["rows"], q_len=m["rows"] if prefill else 1,
      clock_hz=clock_hz)


_PARTS = {"scoring": ("scoring",), "selection": ("selection",),
          "copies": ("copies",),
          "step": ("fill", "scoring", "relayout", "selection", "copies")}


def measurement_stages(m: dict, clock_hz: float):
  """The stages that predict measurement `m` (None: it cannot be
  predicted), with the reason."""
  if not m["chip"]:
    return None, "chip not stated"
  if m.get("selection_method") == "sparsecore_radix":
    return None, "a SparseCore program: no bundles in the dump"
  if m["stage"] == "selection" and not m["rows"]:
    # #1607: rows not stated; the decode batch of #1642 at the same shape.
    parts = selection_stages(m["chip"], m["selection_method"], 64,
                             m["entries"], m["k"], clock_hz=clock_hz)
    note = "64 rows assumed (not stated); copies included"
  else:
    st = _step(m, clock_hz)
    if st is None:
      return None, "rows or context not stated"
    parts = [s for s in st.stages if s.name in _PARTS[m["stage"]]]
    note = ASSUMED.get(m["model"], "")
  missing = [s.name for s in parts
             if not s.hbm_only and (s.bundles is None or s.floor)]
  if missing or not parts:
    return None, f"no recorded compile of the {' and '.join(missing)} at this shape"
  return parts, note


def implied_clock(parts: Sequence[Stage], measured_s: float) -> float | None:
  """The clock at which `parts` take `measured_s`: their bundles over the
  time their HBM-only stages (`Stage.hbm_only`) leave; None where those
  stages alone take longer than the measurement."""
  left = measured_s - sum(s.t_hbm for s in parts if s.hbm_only)
  return sum(s.bundles or 0 for s in parts) / left if left > 0 else None
