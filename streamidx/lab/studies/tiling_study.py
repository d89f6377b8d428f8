"""Notebook 04's studies: how the kernels tile a batch, and what it costs.

Each function returns plain rows (lists of dicts, for `lab.tables`) or a
summary dict, computed from the tiling model (`lab.model.tiling`), the
roofline (`lab.model.roofline`), the top-k model (`lab.model.topk`), a
recording of the interpreter's DMAs (`lab.model.timeline`) or the TPU
compiler (`lab.aot`, `lab.schedule`; libtpu, no TPU). Nothing here is a TPU
measurement; every row says which bound it is.

Sections of `notebooks/04_kernel_tiling.ipynb`:

- the launches and their programs (`program_rows`), the recorded run checked
  against the model (`check_recording`);
- VMEM per launch (`production_vmem`, `prefill_fit`);
- decode batching (`lognormal_mixes`, `batching_waste`, `waste_rows`,
  `order_rows`, `random_order_rows`) and empty launches (`launch_rows`);
- block sizes (`decode_block_rows`, `prefill_block_rows`), the DeepSeek-V4
  step (`step_rows`);
- the variants side by side (`variant_step_rows`, `core_split_bound`,
  `megacore_rows`);
- the top-k stage (`topk_rows`, `topk_recommendations`);
- the compiler's VMEM and static schedule (`vmem_rows`, `vmem_findings`,
  `schedule_rows`).
"""

from __future__ import annotations

import glob
import os
import re
import tempfile
from typing import Mapping, Sequence

import numpy as np

from streamidx import batch as batch_lib
from streamidx import topk as topk_lib
from streamidx.lab.model import hardware, roofline, tiling
from streamidx.lab.model import topk as topk_model
from streamidx.semantics import cdiv

__all__ = [
    "ORDERS", "program_rows", "check_recording", "production_vmem",
    "prefill_fit", "lognormal_mixes", "batching_waste", "waste_rows",
    "order_rows", "random_order_rows", "launch_rows", "recorded_costs", "decode_block_rows",
    "prefill_block_rows", "step_rows", "variant_plans", "core_split_bound",
    "variant_step_rows", "megacore_rows", "topk_rows",
    "topk_recommendations", "vmem_rows", "vmem_findings", "schedule_rows",
    "variant_page_bounds", "VARIANT_FORMATS",
]

_MIB = 2 ** 20
# Decode orders compared: the four of `tiling.SORTS` and the kernels' own
# (`sort_decode`, `semantics.decode_order`).
ORDERS = tiling.SORTS + (tiling.KERNEL_SORT,)


# ---------------------------------------------------------------------------
# The launches, and the recorded run.


def program_rows(p: tiling.Plan) -> list[dict]:
  """One row per program of every launch of `p` (an empty launch: one row
  saying so): its sequences, their query and KV lengths, loop trip counts."""
  rows = []
  for li, l in enumerate(p.launches):
    common = dict(launch=li, case=l.case, B=l.seq_batch_size, bq=l.bq_sz,
                  bkv_p=l.bkv_p, bkv_entries=l.bkv_sz)
    for pr in l.programs:
      rows.append(dict(common, program=pr.index,
                       seqs=",".join(map(str, pr.seqs)),
                       q_lens=",".join(map(str, pr.q_lens)),
                       kv_lens=",".join(map(str, pr.kv_lens)),
                       num_bq=pr.num_bq, num_bkv=pr.num_bkv,
                       steps=pr.num_bq * pr.num_bkv))
    if not l.programs:
      rows.append(dict(common, program="-", seqs="(empty: not launched)",
                       steps=0))
  return rows


def check_recording(rec, p: tiling.Plan) -> dict:
  """Checks a `timeline.record()` of the call `p` models, and summarises it.

  Raises AssertionError unless the recorder saw no error, its DMA sequence
  (kind, slot, sequence, bytes, page, output position, in order) equals
  `tiling.expected_dma_events(p)`, its VMEM allocations equal the plan's
  scratch shapes, and it saw one compute step per modelled step.

  Returns {"events": DMA starts and waits, "starts": {kind: n} recorded,
  "model_starts": the plan's, "computes": compute steps, "overlapped":
  compute steps during which a KV DMA started before them was still in
  flight (the double buffering at work)}.
  """
  assert not rec.errors(), rec.errors()[:3]
  recorded = [e.key() for e in rec.dma_events()]
  assert recorded == [e.key() for e in tiling.expected_dma_events(p)], (
      "the tiling model's DMA sequence differs from the kernel's")
  assert rec.allocations("vmem") == [[(s, d) for _, s, d in l.scratch]
                                     for l in p.executed]
  counts = p.counts()
  lanes = rec.lanes()
  computes = [l for l in lanes if l["lane"] == "compute"]
  kv = [l for l in lanes if l["lane"].startswith("KV")]
  assert len(computes) == counts["steps"], (len(computes), counts["steps"])
  overlapped = sum(any(d["start"] < c["start"] and d["end"] > c["end"]
                       for d in kv) for c in computes)
  kinds = ("kv", "q", "w", "out")
  return dict(events=len(recorded),
              starts={k: sum(1 for e in rec.dma_events()
                             if e.op == "start" and e.kind == k)
                      for k in kinds},
              model_starts={k: counts["dma_" + k] for k in kinds},
              computes=len(computes), overlapped=overlapped)


# ---------------------------------------------------------------------------
# VMEM.


def production_vmem(g: tiling.Geometry, *, num_kv_pages_per_block,
                    num_queries_per_block, decode_req_batch_size: int
                    ) -> dict[str, dict]:
  """`tiling.vmem_budget` of the decode, prefill and mixed launches at these
  block sizes (per case: bytes of each scratch buffer, "scratch", the
  "logits" estimate and "total")."""
  nkv, nq = list(num_kv_pages_per_block), list(num_queries_per_block)
  return {
      "decode": tiling.vmem_budget(g, bq_sz=min(nq[0], 1), bkv_p=nkv[0],
                                   seq_batch_size=decode_req_batch_size,
                                   case="decode"),
      "prefill": tiling.vmem_budget(g, bq_sz=nq[1], bkv_p=nkv[1],
                                    case="prefill"),
      "mixed": tiling.vmem_budget(g, bq_sz=nq[2], bkv_p=nkv[2], case="mixed"),
  }


