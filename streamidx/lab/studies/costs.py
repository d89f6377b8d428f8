"""What a kernel call moves, counted from the DMAs the TPU interpreter executes.

The workbook's three findings about the vendored kernel (issue 13), counted
on a variant as the interpreter runs it, not modeled (and not timed):

- bytes per cache entry: the KV DMAs of the packed FP8 record move 256 B per
  entry, those of the dense FP8 cache head_dim + 1 (`bytes_moved`);
- KV blocks fetched for nothing by batched decode programs, in the given and
  in the sorted order (`decode_waste`), next to `tiling.block_waste`'s count
  for the same call;
- launches, grid points and DMAs per launch (`launch_counts`), e.g. with and
  without the launches of empty ranges; all three for one recorded call
  beside the plan that models it (`recorded_costs`, notebook 04).

Every number comes from a `streamidx.lab.model.timeline.record()` of the
call: DMA starts and waits with their byte counts (elements times itemsize
of the destination slice, as the interpreter copies them), grid points and
launches (`pallas_call`s that ran). Interpreter runs are slow (~0.2 ms per
simulated operation); the batches here are small, and bytes per entry do not
depend on the batch.
"""

from __future__ import annotations

import collections

import jax
import numpy as np

from streamidx import modes
from streamidx import variants as variants_lib
from streamidx.lab.model import tiling, timeline
from streamidx.semantics import cdiv

__all__ = ["launch_counts", "totals", "run_recorded", "recorded_call",
           "bytes_moved", "recorded_bytes", "recorded_costs", "decode_waste"]

_KV_KINDS = ("kv", "kv_scale")


def launch_counts(rec: timeline.Recorder) -> list[dict]:
  """Per launch that ran: grid points, DMA starts and bytes by kind, KV blocks.

  Each dict: grid_points, dma_starts {kind: n}, bytes {kind: n} (kind: "kv"
  cache values or records, "kv_scale" dense FP8 scales, "q", "w", "out"),
  kv_blocks (KV blocks fetched: one per sequence per step, counted from the
  "kv" waits).
  """
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


def run_recorded(variant: str, inputs, *, fmt: str | None = None, **static):
  """Runs `VARIANTS[variant]` on `inputs` under the recorder.

  Returns (indices, recorder). `static`: the call's keywords (k or k_pages,
  compression_ratio, block sizes, ...), as for `Variant.run`.
  """
  v = variants_lib.get(variant)
  with timeline.record() as rec:
    idx = jax.block_until_ready(v.run(inputs, fmt=fmt, **static))
  if rec.errors():
    raise RuntimeError(f"the recorder failed: {rec.errors()[:3]}")
  return idx, rec


def recorded_call(fn):
  """(fn()'s result, its `timeline.Recorder` or None), run in the interpreter.

  Under `timeline.record()` where this JAX's interpreter has the internals
  the recorder reads (`streamidx.interpreter_internals_missing("timeline")`
  is None: jax 0.10.2); elsewhere (e.g. a Colab runtime's own JAX) under
  `streamidx.interpreter()` with nothing recorded, so the result still
  comes back and the caller skips what needs the recording.
  """
  if modes.interpreter_internals_missing("timeline") is None:
    with timeline.record() as rec:
      out = jax.block_until_ready(fn())
    if rec.errors():
      raise RuntimeError(f"the recorder failed: {rec.errors()[:3]}")
    return out, rec
  with modes.interpreter():
    return jax.block_until_ready(fn()), None


def bytes_moved(variant: str, inputs, *, fmt: str | None = None,
                **static) -> dict:
  """HBM bytes the call's DMAs move, per cache entry fetched and in total.

  Returns: kv_bytes (cache values, records and scales read), kv_pages (page
  DMAs of the values or records), entries_fetched (kv_pages * page_size),
  bytes_per_entry (kv_bytes / entries_fetched), read (kv + q + weights
  bytes), written (score bytes), and the `totals` of the recording.
  """
  _, rec = run_recorded(variant, inputs, fmt=fmt, **static)
  return recorded_bytes(rec, page_size=int(inputs.batch.page_size))


