"""streamidx.lab.walkthrough: the kernel walkthrough notebook's helpers.

Source excerpts carry the file's own line numbers; the ledger parser finds
every M<n> entry of the vendored kernel's header and every marker line in its
body; score checks pass within twice the derived bound and fail beyond it or
on a different -inf pattern; the tables agree with the tiling model; the
walkthrough notebook has more prose than code; and the compile check of its
section 6 gives the TPU compiler's verdict, under which the notebook's own
teaching kernels (executed from its cells) compile for v5e and v6e (libtpu).
"""

from __future__ import annotations

import inspect
import json
import re
from pathlib import Path

import numpy as np
import pytest

import streamidx as si
from streamidx import semantics
from streamidx.kernels import vendored
from streamidx.lab import walkthrough
from streamidx.lab.model import tiling

ROOT = Path(__file__).resolve().parents[1]
WALKTHROUGH = ROOT / "notebooks" / "01_kernel_walkthrough.ipynb"


def file_lines(module):
  return inspect.getsource(module).splitlines()


# --- excerpts ----------------------------------------------------------------


def test_excerpt_of_a_nested_function_has_the_files_line_numbers():
  ex = walkthrough.excerpt(vendored, "_scores_kernel._fetch_bkv")
  lines = file_lines(vendored)
  assert ex.path == "streamidx/kernels/vendored.py"
  assert ex.lines[0].strip().startswith("def _fetch_bkv(")
  assert list(ex.lines) == lines[ex.first - 1:ex.last]
  assert f"{ex.first} | " in str(ex) and f"{ex.last} | " in str(ex)


def test_excerpt_of_a_decorated_function_starts_at_its_decorator():
  ex = walkthrough.excerpt(vendored, "streamindex_topk")
  assert ex.lines[0].startswith("@functools.partial")


def test_excerpt_cut_by_start_and_stop_strings():
  ex = walkthrough.excerpt(vendored, "streamindex_topk",
                           start="for launch in semantics.token_launches",
                           stop="case=_MLA_CASE")
  assert "token_launches" in ex.lines[0] and "_MLA_CASE" in ex.lines[-1]
  assert ex.last - ex.first + 1 == len(ex.lines)


def test_excerpt_rejects_unknown_names_and_strings():
  with pytest.raises(ValueError, match="qualname: no definition 'nope'"):
    walkthrough.excerpt(vendored, "_scores_kernel.nope")
  with pytest.raises(ValueError, match="start:"):
    walkthrough.excerpt(vendored, "_scores_kernel.load_bkv", start="no such")


def test_matching_lines_numbers_the_file():
  hits = walkthrough.matching_lines(vendored, r"def _scores_kernel\(")
  assert len(hits) == 1
  n, text = hits[0]
  assert file_lines(vendored)[n - 1].strip() == text


# --- the ledger --------------------------------------------------------------


def test_ledger_lists_every_entry_of_the_vendored_header_in_order():
  header = []
  for line in file_lines(vendored):
    if not line.startswith("#"):
      break
    header.append(line)
  tags = re.findall(r"^# (M\d+)\s", "\n".join(header), flags=re.M)
  entries = walkthrough.ledger(vendored)
  assert [e.tag for e in entries] == tags
  assert tags[:6] == ["M1", "M2", "M3", "M4", "M5", "M6"]
  for e in entries:
    assert e.title and e.text.startswith(e.title)


def test_ledger_marker_lines_carry_their_tag():
  lines = file_lines(vendored)
  for e in walkthrough.ledger(vendored):
    for n in e.marker_lines:
      assert "streamidx (" in lines[n - 1] and e.tag in lines[n - 1]
  m3 = {e.tag: e for e in walkthrough.ledger(vendored)}["M3"]
  assert m3.marker_lines, "M3 is marked in the kernel body"


