"""The streaming reference returns the one-chunk reference's indices, exactly.

Exactly means equal index arrays (set and order), which is stronger than
the tie-aware parity the kernel is held to; every comparison also runs the
tie-aware check so a failure says which rows differ and how. The matrix is
the test batches of the case matrix (`streamidx.lab.studies.cases`, every
batch with one static shape, so each configuration compiles once): chunk
sizes that divide the 384 entries per sequence and that do not, query blocks
that do not divide the 48 rows, k below and above every row's visible
count, FP8 / bf16 / f32 caches, both causal rules, and the page variant in
both of its forms.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import streamidx as si
from streamidx.lab.bench import oracle as bench_oracle
from streamidx import metrics, streaming

from streamidx.lab.studies import cases
import oracle

K = cases.K_TESTS
K_SMALL = cases.K_BELOW
NUM_ENTRIES = cases.NUM_ENTRIES
NUM_HEADS = cases.NUM_HEADS
NUM_TOKENS = cases.NUM_TOKENS
PAGE_SIZE = cases.PAGE_SIZE

# More than any row of the matrix can see: the whole ranking, -1s included.
K_ALL = NUM_ENTRIES + 16


@functools.lru_cache(maxsize=None)
def _inputs(batch_name, ratio, fmt):
  inp = si.make_inputs(cases.BATCHES[batch_name].build(ratio),
                       num_heads=NUM_HEADS,
                       fmt="fp8" if fmt == "f32" else fmt, seed=20 + ratio)
  return inp.with_cache_format("f32") if fmt == "f32" else inp


def _assert_same(got, want, scores, label):
  got, want = np.asarray(got), np.asarray(want)
  metrics.assert_topk_match(got, want, scores, label=label)
  bad = np.flatnonzero((got != want).any(axis=1))
  assert bad.size == 0, (f"{label}: rows {bad[:5].tolist()} hold the same "
                         f"sets in another order: {got[bad[0]][:8]} vs "
                         f"{want[bad[0]][:8]}")


# (fmt, ratio, causal rule, k, chunk_entries, chunk_tokens). 384 entries per
# sequence and 48 query rows: 100 and 7 divide neither, 128 and 16 both;
# 1000 is a single chunk larger than the sequence. K (the kernel matrix's
# k) has rows above and below it; K_ALL exceeds every row's visible count.
CONFIGS = [
    ("fp8", 4, "model", K, 100, 7),
    ("fp8", 4, "seed", K_SMALL, 128, 16),
    ("fp8", 2, "model", K_ALL, 100, None),
    ("bf16", 1, "model", K_SMALL, 100, 7),
    ("bf16", 4, "seed", K_ALL, 1000, 16),
    ("f32", 4, "model", K_SMALL, 128, None),
]


@pytest.mark.parametrize(
    "fmt,ratio,rule,k,chunk_entries,chunk_tokens", CONFIGS,
    ids=[f"{f}-ratio{r}-{rule}-k{k}-chunk{c}-rows{t}"
         for f, r, rule, k, c, t in CONFIGS])
def test_streaming_equals_one_shot_on_every_case(fmt, ratio, rule, k,
                                                 chunk_entries, chunk_tokens):
  for name in cases.TEST_BATCHES:
    inp = _inputs(name, ratio, fmt)
    kw = dict(k=k, compression_ratio=ratio, causal_rule=rule)
    want = si.streamindex_topk_ref(*inp.args, **kw)
    got = streaming.streamindex_topk_streaming(
        *inp.args, chunk_entries=chunk_entries, chunk_tokens=chunk_tokens,
        **kw)
    scores = si.token_scores(*inp.args, compression_ratio=ratio,
                             causal_rule=rule)
    _assert_same(got, want, scores, f"{name} ({fmt}, ratio {ratio}, {rule})")


def test_the_configs_cover_chunks_that_do_and_do_not_divide_the_entries():
  chunks = {c for *_, c, _ in CONFIGS}
  assert any(NUM_ENTRIES % c == 0 for c in chunks)
  assert any(NUM_ENTRIES % c and c < NUM_ENTRIES for c in chunks)
  assert any(c > NUM_ENTRIES for c in chunks)
  rows = {t for *_, t in CONFIGS if t is not None}
  assert any(NUM_TOKENS % t for t in rows) and any(NUM_TOKENS % t == 0
                                                   for t in rows)
  assert {f for f, *_ in CONFIGS} == {"fp8", "bf16", "f32"}
  assert {r for _, _, r, *_ in CONFIGS} == {"model", "seed"}
  assert K_ALL > NUM_ENTRIES


def _tied_cache(cache, pattern):
  """Every entry's record replaced by record `pattern[e % len(pattern)]`."""
  pages, rows, packing, lkv = cache.shape
  flat = cache.reshape(pages * rows * packing, lkv)
  e = np.arange(pages * rows * packing) % (rows * packing)
  pick = np.asarray(pattern)[e % len(pattern)]
  return flat[pick].reshape(cache.shape)


