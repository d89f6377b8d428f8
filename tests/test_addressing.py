"""streamidx.lab.studies.addressing: entry addresses and causal masks."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest

import streamidx as si
from streamidx import cache, ref
from streamidx.lab.studies import addressing


# --------------------------------------------------------------------------
# Where an entry lives.


def _batch(allocation, page_size=8, seed=0):
  return si.make_mixed_batch(decode=[90, 33], prefill=[(5, 70)],
                             mixed=[(3, 128), (1, 20)], page_size=page_size,
                             compression_ratio=4, allocation=allocation,
                             seed=seed)


@pytest.mark.parametrize("allocation", ["contiguous", "shuffled", "fragmented"])
@pytest.mark.parametrize("fmt", ["fp8", "bf16"])
def test_locate_entry_finds_each_entrys_record_in_the_packed_cache(fmt,
                                                                   allocation):
  batch = _batch(allocation)
  inp = si.make_inputs(batch, num_heads=2, fmt=fmt, seed=3)
  packed = np.asarray(inp.cache)
  # Every sequence's keys in its own order, through the page table.
  seq_keys = inp.keys[batch.page_table[:batch.num_seqs]].reshape(
      batch.num_seqs, -1, inp.head_dim)
  per_seq = seq_keys.shape[1]
  # Each entry packed on a page of its own: its record alone.
  alone = jnp.broadcast_to(seq_keys.reshape(-1, 1, inp.head_dim),
                           (seq_keys.shape[0] * per_seq, cache.kv_packing(fmt),
                            inp.head_dim))
  records = np.asarray(cache.pack_cache(alone, fmt))[:, 0, 0]
  for b in range(batch.num_seqs):
    for t in range(int(batch.num_entries[b])):
      addr = addressing.locate_entry(batch, b, t, fmt)
      assert addr.physical_page == batch.page_table[b, t // batch.page_size]
      np.testing.assert_array_equal(packed[addr.index],
                                    records[b * per_seq + t])


def test_locate_entry_rejects_entries_the_sequence_does_not_hold():
  batch = _batch("contiguous")
  n = int(batch.num_entries[1])
  with pytest.raises(ValueError, match="entry must be in"):
    addressing.locate_entry(batch, 1, n)
  with pytest.raises(ValueError, match="seq must be in"):
    addressing.locate_entry(batch, batch.num_seqs, 0)


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
  diff = addressing.causal_rule_difference(positions, 32, ratio,
                                           seq_len=seq_len)
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


# --------------------------------------------------------------------------
# The dense FP8 pair, unmasked scores, planted keys, batch masks.


@pytest.mark.parametrize("page_size", [8, 128])
def test_locate_dense_entry_finds_each_entrys_values_and_scale_byte(page_size):
  batch = si.make_mixed_batch(decode=[4 * 3 * page_size], page_size=page_size,
                              compression_ratio=4, allocation="fragmented")
  inp = si.make_inputs(batch, num_heads=2, fmt="fp8")
  values, scales = (np.asarray(a) for a in
                    inp.with_cache_format("dense_fp8").cache)
  packed = np.asarray(inp.cache)
  for t in (0, 5, int(batch.num_entries[0]) - 1):
    a = addressing.locate_dense_entry(batch, 0, t)
    rec = packed[addressing.locate_entry(batch, 0, t, "fp8").index]
    np.testing.assert_array_equal(values[a.values_index], rec[:128])
    assert scales[a.scale_index] == rec[128]


@pytest.mark.parametrize("fmt", ["fp8", "bf16", "dense_fp8"])
def test_unmasked_row_scores_equal_the_references_visible_scores(fmt):
  batch = _batch("fragmented")
  inp = si.make_inputs(batch, num_heads=4, fmt="fp8").with_cache_format(fmt)
  scores = np.asarray(si.token_scores(*inp.args, compression_ratio=4))
  atol = si.metrics.summation_atol(inp, compression_ratio=4)
  for row in range(batch.num_tokens):
    if batch.token_seq_ids()[row] < 0:
      continue
    u = addressing.unmasked_row_scores(inp, row)
    seq = batch.token_seq_ids()[row]
    assert len(u) == batch.num_entries[seq]
    n = int(np.isfinite(scores[row]).sum())
    np.testing.assert_allclose(u[:n], scores[row][:n], rtol=0, atol=atol)


def test_plant_key_makes_the_planted_entry_the_rows_best_score():
  batch = _batch("fragmented")
  inp = si.make_inputs(batch, num_heads=4, fmt="fp8")
  row = int(batch.cu_q_lens[2]) - 1  # sequence 1's (only) query
  planted = addressing.plant_key(inp, 1, 7, row)
  assert planted.fmt == "fp8"
  s = np.asarray(si.token_scores(*planted.args, compression_ratio=4))[row]
  assert int(np.argmax(s)) == 7
  assert not np.array_equal(np.asarray(planted.cache), np.asarray(inp.cache))


def test_batch_visibility_is_the_references_finite_pattern_and_returned_sets_invert_topk():
  batch = _batch("contiguous")
  inp = si.make_inputs(batch, num_heads=2, fmt="fp8")
  cols = batch.pages_per_seq * batch.page_size
  for rule in si.CAUSAL_RULES:
    scores = np.asarray(si.token_scores(*inp.args, compression_ratio=4,
                                        causal_rule=rule))
    vis = addressing.batch_visibility(batch, cols, rule)
    np.testing.assert_array_equal(vis, np.isfinite(scores[:, :cols]))
    idx = np.asarray(si.streamindex_topk_ref(*inp.args, k=cols,
                                             compression_ratio=4,
                                             causal_rule=rule))
    np.testing.assert_array_equal(addressing.returned_sets(idx, cols), vis)


def test_prefill_chunk_masks_leak_one_cell_per_row_with_an_incomplete_block():
  batch = _batch("contiguous")
  seq = int(batch.distribution[0])
  chunk = addressing.prefill_chunk_masks(batch, seq, window=6)
  assert chunk.masks["model"].shape == chunk.leak.shape == (5, 6)
  # seq_len 70: the length mask removes entry 17 (positions 68, 69) too.
  p = chunk.positions
  assert chunk.leak_cells == int((((p + 1) % 4 != 0) & (p // 4 < 70 // 4)).sum())
  assert chunk.leak_cells == 2
  assert chunk.leak_rows == chunk.leak_cells
  np.testing.assert_array_equal(chunk.leak,
                                chunk.masks["seed"] & ~chunk.masks["model"])


@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("fmt", ["fp8", "bf16", "dense_fp8"])
def test_stored_keys_are_what_unpack_cache_raw_reads(fmt, head_dim):
  batch = _batch("fragmented")
  inp = si.make_inputs(batch, num_heads=2, head_dim=head_dim,
                       fmt="fp8").with_cache_format(fmt)
  values, scales = addressing._stored_keys(inp.cache, head_dim,  # pylint: disable=protected-access
                                           batch.page_size)
  want_v, want_s = cache.unpack_cache_raw(inp.cache, head_dim)
  np.testing.assert_array_equal(values, np.asarray(want_v.astype(jnp.float32)))
  if want_s is None:
    assert scales is None
  else:
    np.testing.assert_array_equal(scales, np.asarray(want_s))
