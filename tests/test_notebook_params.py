"""Every workbook notebook checks its parameters, and stops at a bad one.

Fast (no kernel): each notebook's cell after `parameters` is the one call
`check_notebook("<its name>", globals())`; its rules in
`streamidx.lab.params.NOTEBOOKS` cover exactly the parameters its
`parameters` cell declares; the default and the CI parameters pass.

Slow (one Jupyter kernel per notebook): the real notebook is copied,
untouched, into a scratch notebooks folder whose `ci_parameters.json` entry
is the real one with one bad value, and run through the workbook's command
line (`python -m streamidx.workbook --profile ci --only NAME`, in process).
The run must fail loudly: exit code 1, the notebook named, the cell named
(the first code cell after `parameters`), the parameter and its rule in the
message, and no cell after the check executed.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import nbformat
import pytest

from streamidx.lab import params, workbook

import tiers

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS_DIR = ROOT / "notebooks"
ALL_NOTEBOOKS = workbook.discover(NOTEBOOKS_DIR)
CI_TABLE = json.loads((NOTEBOOKS_DIR / workbook.CI_PARAMETERS_FILE).read_text())

by_name = pytest.mark.parametrize("path", ALL_NOTEBOOKS, ids=lambda p: p.stem)


def check_cell(nb) -> tuple[int, int]:
  """(cells index, 1-based code cell number) of the cell after `parameters`."""
  p = workbook.parameters_cell_index(nb)
  index = p + 1
  code_cell = sum(1 for c in nb["cells"][:index + 1]
                  if c["cell_type"] == "code")
  return index, code_cell


default_parameters = workbook.default_parameters


@by_name
def test_the_cell_after_parameters_is_one_check_notebook_call(path):
  nb = json.loads(path.read_text())
  index, _ = check_cell(nb)
  cell = nb["cells"][index]
  code = [l for l in "".join(cell["source"]).splitlines()
          if l.strip() and not l.lstrip().startswith("#")]
  assert cell["cell_type"] == "code"
  assert code == ["from streamidx.lab.params import check_notebook",
                  f'check_notebook("{path.stem}", globals())'], code


@by_name
def test_rules_cover_exactly_the_declared_parameters(path):
  p = params.Parameters(default_parameters(path), path.stem)
  params.rules(path.stem)(p)
  declared = workbook.declared_parameters(path)
  assert sorted(p.checked) == sorted(declared), (
      f"no rule for {sorted(declared - set(p.checked))}; rules for undeclared "
      f"{sorted(set(p.checked) - declared)}")


@by_name
def test_default_and_ci_parameters_pass(path):
  defaults = default_parameters(path)
  params.check_notebook(path.stem, defaults)
  params.check_notebook(path.name, {**defaults, **CI_TABLE[path.name]})


def test_a_missing_parameter_is_named():
  values = default_parameters(NOTEBOOKS_DIR / "00_quickstart.ipynb")
  del values["page_size"]
  with pytest.raises(params.ParameterError, match="'page_size': missing"):
    params.check_notebook("00_quickstart", values)


def test_an_unknown_notebook_has_no_rules():
  with pytest.raises(ValueError, match="no parameter rules for '99_x'"):
    params.check_notebook("99_x", {})


@pytest.mark.parametrize("rule,value,message", [
    ("pairs", [[5, 3]], "'prefill[0] q_len': must be <= 3 (got 5)"),
    ("pairs", [[5]], "'prefill[0]': must be [q_len, seq_len] (got [5])"),
    ("lane_blocks", 3, "'num_kv_pages_per_block': page_size * "
     "num_kv_pages_per_block must be a multiple of 128, so a multiple of 8 "
     "at page_size 16 (got 3)"),
    ("lane_blocks", [8, 0], "'num_kv_pages_per_block[1]': must be >= 1"),
    ("per_case", [1, 2], "'len(num_kv_pages_per_block)': must be >= 3 (got 2)"),
])
def test_compound_rules_name_the_item_and_the_rule(rule, value, message):
  name = "prefill" if rule == "pairs" else "num_kv_pages_per_block"
  p = params.Parameters({"page_size": 16, name: value}, "test")
  with pytest.raises(params.ParameterError, match=re.escape(message)):
    getattr(p, rule)(name)


def test_block_sizes_may_be_none_for_the_block_size_table_row():
  p = params.Parameters({"page_size": 16, "num_kv_pages_per_block": None},
                        "test")
  assert p.per_case_or_table("num_kv_pages_per_block", lanes=True) is None
  assert p.checked == ["num_kv_pages_per_block"]
  p = params.Parameters({"page_size": 16, "num_kv_pages_per_block": [8, 3, 8]},
                        "test")
  with pytest.raises(params.ParameterError, match=re.escape(
      "'num_kv_pages_per_block[1]': page_size * num_kv_pages_per_block")):
    p.per_case_or_table("num_kv_pages_per_block", lanes=True)


# One bad value per notebook, and what the run must print after
# "ParameterError: notebook parameter ".
BAD = [
    ("00_quickstart", "k", 0, "'k': must be >= 1 (got 0)"),
    ("00_quickstart", "fmt", "fp16",
     "'fmt': must be one of ('fp8', 'bf16') (got 'fp16')"),
    ("02_cache_layout", "page_size", 6,
     "'page_size': must be a multiple of 4 (got 6)"),
    ("01_kernel_walkthrough", "num_kv_pages_per_block", 4,
     "'num_kv_pages_per_block': page_size * num_kv_pages_per_block must be a "
     "multiple of 128, so a multiple of 8 at page_size 16 (got 4)"),
    ("03_fp8_packing", "num_records", 8, "'num_records': must be >= 16 (got 8)"),
    ("04_kernel_tiling", "run_kv_blocks", [8, 8, 3],
     "'run_kv_blocks[2]': run_page_size * run_kv_blocks must be a multiple of "
     "128, so a multiple of 8 at run_page_size 16 (got 3)"),
    ("05_recall_parity", "parity_scope", "most",
     "'parity_scope': must be one of ('ci', 'pairwise', 'full', 'tests') "
     "(got 'most')"),
    ("06_tpu_profiling", "modes", ["token", "tile"],
     "'modes[1]': must be one of ('token', 'page') (got 'tile')"),
    ("07_multichip", "num_context", 3,
     "'num_context': must be a power of two (the 2-D layout's tree merge) "
     "(got 3)"),
]


def test_every_notebook_has_a_bad_parameter_case():
  assert {b[0] for b in BAD} == {p.stem for p in ALL_NOTEBOOKS}


@pytest.mark.parametrize("stem,name,value,message", BAD,
                         ids=[f"{b[0]}-{b[1]}" for b in BAD])
def test_every_bad_parameter_case_is_refused_by_its_rules(stem, name, value,
                                                          message):
  path = NOTEBOOKS_DIR / f"{stem}.ipynb"
  values = {**default_parameters(path), **CI_TABLE[path.name], name: value}
  with pytest.raises(params.ParameterError) as e:
    params.check_notebook(stem, values)
  assert f"notebook parameter {message}" in str(e.value)


# End to end, a kernel per case: in CI two notebooks (every notebook's check
# cell is the same call, checked above without a kernel); the others in the
# full tier (tests/tiers.py).
@pytest.mark.parametrize("stem,name,value,message", tiers.split(
    BAD, lambda b: b[:2] in (("00_quickstart", "k"),
                             ("05_recall_parity", "parity_scope"))),
                         ids=[f"{b[0]}-{b[1]}" for b in BAD])
def test_a_bad_parameter_stops_the_notebook_at_its_check_cell(
    stem, name, value, message, tmp_path, capsys):
  path = NOTEBOOKS_DIR / f"{stem}.ipynb"
  folder = tmp_path / "notebooks"
  folder.mkdir()
  shutil.copy(path, folder / path.name)
  bad = {**CI_TABLE[path.name], name: value}
  (folder / workbook.CI_PARAMETERS_FILE).write_text(
      json.dumps({path.name: bad}))
  source = json.loads(path.read_text())
  index, code_cell = check_cell(source)
  out = tmp_path / "build"

  code = workbook.main(["--profile", "ci", "--notebooks", str(folder),
                        "--out", str(out), "--only", stem,
                        "--timeout", "120"])
  printed = capsys.readouterr().out

  assert code == 1
  assert (f"{path.name} FAILED at code cell {code_cell} "
          f"(cells[{index}]") in printed, printed
  assert f"ParameterError: notebook parameter {message}" in printed, printed
  assert printed.rstrip().endswith("0 passed, 1 failed")
  # The check cell failed and no cell after it ran (the executed copy also
  # holds papermill's injected-parameters cell and error banners).
  executed = nbformat.read(str(out / path.name), as_version=4).cells
  status = [c.metadata.get("papermill", {}).get("status") for c in executed]
  failed = status.index("failed")
  assert executed[failed].source == "".join(source["cells"][index]["source"])
  assert all(c.get("execution_count") is None for c in executed[failed + 1:])
