"""Runs the workbook's notebooks (`notebooks/NN_*.ipynb`) with papermill:
`python -m streamidx.workbook --help`; what it writes and in what order it
runs: docs/workbook.md. A configuration error is a `WorkbookError` before
anything runs (exit 2); a failed notebook is reported with its cell (exit 1).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import dataclasses
import functools
import html as html_lib
import json
import logging
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Sequence

from streamidx.lab import params as params_lib

NOTEBOOK_GLOB = "[0-9][0-9]_*.ipynb"
OUTPUT_DIR_PARAMETER = "output_dir"
KERNEL_NAME = "python3"
PROFILES = ("ci", "default")
PROFILE_OUT = {"ci": Path("build") / "ci", "default": Path("build") / "workbook"}
DEFAULT_TIMEOUT_S = 600
DEFAULT_JOBS = max(1, min(2, os.cpu_count() or 1))  # notebooks at once
INJECTED_TAG = "injected-parameters"
INDEX_NAME = "index.html"
# The notebooks longest first at their defaults on an idle 2-core CPU
# (2026-12-01): the order the runner starts them in (`run_order`).
LONGEST_FIRST = ("04_recall_parity", "06_compiled_variants", "02_fp8_packing",
                 "08_tpu_profiling", "09_multichip", "05_kernel_tiling",
                 "01_cache_layout", "03_kernel_walkthrough", "07_topk_selection",
                 "00_quickstart")
# What `streamidx.describe_machine()` prints: "CPU (cpu), jax 0.10.2: <mode>".
MACHINE_PATTERN = re.compile(r"\b(?:CPU|TPU|GPU|CUDA|ROCM|METAL) \([^()\n]*\), "
                             r"jax \d[\w.+-]*: [^\n]+")
_QUESTION = re.compile(r"\*\*Question\.?\*\*:?\s*(.*?)(?=\n\s*\n|\*\*Answer|\Z)", re.S)


class WorkbookError(Exception):
  """A configuration error: raised before any notebook runs."""


@dataclasses.dataclass(frozen=True)
class CellFailure:
  """Where a notebook failed (None: the injected cell or outside any cell)."""

  cell_index: int | None  # into the SOURCE notebook's cells
  code_cell: int | None  # 1-based among its code cells
  exec_count: int | None  # `In [n]` of the copy
  ename: str
  evalue: str
  source: str
  injected: bool = False

  def where(self) -> str:
    if self.injected:
      return "the injected parameters cell"
    if self.cell_index is None:
      return "no cell (the kernel failed outside any cell)"
    count = self.exec_count if self.exec_count is not None else " "
    return f"code cell {self.code_cell} (cells[{self.cell_index}], In [{count}])"

  def describe(self) -> str:
    src = self.source.strip().splitlines()
    more = [f"    | ... ({len(src) - 8} more lines)"] if len(src) > 8 else []
    return "\n".join([f"{self.where()}: {self.ename}: {self.evalue}".rstrip(": ")]
                     + [f"    | {line}" for line in src[:8]] + more)


@dataclasses.dataclass(frozen=True)
class NotebookResult:
  """The outcome of one notebook run."""

  name: str
  source: Path
  executed: Path
  parameters: dict[str, Any]
  seconds: float
  failure: CellFailure | None

  ok = property(lambda self: self.failure is None)

  def line(self) -> str:
    return f"{self.name:<44} {self.seconds:8.1f}s  {'ok' if self.ok else 'FAILED'}"

  def describe(self) -> str:
    if self.ok:
      return f"{self.name}: ok in {self.seconds:.1f}s -> {self.executed}"
    log = kernel_log(self.executed)
    return (f"{self.name} FAILED at {self.failure.describe()}\n"
            f"    executed copy: {self.executed}" +
            (f"\n    kernel log: {log}" if log.is_file() and log.stat().st_size else ""))


# --------------------------------------------------------------------------
# Notebooks and their parameters.

def _text(value) -> str:
  return "".join(value) if isinstance(value, list) else (value or "")


def _read(path: Path) -> dict:
  try:
    return json.loads(Path(path).read_text(encoding="utf-8"))
  except (OSError, ValueError) as e:
    raise WorkbookError(f"{path}: cannot read notebook: {e}") from e


def discover(notebooks_dir: Path) -> list[Path]:
  """The workbook's notebooks, `NN_*.ipynb`, in file-name order."""
  return sorted(Path(notebooks_dir).glob(NOTEBOOK_GLOB))


