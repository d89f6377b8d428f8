"""The static-schedule step held against every public TPU measurement.

`data/step_schedule.json` records, per chip, the bundles the compiled
programs of the step execute (`streamidx.lab.dump`): each scoring launch's
whole module (`roofline.LaunchProgram`) and each selection program (split
into its sort, its layout copies and the rest), each row with the command
and date that made it. `rows()` predicts each public measurement
(data/public_measurements.json, by others) with the model's stages
(`roofline.measurement_stages`) at ONE clock per chip (`roofline.clock`).

    python -m streamidx.lab.calibration           the tables, from the records:
                                                  the public measurements, then
                                                  this project's chip records
    python -m streamidx.lab.calibration --json    the rows as one JSON list
    python -m streamidx.lab.calibration --record-launches v7x v6e [--shape glm-decode-4k] [--variant lean]
                                                  compile a variant's scoring launches
                                                  and append their rows to the records
    python -m streamidx.lab.calibration --selection
                                                  the recorded selection counts
                                                  (`selection_table`)
    python -m streamidx.lab.calibration --record-selection v7x sort 64 262144 512
                                                  compile one selection and
                                                  append its row to the records
"""

from __future__ import annotations

import argparse
import datetime
import glob
import json
import os
import re
import sys
from typing import Sequence

from streamidx import records, topk
from streamidx.lab import dump
from streamidx.lab import shapes as shapes_lib
from streamidx.lab.model import roofline
from streamidx.variants import VARIANTS

# A prediction within this factor of its measurement (either way) agrees with it.
BAND = 1.5
# The same for this project's own chip measurements (the chip records).
CHIP_BAND = 1.2
# Why a prediction is more than BAND off, with the evidence the dump gives;
# a row off by more and not named here is marked "unexplained".
EXPLAINED = {
    "copies": (
        "SparseCore time (not in the dump): on TPU7x the selection's program hands its input "
        "to SparseCore calls (data/step_schedule.json: sparsecore_calls, "
        "2 x 64 MiB, their bytes 73 us at HBM rate); the dump has no bundles "
        "for them, so their time is not predicted"),
}
UNEXPLAINED = (
    "unexplained (sort clock ~1 GHz): the count is the sort's whole TensorCore program (its 16 "
    "loops, trips read from the dump) and implies about 1 GHz, half the "
    "scoring's clock. Seen in the dump, not in bundles: the sort loops "
    "issue near the cross-lane unit's (XLU) capacity (76-81% in the merge "
    "loops) and every pipelined iteration waits on DMA (4-6 waits)")
_COPY = re.compile(r"^(copy|reshape|transpose|slice|bitcast)(\.\d+)?(\.clone)?$")
_INSTR_SHAPE = re.compile(r"^\s+(?:ROOT )?%([\w.\-]+) = (\w+)\[([\d,]*)\]")


def provenance() -> str:
  """Where the counts and the measurements come from, with their dates: one line a notebook
  quotes beside every number it takes from them."""
  rec, pub = records.load("step_schedule"), records.load("public_measurements")
  dates = sorted({r["date"] for k in ("launches", "selection") for r in rec[k]})
  return (f"bundles: data/{records.FILES['step_schedule']} (libtpu "
          f"{rec['libtpu']}, compiled without a TPU, recorded {', '.join(dates)}); public "
          f"measurements: data/{records.FILES['public_measurements']} (by others, "
          f"collected {pub['collected']})")


def _hlo_bytes(dump_dir: str) -> dict[str, int]:
  """Output bytes of each HLO instruction of the module's top-level HLO."""
  out = {}
  for path in glob.glob(os.path.join(dump_dir, "*-TLP-hlo.txt")):
    with open(path, encoding="utf-8") as f:
      for m in filter(None, map(_INSTR_SHAPE.match, f)):
        out[m.group(1)] = dump.array_bytes(m.group(2), m.group(3))
  return out


