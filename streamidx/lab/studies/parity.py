"""Notebook 05's studies: what the kernel's approximations cost.

Each works on arrays the reference (or kernel) produced:

  page_coverage          how much of the exact token top-k lies in the
                         top-k pages (page mode's approximation)
  causal_rule_diff       the vendored kernel's causal rule ("seed") against
                         the model's, row by row
                         (`streamidx.semantics.CAUSAL_RULES`)
  boundary_ties          exact ties between the k-th and (k+1)-th scores
  tie_breaks             which of the tied entries a top-k kept
  approx_topk_agreement  `lax.approx_max_k(recall_target=1.0)` vs `lax.top_k`

The kernel-vs-reference parity check itself (the case matrix, `run_case`,
the tie tolerance) is `streamidx.lab.studies.cases`; `run_parity` runs a
matrix of it for the notebook (`ParityRun`: totals, a row per variant, the
variants side by side), `race_rows` its kernels under the race detector.

Index arrays are i32[T, k] with -1 padding; score arrays are f32[T, E] masked
scores with -inf for invisible entries (`ref.token_scores`, `ref.page_scores`).
"""

from __future__ import annotations

import dataclasses
import time

import jax
import jax.numpy as jnp
import numpy as np

from streamidx import batch as batch_lib
from streamidx import modes
from streamidx import ref as ref_lib
from streamidx.lab.studies import cases as cases_lib
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
    "ParityRun",
    "run_parity",
    "race_rows",
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


# ---------------------------------------------------------------------------
# The parity table of notebook 05: the case matrix, every variant.


@dataclasses.dataclass(frozen=True)
class ParityRun:
  """The case matrix run through every variant's kernel and reference.

  cases: the `cases.Case`s, in matrix order; rows: their `cases.ParityRow`s;
  kept: case name -> `cases.CaseOutputs` for the names asked to keep;
  seconds: wall time.
  """

  cases: tuple
  rows: tuple
  kept: dict
  seconds: float

  @property
  def failures(self) -> list:
    return [r for r in self.rows if not r.ok]

  def summary(self) -> dict:
    """Totals over every case (JSON-ready)."""
    rows = self.rows
    return dict(cases=len(rows), compilations=len(
        {c.compile_key for c in self.cases}),
                rows=sum(r.rows for r in rows),
                identical_cases=sum(r.sets_agree for r in rows),
                differing_positions=sum(r.differing_positions for r in rows),
                tied_positions=sum(r.tied_positions for r in rows),
                max_score_diff=max(r.max_score_diff for r in rows),
                max_atol=max(r.atol for r in rows),
                failures=len(self.failures), seconds=self.seconds)

  def by_variant(self) -> list[dict]:
    """One row per (variant, cache format): cases, rows, ties, failures."""
    out = {}
    for c, r in zip(self.cases, self.rows):
      d = out.setdefault((c.variant, c.fmt), dict(
          variant=c.variant, format=c.fmt, cases=0, query_rows=0,
          identical_cases=0, differing=0, ties=0, max_atol=0.0,
          mismatched_rows=0, seconds=0.0))
      d["cases"] += 1
      d["query_rows"] += r.rows
      d["identical_cases"] += int(r.sets_agree)
      d["differing"] += r.differing_positions
      d["ties"] += r.tied_positions
      d["max_atol"] = max(d["max_atol"], r.atol)
      d["mismatched_rows"] += r.rows_mismatched
      d["seconds"] += r.seconds
    return list(out.values())

  def side_by_side(self) -> list[dict]:
    """The matrix with the variants side by side.

    One row per (mode, batch, ratio, k, causal rule, heads); one column per
    (variant, cache format), holding "=" (identical index sets), "= (n
    ties)" (they differ only by n tied positions), "MISMATCH" or "" (the
    case is not in this scope).
    """
    columns = list(dict.fromkeys(f"{c.variant} {c.fmt}" for c in self.cases))
    table = {}
    for c, r in zip(self.cases, self.rows):
      key = (c.mode, c.batch_name, c.compression_ratio, c.k, c.causal_rule,
             c.num_heads)
      row = table.setdefault(key, dict(
          mode=c.mode, batch=c.batch_name, ratio=c.compression_ratio, k=c.k,
          rule=c.causal_rule, heads=c.num_heads, **{col: "" for col in columns}))
      row[f"{c.variant} {c.fmt}"] = (
          "MISMATCH" if not r.ok else "=" if r.sets_agree
          else f"= ({r.tied_positions} ties)")
    return list(table.values())


