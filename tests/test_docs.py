"""README.md and docs/*.md: every relative link resolves (and every link into
docs/ from a notebook or `tables.CLOCK_DOC` names a real heading), README stays short.

A link is `[text](target)` outside code; a target with a scheme (https:,
mailto:) is not checked. A relative target must name an existing file or
folder, and a `#fragment` on a Markdown file must be one of its headings
(GitHub's anchors: lower case, punctuation dropped, spaces to hyphens).
"""

import json
import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md"] + sorted((ROOT / "docs").glob("*.md"))
README_MAX_LINES = 160

LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def _prose(path):
  """The file's lines outside fenced code, inline code removed."""
  out, fenced = [], False
  for line in path.read_text().splitlines():
    if line.lstrip().startswith("```"):
      fenced = not fenced
    elif not fenced:
      out.append(re.sub(r"`[^`]*`", "", line))
  return out


def _anchors(path):
  heads = [l.lstrip("#").strip() for l in _prose(path) if l.startswith("#")]
  return {re.sub(r"[^\w\- ]", "", h.lower()).replace(" ", "-") for h in heads}


def test_docs_exist():
  assert len(PAGES) > 1, "docs/*.md is missing"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_relative_links_resolve(page):
  bad = []
  for line in _prose(page):
    for target in LINK.findall(line):
      if re.match(r"[a-z][a-z0-9+.-]*:", target):
        continue
      file, _, fragment = target.partition("#")
      dest = (page.parent / file).resolve() if file else page
      if not dest.exists():
        bad.append(f"{target}: no such file")
      elif fragment and dest.suffix == ".md" and fragment not in _anchors(dest):
        bad.append(f"{target}: no heading #{fragment} in {dest.name}")
  assert not bad, f"{page.name}: " + "; ".join(bad)


def test_readme_is_short():
  n = len((ROOT / "README.md").read_text().splitlines())
  assert n <= README_MAX_LINES, (
      f"README.md has {n} lines (at most {README_MAX_LINES}); move detail to docs/")


# A link into docs/ from a notebook cell (Markdown, or a string a code cell
# writes into Markdown) or from the package's one home of such a link.
DOC_LINK = re.compile(r"docs/([\w.-]+\.md)#([\w-]+)")


def test_notebook_and_package_links_into_docs_name_real_headings():
  from streamidx.lab import tables
  sources = {p.name: "\n".join("".join(c["source"]) for c in json.loads(p.read_text())["cells"])
             for p in sorted((ROOT / "notebooks").glob("*.ipynb"))}
  sources["streamidx.lab.tables.CLOCK_DOC"] = tables.CLOCK_DOC
  bad = [f"{name}: {page}#{fragment}"
         for name, text in sources.items() for page, fragment in DOC_LINK.findall(text)
         if not (ROOT / "docs" / page).exists()
         or fragment not in _anchors(ROOT / "docs" / page)]
  assert len(sources) > 1 and not bad, bad
