"""The top-k stage per method: bytes, passes, comparisons, a time bound by HBM
traffic alone, XLA's static cost analysis, the recall of "approx". What each
count means and what the bound cannot see: docs/topk-methods.md, "The model".
"""

from __future__ import annotations

import dataclasses
import time
from typing import Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from streamidx import metrics, modes
from streamidx import topk as topk_lib
from streamidx.lab import shapes as shapes_lib
from streamidx.lab.model import hardware

_F32 = _I32 = 4


# The selection problems modelled (`lab.shapes.SELECT`): f32[rows, entries]
# scores of an indexer call, k kept.
SHAPES = shapes_lib.SELECT


# Public numbers, TPU7x, decode B=64 x 262,144 entries, k 512 (and prefill
# T=2048 where noted). Context only: measured by others, on their build.
PUBLIC_TPU7X = {
    "source": ("sglang-jax #1642 (vendored pipeline: scoring + approx_max_k"
               "(recall_target=1.0)) and #1607 (top-k alternatives on the "
               "same shape), TPU7x"),
    "decode_total_ms": 7.50, "decode_scoring_ms": 3.3, "decode_sort_ms": 3.6,
    "prefill_scoring_ms": 18.9, "prefill_sort_ms": 92.4,
    "lax_top_k_ms": 6.5, "approx_max_k_recall_1_ms": 4.1,
    "tokamax_sparsecore_radix_ms": 0.86,
}


@dataclasses.dataclass(frozen=True)
class TopkCost:
  """What one method moves and compares for one shape. Bytes are totals."""

  method: str
  bytes_read: int
  bytes_written: int
  passes: float  # full reads of the f32 score buffer
  sort_work: float  # compare-exchanges (bitonic network), all rows
  scan_ops: float  # element comparisons outside sorts, all rows
  detail: str
  bytes = property(lambda c: c.bytes_read + c.bytes_written)


def _w(n):
  return topk_lib._sort_work(int(n))  # pylint: disable=protected-access


def approx_topk_reduction_size(n: int, k: int, recall_target: float) -> int | None:
  """Candidates the TPU's ApproxTopK (arXiv:2206.14286: bin maxima, then an
  exact top-k of them) keeps from n: XLA's `ApproxTopKReductionOutputSize`
  (private jaxlib binding; None without it). n: an exact top-k."""
  try:
    from jax._src.lib import _jax  # pylint: disable=g-import-not-at-top
    fn = _jax.approx_top_k_reduction_output_size
  except (ImportError, AttributeError):
    return None
  return int(fn(n, 2, k, recall_target, False, -1)[0])  # rank 2: [T, n] scores


def _approx_bins(n, k, recall_target):
  size = approx_topk_reduction_size(n, k, recall_target)
  return n if size is None else min(n, size)


