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
def _shared_legend(fig, axes, title: str, *, bottom: float):
  """One legend under the panels `axes` (each label once, from whichever
  panel has it), the figure's `title` above them."""
  legend = {}  # label -> handle
  for ax in axes:
    for h, l in zip(*ax.get_legend_handles_labels()):
      legend.setdefault(l, h)
  fig.legend(legend.values(), legend.keys(), loc="lower center", ncol=len(legend), fontsize=8,
             frameon=False)
  fig.suptitle(title, fontsize=10)
  fig.tight_layout(rect=(0, bottom, 1, 1))


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


LANE_ORDER = ("KV pages (slot 0)", "KV pages (slot 1)", "q + weights (slot 0)",  # `Recorder.lanes`
              "q + weights (slot 1)", "compute", "scores -> HBM (slot 0)", "scores -> HBM (slot 1)")


def dma_timeline_axes(ax, rec, *, launches=None, title=None):
  """Notebook 04: a `timeline.Recorder`'s DMAs (start to wait) and compute steps, a row per
  lane; x: the interpreter's operation number (issue order, not time), dotted lines at
  programs, solid at launches. A batched decode program's sequences get a sub-row each; q
  and weights share theirs (weights lighter)."""
  lanes = [l for l in rec.lanes() if launches is None or l["launch"] in launches]
  colors = {"KV ": "tab:blue", "q +": "tab:green", "com": "tab:orange", "sco": "tab:red"}
  per_launch = {}
  for l in lanes:
    per_launch[l["launch"]] = max(per_launch.get(l["launch"], 1), l["batch_idx"] + 1)
  for l in lanes:
    n = per_launch[l["launch"]] if l["sem"] != "out" else 1
    h, row = .7 / n, LANE_ORDER.index(l["lane"]) if l["lane"] in LANE_ORDER else len(LANE_ORDER)
    ax.barh(row - .35 + h * (l["batch_idx"] if n > 1 else 0) + h / 2, l["end"] - l["start"],
            left=l["start"], height=h * .85, color=colors.get(l["lane"][:3], "gray"),
            alpha=.55 if l["sem"] == "w" else 1, edgecolor="black", linewidth=.3)
  for op in rec.ops:
    if op.kind in ("grid", "launch") and (launches is None or op.launch in launches):
      grid = op.kind == "grid"
      ax.axvline(op.seq, color="gray" if grid else "black", lw=.6 if grid else 1.2,
                 ls=":" if grid else "-")
  ax.set_yticks(range(len(LANE_ORDER)), LANE_ORDER)
  ax.invert_yaxis()
  _style(ax, "interpreter operation number (issue order; dotted: program start, solid: launch "
         "start)", title=title)


def kv_double_buffer_figure(fills: Sequence[dict], computes: Sequence[dict],
                            launches: Sequence[tuple], *, xlabel: str, title: str):
  """Notebook 03: the KV double buffer of a call. `fills`: one dict per KV block fetch (slot 0/1,
  start: its first page DMA's number, wait: its wait's, step: the KV-loop step it feeds, pages,
  seqs: the sequences of a batched program, optional),
  a bar on its slot's row from start to wait; `computes` (step, start, end): the step's scoring,
  on a third row; `launches`: (first DMA number, name), a solid line each. x: `xlabel`."""
  rows = ("KV slot 0", "KV slot 1", "compute")
  colors = ("tab:blue", "tab:cyan", "tab:orange")
  end = max([f["wait"] for f in fills] + [c["end"] for c in computes] + [1]) + 1
  fig, ax = plt.subplots(figsize=(min(16, max(9, 0.09 * end + 4)), 3.3))
  for f in fills:
    _box(ax, f["start"], f["slot"] + .15, colors[f["slot"]], w=max(f["wait"] - f["start"], .6), h=.7,
         ec="black", lw=.5)
    _text(ax, (f["start"] + f["wait"]) / 2, f["slot"] + .5, f"step {f['step']}\n{f['pages']} pages"
          + (f" of {f['seqs']} seqs" if f.get("seqs", 1) > 1 else ""), 7)
    ax.plot(f["start"], f["slot"] + .5, ">", color="black", ms=5)
    ax.plot(f["wait"], f["slot"] + .5, "|", color="black", ms=14, mew=2)
  for c in computes:
    _box(ax, c["start"], 2.15, colors[2], w=max(c["end"] - c["start"], .6), h=.7, ec="black", lw=.5)
    _text(ax, c["start"] + max(c["end"] - c["start"], .6) / 2, 2.5, str(c["step"]), 7)
  for x, name in launches:
    ax.axvline(x - .5, color="black", lw=1)
    ax.text(x, -.2, f"{name} launch", fontsize=8, va="center")
  ax.set(xlim=(-1, end), ylim=(3, -.4))
  ax.set_yticks(np.arange(3) + .5, rows[:2] + ("scoring (step)",))
  ax.plot([], [], ">", color="black", label="first page DMA started")
  ax.plot([], [], "|", color="black", ms=10, mew=2, label="wait (block in VMEM)")
  _style(ax, xlabel, title=title, size=10,
         legend=dict(loc="upper center", bbox_to_anchor=(.5, -.3), ncol=2, fontsize=8, frameon=False))
  return _done(fig)


