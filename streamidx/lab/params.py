"""A notebook's parameters: declared once, in its `parameters` cell, checked
before anything runs, and scaled up on a TPU (docs/workbook.md, "Parameters").
"""

from __future__ import annotations

import ast
import dataclasses
import io
import json
import numbers
import os
import tokenize
from pathlib import Path
from typing import Any, Callable, Mapping, MutableMapping

import jax

import streamidx as si
from streamidx import lab, modes, semantics

HEADER = "# Parameters (papermill overrides these with -p)."
PAPERMILL_HEADER = "# Parameters"  # the first line of the cell papermill injects
TPU_SCALE_ENV = "STREAMIDX_TPU_SCALE"


class ParameterError(ValueError):
  """A notebook parameter breaks its rule."""


# --------------------------------------------------------------------------
# The helpers a rule may call: each returns True or False, never raises.

def integer(x) -> bool:  # an int, not a bool
  return isinstance(x, numbers.Integral) and not isinstance(x, bool)


def number(x) -> bool:  # an int or a float, not a bool
  return isinstance(x, numbers.Real) and not isinstance(x, bool)


def boolean(x) -> bool:
  return isinstance(x, bool)


def string(x) -> bool:  # non-empty
  return isinstance(x, str) and bool(x)


def integers(x, empty: bool = False) -> bool:
  """A list of ints, non-empty unless `empty`."""
  return (isinstance(x, (list, tuple)) and (empty or bool(x))
          and all(map(integer, x)))


def pairs(x) -> bool:
  """A list (maybe empty) of [q_len, seq_len] ints, 0 <= q_len <= seq_len."""
  return isinstance(x, (list, tuple)) and all(
      integers(p) and len(p) == 2 and 0 <= p[0] <= p[1] for p in x)


def choices(x, options) -> bool:
  """A non-empty list whose items are all in `options`."""
  return (isinstance(x, (list, tuple)) and bool(x)
          and all(v in tuple(options) for v in x))


def per_case(x) -> bool:
  """Per-case block sizes: one int >= 1 for each of `semantics.CASES`."""
  return integers(x) and len(x) == len(semantics.CASES) and min(x) >= 1


def lanes(page_size, x) -> bool:
  """KV block sizes in pages (an int or a list) each a whole token-mode KV
  block: page_size * each a multiple of `semantics.LANES`."""
  values = x if isinstance(x, (list, tuple)) else [x]
  return integer(page_size) and all(
      integer(v) and v >= 1 and page_size * v % semantics.LANES == 0
      for v in values)


cdiv = semantics.cdiv  # ceil(a / b) for ints

RULE_HELPERS: dict[str, Callable] = {f.__name__: f for f in (
    integer, number, boolean, string, integers, pairs, choices, per_case, lanes, cdiv)}


# --------------------------------------------------------------------------
# Reading the parameters cell.

@dataclasses.dataclass(frozen=True)
class Parameter:
  """One line of a `parameters` cell; `given`: its ci: and tpu: values."""

  name: str
  default: Any
  rule: str | None
  text: str
  given: dict[str, Any]


@dataclasses.dataclass(frozen=True)
class Declarations:
  """A parsed `parameters` cell: name -> Parameter in cell order, and the
  header's `# TPU:` line (why the notebook has no TPU sizes), if any."""

  parameters: dict[str, Parameter]
  tpu_why: str | None

  def _given(self, key: str) -> dict[str, Any]:
    return {n: p.given[key] for n, p in self.parameters.items() if key in p.given}

  def ci(self) -> dict[str, Any]:
    return self._given("ci")

  def tpu(self) -> dict[str, Any]:
    return self._given("tpu")

  def defaults(self) -> dict[str, Any]:
    return {n: p.default for n, p in self.parameters.items()}


def parameters_cell_index(nb: dict) -> int:
  """Index of a notebook's (dict) first cell tagged `parameters`, or -1."""
  return next((i for i, c in enumerate(nb.get("cells", []))
               if "parameters" in c.get("metadata", {}).get("tags", [])), -1)


def cell_source(notebook: str | os.PathLike) -> str:
  """The source of the cell tagged `parameters` in a notebook file."""
  nb = json.loads(Path(notebook).read_text(encoding="utf-8"))
  i = parameters_cell_index(nb)
  if i < 0:
    raise ParameterError(f"{notebook}: no cell tagged 'parameters'")
  src = nb["cells"][i].get("source", "")
  return "".join(src) if isinstance(src, list) else src


