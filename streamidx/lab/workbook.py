"""Runs the workbook's notebooks with papermill, the way CI and `make workbook` do.

    python -m streamidx.workbook --profile ci [--only NAME ...] [--html]
                                 [--out DIR] [--timeout S] [--jobs N] [-v]

Terms used here:
  workbook      the notebooks `notebooks/NN_*.ipynb`.
  jobs          how many notebooks run at once (`--jobs`, default
                `default_jobs()`: min(2, CPUs)), each in its own kernel. They
                start longest first (`run_order`: the duration papermill
                recorded in the previous executed copy in the output folder,
                else `TYPICAL_SECONDS`), so the longest one does not start
                last; each prints its line as it finishes. With more than one
                job, the timings a notebook prints (compile seconds,
                interpreter host times) were taken beside another notebook:
                the summary line and a line under the landing page's heading
                say so (`jobs_note`); use `--jobs 1` for timing studies.
  profile       which parameters a run passes:
                  ci       the notebook's entry in `notebooks/ci_parameters.json`
                           (small sizes, interpret mode) plus `output_dir`;
                  default  only `output_dir`: the notebook's own defaults.
  output_dir    the parameter every notebook declares in its `parameters`
                cell; the runner points it at `<out>/<notebook stem>/`, an
                absolute path, created before the run. Figures and tables the
                notebook writes go there.
  executed copy `<out>/<notebook name>`: the notebook with its outputs. The
                source notebook is never written. `--html` also renders
                `<out>/<notebook stem>.html`.
  landing page  `<out>/index.html`, rewritten after every run: for each
                notebook of the workbook its title and question (the
                `**Question.**` paragraph of its first Markdown cell), its
                answer as computed (the first `text/markdown` output of the
                executed copy, which is where every notebook states it), the
                machine (the first `streamidx.describe_machine()` line it
                printed), status, duration and links to the rendered HTML
                and the executed copy (`write_index`).

`notebooks/ci_parameters.json` maps every notebook's file name to a
`{parameter: value}` object (`{}` for none). A notebook missing from it, a
name in it that is no notebook, a parameter the notebook's `parameters` cell
does not declare, or `output_dir` set there is a configuration error
(`WorkbookError`; exit code 2). A notebook that fails to run is reported with
the cell that failed (exit code 1).

The landing page is written by one writer only: `run_notebook` rewrites it
after its run (`index=True`), and `main` passes `index=False` and rewrites it
itself, in the main thread, after each notebook finishes.

Each cell runs under `--timeout` seconds (papermill's `execution_timeout`),
in the `python3` kernel, with the notebooks folder as working directory.

Only the standard library is imported at module import; papermill, nbformat
and nbconvert (the `notebooks` extra) are imported when a notebook is run.
"""

from __future__ import annotations

import argparse
import ast
import concurrent.futures
import dataclasses
import html as html_lib
import json
import logging
import os
import re
import sys
import threading
import time
from pathlib import Path
from typing import Any, Sequence

NOTEBOOK_GLOB = "[0-9][0-9]_*.ipynb"
CI_PARAMETERS_FILE = "ci_parameters.json"
OUTPUT_DIR_PARAMETER = "output_dir"
KERNEL_NAME = "python3"
PROFILES = ("ci", "default")
# Build folder (under the repository root) for each profile's executed copies.
PROFILE_OUT = {"ci": Path("build") / "ci", "default": Path("build") / "workbook"}
DEFAULT_TIMEOUT_S = 600
INJECTED_TAG = "injected-parameters"
INDEX_NAME = "index.html"
# Roughly the seconds each notebook takes at its defaults on an idle 2-core
# CPU (2026-12-01): the start order when no earlier executed copy gives its
# own duration (`run_order`). Only the order depends on these numbers.
TYPICAL_SECONDS = {
    "04_kernel_tiling.ipynb": 210, "05_recall_parity.ipynb": 205,
    "03_fp8_packing.ipynb": 70, "07_multichip.ipynb": 65,
    "06_tpu_profiling.ipynb": 65, "02_cache_layout.ipynb": 40,
    "01_kernel_walkthrough.ipynb": 30, "00_quickstart.ipynb": 15,
}


class WorkbookError(Exception):
  """A configuration error: raised before any notebook runs."""