parameters_cell_index = params_lib.parameters_cell_index


def declarations(path: Path) -> params_lib.Declarations:
  """The notebook's `parameters` cell, parsed (`params.declarations`)."""
  try:
    return params_lib.declarations(Path(path))
  except (params_lib.ParameterError, SyntaxError) as e:
    raise WorkbookError(f"{Path(path).name}: {e}") from e


def parameters_for(path: Path, profile: str, out_dir: Path) -> dict[str, Any]:
  """What a run of `path` under `profile` passes to papermill."""
  if profile not in PROFILES:
    raise WorkbookError(f"unknown profile {profile!r}; expected one of {PROFILES}")
  decl = declarations(Path(path))
  if OUTPUT_DIR_PARAMETER not in decl.parameters:
    raise WorkbookError(f"{Path(path).name}: its parameters cell must declare "
                        f"{OUTPUT_DIR_PARAMETER!r}")
  ci = decl.ci() if profile == "ci" else {}
  if OUTPUT_DIR_PARAMETER in ci:
    raise WorkbookError(f"{Path(path).name}: gives {OUTPUT_DIR_PARAMETER!r} a ci: "
                        "value; the runner owns it")
  return {**ci, OUTPUT_DIR_PARAMETER: str((Path(out_dir) / Path(path).stem).resolve())}


# --------------------------------------------------------------------------
# Running.

def _cell(source_nb: dict, index: int, exec_count, ename, evalue, source) -> CellFailure:
  code_cell = sum(1 for c in source_nb["cells"][:index + 1] if c.get("cell_type") == "code")
  return CellFailure(index, code_cell, exec_count, ename, evalue, source)


def _failure_from(exc: BaseException, executed: Path, source_nb: dict) -> CellFailure:
  """Where the run failed: a cell error (papermill's index counts its
  injected cell), else a timeout or a dead kernel (the last started cell)."""
  if hasattr(exc, "cell_index"):
    injected = parameters_cell_index(source_nb) + 1
    if exc.cell_index == injected:
      return CellFailure(None, None, exc.exec_count, exc.ename, exc.evalue, exc.source, True)
    return _cell(source_nb, exc.cell_index - (exc.cell_index > injected), exc.exec_count,
                 exc.ename, exc.evalue, exc.source)
  ename, evalue = type(exc).__name__, (str(exc).strip().splitlines() or [""])[0][:300]
  try:
    cells = json.loads(executed.read_text(encoding="utf-8"))["cells"]
  except (OSError, ValueError, KeyError):
    cells = []
  started = [i for i, c in enumerate(cells)
             if c.get("metadata", {}).get("papermill", {}).get("start_time")]
  if not started:
    return CellFailure(None, None, None, ename, evalue, "")
  i = started[-1]
  count, source = cells[i].get("execution_count"), _text(cells[i].get("source"))
  injected = [INJECTED_TAG in c.get("metadata", {}).get("tags", []) for c in cells[:i + 1]]
  if injected[-1]:
    return CellFailure(None, None, count, ename, evalue, source, True)
  return _cell(source_nb, i - sum(injected), count, ename, evalue, source)


TITLE = "streamidx workbook"


def _profile_note(profile: str, out_dir: Path) -> str:
  """What the landing page says about the run under its title."""
  what = ("CI-sized parameters (each parameters cell's ci: values)"
          if profile == "ci" else "the notebooks' default parameters")
  return f"Run with {what}; executed copies in {Path(out_dir).name}/."


def kernel_log(executed: Path) -> Path:
  """Where the run's kernel writes its stdout and stderr."""
  return executed.with_suffix(".kernel.log")


TRANSPORTS = ("auto", "tcp", "ipc")


def kernel_transport(transport: str = "auto") -> str:
  """How the runner talks to a notebook's kernel: "tcp" (ZeroMQ over
  loopback ports) or "ipc" (Unix sockets, where no TCP socket can be
  opened); "auto": "tcp" if a loopback connection can be made."""
  if transport not in TRANSPORTS:
    raise WorkbookError(f"--transport: must be one of {TRANSPORTS} (got "
                        f"{transport!r})")
  if transport != "auto":
    return transport
  import socket  # pylint: disable=g-import-not-at-top
  try:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as server:
      server.bind(("127.0.0.1", 0))
      server.listen(1)
      socket.create_connection(server.getsockname(), timeout=2).close()
    return "tcp"
  except OSError:
    return "ipc"


