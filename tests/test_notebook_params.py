"""A workbook notebook run with a bad parameter stops at its check cell.

The real `notebooks/00_quickstart.ipynb` is copied, untouched, into a scratch
notebooks folder whose `ci_parameters.json` entry is the real one with one
bad value, and run through the workbook's command line
(`python -m streamidx.workbook --profile ci --only 00_quickstart`, in
process). The run must fail loudly: exit code 1, the notebook named, the
cell named (the first code cell after `parameters`, the one calling
`streamidx.lab.params.check`), the parameter and its rule in the message, and no
cell after the check executed.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import nbformat
import pytest

from streamidx.lab import workbook

ROOT = Path(__file__).resolve().parents[1]
QUICKSTART = ROOT / "notebooks" / "00_quickstart.ipynb"


def check_cell(nb) -> tuple[int, int]:
  """(cells index, 1-based code cell number) of the cell after `parameters`."""
  p = workbook.parameters_cell_index(nb)
  index = p + 1
  code_cell = sum(1 for c in nb["cells"][:index + 1]
                  if c["cell_type"] == "code")
  return index, code_cell


@pytest.mark.parametrize("name,value,rule", [
    ("k", 0, "must be >= 1 (got 0)"),
    ("fmt", "fp16", "must be one of ('fp8', 'bf16') (got 'fp16')"),
])
def test_quickstart_with_a_bad_parameter_stops_at_its_check_cell(
    name, value, rule, tmp_path, capsys):
  folder = tmp_path / "notebooks"
  folder.mkdir()
  shutil.copy(QUICKSTART, folder / QUICKSTART.name)
  table = json.loads((QUICKSTART.parent / workbook.CI_PARAMETERS_FILE)
                     .read_text())
  params = {**table[QUICKSTART.name], name: value}
  (folder / workbook.CI_PARAMETERS_FILE).write_text(
      json.dumps({QUICKSTART.name: params}))
  source = json.loads(QUICKSTART.read_text())
  index, code_cell = check_cell(source)
  assert "params import check" in "".join(source["cells"][index]["source"])
  out = tmp_path / "build"

  code = workbook.main(["--profile", "ci", "--notebooks", str(folder),
                        "--out", str(out), "--only", "00_quickstart",
                        "--timeout", "120"])
  printed = capsys.readouterr().out

  assert code == 1
  assert (f"00_quickstart.ipynb FAILED at code cell {code_cell} "
          f"(cells[{index}]") in printed
  assert (f"ParameterError: notebook parameter {name!r}: {rule}"
          in printed), printed
  assert printed.rstrip().endswith("0 passed, 1 failed")
  # The check cell failed and no cell after it ran (the executed copy also
  # holds papermill's injected-parameters cell and error banners).
  executed = nbformat.read(str(out / QUICKSTART.name), as_version=4).cells
  status = [c.metadata.get("papermill", {}).get("status") for c in executed]
  failed = status.index("failed")
  assert executed[failed].source == "".join(source["cells"][index]["source"])
  assert all(c.get("execution_count") is None for c in executed[failed + 1:])
