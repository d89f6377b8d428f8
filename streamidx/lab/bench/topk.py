"""Benchmark of the top-k stage: every `streamidx.topk` method on this machine.

    python -m streamidx.bench --topk                 # decode B=64 at 128K and 1M
    python -m streamidx.bench --topk --quick         # small shapes (CI)
    python -m streamidx.bench --topk --shapes 64x32768:512 2048x32768:512
    python -m streamidx.bench --topk --compile       # compile for v5e/v6e/v7x

`--compile` (needs libtpu; no TPU) compiles `select_topk` for each method
and TPU generation at each shape from `jax.ShapeDtypeStruct`s and records
whether it compiled, the compile time and XLA's cost analysis of the
program (`streamidx.lab.model.topk.compile_estimate`: bytes accessed,
optimal_seconds where the compiler gives one, temp bytes): static compiler
estimates, not measurements. Output: <out>/topk_compile.json.

Each shape is an f32[T, N] masked score buffer (standard normal scores,
row r hiding its last r * N / (2 T) entries as -inf, as a ragged decode
batch does; a tenth of the entries set to 0.0, the ReLU ties), built once.
Each method (`streamidx.topk.select_topk`, jitted) and the reference
(`streamidx.ref.topk_from_scores`) is compiled ahead of time (compile_s),
called once to warm up, then `repeats` times; the median wall time is
reported with min and max. Timings are of this machine (`machine` in the
output: a CPU unless JAX runs on a TPU), never of a TPU. "fused_blockmax"
is timed as the fused kernel calls it: given the block maxima (one per 128
entries, computed before the clock starts; the kernel writes them), and
compiled the same way under `--compile`.

Checks, untimed: every exact method's indices equal the reference's bit for
bit; "approx" reports its recall against the reference (tie-aware) and the
recall `streamidx.lab.model.topk.approx_recall` models for a TPU (off-TPU
XLA's approx_max_k is an exact sort, so the measured recall is 1.0 there).
The command exits 1 when an exact method disagrees.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
from pathlib import Path
from typing import Sequence

import numpy as np

__all__ = ["TopkShape", "SHAPES", "QUICK", "score_buffer", "run", "format_table",
           "main"]

SCHEMA = "streamidx.bench.topk/1"


@dataclasses.dataclass(frozen=True)
class TopkShape:
  rows: int
  entries: int
  k: int

  @property
  def name(self) -> str:
    return f"{self.rows}x{self.entries}:{self.k}"


# Decode B=64 at 128K and 1M tokens, ratio 4 (DeepSeek-V4 k=512).
SHAPES = (TopkShape(64, 32768, 512), TopkShape(64, 262144, 512))
QUICK = (TopkShape(8, 4096, 64), TopkShape(4, 1000, 100))


def parse_shape(text: str) -> TopkShape:
  try:
    tn, k = text.split(":")
    t, n = tn.split("x")
    shape = TopkShape(int(t), int(n), int(k))
  except ValueError:
    raise ValueError(f"--shapes: expected ROWSxENTRIES:K (got {text!r})"
                     ) from None
  if min(shape.rows, shape.entries, shape.k) < 1:
    raise ValueError(f"--shapes: sizes must be positive (got {text!r})")
  return shape


def score_buffer(shape: TopkShape, seed: int = 0) -> np.ndarray:
  """f32[T, N]: normal scores, ragged -inf tails, 10% zeros."""
  rng = np.random.default_rng(seed)
  x = rng.standard_normal((shape.rows, shape.entries)).astype(np.float32)
  x[rng.random(x.shape) < 0.1] = 0.0
  for r in range(shape.rows):
    hidden = r * shape.entries // (2 * shape.rows)
    if hidden:
      x[r, shape.entries - hidden:] = -np.inf
  return x


def _time(fn, x, repeats, *extra):
  """fn(x, *extra) jitted: (result, timings); `extra` are arguments too
  (never constants the compiler could fold)."""
  import jax  # pylint: disable=g-import-not-at-top
  from streamidx.lab.bench import harness  # pylint: disable=g-import-not-at-top
  info, run = harness.compile_call(jax.jit(fn), (x, *extra), {})
  out, res = harness.measure(run, repeats)
  times = res["times_s"]
  return np.asarray(out), {"compile_s": round(info["compile_s"], 3),
                           "median_s": statistics.median(times),
                           "min_s": min(times), "max_s": max(times),
                           "repeats": repeats}


def run(shapes: Sequence[TopkShape] = SHAPES, *, methods=None,
        repeats: int = 5, seed: int = 0) -> dict:
  """Times every method and the reference on each shape; returns the doc."""
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top

  from streamidx import metrics, modes, ref, topk  # pylint: disable=g-import-not-at-top
  from streamidx.lab.model import topk as topk_model  # pylint: disable=g-import-not-at-top

  methods = tuple(methods or topk.TOPK_METHODS)
  for m in methods:
    topk.check_topk_method(m)
  results = []
  for shape in shapes:
    x_np = score_buffer(shape, seed)
    x = jnp.asarray(x_np)
    want, timing = _time(lambda s, k=shape.k: ref.topk_from_scores(s, k), x,
                         repeats)
    results.append({"shape": shape.name, "impl": "reference", **timing,
                    "identical_to_reference": True})
    for m in methods:
      if m in topk.FUSED_TOPK_METHODS:
        # As the fused kernel calls it: with the block maxima, which the
        # kernel writes (computed here before the clock starts).
        w = topk.FUSED_BLOCK_WIDTH
        n = x.shape[1]
        bmax = jnp.asarray(np.pad(
            x_np, ((0, 0), (0, -n % w)), constant_values=-np.inf).reshape(
                x_np.shape[0], -1, w).max(axis=2))
        got, timing = _time(
            lambda s, bm, k=shape.k, m=m: topk.select_topk(
                s, k, m, block_max=bm, block_max_width=w), x, repeats, bmax)
      else:
        got, timing = _time(
            lambda s, k=shape.k, m=m: topk.select_topk(s, k, m), x, repeats)
      row = {"shape": shape.name, "impl": m, **timing,
             "identical_to_reference": bool(np.array_equal(got, want))}
      if m in topk.FUSED_TOPK_METHODS:
        row["timed"] = ("the selection given the block maxima (the fused "
                        "kernel writes them; not timed here)")
      if m not in topk.EXACT_TOPK_METHODS:
        row["recall_here"] = metrics.recall_at_k(got, want, x_np)
        row["tpu_recall_model"] = topk_model.approx_recall(x_np, shape.k)
      results.append(row)
  return {"schema": SCHEMA, "machine": modes.describe_machine(),
          "backend": jax.default_backend(),
          "timings_are": ("CPU timings (this machine), not TPU timings"
                          if jax.default_backend() != "tpu"
                          else "TPU wall times (this machine)"),
          "shapes": [dataclasses.asdict(s) for s in shapes],
          "results": results}


def format_table(doc) -> str:
  ref_t = {r["shape"]: r["median_s"] for r in doc["results"]
           if r["impl"] == "reference"}
  lines = [f"{doc['timings_are']}", f"{'shape':18s} {'method':14s} "
           f"{'median ms':>10s} {'min..max ms':>16s} {'vs ref':>7s} "
           f"{'compile s':>9s}  check"]
  for r in doc["results"]:
    if r["impl"] == "reference" or r.get("identical_to_reference") or (
        "recall_here" not in r):
      check = ("identical" if r["identical_to_reference"] else "DIFFERS")
    else:
      check = ""
    if "recall_here" in r:
      m = r["tpu_recall_model"]
      check = (f"recall {r['recall_here']:.4f} here; TPU model "
               f"{m['emulated_recall']:.4f} ({m['bins']} bins)")
    lines.append(
        f"{r['shape']:18s} {r['impl']:14s} {r['median_s'] * 1e3:10.2f} "
        f"{r['min_s'] * 1e3:7.2f}..{r['max_s'] * 1e3:7.2f} "
        f"{r['median_s'] / ref_t[r['shape']]:6.2f}x {r['compile_s']:9.2f}  "
        f"{check}")
  return "\n".join(lines)


def compile_matrix(shapes: Sequence[TopkShape], generations: Sequence[str],
                   methods=None, progress=None) -> dict:
  """`compile_estimate` for every (shape, generation, method)."""
  import os  # pylint: disable=g-import-not-at-top
  os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
  import jax  # pylint: disable=g-import-not-at-top

  from streamidx import topk  # pylint: disable=g-import-not-at-top
  from streamidx.lab.model import topk as topk_model  # pylint: disable=g-import-not-at-top
  try:
    import libtpu  # pylint: disable=g-import-not-at-top,unused-import
    from importlib.metadata import version  # pylint: disable=g-import-not-at-top
    libtpu_version = version("libtpu")
  except ImportError:
    libtpu_version = None
  rows = []
  for shape in shapes:
    for gen in generations:
      for m in (methods or topk.TOPK_METHODS):
        r = topk_model.compile_estimate(m, shape.rows, shape.entries, shape.k,
                                        gen)
        r["shape"] = shape.name
        rows.append(r)
        if progress:
          progress(r)
  return {"schema": SCHEMA + "/compile", "jax": jax.__version__,
          "libtpu": libtpu_version,
          "estimates_are": ("XLA TPU compiler cost analysis of programs "
                            "compiled without a TPU: static estimates, not "
                            "measurements"), "results": rows}


def _compile_main(a) -> int:
  shapes = ([parse_shape(s) for s in a.shapes] if a.shapes
            else ((TopkShape(64, 262144, 512),) if not a.quick else QUICK[:1]))

  def show(r):
    est = ("-" if r["optimal_seconds"] is None
           else f"{r['optimal_seconds'] * 1e6:.0f} us")
    ba = ("-" if r["bytes_accessed"] is None
          else f"{r['bytes_accessed'] / 1e6:.0f} MB")
    print(f"{r['shape']:18s} {r['generation']:4s} {r['method']:14s} "
          f"{'ok' if r['ok'] else 'FAILED':6s} {r['compile_s']:7.1f} s  "
          f"optimal {est:>9s}  accessed {ba:>8s}  {r['error']}", flush=True)

  doc = compile_matrix(shapes, a.generations, a.methods, progress=show)
  out = Path(a.out)
  out.mkdir(parents=True, exist_ok=True)
  (out / "topk_compile.json").write_text(json.dumps(doc, indent=1))
  print(f"\nwrote {out / 'topk_compile.json'}")
  return 0 if all(r["ok"] for r in doc["results"]) else 1


def main(argv=None) -> int:
  p = argparse.ArgumentParser(
      prog="python -m streamidx.bench --topk",
      description="Every streamidx.topk method timed on this machine beside "
      "the reference (see streamidx/lab/bench/topk.py).")
  p.add_argument("--quick", action="store_true", help="small shapes (CI)")
  p.add_argument("--shapes", nargs="+", metavar="ROWSxENTRIES:K")
  p.add_argument("--methods", nargs="+", metavar="METHOD")
  p.add_argument("--repeats", type=int, default=None,
                 help="timed calls after the warm-up (default 5, quick 3)")
  p.add_argument("--out", default="build/bench",
                 help="folder for topk.json (default build/bench)")
  p.add_argument("--compile", action="store_true",
                 help="compile every method for --generations (libtpu)")
  p.add_argument("--generations", nargs="+", default=["v5e", "v6e", "v7x"])
  a = p.parse_args(argv)
  if a.compile:
    return _compile_main(a)
  try:
    shapes = ([parse_shape(s) for s in a.shapes] if a.shapes
              else (QUICK if a.quick else SHAPES))
  except ValueError as e:
    p.error(str(e))
  repeats = a.repeats if a.repeats is not None else (3 if a.quick else 5)
  if repeats < 1:
    p.error("--repeats: must be >= 1")
  try:
    doc = run(shapes, methods=a.methods, repeats=repeats)
  except ValueError as e:
    p.error(str(e))
  print(doc["machine"])
  print(format_table(doc))
  out = Path(a.out)
  out.mkdir(parents=True, exist_ok=True)
  (out / "topk.json").write_text(json.dumps(doc, indent=1))
  print(f"\nwrote {out / 'topk.json'}")
  bad = [f"{r['shape']} {r['impl']}" for r in doc["results"]
         if "recall_here" not in r and not r["identical_to_reference"]]
  if bad:
    print("FAILED (an exact method differs from the reference): "
          + ", ".join(bad), file=sys.stderr)
  return 1 if bad else 0


if __name__ == "__main__":
  sys.exit(main())
