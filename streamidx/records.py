"""What the project records: every data file's path, reader, writer and rule.

The files live in the checkout's `data/`, shipped in the wheel as the package
`streamidx.data`; this module is the one place that names them:

    tpu_specs            the TPU table, every number with its public source
                         (`streamidx.lab.model.hardware` parses it)
    decode_schedule      bundles per KV page of the decode launches' KV loop
                         (compiled without a TPU: a static schedule)
    step_schedule        bundles each compiled program of the step executes
                         ("selection" and "launches" rows, each with its
                         command; compiled without a TPU)
    public_measurements  others' TPU measurements of the pipeline, cited
    chip                 this project's own measurements on a TPU: "rows"
                         (`CHIP_FIELDS`, one per stage of one measured call),
                         "test_runs" (`TEST_RUN_FIELDS`, `make test-tpu`) and
                         "experiments" (`EXPERIMENT_FIELDS`, the lean
                         kernel taken apart: `lab.bench.ablate`)

`load(name)` reads a file once per process; `save(name, doc)` writes it (one
JSON layout for every file the project writes) and forgets the read.
`chip_rows(**match)` filters the chip's rows (or another list of it);
`append_chip(rows, runs, experiments)` checks
each against its schema (`chip_problems`) before writing anything.

A chip row is one stage of one measured call (`stage`): "call" is the whole
(device time by the profiler, wall time, compile time); "fill", "scoring",
"selection", "copies", "other" and "idle" are its device-time parts, which
sum to the call's `device_s` (`streamidx.lab.model.profiling.stage_times`).
A call measured alone on the selection (`variant` None) has the same parts.
An experiment from before `LATE_ISSUE_UNTIL` or `PREFETCH_2_UNTIL` ran the
lean kernel of then: `removed_now` reads what it left out in today's terms.
"""

from __future__ import annotations

import functools
import importlib.resources
import json
import os
import subprocess
from pathlib import Path
from typing import Any, Iterable, Mapping

FILES = {
    "tpu_specs": "tpu_specs.json",
    "decode_schedule": "decode_schedule.json",
    "step_schedule": "step_schedule.json",
    "public_measurements": "public_measurements.json",
    "chip": "chip_measurements.json",
}

# The device-time parts of a measured call, in the order they run; they sum
# to its "call" row's device_s.
PARTS = ("fill", "scoring", "selection", "copies", "other", "idle")
STAGES = ("call",) + PARTS