def prefill_fit(g: tiling.Geometry, bq_choices: Sequence[int],
                bkv_choices: Sequence[int], limits: Mapping[str, int]):
  """The prefill launch's VMEM (scratch + logits estimate) per (bq, bkv_p).

  Returns (budget f64[len(bq), len(bkv)] bytes, rows: bq, bkv_p, scratch
  and total MiB, and per generation of `limits` (bytes) "fits" or "NO").
  """
  budget = np.zeros((len(bq_choices), len(bkv_choices)))
  rows = []
  for i, bq in enumerate(bq_choices):
    for j, c in enumerate(bkv_choices):
      v = tiling.vmem_budget(g, bq_sz=bq, bkv_p=c, case="prefill")
      budget[i, j] = v["total"]
      rows.append(dict(bq=bq, bkv_p=c, scratch_MiB=v["scratch"] / _MIB,
                       total_MiB=v["total"] / _MIB,
                       **{gen: "fits" if v["total"] <= lim else "NO"
                          for gen, lim in limits.items()}))
  return budget, rows


# ---------------------------------------------------------------------------
# Decode batching and empty launches.


def lognormal_mixes(seed: int, *, num_seqs: int, median_tokens: int,
                    sigma: float, min_tokens: int, max_tokens: int,
                    trials: int) -> list[np.ndarray]:
  """`trials` decode batches of `num_seqs` context lengths (tokens), drawn
  log-normal around `median_tokens` and clipped to [min, max]: i64 arrays."""
  rng = np.random.default_rng(seed)
  return [np.clip(rng.lognormal(np.log(median_tokens), sigma, num_seqs),
                  min_tokens, max_tokens).astype(int) for _ in range(trials)]


def batching_waste(mixes, batch_sizes: Sequence[int], *, page_size: int,
                   compression_ratio: int, bkv_p: int,
                   orders: Sequence[str] = ORDERS, fmt: str = "fp8",
                   num_heads: int = 8) -> dict:
  """{(B, order): [wasted fraction of the computed KV blocks, per mix]}.

  `tiling.decode_batch_waste` of each mix with B decode sequences per
  program and the mix reordered by `order` (one of `ORDERS`; "kernel" is
  the order `sort_decode` scores in).
  """
  return {(b, o): [tiling.decode_batch_waste(
      m, page_size=page_size, compression_ratio=compression_ratio,
      num_kv_pages_per_block=bkv_p, decode_req_batch_size=b, sort=o,
      fmt=fmt, num_heads=num_heads)["waste_fraction"] for m in mixes]
          for b in batch_sizes for o in orders}


def waste_rows(waste: Mapping, batch_sizes: Sequence[int],
               orders: Sequence[str] = ORDERS) -> list[dict]:
  """`batching_waste` as rows: per B, mean ± std (percent) per order."""
  return [dict(B=b, **{o: f"{100 * np.mean(waste[b, o]):.1f}% ± "
                          f"{100 * np.std(waste[b, o]):.1f}"
                       for o in orders}) for b in batch_sizes]


def _decode_plan(seq_lens, *, page_size, compression_ratio, sort_decode,
                 **kw) -> tiling.Plan:
  b = batch_lib.make_mixed_batch(decode=[int(s) for s in seq_lens],
                                 page_size=page_size,
                                 compression_ratio=compression_ratio)
  return tiling.plan(b, sort_decode=sort_decode, **kw)


def order_rows(seq_lens, *, k: int, page_size: int, compression_ratio: int,
               generations: Sequence[str] = ("v5e", "v6e", "v7x"),
               **plan_kw) -> list[dict]:
  """One decode batch in the given order and in `sort_decode`'s: KV blocks
  computed and wasted, KV MB read, the kernel stage's roofline bound (us).

  plan_kw: `tiling.plan`'s keywords (fmt, num_heads, head_dim, block
  sizes, decode_req_batch_size).
  """
  rows = []
  for name, sort in (("given (sort_decode=False)", False),
                     ("length-sorted (sort_decode=True)", True)):
    p = _decode_plan(seq_lens, page_size=page_size,
                     compression_ratio=compression_ratio, sort_decode=sort,
                     **plan_kw)
    w, pred = tiling.block_waste(p), roofline.predict(p, k=k,
                                                      generations=generations)
    rows.append(dict(order=name, blocks_computed=w["blocks_computed"],
                     blocks_wasted=w["blocks_wasted"],
                     waste=f"{100 * w['waste_fraction']:.1f}%",
                     KV_MB=p.counts()["hbm_bytes_kv"] / 1e6,
                     **{f"{gen} kernel us": pred[gen]["kernel"] * 1e6
                        for gen in generations}))
  return rows