# An ipc kernel: ipykernel without its IOPub pipe, a PULL socket it binds on
# tcp://127.0.0.1 at start for forked subprocesses' output. Where no AF_INET
# socket opens (the TPU host), libzmq aborts the kernel there: "Address
# family not supported by protocol (src/ip_resolver.cpp:542)".
IPC_KERNEL = ("from ipykernel import iostream, kernelapp; "
              "iostream.IOPubThread._setup_pipe_in = "
              "lambda self: setattr(self, '_pipe_flag', False); "
              "kernelapp.launch_new_instance()")


def _logged_kernel_manager(log: Path, transport: str = "tcp"):
  """Kernels that write their own stdout and stderr to `log` (docs/workbook.md),
  over `transport` ("ipc": Unix sockets in a fresh temporary folder, the
  kernel started as `IPC_KERNEL`)."""
  from jupyter_client.manager import AsyncKernelManager

  class LoggedKernelManager(AsyncKernelManager):
    def __init__(self, **kw):
      super().__init__(**kw)
      if transport == "ipc":
        self.transport = "ipc"
        self.ip = os.path.join(tempfile.mkdtemp(prefix="streamidx-kernel-"),
                               "kernel")

    def format_kernel_cmd(self, extra_arguments=None):
      cmd = super().format_kernel_cmd(extra_arguments)
      if transport != "ipc":
        return cmd
      return [sys.executable, "-c", IPC_KERNEL] + cmd[cmd.index("-f"):]

    async def start_kernel(self, **kw):
      with open(log, "ab") as f:  # the kernel holds its own descriptor
        await super().start_kernel(stdout=f, stderr=f, **kw)

  return LoggedKernelManager


def _declared_only(record: logging.LogRecord) -> bool:
  return not record.getMessage().startswith("Passed unknown parameter")


def _quiet_logs() -> None:
  """Silences papermill's warnings about the parameters cell (it cannot read a
  rule's `>=`) and closing kernels' asyncio noise."""
  logging.getLogger("papermill.translators").setLevel(logging.ERROR)
  logging.getLogger("papermill").addFilter(_declared_only)
  logging.getLogger("asyncio").setLevel(logging.CRITICAL)


def _html_exporter():
  """nbconvert's HTML exporter; WorkbookError where it cannot start (its
  templates are data files: a `pip install --target DIR` puts them in
  DIR/share/jupyter, which JUPYTER_PATH must then name)."""
  try:
    from nbconvert import HTMLExporter  # pylint: disable=g-import-not-at-top
    return HTMLExporter()
  except Exception as e:  # noqa: BLE001 - ImportError, missing templates
    raise WorkbookError(f"--html: nbconvert cannot render ({type(e).__name__}: "
                        f"{str(e).splitlines()[0]}); where it was installed with "
                        "pip --target DIR, set JUPYTER_PATH=DIR/share/jupyter") from None


