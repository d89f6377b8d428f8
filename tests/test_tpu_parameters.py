"""Every notebook scales its parameters up on a TPU through `check_notebook`.

A parameter's TPU size is the `tpu:` field of its line in the `parameters`
cell. Checked here, without a TPU: the TPU values pass the notebook's rules
(and the token-kernel batches fit VMEM by the tiling model); with the opt-in
STREAMIDX_TPU_SCALE=1 on the CPU the defaults are swapped and the values the
run set are kept (papermill's, also one equal to the default, and ones set
by hand), and parameters one rule ties scale only together; off-TPU, and
with STREAMIDX_TPU_SCALE=0 on a TPU, nothing changes. The last test runs a
notebook's first cells through papermill to see that its injected values are
recognised in a real kernel.
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
VMEM_BYTES = 16 * 2**20  # TPU v4's VMEM, the smallest of the generations

by_name = pytest.mark.parametrize("path", ALL_NOTEBOOKS, ids=lambda p: p.stem)


def decl(stem: str) -> params.Declarations:
  return params.declarations(NOTEBOOKS_DIR / f"{stem}.ipynb")


@pytest.fixture(autouse=True)
def _no_setting(monkeypatch):
  monkeypatch.delenv(params.TPU_SCALE_ENV, raising=False)


@by_name
def test_tpu_parameters_differ_from_the_defaults_and_pass_the_rules(path):
  d = params.declarations(path)
  for name, value in d.tpu().items():
    assert not params.same(value, d.parameters[name].default), name
  params.check(d, {**d.defaults(), **d.tpu()})


def _token_plan(batch, num_heads, kv, q):
  return tiling.plan(batch, fmt="fp8", num_heads=num_heads, num_kv_pages_per_block=kv,
                     num_queries_per_block=q)


def test_tpu_batches_of_the_token_kernel_fit_vmem():
  d = decl("00_quickstart")
  p = {**d.defaults(), **d.tpu()}
  batch = si.make_mixed_batch(decode=p["decode_seq_lens"], prefill=[tuple(x) for x in p["prefill"]],
                              mixed=[tuple(x) for x in p["mixed"]], page_size=p["page_size"],
                              compression_ratio=p["compression_ratio"])
  bq = p["num_queries_per_block"]
  quick = _token_plan(batch, p["num_heads"], p["num_kv_pages_per_block"], (1, bq, bq))
  assert 0 < quick.vmem_bytes <= VMEM_BYTES, quick.vmem_bytes
  # 04's kernel check on the long-context batch (its cell's block sizes: 8 pages, bq 8).
  d = decl("04_recall_parity")
  r = {**d.defaults(), **d.tpu()}
  long = si.make_batch([(r["long_rows"], n * r["long_ratio"]) for n in r["long_entries"]],
                       page_size=r["long_page_size"], compression_ratio=r["long_ratio"],
                       max_num_seqs=max(2, len(r["long_entries"])))
  plan = _token_plan(long, r["num_heads"], 8, (1, 8, 8))
  assert 0 < plan.vmem_bytes <= VMEM_BYTES, plan.vmem_bytes


def test_tpu_points_of_08_are_token_calls_that_fit_a_v5e():
  """08 measures its `points` on a TPU: every token variant at DeepSeek-V4
  decode with 64 heads, with v5e's default method and with the sort; no
  page-mode point (at 64 heads it overflowed a v5e's VMEM); each call's plan
  at v5e's block-size row fits VMEM by the tiling model."""
  from streamidx.lab.bench import record
  d = decl("08_tpu_profiling")
  points = record.points({**d.defaults(), **d.tpu()}["points"])
  assert {p.variant for p in points} == {
      name for name, v in si.VARIANTS.items() if v.mode == "token"}
  assert {p.method for p in points} == {si.topk.default_method("v5e"), "sort"}
  for p in points:
    s = p.shape
    assert p.mode == "decode" and s.num_heads == 64 and s.k == 512, p.name
    row = si.block_sizes(p.variant, cache_format=p.cache_format, num_heads=s.num_heads,
                         page_size=s.page_size, generation="v5e")
    plan = tiling.plan(s.batch(), fmt=p.cache_format, num_heads=s.num_heads, head_dim=s.head_dim,
                       variant=p.variant, **row.kwargs())
    assert 0 < plan.vmem_bytes <= VMEM_BYTES, (p.name, plan.vmem_bytes)


def test_one_rule_ties_parameters_to_scale_together():
  assert params.tied(decl("00_quickstart")) == [{"page_size", "num_kv_pages_per_block"}]
  assert params.tied(decl("04_recall_parity")) == [{"page_entries", "page_rows"}]
  assert params.tied(decl("02_fp8_packing")) == []


def papermill_cell(**values) -> str:
  """The source papermill injects (its "# Parameters" header, then values)."""
  return "# Parameters\n" + "".join(f"{n} = {v!r}\n" for n, v in values.items())


def test_opt_in_off_tpu_swaps_defaults_and_keeps_what_the_run_set(monkeypatch, capsys):
  path = NOTEBOOKS_DIR / "00_quickstart.ipynb"
  d = params.declarations(path)
  ns = d.defaults()
  ns.update(k=8, page_size=16)  # injected by papermill; page_size is its default
  ns["num_heads"] = 32          # set by hand, after the parameters cell
  ns["In"] = ["", params.cell_source(path), papermill_cell(k=8, page_size=16, output_dir="x")]
  monkeypatch.setenv(params.TPU_SCALE_ENV, "1")

  params.check_notebook(ns)  # the parameters cell from the kernel's history
  line = capsys.readouterr().out

  tpu = d.tpu()
  kept = {"k", "page_size", "num_heads", "num_kv_pages_per_block"}
  for name in set(tpu) - kept:
    assert ns[name] == tpu[name], name
  # num_kv_pages_per_block scales together with page_size (its rule names it).
  assert (ns["k"], ns["page_size"], ns["num_heads"], ns["num_kv_pages_per_block"]) == (8, 16, 32, 8)
  assert ns["fmt"] == d.parameters["fmt"].default  # no TPU size: untouched
  assert line.count("\n") == 1 and line.startswith(
      "TPU sizes (STREAMIDX_TPU_SCALE=1, JAX backend cpu): ")
  assert "decode_seq_lens [900, 2048, 300, 1500, 64] -> [4096, 16384, 32768, 131072, 8192]" in line
  assert "k (set by papermill)" in line and "page_size (set by papermill)" in line
  assert "num_heads (set by hand: not the default 16)" in line
  assert "num_kv_pages_per_block (with page_size)" in line
  assert re.search(workbook.MACHINE_PATTERN, line), line  # the machine, as describe_machine says it


def test_off_tpu_nothing_changes_and_nothing_is_printed(capsys):
  for path in ALL_NOTEBOOKS:
    ns = params.declarations(path).defaults()
    before = json.dumps(ns, sort_keys=True, default=repr)
    params.check_notebook(ns, path)
    assert json.dumps(ns, sort_keys=True, default=repr) == before, path.name
  assert capsys.readouterr().out == ""


def test_on_a_tpu_it_scales_unless_turned_off():
  d = decl("04_recall_parity")
  ns = d.defaults()
  on = params.tpu_scaling(d, ns, backend="tpu", environ={})
  assert on.reason == "the JAX backend is tpu" and on.values == d.tpu()
  assert params.tpu_scaling(d, ns, backend="tpu", environ={params.TPU_SCALE_ENV: "0"}) is None
  assert params.tpu_scaling(d, ns, backend="cpu", environ={}) is None
  with pytest.raises(ValueError, match=re.escape(
      "STREAMIDX_TPU_SCALE: must be 0 (never scale), 1 (scale off-TPU too) or "
      "auto/unset (scale on a TPU) (got 'yes')")):
    params.tpu_scaling(d, ns, environ={params.TPU_SCALE_ENV: "yes"})


def test_a_notebook_without_tpu_sizes_says_why():
  d = decl("01_cache_layout")
  s = params.tpu_scaling(d, d.defaults(), backend="tpu", environ={})
  assert not s.values and s.note == d.tpu_why
  assert s.line("M").startswith("TPU sizes (the JAX backend is tpu): none applied: its "
                                "kernel calls run inside")


def test_rerunning_the_check_leaves_tpu_values_alone(monkeypatch, capsys):
  path = NOTEBOOKS_DIR / "02_fp8_packing.ipynb"
  ns = params.declarations(path).defaults()
  monkeypatch.setenv(params.TPU_SCALE_ENV, "1")
  params.check_notebook(ns, path)
  params.check_notebook(ns, path)
  second = capsys.readouterr().out.splitlines()[1]
  assert "none applied; already at TPU size: query_tokens, contexts, num_records, num_seeds" in second


def test_scaled_values_that_break_a_rule_name_the_tpu_sizes(monkeypatch):
  cell = ("page_size = 16  # rule: True\n"
          "num_kv_pages_per_block = 8  # tpu: 3 | rule: lanes(page_size, num_kv_pages_per_block)\n")
  ns = {"page_size": 16, "num_kv_pages_per_block": 8}
  monkeypatch.setenv(params.TPU_SCALE_ENV, "1")
  with pytest.raises(params.ParameterError, match=re.escape(
      "(got 3) [with the TPU sizes of num_kv_pages_per_block; STREAMIDX_TPU_SCALE=0 runs "
      "without them]")):
    params.check_notebook(ns, cell)
  assert ns["num_kv_pages_per_block"] == 8  # nothing written when the check fails


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
