"""Measuring the kernel: profiler traces and per-op device times, split into
the parts `records.PARTS` (docs/tpu.md, "Measuring the kernel").
"""

from __future__ import annotations

import dataclasses
import glob as glob_lib
import gzip
import json
import os
import platform
import re
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import jax
import numpy as np

from streamidx import modes
from streamidx.kernels.driver import STAGE_SCOPES

ITERATION_ANNOTATION = "streamidx_iteration"
# The part of the call a device op belongs to (`records.PARTS`), by regex:
# "copies" over the op's own name, the others over its name and string args
# (its named scope: `driver.STAGE_SCOPES`, "select_topk_<method>", the
# kernels' "StreamIdx..." names). First match wins; else "other".
COPY_OPS = r"^(copy|transpose|bitcast|reshape)([.-]|$)"
STAGE_PATTERNS: tuple[tuple[str, str], ...] = (
    ("selection", r"select_topk_"),
    ("scoring", r"StreamIdx|" + STAGE_SCOPES["scoring"]),
    ("fill", STAGE_SCOPES["fill"]),
    # XLA's TPU sort passes make sort instructions without the op's scope.
    ("selection", r"^sort([.-]|$)"),
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
            iterations: int = 3, warmup: int = 1,
            gap_s: float | None = None) -> Capture:
  """Runs `fn` `warmup` times untraced, then `iterations` times traced into
  `log_dir` (Perfetto, no Python frames), each under `ITERATION_ANNOTATION`
  and waited for; `gap_s` > 0: then that many seconds idle before the next;
  0: dispatched back to back, one wait after the last (`host_wall_s`: the
  whole, once)."""
  if iterations < 1 or warmup < 0 or (gap_s is not None and gap_s < 0):
    raise ValueError(f"iterations must be >= 1, warmup and gap_s >= 0, got "
                     f"{iterations}, {warmup}, {gap_s}")
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
    start, outs = time.perf_counter(), []
    for i in range(iterations):
      with jax.profiler.TraceAnnotation(ITERATION_ANNOTATION, iteration=i):
        t0 = time.perf_counter()
        outs.append(fn())
        if gap_s != 0:  # waited for, one at a time
          jax.block_until_ready(outs.pop())
          walls.append(time.perf_counter() - t0)
      if gap_s:
        time.sleep(gap_s)
    if gap_s == 0:  # back to back: waited for once
      jax.block_until_ready(outs)
      walls.append(time.perf_counter() - start)
  runs = sorted(set(glob_lib.glob(pattern)) - before)
  if not runs:
    raise RuntimeError(f"jax.profiler wrote no run under {log_dir}/plugins/profile")
  perfetto = sorted(glob_lib.glob(os.path.join(runs[-1], "*perfetto_trace.json.gz")))
  xplanes = tuple(sorted(glob_lib.glob(os.path.join(runs[-1], "*.xplane.pb"))))
  return Capture(str(log_dir), perfetto[0] if perfetto else None, xplanes,
                 iterations, tuple(walls))


@dataclasses.dataclass
class Trace:
  """A parsed Chrome/Perfetto JSON trace: "X" events (ts, dur in us),
  processes (pid -> name), threads ((pid, tid) -> name)."""

  events: list[dict]
  processes: dict[int, str]
  threads: dict[tuple[int, int], str]

  def device_pids(self) -> list[int]:
    """Processes of accelerator devices ("/device:TPU:0", ...) with events."""
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


def stage_of(event: Mapping[str, Any], unnamed: str = "other") -> str:
  """The part (`records.PARTS`, not "idle") a device op event belongs to;
  `unnamed` where no pattern names it (a program of one stage: that stage)."""
  if re.match(COPY_OPS, event.get("name", "")):
    return "copies"
  text = " ".join([event.get("name", "")] + [
      v for v in (event.get("args") or {}).values() if isinstance(v, str)])
  return next((st for st, rx in STAGE_PATTERNS if re.search(rx, text)), unnamed)


def self_times(events: Sequence[Mapping[str, Any]]) -> list[float]:
  """Each event's own duration on one line: its `dur` less the events
  nested in it, so that the self times sum to the busy time."""
  order = sorted(range(len(events)),
                 key=lambda i: (events[i]["ts"], -events[i].get("dur", 0.0)))
  own = [float(e.get("dur", 0.0)) for e in events]
  stack: list[int] = []
  for i in order:
    ts = events[i]["ts"]
    while stack and ts >= events[stack[-1]]["ts"] + events[stack[-1]].get(
        "dur", 0.0):
      stack.pop()
    if stack:
      own[stack[-1]] -= events[i].get("dur", 0.0)  # its direct parent
    stack.append(i)
  return own


