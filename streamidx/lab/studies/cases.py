"""The case matrix: named batches run through every registered kernel variant,
for the tests and notebook 04's parity table (docs/testing.md, "The case matrix").
"""

from __future__ import annotations

import dataclasses
import itertools
import time
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np

from streamidx import batch as batch_lib
from streamidx import metrics
from streamidx import ref as ref_lib
from streamidx import variants as variants_lib
from streamidx.lab.model import tiling
from streamidx.lab.shapes import DSV4
from streamidx.semantics import DEFAULT_CAUSAL_RULE, cdiv

# ---------------------------------------------------------------------------
# The shared static shape.

NUM_TOKENS = 48  # query rows (the rest of a case's rows are padding)
MAX_NUM_SEQS = 10  # sequence slots (the rest are padding sequences)
PAGE_SIZE = 16  # entries per page
PAGES_PER_SEQ = 24  # page-table columns: 384 entries, 3 decode KV blocks
NUM_ENTRIES = PAGE_SIZE * PAGES_PER_SEQ
# The largest pool `make_batch` can need (fragmented: twice the used pages).
TOTAL_NUM_PAGES = 2 * MAX_NUM_SEQS * PAGES_PER_SEQ
NUM_HEADS = 4
RATIOS = (1, 2, 4)  # token variants; page variants run at ratio 1

# The small test block sizes (docs/testing.md), by mode (or variant name).
TEST_BLOCKS = {
    "token": dict(num_kv_pages_per_block=(8, 16, 8),
                  num_queries_per_block=(1, 8, 8)),
    "page": dict(num_kv_pages_per_block=128, num_queries_per_block=8),
}


def blocks_for(variant: variants_lib.Variant | str) -> dict:
  """`TEST_BLOCKS` for a variant: its own entry, else its mode's."""
  v = variants_lib.get(variant) if isinstance(variant, str) else variant
  return dict(TEST_BLOCKS.get(v.name, TEST_BLOCKS[v.mode]))


# k per scope: the notebook's one below most rows' visible counts and one
# above all (then -1 padding); the tests' with live rows on both sides.
K_BELOW = 8
K_ABOVE = 2 * NUM_ENTRIES + 44
K_PAGES_BELOW = 3
K_PAGES_ABOVE = PAGES_PER_SEQ  # every visible page, then -1
K_TESTS = 40
K_PAGES_TESTS = 6
MTP_Q_LENS = (2, 3, 4)  # gamma + 1 of the speculative-decoding batches
PRODUCTION_KS = (512, 1024, 2048)  # V4-Flash, V4-Pro, V3.2 (top-k entries)
PRODUCTION_BATCH = "production_topk_h64_p128"

# ---------------------------------------------------------------------------
# The named batches.


def _seq_len(spec, ratio: int, q_len: int = 1) -> int:
  """entries or (entries, extra tokens) -> seq_len in tokens (>= q_len)."""
  entries, extra = (spec, 0) if isinstance(spec, int) else spec
  return max(entries * ratio + min(extra, ratio - 1), q_len)


@dataclasses.dataclass(frozen=True)
class Batch:
  """A named ragged batch; lengths in compressed entries, scaled by the ratio."""

  name: str
  decode: tuple = ()
  prefill: tuple = ()
  mixed: tuple = ()
  allocation: str = "fragmented"
  note: str = ""
  decode_q_len: int = 1
  page_size: int = PAGE_SIZE
  pages_per_seq: int = PAGES_PER_SEQ

  def build(self, ratio: int, *, seed: int = 0) -> batch_lib.RaggedBatch:
    """The batch at compression ratio `ratio`, padded to the shared shape."""
    def pair(p):
      return (p[0], _seq_len(p[1:] if len(p) > 2 else p[1], ratio, p[0]))

    return batch_lib.make_mixed_batch(
        decode=[_seq_len(s, ratio, self.decode_q_len) for s in self.decode],
        prefill=[pair(p) for p in self.prefill],
        mixed=[pair(p) for p in self.mixed], decode_q_len=self.decode_q_len,
        page_size=self.page_size, compression_ratio=ratio,
        allocation=self.allocation, pages_per_seq=self.pages_per_seq,
        max_num_seqs=MAX_NUM_SEQS, num_tokens=NUM_TOKENS,
        total_num_pages=2 * MAX_NUM_SEQS * self.pages_per_seq, seed=seed)


