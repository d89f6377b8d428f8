"""The calibration table (streamidx.lab.calibration) from the records."""

import json
import re

import pytest

from streamidx import blocks, records
from streamidx.lab import calibration
from streamidx.lab.model import roofline

import test_dump  # its synthetic dump text
from tiers import needs_libtpu


def test_calibration_prints_every_measurement_and_the_one_clock_line(capsys):
  calibration.main([])
  public, chip = capsys.readouterr().out.strip().split("\n\n")
  lines = public.splitlines()
  n = len(_public())
  assert len(lines) == n + 2  # header, one row each, the last line
  # then this project's measured token calls, each beside the model
  mine = chip.splitlines()
  every = {(r["chip"], r["shape"], r["variant"], r["method"], r["k"]): r
           for r in records.chip_rows(stage="call", mode=("decode", "prefill"))}
  calls = [r for r in every.values() if not calibration.superseded(r)]
  old = len(every) - len(calls)  # lean calls from before today's kernel
  assert len(mine) == len(calls) + 2
  m = re.search(r"(\d+) of (\d+) calls within 1\.2x of the model \((\d+) "
                r"with the selection's own time measured alone in it\); the "
                r"scoring alone (\d+) of (\d+)(; (\d+) lean calls? recorded "
                r"before today's lean kernel shipped left out)?$", mine[-1])
  assert m and int(m.group(2)) == int(m.group(5)) == len(calls)
  assert int(m.group(7) or 0) == old
  assert int(m.group(3)) <= len(calls)
  m = re.fullmatch(r"(\d+) of (\d+) public measurements within 1\.5x at one "
                   r"clock per chip \((.*)\)", lines[-1])
  assert m and int(m.group(2)) == n and int(m.group(1)) <= n
  assert "v7x 2.075 GHz from " + roofline.INFER_FROM["v7x"] in m.group(3)
  # every chip the table predicts has its clock: none is left without one
  assert "v6e 1.165 GHz from " + roofline.INFER_FROM["v6e"] in m.group(3)
  assert "no clock" not in m.group(3)


def test_calibration_json_rows_and_the_clock_source_predicts_itself(capsys):
  calibration.main(["--json"])
  rows = json.loads(capsys.readouterr().out)
  assert all(set(r) == {"source", "chip", "stage", "shape", "measured_s",
                        "predicted_s"} for r in rows)
  full = {r["id"]: r for r in calibration.rows()}
  src = full[roofline.INFER_FROM["v7x"]]
  assert abs(src["predicted_s"] / src["measured_s"] - 1) < 1e-9
  # every prediction more than 1.5x off says why (or "unexplained")
  for r in full.values():
    if r["predicted_s"] is not None and not 1 / 1.5 <= r["predicted_s"] / r["measured_s"] <= 1.5:
      assert r["why"], r["id"]


def _public() -> list[dict]:
  return records.load("public_measurements")["measurements"]


def _measurement(mid):
  return next(m for m in _public() if m["id"] == mid)


def test_v6e_clock_is_its_named_whole_call_bundles_over_its_measured_time():
  name = roofline.INFER_FROM["v6e"]
  m = _measurement(name)
  assert (m["chip"], m["model"], m["rows"], m["stage"]) == ("v6e", "GLM-5.2", 64, "step")
  # the largest v6e call: the least fixed overhead of the three
  assert m["measured_s"] == max(x["measured_s"] for x in _public()
                                if x["chip"] == "v6e" and x["selection_method"] == "sort")
  # the whole call's stages (fill, scoring, relayout, sort, copies) counted at GLM-5.2's geometry
  st = roofline.indexer_step("v6e", roofline.GEOMETRY["GLM-5.2"], k=m["k"], batch=m["rows"],
                             context_tokens=m["context_tokens"], clock_hz=0)
  bundles = sum(s.bundles or 0 for s in st.stages)
  assert all(s.bundles is not None and not s.floor for s in st.stages if not s.hbm_only)
  hz, src = roofline.clock("v6e")
  hbm = sum(s.t_hbm for s in st.stages if s.hbm_only)  # the fill, the relayout
  assert hz == pytest.approx(bundles / (m["measured_s"] - hbm)) and src == f"inferred from {name}"
  assert 1.15e9 < hz < 1.17e9
  # every v6e prediction is at it: the step's stages and its clock
  step = roofline.dsv4_step("v6e", context_tokens=2**20)
  assert not step.at_least and all(s.clock_hz == hz for s in step.stages)
  assert name in step.clock_source and "1.165 GHz" in step.clock_source


