"""The reference against the NumPy loop oracle (float64, its own FP8 decode).

The reference scores in float32 like the kernel; the oracle in float64. They
may differ by f32 roundoff, bounded by `oracle.f32_error_bound`, so index
sets are compared tie-aware with that bound as the tie tolerance, and scores
directly against it. The bound is derived, not tuned: products of the stored
values are exact in f32, only the sums round.
"""

import functools

import jax
import numpy as np
import pytest

import streamidx as si
from streamidx import metrics

from streamidx.lab.studies import cases

import oracle
import tiers

K = cases.K_TESTS
NUM_HEADS = cases.NUM_HEADS


@functools.lru_cache(maxsize=None)
def _inputs(batch_name, ratio, fmt):
  return si.make_inputs(cases.BATCHES[batch_name].build(ratio),
                        num_heads=NUM_HEADS, fmt=fmt, seed=10 + ratio)


def _oracle_scores(inp, ratio, rule):
  b = inp.batch
  return oracle.scores(inp.q.astype(np.float32), inp.weights, inp.cache,
                       b.seq_lens, b.page_indices, b.cu_q_lens, b.num_seqs,
                       ratio=ratio, rule=rule)


@pytest.mark.parametrize("fmt", ("fp8", "bf16"))
@pytest.mark.parametrize("ratio,rule", [(1, "model"), (2, "model"),
                                        (4, "model"), (4, "seed")])
@pytest.mark.parametrize("case", ["all_three_ranges",
                                  "prefill_and_decode_in_mixed_range",
                                  "empty_and_tiny_sequences"])
def test_reference_matches_oracle(case, ratio, rule, fmt):
  inp = _inputs(case, ratio, fmt)
  want_scores = _oracle_scores(inp, ratio, rule)
  got_scores = np.asarray(si.token_scores(*inp.args, compression_ratio=ratio,
                                          causal_rule=rule), np.float64)
  bound = oracle.f32_error_bound(inp.q.astype(np.float32), inp.weights,
                                 inp.cache, inp.head_dim)
  # Same mask, exactly.
  np.testing.assert_array_equal(np.isneginf(got_scores),
                                np.isneginf(want_scores))
  live = ~np.isneginf(want_scores)
  assert np.abs(got_scores[live] - want_scores[live]).max(initial=0) <= bound
  for k in (K, 500):
    got = si.streamindex_topk_ref(*inp.args, k=k, compression_ratio=ratio,
                                  causal_rule=rule)
    want = oracle.topk(want_scores, k)
    metrics.assert_topk_match(got, want, want_scores, atol=2 * bound,
                              label=f"{case} k={k}")


@pytest.mark.parametrize("fmt", ("fp8", "bf16"))
def test_page_reference_matches_oracle(fmt):
  inp = _inputs("all_three_ranges", 1, fmt)
  tok = _oracle_scores(inp, 1, "model")
  want_scores = oracle.pool_pages(tok, inp.batch.page_size)
  got_scores = np.asarray(si.page_scores(*inp.page_args), np.float64)
  bound = oracle.f32_error_bound(inp.q.astype(np.float32), inp.weights,
                                 inp.cache, inp.head_dim)
  np.testing.assert_array_equal(np.isneginf(got_scores),
                                np.isneginf(want_scores))
  live = ~np.isneginf(want_scores)
  assert np.abs(got_scores[live] - want_scores[live]).max(initial=0) <= bound
  got = si.streamindex_page_topk_ref(*inp.page_args, k_pages=5)
  metrics.assert_topk_match(got, oracle.topk(want_scores, 5), want_scores,
                            atol=2 * bound)


