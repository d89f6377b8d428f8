"""`streamidx.topk.defaults`: the default top-k method of each chip, a table
with a source per row, checked against the recorded figures; and the calls'
defaults resolved through it for the chip traced for."""

from __future__ import annotations

import contextlib
import json

import numpy as np
import pytest

import streamidx as si
from streamidx import modes, records, topk
from streamidx.lab import aot, shapes
from streamidx.lab.studies import cases
from streamidx.topk import defaults

import tiers



def _decode_records(chip):
  """The file's selection rows of `chip` at DeepSeek-V4-Flash decode (64 x
  262,144, k 512), read here without the module's helper."""
  data = json.loads(records.path("step_schedule").read_text(encoding="utf-8"))
  return {r["method"]: r for r in data["selection"] if r["chip"] == chip
          and (r["rows"], r["entries"], r["k"]) == (64, 262144, 512)}


def test_every_chip_and_off_tpu_has_a_row():
  assert set(defaults.TABLE) == {None, *modes.TOPOLOGIES}
  assert all(r.generation == g for g, r in defaults.TABLE.items())
  assert all(r.method in topk.KERNEL_TOPK_METHODS
             for r in defaults.TABLE.values())


def test_the_table_ranks_at_the_shape_the_bench_and_the_goals_name_decode():
  from streamidx.lab import shapes
  s = shapes.DSV4_DECODE_1M
  assert (s.rows, s.entries, s.k) == defaults.DECODE


def _measured_decode(chip):
  """The chip records' selection-alone calls of `chip` at decode (64 x
  262,144, k 512) checked equal to the rule, newest per method, read here
  without the module's helper."""
  data = json.loads(records.path("chip").read_text(encoding="utf-8"))
  out = {}
  for r in data["rows"]:
    if (r["chip"], r["stage"], r["variant"], r["rows"], r["entries"],
        r["k"]) == (chip, "call", None, 64, 262144, 512) and (
            r.get("check") or {}).get("ok") and r["method"] in topk.KERNEL_TOPK_METHODS:
      out[r["method"]] = r
  return out


@pytest.mark.parametrize("chip", sorted(modes.TOPOLOGIES))
def test_a_measured_row_is_the_exact_method_with_least_device_time_at_decode(chip):
  row, recs = defaults.TABLE[chip], _measured_decode(chip)
  recs = {m: r for m, r in recs.items() if topk.METHODS[m].exact}
  assert row.measured == bool(recs) or not row.recorded
  if not row.measured:
    return
  own = recs[row.method]["device_s"]
  assert f"took {own * 1e3:.3f} ms of device time with {row.method}" in row.source
  for m, r in recs.items():
    if m != row.method:
      assert r["device_s"] > own, (m, r["device_s"], own)
      assert f"{m} {r['device_s'] * 1e3:.3f} ms" in row.source
  assert "sort" in recs  # the vendored selection it replaces is measured


@pytest.mark.parametrize("chip", sorted(modes.TOPOLOGIES))
def test_a_recorded_row_is_the_exact_method_with_fewest_bundles_at_decode(chip):
  row, recs = defaults.TABLE[chip], _decode_records(chip)
  if not row.recorded:  # then nothing recorded could have picked another
    assert row.method == "sort" and not recs, recs.keys()
    assert row.source == "no recorded figure: the vendored sort"
    return
  if row.measured:  # the chip's own times rank them (the test above)
    return
  assert topk.METHODS[row.method].exact
  own = recs[row.method]["bundles"]
  assert own is not None and f"{own:,} bundles" in row.source
  for m, r in recs.items():
    if m == row.method or not topk.METHODS[m].exact:
      continue
    # A loop of data-dependent trip count has no count: its count at 0
    # trips is a lower bound.
    other = r["bundles"] if r["bundles"] is not None else r[
        "bundles_without_dynamic"]
    assert other > own, (m, other, own)
    assert f"{m} " in row.source
  assert "sort" in recs  # the vendored selection it replaces is recorded


