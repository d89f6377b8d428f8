"""The benchmark's harness: implementations, worker processes, timing, checks.

Every measurement runs in a fresh worker process (`python -m streamidx.bench
--worker SPEC`, SPEC a JSON object); the worker prints one line
`STREAMIDX_BENCH_RESULT <json>` and the parent (`run_worker`) reads it back.
Subprocesses keep one implementation's freed buffers from hiding another's
peak, and keep the parent free of any JAX backend: on a TPU only one process
may hold the chip, so even the machine description (`machine`) comes from a
worker.

`IMPLEMENTATIONS` are the report's columns (`streamidx.lab.bench`); a kernel
column runs its variant's cache format built from the shape's logical keys
(`variant_format`) with the block-size table's row (`kernel_blocks`).
`run_sweep` runs each on every shape, checks it (`agreement`) and writes
bench.json (and bench.png through `report`).
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Sequence

import numpy as np

from streamidx import cache as cache_lib
from streamidx import variants as variants_lib
from streamidx.lab.bench import memory, report
from streamidx.lab.bench.shapes import Shape

__all__ = [
    "SCHEMA", "IMPLEMENTATIONS", "KINDS", "BASELINE_VARIANT",
    "ORACLE_MAX_FLOPS", "kernel_columns", "column_variant", "variant_format",
    "kernel_blocks", "device_times", "worker", "compile_call", "measure",
    "run_worker", "machine",
    "agreement", "progress_bar", "run_sweep",
]

SCHEMA = "streamidx.bench/2"  # /2: one kernel column per token variant
KINDS = ("kernel", "reference", "streaming", "oracle")
BASELINE_VARIANT = "vendored"
ORACLE_MAX_FLOPS = 2e10
RESULT_PREFIX = "STREAMIDX_BENCH_RESULT "


def kernel_columns() -> dict[str, str]:
  """Column name -> variant name, one per token-mode variant, baseline first.

  The baseline's column is "kernel"; any other variant NAME's "kernel:NAME".
  """
  names = [n for n, v in variants_lib.VARIANTS.items() if v.mode == "token"]
  names.sort(key=lambda n: n != BASELINE_VARIANT)
  return {("kernel" if n == BASELINE_VARIANT else f"kernel:{n}"): n
          for n in names}


IMPLEMENTATIONS = (*kernel_columns(), "reference", "streaming", "oracle")


def column_variant(column: str) -> str | None:
  """The variant a kernel column runs (None for the other implementations)."""
  return kernel_columns().get(column)


def variant_format(variant: str, fmt: str) -> str | None:
  """The cache format `variant` reads for a shape stored as `fmt`.

  `fmt` itself when the variant reads it, else the variant's first format
  that decodes to `fmt`'s keys (`CacheLayout.decodes_as`: another layout of
  the same quantization, e.g. "dense_fp8" for "fp8") or is named `fmt_*`;
  None when it reads neither.
  """
  formats = variants_lib.get(variant).cache_formats
  if fmt in formats:
    return fmt
  # Another layout of the same quantization: it decodes to `fmt`'s keys,
  # or it is named `fmt_*`.
  def same_quantization(f):
    layout = cache_lib.CACHE_FORMATS.get(f)
    return (layout is not None and layout.decodes_as == fmt) or (
        f.startswith(fmt + "_"))

  return next((f for f in formats if same_quantization(f)), None)


def kernel_blocks(shape: Shape, variant: str, fmt: str,
                  generation: str | None) -> dict:
  """The block-size table's row for `variant` on `shape`: kwargs and source."""
  row = variants_lib.block_sizes(variant, cache_format=fmt,
                                 num_heads=shape.num_heads,
                                 page_size=shape.page_size,
                                 generation=generation)
  return {"kwargs": {k: list(v) if isinstance(v, tuple) else v
                     for k, v in row.kwargs().items()},
          "generation": generation, "source": row.source}


def _static(blocks: dict) -> dict:
  return {k: tuple(v) if isinstance(v, list) else v
          for k, v in blocks["kwargs"].items()}


# --------------------------------------------------------------------------
# Inside a worker: one implementation on one shape
# --------------------------------------------------------------------------


