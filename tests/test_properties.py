"""Random ragged batches, kernel against reference (hypothesis).

Each profile fixes everything that is static to the kernel (shapes, dtypes,
block sizes, k, compression_ratio, causal_rule): one compile per profile.
Hypothesis draws the values inside: how many sequences, the distribution
(i, j, n), every (q_len, seq_len) pair (0 and 1 included, and lengths
whose visible-entry counts sit at k - 1, k, k + 1), the page allocation
(contiguous, shuffled, fragmented) and its seed, the key distribution and
ties (exact duplicate keys, near-duplicates that quantize to ties, all-zero
query rows that tie every visible entry) and the seeds of the data.
Each batch is checked with `kernel_scores.assert_kernel_matches_reference`
(no NaN, exact masking, scores within twice the derived summation bound
`metrics.summation_error_bound` of the reference's, tie-aware indices with
tie tolerance `metrics.summation_atol`). A failure shrinks to a minimal
batch; the test prints it (`note`) with the `make_batch` call that rebuilds
it.

Speculative decoding (M17): the `mtp<q>-<variant>-<fmt>` profiles, one per
token variant of the registry x its cache formats x gamma + 1 = q in
{2, 3, 4}, draw q rows per decode sequence (at least one per batch, seq_len
>= q); across a profile's batches there are decode sequences without
entries (q < ratio), shorter than one decode KV block and longer.

Budget: `EXAMPLES[profile]` batches per profile, derandomized (the same
batches on every run, no example database), for about a minute on a 2-core
CPU.
"""

from __future__ import annotations

import dataclasses
import functools

import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import HealthCheck, given, note, settings
from hypothesis import strategies as st

import streamidx as si
from streamidx import metrics
from streamidx.lab.studies import cases

from kernel_scores import KernelWithScores, assert_kernel_matches_reference
import tiers


@dataclasses.dataclass(frozen=True)
class Profile:
  mode: str  # "token" or "page"
  fmt: str
  ratio: int
  page_size: int
  pages_per_seq: int
  max_num_seqs: int
  num_tokens: int
  num_heads: int
  k: int
  bkv: object  # num_kv_pages_per_block
  bq: object  # num_queries_per_block
  decode_req_batch_size: int = 4
  causal_rule: str = "model"
  q_dtype: object = jnp.bfloat16
  variant: str = "vendored"  # any token variant reading `fmt` (page mode: its
  #                             "_page" twin)
  decode_q_len: int = 1  # gamma + 1 rows per decode sequence (M17)

  @property
  def total_num_pages(self) -> int:
    # The largest pool make_batch can need ("fragmented": twice the pages
    # used): a fixed cache shape for every batch of the profile.
    return 2 * self.max_num_seqs * self.pages_per_seq

  @property
  def max_seq_len(self) -> int:
    # The longest sequence whose entries fit the page-table row.
    return (self.pages_per_seq * self.page_size + 1) * self.ratio - 1

  def kernel_kwargs(self) -> dict:
    if self.mode == "page":
      return dict(k_pages=self.k, num_queries_per_block=self.bq,
                  causal_rule=self.causal_rule)
    return dict(k=self.k, compression_ratio=self.ratio,
                num_kv_pages_per_block=self.bkv,
                num_queries_per_block=self.bq,
                decode_req_batch_size=self.decode_req_batch_size,
                causal_rule=self.causal_rule,
                **({"decode_q_len": self.decode_q_len}
                   if self.decode_q_len > 1 else {}))