def run_notebook(path: str | os.PathLike, profile: str = "ci",
                 out_dir: str | os.PathLike | None = None,
                 timeout: float = DEFAULT_TIMEOUT_S, *, html: bool = False,
                 index: bool = True,
                 transport: str = "auto") -> NotebookResult:
  """Executes one notebook with papermill (`parameters_for`) into `out_dir`
  (default: the profile's build folder); `index`: rewrite the landing page
  after it; `transport`: the kernel's (`kernel_transport`)."""
  path = Path(path).resolve()
  if not path.is_file():
    raise WorkbookError(f"{path}: no such notebook")
  out_dir = Path(out_dir or path.parent.parent / PROFILE_OUT.get(
      profile, Path("build") / profile)).resolve()
  params = parameters_for(path, profile, out_dir)
  executed = out_dir / path.name
  if executed == path:
    raise WorkbookError(f"{path}: output folder is the notebooks folder")
  Path(params[OUTPUT_DIR_PARAMETER]).mkdir(parents=True, exist_ok=True)
  source_nb = _read(path)
  from streamidx.lab.plots import HEADLINE_FILE  # pylint: disable=g-import-not-at-top
  for stale in (executed, executed.with_suffix(".html"), kernel_log(executed),
                Path(params[OUTPUT_DIR_PARAMETER]) / HEADLINE_FILE):
    stale.unlink(missing_ok=True)  # a stale copy (or headline) would pass for this run's
  import papermill
  _quiet_logs()
  failure, start = None, time.perf_counter()
  try:
    papermill.execute_notebook(
        str(path), str(executed), parameters=params, kernel_name=KERNEL_NAME,
        language="python", cwd=str(path.parent), execution_timeout=timeout,
        progress_bar=False,
        kernel_manager_class=_logged_kernel_manager(
            kernel_log(executed), kernel_transport(transport)))
  except Exception as e:  # noqa: BLE001 - cell errors, timeouts, dead kernels
    failure = _failure_from(e, executed, source_nb)
  seconds = time.perf_counter() - start
  if executed.exists():
    import nbformat
    copy = nbformat.read(str(executed), as_version=4)
    if rebase_notebook(copy, path.parent, out_dir):  # its links resolve from out_dir
      nbformat.write(copy, str(executed))
    if html:  # rendered beside the executed copy
      body, _ = _html_exporter().from_notebook_node(copy)
      executed.with_suffix(".html").write_text(body, encoding="utf-8")
  if index:
    write_index(path.parent, out_dir, heading=TITLE, note=_profile_note(profile, out_dir))
  return NotebookResult(path.name, path, executed, params, seconds, failure)


# --------------------------------------------------------------------------
# The landing page: each notebook's question, its computed answer, the machine.

def notebook_question(nb: dict) -> tuple[str, str | None]:
  """(title, question) from the first Markdown cell: its first `#` heading
  and the paragraph after `**Question.**`."""
  first = next((_text(c.get("source")) for c in nb.get("cells", [])
                if c.get("cell_type") == "markdown"), "")
  title = next((line.lstrip("#").strip() for line in first.splitlines()
                if line.startswith("#")), "")
  found = _QUESTION.search(first)
  return title, (" ".join(found.group(1).split()) or None) if found else None


def _outputs(nb: dict) -> list[dict]:
  return [o for c in nb.get("cells", []) if c.get("cell_type") == "code"
          for o in c.get("outputs", [])]


def first_markdown_output(nb: dict) -> str | None:
  """The first `text/markdown` output of an executed notebook."""
  return next((_text(o["data"]["text/markdown"]) for o in _outputs(nb)
               if "text/markdown" in o.get("data", {})), None)


def machine_line(nb: dict) -> str | None:
  """The first `describe_machine()` line in the notebook's outputs (cut at
  the first parenthesis it did not open)."""
  outputs = _outputs(nb)
  texts = ([_text(o.get("text")) for o in outputs if o.get("output_type") == "stream"]
           + [_text(o.get("data", {}).get(m)) for o in outputs
              for m in ("text/plain", "text/markdown")])
  for found in filter(None, map(MACHINE_PATTERN.search, texts)):
    line, depth = found.group(0).strip(), 0
    for i, ch in enumerate(line):
      depth += {"(": 1, ")": -1}.get(ch, 0)
      if depth < 0:
        line = line[:i]
        break
    return line.rstrip(" :;,.*_`|")
  return None


def markdown_to_html(text: str) -> str:
  """Markdown -> HTML with raw HTML escaped (mistune, nbconvert's own)."""
  import mistune
  return mistune.create_markdown(escape=True, plugins=["table", "strikethrough"])(text)


_STYLE = """body{font-family:system-ui,sans-serif;max-width:80rem;margin:2rem auto;padding:0 1rem;
line-height:1.45;color:#222}section{border-top:1px solid #ccc;padding:.5rem 0 1rem}
h2{font-size:1.25rem;margin-bottom:.25rem}.meta{color:#555;font-size:.9rem}
.failed{color:#b00020;font-weight:bold}.answer{background:#f6f8fa;padding:.25rem 1rem;
border-left:3px solid #4a7}table{border-collapse:collapse}td,th{border:1px solid #ccc;
padding:.15rem .5rem}code{background:#eee;padding:0 .2rem}.result{display:flex;gap:1rem;
align-items:flex-start;flex-wrap:wrap}.result .answer{flex:1 1 30rem;min-width:0;overflow-x:auto}
figure{flex:1 1 30rem;margin:0}figure img{width:100%;border:1px solid #ddd}
figcaption{color:#555;font-size:.85rem}figure.step{max-width:56rem;margin:1rem 0}"""


