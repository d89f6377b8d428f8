"""libtpu's final bundle dump of a compiled program: bundles, loops, trip
counts, and the count of bundles a whole compiled module executes.

`compile_dumps` compiles programs for a TPU generation in a child process
with the dump flags on; `read_module` parses every TensorCore computation
of the dump (`*-final_bundles.txt`); `executed` counts the bundles the
module issues: each once per trip of every loop around it, each
`inlined_call` as its callee's count, trip counts read from the dump
(`trip_count`) or, dynamic, given. SparseCore calls have no bundles in the
dump (`ModuleCount.sparsecore` lists their bytes). Bundles are issue
slots, not time (docs/tpu.md, "The whole program's count").
"""

from __future__ import annotations

import dataclasses
import functools
import glob
import importlib
import math
import os
import re
import sys
from typing import Mapping, Sequence

from streamidx.lab import worker

DUMP_FLAGS = ("--xla_jf_dump_llo_text=true "
              "--xla_jf_dump_llo_pass_label_regex=final "
              "--xla_mosaic_enable_llo_source_annotations=true")
# Every operand in HBM, as in a real step (docs/tpu.md says why).
HBM_FLAGS = ("--xla_gf_vmem_memory_space_assignment=false "
             "--xla_vf_vmem_memory_space_assignment=false")
DELAY_SLOTS = 4  # bundles after a taken branch that still issue

_LINE = re.compile(
    r"^\s*(0x[0-9a-f]+|\d+)\s+(?:(L[BHE]|PB|PF|CT))?\s*:\s*(>*)\s*\{(.*)\}(.*)$")
_START = re.compile(r"Start region (\d+)")
_BRANCH = re.compile(r"sbr\.rel\s*\((!?)(%p[\w]+)\)[^;]*?target = \$region(\d+)")
_LOC = re.compile(r'loc\("([^"]+)":(\d+):')
_CALL = re.compile(r"inlined_call[^;]*?/\*\s*(?:%([\w.\-]+) = |(<[\w\-]+>))")
_DEF = re.compile(r"(%[svp]\w+) = ([\w.]+)\s*(.*)")
_INT = re.compile(r"^-?\d+$")


@dataclasses.dataclass(frozen=True)
class Bundle:
  """One scheduled bundle of the final program."""

  addr: int
  label: str  # "LB", "LH", "LE", "PB", "PF", "CT" or ""
  ops: str  # the text between the braces
  comment: str  # the text after them ("Start region N", ...)
  depth: int = 0  # loops around it, as the dump marks them (">", ">>")

  starts = property(lambda self: tuple(
      int(x) for x in _START.findall(self.comment)))

  @property
  def branch(self) -> tuple[str, bool, int] | None:
    """(predicate, negated, target region) of its branch, or None."""
    m = _BRANCH.search(self.ops)
    return (m.group(2), m.group(1) == "!", int(m.group(3))) if m else None

  @property
  def call(self) -> str | None:
    """The HLO instruction (or "<late-initialization>"...) it calls inline."""
    m = _CALL.search(self.ops)
    return (m.group(1) or m.group(2)) if m else None

  def source_lines(self, file_suffix: str = "") -> set[tuple[str, int]]:
    return {(f, int(l)) for f, l in _LOC.findall(self.ops)
            if f.endswith(file_suffix)}


_OPEN = re.compile(r"^\s*(0x[0-9a-f]+|\d+)\s+(?:L[BHE]|PB|PF|CT)?\s*:\s*>*\s*\{")


def parse_bundles(text: str) -> list[Bundle]:
  """The bundles of a `*-final_bundles.txt` dump, in address order (a
  bundle whose comment spans lines, e.g. a bounds check quoting its HLO,
  joined into one)."""
  out, pending = [], ""
  for line in text.splitlines():
    if _OPEN.match(line):
      pending = line
    elif pending:
      pending += " " + line.strip()
    else:
      continue
    m = _LINE.match(pending)
    if m:
      out.append(Bundle(int(m.group(1), 0), m.group(2) or "", m.group(4),
                        m.group(5), len(m.group(3))))
      pending = ""
  return out


