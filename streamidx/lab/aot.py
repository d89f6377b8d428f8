"""The compile matrix: every variant compiled for every TPU generation, no TPU
(`python -m streamidx.aot`, make aot; docs/tpu.md). `compile_entry` compiles
one entry point at any `CallShape`; `launch_calls` / `compile_launch` one
`pallas_call` alone (VMEM probes, schedules).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import dataclasses
import multiprocessing
import os
import re
import sys
import time
from typing import Any, Sequence

import jax
import jax.numpy as jnp

from streamidx import cache as cache_lib
from streamidx import modes, semantics, topk
from streamidx.lab import shapes as shapes_lib
from streamidx.lab.model import tiling
from streamidx.variants import VARIANTS

GENERATIONS: tuple[str, ...] = tuple(modes.TOPOLOGIES)


Shape = shapes_lib.CallShape  # the compile matrix's shapes, `lab.shapes`'
SHAPES = shapes_lib.COMPILE
SHAPES_BY_NAME = shapes_lib.COMPILE_BY_NAME
QUICK_SHAPES = {"token": "dsv4-decode-4k", "page": "glm-page-prefill"}

# Block sizes tried per mode besides the block-size table's row ("table").
BLOCK_SETS: dict[str, tuple[dict, ...]] = {
    "token": (
        dict(num_kv_pages_per_block=(1, 1, 1), num_queries_per_block=(1, 64, 64)),
        dict(num_kv_pages_per_block=(8, 4, 4),
             num_queries_per_block=(1, 256, 256)),
    ),
    "page": (  # fewer rows than the table's (its rows' bound: blocks.py)
        dict(num_kv_pages_per_block=128, num_queries_per_block=4),
        dict(num_kv_pages_per_block=128, num_queries_per_block=8),
    ),
}


@dataclasses.dataclass(frozen=True)
class Row:
  """One compile: variant x generation x cache format x blocks x shape."""

  variant: str
  generation: str
  fmt: str
  shape: str
  blocks: tuple  # sorted (name, value) pairs of the block-size keywords
  table: bool  # blocks are the block-size table's row
  topk_method: str | None = None  # None: the kernel's default
  refused: str = ""  # the table's rule refuses the call (its ValueError)

  static = property(lambda self: dict(self.blocks, **(
      {} if self.topk_method is None else {"topk_method": self.topk_method})))


@dataclasses.dataclass
class Result:
  row: Row
  ok: bool
  error: str = ""
  compile_s: float = 0.0
  vmem_scratch: int = 0  # bytes, largest launch
  memory: dict = dataclasses.field(default_factory=dict)


def _blocks_key(kwargs: dict) -> tuple:
  return tuple(sorted(kwargs.items()))


def matrix(*, quick: bool = False, variants: Sequence[str] | None = None,
           generations: Sequence[str] | None = None,
           formats: Sequence[str] | None = None,
           shapes: Sequence[str] | None = None,
           topk_methods: Sequence[str] | None = None) -> list[Row]:
  """The rows to compile. quick: the table's blocks, one shape per variant.
  topk_methods: one more row (table blocks) per method a variant takes."""
  out = []
  for name, v in VARIANTS.items():
    if variants and name not in variants:
      continue
    for gen in generations or GENERATIONS:
      for fmt in v.cache_formats:
        if formats and fmt not in formats:
          continue
        for shape in SHAPES:
          if shape.mode != v.mode or (shape.name not in shapes if shapes else
                                      quick and shape.name != QUICK_SHAPES[v.mode]):
            continue
          try:
            sets = [(shapes_lib.table_blocks(shape, name, fmt, gen).kwargs(), True)]
          except ValueError as e:  # refused before the compiler: a result
            out.append(Row(name, gen, fmt, shape.name, (), True,
                           refused=summarize_error(e)))
            continue
          if not quick:
            sets += [(b, False) for b in BLOCK_SETS[v.mode]]
          for kw, is_table in sets:
            out.append(Row(name, gen, fmt, shape.name, _blocks_key(kw),
                           is_table))
          for m in topk_methods or ():
            if m in v.topk_methods:
              out.append(Row(name, gen, fmt, shape.name,
                             _blocks_key(sets[0][0]), True, topk_method=m))
  return out


def entry_args(variant: str, shape: Shape, fmt: str, target=None) -> tuple:
  """The entry point's positional arguments as specs on `target`'s device
  (None: `jax.ShapeDtypeStruct`s without one)."""
  v = VARIANTS[variant]
  spec = target.spec if target is not None else jax.ShapeDtypeStruct
  keys = jax.ShapeDtypeStruct(
      (shape.total_pages, shape.page_size, shape.head_dim), jnp.float32)
  cache = jax.eval_shape(cache_lib.CACHE_FORMATS[fmt].pack, keys)
  t, n = shape.num_tokens, shape.max_num_seqs
  last = spec((3,), jnp.int32) if v.mode == "token" else spec((), jnp.int32)
  return (spec((t, shape.num_heads, shape.head_dim), jnp.bfloat16),
          spec((t, shape.num_heads), jnp.float32),
          *(spec(a.shape, a.dtype) for a in cache),
          spec((n,), jnp.int32), spec((n * shape.pages_per_seq,), jnp.int32),
          spec((n + 1,), jnp.int32), last)


def entry_static(variant: str, shape: Shape, blocks: dict) -> dict:
  """The entry point's keyword arguments at `shape`: k (or k_pages), the
  ratio, decode_q_len where above 1, then `blocks` (any static keywords)."""
  v = VARIANTS[variant]
  extra = {"decode_q_len": shape.decode_q_len} if shape.decode_q_len > 1 else {}
  return {v.k_name: shape.k, "compression_ratio": shape.compression_ratio,
          **extra, **blocks}


_ERROR_CODE = re.compile(r"(E\d{4}: \w+)")
_OOM = r"Ran out of memory[^.]*\. Used \S+ of \S+ vmem"
_CODED = (r"Scoped allocation with size \S+ and limit \S+",
          r"Unsupported [^:]*: [^ ]+", _OOM)
_UNCODED = (_OOM, r"Allocation \(size=\d+\) would exceed memory \(size=\d+\)")


def summarize_error(e: BaseException) -> str:
  """The compiler's (or streamidx's) error in one line."""
  text = str(e)
  lines = [l.strip() for l in text.splitlines() if l.strip()]
  code = _ERROR_CODE.search(text)
  if code is None and isinstance(e, ValueError):
    return f"ValueError: {text.splitlines()[0] if text else ''}"
  found = [m.group(0) for p in (_CODED if code else _UNCODED)
           for m in [re.search(p, text)] if m]
  if code:
    after = text[code.end():].strip(" :\n").splitlines()
    return f"{code.group(1)}: {(found or after or [''])[0]}"[:240]
  return f"{type(e).__name__}: {(found or lines or [''])[0]}"[:240]


def launch_calls(variant: str, shape: Shape, fmt: str, blocks: dict, target):
  """`tiling.traced_launches` of the entry point at `shape` on `target`:
  its scoring launches, then, where `blocks` names "blocktop", its
  selection kernel's call."""
  return tiling.traced_launches(VARIANTS[variant], entry_args(
      variant, shape, fmt, target), entry_static(variant, shape, blocks))


