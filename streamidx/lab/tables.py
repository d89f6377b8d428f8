"""Tables: a list of dicts as a Markdown table (notebooks) or aligned text (the benchmark's
reports), and a batch as such a list. Floats print with 4 significant digits, None as "-",
everything else with `str`.
"""

from __future__ import annotations

from typing import Mapping, Sequence


def _text(value) -> str:
  return "-" if value is None else f"{value:.4g}" if isinstance(value, float) else str(value)


def markdown(rows: Sequence[Mapping], cols: Sequence[str] | None = None) -> str:
  """`rows` as a GitHub-flavoured Markdown table, one line per row under a header (`|`
  escaped). `cols` picks and orders the columns (default: the first row's keys); a row
  without a column shows "-" there."""
  if not rows:
    raise ValueError("rows: must not be empty")
  cols = list(cols or rows[0])
  lines = ["| " + " | ".join(cols) + " |", "|" + "|".join("---" for _ in cols) + "|"]
  lines += ["| " + " | ".join(_text(r.get(c)).replace("|", "\\|").replace("\n", " ")
                              for c in cols) + " |" for r in rows]
  return "\n".join(lines)


def format_rows(rows: Sequence[Mapping], cols: Sequence[str] | None = None) -> str:
  """`rows` as an aligned text table (cells as `markdown` writes them, unescaped), each column
  right-aligned to its widest cell or header; "(no rows)" for none."""
  if not rows:
    return "(no rows)"
  cols = list(cols or rows[0])
  cells = [[_text(r.get(c)) for c in cols] for r in rows]
  widths = [max(len(c), *(len(x[i]) for x in cells)) for i, c in enumerate(cols)]
  return "\n".join("  ".join(v.rjust(w) for v, w in zip(line, widths))
                   for line in [cols] + cells)


def batch_rows(batch, *, max_pages: int = 6) -> list[dict]:
  """A `streamidx.RaggedBatch`, one dict per sequence, for `markdown`: seq, range (of
  `distribution`), q_len, query rows (its rows of q), seq_len, entries, physical pages (its
  page-table row, the first `max_pages`, then "...")."""
  i, j, _ = (int(x) for x in batch.distribution)
  cu = [int(x) for x in batch.cu_q_lens]
  rows = []
  for b in range(batch.num_seqs):
    pages = [int(x) for x in batch.page_table[b, :int(batch.num_pages_used[b])]]
    rows.append({
        "seq": b, "range": "decode" if b < i else "prefill-only" if b < j else "mixed",
        "q_len": cu[b + 1] - cu[b],
        "query rows": f"{cu[b]}" if cu[b + 1] - cu[b] == 1 else f"{cu[b]}..{cu[b + 1] - 1}",
        "seq_len": int(batch.seq_lens[b]), "entries": int(batch.num_entries[b]),
        "physical pages": ", ".join(map(str, pages[:max_pages]))
                          + (", ..." if len(pages) > max_pages else "")})
  return rows