_RELATIVE_LINK = re.compile(r"\]\((?![a-z][a-z0-9+.-]*:|#|/)([^)\s]+)\)")


def rebase_links(markdown: str, notebooks_dir: Path, out_dir: Path) -> str:
  """`markdown` written for the notebooks folder, its relative links resolving from `out_dir`."""
  return _RELATIVE_LINK.sub(lambda m: "](" + Path(os.path.relpath(
      Path(notebooks_dir) / m.group(1).split("#")[0], out_dir)).as_posix()
      + ("#" + m.group(1).split("#", 1)[1] if "#" in m.group(1) else "") + ")", markdown)


def rebase_notebook(nb, notebooks_dir: Path, out_dir: Path) -> int:
  """`rebase_links` of an executed copy `nb`'s (an nbformat node) Markdown cells and outputs,
  in place; how many texts changed."""
  changed = 0
  for cell in nb.cells:
    texts = [cell] if cell.cell_type == "markdown" else []
    holders = [o["data"] for o in cell.get("outputs", []) if "text/markdown" in o.get("data", {})]
    for holder, key in [(c, "source") for c in texts] + [(d, "text/markdown") for d in holders]:
      new = rebase_links(_text(holder[key]), notebooks_dir, out_dir)
      if new != _text(holder[key]):
        holder[key], changed = new, changed + 1
  return changed


def numbered_title(title: str, name: str) -> str:
  """A notebook's title as the landing page shows it: "NN · title", NN its file's number."""
  rest = re.sub(r"^\d+\s*[·.:-]\s*", "", title).strip()
  return f"{name[:2]} · {rest}" if rest else name[:2]


def headline_figure(out_dir: Path, stem: str) -> str | None:
  """The notebook's headline figure (`plots.save(..., headline=True)`), relative to `out_dir`."""
  from streamidx.lab.plots import HEADLINE_FILE  # pylint: disable=g-import-not-at-top
  try:
    name = json.loads((Path(out_dir) / stem / HEADLINE_FILE).read_text(encoding="utf-8"))["figure"]
  except (OSError, ValueError, KeyError, TypeError):
    return None
  return f"{stem}/{name}" if (Path(out_dir) / stem / name).is_file() else None


def _section(source: Path, out_dir: Path, pending: str | None) -> str:
  """The landing page's section for `source` (its copy unread while `pending`)."""
  esc, executed = html_lib.escape, out_dir / source.name
  rendered, nb = executed.with_suffix(".html"), None
  if not pending and executed.is_file():
    try:
      nb = json.loads(executed.read_text(encoding="utf-8"))
    except (OSError, ValueError):
      nb = None
  title, question = notebook_question(nb or _read(source))
  meta = (nb or {}).get("metadata", {}).get("papermill", {})
  status = pending or ("not run" if nb is None else "failed" if meta.get("exception") else "ok")
  items = [('<span class="failed">failed</span>' if status == "failed" else esc(status))
           + (f", {meta['duration']:.1f} s" if meta.get("duration") is not None else "")
           + (f", finished {esc(meta['end_time'])}" if meta.get("end_time") else "")]
  if nb is not None:
    set_ = sorted(set(meta.get("parameters", {})) - {OUTPUT_DIR_PARAMETER})
    items.append("parameters: " + esc(f"{len(set_)} set by the runner ({', '.join(set_)})"
                                      if set_ else "the notebook's defaults"))
    items.append(" · ".join(f'<a href="{esc(f.name, quote=True)}">{label}</a>' for f, label in
                            ((rendered, "rendered notebook"), (executed, "executed .ipynb"))
                            if f.is_file()))
  if nb is None and question:  # the source's words, written for the notebooks folder
    question = rebase_links(question, source.parent, out_dir)
  parts = [f'<section id="{esc(source.stem, quote=True)}">',
           f"<h2>{esc(numbered_title(title or source.stem, source.name))} "
           f"<small>({esc(source.name)})</small></h2>",
           f'<p class="meta">{"; ".join(items)}</p>',
           markdown_to_html(f"**Question.** {question}") if question else
           "<p><em>No <strong>Question.</strong> paragraph in its first Markdown cell.</em></p>"]
  if nb is not None:
    answer, machine = first_markdown_output(nb), machine_line(nb)
    figure = headline_figure(out_dir, source.stem)
    block = (f'<div class="answer">{markdown_to_html(answer)}</div>'  # the copy's links: rebased
             if answer is not None
             else "<p><em>The executed notebook has no Markdown output.</em></p>")
    if figure:
      block += (f'<figure><a href="{esc(figure, quote=True)}"><img src="{esc(figure, quote=True)}" '
                f'alt="headline figure of {esc(source.stem, quote=True)}"></a>'
                f"<figcaption>Headline figure of this run ({esc(figure)})</figcaption></figure>")
    parts.append(f'<div class="result">{block}</div>')
    parts.append(f'<p class="meta">Machine: {esc(machine)}</p>' if machine else
                 '<p class="meta">Machine: not printed by this run (no '
                 "<code>streamidx.describe_machine()</code> line in its outputs)</p>")
  return "\n".join(parts + ["</section>"])


