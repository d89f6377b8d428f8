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