def _implementation(spec: dict, shape: Shape, inputs):
  """(jitted function or None, positional args, keyword args, label)."""
  import streamidx as si  # pylint: disable=g-import-not-at-top
  from streamidx import streaming  # pylint: disable=g-import-not-at-top
  impl = spec["impl"]
  kw = shape.kernel_kwargs()
  if spec.get("variant"):
    v = variants_lib.get(spec["variant"])
    return (v.kernel, v.args(inputs, spec["fmt"]),
            dict(kw, **_static(spec["blocks"])),
            f"{impl} ({si.kernel_mode()})")
  if impl == "reference":
    return (si.streamindex_topk_ref, inputs.args, kw,
            "reference (one chunk, jit)")
  if impl == "streaming":
    return (streaming.streamindex_topk_streaming, inputs.args, kw,
            "streaming reference (chunks, jit)")
  if impl == "oracle":
    return None, inputs.args, kw, "oracle (loop, float64)"
  raise ValueError(f"implementation must be one of {IMPLEMENTATIONS}, got "
                   f"{impl!r}")


def check_rows(num_tokens: int) -> list[int]:
  """Query rows the oracle checks: all of up to 32, else the first and last 8."""
  if num_tokens <= 32:
    return list(range(num_tokens))
  return list(range(8)) + list(range(num_tokens - 8, num_tokens))


def device_times(shape: Shape, impl: str, run, *,
                 variant: str = BASELINE_VARIANT) -> dict:
  """On a TPU: device seconds per call from a profiler trace, and the bound.

  `streamidx.lab.model.profiling` captures 3 traced calls and splits the
  device op time into the kernel's ops ("StreamIdx*"), the top-k and the
  rest; `streamidx.lab.model.roofline` bounds the vendored kernel's call
  (fill + kernel + top-k) on this generation from
  `streamidx.lab.model.tiling`'s plan of it, with the table's block sizes.
  The bound is a model of the vendored kernel: `fraction_of_roofline` is
  given for the baseline kernel column only; for the other implementations
  the device total is reported next to the bound for scale.
  """
  from streamidx.lab.model import hardware, profiling, roofline, tiling  # pylint: disable=g-import-not-at-top
  with tempfile.TemporaryDirectory() as d:
    cap = profiling.capture(run, log_dir=d, iterations=3, warmup=0)
    times = (profiling.stage_times(profiling.load_trace(cap.perfetto_path),
                                   iterations=3)
             if cap.perfetto_path else None)
  out = {"source": None if times is None else times["source"],
         "device_s": None if times is None else times["total_s"],
         "kernel_s": None if times is None else times["kernel_s"],
         "topk_s": None if times is None else times["topk_s"]}
  gen = hardware.detect_generation()
  if gen is not None:
    blocks = kernel_blocks(shape, BASELINE_VARIANT, shape.fmt, gen)
    p = tiling.plan(shape.batch(), fmt=shape.fmt, num_heads=shape.num_heads,
                    head_dim=shape.head_dim, **_static(blocks))
    pred = roofline.predict(p, k=shape.k, generations=[gen])[gen]
    out["generation"] = gen
    out["roofline_kernel_call_s"] = pred["total"]
    if impl == "kernel" and variant == BASELINE_VARIANT and out["device_s"]:
      out["fraction_of_roofline"] = pred["total"] / out["device_s"]
  return out


def machine() -> dict:
  """This process's machine: device, kernel mode, TPU generation, versions."""
  import jax  # pylint: disable=g-import-not-at-top
  from streamidx import modes  # pylint: disable=g-import-not-at-top
  from streamidx.lab.model import hardware  # pylint: disable=g-import-not-at-top
  dev = jax.devices()[0]
  total = memory.mem_total()
  return {
      "describe": modes.describe_machine(),
      "platform": dev.platform,
      "device_kind": getattr(dev, "device_kind", dev.platform),
      "kernel_mode": modes.kernel_mode(),
      "generation": hardware.detect_generation(dev),
      "cpu_count": os.cpu_count(),
      "memory_total_gib": None if total is None else round(total / 2**30, 1),
      "jax": jax.__version__,
      "numpy": np.__version__,
      "python": platform.python_version(),
      "host": platform.platform(),
  }


