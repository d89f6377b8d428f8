"""Tooling for the kernel walkthrough notebook (03): numbered source excerpts
and the TPU compiler's verdict on its kernels. The kernels it teaches live in
the notebook's cells.
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import json
import re
from pathlib import Path
from typing import Callable, Sequence


def _module_path(module) -> str:
  """The module's file relative to the package root's parent
  (`streamidx/kernels/vendored.py`), or its absolute path."""
  path = Path(inspect.getsourcefile(module)).resolve()
  top = module.__name__.split(".")[0]
  for parent in path.parents:
    if parent.name == top:
      return str(path.relative_to(parent.parent))
  return str(path)


@dataclasses.dataclass(frozen=True)
class Excerpt:
  """Lines `first..last` (1-based, inclusive) of `path`."""

  path: str
  name: str
  first: int
  last: int
  lines: tuple[str, ...]

  def __str__(self) -> str:
    width = len(str(self.last))
    head = f"# {self.path}, lines {self.first}-{self.last}: {self.name}"
    body = [f"{n:>{width}} | {line}"
            for n, line in zip(range(self.first, self.last + 1), self.lines)]
    return "\n".join([head, *body])


def excerpt(module, qualname: str, *, start: str | None = None,
            stop: str | None = None) -> Excerpt:
  """The source of function (or class) `qualname` of `module` (e.g.
  `streamidx.kernels.vendored`), numbered as in the file, decorators
  included. qualname: a dotted path through nested definitions
  ("_scores_kernel._fetch_bkv", which `inspect.getsource` cannot reach);
  start, stop: substrings, the excerpt then runs from the first line
  containing `start` to the first line after it containing `stop`."""
  source = inspect.getsource(module)
  lines = source.splitlines()
  node = ast.parse(source)
  for part in qualname.split("."):  # each a definition nested in the last
    node = next((c for c in ast.walk(node) if c is not node and isinstance(
        c, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
                 and c.name == part), None)
    if node is None:
      raise ValueError(f"qualname: no definition {part!r} in {qualname!r}")
  first = min([node.lineno] + [d.lineno for d in
                               getattr(node, "decorator_list", [])])
  last = node.end_lineno
  for arg, text in (("start", start), ("stop", stop)):
    if text is None:
      continue
    hits = [n for n in range(first, last + 1) if text in lines[n - 1]]
    if not hits:
      raise ValueError(f"{arg}: {text!r} not in {qualname} from line {first}")
    first, last = (hits[0], last) if arg == "start" else (first, hits[0])
  return Excerpt(_module_path(module), qualname, first, last,
                 tuple(lines[first - 1:last]))


_NO_LOWERING = re.compile(r"Unimplemented primitive in Pallas TPU lowering for \w+: (\w+)")


def lowering_gap(e: BaseException) -> str | None:
  """An error saying Pallas cannot lower a primitive inside a TPU kernel, in
  one line of our own ("Pallas has no TPU lowering for `top_k` inside a
  kernel"); None for any other error."""
  found = _NO_LOWERING.search(str(e))
  return (f"Pallas has no TPU lowering for `{found.group(1)}` inside a kernel"
          if found else None)


def compile_rows(kernels: dict[str, tuple[Callable, tuple]],
                 generations: Sequence[str]) -> list[dict]:
  """One table row per kernel, `{"kernel": name, <generation>: verdict}`; never
  raises. `kernels`: name -> (fn, args), `fn(*args)` tracing its
  `pallas_call`s compiled, `args` made beforehand (a compile-only device
  computes nothing); `generations`: "v4" .. "v7x" (`streamidx.compile_for`,
  no TPU) or "local" (a TPU)."""
  import jax  # pylint: disable=g-import-not-at-top

  from streamidx import modes  # pylint: disable=g-import-not-at-top
  from streamidx.lab import aot  # pylint: disable=g-import-not-at-top

  def verdict(fn, args, generation):
    try:
      if generation == "local":
        compiled = jax.jit(fn).lower(*args).compile()
      else:
        with modes.compile_for(generation) as target:
          compiled = jax.jit(fn).lower(*target.specs(args)).compile()
    except Exception as e:  # noqa: BLE001 - the compiler's error is the result
      return f"fails: {lowering_gap(e) or aot.summarize_error(e)}"
    if "tpu_custom_call" in compiled.as_text():
      return "compiles (Mosaic)"
    return "compiles, but no Mosaic kernel"

  return [{"kernel": name, **{g: verdict(fn, args, g) for g in generations}}
          for name, (fn, args) in kernels.items()]