def test_page_reference_decode_form_one_token_per_seq():
  """Row i is sequence i's single query at p = seq_len - 1."""
  b = si.make_batch([(1, 40), (1, 200), (1, 7), (1, 129)], page_size=16,
                    compression_ratio=1, pages_per_seq=16)
  inp = si.make_inputs(b, num_heads=NUM_HEADS, fmt="fp8", seed=3)
  got = si.streamindex_page_topk_ref(*inp.page_args, k_pages=4,
                                     one_token_per_seq=True)
  # With one query per sequence in order, both forms agree.
  want = si.streamindex_page_topk_ref(*inp.page_args, k_pages=4)
  np.testing.assert_array_equal(got, want)
  # And a decode batch whose cu_q_lens are not given still works: cu_q_lens
  # is ignored in that form.
  args = list(inp.page_args)
  args[5] = jax.numpy.zeros_like(args[5])
  np.testing.assert_array_equal(
      si.streamindex_page_topk_ref(*args, k_pages=4, one_token_per_seq=True),
      got)


def test_page_reference_supports_compression():
  """Unlike the kernel, the page reference works at ratio 4: pooled entries."""
  b = si.make_batch([(9, 300), (1, 64)], page_size=16, compression_ratio=4)
  inp = si.make_inputs(b, num_heads=NUM_HEADS, fmt="bf16")
  tok = np.asarray(si.token_scores(*inp.args, compression_ratio=4))
  pages = np.asarray(si.page_scores(*inp.page_args, compression_ratio=4))
  np.testing.assert_array_equal(pages, oracle.pool_pages(tok, 16))


def test_reference_is_jittable_and_vectorized():
  inp = _inputs("all_three_ranges", 4, "fp8")
  jaxpr = jax.make_jaxpr(lambda *a: si.streamindex_topk_ref(
      *a, k=K, compression_ratio=4))(*inp.args)
  # One pass, no per-token Python loop: the equation count is independent of
  # the number of tokens.
  inp2 = si.make_inputs(cases.BATCHES["decode_only_full_batches"].build(4),
                        num_heads=NUM_HEADS, fmt="fp8")
  jaxpr2 = jax.make_jaxpr(lambda *a: si.streamindex_topk_ref(
      *a, k=K, compression_ratio=4))(*inp2.args)
  assert len(jaxpr.eqns) == len(jaxpr2.eqns)


