"""The notebooks' figures: page tables, packed pages, records, masks,
batches with their launches, and one function per figure a notebook draws
(the e4m3 grid, scale errors, recall, the Hadamard rotation,
iteration order, VMEM budgets, the causal leak, page coverage, the
roofline). Matplotlib only; safe under the Agg backend.

Every function draws what it is given (arrays from `streamidx.batch`,
`streamidx.cache`, `streamidx.lab.studies`; a launch plan from
`streamidx.lab.model.tiling`); none computes a layout, a plan or a study of
its own. Each returns the `Figure` (or draws on the `Axes` passed in); `save`
writes it as a PNG under a notebook's `output_dir`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import matplotlib.pyplot as plt
from matplotlib import colors as mcolors
from matplotlib import patches
import numpy as np

__all__ = [
    "decode_waste_figure",
    "decode_step_figure",
    "save",
    "seq_colors",
    "page_table_figure",
    "record_bytes_axes",
    "visibility_axes",
    "batch_launch_figure",
    "scale_error_figure",
    "e4m3_use_figure",
    "recall_ci_figure",
    "rotation_figure",
    "iteration_order_figure",
    "vmem_budget_figure",
    "causal_leak_figure",
    "page_coverage_figure",
    "roofline_figure",
    "static_schedule_figure",
    "scaling_figure",
    "crossover_figure",
    "variant_timing_figure",
    "query_scores_figure",
    "sublane_words_axes",
    "decode_step_time_figure",
    "causal_masks_figure",
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


def batch_launch_figure(batch, plan, *, filled_rows=None):
  """The ragged batch as the kernel sees it, and the launches over it.

  `plan` is the tiling model's `Plan` of the call
  (`streamidx.lab.model.tiling.plan`). Top: one cell per query row
  (cu_q_lens order), coloured by sequence, with the distribution's ranges.
  Below: one band per launch; each program is a box over the rows it
  scores, labelled with its sequences and num_bq x num_bkv blocks.
  `filled_rows` (bool[T], e.g. rows where the kernel returned an index) is
  drawn as a last band.
  """
  colors = seq_colors(batch.num_seqs)
  t = batch.num_tokens
  seq_of = batch.token_seq_ids()
  launches = plan.launches
  n_bands = 1 + len(launches) + (filled_rows is not None)
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
  for li, launch in enumerate(launches):
    y = 1 + li
    labels.append(f"launch {li}: {launch.name}\n{launch.seq_batch_size} seq(s) "
                  f"per program, grid={launch.grid}")
    for pr in launch.programs:
      for (lo, hi), s in zip(pr.q_rows, pr.seqs):
        if hi > lo:
          ax.add_patch(patches.Rectangle((lo, y + .05), hi - lo, .7,
                                         ec="black", fc=colors[s], alpha=.55))
      lo = min(q[0] for q in pr.q_rows)
      hi = max(q[1] for q in pr.q_rows)
      ax.add_patch(patches.Rectangle((lo, y + .05), max(hi - lo, .3), .7,
                                     ec="black", fill=False, lw=1.4))
      ax.text((lo + hi) / 2, y + .42,
              f"p{pr.index}\n{pr.num_bq}x{pr.num_bkv}", ha="center",
              va="center", fontsize=6.5, linespacing=.9)
  if filled_rows is not None:
    y = 1 + len(launches)
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


# ---------------------------------------------------------------------------
# Notebook figures: each draws the numbers a notebook computed, nothing else.


def scale_error_figure(scale_study, *, amax_of: str = "gaussian",
                       title: str | None = None):
  """Notebook 03: record error with ue8m0 vs exact float scales; amax / scale.

  Args:
    scale_study: distribution -> {"err_pow2", "err_float" (f[records]
      relative L2 errors), "mean_err_ue8m0", "mean_err_float",
      "amax_over_scale" (f[records])}; the first two distributions are drawn.
    amax_of: the distribution whose amax / 2**e histogram is drawn.
    title: the figure's title (its finding), if any.
  """
  fig, axes = plt.subplots(1, 3, figsize=(15, 3.6))
  for ax, dist in zip(axes[:2], scale_study):
    st = scale_study[dist]
    bins = np.linspace(0, max(st["err_pow2"].max(), st["err_float"].max()), 60)
    ax.hist(st["err_float"], bins, alpha=.6,
            label=f"exact float scale (mean {st['mean_err_float']:.4f})")
    ax.hist(st["err_pow2"], bins, alpha=.6,
            label=f"ue8m0 scale (mean {st['mean_err_ue8m0']:.4f})")
    ax.set_title(f"{dist} keys: relative L2 error per record", fontsize=10)
    ax.set_xlabel("||k - deq(q(k))|| / ||k|| (relative L2 error, no unit)")
    ax.set_ylabel("records")
    ax.legend(fontsize=8)
  axes[2].hist(scale_study[amax_of]["amax_over_scale"], 60, color="tab:green")
  axes[2].axvline(448, color="k", ls="--", lw=1)
  axes[2].set_title(f"where amax lands with a ue8m0 scale ({amax_of})",
                    fontsize=10)
  axes[2].set_xlabel("amax / 2**e (448 = e4m3 max)")
  axes[2].set_ylabel("records")
  if title:
    fig.suptitle(title, fontsize=11)
    fig.tight_layout()
  return fig




def e4m3_use_figure(positive, spacing, stored, *, title: str,
                    min_normal: float = 2.0 ** -6):
  """Notebook 03: where scaled records land on the e4m3 grid, and its spacing.

  Left: the share of stored |values| (ue8m0-scaled records, zeros left out)
  in each binade [2**e, 2**(e+1)), subnormals shaded. Right: the relative
  spacing (next - x) / x of the grid, i.e. twice the worst rounding error.

  Args:
    positive: f[N] the positive finite e4m3 values, sorted.
    spacing: f[N - 1] (next value - x) / x for each but the last.
    stored: f[M] stored |values| of quantized records.
    title: the figure's title (its finding).
  """
  positive = np.asarray(positive, np.float64)
  spacing = np.asarray(spacing, np.float64)
  stored = np.asarray(stored, np.float64)
  stored = stored[stored > 0]
  lo, hi = np.log2(positive.min()), np.log2(positive.max())
  edges = np.exp2(np.arange(np.floor(lo), np.ceil(hi) + 1))
  counts, _ = np.histogram(stored, edges)
  fig, (ax0, ax1) = plt.subplots(1, 2, figsize=(13, 3.8))
  ax0.bar(edges[:-1], counts / max(1, stored.size), width=np.diff(edges),
          align="edge", edgecolor="white")
  ax0.set_xscale("log", base=2)
  ax0.axvspan(positive.min(), min_normal, color="tab:orange", alpha=.15,
              label="subnormals (fewer mantissa bits)")
  ax0.set_xlabel("stored |value| (binades of the e4m3 grid, log2 axis)")
  ax0.set_ylabel("share of stored nonzero values")
  ax0.set_title("where ue8m0-scaled records land", fontsize=10)
  ax0.legend(fontsize=8)
  ax1.plot(positive[:-1], spacing, ".-", ms=3)
  ax1.set_xscale("log", base=2)
  ax1.set_yscale("log", base=2)
  ax1.axvspan(positive.min(), min_normal, color="tab:orange", alpha=.15)
  ax1.set_xlabel("e4m3 value x (log2 axis)")
  ax1.set_ylabel("(next value - x) / x (relative spacing)")
  ax1.set_title("relative spacing of the grid", fontsize=10)
  ax1.grid(alpha=.3, which="both")
  fig.suptitle(title, fontsize=11)
  fig.tight_layout()
  return fig


def recall_ci_figure(summary, *, dists, contexts, ks, variants, title: str):
  """Notebook 03: mean recall@k over seeds with its 95% interval (clipped to
  [0, 1]), per panel.

  Args:
    summary: (dist, entries, variant, k) -> the mean recall over seeds and
      the half-width of its interval (attributes `mean`, `half_width`).
    dists, contexts: the rows and columns of panels.
    ks: the k values (those <= a panel's entries are drawn).
    variants: variant names, one line each.
    title: the figure's title (its finding).
  """
  fig, axes = plt.subplots(len(dists), len(contexts),
                           figsize=(4.2 * len(contexts), 3.5 * len(dists)),
                           sharey=True, squeeze=False)
  for i, dist in enumerate(dists):
    for j, entries in enumerate(contexts):
      ax = axes[i, j]
      kk = [k for k in ks if k <= entries]
      for name in variants:
        s = [summary(dist, entries, name, k) for k in kk]
        mean = np.array([x.mean for x in s])
        half = np.nan_to_num([x.half_width for x in s])
        # The interval, clipped to the possible range [0, 1] of a recall.
        err = [mean - np.maximum(mean - half, 0), np.minimum(mean + half, 1) - mean]
        ax.errorbar(kk, mean, yerr=err, fmt="o-", ms=4, capsize=3, label=name)
      ax.set_xscale("log", base=2)
      ax.set_xticks(kk, [str(k) for k in kk])
      ax.minorticks_off()
      ax.set_title(f"{dist} keys, {entries} entries", fontsize=10)
      ax.grid(alpha=.3)
      if i == len(dists) - 1:
        ax.set_xlabel("k (entries selected, log2 axis)")
      if j == 0:
        ax.set_ylabel("recall@k vs exact f32 top-k")
  axes[0, 0].legend(fontsize=8)
  fig.suptitle(title, fontsize=11)
  fig.tight_layout()
  return fig


def rotation_figure(key, rotated_key, diffs, *, outlier_channels: int,
                    title: str):
  """Notebook 03: a key before and after the Hadamard rotation; the recall
  the rotation changes, with 95% intervals, on an axis through 0.

  Args:
    key, rotated_key: f[head_dim], before and after the rotation.
    diffs: [(label, MeanCI of recall(rotated) - recall(plain))].
    title: the figure's title (its finding).
  """
  key = np.abs(np.asarray(key))
  rotated_key = np.abs(np.asarray(rotated_key))
  fig, (ax0, ax1) = plt.subplots(1, 2, figsize=(13, 3.8),
                                 gridspec_kw={"width_ratios": [1.4, 1]})
  channels = np.arange(key.size)
  ax0.plot(channels, key, ".", ms=4,
           label=f"|k| (max / rms {key.max() / np.sqrt(np.mean(key**2)):.1f})")
  ax0.plot(channels, rotated_key, ".", ms=4, color="tab:green",
           label=f"|k H| (max / rms "
                 f"{rotated_key.max() / np.sqrt(np.mean(rotated_key**2)):.1f})")
  ax0.set_yscale("log")
  ax0.set_xlabel("channel")
  ax0.set_ylabel("|value| (key units, log axis)")
  ax0.set_title(f"one key with {outlier_channels} outlier channels, and "
                "rotated", fontsize=10)
  ax0.legend(fontsize=8)
  y = np.arange(len(diffs))
  means = [x[1].mean for x in diffs]
  err = np.nan_to_num([x[1].half_width for x in diffs])
  ax1.barh(y, means, xerr=err, capsize=4,
           color=["tab:green" if m > 0 else "tab:red" for m in means])
  ax1.axvline(0, color="k", lw=1)
  ax1.set_yticks(y, [x[0] for x in diffs], fontsize=8)
  ax1.set_xlabel("recall change from rotating (rotated - plain), "
                 "95% interval over seeds")
  ax1.set_title("what the rotation buys", fontsize=10)
  ax1.grid(alpha=.3, axis="x")
  fig.suptitle(title, fontsize=11)
  fig.tight_layout()
  return fig


CASE_COLORS = {"decode": "tab:blue", "decode_rest": "tab:cyan",
               "prefill": "tab:green", "mixed": "tab:orange"}


def iteration_order_figure(steps, num_seqs: int, *, title: str):
  """Notebook 04: the kernel's steps in execution order, one row per sequence.

  Args:
    steps: `tiling.steps(plan)` dicts (case, seqs, kv_lens, bq, bkv, bkv_sz);
      a step covers every sequence of its program. A block past a
      sequence's entries (computed, masked) is hatched.
    num_seqs: sequences of the batch (rows).
  """
  steps = list(steps)
  fig, ax = plt.subplots(figsize=(min(18, 3 + 0.28 * len(steps)),
                                  0.5 * num_seqs + 1.6))
  for x, st in enumerate(steps):
    for s, kv in zip(st["seqs"], st["kv_lens"]):
      past_end = st["bkv"] * st["bkv_sz"] >= max(kv, 1)
      ax.add_patch(patches.Rectangle(
          (x, s), 0.9, 0.8, fc=CASE_COLORS[st["case"]],
          alpha=0.25 if past_end else 0.9, ec="black", lw=0.4,
          hatch="//" if past_end else None))
      if len(steps) <= 80:
        ax.text(x + 0.45, s + 0.4, f"{st['bq']},{st['bkv']}", ha="center",
                va="center", fontsize=6)
  for case, c in CASE_COLORS.items():
    ax.add_patch(patches.Rectangle((0, 0), 0, 0, fc=c, label=case))
  ax.add_patch(patches.Rectangle(
      (0, 0), 0, 0, fc="white", ec="black", hatch="//",
      label="block past the sequence's end (computed, masked)"))
  ax.set_xlim(0, len(steps))
  ax.set_ylim(num_seqs, 0)
  ax.set_yticks(np.arange(num_seqs) + 0.4, [f"seq {s}" for s in range(num_seqs)])
  ax.set_xlabel("step in execution order (label: bq block, bkv block)")
  ax.set_title(title)
  ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.18), ncol=5, fontsize=8)
  return fig


def vmem_budget_figure(budget, bq_choices, bkv_choices, limits, *,
                       production=None, title: str):
  """Notebook 04: VMEM of a launch per (bq, bkv_p), the limits outlined.

  Args:
    budget: bytes[len(bq_choices), len(bkv_choices)].
    limits: generation -> bytes; the cells over each distinct limit are
      outlined in red (one line style per limit, up to three).
    production: (bq, bkv_p) to mark with a white square, or None.
  """
  mib = 2.0 ** 20
  budget = np.asarray(budget, float)
  fig, ax = plt.subplots(figsize=(7, 4.5))
  im = ax.imshow(budget / mib, cmap="viridis", norm=mcolors.LogNorm(),
                 origin="lower", aspect="auto")
  for i in range(len(bq_choices)):
    for j in range(len(bkv_choices)):
      ax.text(j, i, f"{budget[i, j] / mib:.1f}", ha="center", va="center",
              fontsize=7,
              color="white" if budget[i, j] < np.median(budget) else "black")
  # Outline, for each limit, the cells that exceed it (cell edges).
  for lvl, style in zip(sorted(set(limits.values())), ("-", "--", ":")):
    over = budget > lvl
    for i in range(len(bq_choices)):
      for j in range(len(bkv_choices)):
        if over[i, j] and (i == 0 or not over[i - 1, j]):
          ax.plot([j - 0.5, j + 0.5], [i - 0.5, i - 0.5], "r", ls=style, lw=1.5)
        if over[i, j] and (j == 0 or not over[i, j - 1]):
          ax.plot([j - 0.5, j - 0.5], [i - 0.5, i + 0.5], "r", ls=style, lw=1.5)
    ax.plot([], [], "r", ls=style, label=f"> {lvl / mib:.0f} MiB")
  if (production is not None and production[0] in bq_choices
      and production[1] in bkv_choices):
    i, j = bq_choices.index(production[0]), bkv_choices.index(production[1])
    ax.add_patch(patches.Rectangle((j - 0.45, i - 0.45), 0.9, 0.9, fill=False,
                                   ec="white", lw=2))
    ax.plot([], [], "s", mfc="none", mec="gray", label="production (bq, bkv_p)")
  ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.14), ncol=4, fontsize=7)
  ax.set_xticks(range(len(bkv_choices)), bkv_choices)
  ax.set_yticks(range(len(bq_choices)), bq_choices)
  ax.set_xlabel("num_kv_pages_per_block (bkv_p)")
  ax.set_ylabel("num_queries_per_block (bq)")
  ax.set_title(title)
  fig.colorbar(im, ax=ax, label="MiB")
  return fig


def causal_leak_figure(live, leaked_selected, leaked_mass, bound_differs,
                       seq_starts, *, title: str):
  """Notebook 05: per query row, the leaked entry's share of the top-k mass.

  Args:
    live, leaked_selected, bound_differs: bool[T]; leaked_mass: f[T].
    seq_starts: query rows where a sequence starts (dotted lines).
  """
  live = np.asarray(live, bool)
  sel = np.asarray(leaked_selected, bool)
  bound = np.asarray(bound_differs, bool)
  rows = np.flatnonzero(live)
  fig, ax = plt.subplots(figsize=(10, 4))
  ax.bar(rows, np.where(sel, np.asarray(leaked_mass), 0)[rows], color="tab:red",
         label="leaked entry's share of the vendored-rule top-k score mass")
  only = rows[bound[rows] & ~sel[rows]]
  ax.plot(only, np.zeros(len(only)), "x", color="0.4",
          label="bound differs, leaked entry not selected")
  for start in seq_starts:
    ax.axvline(start - 0.5, color="k", lw=0.8, ls=":")
  ax.xaxis.set_major_locator(plt.MaxNLocator(integer=True))
  ax.set_xlabel("query row (sequences separated by dotted lines)")
  ax.set_ylabel("share of top-k score")
  ax.set_title(title)
  ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=2,
            frameon=False)
  fig.tight_layout()
  return fig



def page_coverage_figure(coverage, page_sizes, budgets, *, page_entries: int,
                         title: str):
  """Notebook 05: how much of the exact token top-k the top pages hold.

  Args:
    coverage: "fp8" / "f32" -> {"count", "mass"} -> f[len(budgets),
      len(page_sizes)].
    page_entries: entries per sequence (random pages cover budget / it).
  """
  fig, axes = plt.subplots(1, 2, figsize=(11, 4), sharey=True)
  for ax, m in zip(axes, ("count", "mass")):
    for i, budget in enumerate(budgets):
      c = plt.cm.viridis(i / max(1, len(budgets)))
      ax.plot(page_sizes, coverage["fp8"][m][i], "o-", color=c,
              label=f"FP8 pages, k = {budget}")
      ax.plot(page_sizes, coverage["f32"][m][i], "s--", color=c, mfc="none",
              label=f"f32 pages, k = {budget}")
      ax.axhline(budget / page_entries, color=c, lw=0.8, ls=":")
    ax.set_xscale("log", base=2)
    ax.set_xticks(page_sizes)
    ax.set_xticklabels(page_sizes)
    ax.set_xlabel("page size (entries per page; k_pages = k / page size)")
    ax.grid(alpha=0.3)
    ax.set_title(f"coverage of the exact token top-k, by {m}")
  axes[0].set_ylabel("share inside the top-k_pages pages")
  axes[0].legend(fontsize=7)
  fig.suptitle(title, fontsize=9)
  fig.tight_layout()
  return fig


STAGE_COLORS = (("kernel", "tab:blue"), ("topk", "tab:orange"),
                ("other", "tab:gray"))


def roofline_figure(records, predictions, *, measured: bool,
                    generation: str | None, generations, device_kind: str = "",
                    split_generation: str = "v5e"):
  """Notebook 06: device time against the roofline, and its split by stage.

  measured (a TPU run with device times): left, stacked measured kernel /
  top-k / other microseconds per record with the bounds of `generation`
  marked; right, the measured split. Otherwise: left, the predicted bound
  of every generation at the TPU sweep sizes; right, the predicted split on
  `split_generation`; the figure says that device timings need a TPU.

  Args:
    records: run-file records (mode, batch_size, context_tokens, kernel_us,
      topk_us, other_us, predicted_us).
    predictions: (mode, B, L) -> generation -> roofline prediction (seconds
      per stage: fill, kernel, topk, total).
    generations: the generations drawn in the model panel.
  """
  fig, axes = plt.subplots(1, 2, figsize=(14, 4.6))
  ax = axes[0]
  if measured:
    labels = [f"{r['mode']}\nB={r['batch_size']}\nL={r['context_tokens']}"
              for r in records]
    x = np.arange(len(records))
    bottom = np.zeros(len(records))
    for stage, c in STAGE_COLORS:
      v = np.array([r[f"{stage}_us"] for r in records])
      ax.bar(x, v, bottom=bottom, color=c, label=f"measured {stage}")
      bottom += v
    if generation:
      ax.scatter(x, [r["predicted_us"][generation]["total"] for r in records],
                 marker="_", s=500, color="black", zorder=3,
                 label=f"roofline bound, {generation} (whole call)")
      ax.scatter(x, [r["predicted_us"][generation]["kernel"] for r in records],
                 marker="_", s=500, color="tab:blue", zorder=3,
                 label="roofline bound, kernel")
    ax.set_title(f"Measured on {device_kind} vs roofline")
    ax.set_xticks(x, labels, fontsize=8)
  else:
    keys = list(predictions)
    x = np.arange(len(keys))
    w = 0.8 / len(generations)
    for i, gen in enumerate(generations):
      ax.bar(x + i * w, [predictions[kk][gen]["total"] * 1e6 for kk in keys], w,
             label=gen)
    ax.set_xticks(x + 0.4 - w / 2, [f"{m}\nB={b}\nL={l}" for m, b, l in keys],
                  fontsize=8)
    ax.set_title("No TPU here: predicted bounds (model) at the TPU sweep sizes")
    ax.text(0.01, 0.97, "device timings need a TPU", transform=ax.transAxes,
            va="top", fontsize=9, color="darkred")
  ax.set_yscale("log")
  ax.set_ylabel("microseconds per call")
  ax.legend(fontsize=7)

  ax = axes[1]
  if measured:
    split = [(f"{r['mode']} B={r['batch_size']} L={r['context_tokens']}",
              r["kernel_us"], r["topk_us"], r["other_us"]) for r in records]
    ax.set_title("Measured split of the device time")
  else:
    g = split_generation
    split = [(f"{m} B={b} L={l}", pr[g]["kernel"], pr[g]["topk"], pr[g]["fill"])
             for (m, b, l), pr in predictions.items()]
    ax.set_title(f"Predicted split of the bound ({g}, model)")
  names = [s[0] for s in split]
  tot = np.array([sum(s[1:]) for s in split])
  left = np.zeros(len(split))
  for j, (lab, c) in enumerate((("scoring (kernel)", "tab:blue"),
                                ("top-k", "tab:orange"),
                                ("other (fill, pad)", "tab:gray"))):
    v = np.array([s[1 + j] for s in split]) / tot * 100
    ax.barh(names, v, left=left, color=c, label=lab)
    left += v
  ax.set_xlabel("% of the step")
  ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.14), ncol=3)
  fig.tight_layout()
  return fig


def static_schedule_figure(rows: Sequence[dict], bounds: Sequence, *,
                           title: str = ""):
  """Scheduled bundles per KV page against num_kv_pages_per_block, one panel
  per generation (`rows`: `lab.schedule.schedule_table` rows; `bounds`: the
  matching `roofline.PageBound`s). With a clock, the page's HBM time in
  cycles is a dashed line; without one, the break-even clock is written."""
  gens = list(dict.fromkeys(r["generation"] for r in rows))
  fig, axes = plt.subplots(1, len(gens), figsize=(3.2 * len(gens), 3.2),
                           sharey=True, squeeze=False)
  for ax, gen in zip(axes[0], gens):
    pairs = [(r, b) for r, b in zip(rows, bounds) if r["generation"] == gen]
    ax.plot([r["bkv_p"] for r, _ in pairs],
            [r["bundles_per_page"] for r, _ in pairs], "o-",
            label="scheduled bundles per page")
    clock = pairs[0][1].clock_hz
    if clock:
      ax.axhline(pairs[0][1].t_hbm * clock, color="k", ls="--",
                 label=f"a page's HBM time, cycles at {clock / 1e9:.2f} GHz")
    else:
      low = min(b.break_even_clock_hz for _, b in pairs)
      ax.text(0.05, 0.05, f"no public clock:\nvector-bound below\n"
              f"{low / 1e9:.2f} GHz", transform=ax.transAxes, fontsize=8)
    ax.set_title(gen)
    ax.set_xlabel("num_kv_pages_per_block (decode)")
    ax.set_ylim(bottom=0)
  axes[0][0].set_ylabel("bundles per KV page")
  axes[0][0].legend(fontsize=7, loc="upper right")
  if title:
    fig.suptitle(title, fontsize=10)
  return fig


def scaling_figure(rows: Sequence[dict], *, title: str = ""):
  """Notebook 07: the modelled decode step and cache per device over chips.

  `rows`: `lab.model.scaling.scaling_table` rows. Left: step time (us, log)
  against chips per generation, one chip per sequence (C = 1, solid) and
  the best context-parallel degree (dashed, where it differs). Right: cache
  MiB per JAX device for both.
  """
  gens = list(dict.fromkeys(r["generation"] for r in rows))
  fig, axes = plt.subplots(1, 2, figsize=(12, 4))
  for i, gen in enumerate(gens):
    rs = [r for r in rows if r["generation"] == gen]
    c = f"C{i}"
    chips = [r["chips"] for r in rs]
    for ax, one, best in ((axes[0], "step us (C=1)", "step us (best)"),
                          (axes[1], "cache MiB/device (C=1)",
                           "cache MiB/device (best)")):
      ax.plot(chips, [r[one] for r in rs], "o-", color=c,
              label=f"{gen}, one chip per sequence")
      if any(r[best] != r[one] for r in rs):
        ax.plot(chips, [r[best] for r in rs], "s--", color=c,
                label=f"{gen}, best context-parallel C")
  for ax, ylabel in ((axes[0], "modelled step (us, one layer)"),
                     (axes[1], "cache per JAX device (MiB, one layer)")):
    ax.set_xscale("log", base=2)
    ax.set_xticks(sorted({r["chips"] for r in rows}),
                  [str(n) for n in sorted({r["chips"] for r in rows})])
    ax.set_yscale("log")
    ax.set_xlabel("chips")
    ax.set_ylabel(ylabel)
    ax.grid(True, which="both", alpha=0.3)
  axes[0].legend(fontsize=7)
  if title:
    fig.suptitle(title, fontsize=10)
  fig.tight_layout()
  return fig


def crossover_figure(rows: Sequence[dict], *, title: str = ""):
  """Notebook 07: the context length from which context parallelism pays,
  against the assumed collective latency.

  `rows`: notebook 07's crossover rows (generation, chips,
  "latency us", "tokens" or None). One line per (generation, chips); a
  configuration where it never pays is left out of its line.
  """
  fig, ax = plt.subplots(figsize=(7, 4))
  keys = list(dict.fromkeys((r["generation"], r["chips"]) for r in rows))
  for gen, chips in keys:
    rs = [r for r in rows if (r["generation"], r["chips"]) == (gen, chips)
          and r["tokens"]]
    ax.plot([r["latency us"] for r in rs], [r["tokens"] for r in rs], "o-",
            label=f"{gen}, 1 sequence on {chips} chip(s)")
  ax.set_yscale("log", base=2)
  ax.set_xlabel("assumed latency per collective round (us)")
  ax.set_ylabel("shortest context that pays (tokens)")
  ax.grid(True, which="both", alpha=0.3)
  ax.legend(fontsize=7)
  if title:
    ax.set_title(title, fontsize=10)
  fig.tight_layout()
  return fig


def variant_timing_figure(records: Sequence[dict], *, measured: bool,
                          title: str = ""):
  """Notebook 06: every kernel configuration, measured against its model.

  `records`: notebook 06's configuration records (label, generation, the
  measured and modelled microseconds). One row per
  configuration: the measured device time (a TPU run: kernel and top-k
  stacked) beside the roofline bound (fill + kernel + the method's top-k,
  hollow bar) and the static-schedule bound (a marker, where computed).
  Without a TPU only the model is drawn, and the axes say so.
  """
  labels = [r["label"] for r in records]
  y = np.arange(len(records))
  fig, ax = plt.subplots(figsize=(10, 0.45 * len(records) + 1.6))
  h = 0.38
  if measured:
    k_ = np.array([r["kernel_us"] or 0.0 for r in records])
    t_ = np.array([r["topk_us"] or 0.0 for r in records])
    o_ = np.array([r["other_us"] or 0.0 for r in records])
    ax.barh(y - h / 2, k_, h, color="tab:blue", label="measured: kernel")
    ax.barh(y - h / 2, t_, h, left=k_, color="tab:orange",
            label="measured: top-k")
    ax.barh(y - h / 2, o_, h, left=k_ + t_, color="tab:gray",
            label="measured: other")
  gen = records[0]["generation"] if records else ""
  ax.barh(y + (h / 2 if measured else 0), [r["roofline us"] for r in records],
          h, fill=False, edgecolor="black",
          label=f"model: roofline bound ({gen})")
  st = [(i, r["static schedule us"]) for i, r in enumerate(records)
        if r["static schedule us"] is not None]
  if st:
    ax.scatter([v for _, v in st], [i + (h / 2 if measured else 0)
                                    for i, _ in st], marker="D",
               color="tab:red", zorder=3,
               label=f"model: static-schedule bound ({gen})")
  if not measured:
    ax.text(0.99, 0.02, "no TPU: no device timing exists; model only",
            transform=ax.transAxes, ha="right", fontsize=8, color="darkred")
  ax.set_yticks(y, labels, fontsize=8)
  ax.invert_yaxis()
  ax.set_xlabel("microseconds per call")
  ax.legend(fontsize=7, loc="lower right" if measured else "upper right")
  if title:
    ax.set_title(title, fontsize=10)
  fig.tight_layout()
  return fig


def decode_waste_figure(waste, batch_sizes: Sequence[int],
                        orders: Sequence[str], *, title: str):
  """Notebook 04: wasted share of computed KV blocks per decode order.

  Args:
    waste: {(B, order): [fraction per batch]} (notebook 04: `tiling.decode_batch_waste`);
      bars are means, error bars one standard deviation.
  """
  fig, ax = plt.subplots(figsize=(8, 3.6))
  width = 0.8 / len(orders)
  x = np.arange(len(batch_sizes))
  for i, o in enumerate(orders):
    ax.bar(x + i * width, [100 * np.mean(waste[b, o]) for b in batch_sizes],
           width, yerr=[100 * np.std(waste[b, o]) for b in batch_sizes],
           label=o, capsize=2)
  ax.set_xticks(x + width * (len(orders) - 1) / 2,
                [f"B = {b}" for b in batch_sizes])
  ax.set_xlabel("decode sequences per program (decode_req_batch_size)")
  ax.set_ylabel("% of computed KV blocks wasted")
  ax.set_title(title)
  ax.legend(title="order", fontsize=8)
  return fig


def decode_step_figure(rows: Sequence[dict], *, title: str):
  """Notebook 04: stacked roofline bounds (us) of one decode step per
  generation (notebook 04's step table: fill_us, kernel_us, topk_us)."""
  fig, ax = plt.subplots(figsize=(7, 3.2))
  gens = [r["generation"] for r in rows]
  bottom = np.zeros(len(rows))
  for stage, c in (("fill", "tab:gray"), ("kernel", "tab:blue"),
                   ("topk", "tab:orange")):
    v = np.array([r[f"{stage}_us"] for r in rows])
    ax.bar(gens, v, bottom=bottom, label=stage, color=c)
    bottom += v
  ax.set_xlabel("TPU generation")
  ax.set_ylabel("roofline lower bound, microseconds")
  ax.set_title(title)
  ax.legend()
  return fig


def query_scores_figure(scores, unmasked, chosen, *, k: int, n_visible: int,
                        compression_ratio: int, title: str):
  """Notebook 00: one query row's scores, the selected entries, the k-th
  score, and the entries the causal mask hides.

  Args:
    scores: f32[E] the row's scores as the reference returns them (-inf
      where the row may not look), E >= the sequence's entries.
    unmasked: f32[entries] the same row against every entry of its sequence,
      the masks left out (notebook 00 scores them with `ref.score_entries`).
    chosen: the entries the kernel returned (-1 padding removed).
    k: the call's k; n_visible: entries the row sees (0 .. n_visible - 1).
  """
  s = np.asarray(scores, np.float64)
  u = np.asarray(unmasked, np.float64)
  chosen = np.asarray(chosen, int)
  n_entries = len(u)
  visible = np.arange(n_visible)
  fig, ax = plt.subplots(figsize=(10, 4))
  ax.plot(visible, s[visible], ".", ms=4, color="0.45",
          label=f"visible entries ({n_visible})")
  ax.plot(chosen, s[chosen], "o", ms=6, mfc="none", mew=1.3,
          color="tab:red", label=f"returned by the kernel ({len(chosen)})")
  if n_entries > n_visible:
    hidden = np.arange(n_visible, n_entries)
    ax.axvspan(n_visible - .5, n_entries - .5, color="0.85", zorder=0)
    ax.plot(hidden, u[hidden], "x", ms=7, mew=1.6, color="0.3",
            label=f"masked by causality ({len(hidden)}): drawn at the score "
                  "they would have")
  if n_visible >= k:
    kth = float(np.sort(s[visible])[::-1][k - 1])
    ax.axhline(kth, color="tab:red", ls="--", lw=1,
               label=f"k-th best visible score ({kth:.3g}): the cut")
  ax.axvline(n_visible - .5, color="k", lw=1, ls="-",
             label=f"causal bound (p + 1) // {compression_ratio} = "
                   f"{n_visible}")
  ax.axvline(n_entries - .5, color="tab:blue", lw=1.5, ls=":",
             label=f"sequence end seq_len // {compression_ratio} = "
                   f"{n_entries}")
  ax.set_xlim(-1, n_entries + 1)
  ax.set_xlabel("compressed entry s (sequence-local index)")
  ax.set_ylabel("index score sum_h w[h] ReLU(q[h] . k[s])")
  ax.set_title(title, fontsize=10)
  ax.legend(loc="upper center", bbox_to_anchor=(.5, -.16), ncol=2, fontsize=8,
            frameon=False)
  ax.grid(alpha=.3)
  fig.tight_layout()
  return fig


def sublane_words_axes(ax, page, *, kv_packing: int, lanes: Sequence[int],
                       title: str, highlight: int | None = None,
                       lane_names: dict | None = None):
  """A cache page as 32-bit words: sublane rows x lanes, each word split
  into the `kv_packing` entries it packs.

  `page` is one physical page of the cache, `[page_size / kv_packing,
  kv_packing, lkv]` (uint8 FP8 bytes or bf16 values). The word at (row r,
  lane l) holds `page[r, j, l]` for j = 0 .. kv_packing - 1: the l-th byte
  (FP8) or value (bf16) of entries r * kv_packing + j, which is how the
  TPU tiles the two minor dimensions of the array (`T(4,128)(4,1)` for
  uint8, see `streamidx.cache`). Only `lanes` are drawn (a gap column marks
  skipped lanes); each part is labelled with its entry and, for uint8, its
  byte in hex. `highlight`: an entry to outline in red; `lane_names`: lane
  -> a name for its column header (e.g. the scale lane).
  """
  page = np.asarray(page)
  rows = page.shape[0]
  lanes = list(lanes)
  cols = []  # lane or None (a gap)
  for i, lane in enumerate(lanes):
    if i and lane != lanes[i - 1] + 1:
      cols.append(None)
    cols.append(lane)
  cmap = plt.get_cmap("tab20" if rows * kv_packing <= 20 else "viridis")
  n_entries = rows * kv_packing

  def color(t):
    return cmap(t % 20) if n_entries <= 20 else cmap(t / max(1, n_entries - 1))

  for x, lane in enumerate(cols):
    if lane is None:
      ax.text(x + .5, rows / 2, "...", ha="center", va="center", fontsize=12)
      continue
    for r in range(rows):
      for j in range(kv_packing):
        t = r * kv_packing + j
        x0 = x + j / kv_packing
        ax.add_patch(patches.Rectangle((x0, r), 1 / kv_packing, 1, ec="white",
                                       lw=.5, fc=color(t)))
        label = f"e{t}"
        if page.dtype == np.uint8:
          label += f"\n{int(page[r, j, lane]):02x}"
        ax.text(x0 + .5 / kv_packing, r + .5, label, ha="center",
                va="center", fontsize=5.5, linespacing=.9)
        if t == highlight:
          ax.add_patch(patches.Rectangle((x0, r), 1 / kv_packing, 1,
                                         fill=False, ec="red", lw=3,
                                         zorder=3))
      ax.add_patch(patches.Rectangle((x, r), 1, 1, fill=False, ec="black",
                                     lw=1.2))
  names = lane_names or {}
  ax.set_xlim(0, len(cols))
  ax.set_ylim(rows, 0)
  ax.set_xticks([x + .5 for x, l in enumerate(cols) if l is not None],
                [f"lane {l}" + (f"\n{names[l]}" if l in names else "")
                 for l in cols if l is not None], fontsize=7, rotation=0)
  ax.set_yticks(np.arange(rows) + .5,
                [f"row {r}\n(entries {r * kv_packing}..{r * kv_packing + kv_packing - 1})"
                 for r in range(rows)], fontsize=7)
  ax.set_xlabel("lane (the record's minor axis); each black box is one "
                "32-bit word", fontsize=8)
  ax.set_title(title, fontsize=9)


def decode_step_time_figure(rows: Sequence[dict], *, title: str,
                            labels: dict | None = None):
  """Predicted microseconds per decode step, per TPU generation and format.

  `rows`: notebook 02's decode-step rows (fmt, generation,
  step_us, stored_bytes). One group of bars per generation, one bar per
  format, each labelled with its microseconds; `labels`: fmt -> legend text
  (default: the layout's name and its stored bytes per entry).
  """
  fmts = list(dict.fromkeys(r["fmt"] for r in rows))
  gens = list(dict.fromkeys(r["generation"] for r in rows))
  by = {(r["fmt"], r["generation"]): r for r in rows}
  colors = {"fp8": "#4c72b0", "dense_fp8": "#55a868", "bf16": "#c44e52"}
  names = {"fp8": "vendored packed FP8", "dense_fp8": "dense FP8",
           "bf16": "bf16"}
  labels = labels or {}
  width = .8 / len(fmts)
  fig, ax = plt.subplots(figsize=(10, 4.2))
  for i, fmt in enumerate(fmts):
    xs = np.arange(len(gens)) + (i - (len(fmts) - 1) / 2) * width
    us = [by[fmt, g]["step_us"] for g in gens]
    stored = by[fmt, gens[0]]["stored_bytes"]
    bars = ax.bar(xs, us, width, color=colors.get(fmt),
                  label=labels.get(fmt, f"{names.get(fmt, fmt)} ({stored} "
                                        "B/entry stored)"))
    for bar, v in zip(bars, us):
      ax.text(bar.get_x() + bar.get_width() / 2, v, f"{v:.0f}",
              ha="center", va="bottom", fontsize=7)
  ax.set_xticks(np.arange(len(gens)), gens)
  ax.set_xlabel("TPU generation (HBM bandwidth of one TensorCore: "
                "lab.model.hardware, data/tpu_specs.json)")
  ax.set_ylabel("predicted us per decode step (model)")
  ax.set_title(title, fontsize=10)
  ax.legend(fontsize=8)
  ax.grid(axis="y", alpha=.3)
  fig.tight_layout()
  return fig


def causal_masks_figure(chunk, *, compression_ratio: int):
  """Notebook 02: a prefill chunk's visibility under the model's rule (left)
  and the vendored rule (right, the cells only it shows outlined red).

  `chunk`: `lab.studies.addressing.prefill_chunk_masks`.
  """
  fig, axes = plt.subplots(1, 2, figsize=(12, 4.6), sharey=True)
  visibility_axes(axes[0], chunk.masks["model"], chunk.positions,
                  compression_ratio=compression_ratio,
                  first_entry=chunk.first_entry,
                  title="model rule: s < (p + 1) // ratio")
  visibility_axes(axes[1], chunk.masks["seed"], chunk.positions,
                  diff=chunk.leak, compression_ratio=compression_ratio,
                  first_entry=chunk.first_entry,
                  title="vendored rule: s <= p // ratio  (red: the query's "
                        "own future block)")
  fig.suptitle(f"the vendored rule leaks one future block on "
               f"{chunk.leak_rows} of the {len(chunk.positions)} rows of "
               f"sequence {chunk.seq}'s prefill chunk (seq_len "
               f"{chunk.seq_len}, ratio {compression_ratio}; last "
               f"{chunk.n_entries - chunk.first_entry} entries shown)",
               fontsize=10)
  return fig


def runs_figure(timed_runs: Sequence[dict], *, last: int = 6):
  """Notebook 06: the kernel device time of the `last` TPU runs (run files
  holding device times, `lab.model.profiling.load_runs`) against each one's
  roofline bound, per sweep point (`profiling.plot_runs`)."""
  from streamidx.lab.model import profiling  # pylint: disable=g-import-not-at-top
  runs = list(timed_runs)[-last:]
  if not runs:
    raise ValueError("timed_runs: must hold at least one run with device times")
  fig, ax = plt.subplots(figsize=(11, 4))
  profiling.plot_runs(runs, ax=ax)
  ax.set_title(f"Kernel device time of {len(runs)} TPU run(s) against each one's roofline bound")
  return fig