def selection_program(scores, *extra, k: int, method: str):
  """The selection as one compiled program: `select_topk(scores, k,
  method)` with, for a method that `needs` an extra output of the scoring
  kernel, that output as a second input (as the kernel hands it over; its
  computation inside the kernel is not part of this program)."""
  return topk.select_topk(scores, k, method, extra=extra[0] if extra else None)


def extra_input(method: str, rows: int, entries: int):
  """(shape, dtype) of the extra input `method` reads beside f32[rows,
  entries] (its `extra_ref` on that shape), or None when it needs none."""
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  m = topk.get(method)
  if m.needs is None:
    return None
  opts = m.resolve({})
  out = jax.eval_shape(lambda s: m.extra_ref(s, **opts),
                       jax.ShapeDtypeStruct((rows, entries), jnp.float32))
  return tuple(out.shape), str(out.dtype)


def dynamic_loops(comps) -> list[tuple[str, int, int]]:
  """(computation, loop start, bundles per iteration) of every loop whose
  trip count the dump does not give (a register bound)."""
  return [(name, l.start, l.bundles) for name, c in sorted(comps.items())
          for l in c.loops if l.trips is None]


def taken_branches(method: str, conds) -> dict[str, int]:
  """The branch of each conditional that runs on rows of distinct scores:
  "sort", its one conditional's branch 0 (no row's ties straddle the k-th
  place, so no row is ranked again: `topk.base.again`); "blocktop",
  its outermost conditional's branch 0 (no block overflows, so the full
  sort of branch 1 does not run). Other methods: none (every branch
  counted, an upper bound)."""
  if method == "sort":
    if len(conds) != 1:
      raise ValueError(f"the sort method has one conditional, found {len(conds)}")
    return {conds[0].name: 0}
  if method == "blocktop" and conds:
    inner = set().union(*(b for c in conds for b in c.branches))
    outer = [c for c in conds if c.name not in inner]
    if len(outer) != 1:
      raise ValueError(f"the blocktop method has one outermost conditional, "
                       f"found {len(outer)}")
    return {outer[0].name: 0}
  return {}


def selection_row(dump_dir: str, *, chip: str, method: str, rows: int,
                  entries: int, k: int, command: str, date: str,
                  trips=None, extra=None) -> dict:
  """The record of one selection program dumped in `dump_dir`: bundles
  executed (`taken_branches`; every branch beside it), split into the sort
  computations, the layout copies (their HBM bytes, and the SparseCore
  calls') and the rest. trips: {(computation, loop start): n} of dynamic
  loops; one left unknown makes `bundles` None (`bundles_without_dynamic`:
  with them at 0 trips). extra: (shape, dtype) of the method's extra input."""
  comps, conds, sc = dump.read_module(dump_dir)
  taken = taken_branches(method, conds)
  trips = dict(trips or {})
  zero = {**{d[:2]: 0 for d in dynamic_loops(comps)}, **trips}
  mc = dump.executed(comps, conditionals=conds, taken=taken, sparsecore=sc,
                     trips=zero)
  per_trip = {d[:2]: d[2] for d in dynamic_loops(comps)}
  unknown = [(c, s, per_trip[(c, s)]) for c, s, _ in mc.dynamic
             if (c, s) not in trips]  # reached, trips not supplied
  upper = dump.executed(comps, conditionals=conds, sparsecore=sc,
                        trips=zero).total
  sizes = _hlo_bytes(dump_dir)
  sort = sum(r[3] for r in mc.by_call if r[0].startswith("sort"))
  copies = [r for r in mc.by_call if _COPY.match(r[0])]
  copy_bytes = sum(2 * sizes.get(r[0], 0) * r[1] for r in copies)
  sc_bytes = sum(2 * s[2] for s in mc.sparsecore)
  row = dict(
      chip=chip, method=method, rows=rows, entries=entries, k=k,
      taken={n: i for n, i in taken.items()},
      bundles=None if unknown else mc.total,
      bundles_every_branch=None if unknown else upper, sort_bundles=sort,
      copy_bundles=sum(r[3] for r in copies),
      copy_hbm_bytes=copy_bytes, sparsecore_calls=[list(s) for s in mc.sparsecore],
      sparsecore_hbm_bytes=sc_bytes,
      sort_loops=[[c, b, t] for c, _, b, t, runs in mc.loops
                  if c.startswith("sort") and runs],
      calls=[[r[0], r[1], r[2]] for r in mc.by_call],
      command=command, date=date)
  if extra is not None:
    row["extra_input"] = [list(extra[0]), extra[1]]
  if mc.dynamic:
    row["dynamic_trips"] = [[c, s, n] for c, s, n in mc.dynamic
                            if (c, s) in trips]
  if unknown:
    row.update(bundles_without_dynamic=mc.total,
               dynamic_loops=[list(d) for d in unknown])
  return row