# Every chip row's keys: what ran, where, and what it took. None where a
# key does not apply (a selection alone has no variant or cache format; a
# part has no wall or compile time of its own).
CHIP_FIELDS: Mapping[str, str] = {
    "run": "the measured call this row belongs to (its rows share it)",
    "stage": f"one of {STAGES}",
    "chip": "TPU generation (v5e, ...)",
    "device_kind": "jax's device_kind",
    "shape": "the shape's name (lab.bench.record.SHAPES)",
    "mode": "decode, prefill, page or selection",
    "variant": "streamidx.VARIANTS name; None for a selection alone",
    "cache_format": "streamidx.cache.CACHE_FORMATS name; None likewise",
    "method": "topk_method; page mode: top_k",
    "rows": "query rows (score-buffer rows)",
    "tokens": "context tokens per sequence (None for a selection alone)",
    "entries": "entries (page mode: pages) per score-buffer row",
    "k": "k (page mode: k_pages)",
    "num_heads": "index heads (None for a selection alone)",
    "blocks": "the block sizes the call took (None: not a kernel call)",
    "device_s": "device seconds per call (the profiler), this stage's",
    "wall_s": "median host wall seconds per call (call rows only)",
    "sync_floor_s": "median wall seconds of an empty jitted call, same "
                    "process: the host's floor under wall_s (call rows)",
    "compile_s": "seconds to lower and compile the call (call rows)",
    "repeats": "timed calls behind wall_s; profiled calls behind device_s",
    "check": "the result against the rule or the reference (call rows)",
    "date": "UTC time of the measurement (ISO 8601)",
    "command": "the command that measured it",
    "jax": "jax version", "libtpu": "libtpu version",
    "commit": "git commit of the checkout that ran (`checkout_commit`), or "
              "None: not recorded (chip rows and experiments before "
              "2026-12-07)",
}
TEST_RUN_FIELDS: Mapping[str, str] = {
    "chip": "TPU generation", "device_kind": "jax's device_kind",
    "passed": "tests passed", "failed": "tests failed (errors included)",
    "skipped": "tests skipped", "wall_s": "wall seconds of the run",
    "date": "UTC time (ISO 8601)", "command": "the command",
    "jax": "jax version", "libtpu": "libtpu version",
    "commit": CHIP_FIELDS["commit"],
    "interrupted": "cut short (a timeout, Ctrl-C): its counts are the tests "
                   "that finished",
    "tier_tests": "the tier's tests, those deselected by -k included (None: "
                  "not recorded)",
    "outcomes": "{test id: 'passed' | 'failed' | 'skipped'} of the tests that "
                "finished (None: not recorded)",
}
# One experiment on the lean kernel's scoring launches (`lab.bench.ablate`)
# or on blocktop's kernel (`lab.bench.ablate_select`, variant "blocktop").
EXPERIMENT_FIELDS: Mapping[str, str] = {
    "experiment": "its name (lab.bench.ablate.EXPERIMENTS, or "
                  "ablate_select's)",
    "removed": "the pieces of work left out (kernels.lean.ABLATIONS; "
               "blocktop: 'finish' and topk.blocktop.ABLATIONS)",
    "inputs": "what it ran on besides the shipped call's arguments "
              "(lab.bench.ablate.Experiment.inputs), or None: those alone",
    "cache_bytes": "HBM bytes of the cache it read from, as stored "
                   "(lab.model.tiling.Geometry.cache_bytes); None: blocktop's",
    **{f: CHIP_FIELDS[f] for f in ("blocks", "chip", "device_kind", "shape")},
    "variant": "streamidx.VARIANTS name, or 'blocktop': the selection's "
               "kernel alone",
    **{f: CHIP_FIELDS[f] for f in ("cache_format", "num_heads")},
    "page_size": "entries per cache page",
    "device_s": "device seconds per call of the scoring ops (profiler; "
                "blocktop: the whole program)",
    "ops": "[name, calls, device seconds] per call of each op counted",
    "grid_steps": "programs (lab.model.tiling.plan; blocktop: its groups "
                  "of 8 rows)",
    "kv_steps": "KV-loop trips (the plan's; blocktop: its tiles of 8 rows)",
    "kv_step_s": "device s / step",
    "hbm_bytes": "HBM bytes the shipped kernel moves at these blocks "
                 "(lab.model.roofline.costs, its kernel stage; blocktop: "
                 "the score buffer once)",
    "hbm_s": "their time at the chip's HBM bandwidth (roofline.bounds)",
    "ratio": "device_s / hbm_s",
    **{f: CHIP_FIELDS[f] for f in ("compile_s", "repeats", "date", "command",
                                   "jax", "libtpu", "commit")},
}
_MODES = ("decode", "prefill", "page", "selection")

# The lean kernel issued the next block's DMAs after this block's loads on
# every chip until LATE_ISSUE_UNTIL, and kept one block in flight until
# PREFETCH_2_UNTIL; since, on the v5e (`kernels.lean.DEEP_QUEUE_CHIPS`), it
# issues right after the wait and keeps two: experiments and calls recorded
# before ran the lean kernel of then (`removed_now`).
LATE_ISSUE_UNTIL = "2026-12-06T20:40:00+00:00"
PREFETCH_2_UNTIL = "2026-12-06T22:05:00+00:00"


def removed_now(removed: Iterable[str], date: str) -> frozenset[str]:
  """The pieces of today's lean kernel (`kernels.lean.ABLATIONS`) that an
  experiment recorded at `date` (ISO 8601, UTC) with `removed` left out:
  before `LATE_ISSUE_UNTIL` the kernel issued late, so "early_issue" too,
  unless it removed "late_issue" (that order's name then for the early
  issue); before `PREFETCH_2_UNTIL` "prefetch_2" was a change added, not a
  piece removed, so it swaps: one block ahead then is "prefetch_2" removed
  now, and "prefetch_2" then is today's kernel."""
  removed = set(removed)
  if date < LATE_ISSUE_UNTIL:
    if "late_issue" in removed:
      removed.remove("late_issue")
    else:
      removed.add("early_issue")
  if date < PREFETCH_2_UNTIL:
    removed ^= {"prefetch_2"}
  return frozenset(removed)


