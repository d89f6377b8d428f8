"""The records: every data file in its one home (`streamidx.records`), the
chip measurements' schema, and the command that writes and prints them."""

import json
import pathlib
import re
import subprocess
import sys

import pytest

from streamidx import records
from streamidx.lab import shapes
from streamidx.lab.bench import record

import quote_records  # tools/ (conftest.py)

ROOT = pathlib.Path(__file__).resolve().parents[1]


def test_every_data_file_is_named_once_and_loads():
  on_disk = sorted(p.name for p in (ROOT / "data").glob("*.json"))
  assert sorted(records.FILES.values()) == on_disk
  for name in records.FILES:
    assert isinstance(records.load(name), dict), name


def test_no_module_but_records_names_a_data_file():
  """One home: no other module of the package spells a data file's name or
  opens `streamidx.data` itself."""
  names = "|".join(re.escape(f) for f in records.FILES.values())
  offenders = []
  for py in sorted((ROOT / "streamidx").rglob("*.py")):
    if py.name == "records.py":
      continue
    text = py.read_text(encoding="utf-8")
    code = "\n".join(line.split("#")[0] for line in text.splitlines())
    if re.search(r"streamidx\.data\b|files\(", code) or re.search(
        rf"[\"']({names})[\"']", code):
      offenders.append(str(py.relative_to(ROOT)))
  assert not offenders, offenders


def test_recorded_chip_rows_follow_the_schema_and_their_parts_sum():
  rows = records.chip_rows()
  for r in rows:
    assert records.chip_problems(r) == [], r
  for run in {r["run"] for r in rows}:
    mine = {r["stage"]: r["device_s"] for r in rows if r["run"] == run}
    assert set(mine) == set(records.STAGES), run
    assert sum(mine[p] for p in records.PARTS) == pytest.approx(mine["call"])
  for r in records.test_runs():
    assert records.chip_problems(r, records.TEST_RUN_FIELDS) == [], r


def test_the_last_recorded_tpu_test_run_passed():
  runs = records.test_runs()
  if not runs:
    pytest.skip("no `make test-tpu` run recorded yet")
  last = runs[-1]
  assert last["failed"] == 0, last
  newest = {}  # and no tier test's newest result on the chip is a failure
  for r in runs:
    newest.update(r["outcomes"] or {})
  assert [t for t, o in newest.items() if o == "failed"] == []


def _rows(device_s=1e-3):
  s = shapes.Shape("tiny", "decode", 2, 1, 512, 8, num_heads=4, page_size=16)
  parts = dict.fromkeys(records.PARTS, device_s / len(records.PARTS))
  times = {"total_s": device_s, **{f"{p}_s": v for p, v in parts.items()}}
  return record.call_rows(
      record.Point(s, "vendored", "fp8", "sort"), times,
      wall={"median": 2e-3}, compile_s=3.0, floor=5e-4, repeats=4,
      iterations=2, check={"ok": True}, run="r1", date="2026-12-05T00:00:00",
      command="python -m streamidx.bench --record", chip="v5e",
      device_kind="TPU v5 lite",
      versions={"jax": "0.10.2", "libtpu": "x", "commit": "abc"})


def test_call_rows_are_a_call_and_its_parts(chip_records):
  del chip_records  # records read and append a file of this test's own
  rows = _rows()
  assert [r["stage"] for r in rows] == list(records.STAGES)
  assert all(records.chip_problems(r) == [] for r in rows)
  records.append_chip(rows)
  assert len(records.chip_rows(run="r1", stage=("call", "idle"))) == 2
  (call,) = record.calls(chip="v5e", variant="vendored")
  assert call["stage"] == "call" and call["device_s"] == 1e-3
  assert sum(call["parts"].values()) == pytest.approx(1e-3)
  assert record.calls(chip="v6e") == []


def test_append_refuses_a_bad_row_and_parts_that_miss_the_whole(chip_records):
  del chip_records  # records read and append a file of this test's own
  rows = _rows()
  with pytest.raises(ValueError, match=r"rows\[0\]: .*wall_s"):
    records.append_chip([dict(rows[0], wall_s=None)] + rows[1:])
  with pytest.raises(ValueError, match="parts of run 'r1' sum to"):
    records.append_chip([dict(rows[0], device_s=2e-3)] + rows[1:])
  with pytest.raises(ValueError, match="stage: must be one of"):
    records.append_chip([dict(rows[1], stage="kernel")])
  assert records.chip_rows() == []  # nothing written