def test_each_inferred_clock_source_predicts_itself_and_the_other_v6e_calls_are_predicted():
  full = {r["id"]: r for r in calibration.rows()}
  for chip, name in roofline.INFER_FROM.items():
    r = full[name]
    assert r["chip"] == chip and f"{r['predicted_s'] / r['measured_s']:.2f}" == "1.00"
    assert r["implied_hz"] == roofline.clock(chip)[0]  # its bundles / its time
    assert r["why"].startswith("the clock's source (1.00 by construction)")
  # Each source predicts itself exactly: v7x's, the scoring alone, by its bundles;
  # v6e's, a whole call, by its bundles and its HBM-only stages (the XLA fill and
  # the score buffer's relayout), which the clock leaves out of the time.
  for name in roofline.INFER_FROM.values():
    assert full[name]["predicted_s"] == pytest.approx(full[name]["measured_s"], rel=1e-12)
  m = _measurement(roofline.INFER_FROM["v6e"])
  st = roofline.indexer_step("v6e", roofline.GEOMETRY["GLM-5.2"], k=m["k"], batch=m["rows"],
                             context_tokens=m["context_tokens"]).stages
  assert [s.name for s in st if s.hbm_only] == ["fill", "relayout"]
  assert all(s.bundles is None for s in st if s.hbm_only)
  v6e_sort = [r for r in full.values() if r["chip"] == "v6e" and r["method"] == "sort"]
  assert len(v6e_sort) == 3 and all(r["predicted_s"] for r in v6e_sort)


def test_docs_quote_the_evidence_on_the_v6e_clock_as_the_table_computes_it():
  """docs/tpu.md says what v6e's whole-call clock is worth from v7x, where the
  same whole call sits beside the scoring alone; its numbers are these."""
  import pathlib
  doc = " ".join((pathlib.Path(__file__).resolve().parents[1] / "docs" / "tpu.md")
                 .read_text(encoding="utf-8").split())
  full = {r["id"]: r for r in calibration.rows()}
  whole = full["sglang-jax-1642-glm52-decode-b64-v7x-sort"]["implied_hz"]
  v7x, _ = roofline.clock("v7x")
  v6e, _ = roofline.clock("v6e")
  ratio = whole / v7x
  assert 0.4 < ratio < 0.8  # a sort-bound call implies well under the scoring's clock
  for quoted in (f"implied clock of {whole / 1e9:.2f} GHz against the {v7x / 1e9:.3f} GHz",
                 f"{ratio:.2f} of it", f"nearer {v6e / ratio / 1e9:.1f} GHz than {v6e / 1e9:.3f} GHz",
                 f"{_measurement(roofline.INFER_FROM['v6e'])['measured_s'] * 1e3:.1f} ms, the largest"):
    assert quoted in doc, quoted


# A selection program whose top-level loop has a register bound (a dynamic
# trip count, as XLA's scatter loop): test_dump's loop of 8 bundles an
# iteration, then 2 bundles after it.
_DYNAMIC_TLP = test_dump._DYNAMIC + "   0x8   :  {}\n   0x9   :  {}\n"


