"""The notebooks' figures, one function per figure (or `Axes`) a notebook draws, in notebook
order. Each draws what it is given and computes nothing of its own; it returns the `Figure` (or
draws on the `Axes` passed in); `save` writes a PNG under a notebook's `output_dir`. Agg-safe.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Sequence

import matplotlib.pyplot as plt
from matplotlib import colors as mcolors
from matplotlib import patches
import numpy as np

FREE = "#eeeeee"  # a free page or an empty cell
CASE_COLORS = {"decode": "tab:blue", "decode_rest": "tab:cyan", "prefill": "tab:green",
               "mixed": "tab:orange"}
STAGE_COLORS = (("kernel", "tab:blue"), ("topk", "tab:orange"), ("other", "tab:gray"))


HEADLINE_FILE = "headline.json"  # in a notebook's output_dir: its headline figure's file name


def save(fig, output_dir, name: str, *, headline: bool = False) -> Path:
  """Writes `fig` to `<output_dir>/<name>.png` (folders created); the path. `headline`: this
  is the notebook's headline figure, which the landing page shows beside its answer
  (`<output_dir>/headline.json` names it)."""
  path = Path(output_dir) / f"{name}.png"
  path.parent.mkdir(parents=True, exist_ok=True)
  fig.savefig(path, dpi=110, bbox_inches="tight")
  if headline:
    (path.parent / HEADLINE_FILE).write_text(json.dumps({"figure": path.name}), encoding="utf-8")
  return path


def seq_colors(n: int) -> list:
  """n distinct colours, one per sequence (tab10, then tab20)."""
  cmap = plt.get_cmap("tab10" if n <= 10 else "tab20")
  return [cmap(i % cmap.N) for i in range(n)]


# Shared styling: every figure sets its axes and finishes through these.
def _style(ax, xlabel=None, ylabel=None, title=None, *, size=None, xlog=None, ylog=None,
           grid=None, legend=None):
  """Labels, a title (fontsize `size`), log scales (`xlog`/`ylog`: the base), a grid and a legend
  (keyword arguments, or an alpha / a fontsize) of one axes; before ticks (a scale resets them)."""
  if xlog: ax.set_xscale("log", base=xlog)
  if ylog: ax.set_yscale("log", base=ylog)
  if xlabel: ax.set_xlabel(xlabel)
  if ylabel: ax.set_ylabel(ylabel)
  if title: ax.set_title(title, fontsize=size)
  if grid is not None: ax.grid(**(grid if isinstance(grid, dict) else {"alpha": grid}))
  if legend is not None: ax.legend(**(legend if isinstance(legend, dict) else {"fontsize": legend}))


def _done(fig, title=None, size=11):
  """The figure's title (its finding), if any, and a tight layout; the figure."""
  if title: fig.suptitle(title, fontsize=size)
  fig.tight_layout()
  return fig


def _box(ax, x, y, fc, text=None, *, w=1, h=1, size=7, color="white", **kw):
  """A w x h cell at (x, y) filled `fc` (white edges), `text` centred in it."""
  ax.add_patch(patches.Rectangle((x, y), w, h, fc=fc, **{"ec": "white", **kw}))
  if text is not None: _text(ax, x + w / 2, y + h / 2, text, size, color)


def _text(ax, x, y, text, size, color="black", **kw):
  """`text` centred at (x, y)."""
  ax.text(x, y, text, ha="center", va="center", fontsize=size, color=color, **kw)


def _outline(ax, x, y, w, h, ec="black", **kw):
  """An unfilled w x h rectangle at (x, y)."""
  ax.add_patch(patches.Rectangle((x, y), w, h, fill=False, ec=ec, **kw))


def _grid_axes(ax, width, height, xlabels=None, ylabels=None, size=7):
  """Limits of a grid of unit cells (row 0 at the top), ticks at the cell centres."""
  ax.set(xlim=(0, width), ylim=(height, 0))
  for labels, ticks in ((xlabels, ax.set_xticks), (ylabels, ax.set_yticks)):
    labels = [] if labels is None else list(labels)  # none: no ticks
    ticks(np.arange(len(labels)) + .5, labels, fontsize=size)


def _stack(ax, pos, parts, *, width=.8, horizontal=False, **kw):
  """Stacked bars at `pos`: `parts` is [(label, colour, values)]; the totals."""
  base = np.zeros(len(pos))
  for label, color, v in parts:
    v = np.asarray(v, float)
    (ax.barh if horizontal else ax.bar)(pos, v, width, base, color=color, label=label, **kw)
    base += v
  return base


def _grouped(ax, groups, series, labels=None):
  """One group of bars per `groups` entry, one bar per `series` item [(label, values,
  keyword arguments of `ax.bar`)]; `labels`: the group tick labels. The bar containers."""
  width = .8 / len(series)
  x = np.arange(len(groups))
  bars = [ax.bar(x + (i - (len(series) - 1) / 2) * width, v, width, label=label, **kw)
          for i, (label, v, kw) in enumerate(series)]
  ax.set_xticks(x, labels or groups)
  return bars