@dataclasses.dataclass(frozen=True)
class CellFailure:
  """Where and how a notebook failed.

  cell_index: index into the SOURCE notebook's `cells` (0-based); None when
    the failing cell is papermill's injected parameters cell (`injected`)
    or could not be told (the kernel died before any cell started).
  code_cell: 1-based position among the source notebook's code cells, the
    parameters cell included; None as for cell_index.
  exec_count: the `In [n]` number in the executed copy (it counts the
    injected cell), or None if the cell never ran.
  """

  cell_index: int | None
  code_cell: int | None
  exec_count: int | None
  ename: str
  evalue: str
  source: str
  injected: bool = False

  def where(self) -> str:
    if self.injected:
      return "the injected parameters cell"
    if self.cell_index is None:
      return "no cell (the kernel failed outside any cell)"
    return (f"code cell {self.code_cell} (cells[{self.cell_index}], "
            f"In [{self.exec_count if self.exec_count is not None else ' '}])")

  def describe(self) -> str:
    lines = [f"{self.where()}: {self.ename}: {self.evalue}".rstrip(": ")]
    src = self.source.strip().splitlines()
    lines += [f"    | {line}" for line in src[:8]]
    if len(src) > 8:
      lines.append(f"    | ... ({len(src) - 8} more lines)")
    return "\n".join(lines)


@dataclasses.dataclass(frozen=True)
class NotebookResult:
  """The outcome of one notebook run."""

  name: str
  source: Path
  executed: Path
  html: Path | None
  output_dir: Path
  parameters: dict[str, Any]
  seconds: float
  failure: CellFailure | None

  @property
  def ok(self) -> bool:
    return self.failure is None

  def line(self) -> str:
    return f"{self.name:<44} {self.seconds:8.1f}s  {'ok' if self.ok else 'FAILED'}"

  def describe(self) -> str:
    if self.ok:
      return f"{self.name}: ok in {self.seconds:.1f}s -> {self.executed}"
    return (f"{self.name} FAILED at {self.failure.describe()}\n"
            f"    executed copy: {self.executed}")


# --------------------------------------------------------------------------
# Discovery and parameters.


def discover(notebooks_dir: Path) -> list[Path]:
  """The workbook's notebooks, `NN_*.ipynb`, in file-name order."""
  return sorted(Path(notebooks_dir).glob(NOTEBOOK_GLOB))


def _read_json_notebook(path: Path) -> dict:
  try:
    return json.loads(Path(path).read_text(encoding="utf-8"))
  except (OSError, ValueError) as e:
    raise WorkbookError(f"{path}: cannot read notebook: {e}") from e


def parameters_cell_index(nb: dict) -> int:
  """Index of the first cell tagged `parameters`, or -1."""
  for i, cell in enumerate(nb.get("cells", [])):
    if "parameters" in cell.get("metadata", {}).get("tags", []):
      return i
  return -1


def default_parameters(path: Path) -> dict:
  """The values the notebook's `parameters` cell assigns (it is run)."""
  nb = _read_json_notebook(path)
  idx = parameters_cell_index(nb)
  if idx < 0:
    raise ValueError(f"{path}: no cell tagged 'parameters'")
  source = "".join(nb["cells"][idx]["source"])
  namespace = {}
  exec(compile(source, str(path), "exec"), namespace)  # pylint: disable=exec-used
  return {k: v for k, v in namespace.items() if not k.startswith("__")}


def declared_parameters(path: Path) -> set[str]:
  """Names assigned at top level in the notebook's `parameters` cell."""
  nb = _read_json_notebook(path)
  idx = parameters_cell_index(nb)
  if idx < 0:
    raise WorkbookError(f"{Path(path).name}: no cell tagged 'parameters'")
  source = nb["cells"][idx].get("source", "")
  if isinstance(source, list):
    source = "".join(source)
  # IPython magics and shell escapes are not Python; blank them out.
  lines = ["" if line.lstrip().startswith(("%", "!")) else line
           for line in source.splitlines()]
  try:
    tree = ast.parse("\n".join(lines))
  except SyntaxError as e:
    raise WorkbookError(f"{Path(path).name}: parameters cell does not parse: {e}") from e
  names = set()
  for node in tree.body:
    targets = (node.targets if isinstance(node, ast.Assign)
               else [node.target] if isinstance(node, ast.AnnAssign) else [])
    names.update(t.id for t in targets if isinstance(t, ast.Name))
  return names


