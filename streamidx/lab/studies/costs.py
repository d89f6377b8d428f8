"""What a kernel call moves, counted from the DMAs the TPU interpreter executes
(`lab.model.timeline.record()`): bytes per entry, KV blocks fetched for
nothing, launches, grid points and DMAs per launch.
"""

from __future__ import annotations

import collections

import jax

from streamidx import modes
from streamidx import variants as variants_lib
from streamidx.lab.model import tiling, timeline

_KV_KINDS = ("kv", "kv_scale")


def launch_counts(rec: timeline.Recorder) -> list[dict]:
  """Per launch that ran: grid_points, dma_starts and bytes {kind: n},
  kv_blocks (the "kv" waits: one per sequence per step)."""
  out = []
  for op in rec.ops:
    if op.kind == "launch":
      out.append(dict(grid_points=0, dma_starts=collections.Counter(),
                      bytes=collections.Counter(), kv_blocks=0))
    elif op.kind == "grid":
      out[op.launch]["grid_points"] += 1
    elif op.kind == "dma_start":
      d = out[op.launch]
      d["dma_starts"][op.info["sem"]] += 1
      d["bytes"][op.info["sem"]] += op.info["nbytes"]
    elif op.kind == "dma_wait" and op.info["sem"] == "kv":
      out[op.launch]["kv_blocks"] += 1
  return out


def totals(counts: list[dict]) -> dict:
  """`launch_counts` summed over the launches (plus `launches`)."""
  starts, nbytes = collections.Counter(), collections.Counter()
  for c in counts:
    starts.update(c["dma_starts"])
    nbytes.update(c["bytes"])
  return dict(launches=len(counts),
              grid_points=sum(c["grid_points"] for c in counts),
              dma_starts=dict(starts), dma_total=sum(starts.values()),
              bytes=dict(nbytes), kv_blocks=sum(c["kv_blocks"] for c in counts))


def recorded_call(fn):
  """(fn()'s result, its `timeline.Recorder`); where this JAX lacks the
  recorder's internals, (result, None), for the caller to skip."""
  if modes.interpreter_internals_missing("timeline") is not None:
    with modes.interpreter():
      return jax.block_until_ready(fn()), None
  with timeline.record() as rec:
    out = jax.block_until_ready(fn())
  if rec.errors():
    raise RuntimeError(f"the recorder failed: {rec.errors()[:3]}")
  return out, rec


def run_recorded(variant: str, inputs, *, fmt: str | None = None, **static):
  """`recorded_call` of `VARIANTS[variant].run(inputs, fmt=, **static)`."""
  return recorded_call(
      lambda: variants_lib.get(variant).run(inputs, fmt=fmt, **static))


def recorded_bytes(rec: timeline.Recorder, *, page_size: int) -> dict:
  """HBM bytes a recording's DMAs moved: kv_bytes, kv_pages, entries_fetched,
  bytes_per_entry, read (kv + q + weights), written (scores), totals."""
  t = totals(launch_counts(rec))
  kv = sum(t["bytes"].get(k, 0) for k in _KV_KINDS)
  pages = t["dma_starts"].get("kv", 0)
  entries = pages * int(page_size)
  read = kv + t["bytes"].get("q", 0) + t["bytes"].get("w", 0)
  return dict(kv_bytes=kv, kv_pages=pages, entries_fetched=entries,
              bytes_per_entry=kv / entries if entries else float("nan"),
              read=read, written=t["bytes"].get("out", 0), totals=t)


def recorded_costs(rec: timeline.Recorder, p: tiling.Plan) -> dict:
  """What a recording of the call plan `p` models moved (launches, DMAs,
  decode blocks fetched and needed, waste); ValueError unless it ran one
  launch per launch of the plan."""
  counts = launch_counts(rec)
  if len(counts) != len(p.executed):
    raise ValueError(f"{len(counts)} launches ran, the plan has "
                     f"{len(p.executed)}")
  moved = recorded_bytes(rec, page_size=p.geometry.page_size)
  fetched = sum(c["kv_blocks"] for c, l in zip(counts, p.executed)
                if l.case in ("decode", "decode_rest"))
  needed = tiling.block_waste(p)["blocks_needed"]
  return dict(launches=len(counts), grid_points=moved["totals"]["grid_points"],
              empty_launches=sum(1 for c in counts if not c["grid_points"]),
              kv_page_dmas=moved["kv_pages"],
              bytes_per_entry=moved["bytes_per_entry"], blocks_fetched=fetched,
              blocks_needed=needed,
              waste=(fetched - needed) / fetched if fetched else 0.0)