def declarations(source: str | os.PathLike) -> Declarations:
  """Parses a `parameters` cell (its source, or a notebook file as a Path);
  ParameterError where it breaks the format."""
  if isinstance(source, os.PathLike):
    source = cell_source(source)
  lines = source.splitlines()
  namespace: dict[str, Any] = {}
  exec(compile(source, "parameters cell", "exec"), namespace)  # pylint: disable=exec-used
  comments = {t.start[0]: t.string for t in tokenize.generate_tokens(
      io.StringIO(source).readline) if t.type == tokenize.COMMENT}
  tree = ast.parse(source)
  first = tree.body[0].lineno if tree.body else len(lines) + 1
  why: list[str] = []
  for h in (comments[r] for r in range(1, first) if r in comments):
    if h.startswith("# TPU:") or why and h.startswith("#   "):
      why.append(h[len("# TPU:") if h.startswith("# TPU:") else 1:].strip())
  params = {}
  for node in tree.body:
    if not (isinstance(node, ast.Assign) and len(node.targets) == 1
            and isinstance(node.targets[0], ast.Name)):
      raise ParameterError(f"parameters cell line {node.lineno}: one "
                           "`name = value` per statement")
    name, end = node.targets[0].id, node.end_lineno
    comment = next((comments[r] for r in range(node.lineno, end + 1)
                    if r in comments), "#")
    fields, text = {}, []
    for part in comment[1:].strip().split(" | "):
      key, _, value = part.partition(":")
      if not text and key.strip() in ("ci", "tpu", "rule") and value:
        fields[key.strip()] = value.strip()
      else:
        text.append(part)
    text = [" | ".join(text)]
    while end < len(lines) and lines[end][:1] in (" ", "\t") and lines[end].strip()[:1] == "#":
      text.append(lines[end].strip()[1:].strip())  # an indented continuation
      end += 1
    given = {}
    for key in ("ci", "tpu"):
      try:
        given.update({key: ast.literal_eval(fields[key])} if key in fields else {})
      except (ValueError, SyntaxError) as e:
        raise ParameterError(f"parameter {name!r}: its {key}: field is not a Python "
                             f"literal: {fields[key]!r}") from e
    params[name] = Parameter(name, namespace[name], fields.get("rule"),
                             " ".join(text).strip(), given)
  return Declarations(params, " ".join(why) or None)


# --------------------------------------------------------------------------
# Checking.

def check(decl: Declarations, values: Mapping[str, Any]) -> None:
  """Evaluates every rule of `decl` over `values` in cell order; raises
  ParameterError at the first parameter missing or breaking its rule."""
  for name in decl.parameters:
    if name not in values:
      raise ParameterError(f"notebook parameter {name!r}: missing (the "
                           "parameters cell must assign it)")
  env = {**RULE_HELPERS, "si": si, "lab": lab, **{n: values[n] for n in decl.parameters}}
  for p in decl.parameters.values():
    if p.rule is None and p.name != "output_dir":
      raise ParameterError(f"notebook parameter {p.name!r}: its line in the "
                           "parameters cell has no `rule:` field")
    if p.rule is None:
      continue
    try:
      ok, error = eval(p.rule, dict(env)), ""  # pylint: disable=eval-used
    except Exception as e:  # noqa: BLE001 - a rule over a bad value may raise
      ok, error = False, f"; {type(e).__name__}: {e}"
    if not ok:
      raise ParameterError(f"notebook parameter {p.name!r}: breaks its rule "
                           f"`{p.rule}` (got {values[p.name]!r}{error})")


def _history(namespace: Mapping) -> list[str]:
  """The sources of the cells this IPython kernel ran (`In`), in order."""
  history = namespace.get("In", namespace.get("_ih", ()))
  return [s for s in history if isinstance(s, str)] if isinstance(history, (list, tuple)) else []


def check_notebook(namespace: MutableMapping, cell: str | os.PathLike | None = None,
                   *, before_backend: Callable[[], Any] | None = None) -> None:
  """Checks a notebook's globals() against its parameters cell (`cell`: source or
  path; None: the last one this kernel ran), calls `before_backend` (09's CPU devices),
  applies, checks and prints `tpu_scaling`'s sizes; ParameterError names the first broken."""
  if cell is None:  # the last `parameters` cell this IPython kernel ran
    cell = next((s for s in reversed(_history(namespace)) if s.startswith(HEADER)), None)
  if cell is None:
    raise ParameterError("check_notebook: no parameters cell (its first line "
                         f"{HEADER!r}) has run in this kernel; pass cell=")
  decl = declarations(cell)
  check(decl, namespace)
  if before_backend is not None:
    before_backend()
  scaling = tpu_scaling(decl, namespace)
  if scaling is None:
    return
  if scaling.values:
    try:
      check(decl, {**namespace, **scaling.values})
    except ParameterError as e:
      raise ParameterError(f"{e} [with the TPU sizes of {', '.join(scaling.values)}; "
                           f"{TPU_SCALE_ENV}=0 runs without them]") from None
    namespace.update(scaling.values)
  print(scaling.line())


