"""Tables: a list of dicts as a Markdown table (notebooks) or aligned text (the benchmark's
reports), numbers as `number` prints them, None as "-"; `clock_note`.
"""

from __future__ import annotations

import math
import re
from typing import Mapping, Sequence

# Where the notebooks' missing-clock note is explained once (notebooks/ -> docs/).
CLOCK_DOC = "../docs/tpu.md#the-clock-public-inferred-from-one-measurement-or-a-break-even-clock"
_CLOCK_NOTE = re.compile(r"\(no public clock[^()]*\)")


def clock_note(text: str, *, markdown: bool = True) -> str:
  """`text` with each "(no public clock...)" note of `roofline`'s verdicts
  replaced by a short link to docs/tpu.md (`markdown=False`: the path, for printed text)."""
  link = f"([no public clock]({CLOCK_DOC}))" if markdown else "(no public clock: docs/tpu.md, the clock)"
  return _CLOCK_NOTE.sub(link, text)


def number(value: float) -> str:
  """A float as a reader scans it: 10296.4 -> "10,296", 12.345 -> "12.35", 0.000123 ->
  "0.000123"; the exponent form only outside [1e-4, 1e15) in magnitude (tolerances, errors)."""
  if value != value or value in (float("inf"), float("-inf")):
    return str(value)
  mag = abs(value)
  if mag >= 1e15 or (0 < mag < 1e-4):
    return f"{value:.3g}"
  if mag >= 1000:
    return f"{value:,.0f}"
  if value == int(value):
    return f"{int(value)}"
  digits = max(0, 3 - math.floor(math.log10(mag))) if mag else 0
  return f"{value:.{digits}f}".rstrip("0").rstrip(".")


def _text(value) -> str:
  return "-" if value is None else number(value) if isinstance(value, float) else str(value)


def markdown(rows: Sequence[Mapping], cols: Sequence[str] | None = None) -> str:
  """`rows` as a GitHub-flavoured Markdown table; `cols` picks and orders the columns
  (default: the first row's keys)."""
  if not rows:
    raise ValueError("rows: must not be empty")
  cols = list(cols or rows[0])
  lines = ["| " + " | ".join(cols) + " |", "|" + "|".join("---" for _ in cols) + "|"]
  lines += ["| " + " | ".join(_text(r.get(c)).replace("|", "\\|").replace("\n", " ")
                              for c in cols) + " |" for r in rows]
  return "\n".join(lines)


def format_rows(rows: Sequence[Mapping], cols: Sequence[str] | None = None) -> str:
  """`rows` as an aligned text table (cells as `markdown` writes them), right-aligned."""
  if not rows:
    return "(no rows)"
  cols = list(cols or rows[0])
  cells = [[_text(r.get(c)) for c in cols] for r in rows]
  widths = [max(len(c), *(len(x[i]) for x in cells)) for i, c in enumerate(cols)]
  return "\n".join("  ".join(v.rjust(w) for v, w in zip(line, widths))
                   for line in [cols] + cells)

