"""The benchmark's harness: columns, worker processes, timing, checks, `run`
(docs/benchmarks.md, "Worker processes").
"""

from __future__ import annotations

import dataclasses
import datetime
import functools
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Sequence

import jax
import numpy as np

import streamidx as si
from streamidx import cache as cache_lib
from streamidx import metrics, modes, streaming
from streamidx import ref as ref_lib
from streamidx import variants as variants_lib
from streamidx.lab import aot
from streamidx.lab import worker as lab_worker
from streamidx.lab.bench import memory, oracle, report
from streamidx.lab.shapes import Shape, table_blocks
from streamidx.lab.model import profiling

SCHEMA = "streamidx.bench/4"  # /4: no "long_context" setting
BASELINE_VARIANT = "vendored"
ORACLE_MAX_FLOPS = 2e10


def kernel_columns() -> dict[str, str]:
  """Column -> token-mode variant: "kernel" the baseline, "kernel:NAME"."""
  names = [n for n, v in variants_lib.VARIANTS.items() if v.mode == "token"]
  names.sort(key=lambda n: n != BASELINE_VARIANT)
  return {("kernel" if n == BASELINE_VARIANT else f"kernel:{n}"): n
          for n in names}


IMPLEMENTATIONS = (*kernel_columns(), "reference", "streaming", "oracle")


def variant_format(variant: str, fmt: str) -> str | None:
  """The cache format `variant` reads for a shape stored as `fmt`: `fmt`,
  else its first layout that decodes to `fmt`'s keys, else None."""
  formats = variants_lib.get(variant).cache_formats
  return fmt if fmt in formats else next(
      (f for f in formats if cache_lib.CACHE_FORMATS[f].decodes_as == fmt),
      None)


def compile_call(fn, args, kw):
  """fn(*args, **kw) jitted and compiled ahead of time (`kw` static):
  ({compile_s, xla}, a blocking call)."""
  t0 = time.perf_counter()
  compiled = jax.jit(functools.partial(fn, **kw)).lower(*args).compile()
  info = {"compile_s": time.perf_counter() - t0,
          "xla": aot.xla_memory(compiled)}
  return info, lambda: jax.block_until_ready(compiled(*args))


def measure(run_call, repeats: int):
  """One warm-up call (peak memory reset just before it), then `repeats` timed
  calls: (last output, {warmup_s, wall_s: median, min, max, runs; memory})."""
  mem = memory.PeakMemory()
  mem.start()
  t0 = time.perf_counter()
  out = run_call()
  warmup_s = time.perf_counter() - t0
  peak_first = mem.peak()
  times = []
  for _ in range(repeats):
    t0 = time.perf_counter()
    out = run_call()
    times.append(time.perf_counter() - t0)
  peak = mem.peak()
  wall = {"median": statistics.median(times), "min": min(times),
          "max": max(times), "runs": times}
  return out, {"warmup_s": warmup_s, "wall_s": wall, "memory": {
      "method": mem.method, "rss_before_bytes": mem.rss_before,
      "peak_rss_first_call_bytes": peak_first, "peak_rss_bytes": peak,
      "peak_over_inputs_bytes": mem.rss_before and peak - mem.rss_before}}


def oracle_agreement(shape: Shape, got, args, rows) -> dict:
  """`got[rows]` against the oracle's `rows` of the call on `args`, tie-aware
  within twice its `oracle.f32_score_bound`."""
  np_args = [np.asarray(a) for a in args]
  idx, scores = oracle.oracle_topk(*np_args, return_scores=True, rows=rows,
                                   **shape.kernel_kwargs())
  atol = 2 * oracle.f32_score_bound(*np_args[:3])
  c = metrics.compare_topk(np.asarray(got)[rows], idx[rows], scores[rows],
                           atol=atol)
  return {"rows_checked": len(rows), "atol": atol, "ok": c.ok,
          "rows_mismatched": c.rows_mismatched}


def worker(spec: dict) -> dict:
  """One implementation on one shape, in a worker process: `compile_call`,
  `measure`, indices to `spec["save"]`; untimed, the reference's scores and
  `oracle_agreement` (up to 32 rows, else the first and last 8)."""
  if spec.get("machine"):
    total = memory.proc_bytes("MemTotal", "/proc/meminfo")
    return dict(profiling.machine(), memory_total_gib=total and round(total / 2**30, 1))
  shape, impl = Shape(**spec["shape"]), spec["impl"]
  kw = shape.kernel_kwargs()
  t0 = time.perf_counter()
  inp = si.make_inputs(shape.batch(), num_heads=shape.num_heads,
                       head_dim=shape.head_dim, fmt=shape.fmt, seed=0)
  args = inp.args
  jax.block_until_ready(args)
  built = {"build_s": time.perf_counter() - t0,
           "inputs_bytes": int(sum(a.nbytes for a in args)),
           "peak_rss_while_building_inputs_bytes": memory.PeakMemory().peak()}
  if spec.get("variant"):
    v = variants_lib.get(spec["variant"])
    fn, label = v.kernel, f"{impl} ({si.kernel_mode()})"
    call_args = v.args(inp, spec["fmt"])
    gen = modes.current_generation()
    blocks = table_blocks(shape, v.name, spec["fmt"], gen)
    kw.update(blocks.kwargs())
  else:
    fn, label = {
        "reference": (si.streamindex_topk_ref, "reference (one chunk, jit)"),
        "streaming": (streaming.streamindex_topk_streaming,
                      "streaming reference (chunks, jit)"),
        "oracle": (None, "oracle (loop, float64)")}[impl]
    call_args = args
  if fn is None:
    np_args = [np.asarray(a) for a in args]
    compiled = {"compile_s": None, "xla": None}
    run_call = lambda: oracle.oracle_topk(*np_args, **kw)  # pylint: disable=unnecessary-lambda-assignment
  else:
    compiled, run_call = compile_call(fn, call_args, kw)
  out, res = measure(run_call, spec["repeats"])
  np.save(spec["save"], np.asarray(out))
  res["memory"].update(xla=compiled["xla"], **built)
  if spec.get("variant"):
    res["blocks"] = {"kwargs": blocks.kwargs(), "generation": gen,
                     "source": blocks.source}
  res.update(label=label, compile_s=compiled["compile_s"])
  if spec.get("save_scores"):
    scores = ref_lib.token_scores(*args,
                                  compression_ratio=shape.compression_ratio)
    np.save(spec["save_scores"], np.asarray(scores, np.float32))
  t = shape.num_tokens  # the oracle checks all of up to 32 rows, else 8 + 8
  rows = list(range(t)) if t <= 32 else [*range(8), *range(t - 8, t)]
  res["vs_oracle"] = oracle_agreement(shape, out, args, rows)
  return res