def worker(spec: dict) -> dict:
  """One implementation on one shape (the body of a worker process).

  Builds the shape's inputs (seed 0), compiles ahead of time, makes one
  warm-up call with the peak memory reset just before it, then
  `spec["repeats"]` timed calls. Saves the indices to `spec["save"]`;
  untimed, the reference's scores (`save_scores`) and the oracle's rows
  (`check`).
  """
  if spec.get("machine"):
    return machine()
  from streamidx import modes  # pylint: disable=g-import-not-at-top
  from streamidx import ref as ref_lib  # pylint: disable=g-import-not-at-top
  from streamidx.batch import make_inputs  # pylint: disable=g-import-not-at-top
  from streamidx.lab.bench import oracle  # pylint: disable=g-import-not-at-top

  shape = Shape(**spec["shape"])
  inp = make_inputs(shape.batch(), num_heads=shape.num_heads,
                    head_dim=shape.head_dim, fmt=shape.fmt, seed=0)
  fn, args, kw, label = _implementation(spec, shape, inp)
  np_args = [np.asarray(a) for a in inp.args]
  if fn is None:
    compiled = None
    def run():
      return oracle.oracle_topk(*np_args, **kw)
  else:
    compiled, run = compile_call(fn, args, kw)
  out, res = measure(run, spec["repeats"])
  np.save(spec["save"], np.asarray(out))
  res.update(label=label, compile_s=compiled and compiled["compile_s"])
  res["memory"]["xla"] = compiled and compiled["xla"]

  device = None
  if fn is not None and modes.on_tpu():
    device = device_times(shape, spec["impl"], run,
                          variant=spec.get("variant") or BASELINE_VARIANT)

  # Untimed: the reference's scores (the others are compared against them)
  # and, once per shape, the oracle on a few rows (an independent
  # check of every implementation, the reference included).
  if spec.get("save_scores"):
    scores = ref_lib.token_scores(*inp.args,
                                  compression_ratio=shape.compression_ratio)
    np.save(spec["save_scores"], np.asarray(scores, np.float32))
  bound = None
  check = spec.get("check")
  if check:
    idx, scores = oracle.oracle_topk(*np_args, return_scores=True,
                                     rows=check["rows"], **kw)
    np.save(check["idx"], idx)
    np.save(check["scores"], scores)
    bound = oracle.f32_score_bound(*np_args[:3])

  return dict(res, device=device, f32_score_bound=bound)


def compile_call(fn, args, kw):
  """`fn` compiled ahead of time: ({compile_s, xla}, a blocking call)."""
  import jax  # pylint: disable=g-import-not-at-top
  t0 = time.perf_counter()
  compiled = fn.lower(*args, **kw).compile()
  info = {"compile_s": time.perf_counter() - t0,
          "xla": memory.xla_memory(compiled)}
  return info, lambda: jax.block_until_ready(compiled(*args))


def measure(run, repeats: int):
  """One warm-up call of `run` (the peak is reset just before it), then
  `repeats` timed calls: (last output, {warmup_s, times_s, memory})."""
  mem = memory.PeakMemory()
  mem.start()
  t0 = time.perf_counter()
  out = run()  # warm-up; its peak is the call's memory
  warmup_s = time.perf_counter() - t0
  peak_first = mem.peak()
  times = []
  for _ in range(repeats):
    t0 = time.perf_counter()
    out = run()
    times.append(time.perf_counter() - t0)
  peak = mem.peak()
  return out, {"warmup_s": warmup_s, "times_s": times, "memory": {
      "method": mem.method, "rss_before_bytes": mem.rss_before,
      "peak_rss_first_call_bytes": peak_first, "peak_rss_bytes": peak,
      "peak_over_inputs_bytes": mem.over_start(peak)}}


# --------------------------------------------------------------------------
# In the parent: the worker protocol
# --------------------------------------------------------------------------


def run_worker(spec: dict, timeout: float) -> dict:
  """Runs `spec` in a fresh `python -m streamidx.bench --worker` process.

  Returns the worker's result with status "ok", or {"status": "error",
  "reason": ...} (timeout, or the exit code and the last lines it printed).
  """
  env = dict(os.environ)
  root = str(Path(__file__).resolve().parents[3])  # holds streamidx/
  env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"]
                              if env.get("PYTHONPATH") else "")
  cmd = [sys.executable, "-m", "streamidx.bench", "--worker", json.dumps(spec)]
  try:
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env,
                          timeout=timeout, check=False)
  except subprocess.TimeoutExpired:
    return {"status": "error", "reason": f"timed out after {timeout:.0f} s"}
  for line in reversed(proc.stdout.splitlines()):
    if line.startswith(RESULT_PREFIX):
      out = json.loads(line[len(RESULT_PREFIX):])
      out["status"] = "ok"
      return out
  tail = (proc.stderr or proc.stdout).strip().splitlines()[-6:]
  return {"status": "error",
          "reason": f"exit {proc.returncode}: " + " | ".join(tail)}


