"""Where blocktop's time goes: `python -m streamidx.bench --ablate-select
[--only NAME ...] [--shape NAME] [--again] [--dry-run]` on a TPU
(docs/chip.md).

Each experiment times blocktop's kernel alone (`topk.blocktop.kernel_call`,
no fallback) over the score buffer f32[T, N] of one of the records'
selection points at k 512 (`SHAPE`, the decode 64 x 262,144 entries;
`--shape`: the prefill 2,048 rows), with pieces of its work left out: its
finish (the levels written out instead: the pass alone), then the pass's
work on each tile ("scan": its DMAs and waits alone) or its DMAs ("dma":
its work on whatever VMEM holds); then, the finish kept, one of its steps
(`blocktop.FINISH_ABLATIONS`: the bound's search, the marks and
compaction, the sort). Its row (`records.EXPERIMENT_FIELDS`,
variant "blocktop", a tile of 8 rows a step) is appended to the chip
records; one already recorded on the chip at that shape is skipped.
"""

from __future__ import annotations

import argparse
import datetime
import functools
from typing import Callable, Sequence

import jax.numpy as jnp

from streamidx.lab.bench import ablate, harness, record
from streamidx.lab.bench import topk as topk_bench
from streamidx.lab.bench.ablate import Experiment
from streamidx.lab.model import hardware, profiling
from streamidx.topk import blocktop

VARIANT = "blocktop"
SHAPES = {p.shape.name: p.shape for p in record.POINTS
          if p.variant is None and p.method == VARIANT and p.shape.k == 512
          and p.shape.entries == 262144}
SHAPE = "select-64x262144"
ITERATIONS = 5  # profiled calls per experiment
EXPERIMENTS: tuple[Experiment, ...] = (
    Experiment("baseline"),  # the kernel as `select` runs it
    Experiment("pass_only", ("finish",)),  # its levels written out
    Experiment("reads_only", ("finish", "scan")),  # the tiles' DMAs alone
    Experiment("scan_only", ("finish", "dma")),  # the pass's work alone
    Experiment("no_bound", ("bound",)),  # the finish without its search
    Experiment("no_compact", ("compact",)),  # ... its marks and compaction
    Experiment("no_sort", ("sort",)),  # ... its sort
)


def program(exp: Experiment, shape) -> tuple[dict, Callable]:
  """(blocks {keep, tile}, fn): `fn(x)` the kernel at `shape` less
  `exp.removed` ("finish", then `blocktop.ABLATIONS`), to jit."""
  keep, tile = blocktop.plan(shape.entries, shape.k)
  finish = "finish" not in exp.removed
  ablate = frozenset(exp.removed) - {"finish"}

  def fn(x):
    return blocktop.kernel_call(x, shape.k, keep, tile, finish=finish,
                                ablate=ablate)
  return {"keep": keep, "tile": tile}, fn


def row(exp: Experiment, blocks: dict, times: dict, *, shape, chip: str,
        device_kind: str, compile_s: float, command: str,
        iterations: int = ITERATIONS) -> dict:
  """The records' row of one measurement: the device time per call beside
  one read of the buffer at the chip's HBM bandwidth, per tile of 8 rows."""
  groups = -(-shape.rows // blocktop.SUBLANES)
  tiles = groups * -(-shape.entries // blocks["tile"])
  device_s = times["total_s"]
  hbm_bytes = shape.rows * shape.entries * 4
  hbm_s = hbm_bytes / hardware.spec(chip).device_bandwidth
  return dict(
      experiment=exp.name, removed=list(exp.removed), inputs=None,
      cache_bytes=None, blocks=blocks, chip=chip, device_kind=device_kind,
      shape=shape.name, variant=VARIANT, cache_format=None, num_heads=None,
      page_size=None, device_s=device_s,
      ops=[[o["name"], o["count"] / iterations, o["self_us"] / iterations / 1e6]
           for o in times["ops"]],
      grid_steps=groups, kv_steps=tiles, kv_step_s=device_s / tiles,
      hbm_bytes=hbm_bytes, hbm_s=hbm_s, ratio=device_s / hbm_s,
      compile_s=compile_s, repeats=iterations,
      date=datetime.datetime.now(datetime.timezone.utc).isoformat(
          timespec="seconds"), command=command, **record.versions())


def main(argv: Sequence[str]) -> int:
  names = [e.name for e in EXPERIMENTS]
  p = argparse.ArgumentParser(prog="python -m streamidx.bench --ablate-select",
                              description=__doc__.split("\n\n")[1])
  p.add_argument("--only", nargs="+", choices=names, metavar="NAME",
                 help=f"of {', '.join(names)}")
  p.add_argument("--shape", choices=sorted(SHAPES), default=SHAPE)
  p.add_argument("--again", action="store_true", help="also those recorded")
  p.add_argument("--dry-run", action="store_true")
  a = p.parse_args(argv)
  shape = SHAPES[a.shape]
  todo = [e for e in EXPERIMENTS if not a.only or e.name in a.only]
  x = functools.cache(lambda: jnp.asarray(topk_bench.score_buffer(shape)))

  def one(e, chip, device_kind, command):  # over the selection points' buffer
    blocks, fn = program(e, shape)
    info, run = harness.compile_call(fn, (x(),), {})
    times = profiling.profile(run, iterations=ITERATIONS, warmup=1)
    return row(e, blocks, times, shape=shape, chip=chip,
               device_kind=device_kind, compile_s=info["compile_s"],
               command=command)
  return ablate.run_experiments("--ablate-select", argv, todo, one,
                                shape=shape.name, variant=VARIANT,
                                again=a.again, dry_run=a.dry_run)