def test_selection_row_with_a_dynamic_loop_has_no_count_unless_trips_given(tmp_path):
  (tmp_path / "1-TLP-1-final_bundles.txt").write_text(_DYNAMIC_TLP)
  (tmp_path / "1-TLP-hlo.txt").write_text("ENTRY %main (x: f32[4]) -> f32[4] {\n}\n")
  kw = dict(chip="v7x", method="radix", rows=1, entries=4, k=1, command="c",
            date="d")
  row = calibration.selection_row(str(tmp_path), **kw)
  assert row["bundles"] is None and row["bundles_every_branch"] is None
  assert row["dynamic_loops"] == [["TLP", 0, 8]]
  assert row["bundles_without_dynamic"] == 2
  given = calibration.selection_row(str(tmp_path), trips={("TLP", 0): 5}, **kw)
  assert given["bundles"] == 8 * 5 + 2 and "dynamic_loops" not in given
  assert given["dynamic_trips"] == [["TLP", 0, 5]]


def test_blocktop_counts_its_outer_conditional_without_the_fallback_sort():
  from streamidx.lab import dump
  outer = dump.Conditional("conditional.1", (frozenset({"res"}), frozenset(
      {"sort.1", "conditional.2"})))
  inner = dump.Conditional("conditional.2", (frozenset({"a"}), frozenset({"b"})))
  assert calibration.taken_branches("blocktop", [inner, outer]) == {
      "conditional.1": 0}
  assert calibration.taken_branches("sort", [inner]) == {"conditional.2": 0}
  assert calibration.taken_branches("radix", [inner]) == {}


def test_selection_table_reads_the_recorded_counts(capsys, monkeypatch):
  """`--selection`: the recorded selection programs (data/step_schedule.json),
  compiling nothing, each exact method beside the sort's count."""
  from streamidx import topk

  def no_compile(*a, **kw):
    raise AssertionError(f"compiled {a} without --record-selection")

  monkeypatch.setattr(calibration, "record_selection", no_compile)
  assert calibration.main(["--selection"]) == 0
  out = capsys.readouterr().out.splitlines()
  recorded = [(kind, chip, m, r, e, k) for kind, r, e, k in calibration.SELECTION_SHAPES
              for chip in calibration.SELECTION_CHIPS for m in topk.TOPK_METHODS
              if roofline.selection_record(chip, m, r, e, k)]
  every = (len(calibration.SELECTION_SHAPES) * len(calibration.SELECTION_CHIPS)
           * len(topk.TOPK_METHODS))
  assert len(out) == len(recorded) + 3  # title, header, one row each, the count
  assert out[-1].startswith(f"{every - len(recorded)} of {every} not recorded")
  row = next(l.split() for l in out if l.split()[:6] == [
      "decode", "64x262144", "512", "v7x", "sort", "3,840,549"])
  assert row[6:8] == ["1.000", "-"]  # SparseCore calls: no bundles in the dump
  blocktop = next(l.split() for l in out if l.split()[:5] == [
      "decode", "64x262144", "512", "v7x", "blocktop"])
  assert float(blocktop[6]) == pytest.approx(
      int(blocktop[5].replace(",", "")) / 3840549, abs=1e-3)


def test_record_selection_appends_the_compiled_row_to_the_records(capsys, monkeypatch):
  row = dict(chip="v5e", method="sort", rows=8, entries=128, k=4, bundles=1)
  monkeypatch.setattr(calibration, "record_selection", lambda *a: dict(row))
  appended = []
  monkeypatch.setattr(calibration, "append_selection", appended.extend)
  assert calibration.main(["--record-selection", "v5e", "sort", "8", "128", "4"]) == 0
  assert appended == [row] and json.loads(capsys.readouterr().out) == row


