"""Where the lean kernel's time goes: `python -m streamidx.bench --ablate
[--only NAME ...] [--shape NAME] [--seqs N] [--budget-s S] [--again]
[--dry-run]` on a TPU (docs/chip.md).

Each experiment times the lean kernel's scoring launches alone
(`kernels.driver.scoring`) at `SHAPE` (the records' decode 64 x 262,144;
`--shape`: another of their decode shapes; `--seqs`: its sequences
changed) with ONE change from the shipped call: pieces of its work removed
or changed (`kernels.lean.ABLATIONS`), or its KV block or decode batch
size. Its row (`records.EXPERIMENT_FIELDS`) is appended to the chip
records when measured; one already recorded on the chip at that shape is
skipped (`--records --experiments`).
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import functools
import sys
import time
from typing import Sequence

import jax
import jax.numpy as jnp

from streamidx import blocks as blocks_lib
from streamidx import cache as cache_lib
from streamidx import modes, records
from streamidx import variants as variants_lib
from streamidx.kernels import driver, entries
from streamidx.lab import shapes as shapes_lib
from streamidx.lab.bench import harness
from streamidx.lab.bench import record
from streamidx.lab.model import hardware, profiling, roofline, tiling

SHAPE = next(p.shape for p in record.POINTS if p.shape.name
             == blocks_lib.EXPERIMENT_SHAPE).with_(fmt="dense_fp8")
VARIANT = "lean"
ITERATIONS = 5  # profiled calls per experiment
SPACED_GAP_S = 0.05  # "spaced": idle seconds after each profiled call
WIDE_POOL = 4  # "wide_pool": the cache's pages, times the batch's
BALLAST_BYTES = 2 << 30  # "ballast_*": HBM held beside the cache


@dataclasses.dataclass(frozen=True)
class Experiment:
  """The shipped call less `removed` (`lean.ABLATIONS`: pieces removed, or
  changed as "page_dma", "split_launch", "big_table" and "narrow_pool"), or
  with `kv_pages` pages per KV block or `batch` sequences per decode
  program, or the shipped call with its profiled calls paced otherwise
  (`gap_s`: 0, back to back; > 0, that many seconds idle after each; None,
  each waited for, as every other row), or the shipped call over a cache of
  `pool` times the batch's pages, those past its own zeros never read, or
  with `ballast` (`BALLAST_BYTES` held in HBM, allocated "before" the
  cache's arrays or "after" them; `inputs`), or (`inline`) the same keys'
  inline FP8 cache through the `inline` variant (the lean body, one DMA a
  page)."""

  name: str
  removed: tuple[str, ...] = ()
  kv_pages: int | None = None
  batch: int | None = None
  gap_s: float | None = None  # its profiled calls paced (`profiling.capture`)
  pool: int = 1  # the cache's pages, times the batch's
  inline: bool = False  # the inline FP8 cache, the inline variant
  ballast: str | None = None  # "before" or "after" the cache's arrays

  @property
  def inputs(self) -> str | None:
    """What it runs on besides the shipped call's arguments (its rows'
    "inputs"), or None."""
    if self.pool > 1:
      return f"the cache at {self.pool} times the batch's pages"
    if self.ballast:
      return f"{BALLAST_BYTES >> 30} GiB of HBM allocated {self.ballast} the cache"
    if self.inline:
      return ("the inline FP8 cache of the same keys (cache.pair_to_inline), "
              "the inline variant's launches")
    return None


EXPERIMENTS: tuple[Experiment, ...] = (
    Experiment("baseline"),
    Experiment("no_score_write", ("score_write",)),
    Experiment("no_kv_dma", ("kv_dma",)),
    Experiment("no_scale_dma", ("scale_dma",)),
    Experiment("no_compute", ("compute",)),
    # No KV step, so one block ahead (none would wait the second).
    Experiment("no_kv_loop", ("kv_loop", "prefetch_2")),
    Experiment("kv_reads_only", ("compute", "score_write")),
    Experiment("compute_only", ("kv_dma", "score_write")),
    Experiment("block_dma", ("page_dma",)),
    # The DMA stream alone: one DMA a block, nothing computed or written.
    Experiment("block_reads_only", ("page_dma", "compute", "score_write")),
    # One block in flight, issued after this block's loads: as shipped
    # until `records.LATE_ISSUE_UNTIL`.
    Experiment("late_issue", ("early_issue", "prefetch_2")),
    # One block in flight, issued right after the wait: as shipped on the
    # v5e until `records.PREFETCH_2_UNTIL`; and its DMA stream alone.
    Experiment("one_ahead", ("prefetch_2",)),
    Experiment("one_ahead_reads_only",
               ("prefetch_2", "compute", "score_write")),
    # The launch's programs in four launches: its length apart from its work.
    Experiment("split_launch", ("split_launch",)),
    Experiment("split_launch_reads_only",
               ("split_launch", "compute", "score_write")),
    # The page table in SMEM four times its size: its rows past the
    # table's never read.
    Experiment("big_table", ("big_table",)),
    Experiment("big_table_reads_only", ("big_table", "compute", "score_write")),
    # Every page id folded into the cache's first quarter, the same DMAs
    # and bytes over a quarter of its HBM addresses: does the step follow
    # the span they touch? (No: `lean.NARROW_POOL`.)
    Experiment("narrow_pool", ("narrow_pool",)),
    Experiment("narrow_pool_reads_only",
               ("narrow_pool", "compute", "score_write")),
    # A KV block's scales in one DMA a sequence, from a copy gathered by the
    # page table before the launch: half the DMAs a step, for the gather.
    Experiment("gathered_scales", ("gathered_scales",)),
    # Each page's values and scales in one array, one DMA a page: the same
    # keys' inline FP8 cache through the `inline` variant (the lean body).
    Experiment("inline_scales", inline=True),
    # The same program, the chip kept busy (calls back to back) or left
    # idle between calls: does the step follow the chip's recent load?
    Experiment("back_to_back", gap_s=0.0),
    Experiment("spaced", gap_s=SPACED_GAP_S),
    # The same program and reads in a cache of four times the pages (64 x
    # 1M's 2.2 GB at 64 x 262,144): does the step follow the size of the
    # buffer it reads from, where `narrow_pool` ruled out the span read?
    # Yes: 0.987 ms against 0.764 (docs/chip.md).
    Experiment("wide_pool", pool=WIDE_POOL),
    # The shipped cache with 2 GiB of HBM held beside it, allocated before
    # it (the cache placed past it) or after: its place, or the memory in
    # use, apart from its size. Neither: 0.768 and 0.769 ms against 0.765.
    Experiment("ballast_before", ballast="before"),
    Experiment("ballast_after", ballast="after"),
    *(Experiment(f"kv_pages_{p}", kv_pages=p) for p in (4, 16, 32)),
    *(Experiment(f"batch_{b}", batch=b) for b in (1, 2, 8)),
    # Both at once, around the fastest of the above.
    *(Experiment(f"kv_pages_{p}_batch_{b}", kv_pages=p, batch=b)
      for p, b in ((16, 8), (32, 8), (64, 4), (16, 16))),
)


def program(exp: Experiment, args, chip: str | None, shape=SHAPE):
  """(blocks, fn, arrays): `fn(*arrays)` the experiment's scoring launches,
  to jit, at the lean entry point's positional arrays `args` (or specs)."""
  entry = variants_lib.get("inline" if exp.inline else VARIANT).kernel
  blocks = shapes_lib.table_blocks(shape, VARIANT, shape.fmt, chip).kwargs()
  if exp.kv_pages:
    blocks["num_kv_pages_per_block"] = ((exp.kv_pages,)
                                        + blocks["num_kv_pages_per_block"][1:])
  if exp.batch:
    blocks["decode_req_batch_size"] = exp.batch
  if exp.pool > 1:
    args = widened(args, shape.fmt, exp.pool)
  if exp.inline:  # the same keys' inline array (its block rows are lean's)
    args = (*args[:2], _inline(*args[2:4]), *args[4:])
  call, arrays = entry.bind(*args, **shape.kernel_kwargs(),  # any method
                            topk_method="sort", **blocks)  # needing no extra
  body = entries.INLINE if exp.inline else entries.lean_without(exp.removed)
  return blocks, functools.partial(driver.scoring, call, body), arrays


