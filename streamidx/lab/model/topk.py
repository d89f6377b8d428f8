"""The top-k stage per method: bytes, passes, comparisons, a time bound by HBM
traffic alone, XLA's static cost analysis, the recall of "approx"
(docs/topk-methods.md, "The model").
"""

from __future__ import annotations

import time
from typing import Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from streamidx import metrics, modes
from streamidx import topk as topk_lib
from streamidx.lab import shapes as shapes_lib
from streamidx.lab.model import hardware
from streamidx.topk import approx as approx_lib

SHAPES = shapes_lib.SELECT  # the selection problems modelled

# Public numbers, TPU7x, decode B=64 x 262,144 entries, k 512 (prefill T=2048
# where noted): measured by others, on their build.
PUBLIC_TPU7X = {
    "source": ("sglang-jax #1642 (vendored pipeline: scoring + approx_max_k"
               "(recall_target=1.0)) and #1607 (top-k alternatives on the "
               "same shape), TPU7x"),
    "decode_total_ms": 7.50, "decode_scoring_ms": 3.3, "decode_sort_ms": 3.6,
    "prefill_scoring_ms": 18.9, "prefill_sort_ms": 92.4,
    "lax_top_k_ms": 6.5, "approx_max_k_recall_1_ms": 4.1,
    "tokamax_sparsecore_radix_ms": 0.86,
}


TopkCost = topk_lib.base.TopkCost  # home: `streamidx.topk.base`
approx_topk_reduction_size = approx_lib.reduction_size  # XLA's bin count


def cost(method: str, rows: int, entries: int, k: int, **options) -> TopkCost:
  """The cost of `select_topk(f32[rows, entries], k, method, **options)`:
  the method's own model (`streamidx.topk.METHODS[method].cost`)."""
  m = topk_lib.get(method)
  opts = m.resolve(options)
  return m.cost(int(rows), max(int(entries), int(k)), int(k), **opts)


def costs(shape: shapes_lib.Shape, methods: Sequence[str] = topk_lib.TOPK_METHODS,
          **options) -> list[TopkCost]:
  return [cost(m, shape.rows, shape.entries, shape.k, **options)
          for m in methods]


def hbm_bound(c: TopkCost, spec: hardware.TpuSpec) -> float:
  return c.bytes / spec.device_bandwidth  # seconds at one JAX device's HBM rate


def recommend(shape: shapes_lib.Shape, generation: str, estimates=None,
              specs: Mapping[str, hardware.TpuSpec] | None = None) -> dict:
  """The exact method the model ranks first on `generation` for `shape`: {"method",
  "basis", "rankings", "unambiguous"} (criteria, `estimates`: docs/topk-methods.md)."""
  specs = hardware.load_specs() if specs is None else specs
  exact = topk_lib.EXACT_TOPK_METHODS
  if isinstance(estimates, Mapping) and "results" in estimates:
    estimates = estimates["results"]
  if estimates is not None and not isinstance(estimates, Mapping):
    estimates = {r["method"]: r for r in estimates
                 if (r["rows"], r["entries"], r["k"], r["generation"])
                 == (shape.rows, shape.entries, shape.k, generation)}
  est = {m: (estimates or {}).get(m) or {} for m in exact}
  # Keyed by the method asked for: a method that falls back to another at
  # this shape (e.g. chunked with one chunk) reports the other's name.
  cs = dict(zip(exact, costs(shape, exact)))
  rankings = {}
  for name, field in (("compiler optimal", "optimal_seconds"),
                      ("compiler bytes", "bytes_accessed")):
    if any(e.get(field) for e in est.values()):
      rankings[name] = lambda m, f=field: est[m].get(f) or float("inf")
  rankings["sort work"] = lambda m: cs[m].sort_work
  rankings["HBM bound"] = lambda m: hbm_bound(cs[m], specs[generation])
  rankings = {name: sorted(exact, key=lambda m, f=key: (f(m), exact.index(m)))
              for name, key in rankings.items()}
  basis = next(iter(rankings))
  return {"method": rankings[basis][0], "basis": basis, "rankings": rankings,
          "unambiguous": len({r[0] for r in rankings.values()}) == 1}


