"""Every workbook notebook declares its parameters once, and stops at a bad one.

Fast (no kernel): each notebook's `parameters` cell follows the format of
`streamidx.lab.params` (a rule for every parameter but output_dir); the cell
after it is the one call `check_notebook(globals())`; the defaults and the
ci: values pass; the rules name the parameter, the rule and the value.

Slow (one Jupyter kernel per notebook): the real notebook is copied into a
scratch notebooks folder with one bad `ci:` value and run through the
workbook's command line (`--profile ci --only NAME`, in process). The run
must fail loudly: exit code 1, the notebook, the cell (the first code cell
after `parameters`), the parameter and its rule named, and no later cell run.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import nbformat
import pytest

from streamidx.lab import params, workbook

import tiers

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS_DIR = ROOT / "notebooks"
ALL_NOTEBOOKS = workbook.discover(NOTEBOOKS_DIR)

by_name = pytest.mark.parametrize("path", ALL_NOTEBOOKS, ids=lambda p: p.stem)


def check_cell(nb) -> tuple[int, int]:
  """(cells index, 1-based code cell number) of the cell after `parameters`."""
  index = workbook.parameters_cell_index(nb) + 1
  return index, sum(1 for c in nb["cells"][:index + 1] if c["cell_type"] == "code")


@by_name
def test_the_cell_after_parameters_is_one_check_notebook_call(path):
  nb = json.loads(path.read_text())
  cell = nb["cells"][check_cell(nb)[0]]
  code = [l for l in "".join(cell["source"]).splitlines()
          if l.strip() and not l.lstrip().startswith("#")]
  assert cell["cell_type"] == "code"
  if path.stem == "09_multichip":  # its virtual CPU devices, before JAX starts
    assert code[1] == "from streamidx.lab.studies.multichip import reserve_cpu_devices"
    assert code[2] == ("check_notebook(globals(), before_backend=lambda: "
                       "reserve_cpu_devices(num_data * num_context))")
    del code[1]
  else:
    assert code[1] == "check_notebook(globals())", code
  assert code[0] == "from streamidx.lab.params import check_notebook", code
  assert len(code) == 2


@by_name
def test_the_parameters_cell_declares_each_parameter_once_with_its_rule(path):
  source = params.cell_source(path)
  assert source.startswith(params.HEADER + " Per line: default | ci: CI size | "
                           "tpu: TPU size | rule: expression | what it is\n")
  decl = params.declarations(path)
  assert workbook.OUTPUT_DIR_PARAMETER in decl.parameters
  assert workbook.OUTPUT_DIR_PARAMETER not in decl.ci() | decl.tpu()
  missing = [n for n, p in decl.parameters.items()
             if p.rule is None and n != workbook.OUTPUT_DIR_PARAMETER]
  assert not missing, f"no rule: {missing}"
  assert decl.tpu() or decl.tpu_why, "no tpu: values and no `# TPU:` line saying why"


@by_name
def test_default_and_ci_parameters_pass(path):
  decl = params.declarations(path)
  params.check_notebook(decl.defaults(), path)
  params.check_notebook({**decl.defaults(), **decl.ci()}, path)


def test_the_format():
  decl = params.declarations(
      "# Parameters (papermill overrides these with -p).\n"
      "# TPU: none here, because\n#   the batch is the lesson\n"
      "output_dir = 'x'\n"
      "k = 32  # ci: 8 | rule: integer(k) and k >= 1 | top-k | per query\n"
      "# A section heading, not a description.\n"
      "page_size = 16  # tpu: 128 | rule: page_size % 4 == 0\n"
      "  # continued on an indented line\n")
  k, ps = decl.parameters["k"], decl.parameters["page_size"]
  assert (k.default, k.given, k.rule, k.text) == (
      32, {"ci": 8}, "integer(k) and k >= 1", "top-k | per query")
  assert (ps.given, ps.text) == ({"tpu": 128}, "continued on an indented line")
  assert decl.ci() == {"k": 8} and decl.tpu() == {"page_size": 128}
  assert decl.tpu_why == "none here, because the batch is the lesson"
  with pytest.raises(params.ParameterError, match=re.escape(
      "parameter 'k': its ci: field is not a Python literal: '4 * n'")):
    params.declarations("k = 1  # ci: 4 * n | rule: True\n")


def test_a_missing_parameter_and_a_missing_rule_are_named():
  path = NOTEBOOKS_DIR / "00_quickstart.ipynb"
  values = params.declarations(path).defaults()
  del values["page_size"]
  with pytest.raises(params.ParameterError, match="'page_size': missing"):
    params.check_notebook(values, path)
  with pytest.raises(params.ParameterError, match="'k': its line in the parameters cell has no"):
    params.check_notebook({"k": 1}, "k = 1  # top-k\n")


def test_outside_ipython_the_cell_must_be_given():
  with pytest.raises(params.ParameterError, match="no parameters cell"):
    params.check_notebook({})


@pytest.mark.parametrize("rule,value,ok", [
    ("pairs(x)", [[3, 5], [0, 0]], True), ("pairs(x)", [[5, 3]], False),
    ("pairs(x)", [[5]], False), ("pairs(x)", [], True),
    ("integers(x)", [], False), ("integers(x, empty=True)", [], True),
    ("integers(x)", [1, True], False), ("integer(x)", True, False), ("number(x)", 2.5, True),
    ("lanes(16, x)", 8, True), ("lanes(16, x)", 3, False), ("lanes(16, x)", [8, 0], False),
    ("lanes(128, x)", [1, 2, 3], True), ("lanes(16, x)", None, False),
    ("per_case(x)", [1, 2], False), ("per_case(x)", [1, 2, 3], True), ("per_case(x)", 8, False),
    ("choices(x, si.VARIANTS)", ["vendored"], True), ("choices(x, si.VARIANTS)", [], False),
    ("x in lab.hardware.GENERATIONS", "v5e", True), ("cdiv(x, 4) == 2", 5, True),
])
def test_rule_helpers(rule, value, ok):
  source = f"x = 0  # rule: {rule}\n"
  if ok:
    params.check_notebook({"x": value}, source)
  else:
    with pytest.raises(params.ParameterError, match=re.escape(
        f"notebook parameter 'x': breaks its rule `{rule}` (got {value!r})")):
      params.check_notebook({"x": value}, source)


def test_a_rule_that_raises_is_broken_and_says_why():
  with pytest.raises(params.ParameterError, match=re.escape(
      "'k': breaks its rule `k <= max(ks)` (got 3; ValueError: max() arg is an empty sequence)")):
    params.check_notebook({"k": 3, "ks": []}, "k = 1  # rule: k <= max(ks)\nks = [1]  # rule: True\n")


def _rule(stem, name):
  return params.declarations(NOTEBOOKS_DIR / f"{stem}.ipynb").parameters[name].rule


# One bad value per notebook.
BAD = [
    ("00_quickstart", "k", 0), ("00_quickstart", "fmt", "fp16"),
    ("01_cache_layout", "page_size", 6), ("03_kernel_walkthrough", "num_kv_pages_per_block", 4),
    ("02_fp8_packing", "num_records", 8), ("05_kernel_tiling", "run_kv_blocks", [8, 8, 3]),
    ("04_recall_parity", "parity_scope", "most"), ("08_tpu_profiling", "chip", "v9"),
    ("09_multichip", "num_context", 3), ("07_topk_selection", "tie_k", 4),
    ("06_compiled_variants", "aot_generations", ["v9"]),
]


def test_every_notebook_has_a_bad_parameter_case():
  assert {b[0] for b in BAD} == {p.stem for p in ALL_NOTEBOOKS}


def _message(stem, name, value):
  return f"notebook parameter {name!r}: breaks its rule `{_rule(stem, name)}` (got {value!r})"


@pytest.mark.parametrize("stem,name,value", BAD, ids=[f"{b[0]}-{b[1]}" for b in BAD])
def test_every_bad_parameter_case_is_refused_by_its_rules(stem, name, value):
  path = NOTEBOOKS_DIR / f"{stem}.ipynb"
  decl = params.declarations(path)
  with pytest.raises(params.ParameterError) as e:
    params.check_notebook({**decl.defaults(), **decl.ci(), name: value}, path)
  assert _message(stem, name, value) in str(e.value)


def with_ci(source: str, name: str, value) -> str:
  """`source` with `name`'s ci: field set to `value`."""
  lines = source.splitlines()
  i = next(i for i, l in enumerate(lines) if l.startswith(f"{name} = "))
  code, comment = lines[i].split("# ", 1)
  fields = [f for f in comment.split(" | ") if not f.startswith("ci:")]
  lines[i] = code + "# " + " | ".join([f"ci: {value!r}"] + fields)
  return "\n".join(lines)