def _inline(values, scales):
  """`cache.pair_to_inline` of the pair (arrays, or `jax.ShapeDtypeStruct`s:
  its shape, the values' sharding)."""
  if isinstance(values, jax.ShapeDtypeStruct):
    p, rows, packing, lanes = values.shape
    return jax.ShapeDtypeStruct((p, rows + 1, packing, lanes), values.dtype,
                                sharding=values.sharding)
  return cache_lib.pair_to_inline(values, scales)


def widened(args, fmt: str, pool: int) -> tuple:
  """`record.entry_args`'s `args` (arrays or `jax.ShapeDtypeStruct`s) with
  the cache's arrays given `pool` times their pages, zeros past its own."""
  n = len(cache_lib.CACHE_FORMATS[fmt].arrays)

  def wide(a):
    shape = (a.shape[0] * pool, *a.shape[1:])
    if isinstance(a, jax.ShapeDtypeStruct):
      return jax.ShapeDtypeStruct(shape, a.dtype, sharding=a.sharding)
    return jnp.zeros(shape, a.dtype).at[:a.shape[0]].set(a)
  return (*args[:2], *map(wide, args[2:2 + n]), *args[2 + n:])


def inputs(exp: Experiment, shape, args):
  """(args, ballast): what `exp` runs on (`args`, the shipped call's entry
  arguments, unless it has ballast: new ones, built after `BALLAST_BYTES`
  of HBM are allocated or before) and the ballast to hold while it runs."""
  def ballast():
    return jax.block_until_ready(jnp.zeros(BALLAST_BYTES, jnp.uint8))

  def fresh():
    return jax.block_until_ready(record.entry_args(shape, VARIANT, shape.fmt))
  if exp.ballast is None:
    return args, None
  if exp.ballast == "before":
    held = ballast()
    return fresh(), held
  assert exp.ballast == "after", exp.ballast
  return fresh(), ballast()  # in that order


