"""streamidx.lab.studies.costs: recorded calls and the bytes they count."""

from __future__ import annotations

import jax.numpy as jnp
import pytest
import numpy as np

from streamidx.lab.model import timeline
from streamidx.lab.studies import costs


def test_recorded_call_records_where_the_interpreter_has_the_internals():
  out, rec = costs.recorded_call(lambda: jnp.arange(3) * 2)
  np.testing.assert_array_equal(out, [0, 2, 4])
  assert isinstance(rec, timeline.Recorder)


def test_recorded_call_still_returns_the_result_without_the_internals(monkeypatch):
  monkeypatch.setattr(costs.modes, "interpreter_internals_missing",
                      lambda *f: "jax X lacks Y")
  out, rec = costs.recorded_call(lambda: jnp.arange(3) * 2)
  np.testing.assert_array_equal(out, [0, 2, 4])
  assert rec is None


def test_recorded_bytes_of_an_empty_recording_are_zero():
  with timeline.record() as rec:
    pass
  got = costs.recorded_bytes(rec, page_size=16)
  assert (got["kv_bytes"], got["kv_pages"], got["entries_fetched"]) == (0, 0, 0)
  assert np.isnan(got["bytes_per_entry"])


def _decode_plan(lens):
  import streamidx as si  # pylint: disable=g-import-not-at-top
  from streamidx.lab.model import tiling  # pylint: disable=g-import-not-at-top
  b = si.make_mixed_batch(decode=lens, page_size=128, compression_ratio=4)
  return tiling.plan(b, fmt="fp8", num_heads=8, num_kv_pages_per_block=(3, 2, 2),
                     num_queries_per_block=(1, 128, 128), decode_req_batch_size=4)


def _recording(launches):
  """A Recorder holding, per launch, (grid points, kv page DMAs, kv waits)."""
  rec = timeline.Recorder()
  seq = 0
  for li, (grid, pages, waits) in enumerate(launches):
    ops = ([("launch", {})] + [("grid", {})] * grid
           + [("dma_start", dict(sem="kv", nbytes=128 * 256))] * pages
           + [("dma_wait", dict(sem="kv"))] * waits)
    for kind, info in ops:
      rec.ops.append(timeline.Op(seq, li, kind, info))
      seq += 1
  return rec


def test_recorded_costs_refuses_a_recording_of_another_call():
  p = _decode_plan([4000, 900, 300])  # B=4: one launch
  with pytest.raises(ValueError, match="2 launches ran, the plan has 1"):
    costs.recorded_costs(_recording([(1, 0, 0), (1, 0, 0)]), p)


def test_recorded_costs_count_bytes_per_entry_and_the_waste():
  from streamidx.lab.model import tiling  # pylint: disable=g-import-not-at-top
  p = _decode_plan([4000, 900, 300])
  kv, blocks = p.counts()["dma_kv"], tiling.block_waste(p)["blocks_computed"]
  r = costs.recorded_costs(_recording([(3, kv, blocks)]), p)
  assert r["bytes_per_entry"] == 256
  assert (r["launches"], r["grid_points"], r["empty_launches"]) == (1, 3, 0)
  assert r["kv_page_dmas"] == kv and r["blocks_fetched"] == blocks
  assert r["waste"] == pytest.approx(1 - r["blocks_needed"] / blocks)