def load_ci_parameters(notebooks_dir: Path) -> dict[str, dict[str, Any]]:
  """Reads and checks `ci_parameters.json` against the notebooks present.

  Raises WorkbookError if the file is missing or malformed, names a notebook
  that does not exist, misses one that does, sets `output_dir`, or passes a
  parameter the notebook's parameters cell does not declare.
  """
  notebooks_dir = Path(notebooks_dir)
  path = notebooks_dir / CI_PARAMETERS_FILE
  try:
    table = json.loads(path.read_text(encoding="utf-8"))
  except FileNotFoundError as e:
    raise WorkbookError(f"{path}: missing; it must list every notebook") from e
  except ValueError as e:
    raise WorkbookError(f"{path}: not valid JSON: {e}") from e
  if not isinstance(table, dict):
    raise WorkbookError(f"{path}: must be a JSON object {{notebook name: {{param: value}}}}")
  present = {p.name for p in discover(notebooks_dir)}
  unknown = sorted(set(table) - present)
  missing = sorted(present - set(table))
  problems = []
  if unknown:
    problems.append(f"names no notebook in {notebooks_dir}: {', '.join(unknown)}")
  if missing:
    problems.append(f"has no entry for: {', '.join(missing)} (add {{}} if it needs none)")
  for name in sorted(set(table) & present):
    params = table[name]
    if not isinstance(params, dict):
      problems.append(f"{name}: value must be an object of parameters")
      continue
    if OUTPUT_DIR_PARAMETER in params:
      problems.append(f"{name}: sets {OUTPUT_DIR_PARAMETER!r}, which the runner owns")
    undeclared = sorted(set(params) - declared_parameters(notebooks_dir / name))
    if undeclared:
      problems.append(f"{name}: parameters not in its parameters cell: "
                      f"{', '.join(undeclared)}")
  if problems:
    raise WorkbookError(f"{path}:\n  " + "\n  ".join(problems))
  return table


def parameters_for(path: Path, profile: str, out_dir: Path) -> dict[str, Any]:
  """The parameters a run of `path` under `profile` passes to papermill."""
  path = Path(path)
  if profile not in PROFILES:
    raise WorkbookError(f"unknown profile {profile!r}; expected one of {PROFILES}")
  if OUTPUT_DIR_PARAMETER not in declared_parameters(path):
    raise WorkbookError(f"{path.name}: its parameters cell must declare "
                        f"{OUTPUT_DIR_PARAMETER!r}")
  params: dict[str, Any] = {}
  if profile == "ci":
    table = load_ci_parameters(path.parent)
    if path.name not in table:  # e.g. a notebook outside the NN_ pattern
      raise WorkbookError(f"{path.name}: not in {path.parent / CI_PARAMETERS_FILE}")
    params.update(table[path.name])
  params[OUTPUT_DIR_PARAMETER] = str((Path(out_dir) / path.stem).resolve())
  return params


# --------------------------------------------------------------------------
# Running.


def _kernel_warning() -> str | None:
  """Says so if the `python3` kernel would run another interpreter."""
  try:
    from jupyter_client.kernelspec import KernelSpecManager
    spec = KernelSpecManager().get_kernel_spec(KERNEL_NAME)
  except Exception as e:  # noqa: BLE001 - papermill will report it properly
    return f"cannot find the {KERNEL_NAME!r} kernel: {e}"
  exe = spec.argv[0] if spec.argv else ""
  relative = {"python", "python3", "python%d.%d" % sys.version_info[:2]}
  if exe in relative or os.path.abspath(exe) == os.path.abspath(sys.executable):
    return None
  return (f"the {KERNEL_NAME!r} kernel runs {exe} ({spec.resource_dir}), "
          f"not this interpreter {sys.executable}")


def _failure_from_papermill(error, source_nb: dict) -> CellFailure:
  """Maps papermill's cell index (executed notebook) back to the source."""
  p = parameters_cell_index(source_nb)
  injected = p + 1 if p >= 0 else 0
  idx = error.cell_index
  if idx == injected:
    return CellFailure(None, None, error.exec_count, error.ename,
                       error.evalue, error.source, injected=True)
  src_idx = idx - 1 if idx > injected else idx
  return _cell_failure(source_nb, src_idx, error.exec_count, error.ename,
                       error.evalue, error.source)


def _cell_failure(source_nb, src_idx, exec_count, ename, evalue, source) -> CellFailure:
  cells = source_nb.get("cells", [])
  code_cell = sum(1 for c in cells[: src_idx + 1] if c.get("cell_type") == "code")
  return CellFailure(src_idx, code_cell, exec_count, ename, evalue, source)


