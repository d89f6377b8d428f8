"""Measuring the kernel: profiler traces, per-op device times, run files (how to
use them, why times come from a trace, what `stage_times` sums and reports
off a TPU: docs/tpu.md, "Measuring the kernel").
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import glob as glob_lib
import gzip
import importlib.metadata as md
import json
import os
import platform
import re
import time
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence

import jax
import numpy as np

from streamidx import modes
from streamidx.lab.model import hardware

RUN_SCHEMA = "streamidx.profile_run/1"
ITERATION_ANNOTATION = "streamidx_iteration"
# Stage of a device op, by regex over its name and its string args (first
# match wins). The kernel's pallas_calls run under jax.named_scope
# "StreamIdxTC-..." / "StreamIdxPageTC-..." (kernel.py).
STAGE_PATTERNS: tuple[tuple[str, str], ...] = (
    ("kernel", r"StreamIdx"),
    ("topk", r"(?i)approx[-_ ]?(max|top)|top[-_ ]?k|\bsort"),
)


@dataclasses.dataclass(frozen=True)
class Capture:
  """Where one `capture` wrote its trace, and what it ran."""

  log_dir: str
  perfetto_path: str | None  # perfetto_trace.json.gz
  xplane_paths: tuple[str, ...]
  iterations: int
  host_wall_s: tuple[float, ...]  # per iteration, Python clock (dispatch + wait)


def capture(fn: Callable[[], Any], *, log_dir: str | os.PathLike,
            iterations: int = 3, warmup: int = 1) -> Capture:
  """Runs `fn` `warmup` times untraced (compile), then `iterations` times traced
  into `log_dir` (Perfetto, no Python frames: they swamp an interpreted kernel),
  each under the `ITERATION_ANNOTATION` and waited for before the next."""
  if iterations < 1 or warmup < 0:
    raise ValueError(f"iterations must be >= 1 and warmup >= 0, got "
                     f"{iterations}, {warmup}")
  log_dir = Path(log_dir)
  log_dir.mkdir(parents=True, exist_ok=True)
  pattern = str(log_dir / "plugins" / "profile" / "*")
  before = set(glob_lib.glob(pattern))
  for _ in range(warmup):
    jax.block_until_ready(fn())
  opts = jax.profiler.ProfileOptions()
  opts.python_tracer_level = 0
  walls = []
  with jax.profiler.trace(str(log_dir), create_perfetto_trace=True,
                          profiler_options=opts):
    for i in range(iterations):
      with jax.profiler.TraceAnnotation(ITERATION_ANNOTATION, iteration=i):
        t0 = time.perf_counter()
        jax.block_until_ready(fn())
        walls.append(time.perf_counter() - t0)
  runs = sorted(set(glob_lib.glob(pattern)) - before)
  if not runs:
    raise RuntimeError(f"jax.profiler wrote no run under {log_dir}/plugins/profile")
  perfetto = sorted(glob_lib.glob(os.path.join(runs[-1], "*perfetto_trace.json.gz")))
  xplanes = tuple(sorted(glob_lib.glob(os.path.join(runs[-1], "*.xplane.pb"))))
  return Capture(str(log_dir), perfetto[0] if perfetto else None, xplanes,
                 iterations, tuple(walls))


@dataclasses.dataclass
class Trace:
  """A parsed Chrome/Perfetto JSON trace: its "X" events (name, pid, tid, ts and
  dur in microseconds, args), processes (pid -> name), threads ((pid, tid) -> name)."""

  events: list[dict]
  processes: dict[int, str]
  threads: dict[tuple[int, int], str]

  def device_pids(self) -> list[int]:
    """Processes of accelerator devices ("/device:TPU:0", ...) that recorded
    events (libtpu's compile-only devices, `streamidx.compile_for` earlier in
    the process, appear in a CPU run's trace without any)."""
    busy = {e["pid"] for e in self.events}
    return sorted(p for p, n in self.processes.items()
                  if n.startswith("/device:") and "CPU" not in n.upper()
                  and p in busy)


def load_trace(path: str | os.PathLike) -> Trace:
  """Reads a (gzipped) Chrome/Perfetto JSON trace written by `jax.profiler`."""
  path = str(path)
  with (gzip.open if path.endswith(".gz") else open)(path, "rt", encoding="utf-8") as f:
    doc = json.load(f)
  processes, threads, events = {}, {}, []
  for e in doc["traceEvents"] if isinstance(doc, dict) else doc:
    name = e.get("args", {}).get("name", "")
    if e.get("ph") == "M" and e.get("name") == "process_name":
      processes[e["pid"]] = name
    elif e.get("ph") == "M" and e.get("name") == "thread_name":
      threads[(e["pid"], e.get("tid"))] = name
    elif e.get("ph") == "X":
      events.append(e)
  return Trace(events, processes, threads)


def stage_times(trace: Trace, *, iterations: int) -> dict:
  """Device seconds per iteration by stage, and the op table behind them:
  {"device", "source", "kernel_s", "topk_s", "other_s", "total_s" (None
  off-device), "ops": [{"name", "stage", "count", "total_us"}] by time,
  "host_call_s": the mean host-clock duration of one `capture` iteration's
  annotation (on a CPU, the interpreted run), "host_call_events"}."""
  if iterations < 1:
    raise ValueError(f"iterations must be >= 1, got {iterations}")
  pids = set(trace.device_pids())
  host = [e for e in trace.events
          if e["pid"] not in pids and e["name"] == ITERATION_ANNOTATION]
  host_s = sum(e.get("dur", 0.0) for e in host) / 1e6 / len(host) if host else None
  out = {"device": False, "source": "no device lines in the trace (not a TPU run)",
         "kernel_s": None, "topk_s": None, "other_s": None, "total_s": None,
         "ops": [], "host_call_s": host_s, "host_call_events": len(host)}
  if not pids:
    return out
  # Each device's "XLA Ops" thread (one event per executed op, no nesting),
  # else every thread of the device processes.
  ops = {k for k, n in trace.threads.items() if k[0] in pids and n == "XLA Ops"}
  events = [e for e in trace.events
            if ((e["pid"], e.get("tid")) in ops if ops else e["pid"] in pids)]
  source = ("device 'XLA Ops' lines" if ops else
            "all device lines (no 'XLA Ops' line found: nested events may overlap)")
  table: dict[str, dict] = {}
  sums = {"kernel": 0.0, "topk": 0.0, "other": 0.0}
  for e in events:
    text = " ".join([e.get("name", "")] + [v for v in (e.get("args") or {}).values()
                                          if isinstance(v, str)])
    stage = next((st for st, rx in STAGE_PATTERNS if re.search(rx, text)), "other")
    sums[stage] += e.get("dur", 0.0)
    row = table.setdefault(e["name"], {"name": e["name"], "stage": stage,
                                       "count": 0, "total_us": 0.0})
    row["count"] += 1
    row["total_us"] += e.get("dur", 0.0)
  out.update(device=True, source=source,
             ops=sorted(table.values(), key=lambda r: -r["total_us"]),
             **{f"{k}_s": v / 1e6 / iterations for k, v in sums.items()})
  out["total_s"] = out["kernel_s"] + out["topk_s"] + out["other_s"]
  return out


# -- run files ----------------------------------------------------------------


def machine() -> dict:
  """This process's machine: device, kernel mode, TPU generation, host, versions."""
  dev = jax.devices()[0]
  return {
      "describe": modes.describe_machine(), "platform": dev.platform,
      "device_kind": getattr(dev, "device_kind", dev.platform),
      "num_devices": jax.device_count(), "kernel_mode": modes.kernel_mode(),
      "generation": hardware.detect_generation(dev), "cpu_count": os.cpu_count(),
      "jax": jax.__version__, "numpy": np.__version__,
      "python": platform.python_version(), "host": platform.platform()}


def write_run(out_dir: str | os.PathLike, *, parameters: Mapping[str, Any],
              records: Sequence[Mapping[str, Any]], notes: str = "",
              name: str | None = None) -> Path:
  """Writes `<out_dir>/run-<generation or platform>-<UTC time>.json`: {"schema",
  "created", "machine" (`machine()`), "versions", "parameters", "notes",
  "records": one dict per measured point}; returns its path."""
  machine_ = machine()
  versions = {"python": platform.python_version()}
  for pkg in ("jax", "jaxlib", "libtpu", "libtpu-nightly", "numpy", "streamidx"):
    with contextlib.suppress(md.PackageNotFoundError):
      versions[pkg] = md.version(pkg)
  created = datetime.datetime.now(datetime.timezone.utc)
  doc = {"schema": RUN_SCHEMA, "created": created.isoformat(timespec="seconds"),
         "machine": machine_, "versions": versions,
         "parameters": dict(parameters), "notes": notes,
         "records": [dict(r) for r in records]}
  out_dir = Path(out_dir)
  out_dir.mkdir(parents=True, exist_ok=True)
  tag = machine_["generation"] or machine_["platform"]
  path = out_dir / (name or f"run-{tag}-{created.strftime('%Y%m%dT%H%M%SZ')}.json")
  path.write_text(json.dumps(doc, indent=1, sort_keys=True,
                             default=lambda x: x.item()),  # NumPy scalars
                  encoding="utf-8")
  return path


def load_runs(paths: str | os.PathLike | Iterable[str | os.PathLike], *,
              skip_invalid: bool = False) -> list[dict]:
  """Reads run files (a glob pattern, a folder's `run-*.json` or paths), each with
  its "path"; a file that is no run of this schema raises ValueError naming it,
  or with `skip_invalid` (a glob over build/ meets other JSON) is left out."""
  if isinstance(paths, (str, os.PathLike)):
    p = Path(paths)
    files = (sorted(p.glob("run-*.json")) if p.is_dir() else
             sorted(glob_lib.glob(str(p), recursive=True))
             if any(ch in str(p) for ch in "*?[") else [p])
  else:
    files = list(paths)
  runs = []
  for f in files:
    try:
      doc = json.loads(Path(f).read_text(encoding="utf-8"))
      bad = None if isinstance(doc, dict) and doc.get("schema") == RUN_SCHEMA else (
          f"not a {RUN_SCHEMA} run file")
    except ValueError as e:
      bad = f"not JSON ({e})"
    if bad is None:
      runs.append(dict(doc, path=str(f)))
    elif not skip_invalid:
      raise ValueError(f"{f}: {bad}")
  return runs


def _point(r: Mapping[str, Any]) -> tuple:
  return r.get("mode"), r.get("batch_size"), r.get("context_tokens")


def _bound(run, r, which: str):
  return ((r.get("predicted_us") or {}).get(run["machine"].get("generation") or "",
                                            {}).get(which))


def runs_table(runs: Sequence[Mapping[str, Any]]) -> list[dict]:
  """One row per (run, record): machine, point, measured and predicted times."""
  return [{"run": Path(run["path"]).name, "machine": run["machine"].get("device_kind"),
           **dict(zip(("mode", "batch", "context"), _point(r))),
           **{k: r.get(k) for k in ("kernel_us", "topk_us", "other_us",
                                    "host_call_us")},
           "bound_kernel_us": _bound(run, r, "kernel"),
           "bound_total_us": _bound(run, r, "total")}
          for run in runs for r in run["records"]]

