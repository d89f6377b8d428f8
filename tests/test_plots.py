"""streamidx.lab.plots: the figures draw what the arrays say (Agg backend)."""

from __future__ import annotations

import json

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
from matplotlib.container import BarContainer  # pylint: disable=g-import-not-at-top
import numpy as np  # pylint: disable=g-import-not-at-top
import pytest  # pylint: disable=g-import-not-at-top

import streamidx as si  # pylint: disable=g-import-not-at-top
import collections  # pylint: disable=g-import-not-at-top
from streamidx.lab import plots  # pylint: disable=g-import-not-at-top
from streamidx.lab import tables as plots_tables  # pylint: disable=g-import-not-at-top
from streamidx.lab.model import tiling  # pylint: disable=g-import-not-at-top


def _batch(allocation):
  return si.make_mixed_batch(decode=[90, 33, 60], prefill=[(5, 70)],
                             mixed=[(3, 128)], page_size=8,
                             compression_ratio=4, allocation=allocation)


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


def test_iteration_order_figure_draws_one_cell_per_step_and_sequence():
  batch = _batch("contiguous")
  plan = tiling.plan(batch, num_heads=2, num_kv_pages_per_block=(16, 16, 16),
                     num_queries_per_block=(1, 4, 4), decode_req_batch_size=2)
  steps = list(tiling.steps(plan))
  fig = plots.iteration_order_figure(steps, batch.num_seqs, title="t")
  ax = fig.axes[0]
  cells = [p for p in ax.patches if p.get_width() > 0]
  assert len(cells) == sum(len(st["seqs"]) for st in steps)
  past_end = sum(st["bkv"] * st["bkv_sz"] >= max(kv, 1)
                 for st in steps for kv in st["kv_lens"])
  assert sum(1 for p in cells if p.get_hatch()) == past_end
  plt.close(fig)


def test_vmem_budget_figure_shows_the_budget_and_outlines_cells_over_the_limit():
  mib = 2**20
  budget = np.array([[1, 2], [4, 32]]) * mib
  fig = plots.vmem_budget_figure(budget, [64, 128], [1, 2], {"v5e": 16 * mib},
                                 production=(128, 1), title="t")
  ax = fig.axes[0]
  np.testing.assert_allclose(ax.get_images()[0].get_array(), budget / mib)
  # Only the (128, 2) cell is over 16 MiB: its bottom and left edges.
  red = [l for l in ax.get_lines() if len(l.get_xdata()) == 2]
  assert len(red) == 2
  assert [p for p in ax.patches if not p.get_fill()][0].get_xy() == (-0.45, 0.55)
  plt.close(fig)


  plt.close(fig)


def test_tables_markdown_escapes_pipes_and_marks_missing_cells():
  from streamidx.lab import tables
  text = tables.markdown([dict(a=1, b=0.123456), dict(a="x|y"), dict(a=None, b=12.345678)])
  assert text.splitlines() == ["| a | b |", "|---|---|", "| 1 | 0.1235 |",
                               "| x\\|y | - |", "| - | 12.35 |"]
  with pytest.raises(ValueError, match="rows"):
    tables.markdown([])


def test_static_schedule_figure_draws_bundles_and_the_hbm_line_where_a_clock_exists():
  from streamidx.lab.model import roofline

  rows = [dict(generation=g, bkv_p=c, bundles_per_page=n)
          for g, c, n in (("v5e", 2, 120.0), ("v5e", 4, 115.0), ("v6e", 2, 65.0),
                          ("v6e", 4, 53.5))]
  bounds = [roofline.page_bound(r["generation"], bundles_per_page=r["bundles_per_page"],
                                page_bytes=32768) for r in rows]
  fig = plots.static_schedule_figure(rows, bounds, title="t")
  v5e, v6e = fig.axes
  np.testing.assert_allclose(v5e.get_lines()[0].get_ydata(), [120.0, 115.0])
  hbm = v5e.get_lines()[1].get_ydata()[0]
  assert hbm == pytest.approx(32768 / 8.19e11 * 1.503e9)
  assert len(v6e.get_lines()) == 1 and "no public clock" in v6e.texts[0].get_text()
  plt.close(fig)


def test_tables_format_rows_aligns_columns_and_marks_missing_cells():
  from streamidx.lab import tables
  text = tables.format_rows([dict(a=1, b=0.123456), dict(a="x|y", b=12.345678), dict(a=None)])
  lines = text.splitlines()
  assert lines[0].split() == ["a", "b"] and len({len(l) for l in lines}) == 1
  assert lines[1].split() == ["1", "0.1235"] and lines[2].split() == ["x|y", "12.35"]
  assert lines[3].split() == ["-", "-"]
  assert tables.format_rows([]) == "(no rows)"


