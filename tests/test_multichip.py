"""lab.studies.multichip (notebook 09): layouts run against one device. The
scaling figures, crossover rows, titles and answers are notebook 09's cells,
checked by its own asserts."""

from streamidx import sharded
from streamidx.lab.studies import multichip

import tiers


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
