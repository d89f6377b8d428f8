"""Measuring the kernel: profiler traces, per-op device times, run files.

On a TPU, Python dispatch time dwarfs a kernel's, so times come from a
`jax.profiler` trace, never from a clock around a Python call:

    cap = capture(lambda: streamidx.streamindex_topk(*args, **kw),
                  log_dir="build/trace/point0", iterations=5)
    trace = load_trace(cap.perfetto_path)
    times = stage_times(trace, iterations=cap.iterations)
    times["kernel_s"], times["topk_s"]        # per iteration, device time

`stage_times` reads the device lines of the trace ("/device:TPU:N"
processes, their "XLA Ops" thread): every op event there is classified by
`STAGE_PATTERNS` (the kernel's named scope "StreamIdx...", the top-k) and
summed. On a CPU there are no device lines: `stage_times` says so
(`device=False`) and reports the host-side duration of the jitted call
instead, which for the interpreter is Python simulating a TPU, not a TPU.
The TPU path (device lines, op names) follows the trace format JAX's profiler
writes on TPU and has not been run on a TPU in this project yet: check the
printed op table on your first TPU run and adjust `STAGE_PATTERNS` if an op
lands in "other".

Run files: `write_run` saves one run's machine, versions, parameters and
measurements as JSON; `load_runs` reads any set of them, `plot_runs` puts
them side by side, so runs on different TPUs can be compared.
"""

from __future__ import annotations

import dataclasses
import datetime
import glob as glob_lib
import gzip
import json
import os
import platform
import re
import time
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence

__all__ = [
    "RUN_SCHEMA",
    "STAGE_PATTERNS",
    "Capture",
    "capture",
    "Trace",
    "load_trace",
    "stage_times",
    "hlo_stats",
    "machine_info",
    "write_run",
    "load_runs",
    "runs_table",
    "plot_runs",
]

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


def _block(out):
  import jax  # pylint: disable=g-import-not-at-top
  return jax.block_until_ready(out)


def capture(fn: Callable[[], Any], *, log_dir: str | os.PathLike,
            iterations: int = 3, warmup: int = 1,
            python_tracer: bool = False) -> Capture:
  """Runs `fn` `warmup` times untraced (compile), then `iterations` times traced.

  Each traced iteration runs under a `TraceAnnotation` named
  "streamidx_iteration" and is waited for (`block_until_ready`) before the
  next starts. The trace goes to `log_dir` (`jax.profiler.trace` with
  `create_perfetto_trace=True`). `python_tracer=False` keeps Python frames
  out of the trace (they swamp it when the kernel is interpreted).
  """
  import jax  # pylint: disable=g-import-not-at-top

  if iterations < 1 or warmup < 0:
    raise ValueError(f"iterations must be >= 1 and warmup >= 0, got "
                     f"{iterations}, {warmup}")
  log_dir = Path(log_dir)
  log_dir.mkdir(parents=True, exist_ok=True)
  before = set(glob_lib.glob(str(log_dir / "plugins" / "profile" / "*")))
  for _ in range(warmup):
    _block(fn())
  opts = jax.profiler.ProfileOptions()
  opts.python_tracer_level = 1 if python_tracer else 0
  walls = []
  with jax.profiler.trace(str(log_dir), create_perfetto_trace=True,
                          profiler_options=opts):
    for i in range(iterations):
      with jax.profiler.TraceAnnotation(ITERATION_ANNOTATION, iteration=i):
        t0 = time.perf_counter()
        _block(fn())
        walls.append(time.perf_counter() - t0)
  runs = sorted(set(glob_lib.glob(str(log_dir / "plugins" / "profile" / "*")))
                - before)
  if not runs:
    raise RuntimeError(f"jax.profiler wrote no run under {log_dir}/plugins/profile")
  run = runs[-1]
  perfetto = sorted(glob_lib.glob(os.path.join(run, "*perfetto_trace.json.gz")))
  xplanes = tuple(sorted(glob_lib.glob(os.path.join(run, "*.xplane.pb"))))
  return Capture(str(log_dir), perfetto[0] if perfetto else None, xplanes,
                 iterations, tuple(walls))


