"""Figures the notebooks share: page tables, packed pages, records, masks,
batches with their launches. Matplotlib only; safe under the Agg backend.

Every function draws arrays it is given (from `streamidx.batch`,
`streamidx.cache`, `streamidx.lab.studies.layout`); none computes a layout of its own.
Each returns the `Figure` (or draws on the `Axes` passed in); `save` writes
it as a PNG under a notebook's `output_dir`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import matplotlib.pyplot as plt
from matplotlib import colors as mcolors
from matplotlib import patches
import numpy as np

__all__ = [
    "save",
    "seq_colors",
    "page_table_figure",
    "packed_page_axes",
    "record_bytes_axes",
    "visibility_axes",
    "batch_launch_figure",
]

FREE = "#eeeeee"


def save(fig, output_dir, name: str) -> Path:
  """Writes `fig` to `<output_dir>/<name>.png` (folders created); the path."""
  out = Path(output_dir)
  out.mkdir(parents=True, exist_ok=True)
  path = out / f"{name}.png"
  fig.savefig(path, dpi=110, bbox_inches="tight")
  return path


def seq_colors(n: int) -> list:
  """n distinct colours, one per sequence (tab10, then tab20)."""
  cmap = plt.get_cmap("tab10" if n <= 10 else "tab20")
  return [cmap(i % cmap.N) for i in range(n)]


def page_table_figure(batches: Sequence, titles: Sequence[str]):
  """Page table and physical page pool of each batch, one row per batch.

  Left: the page table (sequence x local page), each cell labelled with its
  physical page. Right: the pool of physical pages, each coloured by the
  sequence that owns it (grey: free) and labelled "b:p" (sequence b, local
  page p).
  """
  n = len(batches)
  fig, axes = plt.subplots(n, 2, figsize=(13, 2.6 * n), squeeze=False,
                           gridspec_kw={"width_ratios": [1, 2.2]})
  for row, (batch, title) in enumerate(zip(batches, titles)):
    colors = seq_colors(batch.num_seqs)
    ax_t, ax_p = axes[row]
    table = batch.page_table
    used = batch.num_pages_used
    for b in range(batch.num_seqs):
      for p in range(batch.pages_per_seq):
        live = p < used[b]
        ax_t.add_patch(patches.Rectangle((p, b), 1, 1, ec="white",
                                         fc=colors[b] if live else FREE))
        if live:
          ax_t.text(p + .5, b + .5, str(table[b, p]), ha="center",
                    va="center", fontsize=8, color="white")
    ax_t.set_xlim(0, batch.pages_per_seq)
    ax_t.set_ylim(batch.num_seqs, 0)
    ax_t.set_xticks(np.arange(batch.pages_per_seq) + .5,
                    range(batch.pages_per_seq), fontsize=7)
    ax_t.set_yticks(np.arange(batch.num_seqs) + .5,
                    [f"seq {b}" for b in range(batch.num_seqs)], fontsize=8)
    ax_t.set_xlabel("local page p")
    ax_t.set_title(f"{title}: page table", fontsize=9)

    owner = np.full(batch.total_num_pages, -1)
    local = np.zeros(batch.total_num_pages, int)
    for b in range(batch.num_seqs):
      for p in range(used[b]):
        owner[table[b, p]] = b
        local[table[b, p]] = p
    cols = 32
    rows = -(-batch.total_num_pages // cols)
    for page in range(batch.total_num_pages):
      x, y = page % cols, page // cols
      own = owner[page]
      ax_p.add_patch(patches.Rectangle((x, y), 1, 1, ec="white",
                                       fc=colors[own] if own >= 0 else FREE))
      ax_p.text(x + .5, y + .32, str(page), ha="center", va="center",
                fontsize=5.5, color="black" if own < 0 else "white")
      if own >= 0:
        ax_p.text(x + .5, y + .72, f"{own}:{local[page]}", ha="center",
                  va="center", fontsize=5.5, color="white")
    ax_p.set_xlim(0, cols)
    ax_p.set_ylim(rows, 0)
    ax_p.set_xticks([])
    ax_p.set_yticks([])
    ax_p.set_title(f"{title}: physical pages (number; owner seq:local page; "
                   f"grey = free)", fontsize=9)
    ax_p.set_aspect("equal")
  fig.tight_layout()
  return fig


def packed_page_axes(ax, entry_ids, *, title: str, kv_packing: int,
                     highlight: int | None = None):
  """A page as the kernel's [page_size / kv_packing, kv_packing] grid.

  `entry_ids[r, j]` is the entry found at row r, slot j (read from the
  cache bytes by the caller); `highlight` marks one entry.
  """
  ids = np.asarray(entry_ids)
  rows, slots = ids.shape
  cmap = plt.get_cmap("viridis")
  norm = mcolors.Normalize(0, max(ids.max(), 1))
  for r in range(rows):
    for j in range(slots):
      t = ids[r, j]
      ax.add_patch(patches.Rectangle((j, r), 1, 1, ec="white", lw=1.5,
                                     fc=cmap(norm(t))))
      ax.text(j + .5, r + .5, str(t), ha="center", va="center", fontsize=9,
              color="white" if norm(t) < .6 else "black",
              fontweight="bold" if t == highlight else None)
      if t == highlight:
        ax.add_patch(patches.Rectangle((j, r), 1, 1, ec="red", lw=2.5,
                                       fill=False))
  ax.set_xlim(0, slots)
  ax.set_ylim(rows, 0)
  ax.set_xticks(np.arange(slots) + .5, [f"slot {j}" for j in range(slots)],
                fontsize=8)
  ax.set_yticks(np.arange(rows) + .5, [f"row {r}" for r in range(rows)],
                fontsize=8)
  ax.set_title(f"{title}\n(one 32-bit word per lane holds the {kv_packing} "
               "slots of a row)", fontsize=9)
  ax.set_aspect("equal")


def record_bytes_axes(ax, record, head_dim: int, *, title: str):
  """One uint8 FP8 record as a 16-wide grid of bytes, coloured by role
  (e4m3 value / e8m0 scale / padding), each labelled in hex."""
  rec = np.asarray(record, np.uint8).reshape(-1)
  width = 16
  rows = -(-rec.size // width)
  role_color = {"value": "#4c72b0", "scale": "#dd8452", "pad": "#dddddd"}
  for i, byte in enumerate(rec):
    role = ("value" if i < head_dim else "scale" if i == head_dim else "pad")
    x, y = i % width, i // width
    ax.add_patch(patches.Rectangle((x, y), 1, 1, ec="white",
                                   fc=role_color[role]))
    ax.text(x + .5, y + .5, f"{byte:02x}", ha="center", va="center",
            fontsize=6.5, color="white" if role != "pad" else "#777777",
            family="monospace")
  ax.set_xlim(0, width)
  ax.set_ylim(rows, 0)
  ax.set_xticks(np.arange(width) + .5, [f"+{i:x}" for i in range(width)],
                fontsize=7)
  ax.set_yticks(np.arange(rows) + .5, [f"{r * width:3d}" for r in range(rows)],
                fontsize=7)
  ax.set_aspect("equal")
  handles = [patches.Patch(color=c, label=l) for l, c in
             (("e4m3 value", role_color["value"]),
              ("e8m0 scale", role_color["scale"]),
              ("zero padding", role_color["pad"]))]
  ax.legend(handles=handles, loc="upper center", bbox_to_anchor=(.5, -.02),
            ncol=3, fontsize=8, frameon=False)
  ax.set_title(title, fontsize=9)


def visibility_axes(ax, mask, q_positions, *, title: str, diff=None,
                    compression_ratio: int | None = None, first_entry: int = 0):
  """A [T, E] visibility mask (dark = visible); `diff` cells outlined red.

  Column c is entry `first_entry + c` (to draw a window of a long sequence).
  """
  mask = np.asarray(mask, bool)
  t, e = mask.shape
  ax.imshow(mask, cmap=mcolors.ListedColormap(["#f4f4f4", "#31688e"]),
            vmin=0, vmax=1, aspect="auto", interpolation="nearest",
            extent=(0, e, t, 0))
  if diff is not None:
    for r, c in zip(*np.nonzero(np.asarray(diff))):
      ax.add_patch(patches.Rectangle((c, r), 1, 1, fill=False, ec="red",
                                     lw=1.6, hatch="///"))
  ax.set_xticks(np.arange(e) + .5, range(first_entry, first_entry + e),
                fontsize=7)
  ax.set_yticks(np.arange(t) + .5, [f"p={p}" for p in q_positions],
                fontsize=7)
  xlabel = "compressed entry s"
  if compression_ratio:
    xlabel += f" (tokens {compression_ratio}s .. {compression_ratio}s+" \
              f"{compression_ratio - 1})"
  ax.set_xlabel(xlabel, fontsize=8)
  ax.set_title(title, fontsize=9)
  ax.set_xticks(np.arange(e + 1), minor=True)
  ax.set_yticks(np.arange(t + 1), minor=True)
  ax.grid(which="minor", color="white", lw=.6)
  ax.tick_params(which="minor", length=0)


def batch_launch_figure(batch, plan, work, *, filled_rows=None):
  """The ragged batch as the kernel sees it, and the launches over it.

  Top: one cell per query row (cu_q_lens order), coloured by sequence, with
  the distribution's ranges. Below: one band per launch; each program is a
  box over the rows it scores, labelled with its sequences and
  num_bq x num_bkv blocks. `filled_rows` (bool[T], e.g. rows where the
  kernel returned an index) is drawn as a last band.
  """
  colors = seq_colors(batch.num_seqs)
  t = batch.num_tokens
  seq_of = batch.token_seq_ids()
  n_bands = 1 + len(plan) + (filled_rows is not None)
  fig, ax = plt.subplots(figsize=(max(9, t * .42), 1.2 + .62 * n_bands))
  for r in range(t):
    s = seq_of[r]
    ax.add_patch(patches.Rectangle((r, 0), 1, .8, ec="white",
                                   fc=colors[s] if s >= 0 else FREE))
    if s >= 0:
      ax.text(r + .5, .4, str(s), ha="center", va="center", fontsize=7,
              color="white")
  d = batch.distribution
  cu = batch.cu_q_lens
  for name, lo, hi in (("decode", 0, d[0]), ("prefill-only", d[0], d[1]),
                       ("mixed", d[1], d[2])):
    if hi > lo:
      x0, x1 = cu[lo], cu[hi]
      ax.annotate("", (x0, -.15), (x1, -.15),
                  arrowprops=dict(arrowstyle="<->", lw=.8))
      ax.text((x0 + x1) / 2, -.3, f"{name}: seqs [{lo}, {hi})",
              ha="center", va="bottom", fontsize=8)
  labels = ["query rows\n(seq id)"]
  for li, launch in enumerate(plan):
    y = 1 + li
    labels.append(f"launch {li}: {launch.name}\n{launch.seq_batch_size} seq(s) "
                  f"per program, grid={launch.grid}")
    for w in (w for w in work if w.launch == li):
      for (lo, hi), s in zip(w.q_rows, w.seqs):
        if hi > lo:
          ax.add_patch(patches.Rectangle((lo, y + .05), hi - lo, .7,
                                         ec="black", fc=colors[s], alpha=.55))
      lo = min(q[0] for q in w.q_rows)
      hi = max(q[1] for q in w.q_rows)
      ax.add_patch(patches.Rectangle((lo, y + .05), max(hi - lo, .3), .7,
                                     ec="black", fill=False, lw=1.4))
      ax.text((lo + hi) / 2, y + .42,
              f"p{w.program}\n{w.num_bq}x{w.num_bkv}", ha="center",
              va="center", fontsize=6.5, linespacing=.9)
  if filled_rows is not None:
    y = 1 + len(plan)
    labels.append("rows the kernel\nreturned indices for")
    for r in np.flatnonzero(np.asarray(filled_rows)):
      ax.add_patch(patches.Rectangle((r, y + .05), 1, .7, ec="white",
                                     fc="#333333"))
  ax.set_xlim(0, t)
  ax.set_ylim(n_bands, -.6)
  ax.set_yticks(np.arange(n_bands) + .4, labels, fontsize=7)
  ax.set_xticks(np.arange(0, t + 1, max(1, t // 16)))
  ax.set_xlabel("query row (token index into q; cu_q_lens[b] is where "
                "sequence b starts)", fontsize=8)
  ax.set_title("boxes: programs (pN = program N of the launch; a x b = "
               "num_bq query blocks x num_bkv KV blocks it loops over)",
               fontsize=8)
  fig.tight_layout()
  return fig
