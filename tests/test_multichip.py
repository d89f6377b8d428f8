"""lab.studies.multichip (notebook 09): layouts run against one device;
lab.plots' scaling figures. The crossover rows, titles and answers are
notebook 09's cells, checked by its own asserts."""

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
import numpy as np  # pylint: disable=g-import-not-at-top

from streamidx import sharded  # pylint: disable=g-import-not-at-top
from streamidx.lab import plots  # pylint: disable=g-import-not-at-top
from streamidx.lab.model import scaling  # pylint: disable=g-import-not-at-top
from streamidx.lab.studies import multichip  # pylint: disable=g-import-not-at-top

import tiers  # pylint: disable=g-import-not-at-top

W = scaling.DSV4_DECODE.with_(seq_len=1 << 17)


# Full tier (tests/tiers.py): notebook 09's CI run takes the same path (a
# 1 x 2 context-parallel layout through check_layouts_subprocess) and
# asserts every check ok; this test pins the rows' fields too.
@tiers.FULL
def test_a_context_parallel_layout_in_a_fresh_process_matches_one_device():
  """This process keeps one CPU device; the fallback path starts a child
  with three (device 0 left out of the 1 x 2 mesh)."""
  batch_kw = dict(decode=[300, 64], prefill=[[5, 200]], page_size=16,
                  compression_ratio=4, pages_per_seq=8, seed=1)
  got = multichip.check_layouts_subprocess(
      batch_kw, [dict(layout="context-parallel", num_data=1, num_context=2)],
      num_heads=2, k=8)
  assert len(got) == 1
  c = got[0]
  assert c.ok, c.detail
  assert c.rows == 2 + 5 and c.identical + c.tied == c.rows
  assert c.devices == "2 x cpu (interpreted)" and c.collective == "all_gather"
  assert c.atol > 0  # the derived tolerance, never 0
  assert c.merge_bytes_per_row == sharded.merge_bytes_per_row(8, 2) == 64
  assert c.pages_per_share == 4


def test_scaling_figure_draws_both_layouts_where_they_differ():
  rows = scaling.scaling_table(W, generations=["v7x"], chips=(8, 64))
  fig = plots.scaling_figure(rows, title="C = 2 pays on v7x at 64 chips")
  step_ax = fig.axes[0]
  lines = step_ax.get_lines()
  assert len(lines) == 2  # C = 1, and the best C (it differs at 64 chips)
  np.testing.assert_allclose(lines[1].get_ydata(),
                             [r["step us (best)"] for r in rows])
  assert [r["best C"] for r in rows] == [1, 2]  # C = 2 pays on v7x at 64 chips
  assert "C = 2 pays on v7x at 64 chips" in fig._suptitle.get_text()  # pylint: disable=protected-access
  plt.close(fig)


def test_crossover_figure_leaves_out_what_never_pays():
  rows = [dict(generation="v6e", chips=1, tokens=None, **{"latency us": 0}),
          dict(generation="v7x", chips=1, tokens=2048, **{"latency us": 0}),
          dict(generation="v7x", chips=1, tokens=4096, **{"latency us": 5})]
  fig = plots.crossover_figure(rows)
  lines = fig.axes[0].get_lines()
  assert [len(l.get_xdata()) for l in lines] == [0, 2]
  plt.close(fig)