# --------------------------------------------------------------------------
# Scaling up on a TPU.

@dataclasses.dataclass
class TpuScaling:
  """What `tpu_scaling` decided."""

  reason: str
  values: dict[str, Any] = dataclasses.field(default_factory=dict)  # to apply
  replaced: dict[str, Any] = dataclasses.field(default_factory=dict)  # had
  kept: dict[str, str] = dataclasses.field(default_factory=dict)  # name: why
  at_tpu: list[str] = dataclasses.field(default_factory=list)  # already at it
  note: str | None = None  # why none apply

  def line(self, machine: str | None = None) -> str:
    """The one line `check_notebook` prints (machine: describe_machine())."""
    if machine is None:
      machine = modes.describe_machine()
    if self.note is not None:
      return f"TPU sizes ({self.reason}): none applied: {self.note}. Machine: {machine}"
    parts = [", ".join(f"{n} {self.replaced[n]!r} -> {v!r}"
                       for n, v in self.values.items()) or "none applied"]
    if self.kept:
      parts.append("kept as set: " + ", ".join(f"{n} ({w})" for n, w in self.kept.items()))
    if self.at_tpu:
      parts.append("already at TPU size: " + ", ".join(self.at_tpu))
    return f"TPU sizes ({self.reason}): {'; '.join(parts)}. Machine: {machine}"


def injected_parameters(namespace: Mapping) -> set[str]:
  """Names assigned in an executed cell whose first line is "# Parameters"
  (papermill's, read from IPython's `In`)."""
  names: set[str] = set()
  for source in _history(namespace):
    if source.split("\n", 1)[0].strip() == PAPERMILL_HEADER:
      try:
        names |= {t.id for node in ast.parse(source).body if isinstance(node, ast.Assign)
                  for t in node.targets if isinstance(t, ast.Name)}
      except SyntaxError:
        pass
  return names


def same(a, b) -> bool:
  """Equal as JSON values (tuples as lists; True is not 1, 20 is not 20.0)."""
  try:
    return json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)
  except (TypeError, ValueError):
    return False


def tied(decl: Declarations) -> list[set[str]]:
  """Groups of parameters with TPU sizes one rule ties (scaled together)."""
  tpu = set(decl.tpu())
  groups: list[set[str]] = []
  for p in decl.parameters.values():
    names = {n.id for n in ast.walk(ast.parse(p.rule or "0")) if isinstance(n, ast.Name)}
    group = (names | {p.name}) & tpu
    if len(group) > 1:
      joined = [g for g in groups if g & group]
      groups = [g for g in groups if not g & group] + [group.union(*joined)]
  return groups


def tpu_scaling(decl: Declarations, namespace: Mapping, *,
                environ: Mapping[str, str] | None = None,
                backend: str | None = None) -> TpuScaling | None:
  """The TPU sizes for the run whose globals are `namespace`, or None (when they
  apply: docs/workbook.md, "Parameters"). `backend`: overrides jax's."""
  environ = os.environ if environ is None else environ
  setting = environ.get(TPU_SCALE_ENV, "").strip().lower()
  if setting not in ("", "auto", "0", "1"):
    raise ValueError(f"{TPU_SCALE_ENV}: must be 0 (never scale), 1 (scale off-TPU too) "
                     f"or auto/unset (scale on a TPU) (got {environ[TPU_SCALE_ENV]!r})")
  if setting == "0":
    return None
  if backend is None:
    backend = jax.default_backend()
  if setting != "1" and backend != "tpu":
    return None
  result = TpuScaling("the JAX backend is tpu" if setting != "1"
                      else f"{TPU_SCALE_ENV}=1, JAX backend {backend}")
  if not decl.tpu():
    result.note = decl.tpu_why or "the parameters cell gives no TPU sizes"
    return result
  injected = injected_parameters(namespace)
  for name, tpu in decl.tpu().items():
    value, default = namespace[name], decl.parameters[name].default
    if name in injected:
      result.kept[name] = "set by papermill"
    elif same(value, tpu):
      result.at_tpu.append(name)
    elif not same(value, default):
      result.kept[name] = f"set by hand: not the default {default!r}"
    else:
      result.values[name], result.replaced[name] = json.loads(json.dumps(tpu)), value
  for group in tied(decl):
    held = [n for n in decl.parameters if n in group and n in result.kept]
    for name in [n for n in decl.parameters if n in group and n in result.values] if held else []:
      del result.values[name], result.replaced[name]
      result.kept[name] = f"with {held[0]}"
  return result