def compile_launch(eqn, target, *, vmem_limit_bytes: Any = "keep",
                   name: str = "launch"):
  """Compiles one `pallas_call` equation alone for `target`.

  vmem_limit_bytes: "keep" (as traced) or a new limit (bytes or None);
  `name` names the function (and the compiler's dump files)."""
  params = dict(eqn.params)
  if vmem_limit_bytes != "keep":
    params["compiler_params"] = dataclasses.replace(
        params["compiler_params"], vmem_limit_bytes=vmem_limit_bytes)
  specs = [target.spec(v.aval.shape, v.aval.dtype) for v in eqn.invars]

  def launch(*a):
    return eqn.primitive.bind(*a, **params)

  launch.__name__ = re.sub(r"\W", "_", name)
  return jax.jit(launch).lower(*specs).compile()


_SIZE = re.compile(r"Scoped allocation with size ([\d.]+)([KMG]?) and limit")
_USED = re.compile(r"Used ([\d.]+)([KMG]?) of [\d.]+[KMG]? vmem")
_ALLOC = re.compile(r"Allocation \(size=(\d+)\) would exceed memory")


def scoped_vmem_probe(eqn, target, vmem_limit_bytes: int) -> float | None:
  """Compiles a launch under `vmem_limit_bytes`: None if it fits, else the
  scoped VMEM bytes the compiler printed (E1001's "size", or its
  out-of-memory "Used")."""
  try:
    compile_launch(eqn, target, vmem_limit_bytes=vmem_limit_bytes)
    return None
  except Exception as e:  # pylint: disable=broad-except
    m = _SIZE.search(str(e)) or _USED.search(str(e))
    if m:
      return float(m.group(1)) * {"": 1, "K": 2**10, "M": 2**20, "G": 2**30}[m.group(2)]
    m = _ALLOC.search(str(e))
    if m:  # one buffer alone exceeds the chip: its size
      return float(m.group(1))
    raise


