"""One DeepSeek-V4 decode step per (chip, variant) across the workbook
(issue 23): every notebook that quotes the production step gets it from
`roofline.dsv4_step`, none writes one of its numbers by hand, and no prose
repeats a claim the static schedule contradicts. Source checks: nothing runs
a notebook (tests/test_notebooks.py does)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from streamidx.lab.model import hardware, roofline

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
PROSE = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
# The notebooks that state the production step's time.
QUOTE_THE_STEP = ("01", "03", "05")


def _cells(path):
  return [("".join(c["source"]), c["cell_type"])
          for c in json.loads(path.read_text(encoding="utf-8"))["cells"]]


def _markdown(path):
  if path.suffix == ".md":
    return path.read_text(encoding="utf-8")
  return "\n".join(s for s, kind in _cells(path) if kind == "markdown")


def test_the_notebooks_that_quote_the_step_call_dsv4_step():
  found = {p.name[:2] for p in NOTEBOOKS
           if any("roofline.dsv4_step(" in s for s, kind in _cells(p)
                  if kind == "code")}
  assert set(QUOTE_THE_STEP) <= found, sorted(found)
  # A notebook that says "production step" says where it comes from.
  for p in NOTEBOOKS:
    text = "\n".join(s for s, _ in _cells(p))
    if "production step" in text or "production DeepSeek-V4 step" in text:
      assert "dsv4_step" in text, p.name


def _step_numbers() -> set[str]:
  """The production step's times as a sentence would print them (us)."""
  out = set()
  for gen in hardware.GENERATIONS:
    for variant in ("vendored", "dense", "lean"):
      for ctx in (2**17, 2**20):
        sb = roofline.dsv4_step(gen, variant, context_tokens=ctx)
        for t in (sb.total_s, sb.kernel_s, sb.t_hbm, sb.t_xla + sb.t_hbm):
          us = t * 1e6
          out |= {f"{us:.0f}", f"{us:,.0f}", f"{us:.1f}"}
  return out


def test_no_notebook_writes_a_step_time_by_hand():
  """A step time typed into prose (or into a string in code) rots when the
  model, the table or the schedule moves; the cells compute them."""
  numbers = _step_numbers()
  pattern = re.compile(r"(?<![\d.,])(\d[\d,]*(?:\.\d)?)\s*(?:us|µs)\b")
  for p in NOTEBOOKS:
    for src, kind in _cells(p):
      text = src if kind == "markdown" else " ".join(
          re.findall(r"\"[^\"\n]*\"|'[^'\n]*'", src))
      typed = {m.group(1) for m in pattern.finditer(text)} & numbers
      assert not typed, (p.name, sorted(typed))


# Claims the static schedule (or the code) contradicts, as the issue quotes
# them; each once stood in a notebook or a doc.
STALE = [
    r"bound by HBM bandwidth, not by the MXU",
    r"every row is HBM-bound",
    r"bound by the bytes it reads from HBM",
    r"its bound is the cache read",
    r"HBM read is the whole decode step",
    r"HBM bandwidth alone sets the bound",
    r"HBM-bound model",
    r"predicted 1\.8\d-1\.8\dx faster",
    r"as of M\d+",
    r"when this was written",
    r"in this session",
    r"fastest top-k: sort",
]
# The step called memory- or HBM-bound outright.
BOUND = re.compile(r"(decode step|the step|decode loop)[^.]{0,60}\b(is|are|runs) "
                   r"(HBM|memory)[- ]bound", re.I)


@pytest.mark.parametrize("path", NOTEBOOKS + PROSE, ids=lambda p: p.name)
def test_no_stale_bound_claim(path):
  text = re.sub(r"\s+", " ", _markdown(path))
  for phrase in STALE:
    assert not re.search(phrase, text), (path.name, phrase)
  assert not BOUND.search(text), (path.name, BOUND.search(text).group(0))