def run_worker(spec: dict, timeout: float = 3600.0) -> dict:
  """`spec` in a fresh worker process: its result with status "ok", or
  {"status": "error", "reason": ...}."""
  try:
    return dict(lab_worker.run("streamidx.bench", spec, timeout=timeout),
                status="ok")
  except RuntimeError as e:
    return {"status": "error", "reason": str(e)}


def vs_reference(got, ref) -> dict:
  """`got` against the reference's (indices, scores or None): identical, or
  tie-aware with exact ties (atol 0) where scores are given."""
  idx, scores = ref
  same = bool(np.array_equal(got, idx))
  c = None if scores is None else metrics.compare_topk(got, idx, scores,
                                                       atol=0.0)
  return {"identical": same, "ok_exact_ties": c.ok if c else same,
          "rows_mismatched": (c.rows_mismatched if c
                              else int((got != idx).any(axis=1).sum()))}


def run(shapes: Sequence[Shape], *, implementations=IMPLEMENTATIONS,
        repeats: int = 5, out_dir: str | Path = "build/bench",
        progress: bool = True, quick: bool = False) -> dict:
  """Every implementation on every shape, checked against the reference
  (run first) and the oracle; writes <out_dir>/bench.json."""
  if unknown := sorted(set(implementations) - set(IMPLEMENTATIONS)):
    raise ValueError(f"implementations: {', '.join(map(repr, unknown))} not "
                     f"in {IMPLEMENTATIONS}")
  if not isinstance(repeats, int) or repeats < 1:
    raise ValueError(f"repeats: must be a positive int (got {repeats!r})")
  impls = sorted(set(implementations),
                 key=lambda i: (i != "reference", IMPLEMENTATIONS.index(i)))
  out = Path(out_dir) / "bench.json"
  out.parent.mkdir(parents=True, exist_ok=True)
  mach = run_worker({"machine": True})
  if mach.pop("status") != "ok":
    raise RuntimeError(f"the machine probe failed: {mach['reason']}")
  doc = {"schema": SCHEMA, "created": datetime.datetime.now(
      datetime.timezone.utc).isoformat(timespec="seconds"),
         "command": " ".join([Path(sys.executable).name, "-m",
                              "streamidx.bench", *sys.argv[1:]]),
         "machine": mach,
         "settings": {"quick": quick, "oracle_max_flops": ORACLE_MAX_FLOPS,
                      "repeats": repeats, "warmup_calls": 1,
                      "implementations": impls},
         "shapes": [], "results": []}
  with tempfile.TemporaryDirectory(prefix="streamidx-bench-") as tmp:
    for n, shape in enumerate(shapes):
      doc["shapes"].append(dict(
          dataclasses.asdict(shape), num_tokens=shape.num_tokens,
          visible_pairs=shape.visible_pairs(), flops=shape.flops(),
          description=shape.describe()))
      ref = None  # the reference's (indices, scores or None)
      for impl in impls:
        if progress:
          print(f"{shape.name}: {impl} ...", file=sys.stderr, flush=True)
        variant = kernel_columns().get(impl)  # a kernel column's variant
        fmt = variant and variant_format(variant, shape.fmt)
        row = {"shape": shape.name, "impl": impl, "variant": variant,
               "cache_format": fmt}
        if variant and not fmt:
          row.update(status="skipped", reason=f"variant {variant!r} reads "
                     f"{variants_lib.get(variant).cache_formats}, no layout "
                     f"of {shape.fmt!r}")
        elif impl == "oracle" and shape.flops() > ORACLE_MAX_FLOPS:
          row.update(status="skipped", reason=f"{shape.flops() / 1e9:.1f} "
                     f"GFLOP, over the loop's {ORACLE_MAX_FLOPS / 1e9:.0f}")
        else:
          save = os.path.join(tmp, f"{n}_{impl}.npy")
          scores = os.path.join(tmp, f"{n}_scores.npy")
          row.update(run_worker(dict(
              variant=variant, fmt=fmt, shape=dataclasses.asdict(shape),
              impl=impl, repeats=repeats, save=save,
              save_scores=impl == "reference" and scores)))
        if row["status"] == "ok":
          row["entries_per_s"] = shape.visible_pairs() / row["wall_s"]["median"]
          row["agreement"] = {"vs_oracle": row.pop("vs_oracle")}
          if ref is not None:
            row["agreement"]["vs_reference"] = vs_reference(np.load(save), ref)
          if impl == "reference":
            ref = (np.load(save), np.load(scores))
        doc["results"].append(row)
  doc["ratios"] = report.ratios(doc)
  out.write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")
  return doc