def launch_scratch_bytes(eqn, tpu_generation: int) -> int:
  """`semantics.scratch_vmem_bytes` of a traced launch's declared scratch."""
  return semantics.scratch_vmem_bytes(
      [("", s, d) for s, d in tiling.declared_scratch(eqn)], tpu_generation)


def xla_memory(compiled) -> dict | None:
  """XLA's buffer assignment of a compiled program in bytes: "<part>_bytes" of its
  arguments, outputs, temporaries, aliases and generated code (a compile-time figure;
  None where XLA has none)."""
  m = compiled.memory_analysis()
  return None if m is None else {
      f"{k}_bytes": int(getattr(m, f"{k}_size_in_bytes"))
      for k in ("argument", "output", "temp", "alias", "generated_code")}


def compile_entry(variant: str, shape: Shape, fmt: str, generation: str,
                  **static):
  """`variant`'s entry point compiled for `generation` on `shape`'s abstract
  arrays, with `static` keywords beside k and the ratio (block sizes left out:
  the table's); raises the compiler's (or streamidx's) error."""
  with modes.compile_for(generation) as target:
    args = entry_args(variant, shape, fmt, target)
    return VARIANTS[variant].kernel.lower(
        *args, **entry_static(variant, shape, static)).compile()


def compile_row(row: Row) -> Result:
  """Compiles one row's entry point for its generation; never raises. A
  refused row is a result as it is (ok: refusing is the rule's answer)."""
  if row.refused:
    return Result(row, True, row.refused)
  shape = SHAPES_BY_NAME[row.shape]
  t0, vmem = time.perf_counter(), 0
  try:
    with modes.compile_for(row.generation) as target:
      for _, eqn in launch_calls(row.variant, shape, row.fmt, row.static,
                                 target):
        vmem = max(vmem, launch_scratch_bytes(eqn, target.tpu_generation))
    t0 = time.perf_counter()
    compiled = compile_entry(row.variant, shape, row.fmt, row.generation,
                             **row.static)
    return Result(row, True, compile_s=time.perf_counter() - t0,
                  vmem_scratch=vmem, memory=xla_memory(compiled) or {})
  except Exception as e:  # pylint: disable=broad-except
    return Result(row, False, summarize_error(e), time.perf_counter() - t0,
                  vmem)


def _label(row: Row) -> str:
  """E.g. "kv=1/2/2 q=1/64/64 B=4 (table) topk_method=sort"."""
  d = dict(row.blocks)
  parts = [f"{short}={'/'.join(map(str, v)) if isinstance(v, tuple) else v}"
           for k, short in (("num_kv_pages_per_block", "kv"),
                            ("num_queries_per_block", "q"),
                            ("decode_req_batch_size", "B"),
                            ("vmem_limit_bytes", "vmem"))
           for v in [d.get(k)] if k in d]
  parts += ["(table)"] * row.table + [f"topk_method={row.topk_method}"] * (
      row.topk_method is not None)
  return " ".join(parts)


def _mib(n) -> str:
  return "-" if n is None else f"{n / 2**20:.2f}"


def format_table(results: Sequence[Result]) -> str:
  """The results as an aligned text table (errors cut at 90 characters)."""
  from streamidx.lab import tables  # pylint: disable=g-import-not-at-top
  return tables.format_rows([{
      "variant": r.row.variant, "gen": r.row.generation, "fmt": r.row.fmt,
      "shape": r.row.shape, "blocks": _label(r.row),
      "result": (("refused: " + r.error[12:90]) if r.row.refused else
                 "compiled" if r.ok else r.error[:90]),
      "compile s": f"{r.compile_s:.1f}", "VMEM scratch MiB": _mib(r.vmem_scratch),
      "HBM temp MiB": _mib(r.memory.get("temp_bytes")),
      "HBM args MiB": _mib(r.memory.get("argument_bytes")),
      "code KiB": (f"{r.memory['generated_code_bytes'] / 1024:.0f}" if r.memory
                   else "-")}
      for r in results])