def approx_recall(scores, k: int, *,
                  recall_target: float = topk_lib.APPROX_RECALL_TARGET
                  ) -> dict:
  """The recall "approx" reaches on a TPU, modelled for f32[T, N] `scores`: {"bins",
  "expected_recall", "emulated_recall", ...} (what each is: docs/topk-methods.md)."""
  x = np.asarray(scores, np.float32)
  t, n = x.shape
  bins = approx_lib.bins(n, k, recall_target)
  expected = (1.0 - 1.0 / bins) ** (k - 1) if bins < n else 1.0
  exact = np.asarray(topk_lib.select_topk(x, k, "top_k"))
  emulated = 1.0
  if bins < n:
    per = -(-n // bins)
    padded = np.full((t, per * bins), -np.inf, np.float32)
    padded[:, :n] = x
    grid = padded.reshape(t, per, bins)
    arg = grid.argmax(axis=1)  # lowest index among equal maxima
    maxima = np.take_along_axis(grid, arg[:, None, :], axis=1)[:, 0]
    index = arg * bins + np.arange(bins)[None, :]
    pick = np.asarray(topk_lib.select_topk(maxima, k, "top_k"))
    got = np.where(pick >= 0, np.take_along_axis(index, np.maximum(pick, 0),
                                                 axis=1), -1)
    emulated = metrics.recall_at_k(got, exact, x)
  return {"bins": int(bins), "entries": int(n), "k": int(k),
          "recall_target": float(recall_target),
          "expected_recall": float(expected), "emulated_recall": float(emulated)}


def compile_estimate(method: str, rows: int, entries: int, k: int,
                     generation: str, **options) -> dict:
  """XLA's cost analysis (a static estimate) of `select_topk(f32[rows,
  entries], k, method)` (and its extra input) compiled for `generation`:
  {"ok", "compile_s", "optimal_seconds", "bytes_accessed", "flops",
  "temp_bytes", "error"}."""
  out = {"method": method, "generation": generation, "rows": rows,
         "entries": entries, "k": k, "ok": False, "compile_s": None,
         "optimal_seconds": None, "bytes_accessed": None, "flops": None,
         "temp_bytes": None, "error": ""}
  start = time.perf_counter()
  try:
    with modes.compile_for(generation) as target:
      spec = target.spec((rows, entries), jnp.float32)
      rec = topk_lib.get(method)
      if rec.needs:
        # The selection as a fused kernel calls it: with its extra output.
        extra = jax.eval_shape(
            lambda s: rec.extra_ref(s, **rec.resolve(options)), spec)
        fn = jax.jit(lambda s, e: topk_lib.select_topk(
            s, k, method, extra=e, **options))
        compiled = fn.lower(spec, target.spec(extra.shape,
                                              extra.dtype)).compile()
      else:
        fn = jax.jit(lambda s: topk_lib.select_topk(s, k, method, **options))
        compiled = fn.lower(spec).compile()
    ca = compiled.cost_analysis() or {}
    if isinstance(ca, (list, tuple)):
      ca = ca[0] if ca else {}
    opt = ca.get("optimal_seconds")
    out.update(ok=True, optimal_seconds=float(opt) if opt and opt > 0 else None,
               bytes_accessed=ca.get("bytes accessed"), flops=ca.get("flops"),
               temp_bytes=getattr(compiled.memory_analysis(), "temp_size_in_bytes", None))
  except Exception as e:  # pylint: disable=broad-except
    msg = str(e).strip().splitlines()
    out["error"] = f"{type(e).__name__}: {msg[0] if msg else ''}"[:300]
  out["compile_s"] = round(time.perf_counter() - start, 2)
  return out