def record_selection(chip: str, method: str, rows: int, entries: int,
                     k: int, *, trips=None, dump_dir: str | None = None) -> dict:
  """`selection_row` of `selection_program` compiled for `chip` at
  f32[rows, entries] (and the method's extra input) in a child process,
  with the command that remakes it and today's date."""
  import contextlib  # pylint: disable=g-import-not-at-top
  import tempfile  # pylint: disable=g-import-not-at-top
  extra = extra_input(method, rows, entries)
  args = [((rows, entries), "float32")] + ([extra] if extra else [])
  with (contextlib.nullcontext(dump_dir) if dump_dir else
        tempfile.TemporaryDirectory(prefix="sidx-sel-")) as tmp:
    dump.compile_dumps([dict(
        generation=chip, fn="streamidx.lab.calibration:selection_program",
        kwargs=dict(k=k, method=method), args=args)], dump_dir=tmp)
    return selection_row(
        tmp, chip=chip, method=method, rows=rows, entries=entries, k=k,
        command=(f"python -m streamidx.lab.calibration --record-selection "
                 f"{chip} {method} {rows} {entries} {k}"),
        date=datetime.date.today().isoformat(), trips=trips, extra=extra)


def append_rows(section: str, key: Sequence[str], new_rows: Sequence[dict]) -> None:
  """Appends rows to data/step_schedule.json's `section` ("selection" or
  "launches"; ValueError if one with the same `key` fields is recorded
  already: a record is replaced by hand, never silently)."""
  doc = dict(records.load("step_schedule"))
  doc[section] = list(doc[section])
  have = {tuple(x[f] for f in key) for x in doc[section]}
  for r in new_rows:
    if tuple(r[f] for f in key) in have:
      raise ValueError(f"new_rows: {tuple(r[f] for f in key)} is recorded already")
    doc[section].append(r)
  records.save("step_schedule", doc)


def append_selection(new_rows: Sequence[dict]) -> None:
  """`append_rows` of `record_selection`'s rows."""
  append_rows("selection", roofline.SELECTION_KEY, new_rows)


# The shapes `selection_table` reports (issue 38): DeepSeek-V4 decode, 64 rows x 262,144
# entries at k 512 (`topk.defaults.DECODE`), 1,024 and 2,048; prefill, 2,048 rows at k 512.
SELECTION_SHAPES = (("decode", *topk.defaults.DECODE), ("decode", 64, 262144, 1024),
                    ("decode", 64, 262144, 2048), ("prefill", 2048, 262144, 512))
SELECTION_CHIPS = ("v5e", "v6e", "v7x")


