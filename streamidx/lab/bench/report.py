"""The benchmark's reports: ratios and the text table; from the JSON documents
`harness.run` writes and nothing else, so a saved one can be reported again.
"""

from __future__ import annotations

import statistics

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
  """A document's results as a text table, then ratios and block sizes."""
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
  return "\n".join(out)
