"""The calibration table (streamidx.lab.calibration) from the records."""

import json
import re

from streamidx.lab import calibration


def test_calibration_prints_every_measurement_and_the_one_clock_line(capsys):
  calibration.main([])
  lines = capsys.readouterr().out.strip().splitlines()
  n = len(calibration.measurements())
  assert len(lines) == n + 2  # header, one row each, the last line
  m = re.fullmatch(r"(\d+) of (\d+) public measurements within 1\.5x at one "
                   r"clock per chip \((.*)\)", lines[-1])
  assert m and int(m.group(2)) == n and int(m.group(1)) <= n
  assert "v7x 2.075 GHz from " + calibration.INFER_FROM["v7x"] in m.group(3)


def test_calibration_json_rows_and_the_clock_source_predicts_itself(capsys):
  calibration.main(["--json"])
  rows = json.loads(capsys.readouterr().out)
  assert all(set(r) == {"source", "chip", "stage", "shape", "measured_s",
                        "predicted_s"} for r in rows)
  full = {r["id"]: r for r in calibration.rows()}
  src = full[calibration.INFER_FROM["v7x"]]
  assert abs(src["predicted_s"] / src["measured_s"] - 1) < 1e-9
  # every prediction more than 1.5x off says why (or "unexplained")
  for r in full.values():
    if r["predicted_s"] is not None and not 1 / 1.5 <= r["predicted_s"] / r["measured_s"] <= 1.5:
      assert r["why"], r["id"]