def _failure_from_exception(exc: BaseException, executed: Path,
                            source_nb: dict) -> CellFailure:
  """A failure that is not a cell error (timeout, dead kernel, ...).

  papermill saves the executed copy as cells start; the last cell that has
  a start time is the one that was running.
  """
  ename = type(exc).__name__
  evalue = (str(exc).strip().splitlines() or [""])[0][:300]
  try:
    cells = json.loads(executed.read_text(encoding="utf-8"))["cells"]
  except (OSError, ValueError, KeyError):
    return CellFailure(None, None, None, ename, evalue, "")
  started = [i for i, c in enumerate(cells)
             if c.get("metadata", {}).get("papermill", {}).get("start_time")]
  if not started:
    return CellFailure(None, None, None, ename, evalue, "")
  i = started[-1]
  cell = cells[i]
  source = cell.get("source", "")
  source = "".join(source) if isinstance(source, list) else source
  if INJECTED_TAG in cell.get("metadata", {}).get("tags", []):
    return CellFailure(None, None, cell.get("execution_count"), ename, evalue,
                       source, injected=True)
  n_injected = sum(1 for c in cells[:i]
                   if INJECTED_TAG in c.get("metadata", {}).get("tags", []))
  return _cell_failure(source_nb, i - n_injected, cell.get("execution_count"),
                       ename, evalue, source)


def render_html(executed: Path) -> Path:
  """Renders an executed copy to HTML beside it; returns the HTML path."""
  import nbformat
  from nbconvert import HTMLExporter

  nb = nbformat.read(str(executed), as_version=4)
  body, _ = HTMLExporter().from_notebook_node(nb)
  html = executed.with_suffix(".html")
  html.write_text(body, encoding="utf-8")
  return html


def _index_heading(profile: str, out_dir: Path) -> str:
  what = {"ci": "CI-sized parameters (notebooks/ci_parameters.json)",
          "default": "the notebooks' default parameters"}.get(profile, profile)
  return f"streamidx workbook ({what}): {Path(out_dir).name}/"


def jobs_note(jobs: int) -> str:
  """What `--jobs` > 1 does to the timings the notebooks print ("" for 1)."""
  if jobs <= 1:
    return ""
  return (f"Run {jobs} notebooks at a time: the timings they print ran beside "
          "another notebook (--jobs 1 for timing studies).")


def run_notebook(path: str | os.PathLike, profile: str = "ci",
                 out_dir: str | os.PathLike | None = None,
                 timeout: float = DEFAULT_TIMEOUT_S, *, html: bool = False,
                 log_output: bool = False, index: bool = True) -> NotebookResult:
  """Executes one notebook with papermill and returns what happened.

  Args:
    path: the source notebook, `notebooks/NN_name.ipynb`. Not modified.
    profile: "ci" (its ci_parameters.json entry plus output_dir) or
      "default" (output_dir only).
    out_dir: folder for the executed copy; defaults to the profile's build
      folder beside the notebooks folder (`build/ci`, `build/workbook`).
    timeout: seconds each cell may run.
    html: also render the executed copy to HTML beside it.
    log_output: stream the notebook's output to the `papermill` logger.
    index: rewrite the landing page `<out_dir>/index.html` (`write_index`)
      after the run, failed or not; a caller running notebooks at once passes
      False and writes it itself, from one thread.

  Returns a NotebookResult; a notebook that fails gives `ok == False` and
  `failure` naming the cell. Raises WorkbookError for configuration errors
  (before running anything).
  """
  path = Path(path).resolve()
  if not path.is_file():
    raise WorkbookError(f"{path}: no such notebook")
  if out_dir is None:
    out_dir = path.parent.parent / PROFILE_OUT.get(profile, Path("build") / profile)
  out_dir = Path(out_dir).resolve()
  params = parameters_for(path, profile, out_dir)
  executed = out_dir / path.name
  if executed == path:
    raise WorkbookError(f"{path}: output folder is the notebooks folder")
  out_dir.mkdir(parents=True, exist_ok=True)
  Path(params[OUTPUT_DIR_PARAMETER]).mkdir(parents=True, exist_ok=True)
  source_nb = _read_json_notebook(path)
  # A stale copy would be taken for this run's (and name the wrong cell).
  executed.unlink(missing_ok=True)
  executed.with_suffix(".html").unlink(missing_ok=True)

  import papermill
  from papermill.exceptions import PapermillExecutionError

  failure = None
  start = time.perf_counter()
  try:
    papermill.execute_notebook(
        str(path), str(executed), parameters=params,
        kernel_name=KERNEL_NAME, language="python", cwd=str(path.parent),
        execution_timeout=timeout, log_output=log_output,
        progress_bar=False,
        # The kernel's own log (e.g. ipykernel's TCP warning at every
        # start) is noise unless asked for; cell errors are in the copy.
        extra_arguments=[] if log_output else ["--IPKernelApp.log_level=CRITICAL"])
  except PapermillExecutionError as e:
    failure = _failure_from_papermill(e, source_nb)
  except Exception as e:  # noqa: BLE001 - timeouts, dead kernels, ...
    failure = _failure_from_exception(e, executed, source_nb)
  seconds = time.perf_counter() - start
  html_path = render_html(executed) if html and executed.exists() else None
  if index:
    write_index(path.parent, out_dir, heading=_index_heading(profile, out_dir))
  return NotebookResult(path.name, path, executed, html_path,
                        Path(params[OUTPUT_DIR_PARAMETER]), params, seconds,
                        failure)