def measure(exp: Experiment, args, *, chip: str | None, shape=SHAPE,
            iterations: int = ITERATIONS) -> tuple[dict, dict, float]:
  """(blocks, `profiling.stage_times`, compile seconds) on this machine."""
  blocks, fn, arrays = program(exp, args, chip, shape)
  info, run = harness.compile_call(fn, arrays, {})
  times = profiling.profile(run, iterations=iterations, warmup=1,
                            gap_s=exp.gap_s)
  return blocks, times, info["compile_s"]


def row(exp: Experiment, blocks: dict, times: dict, *, chip: str,
        device_kind: str, compile_s: float, command: str, shape=SHAPE,
        iterations: int = ITERATIONS) -> dict:
  """The records' row of one measurement: the scoring part of `times`
  beside the plan's steps and its kernel stage's HBM time (`roofline`)."""
  p = tiling.plan(shape.batch(), fmt=shape.fmt, num_heads=shape.num_heads,
                  head_dim=shape.head_dim, variant=VARIANT, generation=chip,
                  **blocks)
  cost = roofline.costs(p, k=shape.k)[1]  # the kernel stage
  hbm_s = roofline.bounds([cost], hardware.spec(chip))[0].t_mem
  steps, device_s = p.counts(), times["scoring_s"]
  return dict(
      experiment=exp.name, removed=list(exp.removed), inputs=exp.inputs,
      cache_bytes=p.geometry.cache_bytes * exp.pool, blocks=blocks,
      chip=chip, device_kind=device_kind, shape=shape.name, variant=VARIANT,
      cache_format="inline_fp8" if exp.inline else shape.fmt,
      num_heads=shape.num_heads,
      page_size=shape.page_size, device_s=device_s,
      ops=[[o["name"], o["count"] / iterations, o["self_us"] / iterations / 1e6]
           for o in times["ops"] if o["stage"] == "scoring"],
      grid_steps=steps["grid_steps"], kv_steps=steps["steps"],
      kv_step_s=device_s / steps["steps"], hbm_bytes=cost.bytes, hbm_s=hbm_s,
      ratio=device_s / hbm_s, compile_s=compile_s, repeats=iterations,
      date=datetime.datetime.now(datetime.timezone.utc).isoformat(
          timespec="seconds"), command=command, **record.versions())