BATCHES: dict[str, Batch] = {b.name: b for b in (
    # The four ways a batch can fill `distribution = (i, j, n)` (notebook 04).
    Batch("decode_only", decode=(37, (64, 3), 100, 250, 5),
          note="5 decode sequences: one batched decode program (4) and one "
               "remainder"),
    Batch("prefill_only_from_scratch",
          prefill=((7, 50, 1), (20, 90), (13, 3, 2)),
          note="chunked prefill, one from scratch (q_len == seq_len at "
               "ratio 1)"),
    Batch("mixed_single_and_multi_token",
          mixed=((1, 77), (20, 90, 3), (9, 33), (1, 250)),
          note="mixed range: single-token and multi-token queries in one "
               "launch"),
    Batch("all_at_once", decode=(37, 64, 100, 250, 45),
          prefill=((7, 50, 1), (12, 3)), mixed=((1, 77), (12, 60, 2)),
          note="all three ranges in one call, padding rows and sequence slots"),
    # Exact ties on purpose (one head, TIES_CASE): half the entries score
    # exactly 0, so rows seeing a few more than k entries tie at the k-th.
    Batch("ties_at_zero_all_launches", decode=(37, 64, 100, 250, 45),
          prefill=((30, 30), (6, 20)), mixed=((1, 77), (6, 12))),
    # Kernel-vs-reference coverage (the tests).
    Batch("decode_only_full_batches",
          decode=(384, 5, 130, 300, 1, 64, 200, 383)),
    Batch("decode_only_with_remainder", decode=(50, 384, 7, 129, 256, 90),
          allocation="contiguous"),
    Batch("decode_only_fewer_than_batch", decode=(100, 3, 300),
          allocation="shuffled"),
    Batch("prefill_only", prefill=((5, 40, 1), (13, 200, 3), (20, 384))),
    Batch("mixed_only", mixed=((1, 100), (12, 300, 2), (0, 0), (2, 0, 1),
                               (9, 129)), allocation="contiguous"),
    Batch("all_three_ranges", decode=(20, 384, 150, 2, 77),
          prefill=((7, 64, 1), (9, 260)),
          mixed=((1, 33), (12, 190, 3), (0, 0))),
    Batch("prefill_and_decode_in_mixed_range",
          mixed=((1, 384), (16, 180, 1), (1, 5), (8, 8), (1, 0, 1)),
          allocation="shuffled"),
    Batch("empty_and_tiny_sequences", decode=(0, 1, 0, 2),
          mixed=((0, 0), (0, 10), (1, 0), (3, 1, 1))),
    # Speculative decoding (M17): gamma + 1 rows per decode sequence, 7 of
    # them (a batched program of 4, a remainder of 3), an empty one, short ones.
    *(Batch(f"mtp{q}_decode_with_empty_and_short", decode=(
        0, 37, (64, 3), 100, 250, 1, 384), prefill=((5, 40, 1),),
        mixed=((1, 77),), decode_q_len=q, allocation="shuffled",
        note=f"gamma + 1 = {q} query rows per decode sequence")
      for q in MTP_Q_LENS),
    # DeepSeek-V4's production top-k: rows above and below every k.
    Batch(PRODUCTION_BATCH, decode=(3000, 600, 2100, 100, 1500),
          mixed=((3, 2600, 1),), page_size=DSV4.page_size, pages_per_seq=24,
          note="production shape: DeepSeek-V4's 64 heads x 128 dims, page "
          "size 128"),
)}

# Which batches each scope runs.
DISTRIBUTIONS = ("decode_only", "prefill_only_from_scratch",
                 "mixed_single_and_multi_token", "all_at_once")