def parse_utilization(text: str):
  """(slot names, capacities, one row of per-slot op counts per bundle)."""
  lines = [l.strip() for l in text.splitlines()]
  # (libtpu spells it CAPACTIY)
  i = next(i for i, l in enumerate(lines) if l in ("== CAPACTIY:",
                                                   "== CAPACITY:"))
  names = tuple(x.strip() for x in lines[i + 1].split(","))
  capacity = tuple(int(x) for x in lines[i + 2].split())
  j = lines.index("== UTILIZATION:")
  rows = [tuple(int(x) for x in l.split()) for l in lines[j + 1:] if l]
  return names, capacity, rows


@dataclasses.dataclass(frozen=True)
class Loop:
  """A loop of the schedule: bundles [start, end] (end: the last delay slot),
  its back branch at `branch`; `trips`: iterations read from the dump, None
  where the bound is a register (a dynamic trip count)."""

  start: int
  end: int
  region: int
  branch: int = -1
  trips: int | None = None
  depth: int = 1

  bundles = property(lambda self: self.end - self.start + 1)

  def contains(self, addr: int) -> bool:
    return self.start <= addr <= self.end


_PRED = re.compile(r"^\(!?%p\w+\),?\s*")  # an op's predicate: "(%p3_p1), "
_SPILL = re.compile(r"sst \[smem:\[(#allocation\d+_spill)\]\]\s+(%s\w+)")


def _defs(bundles: Sequence[Bundle]) -> dict[str, tuple[str, list[str], int]]:
  """SSA name -> (opcode, operands, address) of every scalar op (without
  its predicate). A reload of a spilled value (`sld` of a spill slot) reads
  as the value stored there (a loop index the compiler spilled)."""
  out, spilled = {}, {}
  for b in bundles:
    for op in b.ops.split(";;"):
      st = _SPILL.search(op)
      if st:
        spilled.setdefault(st.group(1), st.group(2))
      m = _DEF.search(op.strip())
      if not m:
        continue
      args = _PRED.sub("", re.sub(r"/\*.*?\*/", "", m.group(3)).strip())
      args = [a.strip() for a in args.replace("(", " ").replace(")", " ")
              .split(",") if a.strip()]
      out.setdefault(m.group(1), (m.group(2), args, b.addr))
  for name, (op, args, addr) in list(out.items()):
    slot = re.search(r"(#allocation\d+_spill)", " ".join(args))
    if op == "sld" and slot and slot.group(1) in spilled:
      out[name] = ("smov", [spilled[slot.group(1)]], addr)
  return out


def _u32(x: int) -> int:
  return x - 2**32 if x >= 2**31 else x


def _const(name: str, defs) -> int | None:
  """An operand's value when it is a literal or a materialized constant."""
  if _INT.match(name):
    return _u32(int(name))
  d = defs.get(name)
  if d and d[0] == "smov" and len(d[1]) == 1 and _INT.match(d[1][0]):
    return _u32(int(d[1][0]))
  return None


_CMP = re.compile(r"scmp\.(lt|le|gt|ge|ne|eq)\.s32")


def trip_count(bundles: Sequence[Bundle], loop: Loop, defs=None) -> int | None:
  """Iterations of `loop`, read from the compare that decides its back
  branch: the iteration index `next = index + step` against a constant C,
  the index starting at `init` (its phi's constant, else 0): ceil((C - init)
  / step) (+1 for <= and >). None: the bound is not a constant (dynamic)
  or no such compare feeds the branch."""
  defs = _defs(bundles) if defs is None else defs
  b = next(x for x in bundles if x.addr == loop.branch)
  pred, _, _ = b.branch
  seen, todo = set(), [pred]
  while todo:
    name = todo.pop(0)
    if name in seen or name not in defs:
      continue
    seen.add(name)
    op, args, _ = defs[name]
    m = _CMP.match(op)
    if m and len(args) == 2:
      c = _const(args[1], defs)
      inc = defs.get(args[0])
      while inc and inc[0] == "smov" and inc[1] and inc[1][0] in defs:
        inc = defs[inc[1][0]]  # a copy (or a spilled value's reload)
      if inc and inc[0] == "sadd.s32" and len(inc[1]) == 2:
        step = _const(inc[1][0], defs)
        index = inc[1][1]
        if step is None:
          step, index = _const(inc[1][1], defs), inc[1][0]
        if step:
          if c is None:
            return None  # a register bound: dynamic
          init = 0
          phi = defs.get(index)
          if phi and phi[0] == "sphi" and phi[1]:
            init = _const(phi[1][0], defs)
            init = 0 if init is None else init
          extra = 1 if m.group(1) in ("le", "gt") else 0
          return max(0, math.ceil((c - init + extra) / step))
    todo.extend(a for a in args if a.startswith("%"))
  return None


