"""Kernel-vs-reference parity over a named case matrix, and what the kernel's
approximations cost: page coverage, the causal rule, ties at the k-th entry.

Parity (`ParityCase`, `case_matrix`, `run_case`): each case is a small frozen
dataclass that builds its batch through `streamidx.batch` and knows its
kernel's keyword arguments. `case_outputs` runs the kernel and its reference
twin on the same inputs; `compare_case` compares them tie-aware
(`metrics.compare_topk`) into one `ParityRow` of the notebook's parity table;
`run_case` does both.

Shapes are shared: every case of `case_matrix()` pads its batch to the same
query rows, sequence slots, page-table columns and physical pages, so the
kernel compiles once per (cache format, ratio, k, causal rule, mode, heads),
not once per case. Sequence lengths are given in compressed entries and scaled
by the ratio, so a case means the same thing at ratios 1, 2 and 4.

Comparison tolerance (`comparison_atol`, alias `accumulation_atol`): kernel
and reference compute the same f32 sums but not always in the same order (on
CPU, XLA may sum the interpreted kernel's block-shaped dots differently from
the reference's; on a TPU the compiled kernel sums on the MXU in Mosaic's
order), so their scores may differ by a few ulps. The tie tolerance is
`metrics.summation_atol`, on every backend: four times the largest per-row
bound `metrics.summation_error_bound` on |f32 score - exact score|, derived
from the arithmetic (number of roundings, magnitudes of the inputs), never
fitted to observed differences; `ParityRow.atol` records it per case.

Approximation costs, on arrays the reference (or kernel) produced:
  page_coverage     how much of the exact token top-k lies in the top-k pages
  causal_rule_diff  the seed's causal rule against the model's, row by row
  boundary_ties     exact ties between the k-th and (k+1)-th scores
  tie_breaks        which of the tied entries a top-k kept
  approx_topk_agreement  `lax.approx_max_k(recall_target=1.0)` vs `lax.top_k`

Index arrays are i32[T, k] with -1 padding; score arrays are f32[T, E] masked
scores with -inf for invisible entries (`ref.token_scores`, `ref.page_scores`).
"""

from __future__ import annotations

import dataclasses
import time
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np

from streamidx import batch as batch_lib
from streamidx.kernels import vendored as kernel_lib
from streamidx import metrics
from streamidx import ref as ref_lib

