"""streamidx.lab.plots: the figures draw what the arrays say (Agg backend)."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
from matplotlib import colors as mcolors  # pylint: disable=g-import-not-at-top
import numpy as np  # pylint: disable=g-import-not-at-top
import pytest  # pylint: disable=g-import-not-at-top

import streamidx as si  # pylint: disable=g-import-not-at-top
from streamidx.lab.studies import layout  # pylint: disable=g-import-not-at-top
from streamidx.lab import plots  # pylint: disable=g-import-not-at-top


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
  plan = layout.launch_plan(batch.distribution, num_kv_pages_per_block=16,
                            num_queries_per_block=(1, 4, 4),
                            decode_req_batch_size=2)
  work = layout.program_work(batch, plan)
  fig = plots.batch_launch_figure(batch, plan, work)
  outlines = [p for p in fig.axes[0].patches if not p.get_fill()]
  assert len(outlines) == len(work) == sum(l.grid for l in plan)
  path = plots.save(fig, tmp_path / "out", "launches")
  assert path.exists() and path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
  plt.close(fig)


def test_visibility_axes_outlines_exactly_the_difference_cells():
  positions = np.arange(20, 28)
  mask = layout.visibility_mask(positions, 8, 4, "seed", seq_len=28)
  diff = layout.causal_rule_difference(positions, 8, 4, seq_len=28)
  fig, ax = plt.subplots()
  plots.visibility_axes(ax, mask, positions, diff=diff, title="t")
  cells = sorted((int(p.get_y()), int(p.get_x())) for p in ax.patches)
  assert cells == sorted(zip(*np.nonzero(diff)))
  plt.close(fig)
