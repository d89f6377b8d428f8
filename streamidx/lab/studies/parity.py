"""Two top-k facts shared beyond notebook 05, whose studies (the parity run,
the causal rule, page coverage, approx_max_k, ties) are its cells:

  boundary_ties                exact ties between the k-th and (k+1)-th
                               scores of each row (also `tests/test_cases.py`)
  approx_topk_reduction_size   how many candidates a TPU's ApproxTopK keeps
                               (also `streamidx.lab.model.topk`)

Score arrays are f32[T, E] masked scores with -inf for invisible entries
(`ref.token_scores`).
"""

from __future__ import annotations

import dataclasses

import numpy as np

__all__ = ["BoundaryTies", "boundary_ties", "approx_topk_reduction_size"]


@dataclasses.dataclass(frozen=True)
class BoundaryTies:
  """Exact ties between the k-th and (k+1)-th largest scores of each row.

  rows: rows that see more than k entries (where a boundary exists).
  tied_rows: i64 indices of those whose k-th and (k+1)-th scores are equal
    (which tied entries make the top-k is the top-k's choice); of them,
    zero_tied_rows tie at score 0 (every head's ReLU zeroed the entries).
  group_sizes, slots: per tied row, how many entries share the boundary
    score, and how many of them the top-k keeps.
  """

  k: int
  rows: int
  tied_rows: np.ndarray
  zero_tied_rows: int
  group_sizes: np.ndarray
  slots: np.ndarray


def boundary_ties(scores, k: int) -> BoundaryTies:
  """Finds rows whose top-k boundary falls inside a group of equal scores."""
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


def approx_topk_reduction_size(n: int, k: int, recall_target: float,
                               rank: int = 2) -> int | None:
  """Candidates the TPU's ApproxTopK keeps from n before its exact final top-k.

  The TPU algorithm (arXiv:2206.14286) reduces each of several bins to its
  maximum, then takes an exact top-k of the bin maxima; this is the number
  of bins, from XLA's own `ApproxTopKReductionOutputSize` (a private jaxlib
  binding). n means nothing is dropped: the result is an exact top-k. None
  if this jaxlib does not expose the binding.
  """
  try:
    from jax._src.lib import _jax  # pylint: disable=g-import-not-at-top
    fn = _jax.approx_top_k_reduction_output_size
  except (ImportError, AttributeError):
    return None
  return int(fn(n, rank, k, recall_target, False, -1)[0])
