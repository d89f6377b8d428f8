"""The benchmark's reports: ratios, the text table, the plot; from the JSON
documents `harness.run` writes and nothing else, so a saved one can be
reported again.
"""

from __future__ import annotations

import statistics

import numpy as np

from streamidx.lab import tables
from streamidx.lab.bench.memory import mib


def ratios(doc) -> dict:
  """Median time of each implementation over the reference's, per shape,
  and its geometric mean over the shapes."""
  per_shape = {}
  for s in doc["shapes"]:
    rows = {r["impl"]: r["wall_s"]["median"] for r in doc["results"]
            if r["shape"] == s["name"] and r["status"] == "ok"}
    if "reference" in rows:
      per_shape[s["name"]] = {i: t / rows["reference"] for i, t in rows.items()}
  vals = {i: [v[i] for v in per_shape.values() if i in v]
          for i in doc["settings"]["implementations"]}
  geo = {i: {"geomean": statistics.geometric_mean(v), "shapes": len(v)}
         for i, v in vals.items() if v}
  return {"time_over_reference": per_shape, "geomean_time_over_reference": geo}


def verdict(a) -> str:
  """One line of an `agreement` dict: vs the reference, vs the oracle."""
  parts = []
  r = a.get("vs_reference")
  if r is not None:
    parts.append("ref: " + ("identical" if r["identical"] else
                            "exact ties" if r["ok_exact_ties"] else
                            f"differs ({r['rows_mismatched']} rows)"))
  o = a.get("vs_oracle")
  if o is not None:
    parts.append(f"oracle ({o['rows_checked']} rows): " +
                 ("ok" if o["ok"] else f"WRONG ({o['rows_mismatched']} rows)"))
  return "; ".join(parts)


def format_table(doc) -> str:
  """A document's results as a text table, then ratios, block sizes and (long
  context) the one-chunk temporaries by `streaming.one_chunk_temp_bytes`."""
  rat = doc["ratios"]["time_over_reference"]
  rows = []
  for r in doc["results"]:
    if r["status"] != "ok":
      rows.append({"shape": r["shape"], "implementation": r["impl"],
                   "median ms": r["status"], "min-max ms": r["reason"][:60]})
      continue
    w, m = r["wall_s"], r["memory"]
    ratio = rat[r["shape"]].get(r["impl"]) if r["shape"] in rat else None
    rows.append({
        "shape": r["shape"], "implementation": r["label"],
        "median ms": f"{w['median'] * 1e3:.1f}",
        "min-max ms": f"{w['min'] * 1e3:.1f}-{w['max'] * 1e3:.1f}",
        "entries/s": f"{r['entries_per_s']:.3g}",
        "peak MiB": mib(m["peak_rss_bytes"]),
        "+over inputs": mib(m["peak_over_inputs_bytes"]),
        "XLA temp MiB": mib((m["xla"] or {}).get("temp_bytes")),
        "vs ref": ratio and f"{ratio:.3g}x",
        "agrees": verdict(r["agreement"])})
  out = [tables.format_rows(rows, list(max(rows, key=len)))]
  geo = doc["ratios"]["geomean_time_over_reference"]
  if geo:
    out += ["", "time / reference time, geometric mean over shapes: "
            + ", ".join(f"{i} {g['geomean']:.3g}x ({g['shapes']} shapes)"
                        for i, g in geo.items())]
  blocks = {(r["impl"], str(r["blocks"]["kwargs"]), r["blocks"]["source"])
            for r in doc["results"] if r.get("blocks")}
  out += [f"{i} block sizes {kw}: {src}" for i, kw, src in sorted(blocks)]
  out += [f"{s['name']}: one-chunk temporaries by formula {mib(f['low'])}-"
          f"{mib(f['high'])} MiB" for s in doc["shapes"]
          if (f := s.get("one_chunk_formula_temp_bytes"))]
  return "\n".join(out)


def plot(doc, path):
  """bench.png: wall time (log) and peak RSS over inputs, per shape and
  column; a bar whose result disagrees with the oracle is marked "wrong"."""
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  from streamidx.lab import plots  # pylint: disable=g-import-not-at-top

  shapes = [s["name"] for s in doc["shapes"]]
  ok = {(r["shape"], r["impl"]): r for r in doc["results"]
        if r["status"] == "ok"}
  rs = {i: [ok.get((s, i)) for s in shapes]
        for i in doc["settings"]["implementations"]}
  wall = lambda r, f: r["wall_s"][f] if r else np.nan  # pylint: disable=unnecessary-lambda-assignment
  fig, axes = plt.subplots(1, 2, figsize=(13, 4.8))
  bars = plots._grouped(axes[0], shapes, [(i, [wall(r, "median") for r in v],  # pylint: disable=protected-access
      dict(yerr=[[wall(r, "median") - wall(r, "min") if r else 0 for r in v],
                 [wall(r, "max") - wall(r, "median") if r else 0 for r in v]],
           capsize=2)) for i, v in rs.items()])
  plots._grouped(axes[1], shapes, [(i, np.array([  # pylint: disable=protected-access
      r and r["memory"]["peak_over_inputs_bytes"] for r in v], float) / 2**20,
                                    {}) for i, v in rs.items()])
  for bar, v in zip(bars, rs.values()):
    for patch, r in zip(bar, v):
      if r and not r["agreement"].get("vs_oracle", {"ok": True})["ok"]:
        axes[0].annotate("wrong", (patch.get_x() + patch.get_width() / 2,
                                   patch.get_height()), ha="center",
                         va="bottom", fontsize=7, color="red", rotation=90)
  plots._style(axes[0], ylabel="wall time per call, s (median, min-max)",  # pylint: disable=protected-access
               ylog=10, legend=8)
  axes[1].set_ylabel("peak RSS over inputs, MiB")
  for ax in axes:
    ax.set_xticklabels(shapes, rotation=20, ha="right", fontsize=8)
    ax.grid(axis="y", alpha=0.3)
  fig.suptitle(doc["machine"]["describe"], fontsize=9)
  fig.tight_layout()
  fig.savefig(path, dpi=110)
  plt.close(fig)
