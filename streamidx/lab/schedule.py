"""The static schedule of the compiled kernel: bundles per KV-loop iteration.

`launch_schedules` compiles each launch alone with libtpu's schedule dumps on
and parses them (`streamidx.lab.dump`); `kv_loop` finds the KV loop (the
innermost with MXU ops): bundles per iteration and per KV page, the binding
slot, spills and source lines (docs/tpu.md, "How `streamidx.lab.schedule`
reads the schedule"). A lower bound on a page's compute, not a run time.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import functools
import glob
import os
import re
import sys
import tempfile
from typing import Sequence

import jax

from streamidx import modes
from streamidx import variants as variants_lib
from streamidx.kernels import driver, entries
from streamidx.lab import aot
from streamidx.lab import dump, worker
from streamidx.lab import shapes as shapes_lib
from streamidx.lab.dump import (HBM_FLAGS, Bundle, find_loops, parse_bundles,
                                parse_utilization)
from streamidx.lab.model import tiling
from streamidx.lab.model.roofline import LaunchProgram, page_bounds

@dataclasses.dataclass(frozen=True)
class KvLoop:
  """The KV loop of one launch, as scheduled."""

  bundles: int  # per iteration (one KV block of every sequence of a program)
  pages_per_iteration: int  # seq_batch_size * bkv_p
  slot_use: dict  # slot -> ops issued per iteration
  capacity: dict  # slot -> ops per bundle
  spill_ops: int  # VSTORE:SPILL + VLOAD:FILL ops per iteration
  top_lines: tuple  # ((line, bundles), ...) of the kernel file, most first
  # Bundles from the loop's top to its first HBM -> VMEM DMA start (the next
  # block's prefetch), and the share of its MXU ops issued before that;
  # None: no DMA starts in the loop.
  dma_issue: int | None = None
  mxu_before_issue: float | None = None

  bundles_per_page = property(
      lambda self: self.bundles / self.pages_per_iteration)

  @property
  def binding_slot(self) -> tuple[str, float]:
    """(slot, its ops / (capacity x bundles)): the busiest slot."""
    rates = {s: self.slot_use[s] / (self.capacity[s] * self.bundles)
             for s in self.slot_use if self.capacity.get(s)}
    s = max(rates, key=rates.get)
    return s, rates[s]


def kv_loop(bundles: Sequence[Bundle], utilization, *, pages_per_iteration: int,
            kernel_file: str = "vendored.py", top: int = 5) -> KvLoop:
  """The innermost loop with MXU ops, with its slot use and source lines."""
  names, capacity, rows = utilization
  mxu = names.index("MXU")
  loops = find_loops(bundles)
  with_mxu = [l for l in loops
              if any(rows[a][mxu] for a in range(l.start, l.end + 1)
                     if a < len(rows))]
  if not with_mxu:
    raise ValueError("no loop with MXU ops in this schedule")
  inner = min(with_mxu, key=lambda l: l.bundles)
  use, lines = collections.Counter(), collections.Counter()
  by_addr = {b.addr: b for b in bundles}
  for a in range(inner.start, inner.end + 1):
    use.update(dict(zip(names, rows[a])))
    if a in by_addr:
      lines.update(line for _, line in by_addr[a].source_lines(kernel_file))
  spill = use.get("VSTORE:SPILL", 0) + use.get("VLOAD:FILL", 0)
  issue = next((a - inner.start for a in range(inner.start, inner.end + 1)
                if a in by_addr and "dma.hbm_to_vmem" in by_addr[a].ops), None)
  before = None
  if issue is not None and use.get("MXU"):
    before = sum(rows[a][mxu] for a in range(inner.start, inner.start + issue)
                 if a < len(rows)) / use["MXU"]
  return KvLoop(inner.bundles, pages_per_iteration, dict(use),
                dict(zip(names, capacity)), spill,
                tuple(lines.most_common(top)), issue, before)


def launch_program(comps: dict, kernel: str) -> LaunchProgram:
  """`LaunchProgram` of a launch module (`dump.read_modules`'s computations;
  `kernel` its Pallas program's name): each dynamic loop at 0, then 1 trip."""
  dyn = sorted((l for l in comps[kernel].loops if l.trips is None),
               key=lambda l: l.depth)
  if not 2 <= len(dyn) <= 3 or any(
      not a.contains(b.start) for a, b in zip(dyn, dyn[1:])):
    raise ValueError(f"{kernel}: expected 2 or 3 nested dynamic loops (grid, "
                     f"[query blocks,] KV), found {[(l.start, l.depth) for l in dyn]}")

  def count(ones):
    trips = {(kernel, l.start): int(i < ones) for i, l in enumerate(dyn)}
    return dump.executed(comps, trips=trips).total

  e = [count(i) for i in range(len(dyn) + 1)]
  calls = dump.executed(comps, trips={(kernel, l.start): 0 for l in dyn}).by_call
  return LaunchProgram(e[0], tuple(b - a for a, b in zip(e, e[1:])),
                       tuple((c[0], c[2]) for c in calls if c[0] != kernel))


@dataclasses.dataclass(frozen=True)
class LaunchSchedule:
  """The static schedule of one launch of a variant on one generation."""

  variant: str
  generation: str
  fmt: str
  shape: str
  launch: str  # its scope name, e.g. "StreamIdxTC-d-bq_1-bkvp_2"
  case: str  # "decode", "decode_rest", "prefill", "mixed" or "page"
  seq_batch_size: int
  bkv_p: int
  bq_sz: int
  page_size: int
  total_bundles: int
  kv: KvLoop | None
  error: str = ""
  program: LaunchProgram | None = None  # the whole launch module


def _launch_calls(variant, shape, fmt, blocks, target, ablate):
  """`aot.launch_calls`; with `ablate` (lean's pieces removed,
  `entries.lean_without`), the scoring launches of that body."""
  if not ablate:
    return aot.launch_calls(variant, shape, fmt, blocks, target)
  call, arrays = variants_lib.get(variant).kernel.bind(
      *aot.entry_args(variant, shape, fmt, target),
      **aot.entry_static(variant, shape, blocks))
  fn = functools.partial(driver.scoring, call, entries.lean_without(ablate))
  return [(eqn.params.get("name") or "pallas_call", eqn)
          for eqn in tiling.pallas_calls(jax.make_jaxpr(fn)(*arrays).jaxpr)]


def _worker(spec: dict) -> list[dict]:
  """In the child: compile every launch alone (libtpu dumps to the directory
  LIBTPU_INIT_ARGS names); one record per launch."""
  shape = shapes_lib.CallShape(**spec["shape"])
  out = []
  with modes.compile_for(spec["generation"]) as target:
    for j, blocks in enumerate(spec["blocks"]):
      blocks = {k: tuple(v) if isinstance(v, list) else v
                for k, v in blocks.items()}
      calls = _launch_calls(spec["variant"], shape, spec["fmt"], blocks,
                            target, spec.get("ablate", ()))
      for i, (name, eqn) in enumerate(calls):
        case, _, _ = tiling.launch_case(name)
        n = eqn.params["grid_mapping"].num_scratch_operands
        batch = int(eqn.params["jaxpr"].invars[-n].aval.shape[1])  # bkv_x2
        if case == "decode" and batch == 1:
          case = "decode_rest"
        if spec["launches"] and case not in spec["launches"]:
          continue
        tag = f"sidx_b{j}_l{i}"
        rec = dict(blocks=j, index=i, name=name, case=case, tag=tag,
                   seq_batch_size=batch, error="")
        try:
          aot.compile_launch(eqn, target, name=tag)
        except Exception as e:  # pylint: disable=broad-except
          rec["error"] = aot.summarize_error(e)
        out.append(rec)
  return out


def launch_schedules(variant: str, generation: str, fmt: str,
                     shape: str | shapes_lib.CallShape, blocks, *,
                     launches: Sequence[str] = (),
                     ablate: Sequence[str] = (),
                     dump_dir: str | None = None,
                     timeout: float = 900.0) -> list[LaunchSchedule]:
  """Compiles each launch of `variant` alone for `generation` (`shape`: an
  `aot.SHAPES` name or a `CallShape`; `blocks`: block-size keywords or a
  list of them, one child process for all) and reads its static schedule;
  `launches`: only these cases; `ablate`: lean's pieces removed
  (`kernels.lean.ABLATIONS`), its scoring launches only."""
  if ablate and variant != "lean":
    raise ValueError(f"ablate: the lean variant's only (got {variant!r})")
  shp = aot.SHAPES_BY_NAME[shape] if isinstance(shape, str) else shape
  block_sets = [blocks] if isinstance(blocks, dict) else list(blocks)
  spec = dict(variant=variant, generation=generation, fmt=fmt,
              shape=dataclasses.asdict(shp),
              blocks=block_sets, launches=list(launches), ablate=list(ablate))
  with tempfile.TemporaryDirectory(prefix="sidx-sched-") as tmp:
    out_dir = dump_dir or tmp
    records = dump.run_worker("streamidx.lab.schedule", spec,
                              dump_dir=out_dir, timeout=timeout)
    files = sorted(glob.glob(os.path.join(out_dir, "*")))
    kernel_file = variants_lib.get(variant).module.rsplit(".", 1)[-1] + ".py"
    modules = dump.read_modules(out_dir)
    out = []
    for rec in records:
      _, bq, bkv_p = tiling.launch_case(rec["name"])
      bundles, kv, err, prog = [], None, rec["error"], None  # err: the compile failed
      if not err:
        tag = re.escape(rec["tag"])
        found = [[f for f in files if re.search(rf"-{tag}\.\d+-\d+-final_{kind}\.txt$", f)]
                 for kind in ("bundles", "hlo-static-per-bundle-utilization")]
        if not all(found):
          raise RuntimeError(f"no schedule dump for {rec['name']} in {out_dir}")
        with open(found[0][0]) as fb, open(found[1][0]) as fu:
          bundles, util = parse_bundles(fb.read()), parse_utilization(fu.read())
        try:
          kv = kv_loop(bundles, util, kernel_file=kernel_file,
                       pages_per_iteration=rec["seq_batch_size"] * bkv_p)
        except ValueError as e:
          err = str(e)
        mod = [m for m, _, _ in modules
               if any(re.match(rf"{tag}(\.\d+)?$", n) for n in m)]
        if len(mod) == 1:
          name = next(n for n in mod[0] if re.match(rf"{tag}(\.\d+)?$", n))
          prog = launch_program(mod[0], name)
      out.append(LaunchSchedule(
          variant, generation, fmt, shp.name, rec["name"], rec["case"],
          rec["seq_batch_size"], bkv_p, bq, shp.page_size, len(bundles), kv, err,
          prog))
    return out


def schedule_table(schedules: Sequence[LaunchSchedule]) -> list[dict]:
  """One row per launch: bundles per iteration / per page, binding slot...,
  "module": the whole launch module's (`LaunchProgram`)."""
  rows = []
  for s in schedules:
    row = dict(variant=s.variant, generation=s.generation, fmt=s.fmt,
               launch=s.case, B=s.seq_batch_size, bq=s.bq_sz, bkv_p=s.bkv_p,
               total_bundles=s.total_bundles)
    if s.kv is None:
      row.update(kv_bundles=None, bundles_per_page=None, binding=s.error)
    else:
      slot, rate = s.kv.binding_slot
      row.update(kv_bundles=s.kv.bundles,
                 bundles_per_page=round(s.kv.bundles_per_page, 1),
                 binding=f"{slot} {rate:.0%}", spill_ops=s.kv.spill_ops,
                dma_issue=(None if s.kv.dma_issue is None else
                           f"{s.kv.dma_issue}/{s.kv.bundles} "
                           f"({s.kv.mxu_before_issue:.0%} of MXU before)"),
                 top_lines=", ".join(f"{l}:{n}" for l, n in s.kv.top_lines[:3]))
    if s.program is not None:  # the whole module: once, per program[, per bq], per KV step
      row["module"] = "/".join(map(str, (s.program.outside,) + s.program.levels))
    rows.append(row)
  return rows


def main(argv=None) -> int:
  if worker.serve(argv, _worker):
    return 0
  p = argparse.ArgumentParser(
      prog="python -m streamidx.lab.schedule",
      description="Static schedule (bundles per KV page) of each launch.")
  p.add_argument("--variant", default="vendored")
  p.add_argument("--generations", nargs="+", default=["v5e", "v6e"])
  p.add_argument("--formats", nargs="+", default=["fp8"])
  p.add_argument("--shape", default="dsv4-decode-4k")
  p.add_argument("--seqs", type=int, default=None,
                 help="the decode shape at this many sequences")
  p.add_argument("--tokens", type=int, default=None,
                 help="the decode shape at this many tokens of cache a "
                 "sequence")
  p.add_argument("--kv-pages", nargs="+", type=int, default=None,
                 help="decode num_kv_pages_per_block values (token mode)")
  p.add_argument("--launches", nargs="+", default=(),
                 help="only these launches (decode, decode_rest, prefill, "
                 "mixed, page)")
  p.add_argument("--ablate", nargs="+", default=(), metavar="PIECE",
                 help="lean only: these pieces removed (kernels.lean.ABLATIONS"
                 ", as `python -m streamidx.bench --ablate` runs them)")
  a = p.parse_args(argv)

  shape = aot.SHAPES_BY_NAME[a.shape]
  if a.seqs is not None or a.tokens is not None:
    try:
      shape = shapes_lib.resized(shape, a.seqs, a.tokens)
    except ValueError as e:
      p.error(str(e))
  print(f"# operands in HBM ({HBM_FLAGS}); bundles per KV page of the final "
        "bundle dump", flush=True)
  for gen in a.generations:
    for fmt in a.formats:
      base = shapes_lib.table_blocks(shape, a.variant, fmt, gen).kwargs()
      sets = [base]
      if a.kv_pages:
        sets = [dict(base, num_kv_pages_per_block=(p,) + tuple(
            base["num_kv_pages_per_block"][1:])) for p in a.kv_pages]
      scheds = launch_schedules(a.variant, gen, fmt, shape, sets,
                                launches=a.launches, ablate=a.ablate)
      for row, s_ in zip(schedule_table(scheds), scheds):
        bound = page_bounds([s_])
        row["verdict"] = bound[0].verdict if bound else ""
        print("  ".join(f"{k}={v}" for k, v in row.items()), flush=True)
  return 0


if __name__ == "__main__":
  sys.exit(main())