def as_shipped(experiment: Mapping[str, Any]) -> bool:
  """Whether an experiment row timed today's shipped call: nothing removed
  (`removed_now`) and nothing beside its arguments (its "inputs")."""
  return (not removed_now(experiment["removed"], experiment["date"])
          and experiment["inputs"] is None)


def checkout_commit() -> str | None:
  """The commit a measurement ran: `STREAMIDX_COMMIT` (a TPU host's copy of
  the checkout has no .git), else the checkout's `git rev-parse --short
  HEAD`, else None."""
  if os.environ.get("STREAMIDX_COMMIT"):
    return os.environ["STREAMIDX_COMMIT"]
  root = Path(__file__).resolve().parents[1]
  if not (root / ".git").exists():
    return None
  try:
    return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=root,
                          capture_output=True, text=True, check=True,
                          timeout=10).stdout.strip() or None
  except (OSError, subprocess.SubprocessError):
    return None


def path(name: str) -> Path:
  """The file `name` (a key of `FILES`) as a filesystem path: in the
  installed package `streamidx.data`, else (a checkout on PYTHONPATH, as on
  a TPU host) in the checkout's `data/`."""
  if name not in FILES:
    raise ValueError(f"name: must be one of {tuple(FILES)} (got {name!r})")
  try:
    folder = Path(str(importlib.resources.files("streamidx.data")))
  except ModuleNotFoundError:
    folder = Path(__file__).resolve().parents[1] / "data"
  return folder / FILES[name]


@functools.lru_cache(maxsize=None)
def load(name: str) -> dict:
  """The parsed file `name`, read once per process (`save` forgets it)."""
  return json.loads(path(name).read_text(encoding="utf-8"))


def save(name: str, doc: Mapping[str, Any]) -> Path:
  """Writes `doc` as file `name` (indent 1, UTF-8, a final newline), whole
  or not at all (a run stopped mid-write leaves the last complete file)."""
  p = path(name)
  tmp = p.with_name(p.name + ".tmp")
  tmp.write_text(json.dumps(doc, indent=1, ensure_ascii=False) + "\n",
                 encoding="utf-8")
  os.replace(tmp, p)
  load.cache_clear()
  return p


def chip_rows(of: str = "rows", **match) -> list[dict]:
  """The chip's rows (list `of`: "rows" or "experiments") whose fields
  equal every `match` (a value, or a tuple of accepted values), in
  recorded order."""
  def ok(row):
    return all(row.get(f) in (v if isinstance(v, tuple) else (v,))
               for f, v in match.items())
  return [r for r in load("chip").get(of, []) if ok(r)]


def calls(**match) -> list[dict]:
  """The recorded calls whose "call" row matches `match` (`chip_rows`'
  rule), each that row with "parts": {part: device seconds}, the newest
  last: what a notebook quotes as measured."""
  parts: dict = {}
  for r in chip_rows():
    parts.setdefault(r["run"], {})[r["stage"]] = r["device_s"]
  return [dict(r, parts={p: parts[r["run"]].get(p) for p in PARTS})
          for r in chip_rows(stage="call", **match)]


def block_kwargs(row: Mapping[str, Any]) -> dict | None:
  """A recorded row's `blocks` as the kernels take them (JSON's lists as
  tuples), or None where it has none."""
  b = row.get("blocks")
  return None if b is None else {
      n: tuple(v) if isinstance(v, list) else v for n, v in b.items()}


def test_runs() -> list[dict]:
  """Every recorded `make test-tpu` run, oldest first."""
  return list(load("chip")["test_runs"])


OUTCOMES = ("passed", "failed", "skipped")  # a tier test's, as recorded


def outcome_counts(outcomes: Mapping[str, str]) -> dict[str, int]:
  """{outcome: how many tests had it} of {test id: outcome}."""
  return {o: sum(v == o for v in outcomes.values()) for o in OUTCOMES}