def worker_machine(timeout: float = 600.0) -> dict:
  """`machine()` as a worker process sees it (the parent touches no device)."""
  res = run_worker({"machine": True}, timeout)
  if res.pop("status") != "ok":
    raise RuntimeError(f"the machine probe failed: {res['reason']}")
  return res


class _NoBar:
  def set_description(self, *_):
    pass

  update = close = set_description


def progress_bar(total: int, enabled: bool):
  """A tqdm bar on stderr, or one that shows nothing (disabled, or no tqdm)."""
  if enabled:
    try:
      from tqdm.auto import tqdm  # pylint: disable=g-import-not-at-top
      return tqdm(total=total, unit="run", file=sys.stderr, dynamic_ncols=True)
    except ImportError:
      print("(tqdm not installed: no progress bar)", file=sys.stderr)
  return _NoBar()


def command_line() -> str:
  return " ".join([Path(sys.executable).name, "-m", "streamidx.bench"]
                  + sys.argv[1:])


def now() -> str:
  return datetime.datetime.now(datetime.timezone.utc).isoformat(
      timespec="seconds")


def agreement(got, ref, check) -> dict:
  """How `got` compares with the reference's result and the oracle's rows.

  ref: (indices, scores) of the reference, or None. check: (rows, oracle
  indices, oracle scores, bound), or None.
  vs_reference: identical indices, and tie-aware with exact ties (atol 0)
  against the reference's scores. vs_oracle: tie-aware on the checked rows
  with atol = 2 x the float32 bound (`oracle.f32_score_bound`),
  independent of the reference.
  """
  from streamidx import metrics  # pylint: disable=g-import-not-at-top
  out = {}
  if ref is not None:
    c = metrics.compare_topk(got, ref[0], ref[1], atol=0.0)
    out["vs_reference"] = {"identical": bool(np.array_equal(got, ref[0])),
                           "ok_exact_ties": c.ok,
                           "rows_mismatched": c.rows_mismatched}
  if check is not None:
    rows, idx, scores, bound = check
    c = metrics.compare_topk(got[rows], idx[rows], scores[rows],
                             atol=2 * bound)
    out["vs_oracle"] = {"rows_checked": len(rows), "atol": 2 * bound,
                        "ok": c.ok, "rows_mismatched": c.rows_mismatched,
                        "detail": c.detail}
  return out


def _summary(times):
  return {"median": statistics.median(times), "min": min(times),
          "max": max(times), "runs": times}


def _columns(implementations) -> list[str]:
  for impl in implementations:
    if impl not in IMPLEMENTATIONS:
      raise ValueError(f"implementations: {impl!r} is not one of "
                       f"{IMPLEMENTATIONS}")
  impls = sorted(set(implementations), key=IMPLEMENTATIONS.index)
  # The reference runs first: the others are checked against it.
  impls.sort(key=lambda i: i != "reference")
  return impls


def _kernel_spec(shape: Shape, column: str, generation) -> dict:
  """The variant, cache format and blocks of a kernel column on `shape`."""
  variant = column_variant(column)
  fmt = variant_format(variant, shape.fmt)
  if fmt is None:
    return {"variant": variant, "skip": (
        f"variant {variant!r} reads {variants_lib.get(variant).cache_formats}"
        f", no layout of {shape.fmt!r}")}
  return {"variant": variant, "fmt": fmt,
          "blocks": kernel_blocks(shape, variant, fmt, generation)}