def test_points_cover_the_chip_issue_list_and_patterns_select_them():
  names = [p.name for p in record.POINTS]
  assert len(names) == len(set(names))
  for shape in ("dsv4-decode-64x65536", "dsv4-decode-64x262144",
                "dsv4-decode-64x1048576", "dsv4-prefill-2048x1048576"):
    for v in ("vendored:fp8", "dense:dense_fp8", "lean:dense_fp8",
              "fp4:mxfp4"):
      for m in ("sort", "blocktop"):
        assert f"{shape}/{v}/{m}/k512" in names
  for rows, entries in ((64, 16384), (64, 65536), (64, 262144),
                        (2048, 262144)):
    for k in (512, 2048):
      assert f"select-{rows}x{entries}/select/blocktop/k{k}" in names
  assert any(n.startswith("glm-page-") for n in names)
  got = record.points(["select-64x262144/*/k512"])
  # every method that reads the score buffer alone ("fused_blockmax" alone
  # is "blockmax"), "approx" with its recall
  assert {p.method for p in got} == (set(record.topk.TOPK_METHODS)
                                     - {"fused_blockmax"})
  with pytest.raises(ValueError, match="matches no point"):
    record.points(["nothing*"])


def test_measure_off_a_tpu_runs_the_point_but_has_no_device_time():
  """The whole path (inputs, compile, check, timing, profile, rows) on a
  tiny interpreted point; its device times are None, which the records
  refuse."""
  s = shapes.Shape("tiny", "decode", 2, 1, 512, 8, num_heads=4, page_size=16)
  rows, ops = record.measure(record.Point(s, "vendored", "fp8", "sort"),
                             repeats=1, iterations=1)
  call = rows[0]
  assert call["check"]["ok"] is True and call["compile_s"] > 0
  assert call["wall_s"] > 0 and call["device_s"] is None
  assert "not a TPU run" in ops["source"]
  assert records.chip_problems(call)  # device_s None: not a measurement


def test_records_command_prints_every_row_as_json():
  out = subprocess.run(
      [sys.executable, "-m", "streamidx.bench", "--records", "--json"],
      capture_output=True, text=True, check=True, cwd=ROOT).stdout
  lines = [json.loads(x) for x in out.splitlines() if x.strip()]
  assert len(lines) == len(records.chip_rows())
  for line in lines:
    for key in ("chip", "stage", "variant", "cache_format", "method", "rows",
                "tokens", "entries", "k", "device_s", "wall_s", "compile_s",
                "date", "command", "jax", "libtpu"):
      assert key in line


def test_record_refuses_to_run_off_a_tpu():
  proc = subprocess.run(
      [sys.executable, "-m", "streamidx.bench", "--record", "--points",
       "select-64x16384/select/sort/k512"],
      capture_output=True, text=True, cwd=ROOT, check=False)
  assert proc.returncode == 2 and "measures on a TPU" in proc.stderr


def test_docs_quote_the_chip_records_as_the_command_prints_them():
  """Every chip figure in README.md and docs/ is a quote of the records
  (`tools/quote_records.py` writes them): none is stale, and the README and
  docs/limitations.md say what ran on which chip."""
  tool = quote_records
  stale = [str(p.relative_to(ROOT)) for p in tool.pages()
           if tool.quoted(p.read_text(encoding="utf-8"))
           != p.read_text(encoding="utf-8")]
  assert not stale, f"run `python tools/quote_records.py`: {stale}"
  for page in ("README.md", "docs/limitations.md"):
    assert "<!-- records: --summary -->" in (ROOT / page).read_text(
        encoding="utf-8"), page


def test_missing_points_are_the_ones_without_a_recorded_call_on_the_chip():
  rows = records.chip_rows(stage="call", chip="v5e")
  todo = record.points(None)
  left = record.missing(todo, "v5e")
  names = {p.name for p in todo} - {p.name for p in left}
  assert len(names) == len({(r["shape"], r["variant"], r["cache_format"],
                             r["method"], r["k"]) for r in rows
                            if any(r["shape"] == p.shape.name for p in todo)})
  assert record.missing(todo, "no-such-chip") == todo