def find_loops(bundles: Sequence[Bundle]) -> list[Loop]:
  """Every loop: an "LB:" bundle starting region N up to the branch back to
  N plus its delay slots; its trip count read from the dump."""
  last = max((b.addr for b in bundles), default=-1)
  defs = _defs(bundles)
  loops = []
  for b in bundles:
    if b.label != "LB":
      continue
    for region in b.starts:
      back = [c.addr for c in bundles
              if c.addr >= b.addr and (c.branch or (0, 0, None))[2] == region]
      if back:
        loop = Loop(b.addr, min(max(back) + DELAY_SLOTS, last), region,
                    max(back), None, max(b.depth, 1))
        loops.append(dataclasses.replace(
            loop, trips=trip_count(bundles, loop, defs)))
        break
  return loops


@dataclasses.dataclass(frozen=True)
class Computation:
  """One TensorCore computation of the dump: its bundles and loops."""

  name: str  # "TLP", an HLO instruction ("sort.3") or a kernel's name
  bundles: tuple
  loops: tuple

  def multiplicity(self, addr: int, trips: Mapping[int, int]) -> int:
    """How often the bundle at `addr` issues per run (`trips`: loop start
    -> trips)."""
    return math.prod(trips[l.start] for l in self.loops if l.contains(addr))


def read_computation(path: str) -> Computation:
  with open(path, encoding="utf-8") as f:
    bundles = tuple(parse_bundles(f.read()))
  name = re.sub(r"^\d+-(.*)-\d+-final_bundles\.txt$", r"\1",
                os.path.basename(path))
  return Computation(name, bundles, tuple(find_loops(bundles)))


@dataclasses.dataclass(frozen=True)
class Conditional:
  """An HLO conditional: the instructions each branch computation runs."""

  name: str
  branches: tuple  # (frozenset of instruction names, ...) by branch index


@dataclasses.dataclass(frozen=True)
class SparseCoreCall:
  """An async call on the SparseCore thread: its shape and bytes."""

  name: str
  shape: str
  bytes_out: int


_COMP = re.compile(r"^(?:ENTRY )?%([\w.\-]+) \(")
_INSTR = re.compile(r"^\s+(?:ROOT )?%([\w.\-]+) = (.*)$")
_REFS = re.compile(r"(?:calls|to_apply|body|condition)=%([\w.\-]+)")
_BRANCHES = re.compile(r"branch_computations=\{([^}]*)\}")
_SHAPE = re.compile(r"(pred|[subf]\d+|bf16)\[([\d,]*)\]")
DTYPE_BYTES = {"pred": 1, "s8": 1, "u8": 1, "f8e4m3fn": 1, "f8e5m2": 1,
               "bf16": 2, "f16": 2, "s16": 2, "u16": 2, "f32": 4, "s32": 4,
               "u32": 4, "f64": 8, "s64": 8, "u64": 8}


def array_bytes(dtype: str, dims: str) -> int:
  """Bytes of an HLO array type, e.g. ("f32", "64,2048")."""
  return math.prod(int(d) for d in dims.split(",") if d) * DTYPE_BYTES.get(dtype, 4)


def read_hlo(text: str) -> tuple[list[Conditional], list[SparseCoreCall]]:
  """The conditionals and SparseCore calls of a `*-TLP-hlo.txt` dump."""
  comps, refs, conds, sc = {}, {}, [], []
  cur = None
  for line in text.splitlines():
    m = _COMP.match(line)
    if m:
      cur = m.group(1)
      comps[cur], refs[cur] = set(), set()
      continue
    m = _INSTR.match(line)
    if not (m and cur):
      continue
    name, rest = m.group(1), m.group(2)
    comps[cur].add(name)
    refs[cur].update(_REFS.findall(rest))
    br = _BRANCHES.search(rest)
    if br and " conditional(" in rest:
      conds.append((name, [x.strip().lstrip("%") for x in br.group(1).split(",")]))
      refs[cur].update(x for _, bs in conds[-1:] for x in bs)
    if 'async_execution_thread="sparsecore"' in rest and " call-start(" in rest:
      out = rest.split(" call-start(")[0]
      sizes = [(array_bytes(dt, dims), f"{dt}[{dims}]")
               for dt, dims in _SHAPE.findall(out)]
      size, shape = max(sizes) if sizes else (0, "")
      sc.append(SparseCoreCall(name, shape, int(size)))

  def closure(c, seen=None):
    seen = set() if seen is None else seen
    if c in seen or c not in comps:
      return set()
    seen.add(c)
    out = set(comps[c])
    for r in refs[c]:
      out |= closure(r, seen)
    return out

  return ([Conditional(n, tuple(frozenset(closure(b)) for b in bs))
           for n, bs in conds], sc)