@dataclasses.dataclass
class Trace:
  """A parsed Chrome/Perfetto JSON trace: complete events and their names.

  events: the "X" (complete) events, each a dict with name, pid, tid, ts and
  dur (microseconds) and args. processes: pid -> process name; threads:
  (pid, tid) -> thread name.
  """

  events: list[dict]
  processes: dict[int, str]
  threads: dict[tuple[int, int], str]

  def device_pids(self) -> list[int]:
    """Processes of accelerator devices ("/device:TPU:0", ...) that recorded
    events; the host excluded. A device plane without events is no device
    run: libtpu's compile-only TPU devices (`streamidx.compile_for` earlier
    in the process) appear in a CPU run's trace that way."""
    busy = {e["pid"] for e in self.events}
    return sorted(p for p, n in self.processes.items()
                  if n.startswith("/device:") and "CPU" not in n.upper()
                  and p in busy)

  def device_op_events(self) -> tuple[list[dict], str]:
    """Events on the devices' op lines, and which lines they came from.

    Prefers each device's "XLA Ops" thread (one event per executed op, no
    nesting); falls back to every thread of the device process, said so in
    the returned description.
    """
    pids = set(self.device_pids())
    ops_threads = {k for k, n in self.threads.items()
                   if k[0] in pids and n == "XLA Ops"}
    if ops_threads:
      evs = [e for e in self.events if (e["pid"], e.get("tid")) in ops_threads]
      return evs, "device 'XLA Ops' lines"
    evs = [e for e in self.events if e["pid"] in pids]
    return evs, "all device lines (no 'XLA Ops' line found: nested events may overlap)"

  def host_events(self, name_regex: str) -> list[dict]:
    rx = re.compile(name_regex)
    pids = set(self.device_pids())
    return [e for e in self.events if e["pid"] not in pids and rx.search(e["name"])]


def load_trace(path: str | os.PathLike) -> Trace:
  """Reads a (gzipped) Chrome/Perfetto JSON trace written by `jax.profiler`."""
  path = str(path)
  opener = gzip.open if path.endswith(".gz") else open
  with opener(path, "rt", encoding="utf-8") as f:
    doc = json.load(f)
  raw = doc["traceEvents"] if isinstance(doc, dict) else doc
  processes, threads, events = {}, {}, []
  for e in raw:
    ph = e.get("ph")
    if ph == "M":
      if e.get("name") == "process_name":
        processes[e["pid"]] = e.get("args", {}).get("name", "")
      elif e.get("name") == "thread_name":
        threads[(e["pid"], e.get("tid"))] = e.get("args", {}).get("name", "")
    elif ph == "X":
      events.append(e)
  return Trace(events, processes, threads)


def _stage(event, patterns) -> str:
  text = event.get("name", "")
  args = event.get("args") or {}
  text += " " + " ".join(str(v) for v in args.values() if isinstance(v, str))
  for stage, rx in patterns:
    if re.search(rx, text):
      return stage
  return "other"


def stage_times(trace: Trace, *, iterations: int,
                patterns: Sequence[tuple[str, str]] = STAGE_PATTERNS) -> dict:
  """Device seconds per iteration by stage, and the op table behind them.

  Returns {"device": bool, "source": str, "kernel_s", "topk_s", "other_s",
  "total_s" (None off-device), "ops": [{"name", "stage", "count",
  "total_us"}] sorted by time, "host_call_s": the mean host-side duration
  of one `capture` iteration (its "streamidx_iteration" annotation: dispatch
  to completion on the profiler's host clock; on a CPU, the whole
  interpreted run)}.
  """
  if iterations < 1:
    raise ValueError(f"iterations must be >= 1, got {iterations}")
  host = trace.host_events("^" + ITERATION_ANNOTATION + "$")
  host_s = sum(e.get("dur", 0.0) for e in host) / 1e6 / len(host) if host else None
  out = {"device": False, "source": "no device lines in the trace (not a TPU run)",
         "kernel_s": None, "topk_s": None, "other_s": None, "total_s": None,
         "ops": [], "host_call_s": host_s, "host_call_events": len(host)}
  if not trace.device_pids():
    return out
  events, source = trace.device_op_events()
  table: dict[str, dict] = {}
  sums = {"kernel": 0.0, "topk": 0.0, "other": 0.0}
  for e in events:
    stage = _stage(e, patterns)
    sums[stage] = sums.get(stage, 0.0) + e.get("dur", 0.0)
    row = table.setdefault(e["name"], {"name": e["name"], "stage": stage,
                                       "count": 0, "total_us": 0.0})
    row["count"] += 1
    row["total_us"] += e.get("dur", 0.0)
  out.update(device=True, source=source,
             kernel_s=sums["kernel"] / 1e6 / iterations,
             topk_s=sums["topk"] / 1e6 / iterations,
             other_s=sum(v for k, v in sums.items() if k not in ("kernel", "topk"))
             / 1e6 / iterations,
             ops=sorted(table.values(), key=lambda r: -r["total_us"]))
  out["total_s"] = out["kernel_s"] + out["topk_s"] + out["other_s"]
  return out


