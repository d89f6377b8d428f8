"""The top-k stage (`--topk`, docs/benchmarks.md): every `streamidx.topk` method
timed on this machine, or with `--compile` XLA's cost analysis of each compiled
per generation (libtpu, no TPU) in <out>/topk_compile.json, which
`lab.model.topk.recommend(estimates=)` reads.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from streamidx import metrics, modes, ref, topk
from streamidx.lab import tables
from streamidx.lab import shapes as shapes_lib
from streamidx.lab.bench import harness
from streamidx.lab.model import topk as topk_model

SCHEMA = "streamidx.bench.topk/2"  # /2: median, min, max, runs as harness.measure


# Decode B=64 at 128K and 1M tokens, ratio 4 (DeepSeek-V4 k=512): score
# buffers f32[shape.rows, shape.entries].
SHAPES = (shapes_lib.DSV4_DECODE_128K, shapes_lib.DSV4_DECODE_1M)


def parse_shape(text: str) -> shapes_lib.Shape:
  """'ROWSxENTRIES:K': ROWS decode rows of ENTRIES entries at ratio 4."""
  try:
    tn, k = text.split(":")
    rows, entries = map(int, tn.split("x"))
    k = int(k)
  except (ValueError, TypeError):  # not ROWSxENTRIES:K
    rows = entries = k = 0
  if min(rows, entries, k) < 1:
    raise ValueError(f"--shapes: expected ROWSxENTRIES:K, positive sizes "
                     f"(got {text!r})")
  ratio = shapes_lib.DSV4.compression_ratio
  return shapes_lib.Shape(text, "decode", rows, 1, entries * ratio, k,
                          compression_ratio=ratio)


def _name(shape: shapes_lib.Shape) -> str:
  return f"{shape.rows}x{shape.entries}:{shape.k}"


def score_buffer(shape: shapes_lib.Shape, seed: int = 0) -> np.ndarray:
  """f32[T, N]: standard normal scores, a tenth of them 0.0 (the ReLU ties),
  row r's last r * N / (2 T) entries -inf (a ragged decode batch)."""
  rng = np.random.default_rng(seed)
  x = rng.standard_normal((shape.rows, shape.entries)).astype(np.float32)
  x[rng.random(x.shape) < 0.1] = 0.0
  for r in range(shape.rows):
    x[r, shape.entries - r * shape.entries // (2 * shape.rows):] = -np.inf
  return x


def _time(fn, args, repeats):
  """fn(*args) jitted (args are arguments, never constants to fold)."""
  info, call = harness.compile_call(fn, args, {})
  out, res = harness.measure(call, repeats)
  return np.asarray(out), {"compile_s": info["compile_s"], **res["wall_s"]}


def run(shapes: Sequence[shapes_lib.Shape] = SHAPES, *, repeats: int = 5,
        seed: int = 0) -> dict:
  """Times every method and the reference on each shape; returns the doc."""
  results = []
  for shape in shapes:
    x_np, k = score_buffer(shape, seed), shape.k
    x = jnp.asarray(x_np)
    want, timing = _time(lambda s: ref.topk_from_scores(s, k), (x,), repeats)
    results.append({"shape": _name(shape), "impl": "reference", **timing,
                    "identical_to_reference": True})
    for m in topk.TOPK_METHODS:
      rec = topk.get(m)
      if rec.needs:  # its extra output as the kernel writes it
        extra = rec.extra_ref(x, **rec.resolve({}))
        got, timing = _time(lambda s, e, m=m: topk.select_topk(
            s, k, m, extra=e), (x, extra), repeats)
      else:
        got, timing = _time(lambda s, m=m: topk.select_topk(s, k, m), (x,),
                            repeats)
      row = {"shape": _name(shape), "impl": m, **timing,
             "identical_to_reference": bool(np.array_equal(got, want))}
      if m not in topk.EXACT_TOPK_METHODS:
        row["recall_here"] = metrics.recall_at_k(got, want, x_np)
        row["tpu_recall_model"] = topk_model.approx_recall(x_np, k)
      results.append(row)
  on_tpu = jax.default_backend() == "tpu"
  return {"schema": SCHEMA, "machine": modes.describe_machine(),
          "timings_are": ("TPU wall times (this machine)" if on_tpu else
                          "CPU timings (this machine), not TPU timings"),
          "shapes": [dict(rows=s.rows, entries=s.entries, k=s.k)
                     for s in shapes],
          "results": results}


def format_table(doc) -> str:
  ref_t = {r["shape"]: r["median"] for r in doc["results"]
           if r["impl"] == "reference"}
  rows = []
  for r in doc["results"]:
    check = "identical" if r["identical_to_reference"] else "DIFFERS"
    if "recall_here" in r:
      m = r["tpu_recall_model"]
      check = (f"recall {r['recall_here']:.4f} here; TPU model "
               f"{m['emulated_recall']:.4f} ({m['bins']} bins)")
    rows.append({"shape": r["shape"], "method": r["impl"],
                 "median ms": r["median"] * 1e3,
                 "min-max ms": f"{r['min'] * 1e3:.2f}-{r['max'] * 1e3:.2f}",
                 "vs ref": f"{r['median'] / ref_t[r['shape']]:.2f}x",
                 "compile s": r["compile_s"], "check": check})
  return doc["timings_are"] + "\n" + tables.format_rows(rows)


def compile_matrix(shapes, generations) -> dict:
  """`compile_estimate` for every (shape, generation, method)."""
  rows = [dict(topk_model.compile_estimate(m, s.rows, s.entries, s.k, gen),
               shape=_name(s))
          for s in shapes for gen in generations
          for m in topk.TOPK_METHODS]
  return {"schema": SCHEMA + "/compile", "jax": jax.__version__,
          "libtpu": modes.libtpu_path(),
          "estimates_are": ("XLA TPU compiler cost analysis of programs "
                            "compiled without a TPU: static estimates, not "
                            "measurements"), "results": rows}


def format_compile_table(doc) -> str:
  return doc["estimates_are"] + "\n" + tables.format_rows([{
      "shape": r["shape"], "generation": r["generation"],
      "method": r["method"], "compiled": "ok" if r["ok"] else "FAILED",
      "compile s": r["compile_s"], "optimal us": r["optimal_seconds"] and (
          r["optimal_seconds"] * 1e6),
      "accessed MB": r["bytes_accessed"] and r["bytes_accessed"] / 1e6,
      "error": r["error"]} for r in doc["results"]])


def main(argv=None) -> int:
  p = argparse.ArgumentParser(
      prog="python -m streamidx.bench --topk",
      description="Every streamidx.topk method timed on this machine beside "
      "the reference (streamidx/lab/bench/topk.py).")
  p.add_argument("--shapes", nargs="+", metavar="ROWSxENTRIES:K")
  p.add_argument("--repeats", type=int, default=5,
                 help="timed calls after the warm-up (default 5)")
  p.add_argument("--out", default="build/bench",
                 help="output folder (default build/bench)")
  p.add_argument("--compile", action="store_true",
                 help="instead: compile every method for v5e, v6e, v7x "
                 "(libtpu)")
  a = p.parse_args(argv)
  try:
    shapes = ([parse_shape(s) for s in a.shapes] if a.shapes
              else SHAPES[1:] if a.compile else SHAPES)
    if a.repeats < 1:
      raise ValueError("--repeats: must be >= 1")
  except ValueError as e:
    p.error(str(e))
  if a.compile:
    doc, name = compile_matrix(shapes, ("v5e", "v6e", "v7x")), "topk_compile"
    print(format_compile_table(doc))
    bad = [f"{r['shape']} {r['generation']} {r['method']}"
           for r in doc["results"] if not r["ok"]]
  else:
    doc, name = run(shapes, repeats=a.repeats), "topk"
    print(doc["machine"])
    print(format_table(doc))
    bad = [f"{r['shape']} {r['impl']}" for r in doc["results"]
           if "recall_here" not in r and not r["identical_to_reference"]]
  out = Path(a.out)
  out.mkdir(parents=True, exist_ok=True)
  (out / f"{name}.json").write_text(json.dumps(doc, indent=1))
  print(f"\nwrote {out / name}.json")
  if bad:
    print("FAILED: " + ", ".join(bad))
  return 1 if bad else 0