# --------------------------------------------------------------------------
# The landing page: each notebook's question, its computed answer, the machine.

# What `streamidx.describe_machine()` prints: "CPU (cpu), jax 0.10.2: <mode>".
MACHINE_PATTERN = re.compile(r"\b(?:CPU|TPU|GPU|CUDA|ROCM|METAL) \([^()\n]*\), "
                             r"jax \d[\w.+-]*: [^\n]+")
_QUESTION = re.compile(r"\*\*Question\.?\*\*:?\s*(.*?)(?=\n\s*\n|\*\*Answer|\Z)", re.S)


@dataclasses.dataclass(frozen=True)
class NotebookSummary:
  """One row of the landing page, read from a notebook and its executed copy.

  status: "ok", "failed" (papermill recorded an exception), "not run"
    (no executed copy in the folder), or, while the runner is at work,
    "running" / "queued" (`write_index(pending=...)`: the folder's copy, if
    any, is not this run's and is not read). question and answer are Markdown;
    answer is None when the executed copy has no `text/markdown` output.
  html, executed: paths of the rendered notebook and the executed copy
    relative to the landing page, None when absent.
  """

  name: str
  title: str
  question: str | None
  answer: str | None
  machine: str | None
  status: str
  seconds: float | None
  finished: str | None
  parameters: str  # "" when not run
  html: str | None
  executed: str | None


def _text(value) -> str:
  return "".join(value) if isinstance(value, list) else (value or "")


def notebook_question(nb: dict) -> tuple[str, str | None]:
  """(title, question) from the first Markdown cell: its first `#` heading
  (the file's first line if none) and the paragraph after `**Question.**`."""
  first = next((_text(c.get("source")) for c in nb.get("cells", [])
                if c.get("cell_type") == "markdown"), "")
  title = next((line.lstrip("#").strip() for line in first.splitlines()
                if line.startswith("#")), "")
  found = _QUESTION.search(first)
  question = " ".join(found.group(1).split()) if found else None
  return title, question or None


def first_markdown_output(nb: dict) -> str | None:
  """The first `text/markdown` output of an executed notebook (display data
  or a cell's result; a display updated later holds its final text)."""
  for cell in nb.get("cells", []):
    for out in cell.get("outputs", []) if cell.get("cell_type") == "code" else []:
      text = out.get("data", {}).get("text/markdown")
      if text is not None:
        return _text(text)
  return None


def _balanced(line: str) -> str:
  """`line` up to the first parenthesis it did not open (a machine line
  quoted inside a sentence: "... on CPU (cpu), jax 0.10.2: ... (...)):")."""
  depth = 0
  for i, ch in enumerate(line):
    depth += {"(": 1, ")": -1}.get(ch, 0)
    if depth < 0:
      line = line[:i]
      break
  return line.rstrip(" :;,.*_`|")


def machine_line(nb: dict) -> str | None:
  """The first `describe_machine()` line the notebook printed (stream
  outputs), else the first one quoted in a text or Markdown output."""
  outputs = [o for c in nb.get("cells", []) if c.get("cell_type") == "code"
             for o in c.get("outputs", [])]
  printed = [_text(o.get("text")) for o in outputs if o.get("output_type") == "stream"]
  shown = [_text(o.get("data", {}).get(m)) for o in outputs
           for m in ("text/plain", "text/markdown")]
  for text in printed + shown:
    found = MACHINE_PATTERN.search(text)
    if found:
      return _balanced(found.group(0).strip())
  return None