def run_parity(matrix, *, keep=()) -> ParityRun:
  """Runs every case of `matrix` (`cases.case_outputs`) and compares it at
  its derived tolerance (`Case.atol`, `metrics.summation_atol`).

  keep: names of cases whose outputs to keep (`ParityRun.kept`).
  """
  t0 = time.perf_counter()
  rows, kept = [], {}
  for case in matrix:
    out = cases_lib.case_outputs(case)
    rows.append(cases_lib.compare_case(case, out.got, out.want, out.scores,
                                       atol=case.atol(out.inputs),
                                       b=out.inputs.batch,
                                       seconds=out.seconds))
    if case.name in keep:
      kept[case.name] = out
  return ParityRun(tuple(matrix), tuple(rows), kept, time.perf_counter() - t0)


def race_rows(matrix) -> list[dict]:
  """Runs each case's kernel under the interpreter's race detector
  (`streamidx.race_check`) and reports it.

  Returns:
    [dict(case, launches (interpreted launches seen), races_found, seconds)].
  """
  out = []
  for case in matrix:
    inputs = case.inputs()
    t0 = time.perf_counter()
    with modes.race_check() as report:
      jax.block_until_ready(case.run_kernel(inputs))
    out.append(dict(case=case.name, launches=report.launches,
                    races_found=bool(report.races_found),
                    seconds=time.perf_counter() - t0))
  return out


# ---------------------------------------------------------------------------
# Notebook 05's sections as tables.


def causal_summary(cd: CausalDiff, b: batch_lib.RaggedBatch, *,
                   compression_ratio: int) -> dict:
  """`causal_rule_diff`'s result in numbers (JSON-ready).

  live_rows; rows_incomplete_block (live rows with (p + 1) % ratio != 0);
  rows_bound_differs (of those, rows whose block p // ratio is in the
  cache: the vendored rule shows them one more entry); rows_changed and
  entries_changed (top-k sets that change, entries that do);
  leaked_selected_rows; leaked_mass_mean / _max (the leaked entry's share
  of the top-k score where it is selected); leaked_ranks (its ranks, 0 =
  best); per_sequence (one dict per sequence).
  """
  live = b.token_seq_ids() >= 0
  incomplete = live & ((cd.positions + 1) % compression_ratio != 0)
  sel = cd.leaked_selected
  mass = cd.leaked_mass[sel]
  seq_ids = b.token_seq_ids()
  per_seq = []
  for s in range(b.num_seqs):
    rows = np.flatnonzero(seq_ids == s)
    vis = cd.visible_model[rows]
    per_seq.append(dict(
        sequence=s, q_len=int(b.q_lens[s]), seq_len=int(b.seq_lens[s]),
        visible_entries=f"{vis.min()}..{vis.max()}",
        rows_bound_differs=int(cd.bound_differs[rows].sum()),
        rows_topk_changes=int(cd.selection_differs[rows].sum())))
  return dict(live_rows=int(live.sum()),
              rows_incomplete_block=int(incomplete.sum()),
              rows_bound_differs=int(cd.bound_differs.sum()),
              rows_changed=cd.rows_changed,
              entries_changed=int(cd.entries_changed.sum()),
              leaked_selected_rows=int(sel.sum()),
              leaked_mass_mean=float(mass.mean()) if sel.any() else 0.0,
              leaked_mass_max=float(mass.max()) if sel.any() else 0.0,
              leaked_ranks=sorted(cd.leaked_rank[sel].tolist()),
              per_sequence=per_seq)