def main(argv: Sequence[str]) -> int:
  t0 = time.perf_counter()
  names = [e.name for e in EXPERIMENTS]
  p = argparse.ArgumentParser(prog="python -m streamidx.bench --ablate",
                              description=__doc__.split("\n\n")[1])
  p.add_argument("--only", nargs="+", choices=names, metavar="NAME",
                 help=f"of {', '.join(names)}")
  decode = {q.shape.name: q.shape.with_(fmt=SHAPE.fmt) for q in record.POINTS
            if q.shape.kind == "decode" and q.variant == VARIANT}
  p.add_argument("--shape", choices=sorted(decode), default=SHAPE.name,
                 help=f"the decode shape (default {SHAPE.name})")
  p.add_argument("--seqs", type=int, default=None,
                 help="that shape's tokens a sequence with this many "
                 "sequences (dsv4-decode-SEQSxTOKENS): the launch's length "
                 "and footprint apart from its KV steps a program")
  p.add_argument("--again", action="store_true", help="also those recorded")
  p.add_argument("--budget-s", type=float, default=None,
                 help="start none after this many seconds")
  p.add_argument("--dry-run", action="store_true")
  a = p.parse_args(argv)
  todo = [e for e in EXPERIMENTS if not a.only or e.name in a.only]
  shape = decode[a.shape]
  if a.seqs is not None:
    if a.seqs < 1:
      p.error(f"--seqs: must be >= 1 (got {a.seqs})")
    shape = record.decode_shape(a.seqs, shape.seq_len, shape.k,
                                fmt=shape.fmt)
  args = functools.cache(lambda: record.entry_args(shape, VARIANT, shape.fmt))

  def one(e, chip, device_kind, command):
    run_args, ballast = inputs(e, shape, args())
    blocks, times, compile_s = measure(e, run_args, chip=chip, shape=shape)
    del run_args, ballast
    return row(e, blocks, times, chip=chip, device_kind=device_kind,
               compile_s=compile_s, command=command, shape=shape)
  return run_experiments("--ablate", argv, todo, one, shape=shape.name,
                         variant=VARIANT, again=a.again, dry_run=a.dry_run,
                         budget_s=a.budget_s, t0=t0)


def run_experiments(flag: str, argv, todo, one, *, shape: str, variant: str,
                    again: bool, dry_run: bool, budget_s: float | None = None,
                    t0: float | None = None) -> int:
  """What `python -m streamidx.bench FLAG` does with its experiments `todo`
  at `shape` (`ablate_select`'s too): those of `variant` recorded on this
  chip there left out (unless `again`); with `dry_run`, their names; off a
  TPU nothing (2); else each measured, `one(exp, chip, device_kind,
  command)` its row, appended to the records and printed (none started
  `budget_s` after `t0`); 1 where one failed."""
  t0 = time.perf_counter() if t0 is None else t0
  dev = jax.devices()[0]
  chip = modes.device_generation(dev)
  if not again:
    done = {r["experiment"] for r in records.chip_rows(
        "experiments", chip=chip, shape=shape, variant=variant)}
    todo = [e for e in todo if e.name not in done]
  if dry_run:
    print("\n".join(e.name for e in todo))
    return 0
  if chip is None:
    print(f"{flag} measures on a TPU: this process's device is "
          f"{dev.device_kind}; nothing was run", file=sys.stderr)
    return 2
  command = " ".join([f"python -m streamidx.bench {flag}", *argv])
  bad = 0
  for e in todo:
    if budget_s is not None and time.perf_counter() - t0 > budget_s:
      print(f"--budget-s spent: {e.name} and after not started", flush=True)
      break
    try:
      r = one(e, chip, dev.device_kind, command)
      records.append_chip(experiments=[r])
    except Exception as ex:  # pylint: disable=broad-except
      print(f"{e.name}: FAILED {type(ex).__name__}: {str(ex)[:400]}",
            file=sys.stderr, flush=True)
      bad += 1
      continue
    print(f"{e.name}: {r['device_s'] * 1e3:.3f} ms, {r['ratio']:.2f}x HBM, "
          f"compile {r['compile_s']:.1f} s ({time.perf_counter() - t0:.0f} s)",
          flush=True)
  return 1 if bad else 0