PAGE_DISTRIBUTIONS = ("prefill_only_from_scratch", "all_at_once")
SEED_RULE_DISTRIBUTIONS = ("prefill_only_from_scratch", "all_at_once")
TEST_BATCHES = ("decode_only_full_batches", "decode_only_with_remainder",
                "decode_only_fewer_than_batch", "prefill_only", "mixed_only",
                "all_three_ranges", "prefill_and_decode_in_mixed_range",
                "empty_and_tiny_sequences")
TEST_PAGE_BATCHES = ("prefill_only", "mixed_only", "all_three_ranges",
                     "empty_and_tiny_sequences")
TEST_SEED_RULE_BATCHES = ("prefill_only", "all_three_ranges",
                          "prefill_and_decode_in_mixed_range")

# ---------------------------------------------------------------------------
# Cases.


@dataclasses.dataclass(frozen=True)
class Case:
  """One named kernel-vs-reference case: a variant on a `BATCHES` batch (k:
  `k_pages` in page mode; block sizes None: `blocks_for(variant)`)."""

  name: str
  batch_name: str
  variant: str = "vendored"
  compression_ratio: int = 4
  fmt: str = "fp8"
  k: int = K_BELOW
  causal_rule: str = DEFAULT_CAUSAL_RULE
  num_heads: int = NUM_HEADS
  head_dim: int = 128
  seed: int = 0
  key_distribution: str = "gaussian"
  num_kv_pages_per_block: int | tuple | None = None
  num_queries_per_block: int | tuple | None = None

  v = property(lambda self: variants_lib.get(self.variant))
  mode = property(lambda self: self.v.mode)

  @property
  def compile_key(self) -> tuple:
    """What one kernel compilation is shared by (the shape is shared)."""
    b = BATCHES[self.batch_name]
    return (self.variant, self.fmt, self.compression_ratio, self.k,
            self.causal_rule, self.num_heads, self.head_dim, b.decode_q_len,
            b.page_size, b.pages_per_seq)

  def blocks(self) -> dict:
    given = dict(num_kv_pages_per_block=self.num_kv_pages_per_block,
                 num_queries_per_block=self.num_queries_per_block)
    return {**blocks_for(self.v),
            **{n: b for n, b in given.items() if b is not None}}

  def static(self) -> dict:
    """The keyword arguments of `Variant.run` / `run_reference`."""
    return dict(k=self.k, compression_ratio=self.compression_ratio,
                fmt=self.fmt, causal_rule=self.causal_rule, **self.blocks())

  def batch(self) -> batch_lib.RaggedBatch:
    """The case's batch (`BATCHES[batch_name]` at its ratio and seed)."""
    return BATCHES[self.batch_name].build(self.compression_ratio,
                                          seed=self.seed)

  def inputs(self) -> batch_lib.IndexerInputs:
    return batch_lib.make_inputs(
        self.batch(), num_heads=self.num_heads, head_dim=self.head_dim,
        fmt=self.fmt, seed=self.seed, key_distribution=self.key_distribution)

  def run_kernel(self, inputs):
    return self.v.run(inputs, **self.static())

  def run_reference(self, inputs):
    return self.v.run_reference(inputs, **self.static())

  def scores(self, inputs):
    """The masked scores the reference selects from: f32[T, E or pages]."""
    return self.v.scores(inputs, compression_ratio=self.compression_ratio,
                         fmt=self.fmt, causal_rule=self.causal_rule)

  def atol(self, inputs) -> float:
    """`comparison_atol` for this case."""
    return comparison_atol(inputs, compression_ratio=self.compression_ratio,
                           causal_rule=self.causal_rule, mode=self.mode)

  def plan(self, b: batch_lib.RaggedBatch | None = None):
    """The tiling model's `Plan` of this case's kernel call."""
    b = self.batch() if b is None else b
    return tiling.plan(b, variant=self.variant, fmt=self.fmt,
                       num_heads=self.num_heads, head_dim=self.head_dim,
                       **self.blocks())

  def launches(self, b: batch_lib.RaggedBatch | None = None) -> str:
    """`tiling.Plan.summary` of the kernel's launches, e.g. "decode[4] x1"."""
    if self.variant not in tiling.MODELLED_VARIANTS:
      return f"(no tiling model of {self.variant})"
    return self.plan(b).summary()

  def visible(self, b: batch_lib.RaggedBatch | None = None) -> np.ndarray:
    """i64[T] entries (page mode: pages) each query row can see."""
    b = self.batch() if b is None else b
    counts = ref_lib.visible_counts(
        b.seq_lens, b.cu_q_lens, b.num_seqs, b.num_tokens,
        compression_ratio=self.compression_ratio, causal_rule=self.causal_rule)
    if self.mode == "page":
      counts = cdiv(counts, b.page_size)
    return counts