def cost(method: str, rows: int, entries: int, k: int, *,
         chunk_size: int | None = None, block_size: int | None = None,
         radix_bits: int = 4,
         recall_target: float = topk_lib.APPROX_RECALL_TARGET) -> TopkCost:
  """The cost of `select_topk(f32[rows, entries], k, method)`; "top_k"'s where
  there is nothing to split. "fused_blockmax" reads the dense kernel's block
  maxima (entries / 128 a row, in whole 128-lane rows, counted in its
  `bytes_written`), then the k best blocks' entries."""
  topk_lib.check_topk_method(method)
  t, n = int(rows), max(int(entries), int(k))
  buf = t * n * _F32
  won = t * k * (_F32 + 2 * _I32)  # values + indices of the k winners, the output
  if method in ("sort", "top_k"):
    extra = buf if method == "sort" else 0  # the tie-counting pass
    return TopkCost(
        method, buf + extra, won, 1 + (method == "sort"),
        t * _w(n), t * n * (method == "sort"), "full sort of each row" + (
            " + one pass counting ties at the k-th score (a lax.top_k again "
            "where they straddle it)" if method == "sort" else ""))
  if method == "chunked":
    c = chunk_size or topk_lib.chunk_size_for(n, k)
    chunks = -(-n // c)
    cand = chunks * min(k, c)
    if chunks == 1:
      return cost("top_k", rows, entries, k)
    return TopkCost(
        method, buf + t * cand * (_F32 + _I32), t * cand * (_F32 + _I32)
        + won, 1, t * (chunks * _w(c) + _w(cand)), 0,
        f"{chunks} chunks of {c}: top-{min(k, c)} each, then top-{k} of "
        f"{cand} candidates")
  if method == "blockmax":
    b = block_size or topk_lib.block_size_for(n, k)
    blocks = -(-n // b)
    if blocks <= k:
      return cost("top_k", rows, entries, k)
    return TopkCost(
        method, buf + t * blocks * _F32 + t * k * b * _F32,
        t * blocks * _F32 + t * k * _I32 + won, 1 + k * b / n,
        t * (_w(blocks) + _w(k) + _w(k * b)), t * n,
        f"max of {blocks} blocks of {b}, top-{k} blocks, top-{k} of their "
        f"{k * b} entries")
  if method == "fused_blockmax":
    w = topk_lib.FUSED_BLOCK_WIDTH
    b = block_size or topk_lib.fused_block_size_for(n, k, w)
    blocks = -(-n // b)
    if blocks <= k:
      return cost("top_k", rows, entries, k)
    maxima = -(-n // w)  # the kernel's: one per 128 entries
    kernel_out = t * (-(-maxima // 128) * 128) * _F32  # whole 128-lane rows
    g = b // w
    grouped = t * blocks * _F32 if g > 1 else 0  # maxima of g maxima
    gather = t * k * b * _F32
    return TopkCost(
        method, t * maxima * _F32 + grouped + gather,
        kernel_out + grouped + t * k * _I32 + won, k * b / n,
        t * (_w(blocks) + _w(k) + _w(k * b)), t * maxima * (g > 1),
        f"the kernel writes {maxima} maxima of {w} entries a row"
        + (f", grouped into {blocks} blocks of {b}" if g > 1 else "")
        + f"; top-{k} blocks, top-{k} of their {k * b} entries")
  if method == "radix":
    r = int(radix_bits)
    p = 32 // r
    # p histogram passes; the take: count above/equal (1 read), tie ranks
    # and slots (cumsums: 1 read, 1 write of i32), the scatter (1 read).
    return TopkCost(
        method, (p + 3) * buf, buf + won, p + 3, t * _w(k),
        t * n * (p * ((1 << r) - 1) + 4),
        f"{p} histogram passes of {1 << r} bins, then the take "
        f"(count, cumulative ranks, scatter) and a sort of the {k} winners")
  m = _approx_bins(n, k, recall_target)
  return TopkCost(
      method, buf + t * m * (_F32 + _I32), t * m * (_F32 + _I32) + won,
      1, t * (_w(m) + _w(k)), t * n,
      f"max of {m} bins (recall target {recall_target}), top-{k} of them")


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
  bins = _approx_bins(n, k, recall_target)
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
  """XLA's cost analysis (a static estimate) of `select_topk(f32[rows, entries],
  k, method)` compiled for `generation` without a TPU ("fused_blockmax" with
  its block maxima, as the fused kernel calls it): {"ok", "compile_s",
  "optimal_seconds" (None where the compiler gives none), "bytes_accessed",
  "flops", "temp_bytes", "error"}."""
  out = {"method": method, "generation": generation, "rows": rows,
         "entries": entries, "k": k, "ok": False, "compile_s": None,
         "optimal_seconds": None, "bytes_accessed": None, "flops": None,
         "temp_bytes": None, "error": ""}
  start = time.perf_counter()
  try:
    with modes.compile_for(generation) as target:
      spec = target.spec((rows, entries), jnp.float32)
      if method in topk_lib.FUSED_TOPK_METHODS:
        # The selection as the fused kernel calls it: with its block maxima.
        w = topk_lib.FUSED_BLOCK_WIDTH
        fn = jax.jit(lambda s, m: topk_lib.select_topk(
            s, k, method, block_max=m, block_max_width=w, **options))
        compiled = fn.lower(spec, target.spec((rows, -(-entries // w)),
                                              jnp.float32)).compile()
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
