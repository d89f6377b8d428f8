"""The benchmark's reports: ratios, text tables, the plot.

Everything here reads the JSON documents that `harness.run_sweep` and
`long_context.run_long_context` write (bench.json, long_context.json) and
nothing else, so a saved document can be reported again.
"""

from __future__ import annotations

import math

import numpy as np

from streamidx.lab.bench.memory import mib

__all__ = ["ratios", "verdict", "format_table", "format_long_table", "plot"]


def ratios(doc) -> dict:
  """Median time of each implementation over the reference's, per shape."""
  order = doc["settings"]["implementations"]
  per_shape = {}
  for s in doc["shapes"]:
    rows = {r["impl"]: r for r in doc["results"]
            if r["shape"] == s["name"] and r["status"] == "ok"}
    if "reference" not in rows:
      continue
    ref = rows["reference"]["wall_s"]["median"]
    per_shape[s["name"]] = {i: r["wall_s"]["median"] / ref
                            for i, r in rows.items()}
  geo = {}
  impls = {i for v in per_shape.values() for i in v}
  for i in sorted(impls, key=order.index):
    vals = [v[i] for v in per_shape.values() if i in v]
    geo[i] = {"geomean": math.exp(sum(map(math.log, vals)) / len(vals)),
              "shapes": len(vals)}
  return {"time_over_reference": per_shape,
          "geomean_time_over_reference": geo}


def verdict(a) -> str:
  """One line of an `agreement` dict: vs the reference, vs the oracle."""
  if not a:
    return "-"
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


def _aligned(head, lines) -> list[str]:
  widths = [max(len(str(x)) for x in col) for col in zip(head, *lines)]
  fmt = "  ".join("{:<%d}" % w for w in widths)
  out = [fmt.format(*head), fmt.format(*("-" * w for w in widths))]
  return out + [fmt.format(*map(str, l)) for l in lines]


def format_table(doc) -> str:
  """The results as a fixed-width text table, ratios after it."""
  head = ("shape", "implementation", "median ms", "min-max ms", "entries/s",
          "peak MiB", "+over inputs", "XLA temp", "vs ref", "agrees")
  lines = []
  rat = doc.get("ratios", {}).get("time_over_reference", {})
  for r in doc["results"]:
    if r["status"] != "ok":
      lines.append((r["shape"], r["impl"], r["status"],
                    r.get("reason", "")[:60], "", "", "", "", "", ""))
      continue
    w = r["wall_s"]
    m = r["memory"]
    xla = m.get("xla") or {}
    ratio = rat.get(r["shape"], {}).get(r["impl"])
    lines.append((
        r["shape"], r["label"], f"{w['median'] * 1e3:.1f}",
        f"{w['min'] * 1e3:.1f}-{w['max'] * 1e3:.1f}",
        f"{r['entries_per_s']:.3g}", f"{mib(m['peak_rss_bytes'])}",
        f"{mib(m['peak_over_inputs_bytes'])}",
        "-" if not xla else f"{mib(xla['temp_bytes'])}",
        "-" if ratio is None else f"{ratio:.3g}x", verdict(r.get("agreement"))))
  out = _aligned(head, lines)
  geo = doc.get("ratios", {}).get("geomean_time_over_reference", {})
  if geo:
    out.append("")
    out.append("time / reference time, geometric mean over shapes: " + ", ".join(
        f"{i} {g['geomean']:.3g}x ({g['shapes']} shapes)" for i, g in geo.items()))
  blocks = {(r["impl"], str(r["blocks"]["kwargs"]), r["blocks"]["source"])
            for r in doc["results"] if r.get("blocks")}
  for impl, kwargs, source in sorted(blocks):
    out.append(f"{impl} block sizes {kwargs}: {source}")
  return "\n".join(out)