def hlo_stats(cap: Capture) -> list[dict] | None:
  """xprof's "hlo_stats" table for a capture (rows as dicts), or None.

  A cross-check of `stage_times` on a TPU (per-HLO-op device self time).
  Needs the `xprof` package; returns None when it is missing or the table
  cannot be built.
  """
  try:
    from xprof.convert import raw_to_tool_data  # pylint: disable=g-import-not-at-top
  except ImportError:
    return None
  if not cap.xplane_paths:
    return None
  try:
    data, _ = raw_to_tool_data.xspace_to_tool_data(list(cap.xplane_paths),
                                                   "hlo_stats", {})
  except Exception:  # pylint: disable=broad-except
    return None
  doc = json.loads(data)
  if isinstance(doc, list):
    doc = doc[0] if doc else {}
  cols = [c.get("id") or c.get("label") for c in doc.get("cols", [])]
  rows = []
  for r in doc.get("rows", []):
    rows.append({c: cell.get("v") if isinstance(cell, dict) else cell
                 for c, cell in zip(cols, r.get("c", []))})
  return rows


# ---------------------------------------------------------------------------
# Run files.


def machine_info() -> dict:
  """The machine a run is on: platform, device kind, generation, kernel mode."""
  import jax  # pylint: disable=g-import-not-at-top
  from streamidx.lab.model import hardware  # pylint: disable=g-import-not-at-top
  from streamidx import modes  # pylint: disable=g-import-not-at-top

  dev = jax.devices()[0]
  return {
      "platform": dev.platform,
      "device_kind": getattr(dev, "device_kind", dev.platform),
      "num_devices": jax.device_count(),
      "generation": hardware.detect_generation(dev),
      "kernel_mode": modes.kernel_mode(),
      "describe": modes.describe_machine(),
      "os": platform.platform(),
  }


def _versions() -> dict:
  import importlib.metadata as md  # pylint: disable=g-import-not-at-top

  out = {"python": platform.python_version()}
  for pkg in ("jax", "jaxlib", "libtpu", "libtpu-nightly", "numpy", "streamidx"):
    try:
      out[pkg] = md.version(pkg)
    except md.PackageNotFoundError:
      pass
  return out


def _jsonable(x):
  if isinstance(x, dict):
    return {str(k): _jsonable(v) for k, v in x.items()}
  if isinstance(x, (list, tuple)):
    return [_jsonable(v) for v in x]
  if hasattr(x, "item") and callable(x.item):  # NumPy scalars
    return x.item()
  return x


def write_run(out_dir: str | os.PathLike, *, parameters: Mapping[str, Any],
              records: Sequence[Mapping[str, Any]], notes: str = "",
              name: str | None = None) -> Path:
  """Writes `<out_dir>/run-<generation or platform>-<UTC time>.json`; returns its path.

  A run: {"schema", "created", "machine" (`machine_info`), "versions",
  "parameters", "notes", "records": one dict per measured point}.
  """
  machine = machine_info()
  created = datetime.datetime.now(datetime.timezone.utc)
  doc = {"schema": RUN_SCHEMA,
         "created": created.isoformat(timespec="seconds"),
         "machine": machine, "versions": _versions(),
         "parameters": _jsonable(dict(parameters)), "notes": notes,
         "records": _jsonable([dict(r) for r in records])}
  out_dir = Path(out_dir)
  out_dir.mkdir(parents=True, exist_ok=True)
  tag = machine["generation"] or machine["platform"]
  name = name or f"run-{tag}-{created.strftime('%Y%m%dT%H%M%SZ')}.json"
  path = out_dir / name
  path.write_text(json.dumps(doc, indent=1, sort_keys=True), encoding="utf-8")
  return path


