"""Ties at the top-k boundary, shared beyond notebook 05 (the candidates a
TPU's ApproxTopK keeps are the selection model's:
`streamidx.topk.approx.reduction_size`).
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
