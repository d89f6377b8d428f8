"""The lean kernel taken apart (`streamidx.lab.bench.ablate`, `kernels.lean`'s
`ablate`): without a TPU, every experiment's program compiles for v5e at
the chip run's shape, the empty ablation is the shipped program, each
ablated program waits for every DMA it starts (interpreted: a wait nothing
signals hangs the chip), and a measurement's row follows the records."""

import collections
import dataclasses
import functools
import json

import jax
import numpy as np
import pytest

import streamidx as si
from streamidx import blocks, records, variants
from streamidx import cache as cache_lib
from streamidx.kernels import driver, entries, lean
from streamidx.lab import aot, shapes
from streamidx.lab.bench import ablate, ablate_select, record
from streamidx.lab.model import roofline, timeline
from streamidx.topk import blocktop

from tiers import FULL, needs_libtpu

S = ablate.SHAPE
ABLATED = [e for e in ablate.EXPERIMENTS if e.removed]
# What each removed piece leaves out of the DMAs (lean.SEMAPHORE_ROWS).
NO_DMA = {"score_write": {"out"}, "kv_dma": {"kv", "kv_scale"},
          "scale_dma": {"kv_scale"}, "compute": set(), "kv_loop": {"out"},
          "page_dma": set(), "early_issue": set(), "prefetch_2": set(),
          "split_launch": set(), "big_table": set(), "narrow_pool": set(),
          "gathered_scales": set()}


@functools.lru_cache(maxsize=None)
def _lowered(name: str, empty_ablate: bool = False,
             compile_: bool = False) -> str:
  """The experiment's scoring program lowered (and with `compile_`,
  compiled) for v5e at `ablate.SHAPE` (with `empty_ablate`, through
  `lean.launch(ablate=frozenset())`)."""
  exp = next(e for e in ablate.EXPERIMENTS if e.name == name)
  spec = shapes.CallShape(S.name, "token", S.num_tokens, S.num_seqs, S.pages,
                          S.page_size, S.num_heads, S.head_dim, S.k,
                          S.compression_ratio)
  with si.compile_for("v5e") as target:
    args = aot.entry_args(ablate.VARIANT, spec, S.fmt, target)
    _, fn, arrays = ablate.program(exp, args, "v5e")
    if empty_ablate:
      call, body = fn.args
      fn = functools.partial(driver.scoring, call, dataclasses.replace(
          body, launch=functools.partial(lean.launch, ablate=frozenset())))
    low = jax.jit(fn).lower(*arrays)
    if compile_:
      low.compile()
    return low.as_text()


@needs_libtpu
def test_an_empty_ablation_is_the_shipped_program():
  assert _lowered("baseline", empty_ablate=True) == _lowered("baseline")


@needs_libtpu
def test_the_deep_queue_ships_where_a_chip_measured_it():
  assert lean.deep_queue(True)  # interpreted: the v5e's kernel
  for gen in ("v5e", "v6e", "v7x"):
    with si.compile_for(gen):
      assert lean.deep_queue(False) == (gen in lean.DEEP_QUEUE_CHIPS), gen


@needs_libtpu
def test_each_ablation_changes_the_program():
  assert len({_lowered(e.name) for e in ablate.EXPERIMENTS if e.removed}
             | {_lowered("baseline")}) == len(ABLATED) + 1


@FULL
@needs_libtpu
@pytest.mark.parametrize("name", [e.name for e in ablate.EXPERIMENTS])
def test_each_experiment_compiles_for_v5e(name):
  _lowered(name, compile_=True)


def _dma_bytes(exp, args, tiny):
  """Interpreted: ({(launch, row, slot): started - waited bytes}, the rows
  with DMAs, the score buffer)."""
  _, fn, arrays = ablate.program(exp, args, "v5e", tiny)
  with timeline.record() as rec:
    out = jax.block_until_ready(jax.jit(fn)(*arrays))
  left, rows = collections.Counter(), set()
  for op in rec.ops:
    if op.kind in ("dma_start", "dma_wait"):
      row = op.info["sem"]
      rows.add(row)
      left[(op.launch, row, op.info["slot"])] += op.info["nbytes"] * (
          1 if op.kind == "dma_start" else -1)
  return {k: v for k, v in left.items() if v}, rows, np.asarray(out[0])


