"""The default top-k method of each chip: a table with a source per row.

A call's `topk_method` and `select_topk`'s `method` left None take the row
of the chip the call is traced for (`lookup()`, through
`modes.current_generation()`; `TopkCall` resolves it when the call is
built and keeps the row's source in `topk_source`).

A recorded row's rule: of the exact methods that need nothing beside the
score buffer (`KERNEL_TOPK_METHODS`), the one with the least device time
for the selection alone at DeepSeek-V4-Flash decode (`DECODE`) where the
chip records measured them on that chip (`measured`: this project's
measurements, each checked equal to the rule), else the one with the fewest
TensorCore bundles executed there (data/step_schedule.json, "selection": a
static schedule, not a timing); its `source` quotes those records
(tests/test_topk_defaults.py checks them). Without records, and off-TPU:
`VENDORED_TOPK_METHOD`.
"""

from __future__ import annotations

import dataclasses
import functools

from streamidx import modes, records

# The vendored kernel's selection (approx_max_k(recall_target=1.0), then the
# tie check, M12): what the table falls back on.
VENDORED_TOPK_METHOD = "sort"
DECODE = (64, 262144, 512)  # rows, entries, k: DeepSeek-V4-Flash decode

_OFF_TPU = (
    "off-TPU (CPU, the TPU interpreter, CI): the vendored sort. No figure "
    "ranks the methods on a CPU, where approx_max_k is XLA's exact sort; "
    "'blocktop' would run its Pallas kernel in the TPU interpreter")
_NO_FIGURE = "no recorded figure: the vendored sort"


def decode_records(generation: str) -> dict[str, dict]:
  """The "selection" records of `generation` at `DECODE`, by method."""
  return {r["method"]: r for r in records.load("step_schedule")["selection"]
          if r["chip"] == generation
          and (r["rows"], r["entries"], r["k"]) == DECODE}


def measured(generation: str) -> dict[str, dict]:
  """The chip records' newest selection-alone call of each exact method of
  `KERNEL_TOPK_METHODS` at `DECODE` on `generation` that its check found
  equal to the rule (a call row of `records.calls`, seconds in "device_s")."""
  from streamidx.topk import registry  # pylint: disable=g-import-not-at-top
  rows, entries, k = DECODE
  return {r["method"]: r for r in records.calls(  # the newest last
      chip=generation, variant=None, rows=rows, entries=entries, k=k)
          if (r.get("check") or {}).get("ok") and r["method"] in
          registry.KERNEL_TOPK_METHODS and registry.METHODS[r["method"]].exact}


def _count(r: dict) -> str:
  if r["bundles"] is not None:
    return f"{r['method']} {r['bundles']:,}"
  return (f"{r['method']} >= {r['bundles_without_dynamic']:,} (loops of "
          f"dynamic trip count)")


@dataclasses.dataclass(frozen=True)
class Default:
  """One row: the chip (None: off-TPU), its default method, and whether it
  rests on the recorded figures (then `source` quotes them)."""

  generation: str | None
  method: str
  recorded: bool = False
  note: str = _NO_FIGURE
  measured: bool = False  # recorded by the chip records, not the schedule

  # Where the row comes from: the records it rests on, or why the vendored sort.
  source = property(lambda self: _source(self))


@functools.lru_cache(maxsize=None)
def _source(row: Default) -> str:
  if not row.recorded:
    return row.note
  if row.measured:
    return _measured_source(row)
  from streamidx.topk import registry  # pylint: disable=g-import-not-at-top

  recs = decode_records(row.generation)
  exact = sorted((r for m, r in recs.items()
                  if registry.METHODS[m].exact and m != row.method),
                 key=lambda r: (r["bundles"] is None,
                                r["bundles"] or r["bundles_without_dynamic"]))
  missing = [m for m in registry.EXACT_TOPK_METHODS if m not in recs]
  own = recs.get(row.method)
  if own is None or own["bundles"] is None:
    return (f"NO count of {row.method!r} at {row.generation} decode in "
            f"data/step_schedule.json")
  rows, entries, k = DECODE
  sc = (f"; its program also makes {len(own['sparsecore_calls'])} "
        f"SparseCore calls, not counted" if own["sparsecore_calls"] else "")
  return (
      f"recorded static schedule (no TPU timing; data/step_schedule.json, "
      f"libtpu {records.load('step_schedule')['libtpu']}, {own['date']}): {row.generation} "
      f"{rows} x {entries:,} entries, k {k}: {row.method} executes "
      f"{own['bundles']:,} bundles (a conditional: the branch rows of "
      f"distinct scores take), the fewest of the exact methods recorded "
      f"there ({', '.join(map(_count, exact))})"
      + (f"; not recorded: {', '.join(missing)}" if missing else "") + sc)


def _measured_source(row: Default) -> str:
  recs = measured(row.generation)
  own = recs[row.method]
  others = sorted((r for m, r in recs.items() if m != row.method),
                  key=lambda r: r["device_s"])
  from streamidx.topk import registry  # pylint: disable=g-import-not-at-top
  missing = [m for m in registry.KERNEL_TOPK_METHODS
             if registry.METHODS[m].exact and m not in recs]
  rows, entries, k = DECODE
  return (
      f"measured on {row.generation} ({own['device_kind']}; jax {own['jax']}, "
      f"libtpu {own['libtpu']}; {own['date'][:10]}; `python -m "
      f"streamidx.bench --record`, the chip records): the selection alone at "
      f"{rows} x {entries:,} entries, k {k}, took {own['device_s'] * 1e3:.3f} "
      f"ms of device time with {row.method}, checked equal to the rule, the "
      f"least of the exact methods measured there ("
      + ", ".join(f"{r['method']} {r['device_s'] * 1e3:.3f} ms" for r in others)
      + ")" + (f"; not measured: {', '.join(missing)}" if missing else ""))


def _row(generation: str, scheduled: str) -> Default:
  """`generation`'s row: by the chip records where they measured the exact
  methods at `DECODE`, else `scheduled` (the static schedule's choice)."""
  recs = measured(generation)
  if not recs:
    return Default(generation, scheduled, recorded=True)
  return Default(generation, min(recs, key=lambda m: recs[m]["device_s"]),
                 recorded=True, measured=True)


TABLE: dict[str | None, Default] = {
    None: Default(None, VENDORED_TOPK_METHOD, note=_OFF_TPU),
    "v4": Default("v4", VENDORED_TOPK_METHOD),
    "v5e": _row("v5e", "blocktop"),
    "v5p": Default("v5p", VENDORED_TOPK_METHOD),
    "v6e": _row("v6e", "blocktop"),
    "v7x": _row("v7x", "blocktop"),
}


def lookup(generation: str | None = None) -> Default:
  """The table's row for `generation` (None: the chip traced for,
  `modes.current_generation()`, None off-TPU or on a TPU it does not name)."""
  if generation is None:
    generation = modes.current_generation()
  if generation not in TABLE:
    raise ValueError(f"generation: must be one of {tuple(TABLE)} (got "
                     f"{generation!r})")
  return TABLE[generation]


def default_method(generation: str | None = None) -> str:
  """The default `topk_method` for `generation` (`lookup`'s row)."""
  return lookup(generation).method