def page_coverage_study(*, page_entries: int, page_rows: int, page_sizes,
                        budgets, num_heads: int, seed: int = 0) -> dict:
  """Page mode's coverage of the exact token top-k, over page sizes at equal
  token budgets `k = k_pages * page_size` (notebook 05, section 4).

  Two sequences of `page_entries` entries (ratio 1), `page_rows` query rows
  each; pages selected by the reference's page scores from the FP8 cache
  and from the float32 keys; coverage by `page_coverage`.

  Returns:
    "fp8" / "f32" -> {"count", "mass"} -> f64[len(budgets), len(page_sizes)].
  """
  coverage = {fmt: {m: np.zeros((len(budgets), len(page_sizes)))
                    for m in ("count", "mass")} for fmt in ("fp8", "f32")}
  for j, ps in enumerate(page_sizes):
    pb = batch_lib.make_batch([(page_rows, page_entries)] * 2, page_size=ps,
                              compression_ratio=1, allocation="fragmented",
                              seed=seed)
    exact = batch_lib.make_inputs(pb, num_heads=num_heads, fmt="f32",
                                  seed=seed)
    exact_scores = ref_lib.token_scores(*exact.args, compression_ratio=1)
    exact_top = np.asarray(ref_lib.topk_from_scores(exact_scores,
                                                    max(budgets)))
    exact_scores = np.asarray(exact_scores)
    for fmt in coverage:
      x = exact if fmt == "f32" else exact.with_cache_format(fmt)
      pscores = ref_lib.page_scores(*x.page_args, compression_ratio=1)
      for i, budget in enumerate(budgets):
        pages = ref_lib.topk_from_scores(pscores, budget // ps)
        cov = page_coverage(exact_top[:, :budget], pages, ps, exact_scores)
        coverage[fmt]["count"][i, j] = cov.count
        coverage[fmt]["mass"][i, j] = cov.mass
  return coverage


def approx_rows(scores, ks, targets=(1.0, 0.95)) -> list[dict]:
  """`approx_topk_agreement` for each recall target and k, as table rows."""
  return [dict(recall_target=t, k=k, **approx_topk_agreement(scores, k, t))
          for t in targets for k in ks]


def tpu_sizing_rows(ns, ks, targets=(1.0, 0.95)) -> list[dict]:
  """Candidates a TPU's ApproxTopK keeps (XLA's sizing,
  `approx_topk_reduction_size`) per (n, k), one column per recall target."""
  return [dict(n=n, k=k, **{f"kept_at_{t}": approx_topk_reduction_size(n, k, t)
                            for t in targets})
          for n in sorted(set(ns)) for k in ks]


def tie_rate_rows(scores_by_format, ks) -> list[dict]:
  """Boundary ties of each score matrix over k: (row, k) pairs with a tie."""
  out = []
  for fmt, scores in scores_by_format.items():
    ties = [boundary_ties(scores, k) for k in ks]
    out.append(dict(format=fmt, tied=sum(len(t.tied_rows) for t in ties),
                    of_row_k_pairs=sum(t.rows for t in ties)))
  return out


def page_coverage_rows(coverage, page_sizes, budgets, *,
                       page_entries: int) -> list[dict]:
  """`page_coverage_study`'s result as table rows: one per (token budget,
  page size), with the pages per sequence, k_pages, the FP8 and float32
  coverage by count and by score mass, and what random pages would cover
  (budget / page_entries)."""
  return [dict(budget_k=b, pages=page_entries // ps, page_size=ps, k_pages=b // ps,
               **{f"{fmt}_{m}": f"{coverage[fmt][m][i, j]:.4f}"
                  for fmt in ("fp8", "f32") for m in ("count", "mass")},
               random=f"{b / page_entries:.4f}")
          for i, b in enumerate(budgets) for j, ps in enumerate(page_sizes)]


def answer_markdown(results: dict, *, by_variant, race_skip, k: int,
                    max_entries: int) -> str:
  """Notebook 05's answer, takeaways first, from the run's `results` (what
  it writes to results.json).

  Args:
    results: machine, kernel_mode, backend, parity {summary}, races (rows
      of `race_rows`), long_kernel_check (absent when not run), causal
      (`causal_summary` and k), page_coverage {entries, quote}, approx_max_k,
      ties {long_batch, ties_case}, notebook_seconds.
    by_variant: `ParityRun.by_variant()`; race_skip: why the race detector
      did not run (None when it did); k, max_entries: the long-context
      batch's largest k and sequence.
  """
  ps_, c_, races = results["parity"]["summary"], results["causal"], results["races"]
  lk, ax = results.get("long_kernel_check"), results["approx_max_k"]
  quote, page_entries = results["page_coverage"]["quote"], results["page_coverage"]["entries"]
  tie_rates, breaks = results["ties"]["long_batch"], results["ties"]["ties_case"]
  per_variant = "; ".join(f"{v['variant']} {v['format']}: {v['cases']} cases, {v['ties']} tied positions"
                          for v in by_variant)
  said = lambda counts: ", ".join(f"{key.replace('_', ' ')} {v}" for key, v in counts.items())
  return f"""**Answer** (computed in this run on {results['machine']}):

- **Parity: every variant matched the exact reference on all {ps_['cases']} cases** of the {ps_['scope']!r} matrix
  ({ps_['compilations']} compilations, {ps_['rows']} query rows, kernels {results['kernel_mode']}): {ps_['identical_cases']} cases with
  identical index sets, {ps_['differing_positions']} differing positions, all ties within the derived tolerance
  (largest score gap {ps_['max_score_diff']:.2g}, largest atol {ps_['max_atol']:.2g}). Per variant: {per_variant}.
- **Races**: {f"none found on {len(races)} cases ({', '.join(r['case'] for r in races)})" if races else
  f"not run ({race_skip or 'race_variants is empty'})"}.
- **Long context**: {f"the FP8 kernel selects the reference's top-{k} on all {lk['rows']} rows "
  f"of sequences up to {max_entries} entries ({lk['tied']} rows differing only by ties)" if lk
  else "kernel not run (long_kernel_check=False)"}. FP8's recall: the FP8-packing notebook (03), section 3.
- **Keep `causal_rule="model"`**: on the prefill batch the vendored rule changes the top-{c_['k']} of
  {c_['rows_changed']} of {c_['live_rows']} query rows; {c_['rows_bound_differs']} rows see one extra (future) entry, and
  where the top-k takes it, it holds {c_['leaked_mass_mean']:.1%} of the top-k score on average (at most {c_['leaked_mass_max']:.1%}).
- **Page mode** at a budget of {quote['budget']} tokens with {quote['page_size']}-entry pages: the top pages (FP8) hold
  {quote['count']:.1%} of the exact token top-k by count, {quote['mass']:.1%} by score (random pages:
  {quote['budget'] / page_entries:.1%}); Gaussian keys have no locality, so this is a floor.
- **approx_max_k(recall_target=1.0)** vs top_k on {results['backend']}: {'identical values and indices for every k' if ax['identical_here']
  else 'NOT identical'}; {"on a TPU, XLA keeps all n candidates at recall_target=1.0 (exact as a set, order among ties unspecified)"
  if ax['sizing_available'] and ax['keeps_all_at_recall_1'] else "XLA's TPU sizing could not be read here"}.
- **Ties**: {tie_rates[0]['tied']} boundary ties in {tie_rates[0]['of_row_k_pairs']} (row, k) pairs with FP8 keys on the
  long-context batch; in the tie case the kernel kept {said(breaks['kernel'])},
  the reference {said(breaks['reference'])} (tie groups kept by choice).
- Reproduce: `python -m streamidx.workbook --only 05` ({results['notebook_seconds']:.0f} s after imports in this run).
"""