PROFILES = {
    # Two bkv blocks (10 pages of 16 > 128 entries), decode batches of 2.
    "token-fp8-r4": Profile("token", "fp8", 4, 16, 10, 6, 24, 4, k=8,
                            bkv=8, bq=(1, 4, 8), decode_req_batch_size=2),
    # Odd head count (padded to bf16 packing), per-case block sizes.
    "token-bf16-r1": Profile("token", "bf16", 1, 32, 5, 5, 20, 3, k=40,
                             bkv=(4, 8, 4), bq=(1, 8, 4)),
    # float32 queries, the vendored causal rule, one 128-entry page per block.
    "token-fp8-r2-seedrule": Profile("token", "fp8", 2, 128, 2, 4, 16, 2,
                                     k=100, bkv=1, bq=(1, 8, 8),
                                     decode_req_batch_size=3,
                                     causal_rule="seed",
                                     q_dtype=jnp.float32),
    "page-fp8": Profile("page", "fp8", 1, 16, 4, 5, 20, 4, k=2, bkv=128,
                        bq=8),
    "page-bf16": Profile("page", "bf16", 1, 8, 6, 4, 16, 2, k=5, bkv=128,
                         bq=16),
    # The MXFP4 cache (its own layout, 8 entries per value row group).
    "token-mxfp4-r4": Profile("token", "mxfp4", 4, 16, 10, 6, 24, 4, k=8,
                              bkv=8, bq=(1, 4, 8), decode_req_batch_size=2,
                              variant="fp4"),
    "page-mxfp4": Profile("page", "mxfp4", 1, 16, 4, 5, 20, 4, k=2, bkv=128,
                          bq=8, variant="fp4"),
    # Speculative decoding (M17): every token variant x its formats x gamma
    # + 1 in {2, 3, 4} on token-fp8-r4's shape (decode batches of 2, two KV
    # blocks), at least one decode sequence per batch.
    **{f"mtp{q}-{v.name}-{fmt}": Profile(
        "token", fmt, 4, 16, 10, 6, 24, 4, k=8, bkv=8, bq=(1, 4, 8),
        decode_req_batch_size=2, variant=v.name, decode_q_len=q)
       for v in si.VARIANTS.values() if v.mode == "token"
       for fmt in v.cache_formats for q in cases.MTP_Q_LENS},
}
EXAMPLES = {
    "token-fp8-r4": 25,
    "token-bf16-r1": 25,
    "token-fp8-r2-seedrule": 20,
    "page-fp8": 12,
    "page-bf16": 12,
    "token-mxfp4-r4": 15,
    "page-mxfp4": 8,
    **{name: 12 for name in PROFILES if name.startswith("mtp")},
}
MTP_CI = "mtp2-vendored-fp8"  # DeepSeek-V4's gamma + 1 = 2, the CI point
TIES = ("none", "outlier_keys", "duplicate_keys", "near_duplicate_keys",
        "zero_query_rows")