def test_ledger_parses_a_synthetic_header(tmp_path, monkeypatch):
  source = ("# header\n"
            "# M1  First change. It does\n"
            "#     two things.\n"
            "# M2  Second change.\n"
            "\"\"\"doc\"\"\"\n"
            "x = 1  # streamidx (M2)\n"
            "y = 2  # streamidx (M1, M2)\n")

  class FakeModule:
    __name__ = "fake"

  monkeypatch.setattr(inspect, "getsource", lambda m: source)
  entries = walkthrough.ledger(FakeModule)
  assert [(e.tag, e.title, e.text, e.marker_lines) for e in entries] == [
      ("M1", "First change.", "First change. It does two things.", (7,)),
      ("M2", "Second change.", "Second change.", (6, 7)),
  ]


# --- score checks ------------------------------------------------------------


def scores(rows=3, cols=6, seed=0):
  rng = np.random.default_rng(seed)
  s = rng.standard_normal((rows, cols)).astype(np.float32)
  s[:, -2:] = -np.inf
  return s


def test_check_scores_passes_within_twice_the_bound():
  want = scores()
  got = want.copy()
  got[0, 0] += 1.9e-3
  c = walkthrough.check_scores(got, want, np.full(3, 1e-3))
  assert c.ok and c.same_mask and 0.9 < c.max_ratio < 1.0
  assert c.visible == 3 * 4


def test_check_scores_fails_beyond_twice_the_bound():
  want = scores()
  got = want.copy()
  got[1, 2] += 2.1e-3
  c = walkthrough.check_scores(got, want, np.full(3, 1e-3))
  assert not c.ok and c.same_mask and c.max_ratio > 1.0


def test_check_scores_fails_on_a_different_mask_or_nan():
  want = scores()
  got = want.copy()
  got[2, -1] = 0.5
  assert not walkthrough.check_scores(got, want, 1.0).ok
  got = want.copy()
  got[0, 0] = np.nan
  assert not walkthrough.check_scores(got, want, 1.0).ok


def test_check_scores_ignores_extra_columns_and_rejects_fewer():
  want = scores()
  got = np.concatenate([want, np.zeros((3, 2), np.float32)], axis=1)
  assert walkthrough.check_scores(got, want, 0.0).ok
  with pytest.raises(ValueError, match="got: fewer columns"):
    walkthrough.check_scores(want[:, :3], want, 0.0)


def test_score_checks_add_prints_and_raises(capsys):
  checks = walkthrough.ScoreChecks()
  want = scores()
  checks.add("same", want, want, 0.0)
  assert "same: 3 rows x 6 entries" in capsys.readouterr().out
  with pytest.raises(AssertionError, match="off:"):
    checks.add("off", want + 1.0, want, 1e-3)
  assert list(checks) == ["same", "off"] and not checks["off"].ok


# --- tables ------------------------------------------------------------------


def small_batch():
  return si.make_mixed_batch(decode=[700, 1500, 333, 64, 900],
                             prefill=[(12, 300)], mixed=[(5, 260)],
                             page_size=16, compression_ratio=4)


def test_launch_rows_sum_to_the_plans_counts():
  p = tiling.plan(small_batch(), num_heads=4, num_kv_pages_per_block=8,
                  num_queries_per_block=(1, 8, 8), decode_req_batch_size=4)
  rows = walkthrough.launch_rows(p)
  counts = p.counts()
  assert [r["launch"] for r in rows] == list(tiling.TOKEN_CASES)
  assert sum(r["kv_page_dmas"] for r in rows) == counts["dma_kv"]
  assert sum(r["steps"] for r in rows) == counts["steps"]


def test_block_size_rows_skip_illegal_blocks_and_grow_the_buffer():
  rows = walkthrough.block_size_rows(
      small_batch(), (4, 8, 16), fmt="fp8", num_heads=4,
      num_kv_pages_per_block=8, num_queries_per_block=8,
      decode_req_batch_size=4)
  assert [r["bkv_p"] for r in rows] == [8, 16]  # 16 * 4 is not a multiple of 128
  assert rows[1]["kv_buffer_kib"] == 2 * rows[0]["kv_buffer_kib"]
  assert rows[1]["decode_steps"] <= rows[0]["decode_steps"]