def page_table_figure(batches: Sequence, titles: Sequence[str]):
  """Notebook 01, a row per batch: its page table (cells: physical pages) and its pool of
  physical pages, coloured by owning sequence (grey: free), labelled "seq:local page"."""
  fig, axes = plt.subplots(len(batches), 2, figsize=(13, 2.6 * len(batches)), squeeze=False,
                           gridspec_kw={"width_ratios": [1, 2.2]})
  for (ax_t, ax_p), batch, title in zip(axes, batches, titles):
    colors, table, used = seq_colors(batch.num_seqs), batch.page_table, batch.num_pages_used
    owner, local = np.full(batch.total_num_pages, -1), np.zeros(batch.total_num_pages, int)
    for b in range(batch.num_seqs):
      for p in range(batch.pages_per_seq):
        live = p < used[b]
        _box(ax_t, p, b, colors[b] if live else FREE, str(table[b, p]) if live else None, size=8)
        if live: owner[table[b, p]], local[table[b, p]] = b, p
    _grid_axes(ax_t, batch.pages_per_seq, batch.num_seqs, range(batch.pages_per_seq),
               [f"seq {b}" for b in range(batch.num_seqs)])
    _style(ax_t, "local page p", title=f"{title}: page table", size=9)
    for page, own in enumerate(owner):
      x, y = page % 32, page // 32
      _box(ax_p, x, y, colors[own] if own >= 0 else FREE)
      _text(ax_p, x + .5, y + .32, str(page), 5.5, "black" if own < 0 else "white")
      if own >= 0: _text(ax_p, x + .5, y + .72, f"{own}:{local[page]}", 5.5, "white")
    _grid_axes(ax_p, 32, -(-batch.total_num_pages // 32))
    _style(ax_p, title=f"{title}: physical pages (number; owner seq:local page; grey = free)",
           size=9)
    ax_p.set_aspect("equal")
  return _done(fig)


def record_bytes_axes(ax, record, head_dim: int, *, title: str):
  """Notebook 02: one uint8 FP8 record as a 16-wide grid of bytes, coloured by role (e4m3
  value / e8m0 scale / padding), each labelled in hex."""
  rec = np.asarray(record, np.uint8).reshape(-1)
  width, rows = 16, -(-rec.size // 16)
  roles = (("e4m3 value", "#4c72b0"), ("e8m0 scale", "#dd8452"), ("zero padding", "#dddddd"))
  for i, byte in enumerate(rec):
    role = 0 if i < head_dim else 1 if i == head_dim else 2
    _box(ax, i % width, i // width, roles[role][1])
    _text(ax, i % width + .5, i // width + .5, f"{byte:02x}", 6.5,
          "#777777" if role == 2 else "white", family="monospace")
  _grid_axes(ax, width, rows, [f"+{i:x}" for i in range(width)],
             [f"{r * width:3d}" for r in range(rows)])
  ax.set_aspect("equal")
  ax.legend(handles=[patches.Patch(color=c, label=l) for l, c in roles], loc="upper center",
            bbox_to_anchor=(.5, -.02), ncol=3, fontsize=8, frameon=False)
  ax.set_title(title, fontsize=9)


def visibility_axes(ax, mask, q_positions, *, title: str, diff=None,
                    compression_ratio: int | None = None, first_entry: int = 0):
  """A [T, E] visibility mask (dark = visible), `diff` cells outlined red; column c is entry
  `first_entry + c` (to draw a window of a long sequence)."""
  mask = np.asarray(mask, bool)
  t, e = mask.shape
  ax.imshow(mask, cmap=mcolors.ListedColormap(["#f4f4f4", "#31688e"]), vmin=0, vmax=1,
            aspect="auto", interpolation="nearest", extent=(0, e, t, 0))
  for r, c in zip(*np.nonzero(np.asarray(diff))) if diff is not None else ():
    _outline(ax, c, r, 1, 1, ec="red", lw=1.6, hatch="///")
  ax.set_xticks(np.arange(e) + .5, range(first_entry, first_entry + e), fontsize=7)
  ax.set_yticks(np.arange(t) + .5, [f"p={p}" for p in q_positions], fontsize=7)
  r = compression_ratio
  ax.set_xlabel("compressed entry s" + (f" (tokens {r}s .. {r}s+{r - 1})" if r else ""),
                fontsize=8)
  ax.set_title(title, fontsize=9)
  ax.set_xticks(np.arange(e + 1), minor=True)
  ax.set_yticks(np.arange(t + 1), minor=True)
  ax.grid(which="minor", color="white", lw=.6)
  ax.tick_params(which="minor", length=0)


def sublane_words_axes(ax, page, *, kv_packing: int, lanes: Sequence[int], title: str,
                       highlight: int | None = None, lane_names: dict | None = None):
  """Notebook 02: a cache page `[page_size / kv_packing, kv_packing, lkv]` (uint8 or bf16) as
  32-bit words, sublane rows x `lanes` ("..." marks skipped lanes); word (r, l) holds
  `page[r, :, l]` (the tiling: `streamidx.cache`). `highlight`: an entry outlined red;
  `lane_names`: lane -> a column header."""
  page = np.asarray(page)
  rows, lanes, names = page.shape[0], list(lanes), lane_names or {}
  cols = []  # lane or None (a gap)
  for i, lane in enumerate(lanes):
    cols += [None] * (i > 0 and lane != lanes[i - 1] + 1) + [lane]
  n_entries = rows * kv_packing
  cmap = plt.get_cmap("tab20" if n_entries <= 20 else "viridis")
  color = lambda t: cmap(t % 20) if n_entries <= 20 else cmap(t / max(1, n_entries - 1))
  w = 1 / kv_packing
  for x, lane in enumerate(cols):
    if lane is None:
      _text(ax, x + .5, rows / 2, "...", 12)
      continue
    for r in range(rows):
      for j in range(kv_packing):
        t = r * kv_packing + j
        label = f"e{t}" + (f"\n{int(page[r, j, lane]):02x}" if page.dtype == np.uint8 else "")
        _box(ax, x + j * w, r, color(t), w=w, lw=.5)
        _text(ax, x + (j + .5) * w, r + .5, label, 5.5, linespacing=.9)
        if t == highlight: _outline(ax, x + j * w, r, w, 1, ec="red", lw=3, zorder=3)
      _outline(ax, x, r, 1, 1, lw=1.2)
  ax.set(xlim=(0, len(cols)), ylim=(rows, 0))
  ax.set_xticks([x + .5 for x, l in enumerate(cols) if l is not None],
                [f"lane {l}" + (f"\n{names[l]}" if l in names else "")
                 for l in cols if l is not None], fontsize=7)
  ax.set_yticks(np.arange(rows) + .5, [f"row {r}\n(entries {r * kv_packing}.."
                                       f"{r * kv_packing + kv_packing - 1})" for r in range(rows)],
                fontsize=7)
  ax.set_xlabel("lane (the record's minor axis); each black box is one 32-bit word", fontsize=8)
  ax.set_title(title, fontsize=9)


def batch_launch_figure(batch, plan, *, filled_rows=None):
  """Notebook 02: the ragged batch's query rows (coloured by sequence) and, a band per launch
  of `plan` (a `tiling.Plan`), each program's rows; `filled_rows` (bool[T]): a last band."""
  colors, t, launches = seq_colors(batch.num_seqs), batch.num_tokens, plan.launches
  n_bands = 1 + len(launches) + (filled_rows is not None)
  fig, ax = plt.subplots(figsize=(max(9, t * .42), 1.2 + .62 * n_bands))
  for r, s in enumerate(batch.token_seq_ids()[:t]):
    _box(ax, r, 0, colors[s] if s >= 0 else FREE, str(s) if s >= 0 else None, h=.8)
  d, cu = batch.distribution, batch.cu_q_lens
  for name, lo, hi in (("decode", 0, d[0]), ("prefill-only", d[0], d[1]), ("mixed", d[1], d[2])):
    if hi > lo:
      ax.annotate("", (cu[lo], -.15), (cu[hi], -.15), arrowprops=dict(arrowstyle="<->", lw=.8))
      ax.text((cu[lo] + cu[hi]) / 2, -.3, f"{name}: seqs [{lo}, {hi})", ha="center",
              va="bottom", fontsize=8)
  labels = ["query rows\n(seq id)"]
  for y, launch in enumerate(launches, 1):
    labels.append(f"launch {y - 1}: {launch.name}\n{launch.seq_batch_size} seq(s) per program, "
                  f"grid={launch.grid}")
    for pr in launch.programs:
      for (lo, hi), s in zip(pr.q_rows, pr.seqs):
        if hi > lo: _box(ax, lo, y + .05, colors[s], w=hi - lo, h=.7, ec="black", alpha=.55)
      lo, hi = min(q[0] for q in pr.q_rows), max(q[1] for q in pr.q_rows)
      _outline(ax, lo, y + .05, max(hi - lo, .3), .7, lw=1.4)
      _text(ax, (lo + hi) / 2, y + .42, f"p{pr.index}\n{pr.num_bq}x{pr.num_bkv}", 6.5,
            linespacing=.9)
  if filled_rows is not None:
    labels.append("rows the kernel\nreturned indices for")
    for r in np.flatnonzero(np.asarray(filled_rows)):
      _box(ax, r, len(launches) + 1.05, "#333333", h=.7)
  ax.set(xlim=(0, t), ylim=(n_bands, -.6))
  ax.set_yticks(np.arange(n_bands) + .4, labels, fontsize=7)
  ax.set_xticks(np.arange(0, t + 1, max(1, t // 16)))
  ax.set_xlabel("query row (token index into q; cu_q_lens[b] is where sequence b starts)",
                fontsize=8)
  ax.set_title("boxes: programs (pN = program N of the launch; a x b = num_bq query blocks x "
               "num_bkv KV blocks it loops over)", fontsize=8)
  return _done(fig)


def causal_masks_figure(chunk, *, compression_ratio: int):
  """Notebook 02: a prefill chunk's visibility (`lab.studies.addressing.prefill_chunk_masks`)
  under the model's rule (left) and the vendored rule (right, the cells only it shows red)."""
  fig, axes = plt.subplots(1, 2, figsize=(12, 4.6), sharey=True)
  kw = dict(compression_ratio=compression_ratio, first_entry=chunk.first_entry)
  visibility_axes(axes[0], chunk.masks["model"], chunk.positions, **kw,
                  title="model rule: s < (p + 1) // ratio")
  visibility_axes(axes[1], chunk.masks["seed"], chunk.positions, diff=chunk.leak, **kw,
                  title="vendored rule: s <= p // ratio  (red: the query's own future block)")
  return _done(fig, f"the vendored rule leaks one future block on {chunk.leak_rows} of the "
               f"{len(chunk.positions)} rows of sequence {chunk.seq}'s prefill chunk (seq_len "
               f"{chunk.seq_len}, ratio {compression_ratio}; last "
               f"{chunk.n_entries - chunk.first_entry} entries shown)", size=10)


def decode_step_time_figure(rows: Sequence[dict], *, title: str):
  """Notebook 02: predicted microseconds per decode step (`rows`: fmt, generation, step_us,
  stored_bytes), a group of bars per generation, a labelled bar per format."""
  by = {(r["fmt"], r["generation"]): r for r in rows}
  fmts, gens = (list(dict.fromkeys(k[i] for k in by)) for i in (0, 1))
  names = {"fp8": ("vendored packed FP8", "#4c72b0"), "dense_fp8": ("dense FP8", "#55a868"),
           "bf16": ("bf16", "#c44e52")}
  fig, ax = plt.subplots(figsize=(10, 4.2))
  for bars in _grouped(ax, gens, [
      (f"{names.get(f, (f,))[0]} ({by[f, gens[0]]['stored_bytes']} B/entry stored)",
       [by[f, g]["step_us"] for g in gens], dict(color=names.get(f, (f, None))[1])) for f in fmts]):
    ax.bar_label(bars, fmt="%.0f", fontsize=7)
  _style(ax, "TPU generation (HBM bandwidth of one TensorCore: lab.model.hardware, "
         "data/tpu_specs.json)", "predicted us per decode step (model)", title, size=10,
         grid=dict(axis="y", alpha=.3), legend=8)
  return _done(fig)


def query_scores_figure(scores, unmasked, chosen, *, k: int, n_visible: int,
                        compression_ratio: int, title: str):
  """Notebook 00: one query row's scores (`scores` f32[E >= entries], -inf where masked), the
  entries the kernel returned (`chosen`), the k-th score, and the masked entries drawn at their
  unmasked scores (`unmasked` f32[entries]); the row sees entries 0 .. n_visible - 1."""
  s, u = np.asarray(scores, np.float64), np.asarray(unmasked, np.float64)
  chosen, n_entries, visible = np.asarray(chosen, int), len(u), np.arange(n_visible)
  fig, ax = plt.subplots(figsize=(10, 4))
  ax.plot(visible, s[visible], ".", ms=4, color="0.45", label=f"visible entries ({n_visible})")
  ax.plot(chosen, s[chosen], "o", ms=6, mfc="none", mew=1.3, color="tab:red",
          label=f"returned by the kernel ({len(chosen)})")
  if n_entries > n_visible:
    hidden = np.arange(n_visible, n_entries)
    ax.axvspan(n_visible - .5, n_entries - .5, color="0.85", zorder=0)
    ax.plot(hidden, u[hidden], "x", ms=7, mew=1.6, color="0.3",
            label=f"masked by causality ({len(hidden)}): drawn at the score they would have")
  if n_visible >= k:
    kth = float(np.sort(s[visible])[::-1][k - 1])
    ax.axhline(kth, color="tab:red", ls="--", lw=1,
               label=f"k-th best visible score ({kth:.3g}): the cut")
  ax.axvline(n_visible - .5, color="k", lw=1,
             label=f"causal bound (p + 1) // {compression_ratio} = {n_visible}")
  ax.axvline(n_entries - .5, color="tab:blue", lw=1.5, ls=":",
             label=f"sequence end seq_len // {compression_ratio} = {n_entries}")
  ax.set_xlim(-1, n_entries + 1)
  _style(ax, "compressed entry s (sequence-local index)",
         "index score sum_h w[h] ReLU(q[h] . k[s])", title, size=10, grid=.3,
         legend=dict(loc="upper center", bbox_to_anchor=(.5, -.16), ncol=2, fontsize=8,
                     frameon=False))
  return _done(fig)


def scale_error_figure(scale_study, *, title: str | None = None):
  """Notebook 03: record error with ue8m0 vs exact float scales for the first two
  distributions of `scale_study`, and where the "gaussian" amax / 2**e lands."""
  fig, axes = plt.subplots(1, 3, figsize=(15, 3.6))
  for ax, dist in zip(axes[:2], scale_study):
    st = scale_study[dist]
    bins = np.linspace(0, max(st["err_pow2"].max(), st["err_float"].max()), 60)
    ax.hist(st["err_float"], bins, alpha=.6,
            label=f"exact float scale (mean {st['mean_err_float']:.4f})")
    ax.hist(st["err_pow2"], bins, alpha=.6, label=f"ue8m0 scale (mean {st['mean_err_ue8m0']:.4f})")
    _style(ax, "||k - deq(q(k))|| / ||k|| (relative L2 error, no unit)", "records",
           f"{dist} keys: relative L2 error per record", size=10, legend=8)
  axes[2].hist(scale_study["gaussian"]["amax_over_scale"], 60, color="tab:green")
  axes[2].axvline(448, color="k", ls="--", lw=1)
  _style(axes[2], "amax / 2**e (448 = e4m3 max)", "records",
         "where amax lands with a ue8m0 scale (gaussian)", size=10)
  return _done(fig, title)


def e4m3_use_figure(positive, spacing, stored, *, title: str):
  """Notebook 03: the share of `stored` |values| (f[M], ue8m0-scaled records, zeros left out)
  in each binade [2**e, 2**(e+1)) of the e4m3 grid (`positive`: f[N] its positive finite
  values, sorted), subnormals (below 2**-6) shaded; and its relative spacing (`spacing`:
  f[N - 1] (next - x) / x, twice the worst rounding error)."""
  positive, stored = np.asarray(positive, np.float64), np.asarray(stored, np.float64)
  stored = stored[stored > 0]
  lo, hi = np.log2(positive.min()), np.log2(positive.max())
  edges = np.exp2(np.arange(np.floor(lo), np.ceil(hi) + 1))
  counts, _ = np.histogram(stored, edges)
  fig, (ax0, ax1) = plt.subplots(1, 2, figsize=(13, 3.8))
  ax0.bar(edges[:-1], counts / max(1, stored.size), width=np.diff(edges), align="edge",
          edgecolor="white")
  ax1.plot(positive[:-1], np.asarray(spacing, np.float64), ".-", ms=3)
  for ax, label in ((ax0, "subnormals (fewer mantissa bits)"), (ax1, None)):
    ax.axvspan(positive.min(), 2.0 ** -6, color="tab:orange", alpha=.15, label=label)
  _style(ax0, "stored |value| (binades of the e4m3 grid, log2 axis)",
         "share of stored nonzero values", "where ue8m0-scaled records land", size=10, xlog=2,
         legend=8)
  _style(ax1, "e4m3 value x (log2 axis)", "(next value - x) / x (relative spacing)",
         "relative spacing of the grid", size=10, xlog=2, ylog=2,
         grid=dict(alpha=.3, which="both"))
  return _done(fig, title)


def recall_ci_figure(summary, *, dists, contexts, ks, variants, title: str):
  """Notebook 03: mean recall@k and its 95% interval in [0, 1] (`summary(dist, entries,
  variant, k)`: mean, half_width), a panel per (dist, entries), a line per variant."""
  fig, axes = plt.subplots(len(dists), len(contexts), sharey=True, squeeze=False,
                           figsize=(4.2 * len(contexts), 3.5 * len(dists)))
  for i, dist in enumerate(dists):
    for j, entries in enumerate(contexts):
      ax, kk = axes[i, j], [k for k in ks if k <= entries]
      for name in variants:
        s = [summary(dist, entries, name, k) for k in kk]
        mean, half = np.array([x.mean for x in s]), np.nan_to_num([x.half_width for x in s])
        err = [mean - np.maximum(mean - half, 0), np.minimum(mean + half, 1) - mean]
        ax.errorbar(kk, mean, yerr=err, fmt="o-", ms=4, capsize=3, label=name)
      _style(ax, "k (entries selected, log2 axis)" if i == len(dists) - 1 else None,
             "recall@k vs exact f32 top-k" if j == 0 else None,
             f"{dist} keys, {entries} entries", size=10, xlog=2, grid=.3)
      ax.set_xticks(kk, [str(k) for k in kk])
      ax.minorticks_off()
  axes[0, 0].legend(fontsize=8)
  return _done(fig, title)


def rotation_figure(key, rotated_key, diffs, *, outlier_channels: int, title: str):
  """Notebook 03: a key before and after the Hadamard rotation (|value| per channel); the
  recall it changes (`diffs`: [(label, MeanCI)]) with 95% intervals, on an axis through 0."""
  fig, (ax0, ax1) = plt.subplots(1, 2, figsize=(13, 3.8), gridspec_kw={"width_ratios": [1.4, 1]})
  for v, name, color in ((key, "|k|", None), (rotated_key, "|k H|", "tab:green")):
    v = np.abs(np.asarray(v))
    ax0.plot(np.arange(v.size), v, ".", ms=4, color=color,
             label=f"{name} (max / rms {v.max() / np.sqrt(np.mean(v**2)):.1f})")
  _style(ax0, "channel", "|value| (key units, log axis)",
         f"one key with {outlier_channels} outlier channels, and rotated", size=10, ylog=10,
         legend=8)
  y, means = np.arange(len(diffs)), [x[1].mean for x in diffs]
  ax1.barh(y, means, xerr=np.nan_to_num([x[1].half_width for x in diffs]), capsize=4,
           color=["tab:green" if m > 0 else "tab:red" for m in means])
  ax1.axvline(0, color="k", lw=1)
  ax1.set_yticks(y, [x[0] for x in diffs], fontsize=8)
  _style(ax1, "recall change from rotating (rotated - plain), 95% interval over seeds",
         title="what the rotation buys", size=10, grid=dict(alpha=.3, axis="x"))
  return _done(fig, title)


STEP_STAGE_COLORS = {"fill": "tab:gray", "scoring": "tab:blue", "selection": "tab:orange",
                     "copies": "tab:red"}  # roofline.Stage names


def step_stages_figure(steps: dict, *, title: str):
  """Notebooks 05 and 08: the production step stage by stage (`roofline.dsv4_step`'s
  `StepBound.stages`), one horizontal stacked bar per label of `steps` {label: StepBound}; a
  floor (`at_least`: a stage without a count or a clock) is hatched and says "at least"; each
  bar names its clock (`Stage.clock_hz`, and whether it was inferred: `clock_source`). A bar
  over 2.5x the next longest is cut at 1.8x that one, its length written on it (a chip's floor
  would otherwise squash the others)."""
  fig, ax = plt.subplots(figsize=(8.5, 0.55 * len(steps) + 1.6))
  pos = np.arange(len(steps))[::-1]
  names = list(dict.fromkeys(st.name for sb in steps.values() for st in sb.stages))
  us = lambda sb, n: 1e6 * sum(st.bound for st in sb.stages if st.name == n)
  totals = _stack(ax, pos, [(n, STEP_STAGE_COLORS.get(n, "tab:purple"),
                             [us(sb, n) for sb in steps.values()]) for n in names],
                  horizontal=True, width=.6)
  longest = sorted(totals)[-2:]
  cut = 1.8 * longest[0] if len(longest) == 2 and longest[1] > 2.5 * longest[0] else None
  for y, sb, t in zip(pos, steps.values(), totals):
    hz = sb.stages[0].clock_hz
    clock = (f"{hz / 1e9:.2f} GHz, {'inferred' if 'inferred' in sb.clock_source else 'public'}"
             if hz else "no clock: bundles not timed")
    if sb.at_least:
      ax.barh(y, t, .6, fill=False, hatch="//", ec="black", lw=0)
    label = f"{'at least ' if sb.at_least else ''}{t:,.0f} us ({clock})"
    if cut and t > cut:  # the bar runs off the axis: a break mark, and its length on it
      ax.plot([cut * .97, cut], [y - .35, y + .35], color="white", lw=4)
      ax.text(cut * .95, y, f"{label}, bar cut ", va="center", ha="right", fontsize=8,
              bbox=dict(fc="white", ec="none", alpha=.85))
    else:
      ax.text(t, y, f"  {label}", va="center", fontsize=8)
  ax.set_yticks(pos, list(steps))
  ax.set_xlim(0, cut or 1.5 * max(totals))
  _style(ax, "microseconds (each stage the larger of its HBM and static-schedule bounds; "
         "hatched: a floor)", title=title, size=10, legend=dict(fontsize=8, loc="lower right"))
  return _done(fig)


def causal_leak_figure(live, leaked_selected, leaked_mass, bound_differs, seq_starts, *,
                       title: str):
  """Notebook 05: per live query row (bool[T] masks, f[T] mass), the leaked entry's share of the
  vendored-rule top-k mass; x: bound differs, leak unselected; dotted: `seq_starts`."""
  live, sel = np.asarray(live, bool), np.asarray(leaked_selected, bool)
  rows = np.flatnonzero(live)
  fig, ax = plt.subplots(figsize=(10, 4))
  ax.bar(rows, np.where(sel, np.asarray(leaked_mass), 0)[rows], color="tab:red",
         label="leaked entry's share of the vendored-rule top-k score mass")
  only = rows[np.asarray(bound_differs, bool)[rows] & ~sel[rows]]
  ax.plot(only, np.zeros(len(only)), "x", color="0.4",
          label="bound differs, leaked entry not selected")
  for start in seq_starts:
    ax.axvline(start - 0.5, color="k", lw=0.8, ls=":")
  ax.xaxis.set_major_locator(plt.MaxNLocator(integer=True))
  _style(ax, "query row (sequences separated by dotted lines)", "share of top-k score", title,
         legend=dict(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=2,
                     frameon=False))
  return _done(fig)


def page_coverage_figure(coverage, page_sizes, budgets, *, page_entries: int, title: str):
  """Notebook 05: the exact token top-k's share in the top pages (`coverage`: "fp8" / "f32"
  -> "count" / "mass" -> f[len(budgets), len(page_sizes)]); dotted: random pages."""
  fig, axes = plt.subplots(1, 2, figsize=(11, 4), sharey=True)
  for ax, m in zip(axes, ("count", "mass")):
    for i, budget in enumerate(budgets):
      c = plt.cm.viridis(i / max(1, len(budgets)))
      ax.plot(page_sizes, coverage["fp8"][m][i], "o-", color=c, label=f"FP8 pages, k = {budget}")
      ax.plot(page_sizes, coverage["f32"][m][i], "s--", color=c, mfc="none",
              label=f"f32 pages, k = {budget}")
      ax.axhline(budget / page_entries, color=c, lw=0.8, ls=":")
    _style(ax, "page size (entries per page; k_pages = k / page size)",
           title=f"coverage of the exact token top-k, by {m}", xlog=2, grid=0.3)
    ax.set_xticks(page_sizes, page_sizes)
  _style(axes[0], ylabel="share inside the top-k_pages pages", legend=7)
  return _done(fig, title, size=9)


def roofline_figure(records, predictions, *, measured: bool, generation: str | None,
                    generations, device_kind: str = ""):
  """Notebook 08: device time against the roofline, and its split by stage: `measured`, the
  run-file `records` and `generation`'s bounds; else each of `generations`' predicted bound
  (`predictions`: (mode, B, L) -> generation -> seconds per stage) and v5e's split, said so."""
  fig, (ax, ax_split) = plt.subplots(1, 2, figsize=(14, 4.6))
  if measured:
    x = np.arange(len(records))
    _stack(ax, x, [(f"measured {s}", c, [r[f"{s}_us"] for r in records])
                   for s, c in STAGE_COLORS])
    if generation:
      for part, color, label in (("total", "black", f"roofline bound, {generation} (whole call)"),
                                 ("kernel", "tab:blue", "roofline bound, kernel")):
        ax.scatter(x, [r["predicted_us"][generation][part] for r in records], marker="_",
                   s=500, color=color, zorder=3, label=label)
    ax.set_title(f"Measured on {device_kind} vs roofline")
    ax.set_xticks(x, [f"{r['mode']}\nB={r['batch_size']}\nL={r['context_tokens']}"
                      for r in records], fontsize=8)
    split = [(f"{r['mode']} B={r['batch_size']} L={r['context_tokens']}", r["kernel_us"],
              r["topk_us"], r["other_us"]) for r in records]
    split_title = "Measured split of the device time"
  else:
    keys = list(predictions)
    _grouped(ax, keys, [(g, [predictions[kk][g]["total"] * 1e6 for kk in keys], {})
                        for g in generations], labels=[f"{m}\nB={b}\nL={l}" for m, b, l in keys])
    ax.tick_params(axis="x", labelsize=8)
    ax.set_title("No TPU here: predicted bounds (model) at the TPU sweep sizes")
    ax.text(0.01, 0.97, "device timings need a TPU", transform=ax.transAxes, va="top",
            fontsize=9, color="darkred")
    split = [(f"{m} B={b} L={l}", pr["v5e"]["kernel"], pr["v5e"]["topk"], pr["v5e"]["fill"])
             for (m, b, l), pr in predictions.items()]
    split_title = "Predicted split of the bound (v5e, model)"
  _style(ax, ylabel="microseconds per call", ylog=10, legend=7)
  tot = np.array([sum(s[1:]) for s in split])
  _stack(ax_split, [s[0] for s in split],
         [(label, c, np.array([s[1 + j] for s in split]) / tot * 100) for j, (label, c) in
          enumerate((("scoring (kernel)", "tab:blue"), ("top-k", "tab:orange"),
                     ("other (fill, pad)", "tab:gray")))], horizontal=True)
  _style(ax_split, "% of the step", title=split_title,
         legend=dict(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.14), ncol=3))
  return _done(fig)


def calibration_figure(rows: Sequence[dict], *, band: float, title: str):
  """Notebook 08: predicted against measured seconds, log-log, one point per public
  measurement with a prediction (`calibration.rows()` rows: measured_s, predicted_s, chip,
  source, stage, method, shape), numbered, their source, stage and shape in a column beside
  the axes; the diagonal and the x`band` band around it."""
  rs = [r for r in rows if r["predicted_s"] is not None]
  fig, ax = plt.subplots(figsize=(6, 5.5))
  lo = 0.5 * min(min(r["measured_s"], r["predicted_s"]) for r in rs) * 1e3
  hi = 2 * max(max(r["measured_s"], r["predicted_s"]) for r in rs) * 1e3
  x = np.geomspace(lo, hi, 50)
  ax.fill_between(x, x / band, x * band, color="tab:green", alpha=.15,
                  label=f"within {band}x of measured")
  ax.plot(x, x, "k--", lw=1, label="predicted = measured")
  markers = {c: m for c, m in zip(sorted({r["chip"] for r in rs}), "os^Dv")}
  color = lambda stage: STEP_STAGE_COLORS.get(stage, "tab:purple")  # purple: the whole step
  key = []  # the points are numbered; their labels stand in a column beside the axes
  for i, r in enumerate(sorted(rs, key=lambda r: r["measured_s"]), 1):
    xy = (r["measured_s"] * 1e3, r["predicted_s"] * 1e3)
    ax.plot(*xy, markers[r["chip"]], color=color(r["stage"]), ms=7)
    ax.annotate(str(i), xy, xytext=(5, -3 if i % 2 else 3), textcoords="offset points",
                fontsize=8, va="top" if i % 2 else "bottom")
    method = f" ({r['method']})" if r.get("method") and r["stage"] == "selection" else ""
    key.append(f"{i}. {r['source']}, {r['chip']}: {r['stage']}{method}, {r['shape']}: "
               f"{xy[1]:,.2f} / {xy[0]:,.2f} ms = {xy[1] / xy[0]:.2f}")
  ax.text(1.03, 1, "predicted / measured\n" + "\n".join(key), transform=ax.transAxes,
          va="top", fontsize=7, family="monospace")
  for stage in dict.fromkeys(r["stage"] for r in rs):
    ax.plot([], [], "o", color=color(stage), label=f"stage: {stage}")
  for chip, m in markers.items():
    ax.plot([], [], m, color="gray", label=f"chip: {chip}")
  ax.set_xlim(lo, hi)
  ax.set_ylim(lo, hi)
  _style(ax, "measured by others, ms (public)", "predicted at one clock per chip, ms", title,
         size=10, xlog=10, ylog=10, grid=dict(visible=True, which="both", alpha=.3),
         legend=dict(fontsize=7, loc="upper left"))
  return fig  # no tight layout: the key beside the axes is outside them (save crops to fit)


def variant_timing_figure(records: Sequence[dict], *, measured: bool, title: str = ""):
  """Notebook 08: a row per kernel configuration: measured device time (a TPU run, stacked by
  stage) beside its roofline (hollow) and static-schedule (marker) bounds; else model only."""
  y, h = np.arange(len(records)), 0.38
  fig, ax = plt.subplots(figsize=(10, 0.45 * len(records) + 1.6))
  if measured:
    _stack(ax, y - h / 2, [(f"measured: {name}", c, [r[f"{s}_us"] or 0.0 for r in records])
                           for (s, c), name in zip(STAGE_COLORS, ("kernel", "top-k", "other"))],
           width=h, horizontal=True)
  gen, ym = (records[0]["generation"] if records else ""), y + (h / 2 if measured else 0)
  ax.barh(ym, [r["roofline us"] for r in records], h, fill=False, edgecolor="black",
          label=f"model: roofline bound ({gen})")
  if st := [i for i, r in enumerate(records) if r["static schedule us"] is not None]:
    ax.scatter([records[i]["static schedule us"] for i in st], ym[st], marker="D",
               color="tab:red", zorder=3, label=f"model: static-schedule bound ({gen})")
  if not measured:
    ax.text(0.99, 0.02, "no TPU: no device timing exists; model only", transform=ax.transAxes,
            ha="right", fontsize=8, color="darkred")
  ax.set_yticks(y, [r["label"] for r in records], fontsize=8)
  ax.invert_yaxis()
  _style(ax, "microseconds per call", title=title, size=10,
         legend=dict(fontsize=7, loc="lower right" if measured else "upper right"))
  return _done(fig)


def runs_figure(timed_runs: Sequence[dict], *, last: int = 6):
  """Notebook 08: kernel device time of the `last` TPU runs (`profiling.load_runs` files with
  device times) per sweep point, a bar per run, its roofline bound a black tick."""
  from streamidx.lab.model import profiling  # pylint: disable=g-import-not-at-top
  if not (runs := list(timed_runs)[-last:]):
    raise ValueError("timed_runs: must hold at least one run with device times")
  points = list(dict.fromkeys(profiling._point(r) for run in runs for r in run["records"]))  # pylint: disable=protected-access
  recs = [{profiling._point(r): r for r in reversed(run["records"])} for run in runs]  # pylint: disable=protected-access
  fig, ax = plt.subplots(figsize=(11, 4))
  bars = _grouped(ax, points, [(f"{run['machine'].get('device_kind')} ({Path(run['path']).name})",
                                [rec.get(p, {}).get("kernel_us", np.nan) for p in points], {})
                               for run, rec in zip(runs, recs)],
                  [f"{m}\nB={b}\nL={c}" for m, b, c in points])
  for run, rec, bar in zip(runs, recs, bars):
    bounds = [profiling._bound(run, rec.get(p, {}), "kernel") for p in points]  # pylint: disable=protected-access
    if any(b is not None for b in bounds):
      ax.scatter([r.get_x() + r.get_width() / 2 for r in bar], [np.nan if b is None else b for b in bounds],
                 marker="_", s=400, color="black", zorder=3,
                 label=f"roofline bound ({run['machine'].get('generation')})")
  ax.tick_params(axis="x", labelsize=8)
  _style(ax, ylabel="microseconds per call", ylog=10, legend=7,
         title=f"Kernel device time of {len(runs)} TPU run(s) against each one's roofline bound")
  return fig


def scaling_figure(rows: Sequence[dict], *, title: str = ""):
  """Notebook 09: the modelled step and cache per device against chips (`scaling_table` rows)
  per generation: C = 1 solid, the best context-parallel C dashed where it differs."""
  fig, axes = plt.subplots(1, 2, figsize=(12, 4))
  chips = sorted({r["chips"] for r in rows})
  for ax, what, ylabel in ((axes[0], "step us", "modelled step (us, one layer)"),
                           (axes[1], "cache MiB/device", "cache per JAX device (MiB, one layer)")):
    for i, gen in enumerate(dict.fromkeys(r["generation"] for r in rows)):
      rs = [r for r in rows if r["generation"] == gen]
      one, best = [r[f"{what} (C=1)"] for r in rs], [r[f"{what} (best)"] for r in rs]
      ax.plot([r["chips"] for r in rs], one, "o-", color=f"C{i}",
              label=f"{gen}, one chip per sequence")
      if best != one:
        ax.plot([r["chips"] for r in rs], best, "s--", color=f"C{i}",
                label=f"{gen}, best context-parallel C")
    _style(ax, "chips", ylabel, xlog=2, ylog=10, grid=dict(visible=True, which="both", alpha=0.3))
    ax.set_xticks(chips, [str(n) for n in chips])
  axes[0].legend(fontsize=7)
  return _done(fig, title, size=10)


def crossover_figure(rows: Sequence[dict], *, title: str = ""):
  """Notebook 09: the shortest context from which context parallelism pays ("tokens"; None:
  never, left out) against the assumed collective latency, a line per (generation, chips)."""
  fig, ax = plt.subplots(figsize=(7, 4))
  for gen, chips in dict.fromkeys((r["generation"], r["chips"]) for r in rows):
    rs = [r for r in rows if (r["generation"], r["chips"]) == (gen, chips) and r["tokens"]]
    ax.plot([r["latency us"] for r in rs], [r["tokens"] for r in rs], "o-",
            label=f"{gen}, 1 sequence on {chips} chip(s)")
  _style(ax, "assumed latency per collective round (us)", "shortest context that pays (tokens)",
         title, size=10, ylog=2, grid=dict(visible=True, which="both", alpha=0.3), legend=7)
  return _done(fig)
