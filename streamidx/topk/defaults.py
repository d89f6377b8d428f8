"""The default top-k method of each chip: a table with a source per row.

A call's `topk_method` and `select_topk`'s `method` left None take the row
of the chip the call is traced for (`lookup()`, through
`modes.current_generation()`; `TopkCall` resolves it when the call is
built and keeps the row's source in `topk_source`).

A recorded row's rule: of the exact methods that need nothing beside the
score buffer (`KERNEL_TOPK_METHODS`), the one with the fewest TensorCore
bundles executed at DeepSeek-V4-Flash decode (`DECODE`) on that chip
(data/step_schedule.json, "selection": a static schedule, not a timing);
its `source` quotes those records (tests/test_topk_defaults.py checks
them). Without records, and off-TPU: `VENDORED_TOPK_METHOD`.
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

  # Where the row comes from: the records it rests on, or why the vendored sort.
  source = property(lambda self: _source(self))


@functools.lru_cache(maxsize=None)
def _source(row: Default) -> str:
  if not row.recorded:
    return row.note
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


TABLE: dict[str | None, Default] = {
    None: Default(None, VENDORED_TOPK_METHOD, note=_OFF_TPU),
    "v4": Default("v4", VENDORED_TOPK_METHOD),
    "v5e": Default("v5e", "blocktop", recorded=True),
    "v5p": Default("v5p", VENDORED_TOPK_METHOD),
    "v6e": Default("v6e", "blocktop", recorded=True),
    "v7x": Default("v7x", "blocktop", recorded=True),
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