# --------------------------------------------------------------------------
# The workbook's headline: the DeepSeek-V4 decode step on v5e per variant and
# top-k method, measured (the chip records) where a chip ran it, else the model.

STEP_CHIP = "v5e"
STEP_SHAPE = "dsv4-decode-64x1048576"  # a point of the records (lab.bench.record.POINTS)
STEP_VARIANTS = ("vendored", "dense", "lean", "fp4")
STEP_METHODS = ("sort", "blocktop")
STEP_FIGURE = "step_v5e.png"  # beside index.html


def step_rows(calls: Sequence[dict]) -> tuple[dict, bool]:
  """({"variant + method": the step}, measured?): each newest of `calls`
  (`records.calls(chip=STEP_CHIP, shape=STEP_SHAPE)`) its parts {part: seconds}; without
  any, the model's step at that shape (`roofline.indexer_step`, a `StepBound`)."""
  newest = {f"{c['variant']} + {c['method']}": c["parts"] for c in calls
            if c["variant"] in STEP_VARIANTS and c["method"] in STEP_METHODS}
  if newest:
    return newest, True
  from streamidx.lab.model import roofline  # pylint: disable=g-import-not-at-top
  from streamidx.lab.shapes import DSV4  # pylint: disable=g-import-not-at-top
  tokens = int(STEP_SHAPE.rsplit("x", 1)[1])
  return {f"{v} + {m}": roofline.indexer_step(STEP_CHIP, DSV4, k=512, variant=v, batch=64,
                                              context_tokens=tokens, method=m)
          for v in STEP_VARIANTS for m in STEP_METHODS}, False


def step_figure(path: str | os.PathLike) -> str:
  """Draws the workbook's headline (`step_rows` of the chip records) to `path`; its caption."""
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  from streamidx import records  # pylint: disable=g-import-not-at-top
  from streamidx.lab import plots  # pylint: disable=g-import-not-at-top
  calls = records.calls(chip=STEP_CHIP, shape=STEP_SHAPE)
  steps, measured = step_rows(calls)
  unchecked = sum(1 for c in calls if (c["check"] or {}).get("ok") is None)
  total = {label: (f"{sum(s or 0.0 for s in step.values()) * 1e3:,.2f} ms" if measured else
                   f"{'at least ' if step.at_least else ''}{step.total_s * 1e3:,.2f} ms")
           for label, step in steps.items()}
  key, vkey = "lean + blocktop", "vendored + sort"
  versus = (f"lean + blocktop {total[key]} against the vendored pipeline (vendored + sort) "
            f"{total[vkey]}" if key in total and vkey in total
            else "lean + blocktop or the vendored pipeline: not recorded")
  what = (f"measured on a TPU {STEP_CHIP} (device time, the chip records)" if measured else
          "THE MODEL, not a measurement: no chip measurement is recorded\n"
          "(`python -m streamidx.bench --record` on a TPU writes it); hatched: a floor (no compiled count)")
  fig = plots.step_stages_figure(steps, unit="ms", title=(
      f"DeepSeek-V4 decode step on {STEP_CHIP}, 64 x 1M tokens, k 512, per variant and top-k "
      f"method\n{what}\n{versus}"))
  fig.savefig(path, dpi=110, bbox_inches="tight")
  plt.close(fig)
  return (f"The step per variant and top-k method on {STEP_CHIP} at {STEP_SHAPE}, "
          + ("measured (device time by the profiler, from the chip records). " if measured else
             "by the model (`roofline.dsv4_step`: HBM bytes and compiled bundles at the chip's clock; "
             "hatched: a floor where a stage has no compiled count): no chip measurement is recorded "
             "(`python -m streamidx.bench --record` on a TPU writes it). ") + versus + "."
          + (f" {unchecked} of the {len(calls)} calls at that shape were timed but not checked against "
             "the reference (the f32 keys do not fit beside their cache; docs/chip.md)." if unchecked else ""))


