"""Scaling model: the indexer's decode step on 1 to many chips, N JAX devices as
D data groups x C context shares (`streamidx.sharded`), each device's call the
roofline of its fill and scoring plus its selection by the chip's default
method (`selection_seconds`). Its terms, sources and what it leaves out:
docs/multichip.md, "The scaling model". Not a measurement.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Sequence

from streamidx import batch as batch_lib
from streamidx import cache as cache_lib
from streamidx import sharded
from streamidx.lab import shapes as shapes_lib
from streamidx.lab.model import hardware, roofline, tiling
from streamidx.lab.model import topk as topk_model
from streamidx.topk import defaults
from streamidx.semantics import cdiv

CHIP_COUNTS = (1, 4, 8, 64)


# The default workload of one decode step (one layer): 64 sequences of 1M tokens.
DSV4_DECODE = shapes_lib.DSV4_DECODE_1M


@dataclasses.dataclass(frozen=True)
class StepModel:
  """The modelled step of one layout on one generation (seconds, bytes)."""

  generation: str
  chips: float
  devices: int
  num_data: int
  num_context: int
  merge: str
  seqs_per_device: int
  share_pages: int
  cache_bytes_per_device: int
  local_s: float  # the device's call: fill + scoring + selection_s
  selection_s: float  # its selection (`selection_seconds`)
  merge_bytes_per_device: int
  merge_ici_s: float
  merge_topk_s: float
  merge_latency_s: float

  merge_s = property(lambda m: m.merge_ici_s + m.merge_topk_s + m.merge_latency_s)
  step_s = property(lambda m: m.local_s + m.merge_s)


@functools.lru_cache(maxsize=4096)
def selection_seconds(generation: str, rows: int, entries: int,
                      k: int) -> tuple[float, str]:
  """(seconds, what they rest on) of one device's selection of f32[rows,
  entries] by `generation`'s default method: the larger of its HBM bound
  and its recorded bundles at `topk.defaults.DECODE` scaled by score
  elements (the model's assumption) at `roofline.clock`; without a record
  or a clock, the HBM bound alone, said so."""
  method = defaults.default_method(generation)
  hbm = topk_model.hbm_bound(topk_model.cost(method, rows, entries, k),
                             hardware.spec(generation))
  rows0, entries0, _ = defaults.DECODE
  rec = roofline.selection_record(generation, method, rows0, entries0, k)
  hz, clock_src = roofline.clock(generation)
  if rec is None or rec["bundles"] is None or not hz:
    why = "no clock" if rec and rec["bundles"] is not None else (
        f"no recorded compile at [{rows0}, {entries0}], k {k}")
    return hbm, f"{method}: HBM bytes only ({why})"
  t = rec["bundles"] * (rows * entries) / (rows0 * entries0) / hz
  return max(hbm, t), (f"{method}: {rec['bundles']:,} bundles at [{rows0}, "
                       f"{entries0}] scaled by elements, at {hz / 1e9:.3f} GHz "
                       f"({clock_src})")


@functools.lru_cache(maxsize=4096)
def _local_seconds(generation: str, seqs: int, share_entries: int,
                   share_pages: int, w: shapes_lib.Shape) -> tuple[float, float]:
  """(roofline bound of one device's fill + kernel, its selection's seconds)."""
  seq_len = share_entries * w.compression_ratio
  batch = batch_lib.make_batch([(w.q_len, max(seq_len, w.q_len))] * seqs,
                               page_size=w.page_size, pages_per_seq=share_pages,
                               compression_ratio=w.compression_ratio)
  # The table's blocks; equal sequences: `sort_decode` changes nothing.
  p = tiling.plan(batch, fmt=w.fmt, num_heads=w.num_heads,
                  head_dim=w.head_dim, variant="vendored",
                  generation=generation, sort_decode=False)
  pred = roofline.predict(p, k=w.k, generations=[generation])[generation]
  select, _ = selection_seconds(generation, seqs * w.q_len, share_entries, w.k)
  return pred["fill"] + pred["kernel"], select


def step(w: shapes_lib.Shape, generation: str, devices: int, num_context: int = 1, *,
         merge: str = "all_gather", collective_latency_s: float = 0.0) -> StepModel:
  """The modelled decode step of `w` on `devices` JAX devices of `generation`,
  D = devices // C data groups x C = `num_context` shares merged by `merge`
  (`streamidx.sharded`), `collective_latency_s` per collective round."""
  spec = hardware.spec(generation)
  if devices < 1 or num_context < 1 or devices % num_context:
    raise ValueError(f"num_context: must divide devices ({devices}) (got "
                     f"{num_context})")
  num_data = devices // num_context
  seqs = max(1, cdiv(w.num_seqs, num_data))
  share_pages = max(1, cdiv(w.pages, num_context))
  share_entries = min(w.entries, share_pages * w.page_size)
  record = cache_lib.record_bytes(w.fmt, w.head_dim)
  scored, select = _local_seconds(generation, seqs, share_entries,
                                 share_pages, w)
  rows = seqs * w.q_len
  merge_bytes = ici_s = topk_s = lat_s = 0.0
  if num_context > 1:
    bw = spec.device_ici_bandwidth
    if bw is None:
      raise ValueError(f"generation: {generation} has no published ICI "
                       f"bandwidth ({spec.sources['ici_bandwidth_bytes_per_s']})")
    merge_bytes = rows * sharded.merge_bytes_per_row(w.k, num_context, merge)
    ici_s = merge_bytes / bw
    rounds = 1 if merge == "all_gather" else int(math.log2(num_context))
    candidates = num_context * w.k if merge == "all_gather" else 2 * w.k
    per_round = rows * (candidates * 8 + w.k * 8)  # read candidates, write k
    topk_s = rounds * per_round / spec.device_bandwidth
    lat_s = rounds * collective_latency_s
  return StepModel(
      generation=generation, chips=devices / spec.jax_devices_per_chip,
      devices=devices, num_data=num_data, num_context=num_context,
      merge=merge, seqs_per_device=seqs, share_pages=share_pages,
      cache_bytes_per_device=seqs * share_pages * w.page_size * record,
      local_s=scored + select, selection_s=select,
      merge_bytes_per_device=int(merge_bytes),
      merge_ici_s=ici_s, merge_topk_s=topk_s, merge_latency_s=lat_s)


def best_step(w: shapes_lib.Shape, generation: str, devices: int, **step_kw
              ) -> StepModel:
  """The fastest layout over C in 1, 2, 4, ... dividing `devices` (`step_kw`:
  `step`'s merge and collective_latency_s)."""
  degrees = [c for c in (2 ** i for i in range(int(math.log2(devices)) + 1))
             if devices % c == 0]
  if hardware.spec(generation).device_ici_bandwidth is None:
    degrees = [1]
  return min((step(w, generation, devices, c, **step_kw) for c in degrees),
             key=lambda m: (m.step_s, m.num_context))


def _pays(w: shapes_lib.Shape, generation: str, devices: int, **step_kw):
  """(whether some C > 1 beats C = 1, the best StepModel, the C = 1 one)."""
  best, sp = best_step(w, generation, devices, **step_kw), step(w, generation, devices, 1)
  return best.num_context > 1 and best.step_s < sp.step_s, best, sp


def scaling_table(w: shapes_lib.Shape = DSV4_DECODE,
                  generations: Sequence[str] = hardware.GENERATIONS,
                  chips: Sequence[int] = CHIP_COUNTS, **step_kw) -> list[dict]:
  """One row per (generation, chips): one chip per sequence vs the best C
  (`step_kw`: `step`'s merge and collective_latency_s)."""
  rows = []
  for gen in generations:
    spec = hardware.spec(gen)
    for n in chips:
      devices = n * spec.jax_devices_per_chip
      _, best, sp = _pays(w, gen, devices, **step_kw)
      rows.append({
          "generation": gen, "chips": n, "devices": devices,
          "cache MiB/device (C=1)": round(sp.cache_bytes_per_device / 2**20, 1),
          "step us (C=1)": round(sp.step_s * 1e6, 1),
          "selection us (C=1)": round(sp.selection_s * 1e6, 1),
          "best C": best.num_context if spec.device_ici_bandwidth else "n/a",
          "cache MiB/device (best)": round(best.cache_bytes_per_device / 2**20, 1),
          "merge KiB/device": round(best.merge_bytes_per_device / 2**10, 1),
          "merge us": round(best.merge_s * 1e6, 2),
          "step us (best)": round(best.step_s * 1e6, 1),
          "speedup": round(sp.step_s / best.step_s, 2)})
  return rows


def crossover_devices(w: shapes_lib.Shape, generation: str, *, max_chips: int = 4096,
                      **step_kw):
  """The fewest chips (powers of two) at which some C > 1 beats C = 1:
  (chips, the winning StepModel, the C = 1 StepModel), or None."""
  per_chip = hardware.spec(generation).jax_devices_per_chip
  for n in (2 ** i for i in range(max_chips.bit_length())):
    ok, best, sp = _pays(w, generation, n * per_chip, **step_kw)
    if ok:
      return n, best, sp
  return None


def crossover_context(w: shapes_lib.Shape, generation: str, chips: int, *,
                      max_tokens: int = 1 << 26, **step_kw):
  """The shortest context (tokens, whole pages) at which context parallelism
  beats one chip per sequence on `chips` chips: (tokens, the winning
  StepModel, the C = 1 StepModel), or None (bisection: docs/multichip.md)."""
  devices = chips * hardware.spec(generation).jax_devices_per_chip
  tokens_per_page = w.page_size * w.compression_ratio
  pays = lambda pages: _pays(  # pylint: disable=unnecessary-lambda-assignment
      w.with_(seq_len=pages * tokens_per_page), generation, devices, **step_kw)
  hi = max(1, max_tokens // tokens_per_page)
  if not pays(hi)[0]:
    return None
  lo = 0  # pays(lo) is False by convention (no entries: nothing to split)
  while hi - lo > 1:
    mid = (lo + hi) // 2
    if pays(mid)[0]:
      hi = mid
    else:
      lo = mid
  _, best, sp = pays(hi)
  return hi * tokens_per_page, best, sp
