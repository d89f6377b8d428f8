"""streamidx.lab.plots: the figures draw what the arrays say (Agg backend)."""

from __future__ import annotations

import json

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
import pytest  # pylint: disable=g-import-not-at-top

from streamidx.lab import plots  # pylint: disable=g-import-not-at-top


def test_save_writes_a_png_and_names_the_headline(tmp_path):
  fig, ax = plt.subplots()
  ax.plot([0, 1])
  path = plots.save(fig, tmp_path / "out", "fig")
  assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
  assert not (tmp_path / "out" / plots.HEADLINE_FILE).exists()
  plots.save(fig, tmp_path / "out", "head", headline=True)
  assert json.loads((tmp_path / "out" / plots.HEADLINE_FILE).read_text()) == {"figure": "head.png"}
  plt.close(fig)


# --------------------------------------------------------------------------
# Notebook figures: each draws the numbers it is given.


def _bar_heights(ax):
  return [p.get_height() for p in ax.patches]


def test_tables_markdown_escapes_pipes_and_marks_missing_cells():
  from streamidx.lab import tables
  text = tables.markdown([dict(a=1, b=0.123456), dict(a="x|y"), dict(a=None, b=12.345678)])
  assert text.splitlines() == ["| a | b |", "|---|---|", "| 1 | 0.1235 |",
                               "| x\\|y | - |", "| - | 12.35 |"]
  with pytest.raises(ValueError, match="rows"):
    tables.markdown([])


def test_tables_format_rows_aligns_columns_and_marks_missing_cells():
  from streamidx.lab import tables
  text = tables.format_rows([dict(a=1, b=0.123456), dict(a="x|y", b=12.345678), dict(a=None)])
  lines = text.splitlines()
  assert lines[0].split() == ["a", "b"] and len({len(l) for l in lines}) == 1
  assert lines[1].split() == ["1", "0.1235"] and lines[2].split() == ["x|y", "12.35"]
  assert lines[3].split() == ["-", "-"]
  assert tables.format_rows([]) == "(no rows)"


def test_tables_print_large_and_small_floats_without_exponents():
  from streamidx.lab import tables
  assert [tables.number(v) for v in (10296.4, 1.03e4, 12.345678, 0.000123, 3.0, -45.678)] == [
      "10,296", "10,300", "12.35", "0.000123", "3", "-45.68"]
  assert "e+" not in tables.markdown([dict(us=1.03e4, mb=2.5e6)])


def test_clock_note_links_the_one_explanation_of_the_missing_clock():
  from streamidx.lab import tables
  text = "v7x: at least 154 us, vector-bound (no public clock; the published TPU clocks are at most 1.75 GHz)"
  linked = tables.clock_note(text)
  assert "published TPU clocks" not in linked and tables.CLOCK_DOC in linked
  assert tables.clock_note("memory-bound (v5e)") == "memory-bound (v5e)"
  assert "docs/tpu.md" in tables.clock_note("below 3 GHz (no public clock)", markdown=False)


def _stepbound(stages, *, source="1.000 GHz, public (data/tpu_specs.json)"):
  from streamidx.lab.model import roofline  # pylint: disable=g-import-not-at-top
  return roofline.StepBound("vx", "vendored", "fp8", 1e-4, 0.0, 1e-6, 1, None, "", None,
                            stages=tuple(stages), clock_source=source)


def test_step_stages_figure_stacks_each_stage_and_hatches_a_floor():
  from streamidx.lab.model import roofline  # pylint: disable=g-import-not-at-top
  done = _stepbound([roofline.Stage("fill", 10e-6, None, 1e9, hbm_only=True),
                     roofline.Stage("scoring", 100e-6, 300_000, 1e9),    # 300 us by its bundles
                     roofline.Stage("selection", 20e-6, 50_000, 1e9)])   # 50 us
  floor = _stepbound([roofline.Stage("fill", 10e-6, None, None, hbm_only=True),
                      roofline.Stage("scoring", 100e-6, 300_000, None)], source="none")
  fig = plots.step_stages_figure({"complete": done, "floor": floor}, title="t")
  ax = fig.axes[0]
  filled = [p for p in ax.patches if p.get_fill()]
  widths = {(round(p.get_y() + p.get_height() / 2), round(p.get_width() * 1e3)) for p in filled}
  assert {(1, 10_000), (1, 300_000), (1, 50_000), (0, 10_000), (0, 100_000)} <= widths
  hatched = [p for p in ax.patches if p.get_hatch()]
  assert len(hatched) == 1 and round(hatched[0].get_y() + hatched[0].get_height() / 2) == 0
  texts = [t.get_text() for t in ax.texts]
  assert any("360 us" in t and "at least" not in t for t in texts)
  assert any("at least 110 us" in t for t in texts)
  plt.close(fig)
def test_step_stages_figure_draws_a_measured_calls_parts_in_ms():
  fig = plots.step_stages_figure({"lean": dict(scoring=2e-3, selection=1e-3, idle=None),
                                  "vendored": dict(scoring=4e-3, selection=3e-3, idle=5e-4)},
                                 title="t", unit="ms")
  ax = fig.axes[0]
  assert not any(p.get_hatch() for p in ax.patches)  # a measurement is no floor
  texts = [t.get_text() for t in ax.texts]
  assert any(t.strip() == "3.00 ms" for t in texts) and any(t.strip() == "7.50 ms" for t in texts)
  assert "device time" in ax.get_xlabel() and ax.get_xlabel().startswith("milliseconds")
  plt.close(fig)


def test_step_stages_figure_cuts_a_bar_that_would_squash_the_others():
  from streamidx.lab.model import roofline  # pylint: disable=g-import-not-at-top
  short = _stepbound([roofline.Stage("scoring", 100e-6, None, 1e9)])
  long_floor = _stepbound([roofline.Stage("scoring", 5000e-6, None, None)], source="none")
  fig = plots.step_stages_figure({"short": short, "long": long_floor}, title="t")
  ax = fig.axes[0]
  assert ax.get_xlim()[1] == pytest.approx(1.8 * 100)   # the axis ends at 1.8 x the next longest bar
  texts = [t.get_text() for t in ax.texts]
  assert any("at least 5,000 us" in t and "bar cut" in t for t in texts)
  assert any("100 us" in t and "bar cut" not in t for t in texts)
  plt.close(fig)
  fig = plots.step_stages_figure({"a": short, "b": _stepbound([roofline.Stage("scoring", 200e-6, None, 1e9)])}, title="t")
  assert not any("bar cut" in t.get_text() for t in fig.axes[0].texts)   # within 2.5x: nothing cut
  plt.close(fig)
