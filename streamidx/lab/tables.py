"""Tables for notebooks: a list of dicts, as aligned text columns or Markdown.

    from streamidx.lab.tables import show, markdown
    show([dict(gen="v5e", kernel_us=12.5), dict(gen="v6e", kernel_us=None)])
    display(Markdown(markdown(rows)))     # a rendered table (IPython.display)

`batch_rows(batch)` is a ragged batch as the kernel sees it, one row per
sequence. Floats print with 4 significant digits, None as "-", everything else with
`str`; every text column is right-aligned to its widest cell or header.
"""

from __future__ import annotations

from typing import Mapping, Sequence

__all__ = ["format_rows", "show", "markdown", "batch_rows"]


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


def batch_rows(batch, *, max_pages: int = 6) -> list[dict]:
  """A `streamidx.RaggedBatch`, one dict per sequence, for `markdown`.

  Columns: seq, range (which range of `distribution` holds it: "decode",
  "prefill-only" or "mixed"), q_len, query rows (its rows of q:
  `cu_q_lens[b] .. cu_q_lens[b+1] - 1`), seq_len, entries (seq_len //
  compression_ratio), physical pages (its page-table row, the first
  `max_pages` pages, then "...").
  """
  i, j, _ = (int(x) for x in batch.distribution)
  cu = [int(x) for x in batch.cu_q_lens]
  rows = []
  for b in range(batch.num_seqs):
    pages = [int(x) for x in batch.page_table[b, :int(batch.num_pages_used[b])]]
    shown = ", ".join(map(str, pages[:max_pages]))
    rows.append({
        "seq": b,
        "range": "decode" if b < i else "prefill-only" if b < j else "mixed",
        "q_len": cu[b + 1] - cu[b],
        "query rows": (f"{cu[b]}" if cu[b + 1] - cu[b] == 1
                       else f"{cu[b]}..{cu[b + 1] - 1}"),
        "seq_len": int(batch.seq_lens[b]),
        "entries": int(batch.num_entries[b]),
        "physical pages": shown + (", ..." if len(pages) > max_pages else ""),
    })
  return rows
