"""Writes the chip records into the docs where they quote them.

    python tools/quote_records.py [--check]

A quote is a block of README.md or docs/*.md between `<!-- records: FLAG
-->` and `<!-- /records -->`; its body is what `python -m streamidx.bench
--records FLAG` prints (`--summary`: what ran on which chip, in a sentence;
`--markdown`: the measured calls as a table). Numbers of the chip are
quoted this way only, never typed. With --check, writes nothing and exits 1
if a block differs (tests/test_records.py checks the same).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BLOCK = re.compile(r"(<!-- records: (--[\w-]+) -->\n)(.*?)(<!-- /records -->)",
                   re.S)


def render(flag: str) -> str:
  from streamidx.lab.bench import record  # pylint: disable=g-import-not-at-top
  out = io.StringIO()
  with contextlib.redirect_stdout(out):
    record.print_records([flag])
  return out.getvalue()


def quoted(text: str) -> str:
  """`text` with every block's body rendered afresh."""
  return BLOCK.sub(lambda m: m[1] + render(m[2]) + m[4], text)


def pages() -> list[Path]:
  return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def main(argv=None) -> int:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--check", action="store_true",
                  help="change nothing; exit 1 if a quote is stale")
  a = ap.parse_args(argv)
  stale = []
  for page in pages():
    text = page.read_text(encoding="utf-8")
    new = quoted(text)
    if new != text:
      stale.append(page)
      if not a.check:
        page.write_text(new, encoding="utf-8")
  for page in stale:
    print(f"{'stale' if a.check else 'quoted'}: {page.relative_to(ROOT)}")
  return 1 if (a.check and stale) else 0


if __name__ == "__main__":
  sys.exit(main())