def _case(v, batch, ratio, fmt, k, rule="model", **kw) -> Case:
  suffix = "" if rule == "model" else f"_{rule}_rule"
  heads = kw.get("num_heads", NUM_HEADS)
  suffix += "" if heads == NUM_HEADS else f"_h{heads}"
  return Case(name=f"{v.name}/{batch}_r{ratio}_{fmt}_k{k}{suffix}",
              batch_name=batch,
              variant=v.name, compression_ratio=ratio, fmt=fmt, k=k,
              causal_rule=rule, **kw)


def _ties_case(v) -> Case:
  return _case(v, "ties_at_zero_all_launches", 1, v.cache_formats[0], K_BELOW,
               num_heads=1)


def _pairwise(formats, ratios, ks):
  """(fmt, ratio, k) groups in which every pair of axis values appears."""
  if len(formats) < 2:
    return [(f, r, k) for f in formats for r in ratios for k in ks]
  return [(f, r, ks[(i + j) % len(ks)]) for i, r in enumerate(ratios)
          for j, f in enumerate(formats)]


SCOPES = ("ci", "pairwise", "full", "tests")


def case_matrix(scope: str = "pairwise") -> list[Case]:
  """The named cases of `scope` (`SCOPES`, docs/testing.md) for every variant
  of `streamidx.VARIANTS`; cases that share a compilation are adjacent."""
  if scope not in SCOPES:
    raise ValueError(f"scope: must be one of {SCOPES} (got {scope!r})")
  cases = []
  for v in variants_lib.VARIANTS.values():
    token, formats = v.mode == "token", v.cache_formats
    ratios = RATIOS if token else (1,)
    if scope == "tests":
      k, batches = (K_TESTS, TEST_BATCHES) if token else (K_PAGES_TESTS, TEST_PAGE_BATCHES)
      groups = [(f, r, k) for f, r in itertools.product(formats, ratios)]
      seed = (list(itertools.product(formats, (2, 4))), TEST_SEED_RULE_BATCHES, K_TESTS)
    else:
      ks = (K_BELOW, K_ABOVE) if token else (K_PAGES_BELOW, K_PAGES_ABOVE)
      batches = DISTRIBUTIONS if token else PAGE_DISTRIBUTIONS
      groups = (list(itertools.product(formats, ratios, ks)) if scope == "full"
                else _pairwise(formats, ratios, ks))
      seed = ([(formats[0], 4)], SEED_RULE_DISTRIBUTIONS, K_BELOW)
      if scope == "ci":
        groups = [] if token else [(formats[0], 1, K_PAGES_BELOW)]
        batches, seed = ("all_at_once",), ([], (), 0)
    for fmt, ratio, k in groups:
      cases += [_case(v, b, ratio, fmt, k) for b in batches]
    if token:
      pairs, seed_batches, seed_k = seed
      for fmt, ratio in pairs:
        cases += [_case(v, b, ratio, fmt, seed_k, "seed") for b in seed_batches]
      if scope != "tests":
        cases.append(_ties_case(v))
  return cases


def case_by_name(name: str) -> Case:
  """The case called `name`, from any scope."""
  groups = (case_matrix("full"), case_matrix("tests"), mtp_cases(), production_cases())
  if (case := next((c for g in groups for c in g if c.name == name), None)) is None:
    raise KeyError(f"no case named {name!r}")
  return case