@st.composite
def batches(draw, p: Profile):
  """(make_batch kwargs, input kwargs, tie mode) for one random batch."""
  dq = p.decode_q_len
  lo = 1 if dq > 1 else 0  # an MTP batch has decode sequences
  n = draw(st.integers(lo, p.max_num_seqs), label="num_seqs")
  if p.mode == "token":
    i = draw(st.integers(lo, min(n, p.num_tokens // dq)),
             label="decode seqs i")
    j = draw(st.integers(i, n), label="decode + prefill-only j")
  else:
    i = j = 0
  # seq_lens: anything that fits, or one at the edges (0, 1, a visible count
  # of k - 1, k, k + 1, the longest).
  edges = sorted({0, 1, (p.k - 1) * p.ratio, p.k * p.ratio,
                  (p.k + 1) * p.ratio, p.max_seq_len} &
                 set(range(p.max_seq_len + 1)))
  seq_len = st.one_of(st.integers(0, p.max_seq_len), st.sampled_from(edges))
  pairs = []
  budget = p.num_tokens - i * dq
  for b in range(n):
    s = draw(seq_len, label=f"seq_len[{b}]")
    if b < i:
      s = max(s, dq)
      q = dq
    else:
      q = draw(st.integers(0, min(s, budget)), label=f"q_len[{b}]")
      budget -= q
    pairs.append((q, s))
  batch_kw = dict(
      pairs=pairs, page_size=p.page_size, compression_ratio=p.ratio,
      distribution=(i, j, n) if p.mode == "token" else None,
      allocation=draw(st.sampled_from(["contiguous", "shuffled",
                                       "fragmented"]), label="allocation"),
      pages_per_seq=p.pages_per_seq, max_num_seqs=p.max_num_seqs,
      num_tokens=p.num_tokens, decode_q_len=dq,
      seed=draw(st.integers(0, 2**16), label="seed"))
  input_kw = dict(seed=draw(st.integers(0, 2**16), label="input seed"))
  ties = draw(st.sampled_from(TIES), label="ties")
  return batch_kw, input_kw, ties


def extra_pages(p: Profile, batch_kw: dict) -> int:
  """Unused pages that pad the cache to the profile's fixed page count."""
  b = si.make_batch(**batch_kw)
  pool = b.total_num_pages if b.num_pages_used.sum() else 0
  return p.total_num_pages - pool


def build(p: Profile, batch_kw: dict, input_kw: dict, ties: str):
  b = si.make_batch(**batch_kw, extra_pages=extra_pages(p, batch_kw))
  assert b.total_num_pages == p.total_num_pages
  inp = si.make_inputs(
      b, num_heads=p.num_heads, fmt=p.fmt, q_dtype=p.q_dtype,
      key_distribution="outliers" if ties == "outlier_keys" else "gaussian",
      **input_kw)
  rng = np.random.default_rng(input_kw["seed"] + 1)
  if ties in ("duplicate_keys", "near_duplicate_keys"):
    keys = np.array(inp.keys).reshape(-1, inp.keys.shape[-1])
    src = rng.integers(0, len(keys), size=len(keys) // 2)
    dst = rng.integers(0, len(keys), size=len(keys) // 2)
    scale = 1.0 if ties == "duplicate_keys" else 1.0 + 1e-3 * rng.random(
        (len(dst), 1))
    keys[dst] = keys[src] * scale
    keys = jnp.asarray(keys.reshape(inp.keys.shape))
    inp = dataclasses.replace(inp, keys=keys).with_cache_format(p.fmt)
  elif ties == "zero_query_rows":
    q = np.array(inp.q.astype(jnp.float32))
    q[rng.random(len(q)) < 0.5] = 0.0
    inp = dataclasses.replace(inp, q=jnp.asarray(q).astype(p.q_dtype))
  return b, inp


@functools.lru_cache(maxsize=None)
def kernel(mode: str, variant: str = "vendored") -> KernelWithScores:
  """One score-tapped kernel (one compile per static call) per variant."""
  return KernelWithScores(mode, variant=variant)


def check_batch(p: Profile, batch_kw, input_kw, ties):
  b, inp = build(p, batch_kw, input_kw, ties)
  note(f"batch: {b.describe()}")
  note(f"rebuild: streamidx.make_batch(**{batch_kw!r}, extra_pages="
       f"{extra_pages(p, batch_kw)}); "
       f"make_inputs(num_heads={p.num_heads}, fmt={p.fmt!r}, "
       f"**{input_kw!r}); ties={ties!r}")
  note(f"q_lens={b.q_lens.tolist()} seq_lens={b.seq_lens.tolist()} "
       f"distribution={b.distribution.tolist()} "
       f"page_table={b.page_table.tolist()}")
  kw = p.kernel_kwargs()
  v = si.VARIANTS[p.variant + ("_page" if p.mode == "page" else "")]
  args = v.args(inp, p.fmt)
  v.validate(*args, **kw)  # every batch is valid input
  idx, scores = kernel(p.mode, p.variant)(*args, **kw)
  ref_idx = v.reference(*args, **kw)
  ratio = p.ratio if p.mode == "token" else 1  # the page kernel's default
  ref_scores = v.scores(inp, compression_ratio=ratio, fmt=p.fmt,
                        causal_rule=p.causal_rule)
  bound = metrics.summation_error_bound(inp, compression_ratio=ratio,
                                        causal_rule=p.causal_rule,
                                        mode=p.mode)
  assert_kernel_matches_reference(idx, scores, ref_idx, ref_scores,
                                  score_bound=bound)
  # A sanity check that the batch exercised something: live rows have
  # exactly min(k, visible) valid indices.
  visible = np.isfinite(np.asarray(ref_scores)).sum(axis=1)
  np.testing.assert_array_equal((idx >= 0).sum(axis=1),
                                np.minimum(visible, p.k))
  return b


def _property_test(name):
  p = PROFILES[name]

  @settings(max_examples=EXAMPLES[name], derandomize=True, database=None,
            deadline=None, print_blob=False,
            suppress_health_check=[HealthCheck.too_slow,
                                   HealthCheck.data_too_large])
  @given(data=st.data())
  def run(data):
    batch_kw, input_kw, ties = data.draw(batches(p), label="batch")
    checked.append((ties, check_batch(p, batch_kw, input_kw, ties)))

  checked: list[tuple] = []
  return run, checked


def _decode_entries(p: Profile, b) -> set:
  """What the decode sequences of batch `b` had: "empty" (no entry),
  "short" (fewer than one decode KV block), "long" (more)."""
  entries = b.seq_lens[:b.distribution[0]] // p.ratio
  block = p.bkv * p.page_size
  return ({"empty"} if (entries == 0).any() else set()) | (
      {"short"} if ((entries > 0) & (entries < block)).any() else set()) | (
      {"long"} if (entries > block).any() else set())


# CI: the FP8 token profile (two KV blocks, decode batches of 2), the FP8
# page profile and speculative decoding's gamma + 1 = 2 on the vendored FP8
# kernel; the other profiles in the full tier (tests/tiers.py).
@pytest.mark.parametrize("name", tiers.split(
    list(PROFILES), lambda n: n in ("token-fp8-r4", "page-fp8", MTP_CI)))
def test_random_batches_match_reference(name):
  run, checked = _property_test(name)
  run()
  ties = sorted({t for t, _ in checked})
  print(f"{name}: {len(checked)} random batches checked (ties: {ties})")
  # The budget is spent on batches, not lost to rejected draws.
  assert len(checked) >= EXAMPLES[name]
  p = PROFILES[name]
  if p.decode_q_len > 1:
    # Every MTP batch has gamma + 1 rows per decode sequence; together they
    # had decode sequences without entries, shorter and longer than a block.
    assert all(b.distribution[0] > 0 and b.decode_q_len == p.decode_q_len
               for _, b in checked)
    seen = set().union(*(_decode_entries(p, b) for _, b in checked))
    assert seen >= ({"short", "long"} | (
        {"empty"} if p.decode_q_len < p.ratio else set())), seen
