"""The top-k stage (`--topk`, docs/benchmarks.md): the reference and every
`streamidx.topk` method timed on this machine, each checked row by row
against the rule's NumPy oracle (`bench.oracle.topk_rule`); `--json`,
`--table`: the TensorCore bundles each one's compiled selection executes
per generation at `COUNT_SHAPES`, from data/step_schedule.json
(`--compile` records the missing ones).
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import sys
from pathlib import Path
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from streamidx import metrics, modes, ref, topk
from streamidx.lab import calibration, tables
from streamidx.lab import shapes as shapes_lib
from streamidx.lab.bench import harness, oracle
from streamidx.lab.model import roofline
from streamidx.lab.model import topk as topk_model

# /4: every result checked against the rule's NumPy oracle (`check_selection`:
# `ok`, `rows_identical`; "approx" its `recall`).
SCHEMA = "streamidx.bench.topk/4"
# The timing's shapes: decode B=64 at 128K and 1M tokens, ratio 4, k 512.
SHAPES = (shapes_lib.DSV4_DECODE_128K, shapes_lib.DSV4_DECODE_1M)
# The bundle counts' (issue 38): decode, 64 rows x 262,144 entries at k 512,
# 1,024 and 2,048; prefill, 2,048 rows x 262,144 at k 512.
COUNT_SHAPES = (
    shapes_lib.DSV4_DECODE_1M,
    dataclasses.replace(shapes_lib.DSV4_DECODE_1M, k=1024),
    dataclasses.replace(shapes_lib.DSV4_DECODE_1M, k=2048),
    shapes_lib.Shape("dsv4 prefill 2048 @1M", "prefill", 1, 2048, 2**20, 512))
GENERATIONS = ("v5e", "v6e", "v7x")
COUNT_KEYS = ("method", "generation", "rows", "entries", "k", "tc_bundles",
              "sc_bundles")


def bundle_line(shape: shapes_lib.Shape, generation: str, method: str,
                row: dict | None) -> dict:
  """One JSON line of `--json`: `COUNT_KEYS` and what qualifies them, from
  a data/step_schedule.json selection row (None: not recorded). tc_bundles
  None: not recorded, or a dynamic trip count (`note`); sc_bundles 0
  without SparseCore calls, None with them (not in the dump)."""
  m = topk.METHODS[method]
  line = dict(method=method, generation=generation, rows=shape.rows,
              entries=shape.entries, k=shape.k, tc_bundles=None,
              sc_bundles=None, exact=m.exact, shape=shape.kind,
              fused_extra=None, sparsecore_calls=None,
              sparsecore_hbm_bytes=None, note="", source=None)
  if m.needs:
    line["fused_extra"] = (
        f"not counted: the scoring kernel's {m.needs!r} output is an input "
        f"of this program; the bundles writing it inside the scoring "
        f"kernel are not in tc_bundles")
  if row is None:
    line["note"] = ("not recorded (python -m streamidx.bench --topk "
                    "--compile records it)")
    return line
  calls = row["sparsecore_calls"]
  line.update(tc_bundles=row["bundles"], sc_bundles=None if calls else 0,
              sparsecore_calls=len(calls),
              sparsecore_hbm_bytes=row["sparsecore_hbm_bytes"],
              source=f"{row['command']} ({row['date']})")
  notes = []
  if row["bundles"] is None:
    loops = ", ".join(f"{c} loop at {s:#x} ({b} bundles an iteration)"
                      for c, s, b in row["dynamic_loops"])
    notes.append(f"tc_bundles unknown: dynamic trip count of {loops}; "
                 f"at least {row['bundles_without_dynamic']} (those loops at "
                 f"0 trips)")
  if calls:
    notes.append(f"SparseCore: {len(calls)} calls, "
                 f"{row['sparsecore_hbm_bytes']} HBM bytes read and written; "
                 f"the dump has no SparseCore bundles")
  line["note"] = "; ".join(notes)
  return line


def bundle_counts(shapes=COUNT_SHAPES, generations=GENERATIONS, *,
                  compile_missing: bool = False, progress=None) -> list[dict]:
  """`bundle_line` of every (shape, generation, registered method), from
  the records; compile_missing: compile each one not recorded
  (`calibration.record_selection`) and append it to the records first."""
  out = []
  for shape in shapes:
    for gen in generations:
      for m in topk.TOPK_METHODS:
        key = (gen, m, shape.rows, shape.entries, shape.k)
        row = roofline.selection_record(*key)
        if row is None and compile_missing:
          if progress:
            progress(f"compiling {key}")
          row = calibration.record_selection(*key)
          calibration.append_selection([row])
        out.append(bundle_line(shape, gen, m, row))
  return out


def parse_shape(text: str) -> shapes_lib.Shape:
  """'ROWSxENTRIES:K': the `COUNT_SHAPES` shape of those sizes (decode or
  prefill), else ROWS decode rows of ENTRIES entries at ratio 4."""
  try:
    tn, k = text.split(":")
    rows, entries = map(int, tn.split("x"))
    k = int(k)
  except (ValueError, TypeError):  # not ROWSxENTRIES:K
    rows = entries = k = 0
  if min(rows, entries, k) < 1:
    raise ValueError(f"--shapes: expected ROWSxENTRIES:K, positive sizes "
                     f"(got {text!r})")
  for shape in COUNT_SHAPES:
    if (shape.rows, shape.entries, shape.k) == (rows, entries, k):
      return shape
  ratio = shapes_lib.DSV4.compression_ratio
  return shapes_lib.Shape(text, "decode", rows, 1, entries * ratio, k,
                          compression_ratio=ratio)


_name = lambda s: f"{s.rows}x{s.entries}:{s.k}"  # pylint: disable=unnecessary-lambda-assignment


def score_buffer(shape: shapes_lib.Shape, seed: int = 0) -> np.ndarray:
  """f32[T, N]: standard normal scores, a tenth of them 0.0 (the ReLU ties),
  row r's last r * N / (2 T) entries -inf (a ragged decode batch)."""
  rng = np.random.default_rng(seed)
  x = rng.standard_normal((shape.rows, shape.entries)).astype(np.float32)
  x[rng.random(x.shape) < 0.1] = 0.0
  for r in range(shape.rows):
    x[r, shape.entries - r * shape.entries // (2 * shape.rows):] = -np.inf
  return x


def selection_call(x, k: int, method: str):
  """(function, args) of one selection over the device scores f32[T, N] `x`:
  `select_topk(x, k, method)`, a method that `needs` a kernel output given
  it as the kernel writes it (`extra_ref`); "reference":
  `ref.topk_from_scores`."""
  if method == "reference":
    return (lambda s: ref.topk_from_scores(s, k)), (x,)
  rec = topk.get(method)
  if rec.needs is None:
    return functools.partial(topk.select_topk, k=k, method=method), (x,)
  extra = rec.extra_ref(x, **rec.resolve({}))
  return (lambda s, e: topk.select_topk(s, k, method, extra=e)), (x, extra)


def check_selection(got, want: np.ndarray, scores: np.ndarray,
                    method: str) -> dict:
  """i32[T, k] `got` against the rule's `want` (`bench.oracle.topk_rule` of
  f32[T, N] `scores`): {"ok", "rows", "rows_identical"}; a method that is
  not exact: "ok" None and its "recall" (`metrics.recall_at_k`)."""
  same = (np.asarray(got) == want).all(axis=1)
  out = {"ok": bool(same.all()), "rows": int(same.size),
         "rows_identical": int(same.sum())}
  if method != "reference" and not topk.METHODS[method].exact:
    out.update(ok=None, recall=metrics.recall_at_k(got, want, scores))
  return out


def run(shapes: Sequence[shapes_lib.Shape] = SHAPES, *, repeats: int = 5,
        seed: int = 0) -> dict:
  """Times the reference and every method on each shape (jitted, the scores an
  argument) and checks each against the rule (`check_selection`); "approx"
  also its modelled TPU recall. Returns the doc."""
  results = []
  for shape in shapes:
    x_np, k = score_buffer(shape, seed), shape.k
    want = oracle.topk_rule(x_np, k)
    x = jnp.asarray(x_np)
    for m in ("reference", *topk.TOPK_METHODS):
      info, call = harness.compile_call(*selection_call(x, k, m), {})
      got, res = harness.measure(call, repeats)
      row = {"shape": _name(shape), "impl": m, "compile_s": info["compile_s"],
             **res["wall_s"], "exact": m == "reference" or topk.get(m).exact,
             **check_selection(got, want, x_np, m)}
      if not row["exact"]:
        row["tpu_recall_model"] = topk_model.approx_recall(x_np, k)
      results.append(row)
  on_tpu = jax.default_backend() == "tpu"
  return {"schema": SCHEMA, "machine": modes.describe_machine(),
          "timings_are": ("TPU wall times (this machine)" if on_tpu else
                          "CPU timings (this machine), not TPU timings"),
          "checked_against": ("the rule's NumPy oracle "
                              "(streamidx.lab.bench.oracle.topk_rule)"),
          "shapes": [dict(rows=s.rows, entries=s.entries, k=s.k)
                     for s in shapes],
          "results": results}


def failures(doc) -> list[str]:
  """'shape impl' of each exact result (the reference's too) that differs
  from the rule on some row."""
  return [f"{r['shape']} {r['impl']}" for r in doc["results"]
          if r["exact"] and r["rows_identical"] < r["rows"]]


def format_table(doc) -> str:
  ref_t = {r["shape"]: r["median"] for r in doc["results"]
           if r["impl"] == "reference"}
  rows = []
  for r in doc["results"]:
    same = f"{r['rows_identical']}/{r['rows']} rows"
    check = (f"rule: identical ({same})" if r["rows_identical"] == r["rows"]
             else f"rule: DIFFERS ({same} identical)")
    if not r["exact"]:
      m = r["tpu_recall_model"]
      check = (f"recall {r['recall']:.4f} here ({same} identical); TPU "
               f"model {m['emulated_recall']:.4f} ({m['bins']} bins)")
    rows.append({"shape": r["shape"], "method": r["impl"],
                 "median ms": r["median"] * 1e3,
                 "min-max ms": f"{r['min'] * 1e3:.2f}-{r['max'] * 1e3:.2f}",
                 "vs ref": f"{r['median'] / ref_t[r['shape']]:.2f}x",
                 "compile s": r["compile_s"], "check": check})
  return (doc["timings_are"] + "; checked against " + doc["checked_against"]
          + "\n" + tables.format_rows(rows))


def format_counts(lines) -> str:
  """The recorded counts as a table (each exact method's tc_bundles over
  the sort's at the same shape)."""
  sort = {(l["generation"], l["rows"], l["entries"], l["k"]): l["tc_bundles"]
          for l in lines if l["method"] == "sort"}
  rows = []
  missing = sum(1 for l in lines if l["source"] is None)
  for l in lines:
    if l["source"] is None:
      continue
    base_ = sort.get((l["generation"], l["rows"], l["entries"], l["k"]))
    ratio = ("-" if not (l["exact"] and l["tc_bundles"] and base_)
             else f"{l['tc_bundles'] / base_:.3f}")
    rows.append({"shape": f"{l['shape']} {l['rows']}x{l['entries']}",
                 "k": l["k"], "chip": l["generation"], "method": l["method"],
                 "tc_bundles": "-" if l["tc_bundles"] is None
                 else f"{l['tc_bundles']:,}", "/ sort": ratio,
                 "sc_bundles": "-" if l["sc_bundles"] is None
                 else l["sc_bundles"],
                 "note": ("dynamic trips" if "dynamic" in l["note"] else
                          "SparseCore calls" if l["sparsecore_calls"] else "")
                 + (" (fused extra not counted)" if l["fused_extra"] else "")})
  return ("TensorCore bundles executed by each compiled selection (static "
          "schedule, libtpu dump; not a timing)\n" + tables.format_rows(rows)
          + f"\n{missing} of {len(lines)} not recorded (--json lists them, "
          "--compile records them)")


def main(argv=None) -> int:
  p = argparse.ArgumentParser(
      prog="python -m streamidx.bench --topk",
      description=__doc__.split("\n\n")[0].replace("`", ""))
  p.add_argument("--shapes", nargs="+", metavar="ROWSxENTRIES:K",
                 help="shapes (default: the timing's or the counts' own)")
  p.add_argument("--repeats", type=int, default=5,
                 help="timed calls after the warm-up (default 5)")
  p.add_argument("--out", default="build/bench",
                 help="output folder (default build/bench)")
  p.add_argument("--json", action="store_true", help="instead of timing: "
                 "the recorded bundle counts, one JSON object a line")
  p.add_argument("--table", action="store_true", help="instead of timing: "
                 "the recorded counts as a table")
  p.add_argument("--compile", action="store_true",
                 help="with the counts: compile (libtpu, no TPU; minutes "
                 "each) and record every one not recorded")
  p.add_argument("--generations", nargs="+", choices=GENERATIONS,
                 default=list(GENERATIONS), help="the counts' chips")
  a = p.parse_args(argv)
  try:
    shapes = ([parse_shape(s) for s in a.shapes] if a.shapes
              else COUNT_SHAPES if (a.json or a.compile or a.table)
              else SHAPES)
    if a.repeats < 1:
      raise ValueError("--repeats: must be >= 1")
    if a.json and a.table:
      raise ValueError("--table: not with --json (one output at a time)")
  except ValueError as e:
    p.error(str(e))
  if a.json or a.compile or a.table:
    lines = bundle_counts(shapes, a.generations,
                          compile_missing=a.compile,
                          progress=lambda s: print(s, file=sys.stderr,
                                                   flush=True))
    if a.json:
      for line in lines:
        print(json.dumps(line))
    else:
      print(format_counts(lines))
    return 0
  doc = run(shapes, repeats=a.repeats)
  print(doc["machine"])
  print(format_table(doc))
  bad = failures(doc)
  out = Path(a.out)
  out.mkdir(parents=True, exist_ok=True)
  (out / "topk.json").write_text(json.dumps(doc, indent=1))
  print(f"\nwrote {out / 'topk.json'}")
  if bad:
    print("FAILED: " + ", ".join(bad))
  return 1 if bad else 0