def test_decode_step_cost_counts_whole_blocks():
  c = walkthrough.decode_step_cost(2, 4096 * 4, generation="v6e")
  entries = 4096
  assert c["entries"] == entries and c["cache_bytes"] == 2 * entries * 256
  bkv = c["bkv_p"] * 128
  assert c["kv_bytes_read"] == 2 * semantics.cdiv(entries, bkv) * bkv * 256
  assert c["score_bytes"] > 0 and c["scale_apart_bytes"] == 2 * entries * 129
  assert c["intensity"] < c["ridge"] and 0 < c["kernel_s"] <= c["call_s"]


def test_causal_rule_rows_leak_unless_the_block_is_complete():
  rows = walkthrough.causal_rule_rows(4, range(8))
  assert [r["leaks"] for r in rows] == [True, True, True, False] * 2
  assert rows[0]["seen_model"] == "none" and rows[7]["seen_model"] == "0..1"


# --- races -------------------------------------------------------------------


def test_capture_races_keeps_reports_out_of_stdout(capsys):

  def noisy():
    print("RACE DETECTED\n  write of x\nRACE DETECTED\n  read of y")
    return np.zeros(2)

  run = walkthrough.capture_races(noisy)
  assert capsys.readouterr().out == ""
  assert run.messages == ["RACE DETECTED\n  write of x",
                          "RACE DETECTED\n  read of y"]
  assert run.report.launches == 0 and not run.races_found


# --- the notebook ------------------------------------------------------------


def test_notebook_line_counts(tmp_path):
  nb = {"cells": [
      {"cell_type": "markdown", "source": ["# t\n", "\n", "text\n"]},
      {"cell_type": "code", "source": "x = 1\n\ny = 2\n"},
      {"cell_type": "raw", "source": "ignored\n"}]}
  path = tmp_path / "n.ipynb"
  path.write_text(json.dumps(nb))
  assert walkthrough.notebook_line_counts(path) == {"markdown": 2, "code": 2}


def test_walkthrough_notebook_has_more_prose_than_code():
  counts = walkthrough.notebook_line_counts(WALKTHROUGH)
  assert counts["markdown"] >= counts["code"], counts


def test_walkthrough_notebook_opens_with_its_question_and_keeps_tpu_metadata():
  nb = json.loads(WALKTHROUGH.read_text())
  first = "".join(nb["cells"][0]["source"])
  assert nb["cells"][0]["cell_type"] == "markdown"
  assert "**Question.**" in first and "**Why it matters.**" in first
  assert nb["metadata"].get("accelerator") == "TPU"
  hidden = [c for c in nb["cells"]
            if c["metadata"].get("jupyter", {}).get("source_hidden")]
  assert len(hidden) >= 2, "exercise answers are collapsed cells"


def test_every_source_excerpt_the_notebook_prints_resolves():
  # The notebook names functions of the vendored kernel and the strings that
  # cut them; an edit to the kernel that breaks one fails here, fast.
  from streamidx import ref  # pylint: disable=g-import-not-at-top
  nb = json.loads(WALKTHROUGH.read_text())
  code = "\n".join("".join(c["source"]) for c in nb["cells"]
                   if c["cell_type"] == "code")
  calls = re.findall(r"walkthrough\.excerpt\((.*?)\)\)$", code, flags=re.M)
  assert len(calls) >= 7, calls
  for call in calls:
    ex = eval(f"walkthrough.excerpt({call})",  # pylint: disable=eval-used
              {"walkthrough": walkthrough, "vendored": vendored, "ref": ref})
    assert ex.lines, call


# --- the compile check (section 6) -----------------------------------------

needs_libtpu = pytest.mark.skipif(si.modes.libtpu_path() is None,
                                  reason="libtpu not installed (make venv installs it)")


