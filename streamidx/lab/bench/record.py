"""Measuring on a TPU into the records (`python -m streamidx.bench --record`).

A point is one call at one shape: a kernel variant with a cache format and a
top-k method, or the selection alone (`select_topk` over a score buffer).
`measure` compiles it (timed), checks its result (a call against its
reference, tie-aware at `metrics.summation_atol`; a selection against the
rule's NumPy oracle, `bench.oracle.topk_rule`), times `repeats` synchronous
calls (wall, beside the process's sync floor: an empty jitted call) and
profiles `iterations` more (`profiling.stage_times`: the device time and
its parts), and returns the rows `streamidx.records` keeps: one "call" row
and one per part (`records.PARTS`), which sum to it.

    python -m streamidx.bench --record [--points NAME ...] [--dry-run]
    python -m streamidx.bench --records [--json]     what is recorded

`POINTS` names every point the records are meant to hold (the chip issue's
list); `--points` takes names or shell-style patterns of them.
"""

from __future__ import annotations

import dataclasses
import datetime
import fnmatch
import functools
import gc
import importlib.metadata as md
import json
import math
import re
import statistics
import sys
import time
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

import streamidx as si
from streamidx import cache as cache_lib
from streamidx import metrics, modes, records, topk
from streamidx import variants as variants_lib
from streamidx.lab import shapes as shapes_lib
from streamidx.lab import tables
from streamidx.lab.bench import harness, oracle
from streamidx.lab.bench import topk as topk_bench
from streamidx.lab.model import profiling

calls = records.calls  # what notebooks quote as `record.calls`

# make_inputs keeps the f32 keys on the device: past this many entries of
# cache the point builds its cache a few pages at a time and is not checked.
# MXFP4's quantisation holds more f32 copies: at 2**22 entries it asked the
# v5e's 15.7 GiB for 2 GiB more than was free (2026-12-06).
CHECK_MAX_ENTRIES = {"mxfp4": 2**21}
CHECK_MAX_DEFAULT = 2**23


def _check_max(fmt: str | None) -> int:
  return CHECK_MAX_ENTRIES.get(fmt, CHECK_MAX_DEFAULT)


@dataclasses.dataclass(frozen=True)
class Point:
  """What one measurement runs: `shape` (a `lab.shapes.Shape`: decode
  sequences or a prefill chunk; for a selection alone, its rows and
  entries), `variant` and `cache_format` (None: the selection alone over a
  score buffer), `method` (page mode: "top_k")."""

  shape: shapes_lib.Shape
  variant: str | None
  cache_format: str | None
  method: str

  @property
  def mode(self) -> str:
    if self.variant is None:
      return "selection"
    return "page" if variants_lib.get(self.variant).mode == "page" else (
        self.shape.kind)

  @property
  def name(self) -> str:
    what = (f"{self.variant}:{self.cache_format}" if self.variant
            else "select")
    return f"{self.shape.name}/{what}/{self.method}/k{self.shape.k}"


def decode_shape(seqs, tokens, k=512, **kw):
  """DeepSeek-V4 decode, `seqs` sequences of `tokens` tokens, named
  dsv4-decode-SEQSxTOKENS."""
  return shapes_lib.Shape(f"dsv4-decode-{seqs}x{tokens}", "decode", seqs, 1,
                          tokens, k, **kw)


def _select(rows, entries, k):
  return shapes_lib.Shape(f"select-{rows}x{entries}", "decode", rows, 1,
                          entries * shapes_lib.DSV4.compression_ratio, k)


_TOKEN = (("vendored", "fp8"), ("dense", "dense_fp8"), ("lean", "dense_fp8"),
          ("inline", "inline_fp8"), ("fp4", "mxfp4"))
_PAGE = (("vendored_page", "fp8"), ("dense_page", "dense_fp8"),
         ("lean_page", "dense_fp8"), ("fp4_page", "mxfp4"))
_GLM = shapes_lib.GLM_PAGE
GLM_PAGE_DECODE = shapes_lib.Shape(
    "glm-page-decode-64x65536", "decode", 64, 1, 65536, 2048 // _GLM.page_size,
    num_heads=_GLM.num_heads, head_dim=_GLM.head_dim,
    compression_ratio=_GLM.compression_ratio, page_size=_GLM.page_size)

