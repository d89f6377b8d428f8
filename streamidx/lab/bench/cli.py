"""Benchmark: the kernel, the jitted reference, the streaming reference and a
NumPy oracle, measured side by side at DeepSeek-V4 sizes.

    python -m streamidx.bench                  # the sweep (make bench)
    python -m streamidx.bench --quick          # small shapes, for CI
    python -m streamidx.bench --shapes decode:8x16384:512 prefill:128x16384:512
    python -m streamidx.bench --long-context   # streaming reference at 1M tokens
    python -m streamidx.bench --list           # the named shapes

For each shape, every implementation runs in a fresh subprocess:

- kernel: `streamidx.streamindex_topk`, compiled on a TPU, Pallas's TPU
  interpreter elsewhere (its CPU times measure the interpreter, not a TPU);
- reference: `streamidx.streamindex_topk_ref` (one-shot, jitted);
- streaming: `streamidx.streaming.streamindex_topk_streaming` (jitted);
- oracle: `streamidx.lab.bench.oracle.oracle_topk`, a NumPy loop, only where
  its work (2 x visible pairs x heads x head_dim FLOPs) is under
  `ORACLE_MAX_FLOPS`.

What is measured, per implementation:

- wall time: compile first (ahead of time, `jit(...).lower().compile()`,
  reported as compile_s), one warm-up call, then `repeats` calls each timed
  with `time.perf_counter` around the call and `block_until_ready`; the
  median is reported with the min and max as the spread.
- entries/s: visible (query row, entry) pairs scored, divided by the median.
  The same count for every implementation (`ref.visible_counts`).
- peak memory: the process's resident set, from Linux's /proc/self/status.
  Just before the warm-up call the peak (VmHWM) is reset (`echo 5 >
  /proc/self/clear_refs`) and VmRSS is read: `peak_over_inputs` is VmHWM
  after the calls minus that VmRSS, the memory the call adds on top of its
  inputs and compiled program. Subprocesses keep one implementation's
  freed buffers from hiding another's. tracemalloc would see none of it:
  XLA allocates its buffers in C++, outside Python's allocator. XLA's own
  buffer assignment (`compiled.memory_analysis()`: temp bytes) is reported
  next to it, a compile-time figure. Off Linux, the peak is ru_maxrss since
  the process started (the method is recorded).
- on a TPU: device time per call from a `jax.profiler` trace
  (`streamidx.lab.model.profiling`: the kernel's "StreamIdx*" ops, the top-k, the
  rest), against the roofline bound of the kernel call on that generation
  (`streamidx.lab.model.roofline` over `streamidx.lab.model.tiling`'s plan, rates from
  `streamidx.lab.model.hardware`). Never run on CPU; not yet run on a TPU either.

Every result is checked twice, untimed:

- against the NumPy oracle (`bench_oracle.oracle_topk`, float32, its own
  FP8 decoding through ml_dtypes) on every row of small batches and the
  first and last 8 rows of larger ones: tie-aware (`metrics.compare_topk`)
  with atol = 2 x `bench_oracle.f32_score_bound`, a derived bound on
  float32 rounding, so it holds whatever order either side sums in. This
  check is independent of the reference and covers it too; the command
  exits with status 1 when any implementation fails it.
- against the reference's indices: identical arrays, or tie-aware with
  exact ties (atol 0) against the reference's scores.

Timings are never asserted anywhere; the README quotes ratios between
implementations measured in one run.

Results: a table on the terminal, `<out>/bench.json`, `<out>/bench.png`.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import math
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Sequence

import numpy as np

__all__ = [
    "Shape",
    "SWEEP",
    "QUICK",
    "LONG_CONTEXT",
    "IMPLEMENTATIONS",
    "ORACLE_MAX_FLOPS",
    "KERNEL_BLOCKS",
    "parse_shape",
    "run_sweep",
    "run_long_context",
    "random_cache",
    "long_context_args",
    "main",
]

SCHEMA = "streamidx.bench/1"
LONG_SCHEMA = "streamidx.bench.long_context/1"
IMPLEMENTATIONS = ("kernel", "reference", "streaming", "oracle")
ORACLE_MAX_FLOPS = 2e10
# Production block sizes (issue 5): (decode, prefill, mixed).
KERNEL_BLOCKS = dict(num_kv_pages_per_block=(3, 2, 2),
                     num_queries_per_block=(1, 128, 128))
_RESULT_PREFIX = "STREAMIDX_BENCH_RESULT "


# --------------------------------------------------------------------------
# Shapes
# --------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Shape:
  """One benchmark batch: `num_seqs` decode rows, or one prefill chunk.

  decode: `num_seqs` sequences of `seq_len` tokens, one query each.
  prefill: one sequence of `seq_len` tokens whose last `q_len` tokens are
  the query chunk (the kernel's chunked-prefill range).
  Defaults are DeepSeek-V4's indexer: 64 heads, head_dim 128, ratio 4,
  packed FP8 cache; page_size 128 entries.
  """

  name: str
  kind: str
  num_seqs: int
  q_len: int
  seq_len: int
  k: int
  num_heads: int = 64
  head_dim: int = 128
  compression_ratio: int = 4
  page_size: int = 128
  fmt: str = "fp8"

  def __post_init__(self):
    if self.kind not in ("decode", "prefill"):
      raise ValueError(
          f"kind: must be 'decode' or 'prefill' (got {self.kind!r})")
    if self.kind == "decode" and self.q_len != 1:
      raise ValueError("a decode shape has q_len 1")
    if self.kind == "prefill" and self.num_seqs != 1:
      raise ValueError("a prefill shape has one sequence")
    if not 1 <= self.q_len <= self.seq_len:
      raise ValueError(f"{self.name}: need 1 <= q_len <= seq_len")

  @property
  def entries_per_seq(self) -> int:
    return self.seq_len // self.compression_ratio

  @property
  def num_tokens(self) -> int:
    return self.num_seqs * self.q_len

  def batch(self):
    from streamidx import batch as batch_lib  # pylint: disable=g-import-not-at-top
    if self.kind == "decode":
      return batch_lib.make_mixed_batch(
          decode=[self.seq_len] * self.num_seqs, page_size=self.page_size,
          compression_ratio=self.compression_ratio)
    return batch_lib.make_mixed_batch(
        prefill=[(self.q_len, self.seq_len)], page_size=self.page_size,
        compression_ratio=self.compression_ratio)

  def visible_pairs(self) -> int:
    """(query row, entry) pairs visible under the model rule."""
    ratio = self.compression_ratio
    if self.kind == "decode":
      return self.num_seqs * self.entries_per_seq
    pos = self.seq_len - self.q_len + np.arange(self.q_len)
    return int(np.minimum((pos + 1) // ratio, self.entries_per_seq).sum())

  def flops(self) -> int:
    """q.k dot products of the visible pairs (2 per multiply-add)."""
    return 2 * self.visible_pairs() * self.num_heads * self.head_dim

  def kernel_kwargs(self) -> dict:
    return dict(k=self.k, compression_ratio=self.compression_ratio)

  def describe(self) -> str:
    if self.kind == "decode":
      return (f"decode {self.num_seqs} seqs x {_tokens(self.seq_len)} tokens "
              f"({self.entries_per_seq} entries), k {self.k}")
    return (f"prefill {self.q_len} queries at {_tokens(self.seq_len)} tokens "
            f"({self.entries_per_seq} entries), k {self.k}")


def _tokens(n: int) -> str:
  for unit, size in (("M", 2**20), ("K", 2**10)):
    if n % size == 0:
      return f"{n // size}{unit}"
  return str(n)


def parse_shape(text: str) -> Shape:
  """'decode:SEQSxSEQ_LEN:K' or 'prefill:QxSEQ_LEN:K' (or a named shape)."""
  named = {s.name: s for s in SWEEP + QUICK}
  if text in named:
    return named[text]
  try:
    kind, dims, k = text.split(":")
    a, seq_len = (int(x) for x in dims.lower().split("x"))
    k = int(k)
  except ValueError:
    raise ValueError(
        f"--shapes: {text!r} is neither a named shape ({sorted(named)}) nor "
        "'decode:SEQSxSEQ_LEN:K' / 'prefill:QxSEQ_LEN:K'") from None
  if kind == "decode":
    return Shape(text, "decode", a, 1, seq_len, k)
  if kind == "prefill":
    return Shape(text, "prefill", 1, a, seq_len, k)
  raise ValueError(f"--shapes: kind must be decode or prefill, got {kind!r}")


SWEEP = [
    Shape("decode_8x16K_k512", "decode", 8, 1, 16384, 512),
    Shape("decode_32x16K_k512", "decode", 32, 1, 16384, 512),
    Shape("decode_8x64K_k2048", "decode", 8, 1, 65536, 2048),
    Shape("prefill_128q_16K_k512", "prefill", 1, 128, 16384, 512),
    Shape("prefill_512q_32K_k2048", "prefill", 1, 512, 32768, 2048),
]
QUICK = [
    Shape("decode_4x4K_k512", "decode", 4, 1, 4096, 512),
    Shape("prefill_32q_2K_k256", "prefill", 1, 32, 2048, 256),
]
# The long-context demonstration: streaming reference only (and the one-shot
# where it fits), at DeepSeek-V4's 1M-token context.
LONG_CONTEXT = [
    Shape("decode_64x1M", "decode", 64, 1, 2**20, 512),
    Shape("prefill_1024q_128K", "prefill", 1, 1024, 2**17, 512),
]
LONG_CONTEXT_KS = (512, 2048)


# --------------------------------------------------------------------------
# Memory and time measurement (inside a worker process)
# --------------------------------------------------------------------------


def _proc_status_bytes(field: str) -> int | None:
  try:
    with open("/proc/self/status", encoding="ascii") as f:
      for line in f:
        if line.startswith(field + ":"):
          return int(line.split()[1]) * 1024
  except OSError:
    return None
  return None


class _PeakMemory:
  """Peak resident memory over a region of code, as the OS counts it.

  Before `start()`: the peak since the process started.
  """

  def __init__(self):
    self.method = "VmHWM since process start (/proc/self/status)"
    self.rss_before = None

  def start(self):
    self.rss_before = _proc_status_bytes("VmRSS")
    try:
      with open("/proc/self/clear_refs", "w", encoding="ascii") as f:
        f.write("5")  # resets VmHWM to the current RSS (Linux >= 4.0)
      self.method = "VmHWM after reset (/proc/self/clear_refs)"
    except OSError:
      self.method = "ru_maxrss since process start"

  def peak(self) -> int:
    hwm = _proc_status_bytes("VmHWM")
    if hwm is not None and self.method.startswith("VmHWM"):
      return hwm
    r = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return r if sys.platform == "darwin" else r * 1024


def _mib(x):
  return None if x is None else round(x / 2**20, 1)


def _xla_memory(compiled) -> dict | None:
  try:
    m = compiled.memory_analysis()
  except Exception:  # pylint: disable=broad-except
    return None
  if m is None:
    return None
  return {"argument_bytes": int(m.argument_size_in_bytes),
          "output_bytes": int(m.output_size_in_bytes),
          "temp_bytes": int(m.temp_size_in_bytes),
          "alias_bytes": int(m.alias_size_in_bytes)}


def _device_times(shape: Shape, impl: str, run) -> dict:
  """On a TPU: device seconds per call from a profiler trace, and the bound.

  `streamidx.lab.model.profiling` captures 3 traced calls and splits the device op
  time into the kernel's ops ("StreamIdx*"), the top-k and the rest;
  `streamidx.lab.model.roofline` bounds the kernel call (fill + kernel + top-k) on
  this generation from `streamidx.lab.model.tiling`'s plan of it. The bound is only
  meaningful for the kernel; for the jitted references the device total
  is reported next to the kernel's bound for scale.
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
    p = tiling.plan(shape.batch(), fmt=shape.fmt, num_heads=shape.num_heads,
                    head_dim=shape.head_dim, **KERNEL_BLOCKS)
    pred = roofline.predict(p, k=shape.k, generations=[gen])[gen]
    out["generation"] = gen
    out["roofline_kernel_call_s"] = pred["total"]
    if impl == "kernel" and out["device_s"]:
      out["fraction_of_roofline"] = pred["total"] / out["device_s"]
  return out


# --------------------------------------------------------------------------
# Worker: one implementation on one shape, in its own process
# --------------------------------------------------------------------------


def _implementation(impl: str, shape: Shape):
  """(jitted function or None, its keyword arguments, label)."""
  import streamidx as si  # pylint: disable=g-import-not-at-top
  from streamidx import streaming  # pylint: disable=g-import-not-at-top
  kw = shape.kernel_kwargs()
  if impl == "kernel":
    return (si.streamindex_topk, dict(kw, **KERNEL_BLOCKS),
            f"kernel ({si.kernel_mode()})")
  if impl == "reference":
    return si.streamindex_topk_ref, kw, "reference (one-shot, jit)"
  if impl == "streaming":
    return (streaming.streamindex_topk_streaming, kw,
            "streaming reference (jit)")
  if impl == "oracle":
    return None, kw, "NumPy oracle"
  raise ValueError(f"implementation must be one of {IMPLEMENTATIONS}, got "
                   f"{impl!r}")


def _check_rows(num_tokens: int) -> list[int]:
  """Query rows the oracle checks: all of up to 32, else the first and last 8."""
  if num_tokens <= 32:
    return list(range(num_tokens))
  return list(range(8)) + list(range(num_tokens - 8, num_tokens))


def _worker(spec: dict) -> dict:
  import jax  # pylint: disable=g-import-not-at-top
  from streamidx.lab.bench import oracle as bench_oracle  # pylint: disable=g-import-not-at-top
  from streamidx import modes  # pylint: disable=g-import-not-at-top
  from streamidx import ref as ref_lib  # pylint: disable=g-import-not-at-top
  from streamidx.batch import make_inputs  # pylint: disable=g-import-not-at-top

  shape = Shape(**spec["shape"])
  impl = spec["impl"]
  fn, kw, label = _implementation(impl, shape)
  inp = make_inputs(shape.batch(), num_heads=shape.num_heads,
                    head_dim=shape.head_dim, fmt=shape.fmt, seed=0)
  args = inp.args
  np_args = [np.asarray(a) for a in args]
  xla = None
  compile_s = None
  if fn is None:
    def run():
      return bench_oracle.oracle_topk(*np_args, **kw)
  else:
    t0 = time.perf_counter()
    compiled = fn.lower(*args, **kw).compile()
    compile_s = time.perf_counter() - t0
    xla = _xla_memory(compiled)

    def run():
      return jax.block_until_ready(compiled(*args))

  mem = _PeakMemory()
  mem.start()
  t0 = time.perf_counter()
  out = run()  # warm-up; its peak is the call's memory
  warmup_s = time.perf_counter() - t0
  peak_first = mem.peak()
  times = []
  for _ in range(spec["repeats"]):
    t0 = time.perf_counter()
    out = run()
    times.append(time.perf_counter() - t0)
  peak_all = mem.peak()
  np.save(spec["save"], np.asarray(out))

  device = None
  if fn is not None and modes.on_tpu():
    device = _device_times(shape, impl, run)

  # Untimed: the reference's scores (the others are compared against them)
  # and, once per shape, the NumPy oracle on a few rows (an independent
  # check of every implementation, the reference included).
  if spec.get("save_scores"):
    scores = ref_lib.token_scores(*args,
                                  compression_ratio=shape.compression_ratio)
    np.save(spec["save_scores"], np.asarray(scores, np.float32))
  bound = None
  check = spec.get("check")
  if check:
    idx, scores = bench_oracle.oracle_topk(*np_args, return_scores=True,
                                           rows=check["rows"], **kw)
    np.save(check["idx"], idx)
    np.save(check["scores"], scores)
    bound = bench_oracle.f32_score_bound(*np_args[:3])

  return {
      "label": label,
      "compile_s": compile_s,
      "warmup_s": warmup_s,
      "times_s": times,
      "memory": {
          "method": mem.method,
          "rss_before_bytes": mem.rss_before,
          "peak_rss_first_call_bytes": peak_first,
          "peak_rss_bytes": peak_all,
          "peak_over_inputs_bytes": (None if mem.rss_before is None
                                     else peak_all - mem.rss_before),
          "xla": xla,
      },
      "device": device,
      "f32_score_bound": bound,
  }


def _run_worker(spec: dict, timeout: float) -> dict:
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
    if line.startswith(_RESULT_PREFIX):
      out = json.loads(line[len(_RESULT_PREFIX):])
      out["status"] = "ok"
      return out
  tail = (proc.stderr or proc.stdout).strip().splitlines()[-6:]
  return {"status": "error",
          "reason": f"exit {proc.returncode}: " + " | ".join(tail)}


# --------------------------------------------------------------------------
# The sweep
# --------------------------------------------------------------------------


def _progress(total: int, enabled: bool):
  if not enabled:
    return None
  try:
    from tqdm.auto import tqdm  # pylint: disable=g-import-not-at-top
  except ImportError:
    print("(tqdm not installed: no progress bar)", file=sys.stderr)
    return None
  return tqdm(total=total, unit="run", file=sys.stderr, dynamic_ncols=True)


def _agreement(got, ref, check) -> dict:
  """How `got` compares with the reference's result and the oracle's rows.

  ref: (indices, scores) of the reference, or None. check: (rows, oracle
  indices, oracle scores, bound), or None.
  vs_reference: identical indices, and tie-aware with exact ties (atol 0)
  against the reference's scores. vs_oracle: tie-aware on the checked rows
  with atol = 2 x the float32 bound (`bench_oracle.f32_score_bound`),
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


def _verdict(a) -> str:
  if not a:
    return "-"
  parts = []
  r = a.get("vs_reference")
  if r is not None:
    parts.append("ref: " + ("identical" if r["identical"] else
                            "exact ties" if r["ok_exact_ties"] else
                            f"differs ({r['rows_mismatched']} rows)"))
  o = a.get("vs_oracle")
  if o is not None:
    parts.append(f"oracle ({o['rows_checked']} rows): " +
                 ("ok" if o["ok"] else f"WRONG ({o['rows_mismatched']} rows)"))
  return "; ".join(parts)


def _machine() -> dict:
  import jax  # pylint: disable=g-import-not-at-top
  from streamidx import modes  # pylint: disable=g-import-not-at-top
  dev = jax.devices()[0]
  mem_total = None
  try:
    with open("/proc/meminfo", encoding="ascii") as f:
      for line in f:
        if line.startswith("MemTotal:"):
          mem_total = int(line.split()[1]) * 1024
  except OSError:
    pass
  return {
      "describe": modes.describe_machine(),
      "platform": dev.platform,
      "device_kind": getattr(dev, "device_kind", dev.platform),
      "kernel_mode": modes.kernel_mode(),
      "cpu_count": os.cpu_count(),
      "memory_total_gib": None if mem_total is None else round(mem_total / 2**30, 1),
      "jax": jax.__version__,
      "numpy": np.__version__,
      "python": platform.python_version(),
      "host": platform.platform(),
  }


def _summary(times):
  return {"median": statistics.median(times), "min": min(times),
          "max": max(times), "runs": times}


def run_sweep(shapes: Sequence[Shape], *, implementations=IMPLEMENTATIONS,
              repeats: int = 5, out_dir: str | Path = "build/bench",
              timeout: float = 1800.0, progress: bool = True,
              plot: bool = True, quick: bool = False) -> dict:
  """Runs every implementation on every shape; writes bench.json (+ png).

  Returns the JSON document (see the module docstring for its fields).
  """
  for impl in implementations:
    if impl not in IMPLEMENTATIONS:
      raise ValueError(f"implementations: {impl!r} is not one of "
                       f"{IMPLEMENTATIONS}")
  if not isinstance(repeats, int) or repeats < 1:
    raise ValueError(f"repeats: must be a positive int (got {repeats!r})")
  impls = sorted(set(implementations), key=IMPLEMENTATIONS.index)
  # The reference runs first: the others are checked against it.
  impls.sort(key=lambda i: i != "reference")
  out_dir = Path(out_dir)
  out_dir.mkdir(parents=True, exist_ok=True)
  doc = {
      "schema": SCHEMA,
      "created": datetime.datetime.now(datetime.timezone.utc).isoformat(
          timespec="seconds"),
      "command": " ".join([Path(sys.executable).name, "-m", "streamidx.bench"]
                          + sys.argv[1:]),
      "machine": _machine(),
      "settings": {
          "quick": quick, "repeats": repeats, "warmup_calls": 1,
          "implementations": impls, "oracle_max_flops": ORACLE_MAX_FLOPS,
          "kernel_blocks": {k: list(v) for k, v in KERNEL_BLOCKS.items()},
          "timer": "time.perf_counter around call + block_until_ready",
          "memory": "per-implementation subprocess; VmHWM reset before the "
                    "warm-up call, minus VmRSS then",
      },
      "shapes": [],
      "results": [],
  }
  bar = _progress(len(shapes) * len(impls), progress)
  with tempfile.TemporaryDirectory(prefix="streamidx-bench-") as tmp:
    for si_, shape in enumerate(shapes):
      doc["shapes"].append(dict(dataclasses.asdict(shape),
                                entries_per_seq=shape.entries_per_seq,
                                num_tokens=shape.num_tokens,
                                visible_pairs=shape.visible_pairs(),
                                flops=shape.flops(),
                                description=shape.describe()))
      ref = None
      rows = _check_rows(shape.num_tokens)
      check_paths = {"rows": rows,
                     "idx": os.path.join(tmp, f"{si_}_oracle_rows.npy"),
                     "scores": os.path.join(tmp, f"{si_}_oracle_scores.npy")}
      check = None
      shape_rows = []
      for impl in impls:
        if bar is not None:
          bar.set_description(f"{shape.name}: {impl}")
        row = {"shape": shape.name, "impl": impl}
        if impl == "oracle" and shape.flops() > ORACLE_MAX_FLOPS:
          row.update(status="skipped", reason=(
              f"{shape.flops() / 1e9:.1f} GFLOP is above the NumPy loop's "
              f"limit ({ORACLE_MAX_FLOPS / 1e9:.0f} GFLOP)"))
        else:
          save = os.path.join(tmp, f"{si_}_{impl}.npy")
          spec = {"shape": dataclasses.asdict(shape), "impl": impl,
                  "repeats": repeats, "save": save,
                  "save_scores": (os.path.join(tmp, f"{si_}_ref_scores.npy")
                                  if impl == "reference" else None),
                  "check": check_paths if check is None else None}
          row.update(_run_worker(spec, timeout))
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
        if bar is not None:
          bar.update()
      for row in shape_rows:
        if row["status"] == "ok":
          got = np.load(row.pop("output"))
          row["agreement"] = _agreement(
              got, ref if row["impl"] != "reference" else None, check)
        row.pop("f32_score_bound", None)
      if check is not None:
        doc["shapes"][-1]["f32_score_bound"] = check[3]
        doc["shapes"][-1]["oracle_rows_checked"] = len(check[0])
      doc["results"].extend(shape_rows)
  if bar is not None:
    bar.close()
  doc["ratios"] = _ratios(doc)
  path = out_dir / "bench.json"
  path.write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")
  if plot:
    _plot(doc, out_dir / "bench.png")
  return doc


def _ratios(doc) -> dict:
  """Median time of each implementation over the reference's, per shape."""
  per_shape = {}
  for s in doc["shapes"]:
    rows = {r["impl"]: r for r in doc["results"]
            if r["shape"] == s["name"] and r["status"] == "ok"}
    if "reference" not in rows:
      continue
    ref = rows["reference"]["wall_s"]["median"]
    per_shape[s["name"]] = {i: r["wall_s"]["median"] / ref
                            for i, r in rows.items()}
  geo = {}
  impls = {i for v in per_shape.values() for i in v}
  for i in sorted(impls, key=IMPLEMENTATIONS.index):
    vals = [v[i] for v in per_shape.values() if i in v]
    geo[i] = {"geomean": math.exp(sum(map(math.log, vals)) / len(vals)),
              "shapes": len(vals)}
  return {"time_over_reference": per_shape,
          "geomean_time_over_reference": geo}


def format_table(doc) -> str:
  """The results as a fixed-width text table, ratios after it."""
  head = ("shape", "implementation", "median ms", "min-max ms", "entries/s",
          "peak MiB", "+over inputs", "XLA temp", "vs ref", "agrees")
  lines = []
  ratios = doc.get("ratios", {}).get("time_over_reference", {})
  for r in doc["results"]:
    if r["status"] != "ok":
      lines.append((r["shape"], r["impl"], r["status"], r.get("reason", "")[:60],
                    "", "", "", "", "", ""))
      continue
    w = r["wall_s"]
    m = r["memory"]
    xla = m.get("xla") or {}
    agrees = _verdict(r.get("agreement"))
    ratio = ratios.get(r["shape"], {}).get(r["impl"])
    lines.append((
        r["shape"], r["label"], f"{w['median'] * 1e3:.1f}",
        f"{w['min'] * 1e3:.1f}-{w['max'] * 1e3:.1f}",
        f"{r['entries_per_s']:.3g}", f"{_mib(m['peak_rss_bytes'])}",
        f"{_mib(m['peak_over_inputs_bytes'])}",
        "-" if not xla else f"{_mib(xla['temp_bytes'])}",
        "-" if ratio is None else f"{ratio:.3g}x", agrees))
  widths = [max(len(str(x)) for x in col) for col in zip(head, *lines)]
  fmt = "  ".join("{:<%d}" % w for w in widths)
  out = [fmt.format(*head), fmt.format(*("-" * w for w in widths))]
  out += [fmt.format(*map(str, l)) for l in lines]
  geo = doc.get("ratios", {}).get("geomean_time_over_reference", {})
  if geo:
    out.append("")
    out.append("time / reference time, geometric mean over shapes: " + ", ".join(
        f"{i} {g['geomean']:.3g}x ({g['shapes']} shapes)" for i, g in geo.items()))
  return "\n".join(out)


def _plot(doc, path):
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top

  shapes = [s["name"] for s in doc["shapes"]]
  impls = doc["settings"]["implementations"]
  fig, axes = plt.subplots(1, 2, figsize=(13, 4.8))
  width = 0.8 / max(len(impls), 1)
  x = np.arange(len(shapes))
  for j, impl in enumerate(impls):
    med, lo, hi, mem, wrong = [], [], [], [], []
    for s in shapes:
      r = next((r for r in doc["results"] if r["shape"] == s
                and r["impl"] == impl and r["status"] == "ok"), None)
      if r is None:
        med.append(np.nan), lo.append(0), hi.append(0), mem.append(np.nan)
        wrong.append(False)
        continue
      wrong.append(not r.get("agreement", {}).get("vs_oracle",
                                                  {"ok": True})["ok"])
      w = r["wall_s"]
      med.append(w["median"])
      lo.append(w["median"] - w["min"])
      hi.append(w["max"] - w["median"])
      over = r["memory"]["peak_over_inputs_bytes"]
      mem.append(np.nan if over is None else over / 2**20)
    pos = x + (j - (len(impls) - 1) / 2) * width
    axes[0].bar(pos, med, width, yerr=[lo, hi], capsize=2, label=impl)
    axes[1].bar(pos, mem, width, label=impl)
    for p_, m_, bad in zip(pos, med, wrong):
      if bad:  # disagrees with the NumPy oracle: its time is not trusted
        axes[0].annotate("wrong", (p_, m_), ha="center", va="bottom",
                         fontsize=7, color="red", rotation=90)
  axes[0].set_yscale("log")
  axes[0].set_ylabel("wall time per call, s (median, min-max)")
  axes[1].set_ylabel("peak RSS over inputs, MiB")
  for ax in axes:
    ax.set_xticks(x)
    ax.set_xticklabels(shapes, rotation=20, ha="right", fontsize=8)
    ax.grid(axis="y", alpha=0.3)
  axes[0].legend(fontsize=8)
  fig.suptitle(doc["machine"]["describe"], fontsize=9)
  fig.tight_layout()
  fig.savefig(path, dpi=110)
  plt.close(fig)


# --------------------------------------------------------------------------
# Long context: the streaming reference at 1M tokens
# --------------------------------------------------------------------------


def random_cache(total_pages: int, page_size: int, head_dim: int = 128,
                 fmt: str = "fp8", *, seed: int = 0,
                 pages_per_step: int = 256):
  """A seeded random cache, packed a few pages at a time.

  Keys are N(0, 1) float32 from `jax.random.normal(fold_in(key(seed), i))`
  for the i-th group of `pages_per_step` pages, packed (`cache.pack_cache`)
  inside one `lax.map`, so only one group's float32 keys (pages_per_step x
  page_size x head_dim x 4 bytes, 16 MiB by default) exist next to the
  packed cache: 64 x 256K FP8 entries take their 4 GiB and little more,
  where float32 keys for them would be 8 GiB. The groups must tile the
  cache (`pages_per_step` is lowered to a divisor of `total_pages`).

  Returns:
    [total_pages, page_size / kv_packing, kv_packing, lkv_dim] cache array.
  """
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  from streamidx import cache as cache_lib  # pylint: disable=g-import-not-at-top

  step = math.gcd(total_pages, pages_per_step)
  n = total_pages // step

  @jax.jit
  def build(key):
    def group(i):
      keys = jax.random.normal(jax.random.fold_in(key, i),
                               (step, page_size, head_dim), jnp.float32)
      return cache_lib.pack_cache(keys, fmt)

    out = jax.lax.map(group, jnp.arange(n))
    return out.reshape((total_pages,) + out.shape[2:])

  return build(jax.random.key(seed))


def long_context_args(shape: Shape, *, seed: int = 0):
  """The kernel's 7 positional arguments for a long-context shape.

  The batch (page table, lengths) comes from `batch.make_mixed_batch`; q and
  the weights are drawn like `batch.make_inputs` draws them (NumPy, seeded);
  the cache comes from `random_cache`, since `make_inputs` would hold
  float32 keys for every entry.
  """
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  b = shape.batch()
  rng = np.random.default_rng(seed)
  t, h, d = b.num_tokens, shape.num_heads, shape.head_dim
  q = rng.standard_normal((t, h, d), np.float32)
  w = np.abs(rng.standard_normal((t, h), np.float32)) / np.sqrt(h)
  cache = random_cache(b.total_num_pages, shape.page_size, d, shape.fmt,
                       seed=seed + 1)
  seq_lens, page_indices, cu_q_lens, distribution = b.kernel_arrays()
  return (jnp.asarray(q).astype(jnp.bfloat16), jnp.asarray(w), cache,
          seq_lens, page_indices, cu_q_lens, distribution)


def _long_fn(impl):
  import streamidx as si  # pylint: disable=g-import-not-at-top
  from streamidx import streaming  # pylint: disable=g-import-not-at-top
  return {"streaming": streaming.streamindex_topk_streaming,
          "reference": si.streamindex_topk_ref}[impl]


def _abstract_args(shape: Shape):
  """ShapeDtypeStructs of `long_context_args(shape)`: nothing allocated."""
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  from streamidx import cache as cache_lib  # pylint: disable=g-import-not-at-top
  b = shape.batch()
  packing = cache_lib.kv_packing(shape.fmt)
  return [
      jax.ShapeDtypeStruct((b.num_tokens, shape.num_heads, shape.head_dim),
                           jnp.bfloat16),
      jax.ShapeDtypeStruct((b.num_tokens, shape.num_heads), jnp.float32),
      jax.ShapeDtypeStruct(
          (b.total_num_pages, shape.page_size // packing, packing,
           cache_lib.lkv_dim(shape.fmt, shape.head_dim)),
          cache_lib.cache_dtype(shape.fmt)),
  ] + [jax.ShapeDtypeStruct(a.shape, jnp.int32) for a in b.kernel_arrays()]


def _spot_check(shape: Shape, args, got) -> dict:
  """The NumPy oracle and the one-shot reference on slices of the batch.

  decode: sequences 0 and last, each with its own pages only (contiguous
  allocation), so the oracle decodes 2048 pages, not the whole cache.
  prefill: the first and last 8 query rows, as prefill chunks of 8 queries
  (a chunk ending at position p sees what the full chunk's rows see), in a
  batch with a second, empty sequence slot: with one slot, jax 0.10.2's
  CPU compiler miscompiles the one-shot reference (tests/test_streaming.py).
  The oracle agrees within twice the float32 bound (tie-aware); the one-shot
  is compared for identical indices.
  """
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  import streamidx as si  # pylint: disable=g-import-not-at-top
  from streamidx.lab.bench import oracle as bench_oracle  # pylint: disable=g-import-not-at-top
  from streamidx import metrics  # pylint: disable=g-import-not-at-top
  q, w, cache, seq_lens, page_indices, _, _ = args
  got = np.asarray(got)
  b = shape.batch()
  kw = shape.kernel_kwargs()
  i32 = lambda x: jnp.asarray(x, jnp.int32)  # pylint: disable=unnecessary-lambda-assignment
  subs = []
  if shape.kind == "decode":
    pps = b.pages_per_seq
    for s in (0, shape.num_seqs - 1):
      table = np.asarray(page_indices)[s * pps:(s + 1) * pps]
      lo = int(table.min())
      subs.append((f"sequence {s}", got[s:s + 1],
                   (q[s:s + 1], w[s:s + 1], cache[lo:lo + pps],
                    seq_lens[s:s + 1], i32(table - lo), i32([0, 1]),
                    i32([1, 1, 1]))))
  else:
    n, total = 8, shape.q_len
    pps = b.pages_per_seq
    table = np.concatenate([np.asarray(page_indices)[:pps],
                            np.zeros(pps, np.int32)])
    for lo in (0, total - n):
      seq_len = shape.seq_len - total + lo + n
      subs.append((f"rows {lo}-{lo + n - 1}", got[lo:lo + n],
                   (q[lo:lo + n], w[lo:lo + n], cache, i32([seq_len, 0]),
                    i32(table), i32([0, n, n]), i32([0, 1, 1]))))
  out = []
  for name, mine, sub in subs:
    np_sub = [np.asarray(a) for a in sub]
    o_idx, o_scores = bench_oracle.oracle_topk(*np_sub, return_scores=True,
                                               **kw)
    bound = bench_oracle.f32_score_bound(*np_sub[:3])
    c = metrics.compare_topk(mine, o_idx, o_scores, atol=2 * bound)
    one_shot = np.asarray(si.streamindex_topk_ref(*sub, **kw))
    out.append({"slice": name, "oracle_ok": c.ok, "oracle_atol": 2 * bound,
                "one_shot_identical": bool(np.array_equal(one_shot, mine))})
  return {"slices": out,
          "oracle_ok": all(x["oracle_ok"] for x in out),
          "one_shot_identical": all(x["one_shot_identical"] for x in out)}


def _long_worker(spec: dict) -> dict:
  import jax  # pylint: disable=g-import-not-at-top
  shape = Shape(**spec["shape"])
  impl = spec["impl"]
  fn = _long_fn(impl)
  kw = shape.kernel_kwargs()
  t0 = time.perf_counter()
  args = long_context_args(shape)
  jax.block_until_ready(args)
  build_s = time.perf_counter() - t0
  build_peak = _PeakMemory().peak()
  t0 = time.perf_counter()
  compiled = fn.lower(*args, **kw).compile()
  compile_s = time.perf_counter() - t0
  mem = _PeakMemory()
  mem.start()
  t0 = time.perf_counter()
  out = jax.block_until_ready(compiled(*args))
  wall = time.perf_counter() - t0
  peak = mem.peak()
  np.save(spec["save"], np.asarray(out))
  result = {
      "build_s": build_s, "compile_s": compile_s, "wall_s": wall,
      "memory": {"method": mem.method,
                 "peak_rss_while_building_inputs_bytes": build_peak,
                 "rss_before_bytes": mem.rss_before,
                 "peak_rss_bytes": peak,
                 "peak_over_inputs_bytes": (None if mem.rss_before is None
                                            else peak - mem.rss_before),
                 "inputs_bytes": int(sum(a.nbytes for a in args)),
                 "xla": _xla_memory(compiled)},
  }
  result["spot_check"] = _spot_check(shape, args, out)
  return result


def _mem_available() -> int | None:
  try:
    with open("/proc/meminfo", encoding="ascii") as f:
      for line in f:
        if line.startswith("MemAvailable:"):
          return int(line.split()[1]) * 1024
  except OSError:
    return None
  return None


def run_long_context(*, shapes=LONG_CONTEXT, ks=LONG_CONTEXT_KS,
                     one_shot: str = "auto", out_dir="build/bench",
                     timeout: float = 3600.0, progress: bool = True) -> dict:
  """Streaming reference at long context; the one-shot predicted, maybe run.

  For each shape and k: XLA's buffer assignment for both references,
  compiled ahead of time from shapes alone (nothing allocated), and
  `streaming.one_shot_temp_bytes`' formula; then the streaming reference in
  a fresh process (peak RSS measured). `one_shot`: "run" also runs the
  one-shot reference there and compares the indices exactly; "auto" does so
  only when XLA's prediction (arguments + temporaries + output) is under
  half of MemAvailable; "skip" never runs it.
  """
  from streamidx import streaming  # pylint: disable=g-import-not-at-top
  if one_shot not in ("auto", "run", "skip"):
    raise ValueError(
        f"one_shot: must be 'auto', 'run' or 'skip' (got {one_shot!r})")
  out_dir = Path(out_dir)
  out_dir.mkdir(parents=True, exist_ok=True)
  configs = [dataclasses.replace(s, name=f"{s.name}_k{k}", k=k)
             for s in shapes for k in ks]
  doc = {"schema": LONG_SCHEMA, "created": datetime.datetime.now(
      datetime.timezone.utc).isoformat(timespec="seconds"),
         "command": " ".join([Path(sys.executable).name, "-m",
                              "streamidx.bench"] + sys.argv[1:]),
         "machine": _machine(), "one_shot": one_shot, "results": []}
  bar = _progress(len(configs) * (1 if one_shot == "skip" else 2), progress)
  with tempfile.TemporaryDirectory(prefix="streamidx-long-") as tmp:
    for i, shape in enumerate(configs):
      b = shape.batch()
      abstract = _abstract_args(shape)
      kw = shape.kernel_kwargs()
      predicted = {}
      for impl in ("streaming", "reference"):
        predicted[impl] = _xla_memory(
            _long_fn(impl).lower(*abstract, **kw).compile())
      formula = streaming.one_shot_temp_bytes(
          num_tokens=b.num_tokens, head_dim=shape.head_dim,
          max_num_seqs=b.max_num_seqs, pages_per_seq=b.pages_per_seq,
          page_size=shape.page_size, total_pages=b.total_num_pages,
          fmt=shape.fmt)
      row = {"shape": dataclasses.asdict(shape), "description": shape.describe(),
             "visible_pairs": shape.visible_pairs(), "predicted_xla": predicted,
             "one_shot_formula_temp_bytes": {"low": formula[0],
                                             "high": formula[1]}}
      for impl in ("streaming", "reference"):
        if bar is not None:
          bar.set_description(f"{shape.name}: {impl}")
        if impl == "reference":
          p = predicted["reference"]
          need = p["argument_bytes"] + p["temp_bytes"] + p["output_bytes"]
          avail = _mem_available()
          fits = avail is not None and need < avail / 2
          row["one_shot_decision"] = {
              "predicted_bytes": need, "mem_available_bytes": avail,
              "fits_half_of_available": fits}
          if one_shot == "skip" or (one_shot == "auto" and not fits):
            row["reference"] = {"status": "not run", "reason": (
                "skipped (--one-shot skip)" if one_shot == "skip" else
                f"predicted {_mib(need)} MiB >= half of MemAvailable "
                f"({_mib(avail)} MiB)")}
            if bar is not None and one_shot != "skip":
              bar.update()
            continue
        save = os.path.join(tmp, f"{i}_{impl}.npy")
        spec = {"shape": dataclasses.asdict(shape), "impl": impl,
                "save": save, "long": True}
        res = _run_worker(spec, timeout)
        if res["status"] == "ok":
          res["entries_per_s"] = shape.visible_pairs() / res["wall_s"]
          if impl == "reference":
            s_path = os.path.join(tmp, f"{i}_streaming.npy")
            if os.path.exists(s_path):
              res["identical_to_streaming"] = bool(
                  np.array_equal(np.load(save), np.load(s_path)))
        row[impl] = res
        if bar is not None:
          bar.update()
      doc["results"].append(row)
  if bar is not None:
    bar.close()
  (out_dir / "long_context.json").write_text(json.dumps(doc, indent=1) + "\n",
                                             encoding="utf-8")
  return doc


def format_long_table(doc) -> str:
  head = ("config", "impl", "wall s", "entries/s", "peak RSS MiB",
          "+over inputs", "XLA args+temp MiB", "checked")
  lines = []
  for row in doc["results"]:
    name = row["shape"]["name"]
    for impl in ("streaming", "reference"):
      pred = row["predicted_xla"][impl]
      xla = f"{_mib(pred['argument_bytes'])}+{_mib(pred['temp_bytes'])}"
      r = row.get(impl)
      if r is None or r.get("status") != "ok":
        reason = "" if r is None else r.get("reason", "")
        lines.append((name, impl, "not run", "", "", "", xla, reason[:50]))
        continue
      m = r["memory"]
      sc = r["spot_check"]
      check = (", ".join(x["slice"] for x in sc["slices"]) + ": oracle "
               + ("ok" if sc["oracle_ok"] else "WRONG") + ", one-shot "
               + ("identical" if sc["one_shot_identical"] else "differs"))
      if impl == "reference":
        same = r.get("identical_to_streaming")
        check += "; all rows vs streaming: " + (
            "identical" if same else "differ" if same is not None else "?")
      lines.append((name, impl, f"{r['wall_s']:.1f}", f"{r['entries_per_s']:.3g}",
                    f"{_mib(m['peak_rss_bytes'])}",
                    f"{_mib(m['peak_over_inputs_bytes'])}", xla, check))
  widths = [max(len(str(x)) for x in col) for col in zip(head, *lines)]
  fmt = "  ".join("{:<%d}" % w for w in widths)
  out = [fmt.format(*head), fmt.format(*("-" * w for w in widths))]
  out += [fmt.format(*map(str, l)) for l in lines]
  for row in doc["results"]:
    f = row["one_shot_formula_temp_bytes"]
    out.append(f"{row['shape']['name']}: one-shot temp by formula "
               f"{_mib(f['low'])}-{_mib(f['high'])} MiB, by XLA "
               f"{_mib(row['predicted_xla']['reference']['temp_bytes'])} MiB; "
               f"streaming temp by XLA "
               f"{_mib(row['predicted_xla']['streaming']['temp_bytes'])} MiB")
  return "\n".join(out)


# --------------------------------------------------------------------------
# Command line
# --------------------------------------------------------------------------


def main(argv=None) -> int:
  p = argparse.ArgumentParser(
      prog="python -m streamidx.bench",
      description="Kernel, jitted reference, streaming reference and NumPy "
      "oracle, measured side by side (see the module docstring).")
  p.add_argument("--quick", action="store_true",
                 help="small shapes and 3 repeats (CI)")
  p.add_argument("--out", default="build/bench",
                 help="output folder for bench.json / bench.png / "
                 "long_context.json (default build/bench)")
  p.add_argument("--shapes", nargs="+", metavar="SHAPE",
                 help="named shapes (--list) or decode:SEQSxSEQ_LEN:K / "
                 "prefill:QxSEQ_LEN:K")
  p.add_argument("--impls", nargs="+", choices=IMPLEMENTATIONS,
                 default=list(IMPLEMENTATIONS), help="implementations to run")
  p.add_argument("--repeats", type=int, default=None,
                 help="timed calls after the warm-up (default 5, quick 3)")
  p.add_argument("--timeout", type=float, default=1800.0,
                 help="seconds allowed per implementation run")
  p.add_argument("--long-context", action="store_true",
                 help="the streaming reference at 1M tokens (decode) and "
                 "128K (prefill), with peak memory")
  p.add_argument("--one-shot", choices=("auto", "run", "skip"), default="auto",
                 help="--long-context: also run the one-shot reference "
                 "(auto: when XLA predicts it fits in half of MemAvailable)")
  p.add_argument("--no-progress", action="store_true")
  p.add_argument("--no-plot", action="store_true")
  p.add_argument("--list", action="store_true", help="list named shapes")
  p.add_argument("--worker", help=argparse.SUPPRESS)
  a = p.parse_args(argv)

  if a.worker is not None:
    spec = json.loads(a.worker)
    res = _long_worker(spec) if spec.get("long") else _worker(spec)
    print(_RESULT_PREFIX + json.dumps(res), flush=True)
    return 0
  if a.list:
    for group, shapes in (("sweep", SWEEP), ("quick", QUICK),
                          ("long context", LONG_CONTEXT)):
      print(f"{group}:")
      for s in shapes:
        at = (f" (run at k {', '.join(map(str, LONG_CONTEXT_KS))})"
              if shapes is LONG_CONTEXT else "")
        print(f"  {s.name:28s} {s.describe()}{at}")
    return 0
  if a.repeats is not None and a.repeats < 1:
    p.error("--repeats: must be >= 1")
  if a.long_context:
    doc = run_long_context(one_shot=a.one_shot, out_dir=a.out,
                           timeout=a.timeout, progress=not a.no_progress)
    print(doc["machine"]["describe"])
    print(format_long_table(doc))
    print(f"\nwrote {Path(a.out) / 'long_context.json'}")
    bad = [f"{row['shape']['name']} {impl}" for row in doc["results"]
           for impl in ("streaming", "reference")
           if row.get(impl, {}).get("status") == "error"
           or not row.get(impl, {}).get("spot_check", {"oracle_ok": True})[
               "oracle_ok"]]
    if bad:
      print("\nFAILED (error, or disagrees with the NumPy oracle): "
            + ", ".join(bad), file=sys.stderr)
    return 1 if bad else 0
  try:
    shapes = ([parse_shape(s) for s in a.shapes] if a.shapes
              else (QUICK if a.quick else SWEEP))
  except ValueError as e:
    p.error(str(e))
  repeats = a.repeats if a.repeats is not None else (3 if a.quick else 5)
  doc = run_sweep(shapes, implementations=a.impls, repeats=repeats,
                  out_dir=a.out, timeout=a.timeout,
                  progress=not a.no_progress, plot=not a.no_plot,
                  quick=a.quick)
  print(doc["machine"]["describe"])
  print(format_table(doc))
  print(f"\nwrote {Path(a.out) / 'bench.json'}"
        + ("" if a.no_plot else f" and {Path(a.out) / 'bench.png'}"))
  bad = [f"{r['shape']} {r['impl']}" for r in doc["results"]
         if r["status"] == "error"
         or not r.get("agreement", {}).get("vs_oracle", {"ok": True})["ok"]]
  if bad:
    print("\nFAILED (error, or disagrees with the NumPy oracle): "
          + ", ".join(bad), file=sys.stderr)
  return 1 if bad else 0


if __name__ == "__main__":
  sys.exit(main())