def test_f32_reference_cache_is_the_exact_baseline():
  """An "f32" cache (reference only) scores the unquantized keys."""
  inp = _inputs("all_three_ranges", 4, "fp8").with_cache_format("f32")
  s = np.asarray(si.token_scores(*inp.args, compression_ratio=4))
  b = inp.batch
  t = 0  # the query of sequence 0 (decode, 20 visible entries)
  keys = np.asarray(inp.keys)
  table = b.page_table[0]
  q = np.asarray(inp.q[t], np.float64)
  w = np.asarray(inp.weights[t], np.float64)
  for e in range(3):
    k = keys[table[e // 16], e % 16].astype(np.float64)
    want = (w * np.maximum(q @ k, 0)).sum()
    assert abs(s[t, e] - want) <= 1e-4 * max(1.0, abs(want))


@pytest.mark.parametrize("pairs,max_num_seqs", tiers.split([
    ([(2, 1024)], None),  # one sequence slot, 256 entries
    ([(3, 4096)], None),  # one slot, 1024 entries
    ([(5, 2048)], 3),
], lambda p: p[1] == 3))
def test_reference_with_a_single_sequence_slot_and_many_entries(
    pairs, max_num_seqs):
  """XLA:CPU once miscompiled this shape (every score = the row's first)."""
  b = si.make_batch(pairs, page_size=64, compression_ratio=4,
                    max_num_seqs=max_num_seqs)
  inp = si.make_inputs(b, num_heads=8, fmt="fp8")
  want = oracle.scores(inp.q.astype(np.float32), inp.weights, inp.cache,
                       b.seq_lens, b.page_indices, b.cu_q_lens, b.num_seqs,
                       ratio=4)
  got = np.asarray(si.token_scores(*inp.args, compression_ratio=4),
                   np.float64)
  bound = oracle.f32_error_bound(inp.q.astype(np.float32), inp.weights,
                                 inp.cache, inp.head_dim)
  np.testing.assert_array_equal(np.isneginf(got), np.isneginf(want))
  live = ~np.isneginf(want)
  assert np.abs(got[live] - want[live]).max() <= bound
  kw = dict(k=8, compression_ratio=4, num_kv_pages_per_block=2,
            num_queries_per_block=(1, 8, 8))
  np.testing.assert_array_equal(si.streamindex_topk(*inp.args, **kw),
                                si.streamindex_topk_ref(*inp.args, **kw))


@pytest.mark.parametrize("heads,entries,rows,batch", [(4, 1024, 3, 2),
                                                     (64, 256, 12, 5)])
def test_reference_remainder_batch_with_a_single_sequence_slot(
    heads, entries, rows, batch):
  """Rows in blocks of `batch`, the last one partly padding: the earlier
  reference's smaller last `lax.map` batch, which XLA:CPU once miscompiled."""
  b = si.make_mixed_batch(prefill=[(rows, entries * 4)], page_size=16,
                          compression_ratio=4)
  inp = si.make_inputs(b, num_heads=heads, fmt="fp8", seed=0)
  per_row = si.ref.step_bytes_per_row(entries, heads, 128, inp.cache.shape[-1])
  assert si.ref.rows_per_block(rows, entries, heads, 128, inp.cache.shape[-1],
                               batch * per_row) == batch
  got = np.asarray(si.token_scores(*inp.args, compression_ratio=4,
                                   chunk_bytes=batch * per_row), np.float64)
  want = oracle.scores(inp.q.astype(np.float32), inp.weights, inp.cache,
                       b.seq_lens, b.page_indices, b.cu_q_lens, b.num_seqs,
                       ratio=4)
  bound = oracle.f32_error_bound(inp.q.astype(np.float32), inp.weights,
                                 inp.cache, inp.head_dim)
  np.testing.assert_array_equal(np.isneginf(got), np.isneginf(want))
  live = ~np.isneginf(want)
  assert np.abs(got[live] - want[live]).max() <= bound


def test_dense_pair_scores_as_the_packed_fp8_record():
  """The engine reads the dense pair's two arrays as the packed record."""
  inp = _inputs("all_three_ranges", 1, "fp8")
  q, w, _, *meta = inp.args
  pair = si.pack_dense_fp8_cache(inp.keys)
  np.testing.assert_array_equal(
      si.token_scores(q, w, pair, *meta, compression_ratio=1),
      si.token_scores(*inp.args, compression_ratio=1))
  kw = dict(k=K, compression_ratio=1, num_cores=2)  # num_cores: ignored
  np.testing.assert_array_equal(
      si.streamindex_topk_dense_ref(q, w, *pair, *meta, **kw),
      si.streamindex_topk_ref(*inp.args, k=K, compression_ratio=1))
  q, w, _, *meta = inp.page_args
  np.testing.assert_array_equal(
      si.streamindex_page_topk_dense_ref(q, w, *pair, *meta, k_pages=5),
      si.streamindex_page_topk_ref(*inp.page_args, k_pages=5))


def test_score_entries_computes_in_float64_for_float64_inputs():
  """The FP8 study's float64 truth calls it under `jax.enable_x64(True)`."""
  rng = np.random.default_rng(0)
  q, w = rng.standard_normal((4, 8)), rng.standard_normal(4)
  kv, scale = rng.standard_normal((10, 8)), np.full(10, 0.5)
  with jax.enable_x64(True):
    got = si.ref.score_entries(q, w, kv, scale)
    assert got.dtype == np.float64
  want = 0.5 * (w @ np.maximum(q @ kv.T, 0.0))
  np.testing.assert_allclose(np.asarray(got), want, rtol=1e-13)
  f32 = si.ref.score_entries(q.astype(np.float32), w.astype(np.float32),
                             kv.astype(np.float32), None)
  assert f32.dtype == np.float32


def test_no_query_rows_give_an_empty_result():
  inp = _inputs("all_three_ranges", 4, "fp8")
  args = list(inp.args)
  args[0], args[1] = args[0][:0], args[1][:0]
  got = si.streamindex_topk_ref(*args, k=K, compression_ratio=4)
  assert got.shape == (0, K)
  assert si.token_scores(*args, compression_ratio=4).shape[0] == 0
