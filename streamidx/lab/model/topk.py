"""The top-k stage per method: bytes, passes, comparisons, a time bound by HBM
traffic alone, the recall of "approx"
(docs/topk-methods.md, "The model").
"""

from __future__ import annotations

import numpy as np

from streamidx import metrics
from streamidx import topk as topk_lib
from streamidx.lab.model import hardware
from streamidx.topk import approx as approx_lib

TopkCost = topk_lib.base.TopkCost  # home: `streamidx.topk.base`
approx_topk_reduction_size = approx_lib.reduction_size  # XLA's bin count


def cost(method: str, rows: int, entries: int, k: int, **options) -> TopkCost:
  """The cost of `select_topk(f32[rows, entries], k, method, **options)`:
  the method's own model (`streamidx.topk.METHODS[method].cost`)."""
  m = topk_lib.get(method)
  opts = m.resolve(options)
  return m.cost(int(rows), max(int(entries), int(k)), int(k), **opts)


def hbm_bound(c: TopkCost, spec: hardware.TpuSpec) -> float:
  return c.bytes / spec.device_bandwidth  # seconds at one JAX device's HBM rate


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