def test_tables_batch_rows_list_each_sequence_as_the_kernel_sees_it():
  batch = _batch("fragmented")
  rows = plots_tables.batch_rows(batch, max_pages=2)
  assert [r["range"] for r in rows] == ["decode"] * 3 + ["prefill-only", "mixed"]
  assert [r["q_len"] for r in rows] == [int(x) for x in batch.q_lens[:5]]
  assert rows[3]["query rows"] == f"{batch.cu_q_lens[3]}..{batch.cu_q_lens[4] - 1}"
  assert [r["entries"] for r in rows] == [int(x) for x in batch.num_entries[:5]]
  assert rows[0]["physical pages"].endswith(", ...")  # 90 tokens: 3 pages of 8 entries


def test_decode_waste_figure_bars_the_mean_waste_with_its_spread():
  waste = {(b, o): [.1 * b, .3 * b] for b in (1, 2) for o in ("none", "length")}
  fig = plots.decode_waste_figure(waste, [1, 2], ["none", "length"], title="t")
  ax = fig.axes[0]
  np.testing.assert_allclose(_bar_heights(ax), [20, 40, 20, 40])  # percent, one series per order
  bars = [c for c in ax.containers if isinstance(c, BarContainer)]
  assert len(bars) == 2 and all(c.errorbar is not None for c in bars)  # one standard deviation
  plt.close(fig)


def test_decode_step_figure_stacks_fill_kernel_and_topk():
  rows = [dict(generation=g, fill_us=1.0, kernel_us=k, topk_us=2.0)
          for g, k in (("v5e", 10.0), ("v6e", 5.0))]
  fig = plots.decode_step_figure(rows, title="t")
  bars = fig.axes[0].patches
  np.testing.assert_allclose([p.get_height() for p in bars], [1, 1, 10, 5, 2, 2])
  np.testing.assert_allclose([p.get_y() for p in bars], [0, 0, 1, 1, 11, 6])
  plt.close(fig)


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


def test_static_schedule_figure_gives_each_chip_its_own_y_range():
  from streamidx.lab.model import roofline
  rows = [dict(generation=g, bkv_p=3, bundles_per_page=n) for g, n in (("v5e", 520.0), ("v6e", 61.0))]
  bounds = [roofline.page_bound(r["generation"], bundles_per_page=r["bundles_per_page"],
                                page_bytes=32768) for r in rows]
  v5e, v6e = plots.static_schedule_figure(rows, bounds, title="t").axes
  assert v5e.get_ylim()[1] >= 520 and v6e.get_ylim()[1] < 100   # both points inside their panel
  plt.close("all")


def test_kv_double_buffer_figure_draws_each_fetch_on_its_slot_and_each_scoring():
  fills = [dict(slot=0, start=2, wait=10, step=0, pages=8, seqs=2),
           dict(slot=1, start=6, wait=14, step=1, pages=8)]
  computes = [dict(step=0, start=10, end=11), dict(step=1, start=14, end=15)]
  fig = plots.kv_double_buffer_figure(fills, computes, [(0, "decode")], xlabel="DMA number",
                                      title="t")
  ax = fig.axes[0]
  boxes = [p for p in ax.patches if p.get_fill()]
  assert [(b.get_x(), b.get_y(), b.get_width()) for b in boxes] == [
      (2, .15, 8), (6, 1.15, 8), (10, 2.15, 1), (14, 2.15, 1)]
  texts = [t.get_text() for t in ax.texts]
  assert "step 0\n8 pages of 2 seqs" in texts and "step 1\n8 pages" in texts
  assert "decode launch" in texts
  plt.close(fig)


def test_running_topk_figure_draws_the_kth_best_per_block_and_outlines_new_entries():
  scores = np.array([3., 1., 2., -np.inf, 5., 0., 4., -np.inf])
  history = [dict(idx=np.array([0, 2]), vals=np.array([3., 2.]), entered=[0, 2], left=[]),
             dict(idx=np.array([4, 6]), vals=np.array([5., 4.]), entered=[4, 6], left=[0, 2])]
  fig = plots.running_topk_figure(scores, history, bkv=4, title="t")
  ax, buf = fig.axes
  segments = [s for c in ax.collections for s in c.get_segments()]
  assert [tuple(map(tuple, s)) for s in segments] == [((0, 2.), (4, 2.)), ((4, 4.), (8, 4.))]
  outlined = [p for p in buf.patches if not p.get_fill()]
  assert len(outlined) == 4  # every entry is new in its block here
  assert [t.get_text() for t in buf.texts] == ["0", "2", "4", "6"]
  dropped = [l for l in ax.lines if l.get_label().startswith("kept for a while")][0]
  assert list(dropped.get_xdata()) == [0, 2]
  plt.close(fig)