def mtp_cases() -> list[Case]:
  """Speculative decoding (M17): every token variant x its formats x gamma
  + 1 in `MTP_Q_LENS`, ratio 4, K_TESTS, on the `mtp<q>_...` batches."""
  return [_case(v, f"mtp{q}_decode_with_empty_and_short", 4, fmt, K_TESTS)
          for v in variants_lib.VARIANTS.values() if v.mode == "token"
          for fmt in v.cache_formats for q in MTP_Q_LENS]


def production_cases() -> list[Case]:
  """The production top-k sizes (`PRODUCTION_KS`) at DeepSeek-V4's geometry,
  FP8, vendored kernel, the block-size table's row for this chip."""
  row = variants_lib.block_sizes("vendored", cache_format="fp8",
                                 num_heads=DSV4.num_heads,
                                 page_size=DSV4.page_size)
  return [_case(variants_lib.get("vendored"), PRODUCTION_BATCH,
                DSV4.compression_ratio, "fp8", k, num_heads=DSV4.num_heads,
                head_dim=DSV4.head_dim,
                num_kv_pages_per_block=row.num_kv_pages_per_block,
                num_queries_per_block=row.num_queries_per_block)
          for k in PRODUCTION_KS]


TIES_CASE = _ties_case(variants_lib.get("vendored"))
CI_CASES = tuple(c.name for c in case_matrix("ci"))

# ---------------------------------------------------------------------------
# Running and comparing.


@dataclasses.dataclass(frozen=True)
class ParityRow:
  """One row of the parity table (`compare_case`; `metrics.compare_topk`'s
  counts)."""

  case: str
  launches: str
  rows: int  # compared, padding included
  rows_k_over_visible: int  # live rows that see fewer than k entries
  max_score_diff: float
  sets_agree: bool
  differing_positions: int
  tied_positions: int
  rows_mismatched: int  # not explained by ties
  atol: float
  detail: str  # the first mismatch
  seconds: float

  ok = property(lambda self: self.rows_mismatched == 0)

  def as_dict(self) -> dict:
    return dict(dataclasses.asdict(self), ok=self.ok)


def compare_case(case: Case, got, want, scores, *, atol: float = 0.0,
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
  """One run of a case: its inputs, got/want i32[T, k] (kernel, reference),
  the reference's masked scores f32[T, E or pages], wall seconds."""

  inputs: batch_lib.IndexerInputs
  got: np.ndarray
  want: np.ndarray
  scores: np.ndarray
  seconds: float


def case_outputs(case: Case, *,
                 kernel_fn: Callable | None = None) -> CaseOutputs:
  """Runs `case`'s kernel (or `kernel_fn(inputs)`, e.g. a corrupted one)
  and reference on its inputs."""
  t0 = time.perf_counter()
  inputs = case.inputs()
  # Wait for the interpreted kernel first: with it in flight, more work can
  # deadlock XLA:CPU.
  got = np.asarray(jax.block_until_ready((kernel_fn or case.run_kernel)(inputs)))
  want = np.asarray(case.run_reference(inputs))
  seconds = time.perf_counter() - t0
  return CaseOutputs(inputs, got, want, np.asarray(case.scores(inputs)),
                     seconds)


def comparison_atol(inputs: batch_lib.IndexerInputs, *,
                    compression_ratio: int, causal_rule: str = DEFAULT_CAUSAL_RULE,
                    mode: str = "token") -> float:
  """The tie tolerance for kernel vs reference, `metrics.summation_atol`;
  f32 queries refused off the CPU (docs/testing.md)."""
  if jax.default_backend() != "cpu" and inputs.q.dtype == jnp.float32:
    raise ValueError("comparison_atol: on a TPU the kernel's f32 queries are "
                     "rounded to bf16 by the MXU; use bf16 queries")
  return metrics.summation_atol(inputs, compression_ratio=compression_ratio,
                                causal_rule=causal_rule, mode=mode)