def test_summary_gives_the_newest_run_of_each_part_of_the_tier(chip_records):
  """The tier runs in parts (`-k`) where a session cannot compile it all:
  each part's newest run is quoted, the whole tier's as the whole."""
  def run(sub, passed, date):
    cmd = "pytest -q tests/test_chip.py" + (f" -k {sub} -p no:randomly"
                                            if sub else "")
    return dict(chip="v5e", device_kind="TPU v5 lite", passed=passed,
                failed=0, skipped=0, wall_s=60.0, date=date, command=cmd,
                commit="abc", jax="0.10.2", libtpu="x")
  chip_records({"rows": [], "test_runs": [
      run("readme", 30, "2026-12-06"), run("dsv4_decode", 35, "2026-12-06"),
      run("readme", 33, "2026-12-07")]})
  text = record.summary()
  assert "`-k readme`) had 33 passed" in text
  assert "`-k dsv4_decode`) had 35 passed" in text
  assert "30 passed" not in text


def test_summary_counts_each_tier_test_by_its_newest_result(chip_records):
  """A run cut short still counts the tests it finished; a test's newest
  outcome wins; a run without outcomes (recorded before they were) is in
  no count; an interrupted run is no part's "last run"."""
  def run(outcomes, date, interrupted=False, sub="readme"):
    return dict(chip="v5e", device_kind="TPU v5 lite",
                **records.outcome_counts(outcomes or {}), wall_s=60.0,
                date=date, command=f"pytest -q tests/test_chip.py -k {sub}",
                commit="abc", jax="0.10.2", libtpu="x",
                interrupted=interrupted, tier_tests=None if outcomes is None
                else 10, outcomes=outcomes)
  runs = [run(None, "2026-12-05", sub="old"),
          run({"a": "failed", "b": "passed"}, "2026-12-06"),
          run({"a": "passed", "c": "skipped"}, "2026-12-07", True, "dsv4")]
  assert records.tier_outcomes(runs) == {"a": "passed", "b": "passed",
                                         "c": "skipped"}
  for r in runs:
    assert records.chip_problems(r, records.TEST_RUN_FIELDS) == [], r
  bad = dict(runs[1], passed=2)
  assert records.chip_problems(bad, records.TEST_RUN_FIELDS) == [
      "outcomes: its counts differ from passed, failed and skipped"]
  assert record.tier_coverage(runs) == [
      "the TPU tier's 10 tests, each one's newest result on the chip: "
      "2 passed, 0 failed, 1 skipped, 7 not yet run (2 runs, 1 cut short, "
      "120 s in all; "
      "2026-12-06, 2026-12-07; commit abc)"]
  chip_records({"rows": [], "test_runs": runs})
  text = record.summary()
  assert "`-k dsv4`" not in text and "`-k readme`) had 1 passed" in text
  # a resumed run (`make test-tpu RESUME=1`) ran what was left: no part's
  # last run either
  resumed = dict(runs[1], command="STREAMIDX_TIER_RESUME=1 " + runs[1][
      "command"], outcomes={"d": "passed"}, passed=1, failed=0)
  chip_records({"rows": [], "test_runs": runs + [resumed]})
  text = record.summary()
  assert "`-k readme`) had 1 passed, 1 failed" in text
  assert "3 passed, 0 failed, 1 skipped, 6 not yet run (3 runs" in text


def test_a_measurement_names_its_commit(monkeypatch):
  """`STREAMIDX_COMMIT` first (a TPU host's copy has no .git), else the
  checkout's HEAD; every chip row, experiment and test run has the key."""
  monkeypatch.setenv("STREAMIDX_COMMIT", "abc1234")
  assert record.versions()["commit"] == "abc1234"
  monkeypatch.delenv("STREAMIDX_COMMIT")
  got = records.checkout_commit()
  assert got is None or len(got) >= 7
  for of, fields in (("rows", records.CHIP_FIELDS),
                     ("experiments", records.EXPERIMENT_FIELDS),
                     ("test_runs", records.TEST_RUN_FIELDS)):
    assert "commit" in fields
    assert all("commit" in r for r in records.load("chip")[of]), of