def selection_table(chips: Sequence[str] = SELECTION_CHIPS) -> str:
  """The recorded selection programs (data/step_schedule.json; compiling nothing) of every
  registered method at `SELECTION_SHAPES` on `chips`, as a table: the TensorCore bundles
  ("-": a loop of dynamic trip count), an exact method's over the sort's at the same chip
  and shape, the SparseCore bundles (0 without SparseCore calls; "-" with them: the dump
  has none). A method that reads the scoring kernel's extra output takes it as an input:
  the bundles writing it in that kernel are not counted."""
  from streamidx.lab import tables  # pylint: disable=g-import-not-at-top
  rows, missing = [], 0
  for kind, n_rows, entries, k in SELECTION_SHAPES:
    for chip in chips:
      sort = roofline.selection_record(chip, "sort", n_rows, entries, k) or {}
      for m in topk.TOPK_METHODS:
        rec = roofline.selection_record(chip, m, n_rows, entries, k)
        if rec is None:
          missing += 1
          continue
        n, calls = rec["bundles"], rec["sparsecore_calls"]
        base = sort.get("bundles") if topk.METHODS[m].exact and n else None
        rows.append({
            "shape": f"{kind} {n_rows}x{entries}", "k": k, "chip": chip, "method": m,
            "tc_bundles": "-" if n is None else f"{n:,}",
            "/ sort": f"{n / base:.3f}" if base else "-",
            "sc_bundles": "-" if calls else 0,
            "note": ("dynamic trips" if n is None else "SparseCore calls" if calls else "")
                    + (" (fused extra not counted)" if topk.METHODS[m].needs else "")})
  return ("TensorCore bundles executed by each compiled selection (static schedule, "
          f"libtpu dump; not a timing)\n{tables.format_rows(rows)}\n{missing} of "
          f"{missing + len(rows)} not recorded (--record-selection CHIP METHOD ROWS "
          "ENTRIES K records one)")


def rows() -> list[dict]:
  """One row per public measurement: its prediction at one clock per chip
  (predicted_s None where it cannot be predicted; `why` says why, or what
  was assumed); `bound`: each stage's bounds."""
  out = []
  for m in records.load("public_measurements")["measurements"]:
    shape = (f"{m['rows'] or '?'} x {m['entries'] or '?'}, k {m['k'] or '?'}")
    row = dict(source=m["source"], id=m["id"], url=m["url"], chip=m["chip"],
               stage=m["stage"], method=m.get("selection_method"), shape=shape,
               measured_s=m["measured_s"], predicted_s=None, why="", bound="",
               implied_hz=None)
    hz, src = roofline.clock(m["chip"]) if m["chip"] else (None, "")
    parts, why = roofline.measurement_stages(m, hz or 0.0)
    row["why"] = why
    if parts is not None and not hz:  # the clock the count implies, still
      row["implied_hz"] = roofline.implied_clock(parts, m["measured_s"])
      row["why"] = "; ".join(x for x in (f"no clock ({src})", why) if x)
    elif parts is not None:
      row.update(predicted_s=sum(s.bound for s in parts),
                 bound="; ".join(s.describe() for s in parts),
                 implied_hz=roofline.implied_clock(parts, m["measured_s"]))
      ratio = row["predicted_s"] / m["measured_s"]
      if roofline.INFER_FROM.get(m["chip"]) == m["id"]:
        row["why"] = "; ".join(x for x in ("the clock's source (1.00 by construction)", why) if x)
      elif not 1 / BAND <= ratio <= BAND:
        row["why"] = "; ".join(x for x in (why, EXPLAINED.get(m["stage"], UNEXPLAINED)) if x)
    out.append(row)
  return out


def format_table(rs: Sequence[dict]) -> str:
  from streamidx.lab import tables  # pylint: disable=g-import-not-at-top
  ms = lambda s: "-" if s is None else f"{s * 1e3:.3f} ms"
  text = tables.format_rows([{
      "source": r["source"], "chip": r["chip"] or "-", "stage": r["stage"],
      "method": r["method"] or "-", "shape": r["shape"],
      "measured": ms(r["measured_s"]), "predicted": ms(r["predicted_s"]),
      "ratio": ("-" if r["predicted_s"] is None
                else f"{r['predicted_s'] / r['measured_s']:.2f}"),
      "implied GHz": "-" if not r["implied_hz"] else f"{r['implied_hz'] / 1e9:.2f}",
      "note": r["why"].split(": ")[0] if len(r["why"]) > 60 else r["why"]}
      for r in rs])
  n = sum(1 for r in rs if r["predicted_s"] is not None
          and 1 / BAND <= r["predicted_s"] / r["measured_s"] <= BAND)
  chips = sorted({r["chip"] for r in rs if r["chip"]})
  clocks, none = [], []
  for c in chips:
    hz, src = roofline.clock(c)
    if hz:
      clocks.append(f"{c} {hz / 1e9:.3f} GHz from {src.replace('inferred from ', '')}")
    else:
      none.append(c)
  if none:  # a chip without a clock predicts nothing; named after the clocks
    clocks.append(f"no clock: {', '.join(none)}")
  return (text + f"\n{n} of {len(rs)} public measurements within {BAND}x at one "
          f"clock per chip ({'; '.join(clocks)})")


