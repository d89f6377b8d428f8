"""The top-k stage (`--topk`, docs/benchmarks.md): the reference and every
`streamidx.topk` method timed on this machine, each checked row by row
against the rule's NumPy oracle (`bench.oracle.topk_rule`). The bundles each
one's compiled selection executes per chip are the records'
(`python -m streamidx.lab.calibration --selection`).
"""

from __future__ import annotations

import argparse
import functools
import json
from pathlib import Path
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from streamidx import metrics, modes, ref, topk
from streamidx.lab import tables
from streamidx.lab import shapes as shapes_lib
from streamidx.lab.bench import harness, oracle
from streamidx.lab.model import topk as topk_model

# /4: every result checked against the rule's NumPy oracle (`check_selection`:
# `ok`, `rows_identical`; "approx" its `recall`).
SCHEMA = "streamidx.bench.topk/4"
# The timing's shapes: decode B=64 at 128K and 1M tokens, ratio 4, k 512.
SHAPES = (shapes_lib.DSV4_DECODE_128K, shapes_lib.DSV4_DECODE_1M)


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


def main(argv=None) -> int:
  p = argparse.ArgumentParser(
      prog="python -m streamidx.bench --topk",
      description=__doc__.split("\n\n")[0].replace("`", ""))
  p.add_argument("--shapes", nargs="+", metavar="SHAPE", help="the benchmark's "
                 "shapes, decode:SEQSxSEQ_LEN:K or prefill:QxSEQ_LEN:K, a score "
                 "row per query (default: decode:64x131072:512 decode:64x1048576:512)")
  p.add_argument("--repeats", type=int, default=5,
                 help="timed calls after the warm-up (default 5)")
  p.add_argument("--out", default="build/bench",
                 help="output folder (default build/bench)")
  a = p.parse_args(argv)
  try:
    shapes = [shapes_lib.parse_shape(s) for s in a.shapes] if a.shapes else SHAPES
    if a.repeats < 1:
      raise ValueError("--repeats: must be >= 1")
  except ValueError as e:
    p.error(str(e))
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
