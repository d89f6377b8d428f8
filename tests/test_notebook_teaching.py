"""Notebooks 00 and 01 as teaching material (issue 16): each opens with its
question, writes its computed answer as the first output, ends with
exercises whose answers are collapsed cells, and renders its conclusions as
Markdown. Source checks only (the notebooks run in tests/test_notebooks.py,
which also checks every notebook's prose >= code, question and exercises)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest


NOTEBOOKS = Path(__file__).resolve().parents[1] / "notebooks"
TEACHING = ["00_quickstart.ipynb", "01_cache_layout.ipynb"]

by_name = pytest.mark.parametrize("name", TEACHING)


def _cells(name):
  return json.loads((NOTEBOOKS / name).read_text())["cells"]


def _src(cell):
  return "".join(cell["source"])


@by_name
def test_opens_with_question_answer_and_why_it_matters(name):
  first = _cells(name)[0]
  assert first["cell_type"] == "markdown"
  for part in ("**Question.**", "**Answer.**", "**Why it matters.**"):
    assert part in _src(first), part


@by_name
def test_the_answer_is_a_markdown_display_right_after_the_parameter_check(name):
  cells = _cells(name)
  check = next(i for i, c in enumerate(cells)
               if "check_notebook(" in _src(c))
  assert "display(Markdown(" in _src(cells[check + 1])
  assert "display_id=True" in _src(cells[check + 1])
  assert any("answer.update(Markdown(" in _src(c) for c in cells[check + 2:])


@by_name
def test_has_exercises_with_collapsed_computed_answers(name):
  cells = _cells(name)
  text = "\n".join(_src(c) for c in cells if c["cell_type"] == "markdown")
  assert "## Exercises" in text and "## Answers" in text
  assert text.count("**Exercise ") >= 2 and text.count("**Answer ") >= 2
  hidden = [c for c in cells if c["cell_type"] == "code"
            and c["metadata"].get("jupyter", {}).get("source_hidden")]
  assert len(hidden) >= 2


@by_name
def test_conclusions_are_rendered_markdown_not_print_blocks(name):
  cells = _cells(name)
  at = next(i for i, c in enumerate(cells) if c["cell_type"] == "markdown"
            and "## Conclusions" in _src(c))
  conclusion = _src(cells[at + 1])
  assert "display(Markdown(" in conclusion and "print(" not in conclusion


@by_name
def test_never_calls_the_vendored_kernel_the_seed(name):
  for c in _cells(name):
    if c["cell_type"] == "markdown":
      assert "the seed's" not in _src(c) and "the seed " not in _src(c)


# --------------------------------------------------------------------------
# Checked value exercises (issue 47): the reader's cell (`my_x = None  #
# EXERCISE`), the check in the very next cell, the worked answer after it.

CHECKED = ["00_quickstart.ipynb", "01_cache_layout.ipynb", "02_fp8_packing.ipynb",
           "04_recall_parity.ipynb", "07_topk_selection.ipynb"]
GAP = re.compile(r"(?m)^(my_\w+) = None\s+# EXERCISE")


@pytest.mark.parametrize("name", CHECKED)
def test_each_value_exercise_is_checked_in_the_next_cell_and_answered_after(name):
  cells = _cells(name)
  gaps = [i for i, c in enumerate(cells) if c["cell_type"] == "code" and GAP.search(_src(c))]
  assert len(gaps) >= 1 + (name == "07_topk_selection.ipynb"), name
  for i in gaps:
    mine, check = GAP.search(_src(cells[i])).group(1), _src(cells[i + 1])
    assert "exercises.check(" in check and mine in check, (name, mine)
    assert "assert exercises.check(" not in check, (name, mine)  # the answer comes later
    assert any("assert exercises.check(" in _src(c) for c in cells[i + 2:]), (name, mine)


# --------------------------------------------------------------------------
# Notebook 03's kernel-code exercises (issue 23): a gap the reader fills, the
# check that runs it in a kernel in the TPU interpreter (skipped, saying so,
# while the gap returns None), and a collapsed worked solution the same check
# must pass (`assert exercise_check(...)`: the notebook's CI run checks each).

EXERCISES = {"my_block_scores": "solution_block_scores", "my_merge": "solution_merge"}


def _cell_defining(cells, name):
  return next(c for c in cells if c["cell_type"] == "code" and f"def {name}(" in _src(c))


@pytest.mark.parametrize("gap, solution", EXERCISES.items())
def test_walkthrough_exercise_has_gap_check_and_checked_solution(gap, solution):
  cells = _cells("03_kernel_walkthrough.ipynb")
  gap_cell, sol_cell = _cell_defining(cells, gap), _cell_defining(cells, solution)
  assert "# EXERCISE" in _src(gap_cell) and _src(gap_cell).rstrip().endswith("return None")
  order = [c["id"] for c in cells]
  check = cells[order.index(gap_cell["id"]) + 1]
  assert "exercise_check(\"kernel exercise" in _src(check) and f", {gap}," in _src(check)
  assert order.index(sol_cell["id"]) > order.index(check["id"])
  assert sol_cell["metadata"].get("jupyter", {}).get("source_hidden")
  assert "assert exercise_check(\"kernel exercise" in _src(sol_cell) and f", {solution}," in _src(sol_cell)


def test_walkthrough_worked_solutions_score_and_select_like_the_package():
  # The worked solutions as plain JAX (no kernel): a block's masked scores
  # are ref.score_entries', and merging block by block gives select_topk's
  # indices, ties (equal scores) by index ascending, -1 past the entries.
  import jax.numpy as jnp
  import numpy as np
  from jax import lax

  from streamidx import ref, topk

  cells = _cells("03_kernel_walkthrough.ipynb")
  namespace = {"jnp": jnp, "lax": lax, "exercise_check": lambda *a: True, "probe": (),
               "merge_probe": (), "run_exercise_1": None, "run_exercise_2": None}
  for solution in EXERCISES.values():
    exec(_src(_cell_defining(cells, solution)), namespace)  # pylint: disable=exec-used
  rng = np.random.default_rng(0)
  heads, dim, bkv, k, entries = 4, 16, 32, 8, 70
  q = jnp.asarray(rng.normal(size=(heads, dim)), jnp.bfloat16)
  w = jnp.asarray(rng.normal(size=(heads,)), jnp.float32)
  keys = jnp.asarray(rng.normal(size=(3 * bkv, dim)), jnp.bfloat16)
  keys = keys.at[40].set(keys[5])  # a tie across blocks
  cols = jnp.arange(3 * bkv, dtype=jnp.int32)[None]
  vals, idx = jnp.full((1, k), -jnp.inf), jnp.full((1, k), -1, jnp.int32)
  scores = []
  for j in range(3):
    block = slice(j * bkv, (j + 1) * bkv)
    s = namespace["solution_block_scores"](q, w[:, None], keys[block], cols[:, block], entries)
    scores.append(s)
    vals, idx = namespace["solution_merge"](vals, idx, s, cols[:, block])
  scores = jnp.concatenate(scores, axis=1)
  want = ref.score_entries(q, w, keys[:entries], None)
  np.testing.assert_allclose(np.asarray(scores[0, :entries]), np.asarray(want), rtol=1e-5, atol=1e-5)
  assert np.all(np.isneginf(np.asarray(scores[0, entries:])))
  np.testing.assert_array_equal(np.asarray(idx), np.asarray(topk.select_topk(scores, k)))
  few, few_idx = jnp.full((1, k), -jnp.inf), jnp.full((1, k), -1, jnp.int32)
  few, few_idx = namespace["solution_merge"](few, few_idx, scores[:, :bkv].at[:, 3:].set(-jnp.inf), cols[:, :bkv])
  assert list(np.asarray(few_idx)[0, 3:]) == [-1] * (k - 3) and sorted(np.asarray(few_idx)[0, :3]) == [0, 1, 2]