def running_topk_figure(scores, history: Sequence[dict], *, bkv: int, title: str):
  """Notebook 03: one query row's running top-k over its KV blocks. Left: the row's scores
  (f32[N], -inf: masked) against the entry index, the k-th best kept after each block drawn
  over that block, the final top-k filled, entries taken in and later dropped as crosses.
  Right: the buffer after each block (`history`: per block, dicts of idx i32[k] and vals f32[k],
  best first, entered/left: entry indices), a cell per rank labelled with its entry, coloured by
  the block it came from, new entries outlined."""
  scores = np.asarray(scores, float)
  k, blocks = len(history[0]["idx"]), len(history)
  colors = seq_colors(blocks)
  fig, (ax, ax_buf) = plt.subplots(1, 2, figsize=(12, max(3.8, 0.26 * k + 1.8)),
                                   gridspec_kw={"width_ratios": [2.3, 0.35 * blocks + .6]})
  live = np.flatnonzero(np.isfinite(scores))
  ax.plot(live, scores[live], ".", color="0.7", ms=3, label="score of an entry")
  final = [i for i in history[-1]["idx"] if i >= 0]
  dropped = sorted({i for h in history for i in h["left"]})
  ax.plot(final, scores[final], "o", color="tab:orange", ms=5, label=f"final top-{k}")
  ax.plot(dropped, scores[dropped], "x", color="tab:red", ms=6,
          label="kept for a while, then dropped")
  for j, h in enumerate(history):
    v = np.asarray(h["vals"], float)
    kth = v[-1] if np.isfinite(v[-1]) else np.nan
    ax.hlines(kth, j * bkv, (j + 1) * bkv, color="black", lw=2,
              label="k-th best kept after this block" if j == 0 else None)
    ax.axvline(j * bkv, color="0.5", lw=.8, ls=":")
    ax.text(j * bkv + 2, 1.0, f"block {j}\n+{len(h['entered'])} in, -{len(h['left'])} out",
            transform=ax.get_xaxis_transform(), fontsize=7, va="top")
  ax.set_xlim(0, blocks * bkv)
  _style(ax, f"entry index (KV blocks of bkv = {bkv} entries)", "score (f32)",
         "the row's scores and the running k-th best", size=9,
         legend=dict(loc="upper center", bbox_to_anchor=(.5, -.2), ncol=2, fontsize=7,
                     frameon=False))
  ax.set_ylim(top=ax.get_ylim()[1] + .25 * np.ptp(ax.get_ylim()))  # room for the block notes
  for j, h in enumerate(history):
    for r, (i, v) in enumerate(zip(h["idx"], h["vals"])):
      new = i in h["entered"]
      _box(ax_buf, j, r, colors[i // bkv] if i >= 0 else FREE, str(i) if i >= 0 else "-1",
           size=6.5, color="white" if i >= 0 else "black")
      if new: _outline(ax_buf, j + .04, r + .04, .92, .92, lw=1.5)
  _grid_axes(ax_buf, blocks, k, [f"after\nblock {j}" for j in range(blocks)],
             [str(r + 1) for r in range(k)])
  _style(ax_buf, ylabel="rank in the running top-k", title="the buffer (entry index;\n"
         "colour: its block; outlined: new)", size=9)
  return _done(fig, title, size=10)


def iteration_order_figure(steps, num_seqs: int, *, title: str):
  """Notebook 04: the kernel's steps (`tiling.steps(plan)`) in order, a row per sequence, a
  cell "bq,bkv" coloured by case, hatched past the sequence's entries (computed, masked)."""
  steps = list(steps)
  fig, ax = plt.subplots(figsize=(min(18, 3 + 0.28 * len(steps)), 0.5 * num_seqs + 1.6))
  for x, st in enumerate(steps):
    for s, kv in zip(st["seqs"], st["kv_lens"]):
      past_end = st["bkv"] * st["bkv_sz"] >= max(kv, 1)
      _box(ax, x, s, CASE_COLORS[st["case"]],
           f"{st['bq']},{st['bkv']}" if len(steps) <= 80 else None, w=.9, h=.8, size=6,
           color="black", alpha=0.25 if past_end else 0.9, ec="black", lw=0.4,
           hatch="//" if past_end else None)
  for case, c in CASE_COLORS.items():
    ax.add_patch(patches.Rectangle((0, 0), 0, 0, fc=c, label=case))
  ax.add_patch(patches.Rectangle((0, 0), 0, 0, fc="white", ec="black", hatch="//",
                                 label="block past the sequence's end (computed, masked)"))
  ax.set(xlim=(0, len(steps)), ylim=(num_seqs, 0))
  ax.set_yticks(np.arange(num_seqs) + 0.4, [f"seq {s}" for s in range(num_seqs)])
  _style(ax, "step in execution order (label: bq block, bkv block)", title=title,
         legend=dict(loc="upper center", bbox_to_anchor=(0.5, -0.18), ncol=5, fontsize=8))
  return fig  # no tight layout: the legend below is wider than a short run of steps


def vmem_budget_figure(budget, bq_choices, bkv_choices, limits, *, production, title: str):
  """Notebook 04: VMEM bytes[len(bq_choices), len(bkv_choices)] of a launch; cells over each
  of up to three `limits` (generation -> bytes) outlined red, `production` in white."""
  mib = 2.0 ** 20
  budget = np.asarray(budget, float)
  fig, ax = plt.subplots(figsize=(7, 4.5))
  im = ax.imshow(budget / mib, cmap="viridis", norm=mcolors.LogNorm(), origin="lower",
                 aspect="auto")
  cells = [(i, j) for i in range(len(bq_choices)) for j in range(len(bkv_choices))]
  for i, j in cells:
    _text(ax, j, i, f"{budget[i, j] / mib:.1f}", 7,
          "white" if budget[i, j] < np.median(budget) else "black")
  for lvl, style in zip(sorted(set(limits.values())), ("-", "--", ":")):
    over = budget > lvl  # outline the cells over the limit: their bottom and left edges
    for i, j in cells:
      if over[i, j] and (i == 0 or not over[i - 1, j]):
        ax.plot([j - 0.5, j + 0.5], [i - 0.5, i - 0.5], "r", ls=style, lw=1.5)
      if over[i, j] and (j == 0 or not over[i, j - 1]):
        ax.plot([j - 0.5, j - 0.5], [i - 0.5, i + 0.5], "r", ls=style, lw=1.5)
    ax.plot([], [], "r", ls=style, label=f"> {lvl / mib:.0f} MiB")
  if production[0] in bq_choices and production[1] in bkv_choices:
    i, j = bq_choices.index(production[0]), bkv_choices.index(production[1])
    _outline(ax, j - 0.45, i - 0.45, 0.9, 0.9, ec="white", lw=2)
    ax.plot([], [], "s", mfc="none", mec="gray", label="production (bq, bkv_p)")
  ax.set_xticks(range(len(bkv_choices)), bkv_choices)
  ax.set_yticks(range(len(bq_choices)), bq_choices)
  _style(ax, "num_kv_pages_per_block (bkv_p)", "num_queries_per_block (bq)", title,
         legend=dict(loc="upper center", bbox_to_anchor=(0.5, -0.14), ncol=4, fontsize=7))
  fig.colorbar(im, ax=ax, label="MiB")
  return _done(fig)


def block_sweep_figure(rows: Sequence[dict], *, x: str, series: str,
                       panels: Sequence[tuple], production=None, title: str):
  """Notebook 05: a block-size sweep, a panel per (column, y label) of `panels` (y from 0),
  `rows[x]` on a log2 x axis, a line per value of `rows[series]`; `production`: the (x, series)
  of the production row, ringed in every panel."""
  n = len(panels)
  cols = min(3, n)
  fig, axes = plt.subplots(-(-n // cols), cols, figsize=(4.2 * cols, 3.2 * -(-n // cols)),
                           squeeze=False)
  for ax in axes.flat[n:]:
    ax.axis("off")
  values = list(dict.fromkeys(r[series] for r in rows))
  for ax, (col, ylabel) in zip(axes.flat, panels):
    for i, v in enumerate(values):
      rs = [r for r in rows if r[series] == v]
      ax.plot([r[x] for r in rs], [r[col] for r in rs], "o-", color=f"C{i}", label=f"{series} = {v}")
    for r in rows:
      if production is not None and (r[x], r[series]) == tuple(production):
        ax.plot(r[x], r[col], "o", ms=13, mfc="none", mec="black", mew=1.5,
                label="production block sizes")
    _style(ax, x, ylabel, xlog=2, grid=.3)
    ax.set_ylim(bottom=0)  # a flat line reads as flat
    ax.set_xticks(sorted({r[x] for r in rows}), sorted({r[x] for r in rows}))
  axes.flat[0].legend(fontsize=7)
  return _done(fig, title, size=10)


def decode_waste_figure(waste, batch_sizes: Sequence[int], orders: Sequence[str], *, title: str):
  """Notebook 04: wasted share of computed KV blocks per decode batch size and order
  (`waste`: {(B, order): [fraction per batch]}): means, one standard deviation error bars."""
  fig, ax = plt.subplots(figsize=(8, 3.6))
  _grouped(ax, batch_sizes, [(o, [100 * np.mean(waste[b, o]) for b in batch_sizes],
                               dict(yerr=[100 * np.std(waste[b, o]) for b in batch_sizes],
                                    capsize=2)) for o in orders],
           labels=[f"B = {b}" for b in batch_sizes])
  _style(ax, "decode sequences per program (decode_req_batch_size)",
         "% of computed KV blocks wasted", title, legend=dict(title="order", fontsize=8))
  return _done(fig)


def decode_step_figure(rows: Sequence[dict], *, title: str):
  """Notebook 04: stacked roofline bounds (us) of one decode step per generation (the step
  table's fill_us, kernel_us, topk_us)."""
  fig, ax = plt.subplots(figsize=(7, 3.2))
  _stack(ax, [r["generation"] for r in rows],
         [(s, c, [r[f"{s}_us"] for r in rows])
          for s, c in (("fill", "tab:gray"), ("kernel", "tab:blue"), ("topk", "tab:orange"))])
  _style(ax, "TPU generation", "roofline lower bound, microseconds", title, legend={})
  return _done(fig)


STEP_STAGE_COLORS = {"fill": "tab:gray", "scoring": "tab:blue", "selection": "tab:orange",
                     "copies": "tab:red"}  # roofline.Stage names


def step_stages_figure(steps: dict, *, title: str):
  """Notebook 05: the production step stage by stage (`roofline.dsv4_step`'s
  `StepBound.stages`), one horizontal stacked bar per label of `steps` {label: StepBound}; a
  floor (`at_least`: a stage without a count or a clock) is hatched and says "at least"; each
  bar names its clock (`Stage.clock_hz`, and whether it was inferred: `clock_source`)."""
  fig, ax = plt.subplots(figsize=(8.5, 0.55 * len(steps) + 1.6))
  pos = np.arange(len(steps))[::-1]
  names = list(dict.fromkeys(st.name for sb in steps.values() for st in sb.stages))
  us = lambda sb, n: 1e6 * sum(st.bound for st in sb.stages if st.name == n)
  totals = _stack(ax, pos, [(n, STEP_STAGE_COLORS.get(n, "tab:purple"),
                             [us(sb, n) for sb in steps.values()]) for n in names],
                  horizontal=True, width=.6)
  for y, sb, t in zip(pos, steps.values(), totals):
    hz = sb.stages[0].clock_hz
    clock = (f"{hz / 1e9:.2f} GHz, {'inferred' if 'inferred' in sb.clock_source else 'public'}"
             if hz else "no clock: bundles not timed")
    if sb.at_least:
      ax.barh(y, t, .6, fill=False, hatch="//", ec="black", lw=0)
    ax.text(t, y, f"  {'at least ' if sb.at_least else ''}{t:,.0f} us ({clock})", va="center",
            fontsize=8)
  ax.set_yticks(pos, list(steps))
  ax.set_xlim(0, 1.5 * max(totals))
  _style(ax, "microseconds (each stage the larger of its HBM and static-schedule bounds; "
         "hatched: a floor)", title=title, size=10, legend=dict(fontsize=8, loc="lower right"))
  return _done(fig)


def static_schedule_figure(rows: Sequence[dict], bounds: Sequence, *, title: str = ""):
  """Notebook 04: scheduled bundles per KV page against bkv_p, a panel per generation (`rows`,
  their `bounds`); dashed: a page's HBM cycles where the chip has a clock, else written. Each
  panel has its own y range (the chips' bundles per page differ several-fold)."""
  gens = list(dict.fromkeys(r["generation"] for r in rows))
  fig, axes = plt.subplots(1, len(gens), figsize=(3.2 * len(gens), 3.2), squeeze=False)
  for ax, gen in zip(axes[0], gens):
    pairs = [(r, b) for r, b in zip(rows, bounds) if r["generation"] == gen]
    ax.plot([r["bkv_p"] for r, _ in pairs], [r["bundles_per_page"] for r, _ in pairs], "o-",
            label="scheduled bundles per page")
    clock = pairs[0][1].clock_hz
    if clock:
      ax.axhline(pairs[0][1].t_hbm * clock, color="k", ls="--",
                 label="a page's HBM time, in cycles at the chip's clock")
    else:
      ax.text(0.05, 0.05, f"no public clock:\nvector-bound below\n"
              f"{min(b.break_even_clock_hz for _, b in pairs) / 1e9:.2f} GHz",
              transform=ax.transAxes, fontsize=8)
    _style(ax, "num_kv_pages_per_block (decode)", ylabel="bundles per KV page", title=gen)
    ax.set_xticks(sorted({r["bkv_p"] for r, _ in pairs}))
    ax.set_ylim(0, 1.15 * max([r["bundles_per_page"] for r, _ in pairs]
                              + [b.t_hbm * clock for _, b in pairs[:1] if clock]))
  # Below the panels: inside, it would cover the points or the HBM line.
  _style(axes[0][0], legend=dict(fontsize=7, loc="upper left", bbox_to_anchor=(0, -0.3)))
  return _done(fig, title, size=10)


def topk_methods_figure(rows: Sequence[dict], *, measured: Sequence[dict] = (), generation: str,
                        title: str):
  """Notebook 05: the top-k methods side by side, a column of panels per shape. `rows`: dicts of
  panel (the shape), series (k), method, bound_us (the HBM bound on `generation`), sort_work_g
  (G compare-exchanges; None: not a sort, e.g. the scoring kernel's row); top row the bound,
  bottom row the sort work, both log scale, a marker per series. `measured`: dicts of panel,
  method, us and label: a measurement by others, a red star on the top row."""
  panels = list(dict.fromkeys(r["panel"] for r in rows))
  methods = list(dict.fromkeys(r["method"] for r in rows))
  series = list(dict.fromkeys(r["series"] for r in rows))
  style = dict(zip(series, zip(("o", "s", "^", "D"), ("tab:blue", "tab:green", "tab:purple",
                                                      "tab:brown"))))
  fig, axes = plt.subplots(2, len(panels), figsize=(3.6 * len(panels) + 1.5, 6.4), sharey=True,
                           squeeze=False)
  y = {m: i for i, m in enumerate(methods)}
  for col, panel in enumerate(panels):
    for row_ax, key, xlabel in ((axes[0][col], "bound_us", f"HBM bound on {generation} (us)"),
                                (axes[1][col], "sort_work_g", "sort work (G compare-exchanges)")):
      for i, ser in enumerate(series):
        pts = [(r[key], y[r["method"]]) for r in rows
               if r["panel"] == panel and r["series"] == ser and r[key]]
        marker, color = style[ser]
        row_ax.plot([p[0] for p in pts], [p[1] + (i - (len(series) - 1) / 2) * .18 for p in pts],
                    marker, color=color, ls="none", ms=6, label=ser)
      _style(row_ax, xlabel, xlog=10, grid=dict(alpha=.3, which="both", axis="x"))
      row_ax.set_yticks(range(len(methods)), methods)
    axes[0][col].set_title(panel, fontsize=10)
    for m in measured:
      if m["panel"] == panel:
        axes[0][col].plot(m["us"], y[m["method"]], "*", color="tab:red", ms=12, label=m["label"])
  axes[0][0].invert_yaxis()
  _shared_legend(fig, axes[0], title, bottom=.05)  # the stars sit in one panel
  return fig


def mtp_step_figure(rows: Sequence[dict], *, title: str):
  """Notebook 05: the predicted MTP decode step per generation, a panel per context ("tokens"),
  a bar per path ("step us") with the kernel stage's terms on it ("HBM us", "MXU us",
  "vector us"; None: not known) as markers; log scale."""
  contexts = list(dict.fromkeys(r["tokens"] for r in rows))
  paths = list(dict.fromkeys(r["path"] for r in rows))
  gens = list(dict.fromkeys(r["generation"] for r in rows))
  fig, axes = plt.subplots(1, len(contexts), figsize=(6 * len(contexts), 3.8), sharey=True,
                           squeeze=False)
  terms = (("HBM us", "_", "black", "kernel's HBM term"), ("MXU us", "x", "tab:red",
                                                          "kernel's MXU term"),
           ("vector us", "D", "tab:purple", "kernel's vector term (static schedule)"))
  for ax, ctx in zip(axes[0], contexts):
    by = {(r["generation"], r["path"]): r for r in rows if r["tokens"] == ctx}
    bars = _grouped(ax, gens, [(f"predicted step, {p} path",
                                [by[g, p]["step us"] for g in gens], dict(alpha=.6))
                               for p in paths])
    for bar, p in zip(bars, paths):
      for key, marker, color, label in terms:
        pts = [(r.get_x() + r.get_width() / 2, by[g, p][key]) for r, g in zip(bar, gens)
               if by[g, p][key]]
        if pts:
          ax.plot([x for x, _ in pts], [v for _, v in pts], marker, color=color, ms=9, mew=2,
                  ls="none", label=label)
    _style(ax, "TPU generation", title=f"{ctx // 1024}K tokens per sequence", size=10, ylog=10,
           grid=dict(alpha=.3, axis="y", which="both"))
  _style(axes[0][0], ylabel="microseconds (one layer, model)")
  _shared_legend(fig, axes[0], title, bottom=.07)  # a term may be known in one panel only
  return fig