_STEP_CHILD = ("import json, sys; from streamidx.lab import workbook; "
               "print(json.dumps(workbook.step_figure(sys.argv[1])))")


@functools.lru_cache(maxsize=1)
def _step_png() -> tuple[bytes | None, str]:
  """(the headline's PNG, its caption), drawn once per process in a child that sees the CPU
  only (the notebooks' kernels need the TPU); (None, why) if it failed."""
  with tempfile.TemporaryDirectory() as d:
    png = Path(d) / STEP_FIGURE
    r = subprocess.run([sys.executable, "-c", _STEP_CHILD, str(png)], capture_output=True,
                       text=True, timeout=600, env=dict(os.environ, JAX_PLATFORMS="cpu"), check=False)
    if r.returncode or not png.is_file():
      why = (r.stderr.strip().splitlines() or ["no output"])[-1][:300]
      return None, f"The step figure was not drawn: {why}"
    return png.read_bytes(), json.loads(r.stdout.strip().splitlines()[-1])


def _step_section(out_dir: Path) -> str:
  """The landing page's headline figure, written beside index.html."""
  png, caption = _step_png()
  if png is None:
    return f'<p class="meta">{html_lib.escape(caption)}</p>'
  (out_dir / STEP_FIGURE).write_bytes(png)
  return (f'<figure class="step"><img src="{STEP_FIGURE}" alt="the step on {STEP_CHIP} per variant '
          f'and method"><figcaption>{markdown_to_html(caption)}</figcaption></figure>')


def write_index(notebooks_dir: str | os.PathLike, out_dir: str | os.PathLike, *,
                heading: str | None = None, note: str = "",
                pending: dict[str, str] | None = None) -> Path:
  """Writes `<out_dir>/index.html` for every notebook of `notebooks_dir` (`pending`: {name:
  "running" or "queued"}); its path."""
  out_dir, esc = Path(out_dir), html_lib.escape
  out_dir.mkdir(parents=True, exist_ok=True)
  heading = heading or TITLE
  page = ["<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
          f"<title>{esc(heading)}</title><style>{_STYLE}</style></head><body>",
          f"<h1>{esc(heading)}</h1>"] + ([f'<p class="meta">{esc(note)}</p>'] if note else [])
  page.append("<p>Each notebook's question, and its answer as that run computed it (the "
              "notebook's first rendered Markdown output) beside its headline figure, with the "
              "machine it ran on.</p>")
  page.append(_step_section(out_dir))
  page += [_section(p, out_dir, (pending or {}).get(p.name)) for p in discover(Path(notebooks_dir))]
  path = out_dir / INDEX_NAME
  tmp = path.with_name(f".{INDEX_NAME}.{os.getpid()}.{threading.get_ident()}.tmp")
  tmp.write_text("\n".join(page + ["</body></html>"]) + "\n", encoding="utf-8")
  os.replace(tmp, path)
  return path


# --------------------------------------------------------------------------
# Command line.

def _select(notebooks: list[Path], only: Sequence[str]) -> list[Path]:
  """Notebooks named by --only: file name, stem, or the NN number."""
  if not only:
    return notebooks
  unknown = [w for w in only if not any(w in (p.name, p.stem, p.name[:2]) for p in notebooks)]
  if unknown:
    names = ", ".join(p.name for p in notebooks) or "(none)"
    raise WorkbookError(f"--only {' '.join(unknown)}: no such notebook; have {names}")
  return [p for p in notebooks if {p.name, p.stem, p.name[:2]} & set(only)]


def run_order(notebooks: Sequence[Path]) -> list[Path]:
  """`notebooks` in `LONGEST_FIRST`'s order, any it does not list after them
  in file-name order."""
  rank = {stem: i for i, stem in enumerate(LONGEST_FIRST)}
  return sorted(notebooks, key=lambda p: (rank.get(p.stem, len(rank)), p.name))