def test_record_launches_appends_each_row_once(tmp_path, monkeypatch, capsys):
  """--record-launches appends the compiled rows to data/step_schedule.json
  (here a copy of it) and refuses a row already recorded."""
  data_file = records.path
  path = tmp_path / "step_schedule.json"
  path.write_text(data_file("step_schedule").read_text(encoding="utf-8"), encoding="utf-8")
  monkeypatch.setattr(records, "path", lambda name: path if name == "step_schedule"
                      else data_file(name))
  records.load.cache_clear()
  row = dict(records.load("step_schedule")["launches"][0], compiled_shape="glm-decode-4k")
  asked = []

  def compiled(chips, *, variant, shape):
    asked.append((tuple(chips), variant, shape))
    return [dict(row, chip=chips[0], variant=variant)]

  monkeypatch.setattr(calibration, "record_launches", compiled)
  argv = ["--record-launches", "v5e", "--variant", "fp4"]
  try:
    assert calibration.main(argv) == 0
    assert asked == [(("v5e",), "fp4", "dsv4-decode-4k")]
    assert records.load("step_schedule")["launches"][-1] == dict(row, chip="v5e", variant="fp4")
    assert json.loads(capsys.readouterr().out)[0]["variant"] == "fp4"
    with pytest.raises(ValueError, match="recorded already"):
      calibration.main(argv)
  finally:
    records.load.cache_clear()


def _glm(rows, method):
  return [r for r in rows if r["id"].startswith("sglang-jax-1642-glm52-")
          and r["method"] == method]


def test_glm_sort_rows_are_predicted_at_glm_geometry_with_the_page_size_assumed():
  rs = calibration.rows()
  sort = _glm(rs, "sort")
  assert len(sort) == 6
  counted = 0
  for r in sort:
    rows = int(r["shape"].split(" x ")[0])
    if roofline.selection_record(r["chip"], "sort", rows, 131072, 2048) is None:
      assert r["why"] == "no recorded compile of the selection at this shape"
      continue
    counted += 1
    assert "page size not stated" in r["why"], r["id"]
    assert r["implied_hz"] > 0, r["id"]  # the recorded compiles, read
    hz, _ = roofline.clock(r["chip"])
    assert (r["predicted_s"] is not None) == bool(hz), r["id"]
  assert counted >= 1
  # the SparseCore rows keep their reason: the dump has no SparseCore bundles
  for r in _glm(rs, "sparsecore_radix"):
    assert r["predicted_s"] is None
    assert r["why"] == "a SparseCore program: no bundles in the dump"


def test_launch_records_are_keyed_by_their_compiled_geometry():
  from streamidx.lab import shapes
  dsv4 = roofline.launch_record("v7x", "vendored", "fp8", "decode", 4, 3, 1)
  assert dsv4 and dsv4["compiled_shape"] == "dsv4-decode-4k"
  assert roofline.launch_record("v7x", "vendored", "fp8", "decode", 4, 3, 1,
                                   geometry=shapes.GLM_TOKEN) is None
  glm = roofline.launch_record("v7x", "vendored", "fp8", "decode", 4, 6, 1,
                                  geometry=shapes.GLM_TOKEN)
  assert glm and glm["compiled_shape"] == "glm-decode-4k"


def test_indexer_step_at_deepseek_v4_geometry_is_dsv4_step():
  from streamidx.lab import shapes
  a = roofline.dsv4_step("v7x", batch=64, context_tokens=2**20)
  b = roofline.indexer_step("v7x", shapes.DSV4, k=512, batch=64,
                            context_tokens=2**20)
  assert a.sum_text == b.sum_text and a.stages == b.stages


def test_the_chips_kv_step_costs_reproduce_its_experiments():
  """v5e's grid-step cost and DMA rate: fitted to its block-size
  experiments (nothing removed), each reproduced within `worst`, the
  shipped blocks' (`baseline`) within 10%; the cost a step never negative
  (0 where the fit would make it so: the steps hide behind the reads);
  a chip with no experiments has none."""
  c = roofline.kv_step_costs("v5e")
  ex = [e for e in records.load("chip")["experiments"]
        if e["chip"] == "v5e" and records.as_shipped(e)
        and e["shape"] == blocks.EXPERIMENT_SHAPE]
  assert c and set(c.experiments) == {e["experiment"] for e in ex}
  err = {e["experiment"]: abs((e["kv_steps"] * c.step_s + e["hbm_bytes"]
                               / c.dma_bandwidth) / e["device_s"] - 1)
         for e in ex}
  assert max(err.values()) == pytest.approx(c.worst)
  assert err["baseline"] < 0.1 and 0 <= c.step_s < 2e-6
  # slower than the HBM peak, as measured, not faster
  assert c.dma_bandwidth < roofline.hardware.spec("v5e").device_bandwidth
  assert roofline.kv_step_costs("v6e") is None