def run_sweep(shapes: Sequence[Shape], *, implementations=IMPLEMENTATIONS,
              repeats: int = 5, out_dir: str | Path = "build/bench",
              timeout: float = 1800.0, progress: bool = True,
              plot: bool = True, quick: bool = False) -> dict:
  """Runs every implementation on every shape; writes bench.json (+ png).

  Returns the JSON document (see `streamidx.lab.bench` for its fields).
  """
  impls = _columns(implementations)
  if not isinstance(repeats, int) or repeats < 1:
    raise ValueError(f"repeats: must be a positive int (got {repeats!r})")
  out_dir = Path(out_dir)
  out_dir.mkdir(parents=True, exist_ok=True)
  mach = worker_machine(timeout)
  generation = mach["generation"]
  doc = {
      "schema": SCHEMA,
      "created": now(),
      "command": command_line(),
      "machine": mach,
      "settings": {
          "quick": quick, "repeats": repeats, "warmup_calls": 1,
          "implementations": impls, "oracle_max_flops": ORACLE_MAX_FLOPS,
          "kernel_variants": {c: v for c, v in kernel_columns().items()
                              if c in impls},
          "kernel_blocks": ("per result: streamidx.block_sizes(variant, "
                            "cache_format, num_heads, page_size, generation="
                            f"{generation!r})"),
          "timer": "time.perf_counter around call + block_until_ready",
          "memory": "per-implementation subprocess; VmHWM reset before the "
                    "warm-up call, minus VmRSS then",
      },
      "shapes": [],
      "results": [],
  }
  bar = progress_bar(len(shapes) * len(impls), progress)
  with tempfile.TemporaryDirectory(prefix="streamidx-bench-") as tmp:
    for si_, shape in enumerate(shapes):
      doc["shapes"].append(dict(dataclasses.asdict(shape),
                                entries_per_seq=shape.entries_per_seq,
                                num_tokens=shape.num_tokens,
                                visible_pairs=shape.visible_pairs(),
                                flops=shape.flops(),
                                description=shape.describe()))
      ref = None
      rows = check_rows(shape.num_tokens)
      check_paths = {"rows": rows,
                     "idx": os.path.join(tmp, f"{si_}_oracle_rows.npy"),
                     "scores": os.path.join(tmp, f"{si_}_oracle_scores.npy")}
      check = None
      shape_rows = []
      for ci, impl in enumerate(impls):
        bar.set_description(f"{shape.name}: {impl}")
        row = {"shape": shape.name, "impl": impl,
               "variant": column_variant(impl)}
        kernel = _kernel_spec(shape, impl, generation) if row["variant"] else {}
        if kernel.get("fmt"):
          row.update(cache_format=kernel["fmt"], blocks=kernel["blocks"])
        if "skip" in kernel:
          row.update(status="skipped", reason=kernel["skip"])
        elif impl == "oracle" and shape.flops() > ORACLE_MAX_FLOPS:
          row.update(status="skipped", reason=(
              f"{shape.flops() / 1e9:.1f} GFLOP is above the oracle loop's "
              f"limit ({ORACLE_MAX_FLOPS / 1e9:.0f} GFLOP)"))
        else:
          save = os.path.join(tmp, f"{si_}_{ci}.npy")
          spec = {"shape": dataclasses.asdict(shape), "impl": impl,
                  "repeats": repeats, "save": save,
                  "save_scores": (os.path.join(tmp, f"{si_}_ref_scores.npy")
                                  if impl == "reference" else None),
                  "check": check_paths if check is None else None, **kernel}
          row.update(run_worker(spec, timeout))
          if row["status"] == "ok":
            row["wall_s"] = _summary(row.pop("times_s"))
            row["entries_per_s"] = shape.visible_pairs() / row["wall_s"]["median"]
            row["output"] = save
            if check is None:
              check = (rows, np.load(check_paths["idx"]),
                       np.load(check_paths["scores"]), row["f32_score_bound"])
            if impl == "reference":
              ref = (np.load(save), np.load(spec["save_scores"]))
        shape_rows.append(row)
        bar.update()
      for row in shape_rows:
        if row["status"] == "ok":
          got = np.load(row.pop("output"))
          row["agreement"] = agreement(
              got, ref if row["impl"] != "reference" else None, check)
        row.pop("f32_score_bound", None)
      if check is not None:
        doc["shapes"][-1]["f32_score_bound"] = check[3]
        doc["shapes"][-1]["oracle_rows_checked"] = len(check[0])
      doc["results"].extend(shape_rows)
  bar.close()
  doc["ratios"] = report.ratios(doc)
  path = out_dir / "bench.json"
  path.write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")
  if plot:
    report.plot(doc, out_dir / "bench.png")
  return doc