def summarize(source: Path, out_dir: Path, pending: str | None = None) -> NotebookSummary:
  """The landing-page row of notebook `source`, run into `out_dir`; with
  `pending` ("running", "queued") the row of a notebook not finished yet."""
  source, out_dir = Path(source), Path(out_dir)
  executed = out_dir / source.name
  rendered = executed.with_suffix(".html")
  if pending:
    title, question = notebook_question(_read_json_notebook(source))
    return NotebookSummary(source.name, title or source.stem, question, None, None,
                           pending, None, None, "", None, None)
  nb = None
  if executed.is_file():
    try:
      nb = json.loads(executed.read_text(encoding="utf-8"))
    except (OSError, ValueError):
      nb = None
  title, question = notebook_question(nb or _read_json_notebook(source))
  meta = (nb or {}).get("metadata", {}).get("papermill", {})
  overridden = sorted(set(meta.get("parameters", {})) - {OUTPUT_DIR_PARAMETER})
  return NotebookSummary(
      name=source.name, title=title or source.stem, question=question,
      answer=first_markdown_output(nb) if nb else None,
      machine=machine_line(nb) if nb else None,
      status=("not run" if nb is None else
              "failed" if meta.get("exception") else "ok"),
      seconds=meta.get("duration"), finished=meta.get("end_time"),
      parameters=("" if nb is None else
                  f"{len(overridden)} set by the runner ({', '.join(overridden)})"
                  if overridden else "the notebook's defaults"),
      html=rendered.name if rendered.is_file() else None,
      executed=executed.name if nb is not None else None)


def markdown_to_html(text: str) -> str:
  """Markdown -> HTML with raw HTML escaped: mistune (nbconvert renders the
  notebooks with it) when installed, else the escaped text in a <pre>."""
  try:
    import mistune
  except ImportError:
    return f"<pre>{html_lib.escape(text)}</pre>"
  return mistune.create_markdown(escape=True, plugins=["table", "strikethrough"])(text)


_NOT_FINISHED = ("not run", "running", "queued")

_STYLE = """body{font-family:system-ui,sans-serif;max-width:60rem;margin:2rem auto;padding:0 1rem;
line-height:1.45;color:#222}section{border-top:1px solid #ccc;padding:.5rem 0 1rem}
h2{font-size:1.25rem;margin-bottom:.25rem}.meta{color:#555;font-size:.9rem}
.failed{color:#b00020;font-weight:bold}.answer{background:#f6f8fa;padding:.25rem 1rem;
border-left:3px solid #4a7}table{border-collapse:collapse}td,th{border:1px solid #ccc;
padding:.15rem .5rem}code{background:#eee;padding:0 .2rem}"""


def _meta(s: NotebookSummary, status: str, links: list[str]) -> str:
  items = [status] + ([f"parameters: {html_lib.escape(s.parameters)}"] if s.parameters
                      else []) + ([" · ".join(links)] if links else [])
  return "; ".join(items)


def index_html(summaries: Sequence[NotebookSummary], *, heading: str,
               note: str = "") -> str:
  """The landing page for `summaries`, a complete HTML document; `note`, if
  any, a line under the heading (how the run was made, e.g. `jobs_note`)."""
  esc = html_lib.escape
  parts = ["<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
           f"<title>{esc(heading)}</title><style>{_STYLE}</style></head><body>",
           f"<h1>{esc(heading)}</h1>"]
  if note:
    parts.append(f'<p class="meta">{esc(note)}</p>')
  parts.append("<p>Each notebook's question, and its answer as that run computed it "
               "(the notebook's first rendered Markdown output), with the machine it ran on.</p>")
  for s in summaries:
    links = [f'<a href="{esc(link, quote=True)}">{label}</a>' for link, label in
             ((s.html, "rendered notebook"), (s.executed, "executed .ipynb")) if link]
    status = (f'<span class="failed">{esc(s.status)}</span>' if s.status == "failed"
              else esc(s.status))
    timing = f", {s.seconds:.1f} s" if s.seconds is not None else ""
    finished = f", finished {esc(s.finished)}" if s.finished else ""
    parts += [f'<section id="{esc(Path(s.name).stem, quote=True)}">',
              f"<h2>{esc(s.title)} <small>({esc(s.name)})</small></h2>",
              f'<p class="meta">{_meta(s, status + timing + finished, links)}</p>',
              markdown_to_html(f"**Question.** {s.question}") if s.question
              else "<p><em>No <strong>Question.</strong> paragraph in its first Markdown cell.</em></p>"]
    if s.answer is not None:
      parts.append(f'<div class="answer">{markdown_to_html(s.answer)}</div>')
    elif s.status not in _NOT_FINISHED:
      parts.append("<p><em>The executed notebook has no Markdown output.</em></p>")
    if s.machine:
      parts.append(f'<p class="meta">Machine: {esc(s.machine)}</p>')
    elif s.status not in _NOT_FINISHED:
      parts.append('<p class="meta">Machine: not printed by this run (no '
                   "<code>streamidx.describe_machine()</code> line in its outputs)</p>")
    parts.append("</section>")
  parts.append("</body></html>")
  return "\n".join(parts) + "\n"


