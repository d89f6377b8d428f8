"""The notebooks' figures: each draws what it is given and computes nothing of its own; `save`
writes a PNG under a notebook's `output_dir`. Agg-safe.
"""

from __future__ import annotations

import json
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np

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


STEP_STAGE_COLORS = {"fill": "tab:gray", "scoring": "tab:blue", "selection": "tab:orange",
                     "copies": "tab:red", "other": "tab:olive", "idle": "lightgray",  # records.PARTS
                     "relayout": "tab:pink"}  # the model's (roofline.step_stages)


def _step_bar(sb) -> tuple[dict, bool, str]:
  """(stage -> seconds, a floor?, what follows its length) of one bar of `step_stages_figure`."""
  if isinstance(sb, dict):  # a measured call's parts
    return {n: s or 0.0 for n, s in sb.items()}, False, ""
  hz = sb.stages[0].clock_hz
  clock = (f"{hz / 1e9:.2f} GHz, {'inferred' if 'inferred' in sb.clock_source else 'public'}"
           if hz else "no clock: bundles not timed")
  names = dict.fromkeys(st.name for st in sb.stages)
  return ({n: sum(st.bound for st in sb.stages if st.name == n) for n in names},
          sb.at_least, f" ({clock})")


def step_stages_figure(steps: dict, *, title: str, unit: str = "us"):
  """The step stage by stage, one stacked bar per label of `steps`: each a `roofline.StepBound`
  (the model: a floor, `at_least`, hatched; each bar's clock named) or each {part: seconds} (a
  measured call's `records.PARTS`, None as 0), in `unit` ("us" or "ms"); a bar over 2.5x the
  next longest cut at 1.8x that one, its length written on it."""
  scale, digits, words = {"us": (1e6, 0, "microseconds"), "ms": (1e3, 2, "milliseconds")}[unit]
  bars = [_step_bar(sb) for sb in steps.values()]
  fig, ax = plt.subplots(figsize=(8.5, 0.55 * len(steps) + 1.6))
  pos = np.arange(len(steps))[::-1]
  totals = np.zeros(len(steps))
  for n in dict.fromkeys(n for parts, _, _ in bars for n in parts):  # stacked, stage by stage
    v = np.array([scale * parts.get(n, 0.0) for parts, _, _ in bars])
    ax.barh(pos, v, .6, totals, color=STEP_STAGE_COLORS.get(n, "tab:purple"), label=n)
    totals += v
  longest = sorted(totals)[-2:]
  cut = 1.8 * longest[0] if len(longest) == 2 and longest[1] > 2.5 * longest[0] else None
  for y, (_, floor, note), t in zip(pos, bars, totals):
    if floor:
      ax.barh(y, t, .6, fill=False, hatch="//", ec="black", lw=0)
    label = f"{'at least ' if floor else ''}{t:,.{digits}f} {unit}{note}"
    if cut and t > cut:  # the bar runs off the axis: a break mark, and its length on it
      ax.plot([cut * .97, cut], [y - .35, y + .35], color="white", lw=4)
      ax.text(cut * .95, y, f"{label}, bar cut ", va="center", ha="right", fontsize=8,
              bbox=dict(fc="white", ec="none", alpha=.85))
    else:
      ax.text(t, y, f"  {label}", va="center", fontsize=8)
  ax.set_yticks(pos, list(steps))
  ax.set_xlim(0, cut or 1.5 * max(totals))
  what = ("device time, the profiler" if all(isinstance(sb, dict) for sb in steps.values())
          else "each stage the larger of its HBM and static-schedule bounds; hatched: a floor")
  ax.set_xlabel(f"{words} ({what})")
  ax.set_title(title, fontsize=10)
  ax.legend(fontsize=8, loc="lower right")
  fig.tight_layout()
  return fig
