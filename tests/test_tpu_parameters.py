"""Every notebook scales its parameters up on a TPU through `check_notebook`.

notebooks/tpu_parameters.json gives, per notebook, the TPU value of each
parameter it scales with the default it replaces. Checked here, without a
TPU: the table names each notebook and only parameters its `parameters` cell
declares, with that cell's defaults; the TPU values pass the notebook's
rules (and the token-kernel batches fit VMEM by the tiling model); with the
opt-in STREAMIDX_TPU_SCALE=1 on the CPU the defaults are swapped and values
the run set are kept (papermill's, also one equal to the default, and ones set
by hand); off-TPU, and with STREAMIDX_TPU_SCALE=0 on a TPU, nothing changes.
The last test runs a notebook through papermill to see that its injected
values are recognised in a real kernel.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import nbformat
import pytest

import streamidx as si
from streamidx.lab import params, workbook
from streamidx.lab.model import tiling

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS_DIR = ROOT / "notebooks"
ALL_NOTEBOOKS = workbook.discover(NOTEBOOKS_DIR)
TABLE_PATH = NOTEBOOKS_DIR / params.TPU_PARAMETERS_FILE
TABLE = params.load_tpu_parameters(TABLE_PATH)
VMEM_BYTES = 16 * 2**20  # TPU v4's VMEM, the smallest of the generations

by_name = pytest.mark.parametrize("path", ALL_NOTEBOOKS, ids=lambda p: p.stem)


default_parameters = workbook.default_parameters


def tpu_values(path: Path) -> dict:
  return {n: s["tpu"] for n, s in TABLE[path.name]["parameters"].items()}


@pytest.fixture(autouse=True)
def _no_setting(monkeypatch):
  monkeypatch.delenv(params.TPU_SCALE_ENV, raising=False)


def test_the_table_has_one_entry_per_notebook():
  assert sorted(TABLE) == sorted(p.name for p in ALL_NOTEBOOKS)


@by_name
def test_the_table_names_only_declared_parameters_with_their_defaults(path):
  declared = workbook.declared_parameters(path)
  defaults = default_parameters(path)
  entry = TABLE[path.name]["parameters"]
  assert not set(entry) - declared, sorted(set(entry) - declared)
  assert workbook.OUTPUT_DIR_PARAMETER not in entry
  for name, spec in entry.items():
    assert params._same(spec["default"], defaults[name]), (  # pylint: disable=protected-access
        f"{path.name} {name}: the table's default {spec['default']!r} is not "
        f"the parameters cell's {defaults[name]!r}: update {TABLE_PATH.name}")
    assert not params._same(spec["tpu"], spec["default"]), name  # pylint: disable=protected-access


@by_name
def test_tpu_parameters_pass_the_notebook_rules(path):
  values = {**default_parameters(path), **tpu_values(path)}
  params.rules(path.stem)(params.Parameters(values, path.stem))


def _token_plan(batch, num_heads, kv, q):
  return tiling.plan(batch, fmt="fp8", num_heads=num_heads, num_kv_pages_per_block=kv,
                     num_queries_per_block=q)


def test_tpu_batches_of_the_token_kernel_fit_vmem():
  p = {**default_parameters(NOTEBOOKS_DIR / "00_quickstart.ipynb"),
       **tpu_values(NOTEBOOKS_DIR / "00_quickstart.ipynb")}
  batch = si.make_mixed_batch(decode=p["decode_seq_lens"], prefill=[tuple(x) for x in p["prefill"]],
                              mixed=[tuple(x) for x in p["mixed"]], page_size=p["page_size"],
                              compression_ratio=p["compression_ratio"])
  bq = p["num_queries_per_block"]
  quick = _token_plan(batch, p["num_heads"], p["num_kv_pages_per_block"], (1, bq, bq))
  assert 0 < quick.vmem_bytes <= VMEM_BYTES, quick.vmem_bytes
  # 05's kernel check on the long-context batch (its cell's block sizes: 8 pages, bq 8).
  r = {**default_parameters(NOTEBOOKS_DIR / "05_recall_parity.ipynb"),
       **tpu_values(NOTEBOOKS_DIR / "05_recall_parity.ipynb")}
  long = si.make_batch([(r["long_rows"], n * r["long_ratio"]) for n in r["long_entries"]],
                       page_size=r["long_page_size"], compression_ratio=r["long_ratio"],
                       max_num_seqs=max(2, len(r["long_entries"])))
  plan = _token_plan(long, r["num_heads"], 8, (1, 8, 8))
  assert 0 < plan.vmem_bytes <= VMEM_BYTES, plan.vmem_bytes


def papermill_cell(**values) -> str:
  """The source papermill injects (its "# Parameters" header, then values)."""
  return "# Parameters\n" + "".join(f"{n} = {v!r}\n" for n, v in values.items())


def test_opt_in_off_tpu_swaps_defaults_and_keeps_what_the_run_set(monkeypatch, capsys):
  path = NOTEBOOKS_DIR / "00_quickstart.ipynb"
  defaults = default_parameters(path)
  ns = dict(defaults)
  ns.update(k=8, page_size=16)  # injected by papermill; page_size is its default
  ns["num_heads"] = 32          # set by hand in the parameters cell
  ns["In"] = ["", "# Parameters (papermill overrides these with -p).\n...",
              papermill_cell(k=8, page_size=16, output_dir="x")]
  monkeypatch.setenv(params.TPU_SCALE_ENV, "1")

  params.check_notebook("00_quickstart", ns)
  line = capsys.readouterr().out

  tpu = tpu_values(path)
  kept = {"k", "page_size", "num_heads", "num_kv_pages_per_block"}
  for name in set(tpu) - kept:
    assert ns[name] == tpu[name], name
  # num_kv_pages_per_block scales together with page_size (one rule ties them).
  assert (ns["k"], ns["page_size"], ns["num_heads"], ns["num_kv_pages_per_block"]) == (8, 16, 32, 8)
  assert ns["fmt"] == defaults["fmt"]  # no TPU size: untouched
  assert line.count("\n") == 1 and line.startswith(
      "TPU sizes for 00_quickstart (STREAMIDX_TPU_SCALE=1, JAX backend cpu; ")
  assert "decode_seq_lens [900, 2048, 300, 1500, 64] -> [4096, 16384, 32768, 131072, 8192]" in line
  assert "k (set by papermill)" in line and "page_size (set by papermill)" in line
  assert "num_heads (set by hand: not the default 16)" in line
  assert "num_kv_pages_per_block (with page_size)" in line
  assert re.search(workbook.MACHINE_PATTERN, line), line  # the machine, as describe_machine says it


def test_off_tpu_nothing_changes_and_nothing_is_printed(capsys):
  for path in ALL_NOTEBOOKS:
    ns = default_parameters(path)
    before = json.dumps(ns, sort_keys=True, default=repr)
    params.check_notebook(path.stem, ns)
    assert json.dumps(ns, sort_keys=True, default=repr) == before, path.name
  assert capsys.readouterr().out == ""


def test_on_a_tpu_it_scales_unless_turned_off():
  ns = default_parameters(NOTEBOOKS_DIR / "05_recall_parity.ipynb")
  on = params.tpu_scaling("05_recall_parity", ns, backend="tpu", environ={})
  assert on.reason == "the JAX backend is tpu"
  assert on.values == tpu_values(NOTEBOOKS_DIR / "05_recall_parity.ipynb")
  assert params.tpu_scaling("05_recall_parity", ns, backend="tpu",
                            environ={params.TPU_SCALE_ENV: "0"}) is None
  assert params.tpu_scaling("05_recall_parity", ns, backend="cpu", environ={}) is None
  with pytest.raises(ValueError, match=re.escape(
      "STREAMIDX_TPU_SCALE: must be 0 (never scale), 1 (scale off-TPU too) or "
      "auto/unset (scale on a TPU) (got 'yes')")):
    params.tpu_scaling("05_recall_parity", ns, environ={params.TPU_SCALE_ENV: "yes"})


def test_a_notebook_without_tpu_sizes_says_why():
  ns = default_parameters(NOTEBOOKS_DIR / "02_cache_layout.ipynb")
  s = params.tpu_scaling("02_cache_layout", ns, backend="tpu", environ={})
  assert not s.values and s.note == TABLE["02_cache_layout.ipynb"]["why"]
  assert s.line("M").startswith("TPU sizes for 02_cache_layout (the JAX backend is "
                                "tpu): none applied: its kernel calls run inside")


def test_rerunning_the_check_leaves_tpu_values_alone(monkeypatch, capsys):
  ns = default_parameters(NOTEBOOKS_DIR / "03_fp8_packing.ipynb")
  monkeypatch.setenv(params.TPU_SCALE_ENV, "1")
  params.check_notebook("03_fp8_packing", ns)
  params.check_notebook("03_fp8_packing", ns)
  second = capsys.readouterr().out.splitlines()[1]
  assert "none applied; already at TPU size: query_tokens, num_seeds, contexts, num_records" in second


def test_scaled_values_that_break_a_rule_name_the_table(monkeypatch, tmp_path):
  ns = default_parameters(NOTEBOOKS_DIR / "00_quickstart.ipynb")
  (tmp_path / params.TPU_PARAMETERS_FILE).write_text(json.dumps({"00_quickstart.ipynb": {
      "why": "test", "parameters": {"num_kv_pages_per_block": {"default": 8, "tpu": 3}}}}))
  monkeypatch.chdir(tmp_path)  # the working folder's table comes first
  monkeypatch.setenv(params.TPU_SCALE_ENV, "1")
  with pytest.raises(params.ParameterError, match=re.escape(
      "(got 3) [with the TPU sizes of num_kv_pages_per_block from "
      f"{tmp_path / params.TPU_PARAMETERS_FILE}; STREAMIDX_TPU_SCALE=0 runs without them]")):
    params.check_notebook("00_quickstart", ns)
  assert ns["num_kv_pages_per_block"] == 8  # nothing written when the check fails


def test_a_malformed_table_is_named(tmp_path):
  bad = tmp_path / "t.json"
  bad.write_text(json.dumps({"00_quickstart.ipynb": {"why": "x", "parameters": {"k": 512}}}))
  with pytest.raises(ValueError, match=re.escape(
      f'{bad}: 00_quickstart.ipynb k: must be {{"default": value, "tpu": value}}')):
    params.load_tpu_parameters(bad)


def test_papermill_injected_values_are_kept_in_a_real_kernel(tmp_path, monkeypatch):
  papermill = pytest.importorskip("papermill")
  source = nbformat.read(str(NOTEBOOKS_DIR / "00_quickstart.ipynb"), as_version=4)
  index = workbook.parameters_cell_index(source)
  nb = nbformat.v4.new_notebook(metadata=source.metadata)
  nb.cells = [source.cells[index], source.cells[index + 1], nbformat.v4.new_code_cell(
      "print('VALUES', k, num_heads, page_size)")]
  (tmp_path / "00_quickstart.ipynb").write_text(nbformat.writes(nb))
  monkeypatch.setenv(params.TPU_SCALE_ENV, "1")  # the kernel inherits it
  papermill.execute_notebook(str(tmp_path / "00_quickstart.ipynb"), str(tmp_path / "out.ipynb"),
                             parameters={"k": 32, "num_heads": 4}, kernel_name=workbook.KERNEL_NAME,
                             cwd=str(tmp_path), progress_bar=False)
  out = nbformat.read(str(tmp_path / "out.ipynb"), as_version=4)
  text = "".join(o.get("text", "") for c in out.cells if c.cell_type == "code" for o in c.outputs)
  # k = 32 is its default, passed with -p: kept; page_size is not passed: scaled.
  assert "VALUES 32 4 128" in text, text
  assert "num_heads (set by papermill)" in text and "k (set by papermill)" in text, text
  assert "page_size 16 -> 128" in text, text
