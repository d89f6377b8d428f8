"""Tables for notebooks: a list of dicts as a Markdown table, and a batch as such a list.

    display(Markdown(markdown(rows)))     # rows: [dict(gen="v5e", kernel_us=12.5), ...]

Floats print with 4 significant digits, None as "-", everything else with `str`.
"""

from __future__ import annotations

from typing import Mapping, Sequence

__all__ = ["markdown", "batch_rows"]


def _cell(value) -> str:
  text = "-" if value is None else f"{value:.4g}" if isinstance(value, float) else str(value)
  return text.replace("|", "\\|").replace("\n", " ")


def markdown(rows: Sequence[Mapping], cols: Sequence[str] | None = None) -> str:
  """`rows` as a GitHub-flavoured Markdown table, one line per row under a header (`|`
  escaped). `cols` picks and orders the columns (default: the first row's keys); a row
  without a column shows "-" there."""
  if not rows:
    raise ValueError("rows: must not be empty")
  cols = list(cols or rows[0])
  lines = ["| " + " | ".join(cols) + " |", "|" + "|".join("---" for _ in cols) + "|"]
  lines += ["| " + " | ".join(_cell(r.get(c)) for c in cols) + " |" for r in rows]
  return "\n".join(lines)


def batch_rows(batch, *, max_pages: int = 6) -> list[dict]:
  """A `streamidx.RaggedBatch`, one dict per sequence, for `markdown`.

  Columns: seq, range (which range of `distribution` holds it: "decode", "prefill-only" or
  "mixed"), q_len, query rows (its rows of q: `cu_q_lens[b] .. cu_q_lens[b+1] - 1`), seq_len,
  entries (seq_len // compression_ratio), physical pages (its page-table row, the first
  `max_pages` pages, then "...").
  """
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
