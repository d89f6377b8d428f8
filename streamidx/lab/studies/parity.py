"""Two top-k facts shared beyond notebook 05: ties at the k-th boundary, and the
candidates a TPU's ApproxTopK keeps.
"""

from __future__ import annotations

import dataclasses

import numpy as np


@dataclasses.dataclass(frozen=True)
class BoundaryTies:
  """rows: rows seeing more than k entries; tied_rows: those whose k-th and
  (k+1)-th scores are equal (zero_tied_rows: at 0); per tied row group_sizes
  (entries at the boundary score) and slots (how many the top-k keeps)."""

  k: int
  rows: int
  tied_rows: np.ndarray
  zero_tied_rows: int
  group_sizes: np.ndarray
  slots: np.ndarray


def boundary_ties(scores, k: int) -> BoundaryTies:
  """Rows of masked scores f32[T, E] (-inf invisible) whose top-k boundary
  falls inside a group of equal scores."""
  s = np.asarray(scores)
  finite = np.isfinite(s)
  n_vis = finite.sum(axis=1)
  rows = np.flatnonzero(n_vis > k)
  tied, zero, groups, slots = [], 0, [], []
  for r in rows:
    v = s[r][finite[r]]
    # The k-th and (k+1)-th largest: positions k-1 and k of the descending order.
    part = -np.partition(-v, (k - 1, k))
    kth, nxt = part[k - 1], part[k]
    if kth == nxt:
      tied.append(r)
      zero += int(kth == 0)
      groups.append(int(np.sum(v == kth)))
      slots.append(int(k - np.sum(v > kth)))
  return BoundaryTies(k=k, rows=len(rows), tied_rows=np.asarray(tied, int),
                      zero_tied_rows=zero, group_sizes=np.asarray(groups, int),
                      slots=np.asarray(slots, int))


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