def test_topk_methods_figure_puts_bound_and_sort_work_per_shape_and_stars_the_measured():
  rows = [dict(panel=p, series=s, method=m, bound_us=b, sort_work_g=w)
          for p in ("decode", "prefill") for s, f in (("k = 512", 1), ("k = 2048", 2))
          for m, b, w in (("sort", 10. * f, 1.), ("radix", 50. * f, .001), ("scoring", 100., None))]
  measured = [dict(panel="decode", method="sort", us=3600., label="measured by others")]
  fig = plots.topk_methods_figure(rows, measured=measured, generation="v7x", title="t")
  axes = fig.axes
  assert len(axes) == 4 and axes[0].get_title() == "decode" and axes[1].get_title() == "prefill"
  top = {l.get_label(): list(l.get_xdata()) for l in axes[0].lines}
  assert top["k = 512"] == [10., 50., 100.] and top["k = 2048"] == [20., 100., 100.]
  assert top["measured by others"] == [3600.]
  bottom = {l.get_label(): list(l.get_xdata()) for l in axes[2].lines}
  assert bottom["k = 512"] == [1., .001]  # the scoring row has no sort work
  assert axes[0].get_xscale() == axes[2].get_xscale() == "log"
  assert [t.get_text() for t in fig.legends[0].get_texts()] == [
      "k = 512", "k = 2048", "measured by others"]
  plt.close(fig)


def test_mtp_step_figure_bars_each_path_and_marks_only_the_known_terms():
  rows = [{"generation": g, "tokens": 131072, "path": p, "step us": s, "HBM us": 10.,
           "MXU us": m, "vector us": v}
          for g, v in (("v5e", 30.), ("v6e", None)) for p, s, m in (("batched", 40., 1.),
                                                                    ("mixed", 80., 64.))]
  fig = plots.mtp_step_figure(rows, title="t")
  ax = fig.axes[0]
  assert [round(p.get_height()) for p in ax.patches] == [40, 40, 80, 80]
  marks = collections.defaultdict(list)
  for line in ax.lines:
    marks[line.get_label()] += list(line.get_ydata())
  assert marks["kernel's HBM term"] == [10.] * 4
  assert marks["kernel's MXU term"] == [1., 1., 64., 64.]
  assert marks["kernel's vector term (static schedule)"] == [30., 30.]  # v6e has none
  assert sorted(t.get_text() for t in fig.legends[0].get_texts()) == sorted([
      "predicted step, batched path", "predicted step, mixed path", "kernel's HBM term",
      "kernel's MXU term", "kernel's vector term (static schedule)"])
  assert ax.get_yscale() == "log"
  plt.close(fig)


def test_block_sweep_figure_draws_a_line_per_series_and_rings_the_production_row():
  rows = [dict(bq=bq, bkv_p=c, MB=100 / bq * c, us=1000 / bq) for c in (1, 2) for bq in (32, 64, 128)]
  fig = plots.block_sweep_figure(rows, x="bq", series="bkv_p", panels=[("MB", "MB"), ("us", "us")],
                                 production=(64, 2), title="t")
  mb = fig.axes[0]
  lines = {l.get_label(): (list(l.get_xdata()), list(l.get_ydata())) for l in mb.lines}
  assert lines["bkv_p = 1"] == ([32, 64, 128], [100 / 32, 100 / 64, 100 / 128])
  assert lines["production block sizes"] == ([64], [100 / 64 * 2])
  assert mb.get_xscale() == "log" and len(fig.axes) == 2
  plt.close(fig)


def _stepbound(stages, *, source="1.000 GHz, public (data/tpu_specs.json)"):
  from streamidx.lab.model import roofline  # pylint: disable=g-import-not-at-top
  return roofline.StepBound("vx", "vendored", "fp8", 1e-4, 0.0, 1e-6, 1, None, "", None,
                            stages=tuple(stages), clock_source=source)


def test_step_stages_figure_stacks_each_stage_and_hatches_a_floor():
  from streamidx.lab.model import roofline  # pylint: disable=g-import-not-at-top
  done = _stepbound([roofline.Stage("fill", 10e-6, None, 1e9),
                     roofline.Stage("scoring", 100e-6, 300_000, 1e9),    # 300 us by its bundles
                     roofline.Stage("selection", 20e-6, 50_000, 1e9)])   # 50 us
  floor = _stepbound([roofline.Stage("fill", 10e-6, None, None),
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