def random_order_rows(seed: int, *, trials: int, num_seqs: int,
                      max_tokens: int, batch_sizes: Sequence[int],
                      page_size: int, compression_ratio: int, bkv_p: int
                      ) -> list[dict]:
  """Uniform random decode batches: per B, the wasted share of KV blocks in
  the given order and in the kernel's, and the worst ratio of the kernel
  order's computed blocks to the given order's (never above 1 by
  construction of `semantics.decode_order`)."""
  rng = np.random.default_rng(seed)
  mixes = [rng.integers(compression_ratio, max_tokens + 1, num_seqs)
           for _ in range(trials)]
  bkv_sz = bkv_p * page_size
  rows = []
  for b in batch_sizes:
    out = {"none": [], tiling.KERNEL_SORT: []}
    ratio = []
    for m in mixes:
      blocks = [max(1, cdiv(int(s) // compression_ratio, bkv_sz)) for s in m]
      got = {}
      for o in out:
        w = tiling.decode_batch_waste(
            m, page_size=page_size, compression_ratio=compression_ratio,
            num_kv_pages_per_block=bkv_p, decode_req_batch_size=b, sort=o)
        out[o].append(w["waste_fraction"])
        got[o] = w["blocks_computed"]
      assert got["none"] >= sum(blocks)
      ratio.append(got[tiling.KERNEL_SORT] / got["none"])
    rows.append(dict(B=b, batches=trials, given=f"{100 * np.mean(out['none']):.1f}%",
                     sorted=f"{100 * np.mean(out[tiling.KERNEL_SORT]):.1f}%",
                     worst_sorted_over_given=max(ratio)))
  return rows


def launch_rows(p: tiling.Plan, recorded: dict | None = None) -> list[dict]:
  """Launches and grid steps of the call `p` with local modification M14 (a
  launch whose range is empty is not made) and without it (every launch of
  `semantics.token_launches` made, an empty one with a grid of 0 programs,
  as the vendored kernel did). `recorded`: `recorded_costs` of a recording
  of the call, added as a third row (what the interpreter ran).
  """
  def row(name, launches):
    return dict(kernel=name, launches=len(launches),
                grid_steps=sum(l.grid for l in launches),
                empty_launches=sum(1 for l in launches if not l.grid),
                kv_page_dmas=sum(pr.num_bq * pr.num_bkv * len(pr.seqs)
                                 * l.bkv_p for l in launches
                                 for pr in l.programs))
  rows = [row("without M14 (model)", p.launches),
          row("with M14 (model)", p.executed)]
  if recorded is not None:
    rows.append(dict(kernel="with M14 (interpreter, recorded)",
                     launches=recorded["launches"],
                     grid_steps=recorded["grid_points"],
                     empty_launches=recorded["empty_launches"],
                     kv_page_dmas=recorded["kv_page_dmas"]))
  return rows


def recorded_costs(counts: Sequence[dict], p: tiling.Plan) -> dict:
  """What a recorded call moved (`costs.launch_counts` of its recording),
  for the call `p` models.

  Returns launches, grid_points, empty_launches (launches that ran no grid
  point), kv_page_dmas, bytes_per_entry (cache bytes
  the KV DMAs moved, scales included, per entry of the pages fetched),
  blocks_fetched by the decode launches (one per sequence per step),
  blocks_needed (`tiling.block_waste(p)`), waste (fraction of the fetched).
  """
  executed = p.executed
  if len(counts) != len(executed):
    raise ValueError(f"counts: {len(counts)} launches ran, the plan has "
                     f"{len(executed)}")
  pages = sum(c["dma_starts"].get("kv", 0) for c in counts)
  kv_bytes = sum(c["bytes"].get(k_, 0) for c in counts
                 for k_ in ("kv", "kv_scale"))
  fetched = sum(c["kv_blocks"] for c, l in zip(counts, executed)
                if l.case in ("decode", "decode_rest"))
  needed = tiling.block_waste(p)["blocks_needed"]
  return dict(launches=len(counts),
              grid_points=sum(c["grid_points"] for c in counts),
              empty_launches=sum(1 for c in counts if not c["grid_points"]),
              kv_page_dmas=pages,
              bytes_per_entry=kv_bytes / (pages * p.geometry.page_size)
              if pages else float("nan"),
              blocks_fetched=fetched, blocks_needed=needed,
              waste=(fetched - needed) / fetched if fetched else 0.0)


# ---------------------------------------------------------------------------
# Block sizes and the DeepSeek-V4 step.


def decode_block_rows(batch, choices: Sequence[int], *, k: int,
                      num_kv_pages_per_block, num_queries_per_block,
                      generations: Sequence[str] = ("v5e", "v6e", "v7x"),
                      **plan_kw) -> list[dict]:
  """The call on `batch` at each decode `bkv_p` of `choices` (prefill and
  mixed keep theirs): programs, steps, KV DMAs and their size, score DMAs,
  over-read (KV bytes read / the sequences' own), decode VMEM, the kernel
  stage's roofline bound per generation (us)."""
  nkv = list(num_kv_pages_per_block)
  rows = []
  for c in choices:
    p = tiling.plan(batch, num_kv_pages_per_block=(c, nkv[1], nkv[2]),
                    num_queries_per_block=tuple(num_queries_per_block),
                    **plan_kw)
    cnt, pred = p.counts(), roofline.predict(p, k=k, generations=generations)
    kc = roofline.costs(p, k=k)[1]
    pb = p.geometry.page_bytes
    rows.append(dict(bkv_p=c, programs=cnt["grid_steps"], steps=cnt["steps"],
                     KV_DMAs=cnt["dma_kv"], KiB_per_DMA=pb / 1024,
                     KiB_per_block=c * pb / 1024, out_DMAs=cnt["dma_out"],
                     over_read=round(kc.bytes_read["kv_cache"] / kc.useful_bytes, 3),
                     VMEM_KiB=p.launches[0].vmem_bytes / 1024,
                     **{f"{gen} us": pred[gen]["kernel"] * 1e6 for gen in generations},
                     production="<-" if c == nkv[0] else ""))
  return rows


def prefill_block_rows(batch, q_choices: Sequence[int],
                       kv_choices: Sequence[int], *, k: int,
                       num_kv_pages_per_block, num_queries_per_block,
                       limits: Mapping[str, int],
                       generations: Sequence[str] = ("v5e", "v6e", "v7x"),
                       **plan_kw) -> list[dict]:
  """The call on `batch` (a chunked prefill) per (bq, bkv_p): steps, KV DMAs
  and MB read, VMEM (scratch + logits estimate) and the generations of
  `limits` it fits, the kernel bound per generation (us) and its limiter."""
  nkv, nq = list(num_kv_pages_per_block), list(num_queries_per_block)
  rows = []
  for bq in q_choices:
    for c in kv_choices:
      p = tiling.plan(batch, num_kv_pages_per_block=(nkv[0], c, c),
                      num_queries_per_block=(1, bq, bq), **plan_kw)
      cnt, pred = p.counts(), roofline.predict(p, k=k, generations=generations)
      v = tiling.vmem_budget(p.geometry, bq_sz=bq, bkv_p=c, case="prefill")
      lim = sorted({next(b for b in pred[gen]["bounds"]
                         if b.stage == "kernel").limiter for gen in generations})
      rows.append(dict(bq=bq, bkv_p=c, steps=cnt["steps"], KV_DMAs=cnt["dma_kv"],
                       KV_MB_read=cnt["bytes_kv"] / 1e6, VMEM_MiB=v["total"] / _MIB,
                       fits=",".join(g for g, l in limits.items() if v["total"] <= l) or "none",
                       **{f"{gen} us": pred[gen]["kernel"] * 1e6 for gen in generations},
                       limit=",".join(lim),
                       production="<-" if (bq, c) == (nq[1], nkv[1]) else ""))
  return rows


def step_rows(pred: Mapping[str, dict]) -> list[dict]:
  """`roofline.predict` as rows: per generation the three stages' bounds,
  their sum (us), the kernel's limiter and its two terms."""
  rows = []
  for gen, r in pred.items():
    kb = next(b for b in r["bounds"] if b.stage == "kernel")
    rows.append(dict(generation=gen, fill_us=r["fill"] * 1e6,
                     kernel_us=r["kernel"] * 1e6, topk_us=r["topk"] * 1e6,
                     total_us=r["total"] * 1e6, kernel_limit=kb.limiter,
                     kernel_T_math_us=kb.t_math * 1e6,
                     kernel_T_mem_us=kb.t_mem * 1e6))
  return rows


# ---------------------------------------------------------------------------
# The variants side by side.

# The token variants and the cache format each reads.
VARIANT_FORMATS = {"vendored": "fp8", "dense": "dense_fp8"}


def variant_plans(batch, *, num_heads: int, head_dim: int = 128,
                  variants: Mapping[str, str] = VARIANT_FORMATS,
                  **plan_kw) -> dict[str, tiling.Plan]:
  """{variant: `tiling.plan` of the call on `batch`} for each token variant
  (name -> its cache format), same block sizes (`plan_kw`)."""
  return {v: tiling.plan(batch, fmt=f, variant=v, num_heads=num_heads,
                         head_dim=head_dim, **plan_kw)
          for v, f in variants.items()}


def core_split_bound(p: tiling.Plan, spec: hardware.TpuSpec, *, k: int,
                     num_cores: int) -> float:
  """The kernel stage's HBM bound (s) with each launch's programs split over
  `num_cores` TensorCores as the dense kernel's `num_cores` does (core c runs
  programs c, c + num_cores, ...): the busiest core's share of the stage's
  bytes (in proportion to the KV pages its programs fetch) over one
  TensorCore's bandwidth, launch by launch. num_cores=1 is the vendored
  one-core bound. A model: equal bandwidth per core, no contention."""
  total = sum(roofline.costs(p, k=k)[1].bytes_read.values()) + sum(
      roofline.costs(p, k=k)[1].bytes_written.values())
  pages = [[0] * num_cores for _ in p.executed]
  for li, l in enumerate(p.executed):
    for j, pr in enumerate(l.programs):
      pages[li][j % num_cores] += pr.num_bq * pr.num_bkv * len(pr.seqs) * l.bkv_p
  all_pages = sum(map(sum, pages))
  if not all_pages:
    return 0.0
  busiest = sum(max(row) for row in pages)
  return total * busiest / all_pages / spec.kernel_bandwidth


def variant_step_rows(plans: Mapping[str, tiling.Plan], *, k: int,
                      generations: Sequence[str],
                      page_bounds: Mapping[tuple, roofline.PageBound] | None = None,
                      split_generations: Sequence[str] = ("v5p",),
                      specs: Mapping[str, hardware.TpuSpec] | None = None
                      ) -> list[dict]:
  """Per variant and generation, the kernel stage of one decode step.

  Columns: bytes per entry as the TPU stores the cache, KV MB read, the HBM
  bound on one TensorCore (the vendored grid) and, for the dense variant on
  a generation of `split_generations` (where the compiler targets two
  TensorCores: v5p; `megacore_rows` shows it), with `num_cores=2`
  (`core_split_bound`); the static compute bound (`page_bounds[(variant,
  generation)]`: KV pages fetched x scheduled bundles per page / clock; no
  stalls) where the generation has a clock, else the clock below which the
  schedule is slower than HBM; and which bound binds.
  """
  specs = hardware.load_specs() if specs is None else specs
  page_bounds = page_bounds or {}
  rows = []
  for v, p in plans.items():
    cnt = p.counts()
    kc = roofline.costs(p, k=k)[1]
    pages = cnt["dma_kv"]
    entries = pages * p.geometry.page_size
    for gen in generations:
      spec = specs[gen]
      t_hbm = roofline.predict(p, k=k, generations=[gen], specs=specs)[gen]["kernel"]
      two = (core_split_bound(p, spec, k=k, num_cores=2)
             if v == "dense" and gen in split_generations else None)
      pb = page_bounds.get((v, gen))
      t_static = None if pb is None or pb.t_compute is None else pages * pb.t_compute
      hbm = two if two is not None else t_hbm
      if pb is None:
        binds = "HBM (no schedule)"
      elif t_static is None:
        binds = (f"schedule, below {pages * pb.bundles_per_page / hbm / 1e9:.2f} GHz"
                 " (no public clock)")
      else:
        binds = "static schedule" if t_static > hbm else "HBM"
      rows.append({
          "variant": v, "generation": gen,
          "B per entry": round(cnt["hbm_bytes_kv"] / entries, 1),
          "KV MB": cnt["hbm_bytes_kv"] / 1e6,
          "HBM bound us (1 core)": t_hbm * 1e6,
          "HBM bound us (num_cores=2)": None if two is None else two * 1e6,
          "bundles/page": None if pb is None else round(pb.bundles_per_page, 1),
          "static bound us": None if t_static is None else t_static * 1e6,
          "binds": binds,
          "FLOP/B": round(kc.intensity, 1)})
  return rows


def megacore_rows(generations: Sequence[str] = ("v5p", "v4"), *,
                  shape: str = "dsv4-decode-4k", blocks=None,
                  timeout: float = 900.0) -> list[dict]:
  """The dense kernel's decode launch compiled for each generation with
  `num_cores` 1 and 2 (libtpu, no TPU), and what the compiler made of it.

  Per (generation, num_cores): the TensorCores per chip (data/tpu_specs.json),
  the cores the compiler targets (`pltpu.get_tpu_info().num_cores` inside
  `compile_for`), the launch's grid and dimension semantics, whether the
  compiled program holds the megacore barrier (`BarrierMegacore` in the
  final bundles: the program synchronises two cores), its bundles, and the
  KV loop's bundles per page. `blocks`: the block-size keywords (default
  the table's DeepSeek-V4 row).
  """
  from jax.experimental.pallas import tpu as pltpu  # pylint: disable=g-import-not-at-top

  from streamidx import modes  # pylint: disable=g-import-not-at-top
  from streamidx.lab import aot, schedule  # pylint: disable=g-import-not-at-top

  blocks = dict(blocks or dict(num_kv_pages_per_block=(3, 2, 2),
                               num_queries_per_block=(1, 128, 128)))
  shp = {s.name: s for s in aot.SHAPES}[shape]
  specs = hardware.load_specs()
  rows = []
  for gen in generations:
    with modes.compile_for(gen) as target:
      seen = int(pltpu.get_tpu_info().num_cores)
      grids = {}
      for nc in (1, 2):
        name, eqn = aot.launch_calls("dense", shp, "dense_fp8",
                                     dict(blocks, num_cores=nc), target)[0]
        grids[nc] = (tuple("programs" if not isinstance(d, int) else d
                           for d in eqn.params["grid_mapping"].grid),
                     tuple(eqn.params["compiler_params"].dimension_semantics))
    with tempfile.TemporaryDirectory(prefix="sidx-megacore-") as d:
      sched = schedule.launch_schedules(
          "dense", gen, "dense_fp8", shape,
          [dict(blocks, num_cores=nc) for nc in (1, 2)],
          launches=("decode",), dump_dir=d, timeout=timeout)
      for j, (nc, s) in enumerate(zip((1, 2), sched)):
        files = [f for f in glob.glob(os.path.join(d, f"*-sidx_b{j}_l*"))
                 if re.search(r"-\d+-final_bundles\.txt$", f)
                 and "schedule-analysis" not in f]
        text = "".join(open(f).read() for f in files)
        rows.append({
            "generation": gen, "num_cores": nc,
            "TensorCores/chip": specs[gen].tensorcores_per_chip,
            "cores the compiler targets": seen,
            "grid": grids[nc][0], "semantics": grids[nc][1],
            "compiled": "yes" if not s.error else s.error,
            "megacore barrier": "BarrierMegacore" in text,
            "bundles": s.total_bundles,
            "bundles/page": None if s.kv is None else round(s.kv.bundles_per_page, 1),
        })
  return rows


# ---------------------------------------------------------------------------
# The top-k stage.


def topk_rows(shapes: Sequence[topk_model.SelectShape] = topk_model.SHAPES,
              generations: Sequence[str] = ("v5e", "v6e", "v7x"),
              methods: Sequence[str] = topk_lib.TOPK_METHODS,
              specs: Mapping[str, hardware.TpuSpec] | None = None
              ) -> list[dict]:
  """Per shape and method (`lab.model.topk`): MB read and written, passes
  over the f32 scores, the sort work (G compare-exchanges) and the
  selection's HBM bound per generation (us, one JAX device); then, per
  shape, a row with the scoring kernel's roofline bound per generation
  (`topk_model.scoring_bound`). A method that is another at this shape
  (e.g. "blockmax" with no more blocks than k is one "top_k") says so.
  Every number is a model."""
  specs = hardware.load_specs() if specs is None else specs
  rows = []
  for shape in shapes:
    for m, c in zip(methods, topk_model.costs(shape, methods)):
      rows.append({"shape": shape.name,
                   "method": m if c.method == m else f"{m} (= {c.method})",
                   "MB read": c.bytes_read / 1e6,
                   "MB written": c.bytes_written / 1e6, "passes": c.passes,
                   "sort work G": c.sort_work / 1e9,
                   **{f"{gen} us": topk_model.hbm_bound(c, specs[gen]) * 1e6
                      for gen in generations}})
    rows.append({"shape": shape.name, "method": "(scoring kernel, roofline)",
                 **{f"{gen} us": topk_model.scoring_bound(shape, gen,
                                                          specs=specs) * 1e6
                    for gen in generations}})
  return rows


def topk_recommendations(shapes: Sequence[topk_model.SelectShape] = topk_model.SHAPES,
                         generations: Sequence[str] = ("v5e", "v6e", "v7x"),
                         specs=None) -> list[dict]:
  """Per shape and generation, `topk_model.recommend` without compiler
  estimates: the exact method first by the model's sort work and by its HBM
  bound, and whether the criteria agree."""
  rows = []
  for shape in shapes:
    for gen in generations:
      r = topk_model.recommend(shape, gen, specs=specs)
      rows.append({"shape": shape.name, "generation": gen,
                   "first by sort work": r["rankings"]["sort work"][0],
                   "first by HBM bound": r["rankings"]["HBM bound"][0],
                   "criteria agree": r["unambiguous"]})
  return rows


# ---------------------------------------------------------------------------
# The compiler's VMEM and static schedule (libtpu, no TPU).


def vmem_rows(generations: Sequence[str], *, fmt: str,
              decode_kv_pages: Sequence[int], prefill_q_blocks: Sequence[int],
              vmem_limit_bytes: int, page_size: int, compression_ratio: int,
              decode_req_batch_size: int, shape: str = "dsv4-decode-4k"
              ) -> tuple[list[dict], list[str]]:
  """`aot.vmem_grid` per generation beside the lab's estimate.

  Returns (rows, errors): per launch compiled, the scratch streamidx counts,
  the compiler's scratch and total (MiB), the lab model (scratch + f32
  logits tile) and its ratio to the compiler's total, the verdict at the
  default limit and at `vmem_limit_bytes`; errors: one line per launch the
  probe could not size.
  """
  from streamidx.lab import aot  # pylint: disable=g-import-not-at-top

  shp = next(s for s in aot.SHAPES if s.name == shape)
  g = tiling.geometry(batch_lib.make_mixed_batch(
      decode=[4096] * 4, page_size=page_size,
      compression_ratio=compression_ratio),
      fmt=fmt, num_heads=shp.num_heads, head_dim=shp.head_dim)
  lim = f"limit {vmem_limit_bytes / _MIB:g} MiB"
  rows, errors = [], []
  for gen in generations:
    for r in aot.vmem_grid(gen, fmt=fmt, decode_kv_pages=decode_kv_pages,
                           prefill_q_blocks=prefill_q_blocks,
                           limits=(None, vmem_limit_bytes)):
      if r["compiler_scratch"] is None:
        errors.append(f"{gen} {r['launch']} bq={r['bq']} bkv_p={r['bkv_p']}: "
                      f"{r['probe_error']}")
        continue
      b = decode_req_batch_size if r["launch"] == "decode" else 1
      model = tiling.vmem_budget(g, bq_sz=r["bq"], bkv_p=r["bkv_p"],
                                 seq_batch_size=b, case=r["launch"])["total"]
      total = r["compiler_total"]
      rows.append({
          "gen": gen, "launch": r["launch"], "bkv_p": r["bkv_p"], "bq": r["bq"],
          "scratch MiB (ours)": r["scratch"] / _MIB,
          "compiler scratch MiB": r["compiler_scratch"] / _MIB,
          "compiler total MiB": None if total is None else total / _MIB,
          "lab model MiB": model / _MIB,
          "model / compiler": None if total is None else model / total,
          "at default limit": r["limit default"],
          f"at {vmem_limit_bytes / _MIB:g} MiB": r[lim]})
  return rows, errors


def _span(values: Sequence[float], fmt: str) -> str:
  lo, hi = min(values), max(values)
  return format(lo, fmt) if format(lo, fmt) == format(hi, fmt) else \
      f"{format(lo, fmt)}-{format(hi, fmt)}"


def _launch_name(r: Mapping) -> str:
  return (f"{r['gen']} {r['launch']} " +
          (f"bkv_p={r['bkv_p']}" if r["launch"] == "decode" else f"bq={r['bq']}"))


def vmem_findings(rows: Sequence[dict], *, vmem_limit_bytes: int,
                  specs: Mapping[str, hardware.TpuSpec] | None = None) -> str:
  """What `vmem_rows` found, as Markdown bullets: every number from `rows`.

  - scratch: the compiler's scratch minus streamidx's count, per generation
    (KiB; the compiler prints sizes to 0.1 KiB below 1 MiB, 0.01 MiB
    above), over the launches that fit the chip's VMEM; a launch whose
    count exceeds the chip's VMEM (`specs`) is named apart: the compiler's
    out-of-memory report counts its register-allocator spill slots too;
  - internal scratch: "compiler total" minus "compiler scratch" (MiB),
    decode launches as one range per generation, prefill per bq;
  - the lab model over the compiler's total, range per launch kind;
  - the launches the compiler refuses at its default limit and at
    `vmem_limit_bytes`, with its one-line error.
  Empty rows (no compiler in this run) give "".
  """
  if not rows:
    return ""
  specs = hardware.load_specs() if specs is None else specs
  lim = f"at {vmem_limit_bytes / _MIB:g} MiB"
  gens = list(dict.fromkeys(r["gen"] for r in rows))
  beyond = [r for r in rows
            if r["compiler scratch MiB"] * _MIB > specs[r["gen"]].vmem_bytes_per_tensorcore]
  inside = [r for r in rows if r not in beyond]
  out, all_constant = [], True
  for g in gens:
    # The compiler prints sizes to 0.1 KiB below 1 MiB and to 0.01 MiB above.
    diffs = [((r["compiler scratch MiB"] - r["scratch MiB (ours)"]) * 1024,
              0.05 if r["compiler scratch MiB"] < 1 else 0.005 * 1024)
             for r in inside if r["gen"] == g]
    if not diffs:
      continue
    exact = sorted({round(d, 1) for d, err in diffs if err < 1})
    constant = len(exact) == 1 and all(abs(d - exact[0]) <= err + 0.05 for d, err in diffs)
    all_constant &= constant
    out.append(f"{exact[0]:g} KiB on {g} (each of its {len(diffs)} launches)" if constant
               else f"{_span([d for d, _ in diffs], '.1f')} KiB on {g} ({len(diffs)} launches)")
  lines = ["- **Scratch**: the compiler counts `semantics.scratch_vmem_bytes` plus "
           + "; ".join(out) + " (exact where it prints 0.1 KiB, within its 0.01 MiB rounding above "
           "1 MiB)" + (": an allocation of its own, the same for every block size." if all_constant
                       else ".")] if out else []
  out = lines
  for r in beyond:
    out.append(f"- **Beyond the chip**: {_launch_name(r)} needs {r['scratch MiB (ours)']:.2f} MiB "
               f"of scratch by streamidx's count, and the compiler reports "
               f"{r['compiler scratch MiB']:.2f} MiB used on a chip of "
               f"{specs[r['gen']].vmem_bytes_per_tensorcore / _MIB:g} MiB: its out-of-memory "
               "report counts the register allocator's spill slots too.")
  internal = []
  for g in gens:
    dec = [r["compiler total MiB"] - r["compiler scratch MiB"] for r in inside
           if r["gen"] == g and r["launch"] == "decode" and r["compiler total MiB"] is not None]
    pre = [f"bq={r['bq']} {r['compiler total MiB'] - r['compiler scratch MiB']:.2f} "
           f"({(r['compiler total MiB'] - r['compiler scratch MiB']) * 64 / r['bq']:.2f} per 64 "
           "query rows)" for r in inside
           if r["gen"] == g and r["launch"] == "prefill" and r["compiler total MiB"] is not None]
    parts = ([f"decode {_span(dec, '.2f')}"] if dec else []) + ([f"prefill {', '.join(pre)}"] if pre else [])
    if parts:
      internal.append(f"{g}: {'; '.join(parts)}")
  if internal:
    out.append("- **The compiler's internal scratch** (total minus scratch, MiB), which only it "
               "sizes: " + "; ".join(internal) + ".")
  ratio = {kind: [r["model / compiler"] for r in inside
                  if r["launch"] == kind and r["model / compiler"] is not None]
           for kind in ("decode", "prefill")}
  if any(ratio.values()):
    out.append("- **The lab's estimate** (scratch + f32 logits tile) over the compiler's total: "
               + "; ".join(f"{k} {_span(v, '.2f')}" for k, v in ratio.items() if v) + ".")
  for col, what in (("at default limit", "the compiler's default scoped limit"),
                    (lim, f"`vmem_limit_bytes` = {vmem_limit_bytes / _MIB:g} MiB")):
    refused = [f"{_launch_name(r)} ({r[col]})" for r in rows if r[col] != "ok"]
    out.append(f"- **Refused at {what}**: " + ("; ".join(refused) if refused else "none") + ".")
  return "\n".join(out)


def schedule_rows(variant: str, fmt: str, generations: Sequence[str],
                  kv_pages: Sequence[int], *, decode_req_batch_size: int,
                  shape: str = "dsv4-decode-4k", prefill_blocks=(2, 2),
                  query_blocks=(1, 128, 128)):
  """The decode launch's static schedule per generation and decode `bkv_p`.

  Returns (rows, bounds, errors): `schedule.schedule_table` rows with the
  page's HBM time, compute time (where the generation has a clock), the
  break-even clock and the verdict (`roofline.page_bounds`), the matching
  `PageBound`s, and one line per launch that did not schedule.
  """
  from streamidx.lab import schedule  # pylint: disable=g-import-not-at-top

  rows, bounds, errors = [], [], []
  for gen in generations:
    sets = [dict(num_kv_pages_per_block=(c, *prefill_blocks),
                 num_queries_per_block=tuple(query_blocks),
                 decode_req_batch_size=decode_req_batch_size) for c in kv_pages]
    for s in schedule.launch_schedules(variant, gen, fmt, shape, sets,
                                       launches=("decode",)):
      if s.kv is None:
        errors.append(f"{gen} {s.launch}: {s.error}")
        continue
      (row,), (b,) = schedule.schedule_table([s]), roofline.page_bounds([s])
      row.update({"variant": variant, "HBM ns/page": b.t_hbm * 1e9,
                  "compute ns/page": None if b.t_compute is None else b.t_compute * 1e9,
                  "break-even GHz": b.break_even_clock_hz / 1e9,
                  "verdict": b.verdict})
      rows.append(row)
      bounds.append(b)
  return rows, bounds, errors


def variant_page_bounds(generations: Sequence[str], bkv_p: int, *,
                        decode_req_batch_size: int,
                        variants: Mapping[str, str] = VARIANT_FORMATS,
                        known=((), ())) -> tuple[dict, list[str]]:
  """{(variant, generation): PageBound} of each variant's decode launch at
  decode `bkv_p`, and the errors of the launches that did not schedule.

  known: (rows, bounds) of a `schedule_rows` call already made (its
  variant's rows at this bkv_p are reused, not compiled again).
  """
  out, errors = {}, []
  for row, b in zip(*known):
    if row["bkv_p"] == bkv_p and row["generation"] in generations:
      out[(row["variant"], row["generation"])] = b
  for variant, fmt in variants.items():
    missing = [g for g in generations if (variant, g) not in out]
    if not missing:
      continue
    _, bounds, errs = schedule_rows(variant, fmt, missing, [bkv_p],
                                    decode_req_batch_size=decode_req_batch_size)
    out.update({(variant, b.generation): b for b in bounds})
    errors += errs
  return out, errors


# ---------------------------------------------------------------------------
# The notebook's answer.


def answer_markdown(*, host: str, waste: Mapping, batch_size: int,
                    random_table: Sequence[dict],
                    measured: Mapping[str, dict] | None,
                    launches: tuple[int, int], variant_table: Sequence[dict],
                    megacore: Sequence[dict], sched_rows: Sequence[dict],
                    topk_table: Sequence[dict], topk_shape: str,
                    production: Mapping[str, dict], run_check: Mapping | None,
                    vmem_limit_bytes: int, over: Sequence[str],
                    step: tuple[int, int, int], trials: int,
                    specs: Mapping[str, hardware.TpuSpec] | None = None) -> str:
  """Notebook 04's answer as Markdown, takeaways first, from the values its
  cells computed (each argument is the table or dict of the same name
  there; `step` = (sequences, tokens, k) of the DeepSeek-V4 step,
  `launches` = (without, with) M14 for the pure decode batch, modelled;
  `measured` = {variant: `recorded_costs`}, the dense run's from a pure
  decode batch; `measured` and `run_check` None where this JAX cannot
  record, `interpreter_internals_missing`)."""
  specs = hardware.load_specs() if specs is None else specs
  b0 = batch_size
  wg, ws, wo = (np.asarray(waste[b0, o]) for o in ("none", "kernel", "optimal"))
  saving = np.mean(1 - (1 - wg) / (1 - ws))
  vt = {(r["variant"], r["generation"]): r for r in variant_table}
  gens = list(dict.fromkeys(r["generation"] for r in variant_table))
  half = [g for g in gens if specs[g].tensorcores_per_device > 1]
  split = sorted({r["generation"] for r in megacore
                  if r["num_cores"] == 2 and r["megacore barrier"]})
  one = sorted({r["generation"] for r in megacore
                if r["num_cores"] == 2 and r["cores the compiler targets"] == 1})
  gain = ", ".join(f"{100 * (1 - r['HBM bound us (num_cores=2)'] / r['HBM bound us (1 core)']):.0f}% on "
                   f"{r['generation']}" for r in variant_table
                   if r["HBM bound us (num_cores=2)"])
  sel = {r["method"]: r for r in topk_table if r["shape"] == topk_shape}
  tg = [c[:-3] for c in topk_table[0] if c.endswith(" us")]
  pub = topk_model.PUBLIC_TPU7X
  sched = "; ".join(f"{r['generation']} bkv_p={r['bkv_p']}: {r['bundles_per_page']:.0f} bundles/page, "
                    f"{r['verdict']}" for r in sched_rows)
  pair = "; ".join(
      f"{g}: vendored {vt[('vendored', g)]['bundles/page']} vs dense {vt[('dense', g)]['bundles/page']}"
      for g in gens if vt[("vendored", g)]["bundles/page"] is not None
      and vt[("dense", g)]["bundles/page"] is not None) or "not run"
  def step_bound(r):
    hbm = r["HBM bound us (num_cores=2)"] or r["HBM bound us (1 core)"]
    return max(hbm, r["static bound us"])
  timed = "; ".join(
      f"{g} {step_bound(vt[('vendored', g)]):.0f} -> {step_bound(vt[('dense', g)]):.0f} us"
      for g in gens if vt[("vendored", g)]["static bound us"] is not None
      and vt[("dense", g)]["static bound us"] is not None)
  fits = [g for g, s_ in specs.items() if production["prefill"]["total"]
          <= min(s_.vmem_bytes_per_tensorcore, vmem_limit_bytes)]
  v, d = (measured or {}).get("vendored"), (measured or {}).get("dense")
  n, tokens, k = step
  bullets = [
      f"**Sort the decode range.** In arrival order the decode programs waste {100 * wg.mean():.1f}% of the KV "
      f"blocks they compute ({trials} log-normal mixes, B={b0}); in the kernel's length-sorted order "
      f"(`sort_decode=True`, M13) {100 * ws.mean():.1f}% (optimal {100 * wo.mean():.1f}%): **{100 * saving:.0f}% "
      f"fewer KV blocks computed and read**. On uniform random batches the sorted order never computes more "
      f"(worst ratio {max(r['worst_sorted_over_given'] for r in random_table):.2f})."
      + (f" *Measured* from the interpreter's DMAs: {v['blocks_fetched']} blocks fetched for "
         f"{v['blocks_needed']} needed." if v else ""),
      f"**One TensorCore leaves half of {' and '.join(half)} unused**: the vendored \"arbitrary\" grid runs on one "
      f"of the chip's two TensorCores. The dense kernel's `num_cores=2` (a parallel leading grid axis, programs "
      f"dealt to the cores in turn) cuts the modelled kernel HBM bound by {gain or '(not modelled)'}; "
      + (f"*compiled* for {', '.join(split)}, the program holds the megacore barrier (the compiler splits it over "
         f"both cores)" if split else "this run did not compile it (no libtpu), so the split is not shown here")
      + (f"; for {', '.join(one)} the compiler targets one core, so there it does not split." if one else "."),
      f"**The dense FP8 cache halves the bytes**: {vt[('dense', gens[0])]['B per entry']:.0f} B per entry as a TPU "
      f"stores it against {vt[('vendored', gens[0])]['B per entry']:.0f} B"
      + (f" (*measured* in the interpreter: {d['bytes_per_entry']:.0f} vs {v['bytes_per_entry']:.0f} B per entry "
         f"fetched)" if d else "") + ". Kernel HBM bound of the "
      f"DeepSeek-V4 step ({n} x {tokens // 1024}K tokens, k {k}), vendored -> dense: " + "; ".join(
          f"{g} {vt[('vendored', g)]['HBM bound us (1 core)']:.0f} -> {vt[('dense', g)]['HBM bound us (1 core)']:.0f} us"
          for g in gens) + ".",
      (f"**The compiler's static schedule** (*compiled*, vendored decode launch): {sched}. Bundles per KV page "
       f"at the production decode block, {pair}: where the loop is vector-bound, the dense layout's saving in "
       f"bytes pays only as far as its bundles per page allow"
       + (f"; the step's larger bound (HBM or static schedule), vendored -> dense: {timed}." if timed else ".")
       if sched_rows else "**The compiler's static schedule** was not computed in this run (no libtpu)."),
      f"**No empty launches** (M14): a pure decode batch makes {launches[1]} launch(es) instead of "
      f"{launches[0]}" + (f" (*measured*: {d['launches']} ran, {d['grid_points']} grid steps, "
                          f"{d['empty_launches']} empty)." if d else " (the recording was skipped here)."),
      f"**The top-k stage** ({topk_shape}): the model's HBM bound of the default `sort` is " + ", ".join(
          f"{sel['sort'][g + ' us']:.0f} us on {g}" for g in tg) + ", beside the scoring kernel's " + ", ".join(
          f"{sel['(scoring kernel, roofline)'][g + ' us']:.0f} us" for g in tg) + ". The model ranks `top_k` "
      f"first by bytes and `radix` by sort work, so it recommends none; public TPU7x measurements by others "
      f"(sglang-jax #1642) put that sort at {pub['decode_sort_ms']} ms beside {pub['decode_scoring_ms']} ms of "
      f"scoring: compute-bound, far above any HBM bound. The default stays `sort` until a TPU measures.",
      f"**VMEM**: the production decode launch needs {production['decode']['scratch'] / _MIB:.2f} MiB of scratch, "
      f"the prefill launch {production['prefill']['total'] / _MIB:.2f} MiB with the logits estimate, which fits "
      f"{', '.join(fits) or 'no generation'}; `vmem_limit_bytes` = {vmem_limit_bytes / _MIB:.0f} MiB exceeds the VMEM of {', '.join(over)}.",
  ]
  if run_check:
    bullets.append(
        f"**Double buffering** (*recorded* on {host}): {run_check['events']} DMA starts and waits equal the "
        f"model's; {run_check['overlapped']} of {run_check['computes']} compute steps ran with the next KV "
        f"block in flight.")
  return (f"**Answer** (computed in this run on {host}; models unless marked *measured*, *recorded* or "
          f"*compiled*):\n\n" + "\n".join(f"- {b}" for b in bullets))