def stage_times(trace: Trace, *, iterations: int,
                unnamed: str = "other") -> dict:
  """Device seconds per iteration, the whole and its parts: {"device",
  "source", "total_s" (the "XLA Modules" line, else the ops' busy time), one
  "<part>_s" per `records.PARTS` (ops' self times by `stage_of`; "idle_s"
  what no op covers), "ops" by time, "host_call_s", "host_call_events"};
  every time None off-device."""
  from streamidx import records  # pylint: disable=g-import-not-at-top
  if iterations < 1:
    raise ValueError(f"iterations must be >= 1, got {iterations}")
  pids = set(trace.device_pids())
  host = [e for e in trace.events
          if e["pid"] not in pids and e["name"] == ITERATION_ANNOTATION]
  host_s = sum(e.get("dur", 0.0) for e in host) / 1e6 / len(host) if host else None
  out = {"device": False, "source": "no device lines in the trace (not a TPU run)",
         "total_s": None, **{f"{p}_s": None for p in records.PARTS},
         "ops": [], "host_call_s": host_s, "host_call_events": len(host)}
  if not pids:
    return out
  lines = {k: n for k, n in trace.threads.items() if k[0] in pids}
  op_lines = [k for k, n in lines.items() if n == "XLA Ops"]
  module_lines = [k for k, n in lines.items() if n == "XLA Modules"]
  if not op_lines:
    raise ValueError(f"trace: no 'XLA Ops' line on the device processes "
                     f"{sorted(pids)} (lines: {sorted(set(lines.values()))})")
  sums = dict.fromkeys(records.PARTS, 0.0)
  table: dict[str, dict] = {}
  for line in op_lines:
    events = [e for e in trace.events if (e["pid"], e.get("tid")) == line]
    for e, own in zip(events, self_times(events)):
      stage = stage_of(e, unnamed)
      sums[stage] += own
      row = table.setdefault(e["name"], {"name": e["name"], "stage": stage,
                                         "count": 0, "self_us": 0.0})
      row["count"] += 1
      row["self_us"] += own
  busy = sum(sums.values())
  module_events = [e for e in trace.events
                   if (e["pid"], e.get("tid")) in module_lines]
  modules = sum(e.get("dur", 0.0) for e in module_events)
  if module_events and modules >= busy:
    whole, source = modules, "device 'XLA Modules' and 'XLA Ops' lines"
  else:  # no module line, or ops past their modules' ends
    whole, source = busy, ("device 'XLA Ops' lines (busy time: the module "
                           f"line {'is missing' if not module_events else 'is shorter'})")
  sums["idle"] = whole - busy
  out.update(device=True, source=source, total_s=whole / 1e6 / iterations,
             ops=sorted(table.values(), key=lambda r: -r["self_us"]),
             **{f"{k}_s": v / 1e6 / iterations for k, v in sums.items()})
  return out


def profile(fn: Callable[[], Any], *, iterations: int, warmup: int = 0,
            unnamed: str = "other", trace_dir: str | None = None,
            gap_s: float | None = None) -> dict:
  """`stage_times` of `fn` under `capture` (`warmup` untraced runs, then
  `iterations` traced, paced by `gap_s`) into a temporary folder (in
  `trace_dir`): a trace without a Perfetto file counts as one without
  device lines."""
  with tempfile.TemporaryDirectory(dir=trace_dir) as d:
    cap = capture(fn, log_dir=d, iterations=iterations, warmup=warmup,
                  gap_s=gap_s)
    trace = (load_trace(cap.perfetto_path) if cap.perfetto_path
             else Trace([], {}, {}))
    return stage_times(trace, iterations=iterations, unnamed=unnamed)


def machine() -> dict:
  """This process's machine: device, kernel mode, TPU generation, host, versions."""
  dev = jax.devices()[0]
  return {
      "describe": modes.describe_machine(), "platform": dev.platform,
      "device_kind": getattr(dev, "device_kind", dev.platform),
      "num_devices": jax.device_count(), "kernel_mode": modes.kernel_mode(),
      "generation": modes.device_generation(dev), "cpu_count": os.cpu_count(),
      "jax": jax.__version__, "numpy": np.__version__,
      "python": platform.python_version(), "host": platform.platform()}
