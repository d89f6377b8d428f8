"""streamidx.lab.plots: the figures draw what the arrays say (Agg backend)."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
from matplotlib import colors as mcolors  # pylint: disable=g-import-not-at-top
from matplotlib.container import BarContainer  # pylint: disable=g-import-not-at-top
import numpy as np  # pylint: disable=g-import-not-at-top
import pytest  # pylint: disable=g-import-not-at-top

import streamidx as si  # pylint: disable=g-import-not-at-top
from streamidx.lab.studies import quant  # pylint: disable=g-import-not-at-top
import collections  # pylint: disable=g-import-not-at-top
import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
from streamidx.lab import plots  # pylint: disable=g-import-not-at-top
from streamidx.lab import tables as plots_tables  # pylint: disable=g-import-not-at-top
from streamidx.lab.model import tiling  # pylint: disable=g-import-not-at-top
from streamidx.lab.studies import addressing  # pylint: disable=g-import-not-at-top


def _batch(allocation):
  return si.make_mixed_batch(decode=[90, 33, 60], prefill=[(5, 70)],
                             mixed=[(3, 128)], page_size=8,
                             compression_ratio=4, allocation=allocation)


@pytest.mark.parametrize("allocation", ["contiguous", "fragmented"])
def test_page_table_figure_colours_each_physical_page_by_its_owner(allocation):
  batch = _batch(allocation)
  fig = plots.page_table_figure([batch], [allocation])
  pool = fig.axes[1]
  assert len(pool.patches) == batch.total_num_pages
  colors = plots.seq_colors(batch.num_seqs)
  owner = np.full(batch.total_num_pages, -1)
  for b in range(batch.num_seqs):
    owner[batch.page_table[b, :batch.num_pages_used[b]]] = b
  for page, patch in enumerate(pool.patches):
    want = colors[owner[page]] if owner[page] >= 0 else plots.FREE
    assert mcolors.same_color(patch.get_facecolor(), want), page
  plt.close(fig)


def test_batch_launch_figure_draws_one_box_per_program(tmp_path):
  batch = _batch("contiguous")
  plan = tiling.plan(batch, num_kv_pages_per_block=16,
                     num_queries_per_block=(1, 4, 4), decode_req_batch_size=2)
  fig = plots.batch_launch_figure(batch, plan)
  outlines = [p for p in fig.axes[0].patches if not p.get_fill()]
  assert len(outlines) == len(plan.grid_points()) == sum(
      l.grid for l in plan.launches)
  path = plots.save(fig, tmp_path / "out", "launches")
  assert path.exists() and path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
  plt.close(fig)


def test_visibility_axes_outlines_exactly_the_difference_cells():
  positions = np.arange(20, 28)
  mask = addressing.visibility_mask(positions, 8, 4, "seed", seq_len=28)
  diff = addressing.causal_rule_difference(positions, 8, 4, seq_len=28)
  fig, ax = plt.subplots()
  plots.visibility_axes(ax, mask, positions, diff=diff, title="t")
  cells = sorted((int(p.get_y()), int(p.get_x())) for p in ax.patches)
  assert cells == sorted(zip(*np.nonzero(diff)))
  plt.close(fig)


# --------------------------------------------------------------------------
# Notebook figures: each draws the numbers it is given.


def _bar_heights(ax):
  return [p.get_height() for p in ax.patches]


def test_scale_error_figure_histograms_every_record():
  rng = np.random.default_rng(0)
  study = {d: dict(err_pow2=rng.random(50) * .05, err_float=rng.random(50) * .04,
                   mean_err_ue8m0=.025, mean_err_float=.02,
                   amax_over_scale=rng.uniform(224, 448, 50))
           for d in ("gaussian", "outliers")}
  fig = plots.scale_error_figure(study)
  for ax in fig.axes[:2]:  # two histograms of 50 records each, 59 bins
    heights = _bar_heights(ax)
    assert len(heights) == 2 * 59 and sum(heights) == 100
  assert sum(_bar_heights(fig.axes[2])) == 50
  plt.close(fig)




CI = collections.namedtuple("CI", "mean half_width")  # a mean and its interval


def test_e4m3_use_figure_shares_stored_values_by_binade_and_draws_the_spacing():
  grid = np.asarray(jnp.arange(256, dtype=jnp.uint8).view(jnp.float8_e4m3fn)
                    .astype(jnp.float32))
  positive = np.unique(grid[np.isfinite(grid) & (grid > 0)])
  spacing = np.diff(positive) / positive[:-1]
  stored = np.array([0.0, 2.0**-8, 1.5, 1.75, 300.0])  # the zero is left out
  fig = plots.e4m3_use_figure(positive, spacing, stored, title="finding")
  (bars,) = [c for c in fig.axes[0].containers if isinstance(c, BarContainer)]
  heights = [p.get_height() for p in bars]
  assert sum(heights) == pytest.approx(1) and max(heights) == pytest.approx(.5)
  (line,) = fig.axes[1].get_lines()
  np.testing.assert_array_equal(line.get_ydata(), spacing)
  assert fig._suptitle.get_text() == "finding"
  assert all(ax.get_xlabel() and ax.get_ylabel() for ax in fig.axes)
  plt.close(fig)


def test_recall_ci_figure_draws_the_mean_and_clips_the_interval_to_one():
  recall = {("gaussian", 256, v, k): np.array([[1.0, 1.0], [.9, 1.0], [1.0, 1.0]])
            for v in ("bf16", "fp8") for k in (64, 128)}
  per_seed = {key: r.mean(axis=1) for key, r in recall.items()}
  summary = lambda d, e, v, k: CI(per_seed[(d, e, v, k)].mean(), 0.1)
  fig = plots.recall_ci_figure(summary, dists=("gaussian",), contexts=[256],
                               ks=(64, 128, 512), variants=["bf16", "fp8"],
                               title="t")
  ax = fig.axes[0]
  line = ax.get_lines()[0]
  np.testing.assert_array_equal(line.get_xdata(), [64, 128])  # k <= 256
  np.testing.assert_allclose(line.get_ydata(), [59 / 60, 59 / 60])  # seeds 1, .95, 1
  tops = [seg[1][1] for c in ax.collections for seg in c.get_segments()]
  assert max(tops) == pytest.approx(1.0)  # the interval stops at recall 1
  plt.close(fig)


def test_rotation_figure_draws_both_keys_and_differences_around_zero():
  key = np.ones(128)
  key[:4] = 20.0
  rotated = np.asarray(quant.rotate(key))
  diffs = [("gaussian, fp8", CI(0.0, .02)), ("outliers, fp8", CI(.03, .02))]
  fig = plots.rotation_figure(key, rotated, diffs, outlier_channels=4, title="t")
  before, after = fig.axes[0].get_lines()
  np.testing.assert_allclose(before.get_ydata(), np.abs(key))
  np.testing.assert_allclose(after.get_ydata(), np.abs(rotated), rtol=1e-6)
  (bars,) = [c for c in fig.axes[1].containers if isinstance(c, BarContainer)]
  widths = [p.get_width() for p in bars]
  np.testing.assert_allclose(widths, [0.0, .03], atol=1e-12)
  assert [l.get_xdata()[0] for l in fig.axes[1].get_lines()][-1] == 0  # the zero line
  plt.close(fig)


def test_causal_leak_figure_bars_only_rows_that_selected_the_leaked_entry():
  live = np.array([1, 1, 1, 1, 1, 0], bool)
  selected = np.array([0, 1, 0, 1, 0, 0], bool)
  mass = np.array([.5, .2, .5, .1, .5, .5])
  bound = np.array([1, 1, 1, 1, 0, 0], bool)
  fig = plots.causal_leak_figure(live, selected, mass, bound, [3], title="t")
  ax = fig.axes[0]
  np.testing.assert_allclose(_bar_heights(ax), [0, .2, 0, .1, 0])
  crosses, start = ax.get_lines()
  assert list(crosses.get_xdata()) == [0, 2]
  assert list(start.get_xdata()) == [2.5, 2.5]
  plt.close(fig)



def test_page_coverage_figure_draws_coverage_and_the_random_baseline():
  coverage = {f: {m: np.array([[.5, .4, .3]]) * (2 if f == "f32" else 1)
                  for m in ("count", "mass")} for f in ("fp8", "f32")}
  fig = plots.page_coverage_figure(coverage, [16, 32, 64], [512],
                                   page_entries=4096, title="t")
  fp8, f32, random_pages = fig.axes[1].get_lines()
  np.testing.assert_allclose(fp8.get_ydata(), [.5, .4, .3])
  np.testing.assert_allclose(f32.get_ydata(), [1., .8, .6])
  assert list(random_pages.get_ydata()) == [512 / 4096] * 2
  plt.close(fig)


def _prediction(kernel, topk, fill):
  return {"kernel": kernel, "topk": topk, "fill": fill,
          "total": kernel + topk + fill}


def test_roofline_figure_off_tpu_draws_the_predicted_bounds():
  gens = ("v5e", "v6e")
  preds = {("token", 8, 16384): {g: _prediction(1e-5 * (i + 1), 2e-6, 1e-6)
                                 for i, g in enumerate(gens)}}
  fig = plots.roofline_figure([], preds, measured=False, generation=None,
                              generations=gens)
  left, right = fig.axes
  np.testing.assert_allclose(_bar_heights(left), [13., 23.])  # microseconds
  assert "need a TPU" in left.texts[0].get_text()
  np.testing.assert_allclose([p.get_width() for p in right.patches],
                             [1000 / 13, 200 / 13, 100 / 13])  # % of v5e's bound
  plt.close(fig)


def test_roofline_figure_on_tpu_stacks_the_measured_stages():
  rec = dict(mode="token", batch_size=8, context_tokens=16384, kernel_us=30.,
             topk_us=10., other_us=10.,
             predicted_us={"v5e": dict(kernel=20., total=25.)})
  fig = plots.roofline_figure([rec], {}, measured=True, generation="v5e",
                              generations=("v5e",), device_kind="TPU v5 lite")
  left, right = fig.axes
  np.testing.assert_allclose(_bar_heights(left), [30., 10., 10.])
  assert [c.get_offsets()[0][1] for c in left.collections] == [25., 20.]
  np.testing.assert_allclose([p.get_width() for p in right.patches], [60, 20, 20])
  assert "TPU v5 lite" in left.get_title()
  plt.close(fig)


def test_tables_markdown_escapes_pipes_and_marks_missing_cells():
  from streamidx.lab import tables
  text = tables.markdown([dict(a=1, b=0.123456), dict(a="x|y"), dict(a=None, b=12.345678)])
  assert text.splitlines() == ["| a | b |", "|---|---|", "| 1 | 0.1235 |",
                               "| x\\|y | - |", "| - | 12.35 |"]
  with pytest.raises(ValueError, match="rows"):
    tables.markdown([])


def test_query_scores_figure_marks_selected_masked_entries_and_the_kth_score():
  rng = np.random.default_rng(0)
  unmasked = rng.random(20).astype(np.float32)
  scores = np.full(24, -np.inf, np.float32)
  scores[:15] = unmasked[:15]
  chosen = np.argsort(-scores[:15], kind="stable")[:4]
  fig = plots.query_scores_figure(scores, unmasked, chosen, k=4, n_visible=15,
                                  compression_ratio=4, title="t")
  ax = fig.axes[0]
  lines = {l.get_label().split(" (")[0]: l for l in ax.get_lines()}
  np.testing.assert_array_equal(lines["returned by the kernel"].get_xdata(), chosen)
  masked = lines["masked by causality"]
  np.testing.assert_array_equal(masked.get_xdata(), np.arange(15, 20))
  np.testing.assert_allclose(masked.get_ydata(), unmasked[15:])
  kth = np.sort(scores[:15])[::-1][3]
  np.testing.assert_allclose(lines["k-th best visible score"].get_ydata(), [kth, kth])
  plt.close(fig)


def test_query_scores_figure_draws_no_kth_line_when_the_row_sees_fewer_than_k():
  scores = np.array([1.0, 2.0, -np.inf, -np.inf], np.float32)
  fig = plots.query_scores_figure(scores, np.array([1.0, 2.0, 3.0]), [1, 0],
                                  k=4, n_visible=2, compression_ratio=4,
                                  title="t")
  labels = [l.get_label() for l in fig.axes[0].get_lines()]
  assert not any(l.startswith("k-th") for l in labels)
  plt.close(fig)


@pytest.mark.parametrize("fmt,packing", [("fp8", 4), ("bf16", 2)])
def test_sublane_words_axes_draws_one_word_per_row_and_lane_split_by_entry(fmt, packing):
  keys = np.random.default_rng(1).standard_normal((1, 8, 128)).astype(np.float32)
  page = np.asarray(si.cache.pack_cache(keys, fmt)[0])
  lanes = [0, 1, 127]
  fig, ax = plt.subplots()
  plots.sublane_words_axes(ax, page, kv_packing=packing, lanes=lanes,
                           highlight=5, title="t")
  rows = 8 // packing
  words = [p for p in ax.patches if not p.get_fill() and p.get_edgecolor()[:3] == (0, 0, 0)]
  parts = [p for p in ax.patches if p.get_fill()]
  red = [p for p in ax.patches if not p.get_fill() and mcolors.same_color(p.get_edgecolor(), "red")]
  assert len(words) == rows * len(lanes) and len(parts) == rows * len(lanes) * packing
  assert len(red) == len(lanes)  # entry 5 once per drawn lane
  assert {(p.get_y(), p.get_x() % 1) for p in red} == {(5 // packing, (5 % packing) / packing)}
  texts = [t.get_text() for t in ax.texts]
  if fmt == "fp8":
    assert f"e0\n{page[0, 0, 0]:02x}" in texts
  assert "..." in texts  # the gap between lanes 1 and 127
  plt.close(fig)


def test_decode_step_time_figure_draws_one_bar_per_format_and_generation():
  rows = [dict(fmt=f, generation=g, step_us=10.0 * i + j + 1, stored_bytes=b)
          for i, (f, b) in enumerate((("fp8", 256), ("dense_fp8", 132), ("bf16", 256)))
          for j, g in enumerate(("v5e", "v6e"))]
  fig = plots.decode_step_time_figure(rows, title="t")
  ax = fig.axes[0]
  np.testing.assert_allclose(_bar_heights(ax), [r["step_us"] for r in rows])
  assert "model" in ax.get_ylabel()
  plt.close(fig)


def test_causal_masks_figure_outlines_the_chunks_leak_cells():
  batch = _batch("contiguous")
  chunk = addressing.prefill_chunk_masks(batch, int(batch.distribution[0]), window=6)
  fig = plots.causal_masks_figure(chunk, compression_ratio=4)
  assert len(fig.axes[1].patches) == chunk.leak_cells and not fig.axes[0].patches
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


def test_runs_figure_draws_the_last_runs_kernel_time_and_rejects_none():
  def run(name, us):
    rec = dict(mode="token", batch_size=8, context_tokens=16384, kernel_us=us,
               predicted_us={"v5e": {"kernel": 10.0, "total": 12.0}})
    return dict(path=f"/tmp/{name}.json", machine=dict(device_kind="TPU v5 lite", generation="v5e"),
                records=[rec])
  fig = plots.runs_figure([run(f"r{i}", 20.0 + i) for i in range(8)], last=3)
  ax = fig.axes[0]
  heights = [p.get_height() for c in ax.containers if isinstance(c, BarContainer) for p in c]
  assert heights == [25.0, 26.0, 27.0]
  assert ax.get_title().startswith("Kernel device time of 3 TPU run(s)")
  plt.close(fig)
  with pytest.raises(ValueError, match="timed_runs"):
    plots.runs_figure([])


def test_variant_figure_draws_the_model_only_without_a_tpu():
  recs = [{"label": label, "generation": "v5e", "roofline us": bound,
           "static schedule us": None, "kernel_us": None, "topk_us": None,
           "other_us": None, "total_us": None}
          for label, bound in (("vendored", 3.0), ("dense", 2.0),
                               ("vendored, topk_method=approx", 2.5))]
  fig = plots.variant_timing_figure(recs, measured=False, title="t")
  ax = fig.axes[0]
  assert len(ax.patches) == len(recs)  # hollow roofline bars only
  assert [p.get_width() for p in ax.patches] == pytest.approx(
      [r["roofline us"] for r in recs])
  assert any("no device timing" in t.get_text() for t in ax.texts)
  plt.close(fig)


def test_record_bytes_axes_colours_each_byte_by_its_role():
  record = np.arange(136, dtype=np.uint8)  # head_dim 128: 128 values, 1 scale, 7 padding
  fig, ax = plt.subplots()
  plots.record_bytes_axes(ax, record, 128, title="t")
  colors = [mcolors.to_hex(p.get_facecolor()) for p in ax.patches]
  assert len(colors) == 136 and colors[127] != colors[128] != colors[129] == colors[135]
  assert [t.get_text() for t in ax.texts][127:130] == ["7f", "80", "81"]
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


def test_calibration_figure_draws_one_point_per_prediction_inside_its_band():
  rows = [dict(source="a #1", chip="vx", stage="scoring", method=None, shape="64 x 8", measured_s=1e-3,
               predicted_s=1e-3),
          dict(source="a #1", chip="vx", stage="selection", method="sort", shape="64 x 8",
               measured_s=4e-3, predicted_s=1e-3),
          dict(source="b #2", chip=None, stage="step", method=None, shape="? x ?", measured_s=2e-3,
               predicted_s=None)]
  fig = plots.calibration_figure(rows, band=1.5, title="t")
  ax = fig.axes[0]
  points = [l for l in ax.lines if l.get_linestyle() == "None" and len(l.get_xdata()) == 1]
  assert sorted((l.get_xdata()[0], l.get_ydata()[0]) for l in points) == [(1.0, 1.0), (4.0, 1.0)]
  assert ax.get_xscale() == ax.get_yscale() == "log"
  key = ax.texts[-1].get_text()
  assert "a #1, vx: selection (sort), 64 x 8: 1.00 / 4.00 ms = 0.25" in key and "b #2" not in key
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