def _off_the_chip():
  """A compiler process's JAX takes the CPU: it compiles only, and on a TPU
  host the chip is its parent's (one process at a time holds it)."""
  jax.config.update("jax_platforms", "cpu")


def run(rows: Sequence[Row], jobs: int = 1, progress=None) -> list[Result]:
  """Compiles `rows` in `jobs` processes (1: in this process)."""
  with (concurrent.futures.ProcessPoolExecutor(
      jobs, mp_context=multiprocessing.get_context("spawn"),
      initializer=_off_the_chip) if jobs > 1
        else contextlib.nullcontext()) as pool:
    out = []
    for r in (pool.map if pool else map)(compile_row, rows):
      out.append(r)
      if progress:
        progress(r)
    return out


def main(argv=None) -> int:
  p = argparse.ArgumentParser(
      prog="python -m streamidx.aot",
      description="Compile every kernel variant for every TPU generation "
      "(no TPU needed; see streamidx/lab/aot.py).")
  add = p.add_argument
  add("--quick", action="store_true",
      help="one shape per variant and generation, table blocks")
  add("--variants", nargs="+")
  add("--generations", nargs="+", choices=GENERATIONS)
  add("--formats", nargs="+")
  add("--shapes", nargs="+", choices=sorted(SHAPES_BY_NAME))
  add("--jobs", type=int, default=min(4, os.cpu_count() or 1),
      help="compiler processes (default: min(4, CPUs))")
  add("--topk-methods", nargs="*", metavar="METHOD", help="also one row per "
      "topk method (all when given no names) at the table's blocks")
  add("--no-sharded", action="store_true", help="skip the sharded rows "
      "(streamidx.lab.sharding)")
  a = p.parse_args(argv)
  methods = None
  if a.topk_methods is not None:
    for m in a.topk_methods:
      topk.check_topk_method(m)
    methods = tuple(a.topk_methods) or topk.TOPK_METHODS
  rows = matrix(quick=a.quick, variants=a.variants, generations=a.generations,
                formats=a.formats, shapes=a.shapes, topk_methods=methods)
  if not rows:
    print("aot: no rows match", file=sys.stderr)
    return 2
  print(f"aot: {len(rows)} compiles, {a.jobs} process(es), libtpu "
        f"{modes.libtpu_path()}, jax {jax.__version__}; no TPU is used",
        flush=True)

  def progress(r):
    print(f"  {'refused ' if r.row.refused else 'compiled' if r.ok else 'FAILED  '} {r.row.variant} "
          f"{r.row.generation} {r.row.fmt} {r.row.shape} {_label(r.row)} "
          f"({r.compile_s:.1f} s)", flush=True)

  t0 = time.perf_counter()
  results = run(rows, a.jobs, progress)
  print()
  print(format_table(results))
  bad = [r for r in results if not r.ok and r.row.table]
  refused = sum(1 for r in results if r.row.refused)
  print(f"\naot: {sum(r.ok for r in results) - refused}/{len(results)} "
        f"compiled, {refused} refused before the compiler (the table's rules), in "
        f"{time.perf_counter() - t0:.0f} s; rows with the block-size table's "
        f"sizes that failed: {len(bad)}")
  sharded_bad = 0
  if not a.no_sharded:  # the sharded layouts on TPU slices, collectives' bytes
    from streamidx.lab import sharding, tables  # pylint: disable=g-import-not-at-top
    t0 = time.perf_counter()
    runs = sharding.compile_matrix(quick=a.quick)
    print("\nsharded (streamidx.lab.sharding; collective bytes read from the "
          "compiled HLO, no TPU):")
    print(tables.markdown([r.row() for r in runs]))
    sharded_bad = sum(not r.ok for r in runs)
    print(f"\naot: {len(runs) - sharded_bad}/{len(runs)} sharded compiled in "
          f"{time.perf_counter() - t0:.0f} s")
  return 1 if (bad or sharded_bad) else 0


if __name__ == "__main__":
  sys.exit(main())