# Selection alone: every method that reads the score buffer only
# ("fused_blockmax" alone is "blockmax"; it is measured inside the calls).
_SELECTIONS = tuple(m for m in topk.TOPK_METHODS if topk.METHODS[m].needs is None)

# The points the records are meant to hold, in the order to measure them.
POINTS: tuple[Point, ...] = (
    *(Point(_select(r, e, k), None, None, m)
      for r, e in ((64, 65536), (64, 262144), (64, 16384), (2048, 262144))
      for k in (512, 2048) for m in _SELECTIONS),
    *(Point(s, v, f, m)
      for s in (decode_shape(64, 262144), decode_shape(64, 65536),
                decode_shape(64, 2**20),
                shapes_lib.Shape("dsv4-prefill-2048x1048576", "prefill", 1,
                                 2048, 2**20, 512))
      for v, f in _TOKEN for m in ("blocktop", "sort")),
    *(Point(GLM_PAGE_DECODE, v, f, "top_k") for v, f in _PAGE),
)


def points(patterns: Sequence[str] | None = None) -> list[Point]:
  """The `POINTS` whose name matches one of `patterns` (fnmatch; None: all);
  ValueError naming a pattern that matches none."""
  if not patterns:
    return list(POINTS)
  out = []
  for pat in patterns:
    hit = [p for p in POINTS if fnmatch.fnmatchcase(p.name, pat)]
    if not hit:
      raise ValueError(f"--points: {pat!r} matches no point (see --dry-run)")
    out += [p for p in hit if p not in out]
  return out


def missing(todo: Sequence[Point], chip: str) -> list[Point]:
  """The points of `todo` with no "call" row recorded on `chip`: what a run
  interrupted (or a session's device time) left to measure."""
  done = {(r["shape"], r["variant"], r["cache_format"], r["method"], r["k"])
          for r in records.chip_rows(stage="call", chip=chip)}
  return [p for p in todo if (p.shape.name, p.variant, p.cache_format,
                              p.method, p.shape.k) not in done]


# -- inputs ---------------------------------------------------------------


# A call's inputs and its reference's answer are kept for the next point of
# the same shape, variant and format (POINTS orders them so: one of each
# method), and only for it: HBM holds one call's inputs at a time.
@functools.lru_cache(maxsize=1)
def _inputs(s: shapes_lib.Shape, variant: str, fmt: str):
  """(kernel arguments, `IndexerInputs` to check against or None)."""
  v = variants_lib.get(variant)
  b = s.batch()
  if b.total_num_pages * s.page_size <= _check_max(fmt):
    inp = si.make_inputs(b, num_heads=s.num_heads, head_dim=s.head_dim,
                         fmt=fmt)
    return v.args(inp, fmt), inp
  return entry_args(s, variant, fmt), None


