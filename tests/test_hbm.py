"""streamidx.lab.studies.hbm: HBM bytes per decode step and layer."""

from __future__ import annotations

import itertools

import pytest

from streamidx.lab.studies import formats, hbm


@pytest.mark.parametrize("context", [0, 3, 4, 8192, 1 << 20])
@pytest.mark.parametrize("name", formats.ENTRY_LAYOUTS)
def test_decode_step_bytes_are_entries_times_bytes_per_entry(context, name):
  step = hbm.decode_step_bytes(context, name, num_heads=64, head_dim=128,
                               compression_ratio=4)
  assert step.entries == context // 4
  assert step.cache_bytes == (context // 4) * formats.bytes_per_entry(name)
  assert step.query_bytes == 64 * 128 * 2 + 64 * 4
  assert step.score_bytes == (context // 4) * 12
  assert step.total_bytes == step.cache_bytes + step.query_bytes + step.score_bytes


def test_one_million_tokens_cost_64_mib_per_layer_in_the_packed_layout():
  step = hbm.decode_step_bytes(1 << 20, "fp8_packed")
  assert step.cache_bytes == 64 * 2**20
  assert hbm.decode_step_bytes(1 << 20, "fp8_f32_scale_apart").cache_bytes \
      == 33 * 2**20


def test_decode_step_table_orders_contexts_then_layouts():
  rows = hbm.decode_step_table([8, 16])
  assert [(r.context, r.layout) for r in rows] == list(
      itertools.product([8, 16], formats.ENTRY_LAYOUTS))


# --------------------------------------------------------------------------
# The cache formats side by side at one decode step.


def test_stored_bytes_per_entry_are_256_for_the_records_and_132_dense_at_page_128():
  assert hbm.stored_bytes_per_entry("fp8") == 256
  assert hbm.stored_bytes_per_entry("bf16") == 256
  assert hbm.stored_bytes_per_entry("dense_fp8", 128, 128) == 132
  assert hbm.stored_bytes_per_entry("dense_fp8", 128, 512) == 129


def test_decode_step_by_format_reads_whole_kv_blocks_of_each_formats_stored_bytes():
  rows = hbm.decode_step_by_format(4, 8192, generations=["v5e", "v6e"])
  assert [(r["fmt"], r["generation"]) for r in rows] == list(
      itertools.product([f for f, _ in hbm.FORMAT_VARIANTS], ["v5e", "v6e"]))
  entries = 8192 // 4
  for r in rows:
    bkv = r["bkv_p"] * 128
    blocks = -(-entries // bkv)
    assert r["kv_bytes"] == 4 * blocks * bkv * r["stored_bytes"], r
    assert r["step_bytes"] > r["kv_bytes"]
    assert r["step_us"] > r["kernel_us"] > 0
    assert r["limiter"] == "memory"  # 64 FLOP/B at 64 heads: below every ridge


def test_dense_fp8_step_is_predicted_faster_by_the_bytes_it_saves():
  rows = hbm.decode_step_by_format(64, 131072, generations=["v6e"])
  by = {r["fmt"]: r for r in rows}
  assert by["fp8"]["step_us"] == pytest.approx(by["bf16"]["step_us"])
  kernel_ratio = by["fp8"]["kernel_us"] / by["dense_fp8"]["kernel_us"]
  bytes_ratio = by["fp8"]["kv_bytes"] / by["dense_fp8"]["kv_bytes"]
  assert 1.8 < kernel_ratio < 2.0 and 1.8 < bytes_ratio < 2.0


def test_decode_step_by_format_rejects_empty_batches():
  with pytest.raises(ValueError, match="batch_size"):
    hbm.decode_step_by_format(0, 8192)