@FULL
def test_every_ablation_waits_for_each_dma_it_starts_and_drops_its_piece():
  tiny = S.with_(name="tiny", num_seqs=4, seq_len=8192)  # 2 KV blocks each
  args = record.entry_args(tiny, ablate.VARIANT, tiny.fmt)
  left, everything, _ = _dma_bytes(ablate.EXPERIMENTS[0], args, tiny)
  assert not left and everything == {"kv", "kv_scale", "q", "w", "out"}
  for exp in ABLATED:
    left, rows, scores = _dma_bytes(exp, args, tiny)
    assert not left, (exp.name, left)
    gone = set().union(*(NO_DMA[r] for r in exp.removed))
    assert rows == everything - gone, exp.name
    # Scores reach the buffer only through the output DMAs.
    assert np.isneginf(scores).all() == ("out" in gone), exp.name



@FULL
def test_late_issue_scores_as_shipped_without_a_race(race_log):
  """The next block's DMAs issued after this block's loads (the order
  shipped before, `late_issue`): the same scores, bit for bit, and the race
  detector finds no DMA into a buffer still being read (4 sequences of 2
  KV blocks each; the shipped order's races: tests/test_races.py)."""
  tiny = S.with_(name="tiny", num_seqs=4, seq_len=8192)
  args = record.entry_args(tiny, ablate.VARIANT, tiny.fmt)
  shipped = _dma_bytes(ablate.EXPERIMENTS[0], args, tiny)[2]
  late = next(e for e in ablate.EXPERIMENTS if e.name == "late_issue")
  _, fn, arrays = ablate.program(late, args, "v5e", tiny)
  with si.interpreter(detect_races=True):
    scores = np.asarray(jax.block_until_ready(jax.jit(fn)(*arrays))[0])
  assert race_log and not any(st.races_found for st in race_log)
  np.testing.assert_array_equal(scores, shipped)


