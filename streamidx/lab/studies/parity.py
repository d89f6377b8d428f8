"""Notebook 05's studies: what the kernel's approximations cost.

Each works on arrays the reference (or kernel) produced:

  page_coverage          how much of the exact token top-k lies in the
                         top-k pages (page mode's approximation)
  causal_rule_diff       the seed's causal rule against the model's, row by
                         row (`streamidx.semantics.CAUSAL_RULES`)
  boundary_ties          exact ties between the k-th and (k+1)-th scores
  tie_breaks             which of the tied entries a top-k kept
  approx_topk_agreement  `lax.approx_max_k(recall_target=1.0)` vs `lax.top_k`

The kernel-vs-reference parity check itself (the case matrix, `run_case`,
the tie tolerance) is `streamidx.lab.studies.cases`.

Index arrays are i32[T, k] with -1 padding; score arrays are f32[T, E] masked
scores with -inf for invisible entries (`ref.token_scores`, `ref.page_scores`).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from streamidx import batch as batch_lib
from streamidx import ref as ref_lib
from streamidx.semantics import CAUSAL_RULES

__all__ = [
    "PageCoverage",
    "page_coverage",
    "CausalDiff",
    "causal_rule_diff",
    "BoundaryTies",
    "boundary_ties",
    "tie_breaks",
    "approx_topk_agreement",
    "approx_topk_reduction_size",
]


# ---------------------------------------------------------------------------
# Page mode: how much of the exact token top-k the selected pages hold.


@dataclasses.dataclass(frozen=True)
class PageCoverage:
  """Coverage of a token top-k by a page top-k, over rows with any token.

  count: mean over rows of (tokens in selected pages) / (tokens selected).
  mass: mean over rows of the same ratio of summed exact scores.
  per_row_count, per_row_mass: f64[rows counted].
  rows: the rows counted (i64 indices).
  """

  count: float
  mass: float
  per_row_count: np.ndarray
  per_row_mass: np.ndarray
  rows: np.ndarray


def page_coverage(token_topk, page_topk, page_size: int,
                  exact_scores) -> PageCoverage:
  """How much of a token top-k lies inside a page top-k, by count and mass.

  Args:
    token_topk: i32[T, k] sequence-local entries (e.g. the exact float32
      token top-k), -1 padding.
    page_topk: i32[T, k_pages] sequence-local pages, -1 padding.
    page_size: entries per page (entry s is in page s // page_size).
    exact_scores: f32[T, E] the scores whose mass is counted (>= 0 where
      selected: ReLU scores with positive weights).

  Rows whose token top-k is empty are skipped. A row whose selected tokens
  all score 0 counts its mass coverage as its count coverage.
  """
  token_topk = np.asarray(token_topk)
  page_topk = np.asarray(page_topk)
  scores = np.asarray(exact_scores, np.float64)
  counts, masses, rows = [], [], []
  for r in range(token_topk.shape[0]):
    tok = token_topk[r][token_topk[r] >= 0]
    if len(tok) == 0:
      continue
    pages = page_topk[r][page_topk[r] >= 0]
    inside = np.isin(tok // page_size, pages)
    s = scores[r, tok]
    if np.any(s < 0) or not np.all(np.isfinite(s)):
      raise ValueError(f"row {r}: selected tokens need finite scores >= 0 "
                       "to count score mass")
    count = inside.mean()
    total = s.sum()
    counts.append(count)
    masses.append(s[inside].sum() / total if total > 0 else count)
    rows.append(r)
  counts, masses = np.asarray(counts), np.asarray(masses)
  return PageCoverage(
      count=float(counts.mean()) if len(counts) else float("nan"),
      mass=float(masses.mean()) if len(masses) else float("nan"),
      per_row_count=counts, per_row_mass=masses, rows=np.asarray(rows, int))


# ---------------------------------------------------------------------------
# The causal rule: the seed's `s <= p // ratio` against the model's
# `s < (p + 1) // ratio`.


@dataclasses.dataclass(frozen=True)
class CausalDiff:
  """The seed's causal rule against the model's, per query row (all [T]).

  positions: absolute position p (-1: padding row).
  visible_model, visible_seed: entries the row sees under each rule (the
    causal bound capped by the sequence's seq_len // ratio entries).
  bound_differs: the seed's rule lets the row see one more entry, the
    block p // ratio that holds the query's own future tokens.
  leaked_entry: that entry, or -1.
  selection_differs: the two top-k index sets differ.
  entries_changed: entries in the seed's top-k and not in the model's.
  leaked_selected: the leaked entry is in the seed's top-k.
  leaked_rank: its rank there (0: best), or -1.
  leaked_mass: its share of the seed top-k's summed score (0 if absent).
  """

  positions: np.ndarray
  visible_model: np.ndarray
  visible_seed: np.ndarray
  bound_differs: np.ndarray
  leaked_entry: np.ndarray
  selection_differs: np.ndarray
  entries_changed: np.ndarray
  leaked_selected: np.ndarray
  leaked_rank: np.ndarray
  leaked_mass: np.ndarray

  @property
  def rows_changed(self) -> int:
    return int(self.selection_differs.sum())


def causal_rule_diff(inputs: batch_lib.IndexerInputs, *, k: int,
                     compression_ratio: int, seed_topk=None,
                     model_topk=None) -> CausalDiff:
  """Compares the two causal rules' top-k on `inputs` (reference scores).

  seed_topk, model_topk: i32[T, k] selections to analyse (e.g. the
  kernel's under each rule); default: the reference's.
  """
  b = inputs.batch
  scores = {}
  for rule in CAUSAL_RULES:
    scores[rule] = np.asarray(ref_lib.token_scores(
        *inputs.args, compression_ratio=compression_ratio, causal_rule=rule))
  if seed_topk is None:
    seed_topk = ref_lib.topk_from_scores(jnp.asarray(scores["seed"]), k)
  if model_topk is None:
    model_topk = ref_lib.topk_from_scores(jnp.asarray(scores["model"]), k)
  seed_topk, model_topk = np.asarray(seed_topk), np.asarray(model_topk)
  t = b.num_tokens
  pos = b.token_positions()
  live = b.token_seq_ids() >= 0
  visible = {rule: ref_lib.visible_counts(
      b.seq_lens, b.cu_q_lens, b.num_seqs, t,
      compression_ratio=compression_ratio, causal_rule=rule)
             for rule in CAUSAL_RULES}
  differs = live & (visible["seed"] != visible["model"])
  leaked = np.where(differs, visible["seed"] - 1, -1)
  sel_diff = np.zeros(t, bool)
  changed = np.zeros(t, np.int64)
  selected = np.zeros(t, bool)
  rank = np.full(t, -1, np.int64)
  mass = np.zeros(t, np.float64)
  for r in range(t):
    s_set = set(seed_topk[r][seed_topk[r] >= 0].tolist())
    m_set = set(model_topk[r][model_topk[r] >= 0].tolist())
    sel_diff[r] = s_set != m_set
    changed[r] = len(s_set - m_set)
    if leaked[r] >= 0 and leaked[r] in s_set:
      selected[r] = True
      row = seed_topk[r]
      rank[r] = int(np.flatnonzero(row == leaked[r])[0])
      vals = scores["seed"][r, row[row >= 0]].astype(np.float64)
      total = vals.sum()
      mass[r] = scores["seed"][r, leaked[r]] / total if total > 0 else 0.0
  return CausalDiff(positions=pos, visible_model=visible["model"],
                    visible_seed=visible["seed"], bound_differs=differs,
                    leaked_entry=leaked, selection_differs=sel_diff,
                    entries_changed=changed, leaked_selected=selected,
                    leaked_rank=rank, leaked_mass=mass)


# ---------------------------------------------------------------------------
# Ties at the k-th boundary.


@dataclasses.dataclass(frozen=True)
class BoundaryTies:
  """Exact ties between the k-th and (k+1)-th largest scores of each row.

  k: the k.
  rows: rows that see more than k entries (where a boundary exists).
  tied_rows: i64 indices of those whose k-th and (k+1)-th scores are equal:
    which of the tied entries make the top-k is the top-k's choice.
  zero_tied_rows: of them, ties at score 0 (entries every head's ReLU
    zeroed).
  group_sizes: per tied row, how many entries share the boundary score.
  slots: per tied row, how many of them the top-k keeps.
  """

  k: int
  rows: int
  tied_rows: np.ndarray
  zero_tied_rows: int
  group_sizes: np.ndarray
  slots: np.ndarray

  @property
  def fraction(self) -> float:
    return len(self.tied_rows) / self.rows if self.rows else float("nan")


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


def tie_breaks(topk, scores, ties: BoundaryTies) -> dict:
  """How a top-k chose among the tied entries of each tied row.

  Returns counts {"lowest_index": .., "highest_index": .., "other": ..,
  "not_a_tie_member": ..}: the kept tied entries are the lowest-indexed of
  the tie group, the highest-indexed, something else, or the selection kept
  an entry outside the group (that would be a wrong top-k, not a tie-break).
  """
  topk = np.asarray(topk)
  s = np.asarray(scores)
  out = {"lowest_index": 0, "highest_index": 0, "other": 0,
         "not_a_tie_member": 0}
  for r, m in zip(ties.tied_rows, ties.slots):
    idx = topk[r][topk[r] >= 0]
    kth = -np.partition(-s[r][np.isfinite(s[r])], ties.k - 1)[ties.k - 1]
    group = np.flatnonzero(s[r] == kth)
    kept = np.sort(idx[s[r, idx] == kth])
    if len(kept) != m or np.any(s[r, idx] < kth):
      out["not_a_tie_member"] += 1
    elif np.array_equal(kept, group[:m]):
      out["lowest_index"] += 1
    elif np.array_equal(kept, group[len(group) - m:]):
      out["highest_index"] += 1
    else:
      out["other"] += 1
  return out


# ---------------------------------------------------------------------------
# approx_max_k against top_k.


def approx_topk_agreement(scores, k: int, recall_target: float = 1.0) -> dict:
  """`lax.approx_max_k(scores, k, recall_target)` against `lax.top_k`.

  Returns {"values_equal", "indices_equal", "sets_equal"}: bools over all
  rows (values and indices compared position by position; sets ignore
  order).
  """
  scores = jnp.asarray(scores)
  av, ai = jax.lax.approx_max_k(scores, k, recall_target=recall_target)
  ev, ei = jax.lax.top_k(scores, k)
  av, ai, ev, ei = (np.asarray(x) for x in (av, ai, ev, ei))
  sets = all(set(a.tolist()) == set(e.tolist()) for a, e in zip(ai, ei))
  return {"values_equal": bool(np.array_equal(av, ev)),
          "indices_equal": bool(np.array_equal(ai, ei)), "sets_equal": sets}


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
