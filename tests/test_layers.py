"""Imports point down only: ARCHITECTURE.md's layer list, checked.

The list (the fenced `layers` block of ARCHITECTURE.md) holds one layer a
line, lowest first; an entry is a module of `streamidx` or a package taken
whole (`topk`, `lab.bench`, `lab.studies`). Every module must have a place,
every import (a function's lazy one too) must go to a lower layer or stay
inside its own entry, and no imports may form a cycle.
"""

from __future__ import annotations

import ast
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _layers() -> dict[str, int]:
  text = (ROOT / "ARCHITECTURE.md").read_text()
  block = text.split("```layers\n", 1)[1].split("```", 1)[0]
  lines = [l.split("#")[0].strip() for l in block.splitlines()]
  return {entry.strip(): i
          for i, line in enumerate(l for l in lines if l)
          for entry in line.split(",")}


def _modules() -> dict[str, pathlib.Path]:
  out = {}
  for path in sorted((ROOT / "streamidx").rglob("*.py")):
    parts = path.relative_to(ROOT / "streamidx").with_suffix("").parts
    out[".".join(p for p in parts if p != "__init__") or "streamidx"] = path
  return out


def _imports(name: str, path: pathlib.Path, modules) -> set[str]:
  """The package modules `name` imports, anywhere in its file."""
  def resolve(dotted):
    dotted = dotted.removeprefix("streamidx").removeprefix(".")
    while dotted and dotted not in modules:
      dotted = dotted.rpartition(".")[0]
    return dotted or "streamidx"

  package = name if path.name == "__init__.py" else name.rpartition(".")[0]
  out = set()
  for node in ast.walk(ast.parse(path.read_text())):
    if isinstance(node, ast.Import):
      out |= {resolve(a.name) for a in node.names
              if a.name.split(".")[0] == "streamidx"}
    elif isinstance(node, ast.ImportFrom):
      base = node.module or ""
      if node.level:  # relative: from the package `name` is in
        up = package.split(".")[:len(package.split(".")) - node.level + 1]
        base = ".".join(["streamidx", *filter(None, up), *filter(None, [base])])
      if base.split(".")[0] == "streamidx":
        out |= {resolve(f"{base}.{a.name}") for a in node.names}
  return out - {name}


def _entry(name: str, layers) -> str | None:
  """The layer entry holding module `name` (itself or its package)."""
  parts = name.split(".")
  return next((".".join(parts[:i]) for i in range(len(parts), 0, -1)
               if ".".join(parts[:i]) in layers), None)


def test_every_import_points_down_the_layer_list():
  layers, modules = _layers(), _modules()
  unplaced = sorted(m for m in modules if _entry(m, layers) is None)
  assert not unplaced, f"modules missing from ARCHITECTURE.md's layers: {unplaced}"
  graph = {m: _imports(m, p, modules) for m, p in modules.items()}
  upward = [f"{m} -> {d}" for m, deps in graph.items() for d in sorted(deps)
            if _entry(d, layers) != _entry(m, layers)
            and layers[_entry(d, layers)] >= layers[_entry(m, layers)]]
  assert not upward, f"imports not to a lower layer: {upward}"


def test_no_import_cycles():
  modules = _modules()
  graph = {m: _imports(m, p, modules) for m, p in modules.items()}
  done, path = set(), []

  def visit(m):
    if m in path:
      raise AssertionError(f"import cycle: {path[path.index(m):] + [m]}")
    if m in done:
      return
    path.append(m)
    for d in sorted(graph[m]):
      visit(d)
    path.pop()
    done.add(m)

  for m in sorted(graph):
    visit(m)


def test_the_layer_list_names_only_modules():
  modules = _modules()
  stale = [e for e in _layers()
           if e not in modules and not any(m.startswith(e + ".")
                                           for m in modules)]
  assert not stale, f"ARCHITECTURE.md's layers name no module: {stale}"
