"""The workbook's notebooks: review hygiene, and each one executes (CI profile).

Hygiene (fast, no kernel): every `notebooks/*.ipynb` is valid nbformat, is
named `NN_*.ipynb`, carries no outputs, execution counts or Colab metadata,
has exactly one cell tagged `parameters` declaring `output_dir`, and has an
entry in `notebooks/ci_parameters.json` (and that file names only notebooks
that exist). `make strip` fixes outputs and metadata.

Execution (`-m notebook`, slow): each notebook runs through
`streamidx.workbook.run_notebook(..., profile="ci")` into `build/ci/`; a
failure names the notebook and the cell.
"""

from __future__ import annotations

import json
from pathlib import Path

import nbformat
import pytest

from streamidx.lab import workbook

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS_DIR = ROOT / "notebooks"
ALL_NOTEBOOKS = sorted(NOTEBOOKS_DIR.glob("*.ipynb"))
WORKBOOK = workbook.discover(NOTEBOOKS_DIR)
CI_OUT = ROOT / "build" / "ci"
COLAB_KEYS = {"colab", "executionInfo", "outputId"}

by_name = pytest.mark.parametrize("path", ALL_NOTEBOOKS, ids=lambda p: p.name)


@by_name
def test_is_valid_nbformat(path):
  nb = nbformat.read(str(path), as_version=nbformat.NO_CONVERT)
  nbformat.validate(nb)
  assert nb.nbformat == 4


@by_name
def test_is_named_as_a_workbook_notebook(path):
  # Only NN_*.ipynb are run by the workbook and CI; nothing may hide outside.
  assert path in WORKBOOK, f"{path.name}: rename to NN_name.ipynb so CI runs it"


@by_name
def test_has_no_outputs_or_execution_counts(path):
  nb = nbformat.read(str(path), as_version=4)
  dirty = [i for i, c in enumerate(nb.cells) if c.cell_type == "code"
           and (c.get("outputs") or c.get("execution_count") is not None)]
  assert not dirty, f"{path.name}: cells {dirty} have outputs; run `make strip`"


@by_name
def test_has_no_colab_metadata(path):
  nb = nbformat.read(str(path), as_version=4)
  found = [f"notebook metadata: {k}" for k in COLAB_KEYS & set(nb.metadata)]
  for i, cell in enumerate(nb.cells):
    found += [f"cells[{i}] metadata: {k}" for k in COLAB_KEYS & set(cell.metadata)]
  assert not found, f"{path.name}: {found}; run `make strip`"


@by_name
def test_has_one_parameters_cell_with_output_dir(path):
  nb = nbformat.read(str(path), as_version=4)
  tagged = [i for i, c in enumerate(nb.cells)
            if "parameters" in c.metadata.get("tags", [])]
  assert len(tagged) == 1, f"{path.name}: cells tagged 'parameters': {tagged}"
  assert nb.cells[tagged[0]].cell_type == "code"
  assert workbook.OUTPUT_DIR_PARAMETER in workbook.declared_parameters(path)


def test_ci_parameters_lists_exactly_the_notebooks():
  table = json.loads((NOTEBOOKS_DIR / workbook.CI_PARAMETERS_FILE).read_text())
  assert isinstance(table, dict)
  assert sorted(table) == sorted(p.name for p in ALL_NOTEBOOKS)
  # Same check as the runner's: declared parameters, no output_dir.
  workbook.load_ci_parameters(NOTEBOOKS_DIR)


@pytest.mark.notebook
@pytest.mark.parametrize("path", WORKBOOK, ids=lambda p: p.name)
def test_notebook_executes_with_ci_parameters(path):
  result = workbook.run_notebook(path, profile="ci", out_dir=CI_OUT)
  if not result.ok:
    pytest.fail(result.describe(), pytrace=False)
