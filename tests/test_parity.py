"""The reference facts notebook 04's studies rest on: the two causal rules
differ by one entry, approx_max_k(recall_target=1.0) is top_k off TPU, XLA's
ApproxTopK sizing keeps every candidate at recall 1.0, one sequence slot
scores right. No kernel runs here.

Notebook 04 asserts the rest on every run: the parity loop's tables, the
causal-rule analysis against its prediction, `page_coverage` on a hand-made
example and on every page, `boundary_ties` and `tie_breaks` on hand-made rows.
"""

from __future__ import annotations

import jax
import numpy as np
import pytest

import streamidx as si
from streamidx import ref
from streamidx.lab.model import topk as topk_model

import oracle


# ---------------------------------------------------------------------------
# The causal rule.


@pytest.mark.parametrize("ratio", [2, 4])
def test_the_seed_rule_adds_exactly_the_block_p_over_ratio_where_it_is_cached(ratio):
  # Trailing incomplete blocks (seq_len % ratio != 0) and a from-scratch
  # prefill; two sequences.
  b = si.make_mixed_batch(prefill=[(2 * ratio + 3, 9 * ratio + 1),
                                   (3 * ratio, 3 * ratio)],
                          page_size=16, compression_ratio=ratio)
  inp = si.make_inputs(b, num_heads=4, fmt="fp8")
  pos, seq = b.token_positions(), b.token_seq_ids()
  kv_len = b.seq_lens[np.maximum(seq, 0)] // ratio
  want = (seq >= 0) & ((pos + 1) % ratio != 0) & (pos // ratio < kv_len)
  assert want.any() and (~want & (seq >= 0)).any()
  top = {}
  for rule in ("model", "seed"):
    scores = ref.token_scores(*inp.args, compression_ratio=ratio,
                              causal_rule=rule)
    top[rule] = np.asarray(ref.topk_from_scores(scores, 64))  # k > all
  # k above every visible count: each such row gains exactly the leaked entry.
  for r in range(b.num_tokens):
    s_set = set(top["seed"][r][top["seed"][r] >= 0].tolist())
    m_set = set(top["model"][r][top["model"][r] >= 0].tolist())
    assert s_set - m_set == ({int(pos[r] // ratio)} if want[r] else set()), r
    assert m_set <= s_set


# ---------------------------------------------------------------------------
# Ties and approx_max_k.


def test_approx_max_k_with_recall_one_is_top_k_on_cpu():
  rng = np.random.default_rng(0)
  scores = rng.standard_normal((4, 4096)).astype(np.float32)
  scores[:, ::7] = 0.0  # ties, too
  for k in (1, 64, 1000):
    av, ai = jax.lax.approx_max_k(scores, k, recall_target=1.0)
    ev, ei = jax.lax.top_k(scores, k)
    np.testing.assert_array_equal(np.asarray(av), np.asarray(ev))
    np.testing.assert_array_equal(np.asarray(ai), np.asarray(ei))


def test_tpu_approx_top_k_keeps_every_candidate_at_recall_one():
  n = 65536
  size = topk_model.approx_topk_reduction_size(n, 512, 1.0)
  if size is None:
    pytest.skip("this jaxlib does not expose XLA's ApproxTopK sizing")
  assert size == n
  assert topk_model.approx_topk_reduction_size(n, 64, 0.95) < n


# ---------------------------------------------------------------------------
# One sequence slot.


def test_reference_scores_one_sequence_slot_with_several_rows():
  # XLA:CPU (jaxlib 0.10.2) miscompiled the reference's batched dot here (the
  # per-token gather became a broadcast); streamidx/ref.py works around it.
  b = si.make_batch([(2, 4 * 256)], page_size=128, compression_ratio=4)
  inp = si.make_inputs(b, num_heads=8, fmt="bf16")
  got = np.asarray(ref.token_scores(*inp.args, compression_ratio=4))
  want = oracle.scores(np.asarray(inp.q, np.float32), inp.weights, inp.cache,
                       b.seq_lens, b.page_indices, b.cu_q_lens, b.num_seqs,
                       ratio=4)
  fin = np.isfinite(want)
  np.testing.assert_allclose(got[fin], want[fin], rtol=1e-4, atol=1e-3)