@pytest.mark.parametrize("pattern", [(0,), (0, 1, 2)],
                         ids=["all_entries_equal", "three_distinct_records"])
def test_ties_across_chunks_resolve_to_the_lower_entry_like_one_shot(pattern):
  inp = _inputs("all_three_ranges", 4, "fp8")
  args = list(inp.args)
  args[2] = _tied_cache(inp.cache, pattern)
  kw = dict(k=150, compression_ratio=4)  # k spans two chunks of 100
  want = np.asarray(si.streamindex_topk_ref(*args, **kw))
  got = streaming.streamindex_topk_streaming(*args, chunk_entries=100, **kw)
  scores = si.token_scores(*args, compression_ratio=4)
  _assert_same(got, want, scores, f"tied records {pattern}")
  if pattern == (0,):
    # Every visible entry ties: both pick the lowest ids, in order (the rule
    # the streaming merge relies on; a change in lax.top_k shows up here).
    visible = np.isfinite(np.asarray(scores)).sum(axis=1)
    for r in range(want.shape[0]):
      n = min(150, int(visible[r]))
      np.testing.assert_array_equal(want[r, :n], np.arange(n))
      assert (want[r, n:] == -1).all()


def test_references_keep_the_rule_whatever_top_k_does_with_ties(
    ties_backwards):
  """`lax.top_k` breaks ties index-descending here (the fixture); the
  one-chunk and streaming references, tokens and pages, still return the
  rule over their own scores (`oracle.topk_rule`), ties across chunks
  included: the merge ranks by (score, id), not by position."""
  del ties_backwards
  inp = _inputs("all_three_ranges", 4, "fp8")
  for pattern in (None, (0,), (0, 1, 2)):
    args = list(inp.args)
    if pattern:
      args[2] = _tied_cache(inp.cache, pattern)
    kw = dict(k=150, compression_ratio=4)  # k spans two chunks of 100
    want = oracle.topk_rule(si.token_scores(*args, compression_ratio=4), 150)
    np.testing.assert_array_equal(si.streamindex_topk_ref(*args, **kw), want,
                                  err_msg=f"one chunk, {pattern}")
    np.testing.assert_array_equal(streaming.streamindex_topk_streaming(
        *args, chunk_entries=100, **kw), want, err_msg=f"chunks, {pattern}")
    page_args = args[:6] + [inp.page_args[6]]
    want = oracle.topk_rule(si.page_scores(*page_args, compression_ratio=4), 5)
    for chunk in (None, 2 * PAGE_SIZE):
      np.testing.assert_array_equal(si.streamindex_page_topk_ref(
          *page_args, k_pages=5, compression_ratio=4, chunk_entries=chunk),
          want, err_msg=f"pages, chunk {chunk}, {pattern}")


@pytest.mark.parametrize("one_token_per_seq,k_pages,chunk_entries", [
    (False, 5, 5 * PAGE_SIZE),    # 24 pages: 5 per chunk does not divide
    (True, 30, 6 * PAGE_SIZE),    # k_pages > pages_per_seq; 6 divides 24
], ids=["prefill_form", "decode_form"])
def test_page_streaming_equals_one_shot(one_token_per_seq, k_pages,
                                        chunk_entries):
  for name in ("all_three_ranges", "prefill_and_decode_in_mixed_range",
               "empty_and_tiny_sequences"):
    for fmt in ("fp8", "bf16"):
      inp = _inputs(name, 1, fmt)
      kw = dict(k_pages=k_pages, one_token_per_seq=one_token_per_seq)
      want = si.streamindex_page_topk_ref(*inp.page_args, **kw)
      got = streaming.streamindex_page_topk_streaming(
          *inp.page_args, chunk_entries=chunk_entries, chunk_tokens=7, **kw)
      scores = si.page_scores(*inp.page_args,
                              one_token_per_seq=one_token_per_seq)
      _assert_same(got, want, scores, f"{name} {fmt} pages")


@pytest.mark.parametrize("rows,entries,chunk_tokens", [(3, 1024, 2),
                                                      (24, 512, None)])