def test_a_large_cache_pays_each_dma_at_least_what_wide_pool_measured():
  """v5e: in a cache of at least the smallest one measured at `wide_pool`'s
  step (and more than the largest at the shipped call's) a KV DMA takes at
  least `wide_pool`'s time less its steps' cost over its DMAs (two a page:
  the dense pair); a call's KV DMAs cost the larger of their bytes at the
  fit's rate and their count at that. The model's lean call at 64 x 1M
  (2.2 GB) is bound by its count, the inline call (one DMA a page) by its
  bytes, and neither at 64 x 262,144 (0.55 GB)."""
  c = roofline.kv_step_costs("v5e")
  big = roofline.large_cache("v5e", c)
  wide = records.chip_rows("experiments", chip="v5e", experiment="wide_pool",
                           shape=blocks.EXPERIMENT_SHAPE)[-1]
  assert big.max_fast_bytes < big.min_bytes <= wide["cache_bytes"]
  b = wide["blocks"]
  dmas = (wide["kv_steps"] * b["num_kv_pages_per_block"][0]
          * b["decode_req_batch_size"] * 2)
  assert big.dma_s == pytest.approx(
      (wide["device_s"] - wide["kv_steps"] * c.step_s) / dmas)
  bw = roofline.hardware.spec("v5e").device_bandwidth
  for variant, tokens, by_count in (("lean", 2**20, True),
                                    ("inline", 2**20, False),
                                    ("lean", 262144, False)):
    sb = roofline.dsv4_step("v5e", variant, context_tokens=tokens,
                            method="blocktop")
    sc = {s.name: s for s in sb.stages}["scoring"]
    by_bytes = sc.t_hbm * bw / c.dma_bandwidth
    assert ("large cache's step" in sc.detail) == (tokens == 2**20)
    if by_count:
      assert sc.t_dma > by_bytes * 1.1, (variant, tokens)
    else:
      assert sc.t_dma == pytest.approx(by_bytes), (variant, tokens)
  assert roofline.large_cache("v5e", None) is None


def test_no_large_cache_where_the_slow_and_fast_caches_overlap(chip_records):
  """A shipped-kernel experiment stepping nearer `wide_pool` with a smaller
  cache than one stepping nearer the shipped call: no size says which."""
  def row(name, shape, step, cache):
    return dict(experiment=name, removed=[], inputs=None, chip="v5e",
                shape=shape, variant="lean", cache_format="dense_fp8",
                blocks={"num_kv_pages_per_block": [32, 2, 2],
                        "decode_req_batch_size": 4},
                date="2026-12-07T00:00:00+00:00", kv_step_s=step,
                kv_steps=256, cache_bytes=cache, hbm_bytes=5e8,
                device_s=256 * step)
  ex = [row("baseline", blocks.EXPERIMENT_SHAPE, 3.0e-6, 5.5e8),
        row("wide_pool", blocks.EXPERIMENT_SHAPE, 3.9e-6, 2.2e9),
        row("baseline", "dsv4-decode-128x262144", 3.0e-6, 1.1e9)]
  costs = roofline.KvStepCosts("v5e", 0.0, 7e11, (), 0.0, "")
  chip_records({"rows": [], "test_runs": [], "experiments": ex})
  assert roofline.large_cache("v5e", costs).min_bytes == 2.2e9
  ex.append(row("baseline", "dsv4-decode-20x1048576", 3.8e-6, 7e8))
  chip_records({"rows": [], "test_runs": [], "experiments": ex})
  assert roofline.large_cache("v5e", costs) is None


def _stall_row():
  """The newest compute_only experiment at the experiments' shape on v5e,
  and data/decode_schedule.json's count of its program."""
  e = records.chip_rows("experiments", chip="v5e", experiment="compute_only",
                        shape=blocks.EXPERIMENT_SHAPE)[-1]
  (row,) = [r for r in records.load("decode_schedule")["ablated"]["rows"]
            if r["ablate"] == sorted(records.removed_now(e["removed"],
                                                         e["date"]))]
  return e, row