@dataclasses.dataclass(frozen=True)
class ModuleCount:
  """Bundles one run of a compiled module issues on its TensorCore."""

  total: int  # every computation reached from the top level, loops by trips
  by_call: tuple  # (callee, calls, bundles per call, bundles) per callee
  loops: tuple  # (computation, start, bundles per iteration, trips, runs)
  conditionals: tuple  # how each was counted
  sparsecore: tuple  # its SparseCore calls (no bundles; a skipped branch's out)
  dynamic: tuple = ()  # loops whose trip count the caller supplied


def executed(comps: Mapping[str, Computation], *, root: str = "TLP",
             conditionals: Sequence[Conditional] = (),
             taken: Mapping[str, int] | None = None,
             trips: Mapping[tuple[str, int], int] | None = None,
             sparsecore: Sequence[SparseCoreCall] = ()) -> ModuleCount:
  """The bundles the module issues from `root` (`comps`: name ->
  Computation). `trips`: (computation, loop start) -> trips of the loops
  the dump does not bound (ValueError naming them otherwise; a loop whose
  every call is into a branch not taken does not run: 0 trips); `taken`:
  conditional -> the branch that runs (default: every branch, a bound)."""
  taken = dict(taken or {})
  trips = dict(trips or {})
  for name in taken:
    if name not in {c.name for c in conditionals}:
      raise ValueError(f"taken: no conditional {name!r} in this module")
  skip, notes = set(), []
  for c in conditionals:
    if c.name in taken:
      i = taken[c.name]
      if not 0 <= i < len(c.branches):
        raise ValueError(f"taken[{c.name!r}]: must be a branch index in "
                         f"[0, {len(c.branches)}) (got {i!r})")
      others = set().union(*(b for j, b in enumerate(c.branches) if j != i))
      skip |= others - c.branches[i]
      notes.append((c.name, f"branch {i} (the one that runs)"))
    else:
      notes.append((c.name, "every branch (upper bound)"))
  calls, loops, dynamic, missing = {}, [], [], []

  def count(name: str, runs: int, stack=()) -> int:
    comp = comps[name]
    t = {}
    for l in comp.loops:
      n = l.trips if l.trips is not None else trips.get((name, l.start))
      inside = {b.call for b in comp.bundles if b.call and l.contains(b.addr)}
      if l.trips is None and inside and inside <= skip:
        n = 0  # every call it makes is a branch's that does not run
        notes.append((f"{name} loop at {l.start:#x}", "in a branch not taken"))
      elif n is None:
        missing.append(f"{name} loop at {l.start:#x}")
        n = 0
      elif l.trips is None:
        dynamic.append((name, l.start, n))
      t[l.start] = n
    total = 0
    for b in comp.bundles:
      mult = comp.multiplicity(b.addr, t)
      total += mult
      callee = b.call
      if callee and callee not in skip:
        key = callee if callee in comps else None
        if key is not None and key not in stack:
          sub = count(key, runs * mult, stack + (name,))
          c = calls.setdefault(key, [0, sub])
          c[0] += mult * runs
          total += mult * sub
    for l in comp.loops:
      loops.append((name, l.start, l.bundles, t[l.start],
                    runs * comp.multiplicity(l.start, t) // max(t[l.start], 1)))
    return total

  total = count(root, 1)
  if missing:
    raise ValueError("trips: no trip count for the dynamic loop(s) "
                     + ", ".join(missing) + " (pass trips={(computation, "
                     "start): n})")
  return ModuleCount(
      total=total,
      by_call=tuple(sorted(((k, v[0], v[1], v[0] * v[1]) for k, v in calls.items()),
                           key=lambda r: -r[3])),
      loops=tuple(loops), conditionals=tuple(notes),
      sparsecore=tuple(dataclasses.astuple(s) for s in sparsecore
                       if s.name not in skip),
      dynamic=tuple(dynamic))


def read_modules(dump_dir: str) -> list[tuple[dict, list, list]]:
  """[(name -> Computation, conditionals, SparseCore calls)] of each module
  dumped in `dump_dir`, in compile order: a module's files carry ids from
  its top-level program's ("TLP") up to the next module's."""
  paths = [p for p in glob.glob(os.path.join(dump_dir, "*-final_bundles.txt"))
           if "schedule-analysis" not in p]
  key = lambda p: int(os.path.basename(p).split("-", 1)[0])
  paths.sort(key=key)
  starts = sorted(key(p) for p in paths if re.search(r"-TLP-\d+-final", p))
  out = []
  for i, first in enumerate(starts):
    last = starts[i + 1] if i + 1 < len(starts) else None
    comps = {}
    for p in paths:
      if key(p) >= first and (last is None or key(p) < last):
        c = read_computation(p)
        comps[c.name] = c
    conds, sc = [], []
    hlo = glob.glob(os.path.join(dump_dir, f"{first}-TLP-hlo.txt"))
    if hlo:
      with open(hlo[0], encoding="utf-8") as f:
        conds, sc = read_hlo(f.read())
    out.append((comps, conds, sc))
  return out


def read_module(dump_dir: str) -> tuple[dict, list, list]:
  """(name -> Computation, conditionals, SparseCore calls) of the one module
  dumped in `dump_dir` (ValueError if it holds more)."""
  mods = read_modules(dump_dir)
  if len(mods) != 1:
    raise ValueError(f"dump_dir: must hold one module (found {len(mods)} "
                     f"in {dump_dir})")
  return mods[0]


# ---------------------------------------------------------------------------
# Compiling in a child process (libtpu reads its dump flags once per process).


def _worker(specs: list) -> int:
  """In the child: compile each spec's `fn` (module:attr, called with the
  static `kwargs`) at its `args` ([shape, dtype] each) for its
  `generation`, in order (one module each in the dump); how many."""
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  from streamidx import modes  # pylint: disable=g-import-not-at-top
  for spec in specs:
    mod, _, attr = spec["fn"].partition(":")
    fn = functools.reduce(getattr, attr.split("."),
                          importlib.import_module(mod))
    fn = functools.partial(fn, **spec.get("kwargs", {}))
    with modes.compile_for(spec["generation"]) as target:
      args = [target.spec(tuple(s), jnp.dtype(d)) for s, d in spec["args"]]
      jax.jit(fn).lower(*args).compile()
  return len(specs)


def compile_dumps(programs: Sequence[dict], *, dump_dir: str) -> None:
  """Compiles each program ({"generation", "fn": "module:attr" of a function of
  arrays, "kwargs": its static keywords, "args": [(shape, dtype)]}) in one child
  process dumping to `dump_dir`, in order."""
  specs = [dict(generation=p["generation"], fn=p["fn"],
                kwargs=dict(p.get("kwargs") or {}),
                args=[[list(s), str(d)] for s, d in p["args"]])
           for p in programs]
  run_worker("streamidx.lab.dump", specs, dump_dir=dump_dir)


def run_worker(module: str, payload, *, dump_dir: str, timeout: float = 3600.0):
  """`lab.worker.run(module, payload)` with libtpu dumping its final
  schedules to `dump_dir` (`DUMP_FLAGS`), every operand in HBM
  (`HBM_FLAGS`): the one way a compile is dumped. The child compiles only
  (`compile_for`): JAX_PLATFORMS=cpu keeps it off a TPU host's chip, which
  the caller may hold (one process at a time can)."""
  env = {"JAX_PLATFORMS": "cpu",
         "LIBTPU_INIT_ARGS": (os.environ.get("LIBTPU_INIT_ARGS", "") +
                              f" --xla_jf_dump_to={dump_dir} {DUMP_FLAGS} "
                              f"{HBM_FLAGS}"),
         "ALLOW_MULTIPLE_LIBTPU_LOAD": os.environ.get(
             "ALLOW_MULTIPLE_LIBTPU_LOAD", "1")}
  return worker.run(module, payload, env=env, timeout=timeout)


def main(argv=None) -> int:
  """The child process of `compile_dumps` (`--worker JSON`)."""
  return 0 if worker.serve(argv, _worker) else 2


if __name__ == "__main__":
  sys.exit(main())
