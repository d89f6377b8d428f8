"""streamidx.lab.studies.layout: byte counts, entry addresses, causal masks, launch plan."""

from __future__ import annotations

import itertools

import jax.numpy as jnp
import numpy as np
import pytest

import streamidx as si
from streamidx import cache, ref
from streamidx.lab.studies import layout


# --------------------------------------------------------------------------
# Bytes per entry and HBM per decode step.


def test_bytes_per_entry_at_head_dim_128_are_256_256_132_129():
  got = {name: layout.bytes_per_entry(name) for name in layout.ENTRY_LAYOUTS}
  assert got == {"fp8_packed": 256, "bf16": 256, "fp8_f32_scale_apart": 132,
                 "fp8_e8m0_scale_apart": 129}


@pytest.mark.parametrize("head_dim", [128, 256, 512])
@pytest.mark.parametrize("name", layout.KERNEL_LAYOUTS)
def test_kernel_layouts_take_their_bytes_from_the_cache_format(name, head_dim):
  lay = layout.entry_layout(name, head_dim)
  assert lay.total_bytes == cache.record_bytes(lay.cache_format, head_dim)
  # The packed array really is that many bytes per entry.
  keys = jnp.ones((1, 8, head_dim), jnp.float32)
  packed = cache.pack_cache(keys, lay.cache_format)
  assert packed.nbytes == 8 * lay.total_bytes


@pytest.mark.parametrize("head_dim", [128, 256])
@pytest.mark.parametrize("name", layout.ENTRY_LAYOUTS)
def test_layout_parts_add_up(name, head_dim):
  lay = layout.entry_layout(name, head_dim)
  assert lay.value_bytes + lay.scale_bytes + lay.pad_bytes == lay.total_bytes
  assert lay.pad_bytes >= 0 and lay.value_bytes >= head_dim
  assert lay.scales_inline == (lay.cache_format is not None)


def test_fp8_packed_record_is_values_scale_and_padding_to_128_lanes():
  lay = layout.entry_layout("fp8_packed", 128)
  assert (lay.value_bytes, lay.scale_bytes, lay.pad_bytes) == (128, 1, 127)


@pytest.mark.parametrize("bad", [0, 64, 130, -128])
def test_entry_layout_rejects_head_dims_the_layouts_cannot_hold(bad):
  with pytest.raises(ValueError, match="head_dim"):
    layout.entry_layout("fp8_packed", bad)


def test_entry_layout_rejects_unknown_names():
  with pytest.raises(ValueError, match="layout must be one of"):
    layout.entry_layout("fp4", 128)