def test_streaming_matches_numpy_oracle_on_a_one_sequence_prefill(
    rows, entries, chunk_tokens):
  """Where jax 0.10.2's CPU compiler miscompiled an earlier reference.

  With one sequence slot, an `x[i]` gather of a sequence's whole cache
  feeding a batched dot and a head sum made XLA score every entry of a row
  as its first (in a remainder batch of `lax.map` too: 3 rows in batches of
  2). The engine gathers record by record through the page table (module
  docstring of `streamidx.ref`); streaming must agree with the bench's
  oracle within float32 rounding (tie-aware, twice the derived bound).
  """
  b = si.make_mixed_batch(prefill=[(rows, entries * 4)], page_size=PAGE_SIZE,
                          compression_ratio=4)
  assert b.max_num_seqs == 1
  inp = si.make_inputs(b, num_heads=NUM_HEADS, fmt="fp8", seed=5)
  np_args = [np.asarray(a) for a in inp.args]
  idx, scores = bench_oracle.oracle_topk(*np_args, k=K_SMALL,
                                         compression_ratio=4,
                                         return_scores=True)
  bound = bench_oracle.f32_score_bound(*np_args[:3])
  got = streaming.streamindex_topk_streaming(
      *inp.args, k=K_SMALL, compression_ratio=4, chunk_tokens=chunk_tokens)
  metrics.assert_topk_match(got, idx, scores, atol=2 * bound)
  assert bound < 1e-3 * np.abs(scores[np.isfinite(scores)]).max()


def _abstract_decode(num_seqs, entries, num_heads=64):
  b = si.make_mixed_batch(decode=[entries * 4] * num_seqs, page_size=128,
                          compression_ratio=4)
  shapes = [jax.ShapeDtypeStruct((num_seqs, num_heads, 128), jnp.bfloat16),
            jax.ShapeDtypeStruct((num_seqs, num_heads), jnp.float32),
            jax.ShapeDtypeStruct((b.total_num_pages, 32, 4, 256), jnp.uint8)]
  return shapes + [jax.ShapeDtypeStruct(a.shape, jnp.int32)
                   for a in b.kernel_arrays()], b


def _temp_bytes(fn, args, **kw):
  return fn.lower(*args, **kw).compile().memory_analysis().temp_size_in_bytes


def test_streaming_temporaries_do_not_grow_with_the_sequence():
  """XLA's buffer assignment, compiled from shapes only (nothing runs).

  The one-chunk reference's step grows with the entries until its blocks
  reach `ref.rows_per_block`'s budget (then it blocks fewer rows): both
  lengths here stay under it.
  """
  kw = dict(k=512, compression_ratio=4)
  short, _ = _abstract_decode(4, 4096)
  long, _ = _abstract_decode(4, 16 * 4096)
  st_short = _temp_bytes(streaming.streamindex_topk_streaming, short, **kw)
  st_long = _temp_bytes(streaming.streamindex_topk_streaming, long, **kw)
  one_short = _temp_bytes(si.streamindex_topk_ref, short, **kw)
  one_long = _temp_bytes(si.streamindex_topk_ref, long, **kw)
  assert st_long <= 1.1 * st_short
  assert one_long >= 4 * one_short  # one chunk grows with the entries
  assert st_long < one_long / 10


@pytest.mark.parametrize("name", ["decode_64x1M", "prefill_1024q_128K",
                                  "decode_8x64K_k2048",
                                  "prefill_512q_32K_k2048"])
def test_one_chunk_memory_formula_brackets_xla(name):
  """The formula docs/benchmarks.md quotes, against XLA's buffer assignment."""
  from streamidx.lab import shapes
  from streamidx.lab.bench import record
  long = [shapes.Shape("decode_64x1M", "decode", 64, 1, 2**20, 512),
          shapes.Shape("prefill_1024q_128K", "prefill", 1, 1024, 2**17, 512)]
  shape = {s.name: s for s in long + shapes.SWEEP}[name]
  b = shape.batch()
  xla = _temp_bytes(si.streamindex_topk_ref, jax.eval_shape(  # the cache unbuilt
                        lambda: record.entry_args(shape, "vendored", shape.fmt)),
                    **shape.kernel_kwargs())
  low, high = streaming.one_chunk_temp_bytes(
      num_tokens=b.num_tokens, num_entries=b.pages_per_seq * shape.page_size,
      num_heads=shape.num_heads, head_dim=shape.head_dim, fmt=shape.fmt,
      k=shape.k)
  assert low <= xla <= high, (low, xla, high)


@pytest.mark.parametrize("kwargs,message", [
    (dict(chunk_entries=0), "chunk_entries: must be None or a positive int"),
    (dict(chunk_entries=64.0), "chunk_entries: must be None or a positive int"),
    (dict(chunk_tokens=0), "chunk_tokens: must be None or a positive int"),
    (dict(causal_rule="future"), "causal_rule: must be one of"),
])
def test_bad_chunk_arguments_are_rejected_by_name(kwargs, message):
  inp = _inputs("all_three_ranges", 4, "fp8")
  with pytest.raises(ValueError, match=message):
    streaming.streamindex_topk_streaming(*inp.args, k=8, compression_ratio=4,
                                         **kwargs)


def test_page_mode_rejects_chunks_that_split_a_page():
  inp = _inputs("all_three_ranges", 1, "fp8")
  with pytest.raises(ValueError, match="multiple of page_size"):
    streaming.streamindex_page_topk_streaming(*inp.page_args, k_pages=4,
                                              chunk_entries=PAGE_SIZE + 1)