def newest_calls() -> list[dict]:
  """The newest recorded token call of each chip, shape, variant, method
  and k (`records.calls`)."""
  return list({(r["chip"], r["shape"], r["variant"], r["method"], r["k"]): r
               for r in records.calls(mode=("decode", "prefill"))}.values())


def superseded(call: dict) -> bool:
  """A lean call whose kernel lacked a piece today's has (recorded before
  its early issue or its second block in flight shipped:
  `records.removed_now`): the model of today's kernel is not held against
  it."""
  return call["variant"] == "lean" and bool(
      records.removed_now((), call["date"]))


def chip_rows() -> list[dict]:
  """This project's measured token calls (`records.calls`, the newest of
  each chip, shape, variant, method and k) beside the model's step at
  their shape and blocks (`roofline.indexer_step` at DeepSeek-V4's
  geometry and the chip's clock): the call's device time and its scoring part, each with
  the model's; "model" the `StepBound`; "selection_measured": its
  selection is the chip's own time for it alone (`roofline.selection_stages`)."""
  from streamidx.lab.shapes import DSV4  # pylint: disable=g-import-not-at-top
  out = []
  for r in newest_calls():
    if superseded(r):
      continue
    prefill = r["mode"] == "prefill"
    sb = roofline.indexer_step(
        r["chip"], DSV4, k=r["k"], variant=r["variant"], method=r["method"],
        batch=1 if prefill else r["rows"], q_len=r["rows"] if prefill else 1,
        context_tokens=r["tokens"], blocks=records.block_kwargs(r))
    scoring = next(st.bound for st in sb.stages if st.name == "scoring")
    out.append(dict(chip=r["chip"], shape=r["shape"], variant=r["variant"],
                    method=r["method"], k=r["k"], measured_s=r["device_s"],
                    predicted_s=sb.total_s, scoring_s=r["parts"]["scoring"],
                    scoring_predicted_s=scoring, model=sb, call=r,
                    selection_measured=any(st.t_chip is not None
                                           for st in sb.stages)))
  return out


def format_chip_table(rs: Sequence[dict]) -> str:
  from streamidx.lab import tables  # pylint: disable=g-import-not-at-top
  ms = lambda s: f"{s * 1e3:.3f} ms"
  text = tables.format_rows([{
      "chip": r["chip"], "shape": r["shape"], "variant": r["variant"],
      "method": r["method"], "measured": ms(r["measured_s"]),
      "model": ms(r["predicted_s"]),
      "ratio": f"{r['predicted_s'] / r['measured_s']:.2f}",
      "scoring measured": ms(r["scoring_s"]),
      "scoring model": ms(r["scoring_predicted_s"]),
      "scoring ratio": f"{r['scoring_predicted_s'] / r['scoring_s']:.2f}",
      "model's selection": ("measured alone" if r["selection_measured"]
                            else "modelled")}
      for r in rs])
  within = lambda a, b: 1 / CHIP_BAND <= a / b <= CHIP_BAND
  n = sum(within(r["predicted_s"], r["measured_s"]) for r in rs)
  ns = sum(within(r["scoring_predicted_s"], r["scoring_s"]) for r in rs)
  chips = sorted({r["chip"] for r in rs})
  sel = sum(r["selection_measured"] for r in rs)
  return (text + f"\n{', '.join(chips) or 'no chip'} (this project's "
          f"measurements, the chip records): {n} of {len(rs)} calls within "
          f"{CHIP_BAND}x of the model ({sel} with the selection's own time "
          f"measured alone in it); the scoring alone {ns} of {len(rs)}"
          + (f"; {old} lean call{'s' * (old > 1)} recorded before today's "
             f"lean kernel shipped left out" if (old := sum(
                 map(superseded, newest_calls()))) else ""))