def load_runs(paths: str | os.PathLike | Iterable[str | os.PathLike], *,
              skip_invalid: bool = False) -> list[dict]:
  """Reads run files: a glob pattern, a folder (its `run-*.json`) or paths.

  Each returned run gains "path". A file that is not a run of this schema
  raises ValueError naming it, or with `skip_invalid=True` is left out
  (a glob over build/ may meet other tools' JSON).
  """
  if isinstance(paths, (str, os.PathLike)):
    p = Path(paths)
    if p.is_dir():
      files = sorted(p.glob("run-*.json"))
    elif any(ch in str(p) for ch in "*?["):
      files = [Path(f) for f in sorted(glob_lib.glob(str(p), recursive=True))]
    else:
      files = [p]
  else:
    files = [Path(f) for f in paths]
  runs = []
  for f in files:
    try:
      doc = json.loads(Path(f).read_text(encoding="utf-8"))
    except ValueError as e:
      if skip_invalid:
        continue
      raise ValueError(f"{f}: not JSON ({e})") from e
    if not isinstance(doc, dict) or doc.get("schema") != RUN_SCHEMA:
      if skip_invalid:
        continue
      raise ValueError(f"{f}: not a {RUN_SCHEMA} run file")
    doc["path"] = str(f)
    runs.append(doc)
  return runs


def runs_table(runs: Sequence[Mapping[str, Any]]) -> list[dict]:
  """One row per (run, record): machine, point, measured and predicted times."""
  rows = []
  for run in runs:
    m = run["machine"]
    for r in run["records"]:
      pred = (r.get("predicted_us") or {}).get(m.get("generation") or "", {})
      rows.append({
          "run": Path(run["path"]).name, "machine": m.get("device_kind"),
          "mode": r.get("mode"), "batch": r.get("batch_size"),
          "context": r.get("context_tokens"),
          "kernel_us": r.get("kernel_us"), "topk_us": r.get("topk_us"),
          "other_us": r.get("other_us"),
          "host_call_us": r.get("host_call_us"),
          "bound_kernel_us": pred.get("kernel"),
          "bound_total_us": pred.get("total"),
      })
  return rows


def plot_runs(runs: Sequence[Mapping[str, Any]], ax=None, *, what: str = "kernel_us"):
  """Side by side, per sweep point: `what` of every run, and its roofline bound.

  Device times (`kernel_us`, `topk_us`) exist only for TPU runs; CPU runs
  show `host_call_us` hatched (interpreter time: not comparable to a TPU).
  """
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top

  if ax is None:
    _, ax = plt.subplots(figsize=(10, 4))
  points = []
  for run in runs:
    for r in run["records"]:
      key = (r.get("mode"), r.get("batch_size"), r.get("context_tokens"))
      if key not in points:
        points.append(key)
  width = 0.8 / max(len(runs), 1)
  x = np.arange(len(points))
  for i, run in enumerate(runs):
    m = run["machine"]
    gen = m.get("generation")
    label = f"{m.get('device_kind')} ({Path(run['path']).name})"
    vals, hatches, bounds = [], [], []
    for key in points:
      rec = next((r for r in run["records"]
                  if (r.get("mode"), r.get("batch_size"), r.get("context_tokens")) == key),
                 None)
      v = rec.get(what) if rec else None
      hatch = ""
      if v is None and rec is not None:
        v, hatch = rec.get("host_call_us"), "//"
      vals.append(np.nan if v is None else v)
      hatches.append(hatch)
      b = ((rec or {}).get("predicted_us") or {}).get(gen or "", {}).get(
          "kernel" if what == "kernel_us" else "total")
      bounds.append(np.nan if b is None else b)
    bars = ax.bar(x + i * width, vals, width, label=label)
    for bar, h in zip(bars, hatches):
      bar.set_hatch(h)
    if not all(np.isnan(bounds)):
      ax.scatter(x + i * width, bounds, marker="_", s=400, color="black",
                 zorder=3, label=f"roofline bound ({gen})")
  ax.set_xticks(x + width * (len(runs) - 1) / 2)
  ax.set_xticklabels([f"{m}\nB={b}\nL={c}" for m, b, c in points], fontsize=8)
  ax.set_yscale("log")
  ax.set_ylabel("microseconds per call")
  ax.legend(fontsize=7)
  return ax
