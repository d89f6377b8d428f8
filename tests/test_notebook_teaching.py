"""Notebooks 00 and 02 as teaching material (issue 16): each opens with its
question, writes its computed answer as the first output, ends with
exercises whose answers are collapsed cells, and renders its conclusions as
Markdown. Source checks only (the notebooks run in tests/test_notebooks.py,
which also checks every notebook's prose >= code, question and exercises)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest


NOTEBOOKS = Path(__file__).resolve().parents[1] / "notebooks"
TEACHING = ["00_quickstart.ipynb", "02_cache_layout.ipynb"]

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
