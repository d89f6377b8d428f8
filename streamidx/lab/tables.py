"""Text tables for notebooks: a list of dicts, printed as aligned columns.

    from streamidx.lab.tables import show
    show([dict(gen="v5e", kernel_us=12.5), dict(gen="v6e", kernel_us=None)])

Floats print with 4 significant digits, None as "-", everything else with
`str`; every column is right-aligned to its widest cell or header.
"""

from __future__ import annotations

from typing import Mapping, Sequence

__all__ = ["format_rows", "show"]


def _cell(value) -> str:
  if value is None:
    return "-"
  if isinstance(value, float):
    return f"{value:.4g}"
  return str(value)


def format_rows(rows: Sequence[Mapping], cols: Sequence[str] | None = None) -> str:
  """`rows` as an aligned text table, one line per row under a header.

  `cols` picks and orders the columns (default: the first row's keys); a
  row without a column shows "-" there.
  """
  if not rows:
    return "(no rows)"
  cols = list(cols or rows[0])
  cells = [[_cell(r.get(c)) for c in cols] for r in rows]
  widths = [max(len(c), *(len(x[i]) for x in cells)) for i, c in enumerate(cols)]
  lines = ["  ".join(c.rjust(w) for c, w in zip(cols, widths))]
  lines += ["  ".join(v.rjust(w) for v, w in zip(x, widths)) for x in cells]
  return "\n".join(lines)


def show(rows: Sequence[Mapping], cols: Sequence[str] | None = None) -> None:
  """Prints `format_rows(rows, cols)`."""
  print(format_rows(rows, cols))