def _mixed_scores(num_cores: int, narrow: bool = False):
  """`scores(exp)`: the experiment's score buffer over one batch of all four
  launches whose programs take several KV steps (128-entry blocks) and
  query blocks (8 rows), 2 sequences a decode program, on `num_cores`;
  with `narrow`, each page p of the P-page cache holds page
  p % (P // `lean.NARROW_POOL`)'s data."""
  batch = si.make_mixed_batch(
      decode=[2000, 37, 1200, 64, 700], prefill=[(20, 1100)],
      mixed=[(9, 1333), (1, 90), (3, 600), (0, 40)], page_size=64,
      compression_ratio=4, seed=3)
  q, w, cache, *rest = si.make_inputs(batch, num_heads=4, fmt="dense_fp8",
                                      seed=1).args
  if narrow:
    pages = cache[0].shape[0]
    cache = tuple(a[np.arange(pages) % (pages // lean.NARROW_POOL)]
                  for a in cache)
  call, arrays = variants.get(ablate.VARIANT).kernel.bind(
      q, w, *cache, *rest, k=8, compression_ratio=4, topk_method="sort",
      num_kv_pages_per_block=2, num_queries_per_block=(1, 8, 8),
      decode_req_batch_size=2, num_cores=num_cores)

  def scores(exp):
    fn = functools.partial(driver.scoring, call,
                           entries.lean_without(exp.removed))
    return np.asarray(jax.block_until_ready(jax.jit(fn)(*arrays))[0])
  return scores


@FULL
@pytest.mark.parametrize("num_cores", [1, 2])
def test_two_blocks_ahead_score_as_one_without_a_race(race_log, num_cores):
  """Two KV blocks in flight (the shipped v5e kernel, interpreted): the
  scores of one block ahead (`one_ahead`), bit for bit, and no DMA into
  a buffer still being read, over `_mixed_scores`'s four launches, where
  the block two steps on is often the next program's, or past a program of
  one step the one after it; on two cores, each core's programs."""
  scores = _mixed_scores(num_cores)
  one = scores(next(e for e in ablate.EXPERIMENTS if e.name == "one_ahead"))
  race_log.clear()  # one_ahead's run
  with si.interpreter(detect_races=True, num_cores_or_threads=num_cores):
    got = scores(ablate.EXPERIMENTS[0])
  assert len(race_log) == 4 and not any(st.races_found for st in race_log)
  np.testing.assert_array_equal(got, one)
  assert np.isfinite(one).any()


@FULL
def test_a_split_launch_scores_as_one_without_a_race(race_log):
  """The launch's programs in `lean.SPLIT_PARTS` launches ("split_launch"):
  the shipped scores, bit for bit, race-free, over a batch whose decode
  launch has two programs (two of its four ranges empty) and whose
  prefill and mixed launches one program a sequence."""
  scores = _mixed_scores(1)
  shipped = scores(ablate.EXPERIMENTS[0])
  race_log.clear()
  with si.interpreter(detect_races=True):
    got = scores(next(e for e in ablate.EXPERIMENTS
                      if e.name == "split_launch"))
  assert race_log and not any(st.races_found for st in race_log)
  np.testing.assert_array_equal(got, shipped)
  assert np.isfinite(shipped).any()


@FULL
def test_a_big_table_scores_as_the_shipped_table():
  """The page table with `lean.BIG_TABLE_ROWS` times its rows ("big_table",
  the rows past the table's never read): the shipped scores, bit for bit."""
  scores = _mixed_scores(1)
  np.testing.assert_array_equal(
      scores(next(e for e in ablate.EXPERIMENTS if e.name == "big_table")),
      scores(ablate.EXPERIMENTS[0]))


@FULL
def test_a_narrow_pool_scores_as_the_shipped_table_on_a_folded_cache():
  """The page ids folded into the cache's first 1/`lean.NARROW_POOL` pages
  ("narrow_pool"): the shipped scores, bit for bit, over the cache whose
  every page p holds the data of the page it folds to (the batch's table
  reads every page); the narrow pool's own cache is the unfolded one, whose
  first pages are the same, so an ablation that folded nothing differs."""
  narrow = next(e for e in ablate.EXPERIMENTS if e.name == "narrow_pool")
  np.testing.assert_array_equal(
      _mixed_scores(1)(narrow),
      _mixed_scores(1, narrow=True)(ablate.EXPERIMENTS[0]))


def test_a_wide_pool_gives_the_shipped_program_four_times_the_pages():
  """"wide_pool": the cache's arrays `ablate.WIDE_POOL` times the batch's
  pages, the rest of every argument and the kernel the shipped call's."""
  spec = shapes.CallShape(S.name, "token", S.num_tokens, S.num_seqs, S.pages,
                          S.page_size, S.num_heads, S.head_dim, S.k,
                          S.compression_ratio)
  args = aot.entry_args(ablate.VARIANT, spec, S.fmt)
  wide = next(e for e in ablate.EXPERIMENTS if e.name == "wide_pool")
  (_, fn, got), (_, base, want) = (ablate.program(e, args, "v5e")
                                   for e in (wide, ablate.EXPERIMENTS[0]))
  assert fn.args[1] is base.args[1] is entries.LEAN
  pairs = zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True)
  changed = [(g.shape, w.shape) for g, w in pairs if g.shape != w.shape]
  assert len(changed) == len(cache_lib.CACHE_FORMATS[S.fmt].arrays) == 2
  assert all(g == (w[0] * ablate.WIDE_POOL, *w[1:]) for g, w in changed)


@pytest.mark.parametrize("where", ["before", "after"])
def test_ballast_holds_its_bytes_beside_the_shipped_arrays(monkeypatch, where):
  """"ballast_*": the shipped program's arguments built anew (equal to the
  shipped call's), with `ablate.BALLAST_BYTES` of HBM to hold beside them;
  no ballast, the shipped arguments themselves."""
  monkeypatch.setattr(ablate, "BALLAST_BYTES", 4096)
  tiny = S.with_(name="tiny", num_seqs=4, seq_len=8192)
  args = record.entry_args(tiny, ablate.VARIANT, tiny.fmt)
  exp = next(e for e in ablate.EXPERIMENTS if e.name == f"ballast_{where}")
  got, ballast = ablate.inputs(exp, tiny, args)
  assert ballast.shape == (4096,) and ballast.dtype == np.uint8
  assert all(a is not b and np.array_equal(a, b)
             for a, b in zip(got, args, strict=True))
  assert ablate.inputs(ablate.EXPERIMENTS[0], tiny, args) == (args, None)


@FULL
def test_a_wide_pool_scores_as_the_shipped_cache():
  """The cache given `ablate.WIDE_POOL` times its pages, zeros past its
  own: the shipped scores, bit for bit, every DMA waited for."""
  tiny = S.with_(name="tiny", num_seqs=4, seq_len=8192)
  args = record.entry_args(tiny, ablate.VARIANT, tiny.fmt)
  wide = next(e for e in ablate.EXPERIMENTS if e.name == "wide_pool")
  left, _, got = _dma_bytes(wide, args, tiny)
  assert not left
  np.testing.assert_array_equal(got, _dma_bytes(ablate.EXPERIMENTS[0], args,
                                                tiny)[2])


@FULL
def test_inline_scales_score_as_the_shipped_kernel():
  """Each page's values and scales in one array, one DMA a page
  ("inline_scales": the inline variant over the same keys' inline array):
  the shipped scores, bit for bit, no scale DMA, every DMA waited for (4
  sequences of 2 KV blocks)."""
  tiny = S.with_(name="tiny", num_seqs=4, seq_len=8192)
  args = record.entry_args(tiny, ablate.VARIANT, tiny.fmt)
  inline = next(e for e in ablate.EXPERIMENTS if e.name == "inline_scales")
  left, rows, got = _dma_bytes(inline, args, tiny)
  assert not left and "kv_scale" not in rows
  np.testing.assert_array_equal(got, _dma_bytes(ablate.EXPERIMENTS[0], args,
                                                tiny)[2])


@FULL
def test_gathered_scales_score_as_the_shipped_kernel():
  """A KV block's scales in one DMA a sequence from the gathered copy
  ("gathered_scales"): the shipped scores, bit for bit, over a batch of
  all four launches on one core (every DMA waited for:
  `test_every_ablation_waits_for_each_dma_it_starts_and_drops_its_piece`)."""
  scores = _mixed_scores(1)
  np.testing.assert_array_equal(
      scores(next(e for e in ablate.EXPERIMENTS
                  if e.name == "gathered_scales")),
      scores(ablate.EXPERIMENTS[0]))


@FULL
def test_block_dma_reads_what_the_page_dmas_read_from_a_contiguous_table():
  """`block_dma`'s one DMA a block equals the per-page DMAs where the
  block's pages are consecutive and inside the cache (4 sequences of one
  whole 32-page block: at `tiny`'s 16 pages a block runs past the cache)."""
  shape = S.with_(name="one_block", num_seqs=4, seq_len=16384)
  args = record.entry_args(shape, ablate.VARIANT, shape.fmt)
  exp = next(e for e in ablate.EXPERIMENTS if e.name == "block_dma")
  shipped = _dma_bytes(ablate.EXPERIMENTS[0], args, shape)[2]
  np.testing.assert_array_equal(_dma_bytes(exp, args, shape)[2], shipped)


def _row():
  """The baseline's row at 1.5 ms of scoring (4 profiled calls)."""
  exp = ablate.EXPERIMENTS[0]
  times = {"scoring_s": 1.5e-3, "ops": [
      {"name": "StreamIdxLeanTC-d", "stage": "scoring", "count": 4,
       "self_us": 5800.0},
      {"name": "sort.1", "stage": "selection", "count": 2, "self_us": 9.0}]}
  blocks = shapes.table_blocks(S, ablate.VARIANT, S.fmt, "v5e").kwargs()
  return ablate.row(exp, blocks, times, chip="v5e", device_kind="TPU v5 lite",
                    compile_s=4.0, iterations=4,
                    command="python -m streamidx.bench --ablate")


def test_a_measurement_row_follows_the_records_and_appends(chip_records):
  del chip_records  # records read and append a file of this test's own
  r = _row()
  assert records.chip_problems(r, records.EXPERIMENT_FIELDS) == []
  # The shipped call's plan at v5e's table row: the HBM bound of the
  # roofline's kernel stage, as the model quotes it for the records' call.
  sb = roofline.indexer_step(
      "v5e", shapes.DSV4, k=S.k, variant="lean", batch=S.num_seqs,
      context_tokens=S.seq_len)
  assert r["hbm_s"] == pytest.approx(sb.kernel_s)
  assert r["ratio"] == pytest.approx(1.5e-3 / sb.kernel_s)
  assert r["kv_step_s"] * r["kv_steps"] == pytest.approx(1.5e-3)
  assert r["ops"] == [["StreamIdxLeanTC-d", 1.0, pytest.approx(1.45e-3)]]
  with pytest.raises(ValueError, match=r"experiments\[0\]: .*device_s"):
    records.append_chip(experiments=[dict(r, device_s=None)])
  records.append_chip(experiments=[r])
  got = records.chip_rows("experiments", chip="v5e", experiment="baseline")
  assert got == [json.loads(json.dumps(r))]
  (got,) = record.experiment_table(records.chip_rows("experiments"))
  assert got["kv pages"] == r["blocks"]["num_kv_pages_per_block"][0]
  assert got["/ HBM"] == round(r["ratio"], 2)
  assert got["shape"] == r["shape"]
  other = dict(r, shape="dsv4-decode-64x1048576")
  rows = [r, other, dict(r, experiment="no_compute")]
  assert [(g["shape"], g["experiment"])
          for g in record.experiment_table(rows)] == [
      (r["shape"], "baseline"), (r["shape"], "no_compute"),
      ("dsv4-decode-64x1048576", "baseline")]


# The experiments that moved the issue early, and that kept two blocks in
# flight, before each shipped (`records.LATE_ISSUE_UNTIL`, `PREFETCH_2_UNTIL`).
_BEFORE_THE_EARLY_ISSUE = {"early_issue", "early_issue_no_score_write"}
_BEFORE_PREFETCH_2 = {"prefetch_2", "prefetch_2_reads_only"}


def test_recorded_experiments_follow_the_schema():
  """Each row the schema's, an experiment of its variant's table (lean's
  `--ablate`, blocktop's `--ablate-select`) and pieces it can remove."""
  # "inline_scales": the rows recorded before the inline FP8 cache shipped
  # named it removed (an input since: `ablate.Experiment.inline`).
  kinds = {ablate.VARIANT: (ablate.EXPERIMENTS,
                            {*lean.ABLATIONS, "inline_scales"}),
           ablate_select.VARIANT: (ablate_select.EXPERIMENTS,
                                   {"finish", *blocktop.ABLATIONS})}
  for r in records.chip_rows("experiments"):
    assert records.chip_problems(r, records.EXPERIMENT_FIELDS) == [], r
    experiments, pieces = kinds[r["variant"]]
    old = ((_BEFORE_THE_EARLY_ISSUE if r["date"] < records.LATE_ISSUE_UNTIL
            else set())
           | (_BEFORE_PREFETCH_2 if r["date"] < records.PREFETCH_2_UNTIL
              else set())) if r["variant"] == ablate.VARIANT else set()
    assert r["experiment"] in {e.name for e in experiments} | old, r
    assert records.removed_now(r["removed"], r["date"]) <= pieces, r


def test_an_experiment_from_before_the_deep_queue_reads_in_todays_terms():
  before, between, after = ("2026-12-05T10:00:00+00:00",
                            "2026-12-06T21:00:00+00:00",
                            "2026-12-07T10:00:00+00:00")
  assert (before < records.LATE_ISSUE_UNTIL < between
          < records.PREFETCH_2_UNTIL < after)
  late, one = {"early_issue", "prefetch_2"}, {"prefetch_2"}
  assert records.removed_now([], before) == late  # its baseline
  assert records.removed_now(["late_issue"], before) == one  # early then
  assert records.removed_now(["late_issue", "score_write"], before) == {
      "score_write", "prefetch_2"}
  assert records.removed_now(["compute"], before) == late | {"compute"}
  assert records.removed_now([], between) == one  # its baseline
  assert records.removed_now(["early_issue"], between) == late
  assert records.removed_now(["prefetch_2"], between) == set()  # today's
  assert records.removed_now(["prefetch_2", "compute"], between) == {
      "compute"}
  assert records.removed_now([], after) == set()
  assert records.removed_now(["prefetch_2"], after) == one


def test_ablate_refuses_to_run_off_a_tpu(capsys):
  assert ablate.main(["--only", "baseline"]) == 2
  assert "measures on a TPU" in capsys.readouterr().err


def test_recorded_experiments_are_skipped_per_shape(monkeypatch, capsys,
                                                   chip_records):
  """--dry-run lists what a run would measure: at a shape, the experiments
  not yet recorded on the chip at that shape; --again, all."""
  chip_records({"experiments": [
      dict(_row(), experiment=name) for name in ("baseline", "no_compute")]})
  monkeypatch.setattr(ablate.modes, "device_generation", lambda d: "v5e")
  names = [e.name for e in ablate.EXPERIMENTS]
  assert ablate.main(["--dry-run"]) == 0
  assert capsys.readouterr().out.split() == [
      n for n in names if n not in ("baseline", "no_compute")]
  assert ablate.main(["--dry-run", "--shape", "dsv4-decode-64x1048576"]) == 0
  assert capsys.readouterr().out.split() == names
  assert ablate.main(["--dry-run", "--again"]) == 0
  assert capsys.readouterr().out.split() == names
  # --seqs: the same tokens a sequence, another launch length.
  assert ablate.main(["--dry-run", "--seqs", str(S.num_seqs)]) == 0
  assert "baseline" not in capsys.readouterr().out.split()
  assert ablate.main(["--dry-run", "--seqs", "256"]) == 0
  assert capsys.readouterr().out.split() == names
  with pytest.raises(SystemExit):
    ablate.main(["--dry-run", "--seqs", "0"])
  assert "--seqs: must be >= 1 (got 0)" in capsys.readouterr().err


def test_lean_refuses_an_unknown_ablation():
  spec = driver.Launch("decode", 1, 1, 1, 1, 1, 16, 4, "model")
  with pytest.raises(ValueError, match="ablate: a subset of"):
    lean.launch(spec, None, None, (None, None), None, 0, 1, (None,),
                ablate={"everything"})


def test_lean_refuses_an_ablation_over_the_inline_cache():
  """The experiments take the shipped pair's call apart; over the inline
  cache (one array) none applies."""
  spec = driver.Launch("decode", 1, 1, 1, 1, 1, 16, 4, "model")
  with pytest.raises(ValueError, match="token mode and the dense pair only"):
    lean.launch(spec, None, None, (None,), None, 0, 1, (None,),
                ablate={"compute"})


def test_lean_refuses_two_blocks_ahead_without_kv_steps():
  """Two blocks ahead ("prefetch_2"), the program issues two blocks before
  the KV loop, which "kv_loop" leaves without a trip to wait for them."""
  spec = driver.Launch("decode", 1, 1, 1, 1, 1, 16, 4, "model")
  with pytest.raises(ValueError, match="kv_loop only with prefetch_2"):
    lean.launch(spec, None, None, (None, None), None, 0, 1, (None,),
                ablate={"kv_loop"})


def test_lean_blocks_on_a_measured_chip_are_its_fastest_experiment():
  """Where `--ablate` ran, lean's decode row is the blocks of the fastest
  experiment recorded at the experiments' shape that ran today's kernel as
  shipped (`records.as_shipped`: nothing removed, nothing beside its
  arguments); elsewhere the static schedule's."""
  full = [r for r in records.chip_rows("experiments", variant="lean",
                                       shape=blocks.EXPERIMENT_SHAPE)
          if records.as_shipped(r)]
  for chip in ("v5e", "v6e", "v7x"):
    row = si.block_sizes("lean", cache_format="dense_fp8", num_heads=64,
                         page_size=128, generation=chip)
    mine = [r for r in full if r["chip"] == chip]
    if not mine:
      assert row.source in blocks.STATIC_SCHEDULE_SOURCES
      continue
    best = min(mine, key=lambda r: r["device_s"])
    assert row.kwargs() == records.block_kwargs(best)
    assert row.source.startswith(f"measured on {chip}")
    assert repr(best["experiment"]) in row.source
    sizes = {tuple(records.block_kwargs(r).items()) for r in mine}
    assert f"the least of the {len(mine)} experiment" in row.source
    assert f", {len(sizes)} block size" in row.source


def test_lean_blocks_are_compared_at_one_shape(chip_records):
  """A faster experiment at another shape (fewer tokens, or blocks that
  won only there) does not choose the blocks."""
  r = _row()
  chip_records({"experiments": [
      dict(r, experiment="kv_pages_16", device_s=1.6e-3,
           blocks=dict(r["blocks"], num_kv_pages_per_block=[16, 2, 2])),
      dict(r, experiment="kv_pages_64_batch_4", device_s=0.2e-3,
           shape="dsv4-decode-64x65536",
           blocks=dict(r["blocks"], num_kv_pages_per_block=[64, 2, 2]))]})
  (row,) = blocks._measured()  # pylint: disable=protected-access
  assert row.num_kv_pages_per_block == (16, 2, 2)
  assert "'kv_pages_16'" in row.source
  assert "of the 1 experiment there, 1 block size" in row.source