def main(argv: Sequence[str] | None = None) -> int:
  ap = argparse.ArgumentParser(prog="python -m streamidx.workbook",
                               description="Execute the workbook notebooks with papermill.")
  ap.add_argument("--profile", choices=PROFILES, default="default",
                  help="ci: each parameter's ci: value; default: the notebooks' own (default)")
  ap.add_argument("--only", nargs="+", action="extend", default=[], metavar="NAME",
                  help="run only these notebooks (file name, stem or NN number)")
  ap.add_argument("--html", action="store_true", help="also render each executed copy to HTML")
  ap.add_argument("--out", type=Path, default=None, metavar="DIR",
                  help="folder for executed copies (default: build/ci or build/workbook)")
  ap.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_S, metavar="S",
                  help=f"seconds each cell may run (default {DEFAULT_TIMEOUT_S})")
  ap.add_argument("--notebooks", type=Path, default=Path("notebooks"), metavar="DIR",
                  help="the notebooks folder (default: ./notebooks)")
  ap.add_argument("--jobs", "-j", type=int, default=DEFAULT_JOBS, metavar="N",
                  help=f"notebooks at once, longest first (default {DEFAULT_JOBS}); "
                       "use --jobs 1 to time")
  ap.add_argument("--transport", choices=TRANSPORTS, default="auto",
                  help="the kernels' ZeroMQ transport (default auto: tcp, or "
                  "ipc where no loopback TCP socket can be opened, as on a "
                  "TPU host that allows none)")
  args = ap.parse_args(argv)
  notebooks_dir = args.notebooks.resolve()
  out_dir = (args.out or notebooks_dir.parent / PROFILE_OUT[args.profile]).resolve()
  try:
    if not notebooks_dir.is_dir():
      raise WorkbookError(f"{notebooks_dir}: no such folder")
    selected = _select(discover(notebooks_dir), args.only)
    for nb in selected:
      parameters_for(nb, args.profile, out_dir)
    if args.jobs < 1:
      raise WorkbookError(f"--jobs: must be at least 1 (got {args.jobs})")
    if args.html:
      _html_exporter()
  except WorkbookError as e:
    print(f"workbook: error: {e}", file=sys.stderr)
    return 2
  if not selected:
    print(f"workbook: no notebooks matching {NOTEBOOK_GLOB} in {notebooks_dir}")
    return 0
  jobs = min(args.jobs, len(selected))
  print(f"workbook: {len(selected)} notebook(s), profile {args.profile}, cell timeout "
        f"{args.timeout:g}s, {jobs} at a time -> {out_dir}", flush=True)
  order = run_order(selected)
  heading = TITLE
  note = "" if jobs <= 1 else (f"Run {jobs} notebooks at a time: the timings they print ran "
                               "beside another notebook (--jobs 1 for timing studies).")
  results: dict[Path, NotebookResult] = {}
  start = time.perf_counter()

  def run(nb: Path) -> NotebookResult:
    return run_notebook(nb, args.profile, out_dir, args.timeout, html=args.html,
                        index=False,
                        transport=args.transport)

  def index() -> None:  # the one writer of the landing page, in this thread
    left = [nb for nb in order if nb not in results]
    write_index(notebooks_dir, out_dir, heading=heading,
                note=" ".join(filter(None, [_profile_note(args.profile, out_dir), note])), pending={
        nb.name: "running" if i < jobs else "queued" for i, nb in enumerate(left)})

  index()
  with concurrent.futures.ThreadPoolExecutor(max_workers=jobs) as pool:
    futures = [pool.submit(run, nb) for nb in order]
    try:
      for future in concurrent.futures.as_completed(futures):
        result = future.result()
        results[result.source] = result
        index()
        print(result.line(), flush=True)
    except BaseException:  # Ctrl-C, or a runner error: start nothing more
      for future in futures:
        future.cancel()
      raise
  failed = [results[nb] for nb in selected if not results[nb].ok]
  for r in failed:
    print(f"\n{r.describe()}")
  print(f"\nworkbook: {time.perf_counter() - start:.1f}s; " + (f"{note} " if note else "") +
        f"executed copies in {out_dir}; landing page {out_dir / INDEX_NAME}")
  print(f"{len(selected) - len(failed)} passed, {len(failed)} failed")
  return 1 if failed else 0


if __name__ == "__main__":
  sys.exit(main())