def write_index(notebooks_dir: str | os.PathLike, out_dir: str | os.PathLike,
                *, heading: str | None = None, note: str = "",
                pending: dict[str, str] | None = None) -> Path:
  """Writes `<out_dir>/index.html` for every notebook of `notebooks_dir`
  (those without an executed copy in `out_dir` are listed as not run; those
  `pending` names, {notebook name: "running" or "queued"}, with that status;
  `note`: a line under the heading); returns its path. Written whole to a temporary file, then renamed."""
  out_dir = Path(out_dir)
  out_dir.mkdir(parents=True, exist_ok=True)
  pending = pending or {}
  summaries = [summarize(p, out_dir, pending.get(p.name))
               for p in discover(Path(notebooks_dir))]
  page = index_html(summaries, heading=heading or f"streamidx workbook: {out_dir.name}",
                    note=note)
  path = out_dir / INDEX_NAME
  tmp = path.with_name(f".{INDEX_NAME}.{os.getpid()}.{threading.get_ident()}.tmp")
  tmp.write_text(page, encoding="utf-8")
  os.replace(tmp, path)
  return path


# --------------------------------------------------------------------------
# Command line.


def _select(notebooks: list[Path], only: Sequence[str]) -> list[Path]:
  """Notebooks named by --only: file name, stem, or the NN number."""
  if not only:
    return notebooks
  chosen, unknown = [], []
  for want in only:
    hits = [p for p in notebooks if want in (p.name, p.stem, p.name[:2])]
    if not hits:
      unknown.append(want)
    chosen += [p for p in hits if p not in chosen]
  if unknown:
    names = ", ".join(p.name for p in notebooks) or "(none)"
    raise WorkbookError(f"--only {' '.join(unknown)}: no such notebook; have {names}")
  return sorted(chosen)


def default_jobs() -> int:
  """Notebooks run at once by default: min(2, CPUs). Each runs in its own
  kernel, and most of a notebook's time is one busy core."""
  return max(1, min(2, os.cpu_count() or 1))


def expected_seconds(source: Path, out_dir: Path) -> float:
  """How long `source` is expected to run: the duration papermill recorded in
  its executed copy in `out_dir` (the previous run's), else
  `TYPICAL_SECONDS` (0 for a notebook it does not list)."""
  executed = Path(out_dir) / Path(source).name
  try:
    meta = json.loads(executed.read_text(encoding="utf-8"))["metadata"]["papermill"]
    if not meta.get("exception") and meta.get("duration"):
      return float(meta["duration"])
  except (OSError, ValueError, KeyError, TypeError):
    pass
  return float(TYPICAL_SECONDS.get(Path(source).name, 0))


def run_order(notebooks: Sequence[Path], out_dir: Path) -> list[Path]:
  """`notebooks` longest expected first (`expected_seconds`), ties in
  file-name order: with several jobs the longest does not start last."""
  seconds = {p: expected_seconds(p, out_dir) for p in notebooks}
  return sorted(notebooks, key=lambda p: (-seconds[p], p.name))