@pytest.mark.parametrize("context", [0, 3, 4, 8192, 1 << 20])
@pytest.mark.parametrize("name", layout.ENTRY_LAYOUTS)
def test_decode_step_bytes_are_entries_times_bytes_per_entry(context, name):
  step = layout.decode_step_bytes(context, name, num_heads=64, head_dim=128,
                                  compression_ratio=4)
  assert step.entries == context // 4
  assert step.cache_bytes == (context // 4) * layout.bytes_per_entry(name)
  assert step.query_bytes == 64 * 128 * 2 + 64 * 4
  assert step.score_bytes == (context // 4) * 12
  assert step.total_bytes == step.cache_bytes + step.query_bytes + step.score_bytes


def test_one_million_tokens_cost_64_mib_per_layer_in_the_packed_layout():
  step = layout.decode_step_bytes(1 << 20, "fp8_packed")
  assert step.cache_bytes == 64 * 2**20
  assert layout.decode_step_bytes(1 << 20, "fp8_f32_scale_apart").cache_bytes \
      == 33 * 2**20


def test_decode_step_table_orders_contexts_then_layouts():
  rows = layout.decode_step_table([8, 16])
  assert [(r.context, r.layout) for r in rows] == list(
      itertools.product([8, 16], layout.ENTRY_LAYOUTS))


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
      addr = layout.locate_entry(batch, b, t, fmt)
      assert addr.physical_page == batch.page_table[b, t // batch.page_size]
      np.testing.assert_array_equal(packed[addr.index],
                                    records[b * per_seq + t])


def test_locate_entry_rejects_entries_the_sequence_does_not_hold():
  batch = _batch("contiguous")
  n = int(batch.num_entries[1])
  with pytest.raises(ValueError, match="entry must be in"):
    layout.locate_entry(batch, 1, n)
  with pytest.raises(ValueError, match="seq must be in"):
    layout.locate_entry(batch, batch.num_seqs, 0)


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
    mask = layout.visibility_mask(pos[r:r + 1], 200, ratio, rule,
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
    mask = layout.visibility_mask(pos[r:r + 1], scores.shape[1], 4, rule,
                                  seq_len=int(batch.seq_lens[seq_of[r]]))[0]
    np.testing.assert_array_equal(mask, np.isfinite(scores[r]))


@pytest.mark.parametrize("ratio", [1, 2, 4, 5])
def test_model_rule_sees_a_subset_of_the_seed_rule_and_decode_rows_agree(ratio):
  seq_lens = np.arange(1, 60)
  for seq_len in seq_lens:
    positions = np.arange(seq_len)
    model = layout.visibility_mask(positions, 64, ratio, "model",
                                   seq_len=seq_len)
    seed = layout.visibility_mask(positions, 64, ratio, "seed",
                                  seq_len=seq_len)
    assert not (model & ~seed).any()
    # The decode row (p = seq_len - 1) is the same under both rules.
    np.testing.assert_array_equal(model[-1], seed[-1])


@pytest.mark.parametrize("ratio", [2, 4])
def test_rules_differ_exactly_on_the_querys_own_incomplete_block(ratio):
  seq_len = 41
  positions = np.arange(seq_len)
  diff = layout.causal_rule_difference(positions, 32, ratio, seq_len=seq_len)
  for p, row in zip(positions, diff):
    leaked = np.flatnonzero(row)
    own_block = p // ratio
    if (p + 1) % ratio and own_block < seq_len // ratio:
      assert leaked.tolist() == [own_block]
    else:
      assert leaked.size == 0


def test_visibility_mask_rejects_unknown_rules():
  with pytest.raises(ValueError, match="causal_rule"):
    layout.visibility_mask([3], 4, 4, "future")


# --------------------------------------------------------------------------
# The launch plan.

DISTRIBUTION_FORMS = {
    "empty": (0, 0, 0),
    "decode_only": (7, 7, 7),
    "prefill_only": (0, 5, 5),
    "mixed_only": (0, 0, 6),
    "decode_prefill": (5, 8, 8),
    "decode_mixed": (6, 6, 9),
    "prefill_mixed": (0, 3, 7),
    "all_three": (9, 11, 14),
}


@pytest.mark.parametrize("decode_req_batch_size", [1, 2, 3, 4, 8])
@pytest.mark.parametrize("form", sorted(DISTRIBUTION_FORMS))
def test_launch_plan_covers_each_sequence_exactly_once(form,
                                                       decode_req_batch_size):
  i, j, n = DISTRIBUTION_FORMS[form]
  plan = layout.launch_plan((i, j, n), num_kv_pages_per_block=(3, 2, 2),
                            num_queries_per_block=(1, 128, 64),
                            decode_req_batch_size=decode_req_batch_size)
  assert [l.case for l in plan] == ["decode", "decode", "prefill", "mixed"]
  covered = [s for l in plan for prog in layout.program_sequences(l)
             for s in prog]
  assert sorted(covered) == list(range(n)) and len(covered) == n
  case_of = {s: l.case for l in plan for prog in layout.program_sequences(l)
             for s in prog}
  assert all(case_of[s] == "decode" for s in range(i))
  assert all(case_of[s] == "prefill" for s in range(i, j))
  assert all(case_of[s] == "mixed" for s in range(j, n))
  batched, rest, prefill, mixed = plan
  assert batched.seq_batch_size == decode_req_batch_size
  assert batched.grid == i // decode_req_batch_size
  assert rest.grid == i % decode_req_batch_size
  assert (batched.static_q_len, rest.static_q_len) == (1, 1)
  assert (prefill.static_q_len, mixed.static_q_len) == (None, None)
  assert (batched.bkv_p, prefill.bkv_p, mixed.bkv_p) == (3, 2, 2)
  assert (batched.bq_sz, prefill.bq_sz, mixed.bq_sz) == (1, 128, 64)


def test_launch_names_are_the_kernels_scope_names():
  plan = layout.launch_plan((2, 3, 4), num_kv_pages_per_block=8,
                            num_queries_per_block=(4, 16, 32))
  # Decode: bq = min(num_queries_per_block, static q_len 1).
  assert [l.name for l in plan] == [
      "StreamIdxTC-d-bq_1-bkvp_8", "StreamIdxTC-d-bq_1-bkvp_8",
      "StreamIdxTC-p-bq_16-bkvp_8", "StreamIdxTC-m-bq_32-bkvp_8"]


@pytest.mark.parametrize("distribution, message", [
    ((1, 2), "distribution must be"),
    ((3, 2, 4), "0 <= i <= j <= n"),
    ((0, 0, -1), "0 <= i <= j <= n"),
])
def test_launch_plan_rejects_bad_distributions(distribution, message):
  with pytest.raises(ValueError, match=message):
    layout.launch_plan(distribution, num_kv_pages_per_block=8,
                       num_queries_per_block=8)


def test_launch_plan_rejects_bad_block_sizes_and_batch_size():
  with pytest.raises(ValueError, match="num_queries_per_block"):
    layout.launch_plan((1, 1, 1), num_kv_pages_per_block=8,
                       num_queries_per_block=(1, 8))
  with pytest.raises(ValueError, match="decode_req_batch_size"):
    layout.launch_plan((1, 1, 1), num_kv_pages_per_block=8,
                       num_queries_per_block=8, decode_req_batch_size=0)


def test_program_work_counts_query_and_kv_blocks_like_the_kernel():
  # page_size 16, bkv_p 8: 128 entries per KV block.
  batch = si.make_mixed_batch(decode=[4 * 300, 4 * 100, 4 * 129],
                              prefill=[(9, 4 * 128)], mixed=[(1, 40)],
                              page_size=16, compression_ratio=4)
  plan = layout.launch_plan(batch.distribution, num_kv_pages_per_block=8,
                            num_queries_per_block=(1, 4, 4),
                            decode_req_batch_size=2)
  work = layout.program_work(batch, plan)
  got = [(w.launch, w.seqs, w.num_bq, w.num_bkv, w.q_rows) for w in work]
  assert got == [
      (0, (0, 1), 1, 3, ((0, 1), (1, 2))),  # max(300, 100) entries: 3 blocks
      (1, (2,), 1, 2, ((2, 3),)),           # 129 entries: 2 blocks
      (2, (3,), 3, 1, ((3, 12),)),          # 9 rows / bq 4: 3 query blocks
      (3, (4,), 1, 1, ((12, 13),)),         # 10 entries: still 1 block
  ]


def test_launch_plan_matches_the_interpreted_kernels_grid_points():
  recorded = []

  def recorder(token, grid_point, core):
    recorded.append(tuple(int(g) for g in grid_point))
    return token

  batch = si.make_mixed_batch(decode=[37, 64, 100, 20, 30], prefill=[(7, 50)],
                              mixed=[(5, 90)], page_size=16,
                              compression_ratio=4, allocation="fragmented")
  inp = si.make_inputs(batch, num_heads=2, fmt="fp8")
  kw = dict(k=8, compression_ratio=4, num_kv_pages_per_block=8,
            num_queries_per_block=(1, 8, 8), decode_req_batch_size=2)
  args = list(inp.args)
  # Same shapes, other distributions: one compile, several launch plans.
  for distribution in [(5, 6, 7), (3, 5, 7), (0, 0, 7), (4, 7, 7)]:
    recorded.clear()
    args[6] = jnp.asarray(distribution, jnp.int32)
    with si.interpreter(grid_point_recorder=recorder):
      si.streamindex_topk(*args, **kw).block_until_ready()
    plan = layout.launch_plan(distribution, num_kv_pages_per_block=8,
                              num_queries_per_block=(1, 8, 8),
                              decode_req_batch_size=2)
    assert recorded == layout.expected_grid_points(plan), distribution
