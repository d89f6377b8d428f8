"""streamidx.lab.walkthrough: the kernel walkthrough notebook's helpers.

Source excerpts carry the file's own line numbers; the walkthrough notebook
has more prose than code; and the compile check of its section 6 gives the
TPU compiler's verdict, under which the notebook's own teaching kernels
(executed from its cells) compile for v5e and v6e (libtpu). The ledger
parser, the score checks, the tables and the race capture are notebook 03's
cells, checked by its own asserts (CI runs it).
"""

from __future__ import annotations

import inspect
import json
import re
from pathlib import Path

import pytest

import streamidx as si
from streamidx import topk
from streamidx.kernels import driver, tpu, vendored
from streamidx.lab import walkthrough

ROOT = Path(__file__).resolve().parents[1]
WALKTHROUGH = ROOT / "notebooks" / "03_kernel_walkthrough.ipynb"


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
  ex = walkthrough.excerpt(topk, "_select")
  assert ex.lines[0].startswith("@functools.partial")


def test_excerpt_cut_by_start_and_stop_strings():
  ex = walkthrough.excerpt(driver, "_runs",
                           start="for launch in semantics.token_launches",
                           stop="case=launch.case")
  assert "token_launches" in ex.lines[0] and "launch.case" in ex.lines[-1]
  assert ex.last - ex.first + 1 == len(ex.lines)


def test_excerpt_rejects_unknown_names_and_strings():
  with pytest.raises(ValueError, match="qualname: no definition 'nope'"):
    walkthrough.excerpt(vendored, "_scores_kernel.nope")
  with pytest.raises(ValueError, match="start:"):
    walkthrough.excerpt(vendored, "_scores_kernel.load_bkv", start="no such")


# --- the notebook ------------------------------------------------------------


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
              {"walkthrough": walkthrough, "vendored": vendored, "ref": ref,
               "driver": driver, "tpu": tpu})
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


def test_lowering_gap_says_which_primitive_pallas_cannot_lower_without_the_message():
  e = NotImplementedError("Unimplemented primitive in Pallas TPU lowering for tc: top_k. "
                          "Please file an issue at https://example.invalid/issues.")
  said = walkthrough.lowering_gap(e)
  assert said == "Pallas has no TPU lowering for `top_k` inside a kernel"
  assert walkthrough.lowering_gap(ValueError("block shape")) is None