def random_cache(total_pages: int, page_size: int, head_dim: int = 128,
                 fmt: str = "fp8", *, seed: int = 0,
                 pages_per_step: int = 256) -> tuple:
  """A seeded N(0, 1) cache in `fmt` (`cache.CACHE_FORMATS`): the tuple of
  its arrays, packed gcd(total_pages, pages_per_step) pages at a time in one
  `lax.map` (keys of group i from `fold_in(key(seed), i)`, the same keys in
  every format): one group's f32 keys (16 MiB) beside the packed cache, not
  8 GiB of them at 64 x 256K entries."""
  step = math.gcd(total_pages, pages_per_step)
  layout = cache_lib.CACHE_FORMATS[fmt]

  @jax.jit
  def build(key):
    def group(i):
      keys = jax.random.normal(jax.random.fold_in(key, i),
                               (step, page_size, head_dim), jnp.float32)
      return tuple(layout.pack(keys))
    out = jax.lax.map(group, jnp.arange(total_pages // step))
    return tuple(a.reshape((total_pages,) + a.shape[2:]) for a in out)

  return build(jax.random.key(seed))


def entry_args(s: shapes_lib.Shape, variant: str, fmt: str, *,
               seed: int = 0) -> tuple:
  """`variant`'s entry-point arguments at shape `s` in format `fmt`, built
  on the device with no f32 keys beside the cache (nothing to check
  against): q and weights drawn as `batch.make_inputs` draws them, the
  cache's arrays from `random_cache`."""
  b = s.batch()
  rng = np.random.default_rng(seed)
  t, h, d = b.num_tokens, s.num_heads, s.head_dim
  q = rng.standard_normal((t, h, d), np.float32)
  w = np.abs(rng.standard_normal((t, h), np.float32)) / np.sqrt(h)
  cache = random_cache(b.total_num_pages, s.page_size, d, fmt, seed=seed + 1)
  *meta, distribution = b.kernel_arrays()
  last = (distribution if variants_lib.get(variant).mode == "token"
          else jnp.int32(b.num_seqs))
  return (jnp.asarray(q).astype(jnp.bfloat16), jnp.asarray(w), *cache,
          *meta, last)


def _check_call(point: Point, got, inputs, kw) -> dict:
  """The call's indices against its reference, tie-aware (None: not
  checked, with why)."""
  if inputs is None:
    return {"ok": None, "detail": f"not checked: over "
            f"{_check_max(point.cache_format):,} "
            "cache entries the f32 keys do not fit beside the cache"}
  kw = {n: x for n, x in kw.items() if n != "topk_method"}  # not the ref's
  want, scores, atol = _expected(point.shape, point.variant,
                                 point.cache_format, **kw)
  c = metrics.compare_topk(got, want, scores, atol=atol)
  return {"ok": bool(c.ok), "rows": c.rows, "rows_identical": c.rows_identical,
          "rows_tied": c.rows_tied, "rows_mismatched": c.rows_mismatched,
          "atol": atol, "detail": "" if c.ok else c.detail}


@functools.lru_cache(maxsize=1)
def _expected(s: shapes_lib.Shape, variant: str, fmt: str, **kw):
  """(the reference's indices, its masked scores, the tie tolerance) of the
  call `_inputs(s, variant, fmt)` makes with keywords `kw`."""
  v, inputs = variants_lib.get(variant), _inputs(s, variant, fmt)[1]
  return (np.asarray(v.reference(*v.args(inputs, fmt), **kw)),
          np.asarray(v.scores(inputs, compression_ratio=s.compression_ratio,
                              fmt=fmt)),
          metrics.summation_atol(inputs, compression_ratio=s.compression_ratio,
                                 mode=v.mode))


@functools.lru_cache(maxsize=1)
def _score_buffer(rows: int, entries: int):
  """(NumPy, device) score buffer of a selection point: the points at one
  size share it (generating 2 GiB takes the host seconds)."""
  x = topk_bench.score_buffer(_select(rows, entries, 1))
  return x, jnp.asarray(x)


@functools.lru_cache(maxsize=2)
def _rule(rows: int, entries: int, k: int) -> np.ndarray:
  return oracle.topk_rule(_score_buffer(rows, entries)[0], k)


# -- measuring ------------------------------------------------------------


def versions() -> dict:
  """jax, libtpu and the checkout's commit (`records.checkout_commit`):
  what a chip row, experiment or test run ran with."""
  out = {"jax": jax.__version__, "libtpu": None,
         "commit": records.checkout_commit()}
  for pkg in ("libtpu", "libtpu-nightly"):
    try:
      out["libtpu"] = md.version(pkg)
      break
    except md.PackageNotFoundError:
      pass
  return out


@functools.lru_cache(maxsize=None)
def sync_floor(repeats: int = 50) -> float:
  """Median wall seconds of an empty jitted call, waited for: what every
  synchronous call costs this host whatever it does."""
  f = jax.jit(lambda x: x + 1)
  x = jnp.zeros((8, 128), jnp.float32)
  jax.block_until_ready(f(x))
  walls = []
  for _ in range(repeats):
    t0 = time.perf_counter()
    jax.block_until_ready(f(x))
    walls.append(time.perf_counter() - t0)
  return statistics.median(walls)


def _compiled(point: Point):
  """(compile seconds, the blocking call, the check's inputs) of `point`."""
  s = point.shape
  if point.variant is None:
    x, x_dev = _score_buffer(s.rows, s.entries)
    (fn, args), kw = topk_bench.selection_call(x_dev, s.k, point.method), {}
    check = functools.partial(topk_bench.check_selection,
                              want=_rule(s.rows, s.entries, s.k), scores=x,
                              method=point.method)
  else:
    args, inputs = _inputs(s, point.variant, point.cache_format)
    v = variants_lib.get(point.variant)
    kw = dict(s.kernel_kwargs())
    if v.mode == "page":
      kw = {"k_pages": s.k, "compression_ratio": s.compression_ratio}
    else:
      kw["topk_method"] = point.method
    fn = v.kernel
    check = functools.partial(_check_call, point, inputs=inputs, kw=kw)
  info, call = harness.compile_call(fn, args, kw)
  return info["compile_s"], call, check


def call_rows(point: Point, times: dict, *, wall: dict, compile_s: float,
              floor: float, repeats: int, iterations: int, check: dict,
              run: str, date: str, command: str, chip: str | None,
              device_kind: str, versions: dict, blocks=None) -> list[dict]:
  """The records' rows of one measured call: "call" (device, wall and
  compile time, the check) and one per part of `times`
  (`profiling.stage_times`), which sum to the call's device time."""
  s = point.shape
  page = point.mode == "page"
  common = dict(
      run=run, chip=chip, device_kind=device_kind, shape=s.name,
      mode=point.mode, variant=point.variant, cache_format=point.cache_format,
      method=point.method, rows=s.rows,
      tokens=None if point.variant is None else s.seq_len,
      entries=s.pages if page else s.entries, k=s.k,
      num_heads=None if point.variant is None else s.num_heads,
      blocks=blocks, date=date, command=command, **versions)
  out = [dict(common, stage="call", device_s=times["total_s"],
              wall_s=wall["median"], sync_floor_s=floor, compile_s=compile_s,
              repeats={"wall": repeats, "device": iterations}, check=check)]
  out += [dict(common, stage=p, device_s=times[f"{p}_s"], wall_s=None,
               sync_floor_s=None, compile_s=None, repeats=None, check=None)
          for p in records.PARTS]
  return [{f: r[f] for f in records.CHIP_FIELDS} for r in out]


def measure(point: Point, *, repeats: int = 20, iterations: int = 5,
            command: str = "", run: str | None = None,
            trace_dir: str | None = None) -> tuple[list[dict], dict]:
  """(the records' rows, the profile's op table) of one point on this
  machine. Off a TPU the device times are None (the profile has no device
  lines) and `records.append_chip` refuses the rows."""
  dev = jax.devices()[0]
  chip = modes.device_generation(dev)
  date = datetime.datetime.now(datetime.timezone.utc).isoformat(
      timespec="seconds")
  compile_s, call, check = _compiled(point)
  got, res = harness.measure(call, repeats)
  got = got[0] if isinstance(got, tuple) else got
  checked = check(np.asarray(got))
  # A program of `select_topk` alone: what no scope names (radix's
  # scatter) is the selection's.
  times = profiling.profile(
      call, iterations=iterations, trace_dir=trace_dir,
      unnamed="selection" if point.variant is None else "other")
  blocks = None
  if point.variant is not None:
    s = point.shape
    blocks = shapes_lib.table_blocks(s, point.variant, point.cache_format,
                                   chip).kwargs()
  rows = call_rows(point, times, wall=res["wall_s"], compile_s=compile_s,
                   floor=sync_floor(), repeats=repeats, iterations=iterations,
                   check=checked, run=run or f"{date} {point.name}", date=date,
                   command=command, chip=chip,
                   device_kind=getattr(dev, "device_kind", ""),
                   versions=versions(), blocks=blocks)
  return rows, {"point": point.name, "source": times["source"],
                "ops": times["ops"][:40]}


# -- the command line -----------------------------------------------------


def call_table(rows: Sequence[dict]) -> list[dict]:
  """One dict per measured call (its "call" row), its parts' device times
  beside it, in milliseconds, for `tables.markdown` / `format_rows`."""
  parts = {(r["run"], r["stage"]): r["device_s"] for r in rows}
  ms = lambda s: None if s is None else round(s * 1e3, 3)  # pylint: disable=unnecessary-lambda-assignment
  out = []
  for r in rows:
    if r["stage"] != "call":
      continue
    chk = r["check"] or {}
    out.append({
        "chip": r["chip"], "shape": r["shape"],
        "variant": r["variant"] or "-", "format": r["cache_format"] or "-",
        "method": r["method"], "k": r["k"], "device ms": ms(r["device_s"]),
        **{f"{p} ms": ms(parts.get((r["run"], p))) for p in records.PARTS},
        "wall ms": ms(r["wall_s"]), "sync floor ms": ms(r["sync_floor_s"]),
        "compile s": round(r["compile_s"], 1),
        "check": ("ok" if chk.get("ok") else "not checked"
                  if chk.get("ok") is None else "WRONG"),
        "date": r["date"][:10]})
  return out


def experiment_table(rows: Sequence[dict]) -> list[dict]:
  """One dict per recorded experiment (`lab.bench.ablate`), grouped by chip
  and shape (each group in the order of its first row), in record order
  within a group; "removed": from today's kernel (`records.removed_now`: a
  row from before its early issue or second block in flight ran without
  them)."""
  first = {}
  for r in rows:
    first.setdefault((r["chip"], r["shape"]), len(first))
  rows = sorted(rows, key=lambda r: first[r["chip"], r["shape"]])
  return [{
      "chip": r["chip"], "shape": r["shape"], "experiment": r["experiment"],
      "removed": ", ".join(sorted(records.removed_now(r["removed"], r["date"])))
                 or "-",
      "kv pages": r["blocks"].get("num_kv_pages_per_block", ["-"])[0],
      "batch": r["blocks"].get("decode_req_batch_size", "-"),
      "device ms": round(r["device_s"] * 1e3, 3),
      "HBM ms": round(r["hbm_s"] * 1e3, 3), "/ HBM": round(r["ratio"], 2),
      "grid steps": r["grid_steps"], "KV steps": r["kv_steps"],
      "us / KV step": round(r["kv_step_s"] * 1e6, 3),
      "compile s": round(r["compile_s"], 1), "date": r["date"][:10]}
          for r in rows]


def tier_coverage(runs: Sequence[dict]) -> list[str]:
  """[] or one sentence: each tier test's newest outcome over `runs` (one
  chip's, oldest first; those that recorded outcomes, interrupted ones
  included: a test that finished is a result)."""
  runs = [r for r in runs if r.get("outcomes") is not None]
  if not runs:
    return []
  newest = records.tier_outcomes(runs)
  count = records.outcome_counts(newest)
  total = runs[-1]["tier_tests"]
  dates = sorted({r["date"][:10] for r in runs})
  commits = sorted({(r["commit"] or "?")[:7] for r in runs})  # short hashes
  return [f"the TPU tier's {total} tests, each one's newest result on the "
          f"chip: {count['passed']} passed, {count['failed']} failed, "
          f"{count['skipped']} skipped, {total - len(newest)} not yet run "
          f"({len(runs)} run{'s' * (len(runs) > 1)}, "
          f"{sum(bool(r['interrupted']) for r in runs)} cut short, "
          f"{sum(r['wall_s'] for r in runs):,.0f} s in all; "
          f"{', '.join(dates)}; commit "
          f"{', '.join(commits)})"]


def summary() -> str:
  """What ran on which chip, from the records: one sentence per chip (the
  calls measured, the newest `make test-tpu` run of each selection of its
  tests: the whole tier, or each part run alone with `-k`; a line each), or
  that none did."""
  rows, runs = records.chip_rows(stage="call"), records.test_runs()
  if not rows and not runs:
    return ("No TPU measurement is recorded yet (`python -m streamidx.bench "
            "--records`).")
  out = []
  for chip in sorted({r["chip"] for r in rows} | {r["chip"] for r in runs}):
    mine = [r for r in rows if r["chip"] == chip]
    newest = {}  # -k expression (None: the whole tier) -> its newest run
    for t in (r for r in runs if r["chip"] == chip  # whole runs of a part
              and not r.get("interrupted")
              and not r["command"].startswith("STREAMIDX_TIER_RESUME")):
      sub = re.search(r" -k (.+?)(?: -p |$)", t["command"])
      newest.pop(sub and sub.group(1), None)
      newest[sub and sub.group(1)] = t
    any_ = (mine or list(newest.values()))[0]
    parts = [f"On a TPU {chip} ({any_['device_kind']}; jax {any_['jax']}, "
             f"libtpu {any_['libtpu']})"]
    if mine:
      dates = sorted({r["date"][:10] for r in mine})
      oks = [(r["check"] or {}).get("ok") for r in mine]
      measured = len(POINTS) - len(missing(POINTS, chip))
      parts.append(f"{len(mine)} calls were measured ({', '.join(dates)}; "
                   f"{len({r['shape'] for r in mine})} shapes, "
                   f"{sum(1 for r in mine if r['variant'])} kernel calls and "
                   f"{sum(1 for r in mine if not r['variant'])} selections "
                   f"alone: {measured} of the "
                   f"{len(POINTS)} points `--record` names; "
                   f"{oks.count(False)} disagreeing with the rule or "
                   f"reference, {oks.count(None)} not checked)")
    for sub, t in newest.items():
      parts.append(f"the last `make test-tpu` ({t['date'][:10]}"
                   + (f", only the tests `-k {sub}`" if sub else "")
                   + f") had {t['passed']} passed, {t['failed']} failed, "
                   f"{t['skipped']} skipped in {t['wall_s']:.0f} s")
    parts += tier_coverage([r for r in runs if r["chip"] == chip])
    out.append(f"{parts[0]}: " + ";\n  ".join(parts[1:]) + "."
               if len(parts) > 1 else parts[0] + ".")
  return "\n".join(out)


def main(argv: Sequence[str]) -> int:
  import argparse  # pylint: disable=g-import-not-at-top
  p = argparse.ArgumentParser(
      prog="python -m streamidx.bench --record",
      description="Measure points on this TPU and append them to the chip "
      "records (streamidx/lab/bench/record.py); --records prints them.")
  p.add_argument("--points", nargs="+", metavar="NAME",
                 help="point names or fnmatch patterns (default: all)")
  p.add_argument("--repeats", type=int, default=20)
  p.add_argument("--iterations", type=int, default=5)
  p.add_argument("--missing", metavar="CHIP",
                 help="only the points with no call recorded on CHIP "
                 "(e.g. v5e): resume where the records stop")
  p.add_argument("--dry-run", action="store_true",
                 help="list the points, measure nothing")
  p.add_argument("--ops", metavar="FILE", help="also write each point's "
                 "profile op table (JSON lines) to FILE")
  a = p.parse_args(argv)
  try:
    todo = points(a.points)
  except ValueError as e:
    p.error(str(e))
  if a.missing:
    todo = missing(todo, a.missing)
  if a.dry_run:
    print("\n".join(pt.name for pt in todo))
    return 0
  dev = jax.devices()[0]
  if modes.device_generation(dev) is None:
    p.error(f"measures on a TPU: this process's device is {dev.platform} "
            f"({getattr(dev, 'device_kind', '')}); the records hold chip "
            f"measurements only")
  command = " ".join(["python -m streamidx.bench --record", *argv])
  bad = 0
  for i, pt in enumerate(todo):
    if i and (pt.shape, pt.variant) != (todo[i - 1].shape, todo[i - 1].variant):
      _inputs.cache_clear()  # HBM holds one call's inputs at a time
      _expected.cache_clear()
    gc.collect()  # the last point's arrays
    t0 = time.perf_counter()
    try:
      rows, ops = measure(pt, repeats=a.repeats, iterations=a.iterations,
                          command=command)
    except Exception as e:  # pylint: disable=broad-except
      print(f"{pt.name}: FAILED {type(e).__name__}: {str(e)[:400]}",
            file=sys.stderr, flush=True)
      bad += 1
      continue
    records.append_chip(rows)
    if a.ops:
      with open(a.ops, "a", encoding="utf-8") as f:
        f.write(json.dumps(ops) + "\n")
    ok = rows[0]["check"]["ok"]
    bad += ok is False
    print(f"{pt.name}: device {rows[0]['device_s'] * 1e3:.3f} ms, wall "
          f"{rows[0]['wall_s'] * 1e3:.3f} ms, compile {rows[0]['compile_s']:.1f}"
          f" s, check {ok} ({time.perf_counter() - t0:.0f} s)", flush=True)
  return 1 if bad else 0


def print_records(argv: Sequence[str]) -> int:
  """`--records [--json | --markdown | --summary | --experiments [--json]]`:
  every recorded row (JSON lines), the calls as a Markdown table, what ran
  where in a sentence (`summary`), the experiments (`lab.bench.ablate`) as
  a Markdown table (or JSON lines); by default the calls as a text table."""
  rows = records.chip_rows()
  if "--experiments" in argv:
    rows = records.chip_rows("experiments")
    if "--json" in argv:
      print("\n".join(json.dumps(r) for r in rows))
    else:
      print(tables.markdown(experiment_table(rows)) if rows else
            "(no experiment recorded yet: `python -m streamidx.bench "
            "--ablate` on a TPU)")
    return 0
  if "--json" in argv:
    for r in rows:
      print(json.dumps(r))
  elif "--summary" in argv:
    print(summary())
  elif "--markdown" in argv:
    print(tables.markdown(call_table(rows)) if rows else "(no rows)")
  else:
    print(tables.format_rows(call_table(rows)))
  return 0
