"""Comparing top-k results: tie-aware parity, recall, score error. Index
arrays i32[T, k] (-1 padding), score arrays f32[T, entries] masked with -inf
(`streamidx.ref.token_scores` / `page_scores`); NumPy values out.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from streamidx.semantics import DEFAULT_CAUSAL_RULE


@dataclasses.dataclass
class TopkComparison:
  """Result of `compare_topk` over T rows."""

  rows: int
  rows_identical: int  # equal index sets
  rows_tied: int  # sets differ only at ties with the k-th score: a match
  rows_mismatched: int  # differ beyond ties: a real disagreement
  differing_positions: int  # indices in one set but not the other, summed
  tied_positions: int  # those of them that are ties
  max_score_diff: float  # largest |score| difference, selections sorted
  first_bad_row: int  # -1: none
  detail: str  # a sentence on the first mismatch ("" if none)

  ok = property(lambda self: self.rows_mismatched == 0)


def compare_topk(got, want, scores, *, atol: float = 0.0) -> TopkComparison:
  """Tie-aware comparison of got and want, i32[T, k], on the masked scores
  f32[T, E] `want` was selected from: a row matches when both hold as many valid
  indices, none repeated, all visible, and the sets are equal or every index of
  their symmetric difference scores the boundary score (the smallest `want`
  selected) within `atol` (kernel vs reference: `summation_atol`)."""
  got = np.asarray(got)
  want = np.asarray(want)
  scores = np.asarray(scores, np.float64)
  if got.shape != want.shape:
    raise ValueError(f"got {got.shape} and want {want.shape} differ in shape")
  t = got.shape[0]
  identical = tied = bad = diff_pos = tie_pos = 0
  max_diff = 0.0
  first_bad, detail = -1, ""
  for r in range(t):
    g = got[r][got[r] >= 0]
    w = want[r][want[r] >= 0]
    gs, ws = scores[r][g], scores[r][w]  # g, w >= 0
    problem = ""
    if len(g) != len(w):
      problem = f"{len(g)} valid indices vs {len(w)}"
    elif len(set(g.tolist())) != len(g):
      problem = "repeated index"
    elif np.any(g >= scores.shape[1]) or np.any(np.isneginf(gs)):
      problem = "selects an invisible entry"
    sg, sw = set(g.tolist()), set(w.tolist())
    sym = sorted(sg ^ sw)
    if not problem and len(g):
      d = np.abs(np.sort(gs) - np.sort(ws))
      max_diff = max(max_diff, float(d.max()))
    if not problem and not sym:
      identical += 1
      continue
    if not problem:
      boundary = ws.min()
      sym_scores = scores[r][np.asarray(sym)]
      ties = np.abs(sym_scores - boundary) <= atol
      diff_pos += len(sym)
      tie_pos += int(ties.sum())
      if ties.all():
        tied += 1
        continue
      problem = (f"entries {[s for s, ok in zip(sym, ties) if not ok][:5]} "
                 f"differ with scores "
                 f"{sym_scores[~ties][:5].tolist()} vs boundary {boundary}")
    else:
      diff_pos += len(sym)
    bad += 1
    if first_bad < 0:
      first_bad = r
      detail = f"row {r}: {problem}"
  return TopkComparison(t, identical, tied, bad, diff_pos, tie_pos, max_diff,
                        first_bad, detail)


def assert_topk_match(got, want, scores, *, atol: float = 0.0, label=""):
  """Raises AssertionError (with the first bad row) unless `compare_topk` ok."""
  c = compare_topk(got, want, scores, atol=atol)
  if not c.ok:
    raise AssertionError(
        f"{label + ': ' if label else ''}{c.rows_mismatched}/{c.rows} rows "
        f"disagree; {c.detail}")
  return c


def recall_at_k(got, want, exact_scores=None) -> float:
  """Mean over rows of |got ∩ want| / |want| (rows with empty `want` skipped).

  With `exact_scores` (the scores `want` was taken from), an entry of `got`
  whose exact score ties the boundary of `want` counts as a hit, so ties at
  the k-th position never cost recall.
  """
  got = np.asarray(got)
  want = np.asarray(want)
  vals = []
  for r in range(got.shape[0]):
    w = want[r][want[r] >= 0]
    if len(w) == 0:
      continue
    g = got[r][got[r] >= 0]
    hits = len(set(g.tolist()) & set(w.tolist()))
    if exact_scores is not None:
      es = np.asarray(exact_scores[r], np.float64)
      boundary = es[w].min()
      extra = [x for x in set(g.tolist()) - set(w.tolist())
               if es[x] >= boundary]
      hits = min(len(w), hits + len(extra))
    vals.append(hits / len(w))
  return float(np.mean(vals)) if vals else float("nan")


def score_error(approx, exact) -> dict:
  """{"median", "p99", "max"} of |approx - exact| / |exact|, "max_abs" and
  "count", over entries where both are finite and `exact` is nonzero."""
  a = np.asarray(approx, np.float64)
  e = np.asarray(exact, np.float64)
  m = np.isfinite(a) & np.isfinite(e) & (e != 0)
  if not m.any():
    return {"median": float("nan"), "p99": float("nan"), "max": float("nan"),
            "max_abs": float("nan"), "count": 0}
  rel = np.abs(a[m] - e[m]) / np.abs(e[m])
  return {"median": float(np.median(rel)), "p99": float(np.quantile(rel, .99)),
          "max": float(rel.max()), "max_abs": float(np.abs(a[m] - e[m]).max()),
          "count": int(m.sum())}


# ---------------------------------------------------------------------------
# How far two correct f32 evaluations of the same score can be apart.

F32_UNIT_ROUNDOFF = 2.0**-24


def _gamma(n: int) -> float:
  return n * F32_UNIT_ROUNDOFF / (1 - n * F32_UNIT_ROUNDOFF)


# The smallest normal f32: XLA (CPU and TPU) flushes results below it to 0.
F32_TINY = 2.0**-126


def flush_error_bound(inputs) -> np.ndarray:
  """f64[T]: per query row, a bound on what flushing subnormal f32 results
  to zero moves a score by (docs/semantics.md): each of the 2D - 1 product
  and sum steps of a head (times |w_h|) and the 2H - 1 of the head sum lose
  under `F32_TINY` in stored units, times the largest scale s (1, or twice
  the largest |key| over E2M1_MAX); the final scale multiply one more."""
  from streamidx import cache as cache_lib  # pylint: disable=g-import-not-at-top

  w = np.abs(np.asarray(inputs.weights, np.float64)).sum(axis=1)
  _, num_heads, head_dim = inputs.q.shape
  amax = float(np.max(np.abs(np.asarray(inputs.keys, np.float64)), initial=0.0))
  s = max(1.0, 2.0 * amax / cache_lib.E2M1_MAX)
  return F32_TINY * (s * ((2 * head_dim - 1) * w + 2 * num_heads - 1) + 1)


def summation_error_bound(inputs, *, compression_ratio: int,
                          causal_rule: str = DEFAULT_CAUSAL_RULE,
                          mode: str = "token") -> np.ndarray:
  """f64[T]: per query row of `inputs` (`IndexerInputs`), a bound on |f32
  score - exact score|: gamma_n times the row's largest scale * sum_h |w_h|
  sum_d |q_hd k_d|, n = D + H - 1 roundings (+ D for f32 queries), plus
  `flush_error_bound` (docs/semantics.md); mode "page": pooled page scores."""
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top

  from streamidx import ref as ref_lib  # pylint: disable=g-import-not-at-top

  absolute = dataclasses.replace(inputs, q=jnp.abs(inputs.q),
                         weights=jnp.abs(inputs.weights),
                         keys=jnp.abs(inputs.keys)).with_cache_format(
                             inputs.fmt)
  if mode not in ("token", "page"):
    raise ValueError(f"mode: must be 'token' or 'page' (got {mode!r})")
  scores, args = ((ref_lib.page_scores, absolute.page_args) if mode == "page"
                  else (ref_lib.token_scores, absolute.args))
  b = np.asarray(scores(*args, compression_ratio=compression_ratio,
                        causal_rule=causal_rule), np.float64)
  b_row = np.max(np.where(np.isfinite(b), b, 0.0), axis=1, initial=0.0)
  _, num_heads, head_dim = inputs.q.shape
  n = head_dim + num_heads - 1
  if jnp.dtype(inputs.q.dtype) == jnp.dtype(jnp.float32):
    n += head_dim
  return _gamma(n) * b_row + flush_error_bound(inputs)


def summation_atol(inputs, *, compression_ratio: int,
                   causal_rule: str = DEFAULT_CAUSAL_RULE, mode: str = "token") -> float:
  """Tie tolerance for comparing two f32 implementations' top-k: 4 * the
  largest `summation_error_bound` (docs/semantics.md says why 4)."""
  e = summation_error_bound(inputs, compression_ratio=compression_ratio,
                            causal_rule=causal_rule, mode=mode)
  return 4.0 * float(e.max(initial=0.0))