def _tiny_kernel_call(block_rows: int, interpret):
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  from jax.experimental import pallas as pl  # pylint: disable=g-import-not-at-top

  def kernel(x_ref, o_ref):
    o_ref[...] = x_ref[...] * 2.0

  def fn(x):
    return pl.pallas_call(kernel, grid=(x.shape[0] // block_rows,),
                          in_specs=[pl.BlockSpec((block_rows, 128), lambda i: (i, 0))],
                          out_specs=pl.BlockSpec((block_rows, 128), lambda i: (i, 0)),
                          out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
                          interpret=interpret)(x)
  return fn, (jnp.zeros((200, 128), jnp.float32),)


@needs_libtpu
def test_compile_rows_give_the_compilers_verdict():
  from jax.experimental.pallas import tpu as pltpu  # pylint: disable=g-import-not-at-top
  rows = walkthrough.compile_rows({
      "legal block": _tiny_kernel_call(8, False),
      "100-row block": _tiny_kernel_call(100, False),          # breaks the (8, 128) rule
      "interpreted": _tiny_kernel_call(8, pltpu.InterpretParams())}, ["v5e"])
  assert [r["kernel"] for r in rows] == ["legal block", "100-row block", "interpreted"]
  assert rows[0]["v5e"] == "compiles (Mosaic)"
  assert rows[1]["v5e"].startswith("fails: ValueError: The Pallas TPU lowering currently "
                                    "requires that the last two dimensions")
  assert rows[2]["v5e"] == "compiles, but no Mosaic kernel"
  summary = walkthrough.compile_summary(rows)
  assert summary.startswith("1 of 3 kernel x generation compiles accepted")
  assert "100-row block on v5e: fails: ValueError" in summary


def test_compile_summary_quotes_skips_and_ignores_cells_not_compiled():
  rows = [dict(kernel="a", v5e="compiles (Mosaic)", v6e="compiles (Mosaic)"),
          dict(kernel="b", v5e="- (the compile matrix)", v6e="compiles (Mosaic)")]
  assert walkthrough.compile_summary(rows) == ("3 of 3 kernel x generation compiles "
                                               "accepted by the TPU compiler")
  skipped = [dict(kernel=n, result="skipped: libtpu is not installed") for n in "ab"]
  assert walkthrough.compile_summary(skipped) == "skipped: libtpu is not installed"


def _notebook_namespace():
  """The walkthrough's teaching kernels (sections 2-4), defined by executing
  the notebook's own cells that define them, with its default parameters."""
  nb = json.loads(WALKTHROUGH.read_text())
  cells = ["".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "code"]
  params = next(s for s in cells if s.startswith("# Parameters"))
  imports = next(s for s in cells if "from jax.experimental import pallas as pl" in s)
  defining = [s for s in cells if re.search(r"^def (one_sequence|paged|dma)_(kernel|scores)\(", s, re.M)]
  assert len(defining) == 4, "cells defining the section 2-4 kernels and their callers"
  ns = {}
  exec(params, ns)  # pylint: disable=exec-used
  exec("\n".join(l for l in imports.splitlines()  # pylint: disable=exec-used
                 if l.startswith(("import", "from"))), ns)
  ns["bkv"] = ns["num_kv_pages_per_block"] * ns["page_size"]
  for src in defining:
    exec(src, ns)  # pylint: disable=exec-used
  return ns


@needs_libtpu
def test_the_notebooks_teaching_kernels_compile_for_v5e_and_v6e():
  import functools  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  ns = _notebook_namespace()
  H, D, page_size, bkv = ns["num_heads"], 128, ns["page_size"], ns["bkv"]
  seqs, pages, total_pages = 3, 2 * ns["num_kv_pages_per_block"], 64
  q, w = jnp.zeros((seqs, H, D), jnp.bfloat16), jnp.zeros((seqs, H), jnp.float32)
  keys = jnp.zeros((total_pages, page_size, D), jnp.bfloat16)
  table = jnp.zeros((seqs, pages), jnp.int32)
  lens = jnp.full((seqs,), pages * page_size * ns["compression_ratio"], jnp.int32)
  kernels = {
      "BlockSpec": (functools.partial(ns["one_sequence_scores"], interpret=False),
                    (q[0], w[0], jnp.zeros((2 * bkv, D), jnp.bfloat16))),
      "page table": (functools.partial(ns["paged_scores"], interpret=False),
                     (table, lens, q, w, keys)),
      "double-buffered DMA": (functools.partial(ns["dma_scores"], interpret=False),
                              (table, lens, q, w, keys))}
  rows = walkthrough.compile_rows(kernels, ["v5e", "v6e"])
  assert all(v == "compiles (Mosaic)" for r in rows for g, v in r.items() if g != "kernel"), rows