def format_long_table(doc) -> str:
  """The long-context results as a text table, the memory predictions after."""
  head = ("config", "impl", "wall s", "entries/s", "peak RSS MiB",
          "+over inputs", "XLA args+temp MiB", "checked")
  lines = []
  for row in doc["results"]:
    name = row["shape"]["name"]
    for impl in ("streaming", "reference"):
      pred = row["predicted_xla"][impl]
      xla = f"{mib(pred['argument_bytes'])}+{mib(pred['temp_bytes'])}"
      r = row.get(impl)
      if r is None or r.get("status") != "ok":
        reason = "" if r is None else r.get("reason", "")
        lines.append((name, impl, "not run", "", "", "", xla, reason[:50]))
        continue
      m = r["memory"]
      sc = r["spot_check"]
      check = (", ".join(x["slice"] for x in sc["slices"]) + ": oracle "
               + ("ok" if sc["oracle_ok"] else "WRONG") + ", one chunk "
               + ("identical" if sc["one_chunk_identical"] else "differs"))
      if impl == "reference":
        same = r.get("identical_to_streaming")
        check += "; all rows vs streaming: " + (
            "identical" if same else "differ" if same is not None else "?")
      lines.append((name, impl, f"{r['wall_s']:.1f}",
                    f"{r['entries_per_s']:.3g}",
                    f"{mib(m['peak_rss_bytes'])}",
                    f"{mib(m['peak_over_inputs_bytes'])}", xla, check))
  out = _aligned(head, lines)
  for row in doc["results"]:
    f = row["one_chunk_formula_temp_bytes"]
    out.append(f"{row['shape']['name']}: one-chunk temp by formula "
               f"{mib(f['low'])}-{mib(f['high'])} MiB, by XLA "
               f"{mib(row['predicted_xla']['reference']['temp_bytes'])} MiB; "
               f"streaming temp by XLA "
               f"{mib(row['predicted_xla']['streaming']['temp_bytes'])} MiB")
  return "\n".join(out)


def plot(doc, path):
  """bench.png: wall time (log) and peak RSS over inputs, per shape and column.

  A bar whose result disagrees with the oracle is marked "wrong".
  """
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top

  shapes = [s["name"] for s in doc["shapes"]]
  impls = doc["settings"]["implementations"]
  fig, axes = plt.subplots(1, 2, figsize=(13, 4.8))
  width = 0.8 / max(len(impls), 1)
  x = np.arange(len(shapes))
  for j, impl in enumerate(impls):
    med, lo, hi, mem, wrong = [], [], [], [], []
    for s in shapes:
      r = next((r for r in doc["results"] if r["shape"] == s
                and r["impl"] == impl and r["status"] == "ok"), None)
      if r is None:
        med.append(np.nan), lo.append(0), hi.append(0), mem.append(np.nan)
        wrong.append(False)
        continue
      wrong.append(not r.get("agreement", {}).get("vs_oracle",
                                                  {"ok": True})["ok"])
      w = r["wall_s"]
      med.append(w["median"])
      lo.append(w["median"] - w["min"])
      hi.append(w["max"] - w["median"])
      over = r["memory"]["peak_over_inputs_bytes"]
      mem.append(np.nan if over is None else over / 2**20)
    pos = x + (j - (len(impls) - 1) / 2) * width
    axes[0].bar(pos, med, width, yerr=[lo, hi], capsize=2, label=impl)
    axes[1].bar(pos, mem, width, label=impl)
    for p_, m_, bad in zip(pos, med, wrong):
      if bad:  # disagrees with the oracle: its time is not trusted
        axes[0].annotate("wrong", (p_, m_), ha="center", va="bottom",
                         fontsize=7, color="red", rotation=90)
  axes[0].set_yscale("log")
  axes[0].set_ylabel("wall time per call, s (median, min-max)")
  axes[1].set_ylabel("peak RSS over inputs, MiB")
  for ax in axes:
    ax.set_xticks(x)
    ax.set_xticklabels(shapes, rotation=20, ha="right", fontsize=8)
    ax.grid(axis="y", alpha=0.3)
  axes[0].legend(fontsize=8)
  fig.suptitle(doc["machine"]["describe"], fontsize=9)
  fig.tight_layout()
  fig.savefig(path, dpi=110)
  plt.close(fig)