def test_off_tpu_keeps_the_vendored_sort_and_says_why():
  assert defaults.TABLE[None].method == topk.VENDORED_TOPK_METHOD == "sort"
  assert "off-TPU" in defaults.TABLE[None].source
  assert defaults.lookup() is defaults.TABLE[None]  # this machine: no TPU


def test_the_interpreter_takes_the_off_tpu_row_on_a_tpu_host(monkeypatch):
  """Under a forced interpreter the call simulates no one chip: on a v5e host
  (its device's generation faked here) it takes the off-TPU row, the sort,
  not v5e's blocktop, whose kernel the interpreter would then run too (05's
  recorded DMA sequence on the v5e held blocktop's DMAs)."""
  monkeypatch.setattr(modes, "device_generation", lambda: "v5e")
  assert defaults.lookup() is defaults.TABLE["v5e"]
  with modes.interpreter():
    assert modes.current_generation() is None
    assert defaults.lookup() is defaults.TABLE[None]


def test_lookup_refuses_an_unknown_generation():
  with pytest.raises(ValueError, match=r"generation: must be one of .*'v3'"):
    defaults.lookup("v3")


@pytest.mark.parametrize("gen", [None, "v4", "v6e", "v7x"])
def test_the_calls_default_is_the_chip_traced_for(gen, monkeypatch):
  monkeypatch.setattr(modes, "current_generation", lambda: gen)
  row = defaults.TABLE[gen]
  inp = si.make_inputs(cases.BATCHES["all_three_ranges"].build(4),
                       num_heads=cases.NUM_HEADS, fmt="fp8")
  call = si.streamindex_topk.call(*inp.args, k=8, compression_ratio=4)
  assert (call.topk_method, call.topk_source) == (row.method, row.source)
  given = si.streamindex_topk.call(*inp.args, k=8, compression_ratio=4,
                                   topk_method="top_k")
  assert (given.topk_method, given.topk_source) == ("top_k", None)
  page = si.streamindex_page_topk.call(*inp.page_args, k_pages=2)
  assert page.topk_method == "top_k"  # page mode's one selection
  seen = []
  monkeypatch.setattr(topk, "get", lambda m: seen.append(m) or
                      topk.METHODS["sort"])
  topk.select_topk(np.zeros((1, 16), np.float32), 4)
  assert seen == [row.method]


# Full tier: compiles the vendored FP8 kernel at the compile matrix's
# dsv4-decode-4k shape for the chip (libtpu, no TPU; about a minute each).
@tiers.FULL
@tiers.needs_libtpu
@pytest.mark.parametrize("gen", ["v6e", "v7x"])
def test_blocktop_compiles_as_the_default_path_of_a_token_call(gen):
  shape = aot.SHAPES_BY_NAME[aot.QUICK_SHAPES["token"]]
  with si.compile_for(gen) as target:
    args = aot.entry_args("vendored", shape, "fp8", target)
    call = si.streamindex_topk.call(*args, k=shape.k,
                                    compression_ratio=shape.compression_ratio)
  assert call.topk_method == "blocktop"
  row = aot.Row("vendored", gen, "fp8", shape.name,
                aot._blocks_key(shapes.table_blocks(shape, "vendored", "fp8",
                                                    gen).kwargs()), True)
  assert row.topk_method is None  # the call's default
  result = aot.compile_row(row)
  assert result.ok, result.error


def test_the_interpreter_runs_on_the_host_cpu_on_a_tpu_host(monkeypatch):
  """On a TPU host (faked) the interpreter's block takes the CPU as default
  device: its callbacks stay on the host."""
  import jax
  seen = []
  monkeypatch.setattr(modes, "on_tpu", lambda: True)
  monkeypatch.setattr(jax, "default_device", lambda d: seen.append(d) or
                      contextlib.nullcontext())
  with modes.interpreter():
    pass
  assert [d.platform for d in seen] == ["cpu"]