def test_the_decode_stall_is_lean_computing_alone_over_its_bundles():
  """v5e's cycles a bundle in a decode KV loop: lean's compute_only time a
  KV step over its program's counted KV-loop bundles at the clock; the
  model's decode scoring runs its bundles at that rate, a prefill launch
  and a chip with no such experiment at one a cycle."""
  e, row = _stall_row()
  s = roofline.decode_stall("v5e")
  clock = roofline.hardware.spec("v5e").clock_hz
  assert s.factor == pytest.approx(e["kv_step_s"] * clock / row["kv_bundles"])
  assert 1 < s.factor < 1.5 and s.kv_bundles == row["kv_bundles"]
  assert roofline.decode_stall("v6e") is None
  decode = roofline.dsv4_step("v5e", "vendored", context_tokens=262144)
  sc = {st.name: st for st in decode.stages}["scoring"]
  assert sc.stall == pytest.approx(s.factor)
  assert sc.t_bundles == pytest.approx(sc.bundles * s.factor / clock)
  prefill = roofline.indexer_step("v5e", roofline.shapes_lib.DSV4, k=512,
                                  batch=1, context_tokens=65536, q_len=256)
  assert {st.name: st for st in prefill.stages}["scoring"].stall == 1.0
  v6e = roofline.dsv4_step("v6e", "vendored", context_tokens=262144)
  assert all(st.stall == 1.0 for st in v6e.stages)


@needs_libtpu
def test_the_decode_stall_s_bundles_are_its_programs():
  """The recorded count is the compiled KV loop of the program the
  experiment timed (`lab.schedule --ablate`): a kernel or libtpu change
  that moves it fails here."""
  from streamidx.lab import aot, schedule  # pylint: disable=g-import-not-at-top
  _, row = _stall_row()
  base = roofline.shapes_lib.table_blocks(
      aot.SHAPES_BY_NAME["dsv4-decode-4k"], "lean", "dense_fp8",
      "v5e").kwargs()
  (s,) = schedule.launch_schedules(
      "lean", "v5e", "dense_fp8", "dsv4-decode-4k",
      dict(base, num_kv_pages_per_block=(row["bkv_p"], 2, 2)),
      launches=("decode",), ablate=row["ablate"])
  assert (s.seq_batch_size, s.kv.bundles) == (row["seq_batch_size"],
                                              row["kv_bundles"])


def test_v5e_step_adds_measured_step_costs_and_reads_measured_selections():
  """On v5e the scoring stage is its grid steps at the measured cost plus
  the larger of its bytes at the measured DMA rate and its bundles; the
  selection, where the records measured it alone at that shape, is that
  time; v6e (no experiments, no records) keeps the bounds alone."""
  c = roofline.kv_step_costs("v5e")
  sb = roofline.dsv4_step("v5e", "lean", context_tokens=262144,
                          method="blocktop")
  st = {s.name: s for s in sb.stages}
  sc = st["scoring"]
  assert sc.t_dma > sc.t_hbm and sc.limiter == "DMA"
  assert sc.bound == pytest.approx(sc.t_steps + max(sc.t_dma, sc.t_mxu,
                                                    sc.t_bundles or 0))
  assert sc.t_steps == pytest.approx(256 * c.step_s)  # 64 x 512 pages / 128
  alone = records.calls(chip="v5e", mode="selection", method="blocktop",
                        rows=64, entries=65536, k=512)[-1]
  assert st["selection"].t_chip == alone["device_s"] == st["selection"].bound
  assert "copies" not in st
  assert "measured alone on v5e" in st["selection"].describe()
  v6e = roofline.dsv4_step("v6e", "lean", context_tokens=262144,
                           method="blocktop")
  assert all(s.t_steps == 0 and s.t_dma is None and s.t_chip is None
             for s in v6e.stages)