def _parser() -> argparse.ArgumentParser:
  ap = argparse.ArgumentParser(
      prog="python -m streamidx.workbook",
      description="Execute the workbook notebooks with papermill.")
  ap.add_argument("--profile", choices=PROFILES, default="default",
                  help="ci: small parameters from notebooks/ci_parameters.json; "
                       "default: the notebooks' own parameters (default)")
  ap.add_argument("--only", nargs="+", action="extend", default=[], metavar="NAME",
                  help="run only these notebooks (file name, stem or NN number)")
  ap.add_argument("--html", action="store_true",
                  help="also render each executed copy to HTML beside it")
  ap.add_argument("--out", type=Path, default=None, metavar="DIR",
                  help="folder for executed copies (default: build/ci or build/workbook)")
  ap.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_S, metavar="S",
                  help=f"seconds each cell may run (default {DEFAULT_TIMEOUT_S})")
  ap.add_argument("--notebooks", type=Path, default=Path("notebooks"), metavar="DIR",
                  help="the notebooks folder (default: ./notebooks)")
  ap.add_argument("--jobs", "-j", type=int, default=default_jobs(), metavar="N",
                  help="notebooks run at once, longest expected first (default "
                       f"{default_jobs()}: min(2, CPUs)); timings the notebooks print "
                       "then ran beside another notebook: use --jobs 1 to time")
  ap.add_argument("-v", "--verbose", action="store_true",
                  help="log the notebooks' output while they run")
  return ap


def main(argv: Sequence[str] | None = None) -> int:
  args = _parser().parse_args(argv)
  notebooks_dir = args.notebooks.resolve()
  out_dir = (args.out or notebooks_dir.parent / PROFILE_OUT[args.profile]).resolve()
  if args.verbose:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
  try:
    if not notebooks_dir.is_dir():
      raise WorkbookError(f"{notebooks_dir}: no such folder")
    notebooks = discover(notebooks_dir)
    if args.profile == "ci":
      load_ci_parameters(notebooks_dir)  # whole-file check, before any run
    selected = _select(notebooks, args.only)
    for nb in selected:
      parameters_for(nb, args.profile, out_dir)
    if args.jobs < 1:
      raise WorkbookError(f"--jobs: must be at least 1 (got {args.jobs})")
  except WorkbookError as e:
    print(f"workbook: error: {e}", file=sys.stderr)
    return 2
  if not selected:
    print(f"workbook: no notebooks matching {NOTEBOOK_GLOB} in {notebooks_dir}")
    return 0
  warning = _kernel_warning()
  if warning:
    print(f"workbook: warning: {warning}", file=sys.stderr)

  jobs = min(args.jobs, len(selected))
  print(f"workbook: {len(selected)} notebook(s), profile {args.profile}, "
        f"cell timeout {args.timeout:g}s, {jobs} at a time -> {out_dir}", flush=True)
  order = run_order(selected, out_dir)  # before any run removes a stale copy
  heading, note = _index_heading(args.profile, out_dir), jobs_note(jobs)
  results = {}
  start = time.perf_counter()

  def run(nb: Path) -> NotebookResult:
    if args.verbose:
      print(f"--- {nb.name}", flush=True)
    return run_notebook(nb, args.profile, out_dir, args.timeout, html=args.html,
                        log_output=args.verbose, index=False)

  def pending(done: dict) -> dict[str, str]:
    left = [nb for nb in order if nb not in done]
    return {nb.name: "running" if i < jobs else "queued" for i, nb in enumerate(left)}

  write_index(notebooks_dir, out_dir, heading=heading, note=note, pending=pending(results))
  with concurrent.futures.ThreadPoolExecutor(max_workers=jobs) as pool:
    futures = [pool.submit(run, nb) for nb in order]
    try:
      for future in concurrent.futures.as_completed(futures):
        result = future.result()
        results[result.source] = result
        # The one writer of the landing page, after each notebook finishes.
        write_index(notebooks_dir, out_dir, heading=heading, note=note,
                    pending=pending(results))
        print(result.line(), flush=True)
    except BaseException:  # Ctrl-C, or a runner error: start nothing more
      for future in futures:
        future.cancel()
      raise
  results = [results[nb] for nb in selected]  # notebook order from here on
  failed = [r for r in results if not r.ok]
  for r in failed:
    print(f"\n{r.describe()}")
  print(f"\nworkbook: {time.perf_counter() - start:.1f}s; " + (f"{note} " if note else "") +
        f"executed copies in {out_dir}; landing page {out_dir / INDEX_NAME}")
  print(f"{len(results) - len(failed)} passed, {len(failed)} failed")
  return 1 if failed else 0


if __name__ == "__main__":
  sys.exit(main())
