"""Tables for notebooks: a list of dicts, as aligned text columns or Markdown.

    from streamidx.lab.tables import show, markdown
    show([dict(gen="v5e", kernel_us=12.5), dict(gen="v6e", kernel_us=None)])
    display(Markdown(markdown(rows)))     # a rendered table (IPython.display)

Floats print with 4 significant digits, None as "-", everything else with
`str`; every text column is right-aligned to its widest cell or header.
"""

from __future__ import annotations

from typing import Mapping, Sequence

__all__ = ["format_rows", "show", "markdown"]


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


def markdown(rows: Sequence[Mapping], cols: Sequence[str] | None = None) -> str:
  """`rows` as a GitHub-flavoured Markdown table (cells as `format_rows`
  writes them, `|` escaped). `cols` as for `format_rows`."""
  if not rows:
    raise ValueError("rows: must not be empty")
  cols = list(cols or rows[0])

  def cell(value):
    return _cell(value).replace("|", "\\|").replace("\n", " ")

  lines = ["| " + " | ".join(cols) + " |",
           "|" + "|".join("---" for _ in cols) + "|"]
  lines += ["| " + " | ".join(cell(r.get(c)) for c in cols) + " |"
            for r in rows]
  return "\n".join(lines)