def record_launches(chips: Sequence[str], *, variant: str = "vendored",
                    shape: str = "dsv4-decode-4k") -> list[dict]:
  """Recompiles every launch of `variant` (its first cache format) at `shape`
  (the table's blocks) for each chip and returns their `LaunchProgram` rows."""
  from streamidx.lab import schedule  # pylint: disable=g-import-not-at-top
  fmt = VARIANTS[variant].cache_formats[0]
  out = []
  for chip in chips:
    blocks = shapes_lib.table_blocks(shapes_lib.COMPILE_BY_NAME[shape], variant,
                                     fmt, chip).kwargs()
    for s in schedule.launch_schedules(variant, chip, fmt, shape, blocks):
      if s.program is None:
        continue
      out.append(dict(
          chip=chip, variant=variant, fmt=fmt, case=s.case,
          seq_batch_size=s.seq_batch_size, bkv_p=s.bkv_p, bq=s.bq_sz,
          launch=s.launch, compiled_shape=shape, outside=s.program.outside,
          levels=list(s.program.levels), calls=[list(c) for c in s.program.calls],
          command=(f"python -m streamidx.lab.calibration --record-launches {chip}"
                   + ("" if shape == "dsv4-decode-4k" else f" --shape {shape}")
                   + ("" if variant == "vendored" else f" --variant {variant}")),
          date=datetime.date.today().isoformat()))
  return out


_LAUNCH_KEY = roofline.LAUNCH_KEY + ("compiled_shape",)  # one row per compile


def main(argv=None) -> int:
  p = argparse.ArgumentParser(prog="python -m streamidx.lab.calibration",
                              description=__doc__.split("\n\n")[0])
  p.add_argument("--json", action="store_true", help="the rows as JSON")
  p.add_argument("--selection", action="store_true", help="the recorded selection "
                 "counts as a table (`selection_table`)")
  p.add_argument("--record-selection", nargs=5,
                 metavar=("CHIP", "METHOD", "ROWS", "ENTRIES", "K"),
                 help="compile select_topk(f32[ROWS, ENTRIES], K, METHOD) for "
                 "CHIP (no TPU; minutes) and append its row to "
                 "data/step_schedule.json")
  p.add_argument("--record-launches", nargs="+", metavar="CHIP",
                 help="compile the scoring launches for these chips (no TPU; "
                 "minutes) and append their rows to data/step_schedule.json")
  p.add_argument("--variant", default="vendored", choices=sorted(
      v for v in VARIANTS if VARIANTS[v].mode == "token"), help="with "
                 "--record-launches: the token variant (its first cache format)")
  p.add_argument("--shape", default="dsv4-decode-4k",
                 choices=sorted(shapes_lib.COMPILE_BY_NAME), help="with "
                 "--record-launches: the compile shape (its geometry keys "
                 "the rows)")
  a = p.parse_args(argv)
  if a.record_selection:
    chip, method, r, e, k = a.record_selection
    row = record_selection(chip, method, int(r), int(e), int(k))
    append_selection([row])
    print(json.dumps(row, indent=1))
    return 0
  if a.selection:
    print(selection_table())
    return 0
  if a.record_launches:
    new = record_launches(a.record_launches, variant=a.variant, shape=a.shape)
    append_rows("launches", _LAUNCH_KEY, new)
    print(json.dumps([{k: r[k] for k in _LAUNCH_KEY + ("levels",)} for r in new],
                     indent=1))
    return 0
  rs = rows()
  if a.json:
    print(json.dumps([{k: r[k] for k in ("source", "chip", "stage", "shape",
                                          "measured_s", "predicted_s")}
                      for r in rs]))
    return 0
  print(format_table(rs))
  print()
  print(format_chip_table(chip_rows()))
  return 0


if __name__ == "__main__":
  sys.exit(main())