# End to end, a kernel per case: in CI two notebooks (every check cell is
# the same call, checked above without a kernel); the rest in the full tier.
@pytest.mark.parametrize("stem,name,value", tiers.split(
    BAD, lambda b: b[:2] in (("00_quickstart", "k"), ("04_recall_parity", "parity_scope"))),
                         ids=[f"{b[0]}-{b[1]}" for b in BAD])
def test_a_bad_parameter_stops_the_notebook_at_its_check_cell(stem, name, value, tmp_path, capsys):
  path = NOTEBOOKS_DIR / f"{stem}.ipynb"
  folder = tmp_path / "notebooks"
  folder.mkdir()
  nb = nbformat.read(str(path), as_version=4)
  p = workbook.parameters_cell_index(nb)
  nb.cells[p].source = with_ci(nb.cells[p].source, name, value)
  nbformat.write(nb, str(folder / path.name))
  index, code_cell = check_cell(json.loads(path.read_text()))
  out = tmp_path / "build"

  code = workbook.main(["--profile", "ci", "--notebooks", str(folder), "--out", str(out),
                        "--only", stem, "--timeout", "120"])
  printed = capsys.readouterr().out

  assert code == 1
  assert f"{path.name} FAILED at code cell {code_cell} (cells[{index}]" in printed, printed
  assert f"ParameterError: {_message(stem, name, value)}" in printed, printed
  assert printed.rstrip().endswith("0 passed, 1 failed")
  # The check cell failed and no cell after it ran (the executed copy also
  # holds papermill's injected-parameters cell and error banners).
  executed = nbformat.read(str(out / path.name), as_version=4).cells
  status = [c.metadata.get("papermill", {}).get("status") for c in executed]
  failed = status.index("failed")
  assert executed[failed].source == nb.cells[index].source
  assert all(c.get("execution_count") is None for c in executed[failed + 1:])