def tier_outcomes(runs: Iterable[Mapping[str, Any]]) -> dict[str, str]:
  """{test id: its newest outcome} over `runs` (oldest first; a run cut
  short counts the tests it finished; runs without outcomes add none)."""
  newest: dict[str, str] = {}
  for r in runs:
    newest.update(r.get("outcomes") or {})
  return newest


def _number(v) -> bool:
  return isinstance(v, (int, float)) and not isinstance(v, bool) and v >= 0


def chip_problems(row: Mapping[str, Any], fields=CHIP_FIELDS) -> list[str]:
  """What is wrong with one chip row (or, with `TEST_RUN_FIELDS` or
  `EXPERIMENT_FIELDS`, one test run or experiment): missing or unknown
  keys, a stage or mode outside its set, a time that is not a non-negative
  number; [] when it is right."""
  out = [f"missing {f!r}" for f in fields if f not in row]
  out += [f"unknown key {f!r}" for f in row if f not in fields]
  if fields is EXPERIMENT_FIELDS:
    return out + [f"{f}: must be a non-negative number (got {row.get(f)!r})"
                  for f in ("device_s", "hbm_s", "ratio", "kv_step_s")
                  if not _number(row.get(f))]
  if fields is TEST_RUN_FIELDS:
    outcomes = row.get("outcomes") or {}
    return out + [f"{f}: not a count" for f in OUTCOMES
                  if f in row and not isinstance(row[f], int)] + [
        f"outcomes: {t!r} is {o!r}, not passed, failed or skipped"
        for t, o in outcomes.items() if o not in OUTCOMES] + (
        ["outcomes: its counts differ from passed, failed and skipped"]
        if outcomes and outcome_counts(outcomes)
        != {f: row.get(f) for f in OUTCOMES} else [])
  if row.get("stage") not in STAGES:
    out.append(f"stage: must be one of {STAGES} (got {row.get('stage')!r})")
  if row.get("mode") not in _MODES:
    out.append(f"mode: must be one of {_MODES} (got {row.get('mode')!r})")
  if not _number(row.get("device_s")):
    out.append(f"device_s: must be seconds (got {row.get('device_s')!r})")
  call = row.get("stage") == "call"
  for f in ("wall_s", "sync_floor_s", "compile_s"):
    v = row.get(f)
    if (call and not _number(v)) or (not call and v is not None):
      out.append(f"{f}: {'seconds on a call row' if call else 'None on a part'}"
                 f" (got {v!r})")
  return out


def append_chip(rows: Iterable[Mapping[str, Any]] = (),
                runs: Iterable[Mapping[str, Any]] = (),
                experiments: Iterable[Mapping[str, Any]] = ()) -> Path:
  """Appends chip rows, test runs and experiments to the chip file, after
  checking every one (ValueError naming the first bad row and its problems;
  nothing is written then). A call's parts must sum to its device time."""
  rows, runs = [dict(r) for r in rows], [dict(r) for r in runs]
  exps = [dict(r) for r in experiments]
  for name, rs, fields in (("rows", rows, CHIP_FIELDS),
                           ("runs", runs, TEST_RUN_FIELDS),
                           ("experiments", exps, EXPERIMENT_FIELDS)):
    for i, r in enumerate(rs):
      if bad := chip_problems(r, fields):
        raise ValueError(f"{name}[{i}]: {'; '.join(bad)}")
  for run in {r["run"] for r in rows if r["stage"] == "call"}:
    whole = next(r["device_s"] for r in rows
                 if r["run"] == run and r["stage"] == "call")
    parts = sum(r["device_s"] for r in rows
                if r["run"] == run and r["stage"] != "call")
    if abs(parts - whole) > 1e-9 + 1e-6 * whole:
      raise ValueError(f"rows: the parts of run {run!r} sum to {parts} s, "
                       f"not its device_s {whole} s")
  doc = dict(load("chip"))
  doc["rows"] = doc["rows"] + rows
  doc["test_runs"] = doc["test_runs"] + runs
  doc["experiments"] = doc.get("experiments", []) + exps
  return save("chip", doc)
