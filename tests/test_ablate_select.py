"""Blocktop's kernel taken apart (`streamidx.lab.bench.ablate_select`,
`topk.blocktop.kernel_call`'s `ablate`): without a TPU, each experiment is
its own program for v5e, the pass written out is the pass `select` runs,
each ablation leaves out what it names (interpreted: the DMAs it starts),
and a measurement's row follows the records."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import streamidx as si
from streamidx import records
from streamidx.lab.bench import ablate_select, record
from streamidx.lab.bench import topk as topk_bench
from streamidx.lab.model import timeline
from streamidx.topk import blocktop

from tiers import FULL, needs_libtpu

TINY = ablate_select.SHAPES[ablate_select.SHAPE].with_(
    name="tiny", num_seqs=8, seq_len=4 * 16384)  # one tile of two chunks


def _exp(name):
  return next(e for e in ablate_select.EXPERIMENTS if e.name == name)


def test_the_shapes_are_the_records_selection_points():
  assert set(ablate_select.SHAPES) == {"select-64x262144",
                                       "select-2048x262144"}
  assert all(s.k == 512 for s in ablate_select.SHAPES.values())


def test_kernel_call_refuses_an_ablation_of_what_it_does_not_run():
  # The pass's pieces without the finish, the finish's steps with it.
  x = jnp.zeros((8, 16384), jnp.float32)
  for finish, ablate in ((True, {"dma"}), (False, {"sort"}),
                         (True, {"sort", "scan"}), (False, {"tile"})):
    with pytest.raises(ValueError, match="without the finish, of"):
      blocktop.kernel_call(x, 8, 2, 8192, finish=finish, ablate=ablate)


@needs_libtpu
def test_each_experiment_is_its_own_program_for_v5e():
  texts = set()
  with si.compile_for("v5e"):
    for e in ablate_select.EXPERIMENTS:
      _, fn = ablate_select.program(e, TINY)
      spec = jax.ShapeDtypeStruct((TINY.rows, TINY.entries), jnp.float32)
      texts.add(jax.jit(fn).lower(spec).as_text())
  assert len(texts) == len(ablate_select.EXPERIMENTS)


@FULL
@needs_libtpu
@pytest.mark.parametrize("name", [e.name for e in ablate_select.EXPERIMENTS])
def test_each_experiment_compiles_for_v5e(name):
  with si.compile_for("v5e"):
    _, fn = ablate_select.program(_exp(name), TINY)
    spec = jax.ShapeDtypeStruct((TINY.rows, TINY.entries), jnp.float32)
    jax.jit(fn).lower(spec).compile()


@FULL
def test_each_ablation_starts_the_dmas_it_keeps():
  """Interpreted at 8 rows x 16,384 entries: the pass written out is
  `block_candidates`'s levels (the pass `select` runs); without the pass's
  work ("scan") the tiles' DMAs are all started, without its DMAs ("dma")
  none."""
  x = jnp.asarray(topk_bench.score_buffer(TINY))

  def run(name):
    _, fn = ablate_select.program(_exp(name), TINY)
    with timeline.record() as rec:
      out = jax.block_until_ready(jax.jit(fn)(x))
    tile_dmas = [op for op in rec.ops if op.kind == "dma_start"
                 and op.info["src"][0] == "hbm"]  # not the outputs'
    return out, tile_dmas
  levels, shipped = run("pass_only")
  keep, tile = blocktop.plan(TINY.entries, TINY.k)
  vals, _, dropped, _ = blocktop.block_candidates(
      x, keep=keep, tile=tile)
  got = np.asarray(levels[0]).reshape(1, keep + 1, blocktop.UNITS, 8, 128)
  want = np.concatenate([np.asarray(vals), np.asarray(dropped)], axis=1)
  np.testing.assert_array_equal(
      si.topk.base.canonical_zero(got.transpose(0, 3, 1, 2, 4).reshape(8, -1)),
      want)
  assert shipped and len(run("reads_only")[1]) == len(shipped)
  assert run("scan_only")[1] == []


def test_a_measurement_row_follows_the_records_and_appends(chip_records):
  del chip_records
  shape = ablate_select.SHAPES[ablate_select.SHAPE]
  blocks, _ = ablate_select.program(_exp("pass_only"), shape)
  times = {"total_s": 2e-4, "ops": [{"name": "StreamIdxBlocktopLevels",
                                     "count": 5, "self_us": 950.0}]}
  r = ablate_select.row(_exp("pass_only"), blocks, times, shape=shape,
                        chip="v5e", device_kind="TPU v5 lite", compile_s=3.0,
                        command="python -m streamidx.bench --ablate-select")
  assert records.chip_problems(r, records.EXPERIMENT_FIELDS) == []
  assert r["hbm_bytes"] == 64 * 262144 * 4 and r["grid_steps"] == 8
  assert r["kv_steps"] == 8 * 262144 // blocks["tile"]
  assert r["ratio"] == pytest.approx(2e-4 / (r["hbm_bytes"] / 819e9), rel=0.01)
  assert r["ops"] == [["StreamIdxBlocktopLevels", 1.0, pytest.approx(1.9e-4)]]
  records.append_chip(experiments=[r])
  assert records.chip_rows("experiments", variant="blocktop") == [
      json.loads(json.dumps(r))]
  (got,) = record.experiment_table(records.chip_rows("experiments"))
  assert (got["kv pages"], got["batch"], got["removed"]) == ("-", "-", "finish")


def test_ablate_select_refuses_to_run_off_a_tpu(capsys):
  assert ablate_select.main(["--only", "baseline"]) == 2
  assert "measures on a TPU" in capsys.readouterr().err