__all__ = [
    "ParityCase",
    "ParityRow",
    "case_matrix",
    "case_by_name",
    "CI_CASES",
    "TIES_CASE",
    "SCOPES",
    "run_case",
    "CaseOutputs",
    "case_outputs",
    "compare_case",
    "comparison_atol",
    "accumulation_atol",
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

# The shared static shape of `case_matrix()`.
NUM_TOKENS = 48  # query rows (the rest of a case's rows are padding)
MAX_NUM_SEQS = 10  # sequence slots (the rest are padding sequences)
PAGE_SIZE = 16  # entries per page
PAGES_PER_SEQ = 16  # page-table columns: up to 256 entries per sequence
# The largest pool `make_batch` can need (fragmented: twice the used pages).
TOTAL_NUM_PAGES = 2 * MAX_NUM_SEQS * PAGES_PER_SEQ
NUM_HEADS = 8
K_BELOW = 8  # fewer than most rows see: the ranking decides
K_ABOVE = PAGES_PER_SEQ * PAGE_SIZE + 44  # more than any row can see, and
# more than the kernel's score columns: every visible entry, then -1 padding
K_PAGES_BELOW = 3
K_PAGES_ABOVE = PAGES_PER_SEQ  # every visible page, then -1
RATIOS = (1, 2, 4)
FORMATS = ("fp8", "bf16")
TOKEN_BLOCKS = dict(num_kv_pages_per_block=8, num_queries_per_block=(1, 8, 8))
PAGE_BLOCKS = dict(num_kv_pages_per_block=128, num_queries_per_block=8)

def _seq_len(spec, ratio: int, q_len: int = 1) -> int:
  """entries or (entries, extra tokens) -> seq_len in tokens (>= q_len)."""
  entries, extra = (spec, 0) if isinstance(spec, int) else spec
  return max(entries * ratio + min(extra, ratio - 1), q_len)


@dataclasses.dataclass(frozen=True)
class ParityCase:
  """One named kernel-vs-reference case.

  Sequence lengths are in compressed entries and scaled by the ratio:
    decode:  one per decode sequence, `entries` or `(entries, extra)`;
    prefill: chunked-prefill-only sequences, `(q_len, entries[, extra])`;
    mixed:   mixed-range sequences, `(q_len, entries[, extra])`.
  A sequence gets seq_len = entries * ratio + min(extra, ratio - 1) tokens
  (at least q_len): `extra` trailing tokens leave an incomplete block.

  page_mode: run `streamindex_page_topk` (k = k_pages; ratio 1 only) instead
    of `streamindex_topk`.
  num_tokens, max_num_seqs, pages_per_seq, total_num_pages: the padded static
    shape (None: what the batch itself needs).
  """

  name: str
  decode: tuple = ()
  prefill: tuple = ()
  mixed: tuple = ()
  compression_ratio: int = 4
  fmt: str = "fp8"
  k: int = K_BELOW
  causal_rule: str = "model"
  page_mode: bool = False
  page_size: int = PAGE_SIZE
  num_heads: int = NUM_HEADS
  head_dim: int = 128
  num_kv_pages_per_block: int | tuple = 8
  num_queries_per_block: int | tuple = (1, 8, 8)
  decode_req_batch_size: int = 4
  allocation: str = "fragmented"
  key_distribution: str = "gaussian"
  seed: int = 0
  num_tokens: int | None = None
  max_num_seqs: int | None = None
  pages_per_seq: int | None = None
  total_num_pages: int | None = None

  def batch(self) -> batch_lib.RaggedBatch:
    r = self.compression_ratio
    decode = [_seq_len(s, r) for s in self.decode]
    prefill = [(p[0], _seq_len(p[1:] if len(p) > 2 else p[1], r, p[0]))
               for p in self.prefill]
    mixed = [(p[0], _seq_len(p[1:] if len(p) > 2 else p[1], r, p[0]))
             for p in self.mixed]
    kw = dict(decode=decode, prefill=prefill, mixed=mixed,
              page_size=self.page_size, compression_ratio=r,
              allocation=self.allocation, pages_per_seq=self.pages_per_seq,
              max_num_seqs=self.max_num_seqs, num_tokens=self.num_tokens,
              seed=self.seed)
    b = batch_lib.make_mixed_batch(**kw)
    if self.total_num_pages is not None:
      extra = self.total_num_pages - b.total_num_pages
      if extra < 0:
        raise ValueError(f"case {self.name}: total_num_pages "
                         f"({self.total_num_pages}) < the {b.total_num_pages} "
                         "pages its batch needs")
      if extra:
        b = batch_lib.make_mixed_batch(extra_pages=extra, **kw)
    return b

  def inputs(self) -> batch_lib.IndexerInputs:
    return batch_lib.make_inputs(
        self.batch(), num_heads=self.num_heads, head_dim=self.head_dim,
        fmt=self.fmt, seed=self.seed, key_distribution=self.key_distribution)

  def kernel_kwargs(self) -> dict:
    """Keyword arguments of the kernel (and of its reference twin)."""
    kw = dict(compression_ratio=self.compression_ratio,
              num_kv_pages_per_block=self.num_kv_pages_per_block,
              num_queries_per_block=self.num_queries_per_block,
              causal_rule=self.causal_rule)
    if self.page_mode:
      return dict(k_pages=self.k, **kw)
    return dict(k=self.k, decode_req_batch_size=self.decode_req_batch_size,
                **kw)

  def args(self, inputs: batch_lib.IndexerInputs):
    """The kernel's positional arguments for this case's mode."""
    return inputs.page_args if self.page_mode else inputs.args

  def run_kernel(self, inputs):
    fn = (kernel_lib.streamindex_page_topk if self.page_mode
          else kernel_lib.streamindex_topk)
    return fn(*self.args(inputs), **self.kernel_kwargs())

  def run_reference(self, inputs):
    if self.page_mode:
      return ref_lib.streamindex_page_topk_ref(
          *self.args(inputs), one_token_per_seq=False, **self.kernel_kwargs())
    return ref_lib.streamindex_topk_ref(*self.args(inputs),
                                        **self.kernel_kwargs())

  def scores(self, inputs):
    """The masked scores the reference selects from: f32[T, E or pages]."""
    if self.page_mode:
      return ref_lib.page_scores(*self.args(inputs),
                                 compression_ratio=self.compression_ratio,
                                 causal_rule=self.causal_rule)
    return ref_lib.token_scores(*self.args(inputs),
                                compression_ratio=self.compression_ratio,
                                causal_rule=self.causal_rule)

  def atol(self, inputs) -> float:
    """`comparison_atol` for this case (`metrics.summation_atol`): > 0."""
    return comparison_atol(inputs, compression_ratio=self.compression_ratio,
                           causal_rule=self.causal_rule,
                           page_mode=self.page_mode)

  def launches(self, b: batch_lib.RaggedBatch | None = None) -> str:
    """The kernel launches that do work, with their program counts."""
    b = self.batch() if b is None else b
    if self.page_mode:
      return f"page x{b.num_seqs}"
    i, j, n = (int(x) for x in b.distribution)
    batched = i // self.decode_req_batch_size
    parts = []
    if batched:
      parts.append(f"decode[{self.decode_req_batch_size}] x{batched}")
    if i - batched * self.decode_req_batch_size:
      parts.append(f"decode[1] x{i - batched * self.decode_req_batch_size}")
    if j - i:
      parts.append(f"prefill x{j - i}")
    if n - j:
      parts.append(f"mixed x{n - j}")
    return ", ".join(parts)

  def visible(self, b: batch_lib.RaggedBatch | None = None) -> np.ndarray:
    """i64[T] entries (page mode: pages) each query row can see."""
    b = self.batch() if b is None else b
    counts = ref_lib.visible_counts(
        b.seq_lens, b.cu_q_lens, b.num_seqs, b.num_tokens,
        compression_ratio=self.compression_ratio, causal_rule=self.causal_rule)
    if self.page_mode:
      counts = -(-counts // self.page_size)
    return counts


# ---------------------------------------------------------------------------
# The case matrix.

# The four ways a batch can fill `distribution = (i, j, n)`, in entries.
DISTRIBUTIONS = {
    # 5 decode sequences: one batched decode program (4) and one remainder.
    "decode_only": dict(decode=(37, (64, 3), 100, 250, 5)),
    # Chunked prefill, one from scratch (q_len == seq_len at ratio 1).
    "prefill_only": dict(prefill=((7, 50, 1), (20, 90), (13, 3, 2))),
    # Mixed range: single-token and multi-token queries in one launch.
    "mixed_only": dict(mixed=((1, 77), (20, 90, 3), (9, 33), (1, 250))),
    # All three ranges in one call (and padding rows and sequence slots).
    "all_at_once": dict(decode=(37, 64, 100, 250, 45),
                        prefill=((7, 50, 1), (12, 3)),
                        mixed=((1, 77), (12, 60, 2))),
}
PAGE_DISTRIBUTIONS = ("prefill_only", "all_at_once")
SEED_RULE_DISTRIBUTIONS = ("prefill_only", "all_at_once")
_SHAPE = dict(num_tokens=NUM_TOKENS, max_num_seqs=MAX_NUM_SEQS,
              pages_per_seq=PAGES_PER_SEQ, total_num_pages=TOTAL_NUM_PAGES)

# Exact ties on purpose: with one head, an entry scores exactly 0 whenever
# its single dot product is negative (half of them), so rows that see a few
# more than k entries have their k-th boundary inside a group of zeros (the
# from-scratch prefill's rows see 1..30 entries). All four launches run.
TIES_CASE = ParityCase(name="ties_at_zero_all_launches_r1_fp8_k8_h1",
                       decode=(37, 64, 100, 250, 45),
                       prefill=((30, 30), (6, 20)), mixed=((1, 77), (6, 12)),
                       compression_ratio=1, fmt="fp8", k=K_BELOW, num_heads=1,
                       **TOKEN_BLOCKS, **_SHAPE)

# (fmt, ratio, k) groups of the pairwise matrix: every pair of values of
# two of these axes appears in some group (6 groups instead of 12).
PAIRWISE_GROUPS = (("fp8", 4, K_BELOW), ("fp8", 2, K_ABOVE),
                   ("fp8", 1, K_BELOW), ("bf16", 1, K_ABOVE),
                   ("bf16", 2, K_BELOW), ("bf16", 4, K_ABOVE))
PAIRWISE_PAGE_GROUPS = (("fp8", K_PAGES_BELOW), ("bf16", K_PAGES_ABOVE))

# The CI subset, two kernel compilations: the tie case (every launch) and
# one page case.
CI_CASES = (TIES_CASE.name, "page_all_at_once_fp8_kp3")
SCOPES = ("ci", "pairwise", "full")


def _token_case(dist, ratio, fmt, k, rule="model"):
  suffix = "" if rule == "model" else f"_{rule}_rule"
  return ParityCase(name=f"{dist}_r{ratio}_{fmt}_k{k}{suffix}",
                    compression_ratio=ratio, fmt=fmt, k=k, causal_rule=rule,
                    **TOKEN_BLOCKS, **_SHAPE, **DISTRIBUTIONS[dist])


def _page_case(dist, fmt, k_pages):
  return ParityCase(name=f"page_{dist}_{fmt}_kp{k_pages}", compression_ratio=1,
                    fmt=fmt, k=k_pages, page_mode=True, **PAGE_BLOCKS,
                    **_SHAPE, **DISTRIBUTIONS[dist])


def case_matrix(scope: str = "pairwise") -> list[ParityCase]:
  """The named cases of `scope`, cases that share a compilation adjacent.

  Axes: 4 distributions (`DISTRIBUTIONS`) x ratios (1, 2, 4) x formats
  (fp8, bf16) x k (8: below most rows' visible counts; 300: above every
  row's, and above the kernel's 256 score columns), under the model's causal
  rule; the seed's rule on the prefill batches (fp8, ratio 4, k 8); the
  tie case (`TIES_CASE`); page mode (ratio 1) on two distributions x
  formats x k_pages (3: below; 16: every page).

  scope:
    "full": every (format, ratio, k) and (format, k_pages): 59 cases, 18
      kernel compilations.
    "pairwise" (default): the (format, ratio, k) and (format, k_pages)
      groups of `PAIRWISE_GROUPS` / `PAIRWISE_PAGE_GROUPS`, each with every
      distribution; every pair of axis values is covered: 31 cases, 10
      compilations.
    "ci": `CI_CASES`, 2 cases, 2 compilations.
  """
  if scope not in SCOPES:
    raise ValueError(f"scope must be one of {SCOPES}, got {scope!r}")
  if scope == "full":
    groups = [(f, r, k) for f in FORMATS for r in RATIOS
              for k in (K_BELOW, K_ABOVE)]
    page_groups = [(f, kp) for f in FORMATS
                   for kp in (K_PAGES_BELOW, K_PAGES_ABOVE)]
  else:
    groups, page_groups = PAIRWISE_GROUPS, PAIRWISE_PAGE_GROUPS
  cases = []
  for fmt, ratio, k in groups:
    cases += [_token_case(d, ratio, fmt, k) for d in DISTRIBUTIONS]
  cases += [_token_case(d, 4, "fp8", K_BELOW, "seed")
            for d in SEED_RULE_DISTRIBUTIONS]
  cases.append(TIES_CASE)
  for fmt, kp in page_groups:
    cases += [_page_case(d, fmt, kp) for d in PAGE_DISTRIBUTIONS]
  if scope == "ci":
    by_name = {c.name: c for c in cases}
    cases = [by_name[n] for n in CI_CASES]
  return cases


def case_by_name(name: str) -> ParityCase:
  """The case called `name`, from the full matrix."""
  for case in case_matrix("full"):
    if case.name == name:
      return case
  raise KeyError(f"no parity case named {name!r}")


# ---------------------------------------------------------------------------
# Running and comparing.


@dataclasses.dataclass(frozen=True)
class ParityRow:
  """One line of the parity table.

  Attributes:
    case: the case's name.
    launches: kernel launches that did work (`ParityCase.launches`).
    rows: query rows compared (padding rows included).
    rows_k_over_visible: live rows that see fewer than k entries (pages).
    max_score_diff: largest |score| gap between the kernel's and the
      reference's selections, rank by rank (reference scores).
    sets_agree: every row's index set is identical.
    differing_positions: indices in one set but not the other, summed.
    tied_positions: of those, how many score the same as the reference's
      k-th entry (within `atol`; exact ties when atol is 0).
    rows_mismatched: rows that differ beyond ties (must be 0).
    atol: the tie tolerance used (`comparison_atol` by default).
    detail: the first mismatch, or "".
    seconds: wall time of kernel + reference (compilation included).
  """

  case: str
  launches: str
  rows: int
  rows_k_over_visible: int
  max_score_diff: float
  sets_agree: bool
  differing_positions: int
  tied_positions: int
  rows_mismatched: int
  atol: float
  detail: str
  seconds: float

  @property
  def ok(self) -> bool:
    return self.rows_mismatched == 0

  def as_dict(self) -> dict:
    return dict(dataclasses.asdict(self), ok=self.ok)


def compare_case(case: ParityCase, got, want, scores, *, atol: float = 0.0,
                 b: batch_lib.RaggedBatch | None = None,
                 seconds: float = float("nan")) -> ParityRow:
  """Compares kernel output `got` with reference output `want` for `case`."""
  b = case.batch() if b is None else b
  c = metrics.compare_topk(got, want, scores, atol=atol)
  live = b.token_seq_ids() >= 0
  over = int(np.sum(live & (case.visible(b) < case.k)))
  return ParityRow(case=case.name, launches=case.launches(b), rows=c.rows,
                   rows_k_over_visible=over,
                   max_score_diff=c.max_score_diff,
                   sets_agree=c.rows_identical == c.rows,
                   differing_positions=c.differing_positions,
                   tied_positions=c.tied_positions,
                   rows_mismatched=c.rows_mismatched, atol=float(atol),
                   detail=c.detail, seconds=seconds)


@dataclasses.dataclass(frozen=True)
class CaseOutputs:
  """What one run of a case produced.

  inputs: the case's `IndexerInputs`.
  got: i32[T, k] the kernel's indices; want: i32[T, k] the reference's.
  scores: f32[T, E] (page mode: [T, pages]) the reference's masked scores.
  seconds: wall time of kernel + reference (compilation included).
  """

  inputs: batch_lib.IndexerInputs
  got: np.ndarray
  want: np.ndarray
  scores: np.ndarray
  seconds: float


def case_outputs(case: ParityCase, *,
                 kernel_fn: Callable | None = None) -> CaseOutputs:
  """Runs `case`'s kernel and reference on its inputs.

  kernel_fn: replaces `case.run_kernel` (a function of the inputs), e.g. to
    check that a corrupted kernel is caught.
  """
  t0 = time.perf_counter()
  inputs = case.inputs()
  got = np.asarray((kernel_fn or case.run_kernel)(inputs))
  want = np.asarray(case.run_reference(inputs))
  seconds = time.perf_counter() - t0
  return CaseOutputs(inputs, got, want, np.asarray(case.scores(inputs)),
                     seconds)


def run_case(case: ParityCase, *, atol: float | None = None,
             kernel_fn: Callable | None = None) -> ParityRow:
  """Runs `case`'s kernel and reference and compares them.

  Args:
    case: the case.
    atol: tie tolerance; None (default) takes `case.atol(inputs)`
      (`comparison_atol`, the derived summation bound).
    kernel_fn: replaces `case.run_kernel` (see `case_outputs`).
  """
  out = case_outputs(case, kernel_fn=kernel_fn)
  if atol is None:
    atol = case.atol(out.inputs)
  return compare_case(case, out.got, out.want, out.scores, atol=atol,
                      b=out.inputs.batch, seconds=out.seconds)


def comparison_atol(inputs: batch_lib.IndexerInputs, *,
                    compression_ratio: int, causal_rule: str = "model",
                    page_mode: bool = False) -> float:
  """The tie tolerance for kernel vs reference: `metrics.summation_atol`.

  The same on every backend. Kernel and reference compute the same f32
  sums, but not necessarily in the same order: on a TPU the compiled kernel
  tiles them on the MXU; on the CPU the interpreted kernel's dots have the
  kernel's block shapes, the reference's its own, and XLA:CPU may pick a
  different summation for each (seen: 1 ulp, with one head). The tolerance is
  derived from the arithmetic (see `metrics.summation_error_bound`), printed
  per case, and never fitted to observed differences. f32 queries are
  accepted on CPU (their D products round too: the bound counts them) and
  refused on any other backend: a default-precision TPU matmul rounds them to
  bf16, which no summation-order bound covers.
  """
  if jax.default_backend() != "cpu" and inputs.q.dtype == jnp.float32:
    raise ValueError("comparison_atol: on a TPU the kernel's f32 queries are "
                     "rounded to bf16 by the MXU; use bf16 queries")
  return metrics.summation_atol(inputs, compression_ratio=compression_ratio,
                                causal_rule=causal_rule, page_mode=page_mode)


accumulation_atol = comparison_atol


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
  for rule in kernel_lib.CAUSAL_RULES:
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
             for rule in kernel_lib.CAUSAL_RULES}
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