def recorded_bytes(rec: timeline.Recorder, *, page_size: int) -> dict:
  """`bytes_moved`'s counts from a recording of any kernel call(s).

  For a call made under `timeline.record()` by the caller (e.g. a notebook
  that also wants the call's grid points): kv_bytes, kv_pages,
  entries_fetched (kv_pages * page_size), bytes_per_entry, read, written,
  totals, as `bytes_moved` returns them.
  """
  t = totals(launch_counts(rec))
  kv = sum(t["bytes"].get(k, 0) for k in _KV_KINDS)
  pages = t["dma_starts"].get("kv", 0)
  entries = pages * int(page_size)
  read = kv + t["bytes"].get("q", 0) + t["bytes"].get("w", 0)
  return dict(kv_bytes=kv, kv_pages=pages, entries_fetched=entries,
              bytes_per_entry=kv / entries if entries else float("nan"),
              read=read, written=t["bytes"].get("out", 0), totals=t)


def recorded_costs(rec: timeline.Recorder, p: tiling.Plan) -> dict:
  """What a recording of the call that the plan `p` models moved.

  Returns launches, grid_points, empty_launches (launches that ran no grid
  point), kv_page_dmas, bytes_per_entry (`recorded_bytes`: cache bytes the
  KV DMAs moved, scales included, per entry of the pages fetched),
  blocks_fetched by the decode launches (one per sequence per step, the
  "kv" waits), blocks_needed (`tiling.block_waste(p)`, the model) and waste
  (the fetched share beyond the needed). Raises ValueError unless the
  recording ran one launch per launch the plan makes.
  """
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


def decode_waste(variant: str, inputs, *, compression_ratio: int,
                 num_kv_pages_per_block, num_queries_per_block,
                 decode_req_batch_size: int = 4, sort_decode: bool = True,
                 k: int = 8) -> dict:
  """KV blocks the decode launches fetch for nothing: measured and modeled.

  Runs the token variant on `inputs` (its decode range) with these block
  sizes, counts the KV blocks its decode launches fetched (the "kv" waits:
  one per sequence per step, `recorded_costs`) against the blocks its
  decode sequences need (max(1, cdiv(seq_len // ratio, bkv_sz)) each,
  counted here, not from the model), and puts `tiling.block_waste` of the
  same call (`tiling.plan(..., sort_decode=)`) next to it.

  Returns {"measured": {blocks_fetched, blocks_needed, blocks_wasted,
  waste_fraction}, "model": tiling.block_waste(...)}.
  """
  static = dict(k=k, compression_ratio=compression_ratio,
                num_kv_pages_per_block=num_kv_pages_per_block,
                num_queries_per_block=num_queries_per_block,
                decode_req_batch_size=decode_req_batch_size,
                sort_decode=sort_decode)
  _, rec = run_recorded(variant, inputs, **static)
  b = inputs.batch
  p = tiling.plan(b, fmt="fp8" if inputs.fmt != "bf16" else "bf16",
                  num_heads=int(inputs.q.shape[1]),
                  num_kv_pages_per_block=num_kv_pages_per_block,
                  num_queries_per_block=num_queries_per_block,
                  decode_req_batch_size=decode_req_batch_size,
                  sort_decode=sort_decode)
  fetched = recorded_costs(rec, p)["blocks_fetched"]
  bkv_sz = p.launches[0].bkv_sz
  i = int(b.distribution[0])
  needed = sum(max(1, cdiv(int(s) // compression_ratio, bkv_sz))
               for s in np.asarray(b.seq_lens)[:i])
  return {
      "measured": dict(blocks_fetched=fetched, blocks_needed=needed,
                       blocks_wasted=fetched - needed,
                       waste_fraction=(fetched - needed) / fetched
                       if fetched else 0.0),
      "model": tiling.block_waste(p),
  }
