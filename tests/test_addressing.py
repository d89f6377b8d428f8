"""streamidx.lab.studies.addressing: causal masks. (Entry addresses, planted
keys, unmasked scores, batch masks and a prefill chunk's masks are notebooks
00 and 01's cells, checked by their own asserts.)"""

from __future__ import annotations

import numpy as np
import pytest

import streamidx as si
from streamidx import ref
from streamidx.lab.studies import addressing


# --------------------------------------------------------------------------
# Causal visibility.


@pytest.mark.parametrize("rule", si.CAUSAL_RULES)
@pytest.mark.parametrize("ratio", [1, 3, 4])
def test_visibility_mask_counts_match_the_reference(rule, ratio):
  batch = si.make_mixed_batch(decode=[41, 17], prefill=[(9, 50)],
                              mixed=[(7, 31), (1, 12)], page_size=8,
                              compression_ratio=ratio)
  want = ref.visible_counts(batch.seq_lens, batch.cu_q_lens, batch.num_seqs,
                            batch.num_tokens, compression_ratio=ratio,
                            causal_rule=rule)
  seq_of = batch.token_seq_ids()
  pos = batch.token_positions()
  for r in np.flatnonzero(seq_of >= 0):
    mask = addressing.visibility_mask(pos[r:r + 1], 200, ratio, rule,
                                      seq_len=int(batch.seq_lens[seq_of[r]]))
    assert mask.sum() == want[r]
    # Visible entries are a prefix.
    assert mask[0, :want[r]].all() and not mask[0, want[r]:].any()


@pytest.mark.parametrize("rule", si.CAUSAL_RULES)
def test_visibility_mask_is_the_references_finite_score_pattern(rule):
  batch = si.make_mixed_batch(decode=[300], prefill=[(13, 260)],
                              mixed=[(6, 97)], page_size=16,
                              compression_ratio=4)
  inp = si.make_inputs(batch, num_heads=2, fmt="fp8")
  scores = np.asarray(ref.token_scores(*inp.args, compression_ratio=4,
                                       causal_rule=rule, chunk_bytes=1))
  seq_of = batch.token_seq_ids()
  pos = batch.token_positions()
  for r in np.flatnonzero(seq_of >= 0):
    mask = addressing.visibility_mask(
        pos[r:r + 1], scores.shape[1], 4, rule,
        seq_len=int(batch.seq_lens[seq_of[r]]))[0]
    np.testing.assert_array_equal(mask, np.isfinite(scores[r]))


@pytest.mark.parametrize("ratio", [1, 2, 4, 5])
def test_model_rule_sees_a_subset_of_the_seed_rule_and_decode_rows_agree(ratio):
  seq_lens = np.arange(1, 60)
  for seq_len in seq_lens:
    positions = np.arange(seq_len)
    model = addressing.visibility_mask(positions, 64, ratio, "model",
                                       seq_len=seq_len)
    seed = addressing.visibility_mask(positions, 64, ratio, "seed",
                                      seq_len=seq_len)
    assert not (model & ~seed).any()
    # The decode row (p = seq_len - 1) is the same under both rules.
    np.testing.assert_array_equal(model[-1], seed[-1])


@pytest.mark.parametrize("ratio", [2, 4])
def test_rules_differ_exactly_on_the_querys_own_incomplete_block(ratio):
  seq_len = 41
  positions = np.arange(seq_len)
  diff = (addressing.visibility_mask(positions, 32, ratio, "seed", seq_len)
          & ~addressing.visibility_mask(positions, 32, ratio, "model", seq_len))
  for p, row in zip(positions, diff):
    leaked = np.flatnonzero(row)
    own_block = p // ratio
    if (p + 1) % ratio and own_block < seq_len // ratio:
      assert leaked.tolist() == [own_block]
    else:
      assert leaked.size == 0


def test_visibility_mask_rejects_unknown_rules():
  with pytest.raises(ValueError, match="causal_rule"):
    addressing.visibility_mask([3], 4, 4, "future")

