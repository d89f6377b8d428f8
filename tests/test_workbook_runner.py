"""Tests of the notebook runner (streamidx.workbook) on throwaway notebooks.

Each papermill run starts a kernel (a couple of seconds), so the runs are few:
a passing and a failing notebook through the command line, one with the ci:
values of its parameters cell injected, one that times out. Configuration
errors need no kernel.
"""

from __future__ import annotations

import json
from pathlib import Path

import nbformat
import pytest

from streamidx.lab import workbook


def make_notebook(folder: Path, name: str, params: str, *code: str) -> Path:
  """Writes notebooks/NAME: a markdown cell, the parameters cell, then code."""
  nb = nbformat.v4.new_notebook()
  nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3",
                               "language": "python"}
  nb.cells.append(nbformat.v4.new_markdown_cell(f"# {name}"))
  cell = nbformat.v4.new_code_cell(params)
  cell.metadata["tags"] = ["parameters"]
  nb.cells.append(cell)
  nb.cells += [nbformat.v4.new_code_cell(src) for src in code]
  path = folder / name
  nbformat.write(nb, str(path))
  return path


@pytest.fixture
def nbdir(tmp_path):
  folder = tmp_path / "notebooks"
  folder.mkdir()
  return folder


OK_CODE = ("from pathlib import Path\n"
           "Path(output_dir, 'result.txt').write_text('ok')\n"
           "print('done')")


LINKED_CODE = ("from IPython.display import Markdown, display\n"
               "display(Markdown('see [the clock](../docs/tpu.md#the-clock)'))")


def test_passing_and_failing_notebooks_via_cli(nbdir, tmp_path, capsys):
  ok = make_notebook(nbdir, "01_ok.ipynb", "output_dir = 'out'", OK_CODE, LINKED_CODE)
  nb = nbformat.read(str(ok), as_version=4)  # a Markdown cell linking the docs, as notebooks do
  nb.cells.append(nbformat.v4.new_markdown_cell("[usage](../docs/usage.md) and [02](02_fail.ipynb)"))
  nbformat.write(nb, str(ok))
  make_notebook(nbdir, "02_fail.ipynb", "output_dir = 'out'",
                "raise ValueError('deliberate failure in code cell 2')",
                "print('never runs')")
  source_before = ok.read_text()
  out = tmp_path / "build" / "ci"
  (out / "01_ok").mkdir(parents=True)  # an earlier run's headline: not this run's
  (out / "01_ok" / "headline.json").write_text(json.dumps({"figure": "old.png"}))
  (out / "01_ok" / "old.png").write_bytes(b"\x89PNG")

  code = workbook.main(["--profile", "ci", "--notebooks", str(nbdir),
                        "--out", str(out), "--html", "--timeout", "60"])
  printed = capsys.readouterr().out

  assert code == 1
  assert "01_ok.ipynb" in printed and "02_fail.ipynb" in printed
  assert "02_fail.ipynb FAILED at code cell 2 (cells[2]" in printed
  assert "ValueError: deliberate failure in code cell 2" in printed
  assert f"kernel log: {out / '02_fail.kernel.log'}" in printed
  assert printed.rstrip().endswith("1 passed, 1 failed")
  # Executed copies and HTML in the build folder; the source is untouched.
  assert ok.read_text() == source_before
  executed = nbformat.read(str(out / "01_ok.ipynb"), as_version=4)
  assert any("done" in o.get("text", "") for c in executed.cells
             if c.cell_type == "code" for o in c.outputs)
  assert (out / "01_ok.html").read_text().lstrip().startswith("<!DOCTYPE html>")
  assert (out / "02_fail.html").exists()
  assert (out / "01_ok" / "result.txt").read_text() == "ok"
  assert not (out / "01_ok" / "headline.json").exists()  # removed before the run
  # The executed copy's links, written for notebooks/, resolve from build/ci/ (cells and
  # Markdown outputs, so the HTML's too); the source keeps its own.
  text = "\n".join([c.source for c in executed.cells if c.cell_type == "markdown"]
                   + [o["data"]["text/markdown"] for c in executed.cells if c.cell_type == "code"
                      for o in c.outputs if "text/markdown" in o.get("data", {})])
  assert "](../../docs/tpu.md#the-clock)" in text and "](../../docs/usage.md)" in text
  assert "](../../notebooks/02_fail.ipynb)" in text and "](../docs/" not in text
  html = (out / "01_ok.html").read_text()
  assert 'href="../../docs/usage.md"' in html and 'href="../../docs/tpu.md#the-clock"' in html
  # The landing page, rewritten after each run, lists both with their status.
  index = (out / workbook.INDEX_NAME).read_text()
  assert '<a href="01_ok.html">rendered notebook</a>' in index
  assert '<span class="failed">failed</span>' in index.split('id="02_fail"')[1]
  assert "landing page" in printed


def test_run_notebook_injects_ci_parameters(nbdir, tmp_path):
  path = make_notebook(nbdir, "01_params.ipynb",
                       "output_dir = 'out'\nnum_tokens = 65536  # ci: 128 | rule: True\n"
                       "interpret = False  # rule: True | what it is | ci: text, not a field\n"
                       "fast = False  # ci: True | rule: boolean(fast)",
                       "print(f'num_tokens={num_tokens} interpret={interpret} fast={fast}')")
  out = tmp_path / "build" / "ci"

  result = workbook.run_notebook(path, profile="ci", out_dir=out, timeout=60)

  assert result.ok, result.describe()
  assert result.executed == out / "01_params.ipynb"
  assert result.parameters == {"num_tokens": 128, "fast": True,
                               "output_dir": str(out.resolve() / "01_params")}
  executed = nbformat.read(str(result.executed), as_version=4)
  injected = [c for c in executed.cells
              if "injected-parameters" in c.metadata.get("tags", [])]
  assert len(injected) == 1
  assert "num_tokens = 128" in injected[0].source
  assert "num_tokens=128 interpret=False fast=True" in executed.cells[-1].outputs[0]["text"]


def test_cell_timeout_names_the_cell(nbdir, tmp_path):
  path = make_notebook(nbdir, "01_slow.ipynb", "output_dir = 'out'",
                       "x = 1", "import time\ntime.sleep(60)")

  result = workbook.run_notebook(path, profile="ci", out_dir=tmp_path / "out",
                                 timeout=2)

  assert not result.ok
  assert result.failure.code_cell == 3
  assert result.failure.cell_index == 3
  assert "time.sleep(60)" in result.failure.source
  assert "01_slow.ipynb FAILED at code cell 3" in result.describe()


def test_parameters_for_profiles(nbdir, tmp_path):
  path = make_notebook(nbdir, "01_a.ipynb", "output_dir = 'x'\nseed = 0  # ci: 3 | rule: True")
  out_dir = str(tmp_path.resolve() / "01_a")
  assert workbook.parameters_for(path, "default", tmp_path) == {"output_dir": out_dir}
  assert workbook.parameters_for(path, "ci", tmp_path) == {"seed": 3, "output_dir": out_dir}


@pytest.mark.parametrize("cell, message", [
    ("output_dir = 'x'  # ci: '/tmp'", "gives 'output_dir' a ci: value"),
    ("output_dir = 'x'\nn = 1  # ci: 4 * n", "its ci: field is not a Python literal: '4 \\* n'"),
    ("output_dir = 'x'\nn: int = 1", "one `name = value` per statement"),
], ids=["ci-output-dir", "ci-not-a-literal", "not-an-assignment"])
def test_bad_parameters_cells_are_errors_before_anything_runs(nbdir, tmp_path, capsys, cell,
                                                              message):
  make_notebook(nbdir, "01_a.ipynb", "output_dir = 'x'")
  path = make_notebook(nbdir, "02_b.ipynb", cell)
  with pytest.raises(workbook.WorkbookError, match=message):
    workbook.parameters_for(path, "ci", tmp_path / "out")
  assert workbook.main(["--profile", "ci", "--notebooks", str(nbdir),
                        "--out", str(tmp_path / "out")]) == 2
  assert "02_b.ipynb" in capsys.readouterr().err
  assert not (tmp_path / "out").exists()  # nothing ran


def test_notebook_without_output_dir_parameter_is_an_error(nbdir, tmp_path):
  path = make_notebook(nbdir, "01_a.ipynb", "n = 1")
  with pytest.raises(workbook.WorkbookError, match="must declare 'output_dir'"):
    workbook.parameters_for(path, "default", tmp_path)


def test_only_selects_by_name_stem_or_number(nbdir):
  paths = [make_notebook(nbdir, n, "output_dir = 'x'")
           for n in ("01_a.ipynb", "02_b.ipynb", "03_c.ipynb")]
  assert workbook.discover(nbdir) == paths
  assert workbook._select(paths, ["03", "01_a", "02_b.ipynb"]) == paths
  with pytest.raises(workbook.WorkbookError, match="no such notebook"):
    workbook._select(paths, ["04"])


# --------------------------------------------------------------------------
# The landing page (index.html), from fake executed notebooks: no kernel.

MACHINE = "CPU (cpu), jax 0.10.2: Pallas TPU interpreter (simulated TPU, timings are not TPU timings)"


def fake_executed(folder: Path, name: str, *, question: str | None, answer: str | None,
                  machine: str | None = MACHINE, exception: bool = False,
                  parameters: dict | None = None) -> Path:
  """An executed copy as papermill leaves it: outputs and papermill metadata."""
  nb = nbformat.v4.new_notebook()
  intro = f"# Title of {name}\n\n" + (f"**Question.** {question}\n\n" if question else "")
  nb.cells.append(nbformat.v4.new_markdown_cell(intro + "**Answer.** The first output below."))
  code = nbformat.v4.new_code_cell("...")
  if answer is not None:  # the placeholder display, updated in place by a late cell
    code.outputs.append(nbformat.v4.new_output(
        "display_data", data={"text/markdown": answer, "text/plain": "<Markdown>"}))
  if machine is not None:
    code.outputs.append(nbformat.v4.new_output("stream", text=f"{machine}\nkernel mode: x\n"))
  if answer is not None:
    code.outputs.append(nbformat.v4.new_output(
        "display_data", data={"text/markdown": "a later table, not the answer"}))
  nb.cells.append(code)
  nb.metadata["papermill"] = {"duration": 12.5, "end_time": "2026-12-01T10:00:00+00:00",
                              "exception": True if exception else None,
                              "parameters": {"output_dir": "/x", **(parameters or {})}}
  nbformat.write(nb, str(folder / name))
  return folder / name


def test_index_lists_question_answer_machine_and_links(nbdir, tmp_path):
  out = tmp_path / "build" / "workbook"
  out.mkdir(parents=True)
  for name in ("01_ok.ipynb", "02_failed.ipynb", "03_never.ipynb", "04_silent.ipynb"):
    make_notebook(nbdir, name, "output_dir = 'x'")
  fake_executed(out, "01_ok.ipynb", question="How many bytes does an `entry` cost & why?",
                answer="**Answer** (computed on x): 256 B <script>alert(1)</script>\n\n"
                       "| format | bytes |\n|---|---|\n| fp8 | 256 |\n",
                parameters={"num_heads": 8})
  (out / "01_ok.html").write_text("<!DOCTYPE html>")
  fake_executed(out, "02_failed.ipynb", question="Does it fail?", answer=None,
                exception=True)
  fake_executed(out, "04_silent.ipynb", question=None, answer=None, machine=None)

  page = workbook.write_index(nbdir, out, heading="Workbook <ci>").read_text()

  assert page.startswith("<!DOCTYPE html>") and "<title>Workbook &lt;ci&gt;</title>" in page
  ok, failed, never, silent = page.split("<section")[1:]
  assert "01 · Title of 01_ok.ipynb" in ok  # numbered from the file name
  assert ("<strong>Question.</strong> How many bytes does an <code>entry</code> "
          "cost &amp; why?") in ok
  assert "<strong>Answer</strong> (computed on x): 256 B" in ok
  assert "<script>" not in page and "&lt;script&gt;alert(1)&lt;/script&gt;" in ok
  assert "<td>fp8</td>" in ok and "a later table" not in ok
  assert f"Machine: {MACHINE}" in ok
  assert '<a href="01_ok.html">rendered notebook</a>' in ok
  assert '<a href="01_ok.ipynb">executed .ipynb</a>' in ok
  assert "ok, 12.5 s" in ok and "parameters: 1 set by the runner (num_heads)" in ok
  assert '<span class="failed">failed</span>' in failed and "no Markdown output" in failed
  assert "rendered notebook" not in failed
  assert "not run" in never and "href" not in never and "parameters" not in never
  assert "Machine" not in never
  assert "No <strong>Question.</strong> paragraph" in silent
  assert "Machine: not printed by this run" in silent
  assert not list(out.glob(".index.html.*"))  # the temporary file was renamed


def test_machine_line_quoted_in_markdown_keeps_its_own_parentheses():
  nb = {"cells": [{"cell_type": "code", "outputs": [{
      "output_type": "display_data",
      "data": {"text/markdown": f"**Answer** (computed in this run on {MACHINE}):\n- x"}}]}]}
  assert workbook.machine_line(nb) == MACHINE
  assert workbook.first_markdown_output(nb).startswith("**Answer**")
  assert workbook.notebook_question({"cells": []}) == ("", None)


# --------------------------------------------------------------------------
# --jobs: notebooks at once, longest expected first, one landing-page writer.

STAMP_CODE = ("import json, time\nfrom pathlib import Path\n"
              "t0 = time.time(); time.sleep(3)\n"
              "Path(output_dir, 'span.json').write_text(json.dumps([t0, time.time()]))")


def test_jobs_2_runs_two_notebooks_at_once(nbdir, tmp_path, capsys):
  for name in ("01_a.ipynb", "02_b.ipynb"):
    make_notebook(nbdir, name, "output_dir = 'out'", STAMP_CODE)
  out = tmp_path / "build" / "workbook"

  code = workbook.main(["--notebooks", str(nbdir), "--out", str(out), "--jobs", "2",
                        "--timeout", "60"])
  printed = capsys.readouterr().out

  assert code == 0, printed
  (a0, a1), (b0, b1) = (json.loads((out / s / "span.json").read_text())
                        for s in ("01_a", "02_b"))
  assert a0 < b1 and b0 < a1  # the two sleeps overlapped: they ran at once
  assert "2 at a time" in printed
  assert "Run 2 notebooks at a time: the timings they print ran beside another notebook" in printed
  assert printed.rstrip().endswith("2 passed, 0 failed")
  index = (out / workbook.INDEX_NAME).read_text()
  assert "Run 2 notebooks at a time" in index.split("<section")[0]
  assert index.count("ok, ") == 2 and "running" not in index and "queued" not in index
  assert not list(out.glob(".index.html.*"))


# At exit the kernel leaves a task pending on an event loop, as ipykernel's
# closing service loops do, after it has stopped capturing stderr: asyncio
# reports it on the kernel's own stderr, which an inherited stderr printed
# between the runner's lines.
PENDING_AT_EXIT = ("import asyncio, atexit, gc, sys\n"
                   "def leave_a_pending_task():\n"
                   "    sys.stderr = sys.__stderr__\n"
                   "    asyncio.new_event_loop().create_task(asyncio.sleep(1))\n"
                   "    gc.collect()\n"
                   "atexit.register(leave_a_pending_task)\n"
                   "print('done')")


def test_jobs_1_quiet_output_kernel_noise_in_the_kernel_log(nbdir, tmp_path, capfd):
  make_notebook(nbdir, "01_a.ipynb", "output_dir = 'out'", PENDING_AT_EXIT)
  out = tmp_path / "o"
  assert workbook.main(["--notebooks", str(nbdir), "--out", str(out),
                        "--jobs", "1", "--timeout", "60"]) == 0
  printed = capfd.readouterr()  # file descriptors: the kernel's writes too
  assert "1 at a time" in printed.out and "beside another notebook" not in printed.out
  both = printed.out + printed.err
  assert "Traceback" not in both and "Task was destroyed" not in both, both
  assert printed.err == "" and len(printed.out.splitlines()) == 5, both
  # Kept, not dropped: the kernel's own output is in its log.
  assert "Task was destroyed but it is pending!" in (out / "01_a.kernel.log").read_text()


def test_jobs_below_1_is_an_error(nbdir, tmp_path, capsys):
  make_notebook(nbdir, "01_a.ipynb", "output_dir = 'x'")
  assert workbook.main(["--notebooks", str(nbdir), "--out", str(tmp_path / "o"),
                        "--jobs", "0"]) == 2
  assert "--jobs: must be at least 1 (got 0)" in capsys.readouterr().err
  assert not (tmp_path / "o").exists()


def test_html_that_cannot_render_is_an_error_before_anything_runs(nbdir, tmp_path,
                                                                   capsys, monkeypatch):
  """As on the v5e, where nbconvert went in with pip --target and its
  templates were not on JUPYTER_PATH: said before any notebook runs."""
  import nbconvert

  def no_templates():
    raise ValueError("No template sub-directory with name 'lab' found in the "
                     "following paths:\n\t/usr/share/jupyter")
  monkeypatch.setattr(nbconvert, "HTMLExporter", no_templates)
  make_notebook(nbdir, "01_a.ipynb", "output_dir = 'x'")
  assert workbook.main(["--notebooks", str(nbdir), "--out", str(tmp_path / "o"),
                        "--html"]) == 2
  err = capsys.readouterr().err
  assert "--html: nbconvert cannot render (ValueError: No template sub-directory" in err
  assert "JUPYTER_PATH=DIR/share/jupyter" in err
  assert not (tmp_path / "o").exists()


def test_run_order_is_longest_first_then_the_unlisted_by_name(nbdir, monkeypatch):
  paths = [make_notebook(nbdir, n, "output_dir = 'x'")
           for n in ("01_a.ipynb", "02_b.ipynb", "03_c.ipynb", "04_d.ipynb")]
  # The real list names every notebook of the workbook.
  repo_notebooks = Path(__file__).resolve().parent.parent / "notebooks"
  assert set(workbook.LONGEST_FIRST) == {p.stem for p in workbook.discover(repo_notebooks)}
  monkeypatch.setattr(workbook, "LONGEST_FIRST", ("03_c", "01_a"))
  assert workbook.run_order(paths) == [paths[2], paths[0], paths[1], paths[3]]


def test_index_marks_running_and_queued_notebooks(nbdir, tmp_path):
  out = tmp_path / "out"
  out.mkdir()
  for name in ("01_a.ipynb", "02_b.ipynb", "03_c.ipynb"):
    make_notebook(nbdir, name, "output_dir = 'x'")
  fake_executed(out, "01_a.ipynb", question="A?", answer="**Answer** a")
  fake_executed(out, "02_b.ipynb", question="B?", answer="**Answer** stale")  # an earlier run's

  page = workbook.write_index(nbdir, out, pending={"02_b.ipynb": "running",
                                                   "03_c.ipynb": "queued"}).read_text()

  a, b, c = page.split("<section")[1:]
  assert "ok, 12.5 s" in a and "**Answer** a" not in a and "<strong>Answer</strong> a" in a
  assert "running" in b and "stale" not in b and "href" not in b and "Machine" not in b
  assert "queued" in c and "Machine" not in c


def test_index_shows_the_headline_figure_beside_the_answer_under_a_plain_title(nbdir, tmp_path):
  out = tmp_path / "build" / "ci"
  out.mkdir(parents=True)
  make_notebook(nbdir, "01_ok.ipynb", "output_dir = 'x'")
  make_notebook(nbdir, "02_nofig.ipynb", "output_dir = 'x'")
  fake_executed(out, "01_ok.ipynb", question="Q?", answer="**Answer**: 1")
  fake_executed(out, "02_nofig.ipynb", question="Q?", answer="**Answer**: 2")
  (out / "01_ok").mkdir()
  (out / "01_ok" / "step.png").write_bytes(b"\x89PNG")
  (out / "01_ok" / "headline.json").write_text(json.dumps({"figure": "step.png"}))

  page = workbook.write_index(nbdir, out, heading=workbook.TITLE,
                              note=workbook._profile_note("ci", out)).read_text()

  assert "<title>streamidx workbook</title>" in page and "<h1>streamidx workbook</h1>" in page
  assert "CI-sized parameters" in page.split("<section")[0]
  ok, nofig = page.split("<section")[1:]
  assert '<img src="01_ok/step.png"' in ok and ok.index("<strong>Answer</strong>") < ok.index("<img")
  assert "<img" not in nofig


def test_answer_links_written_for_the_notebooks_folder_resolve_from_the_landing_page(tmp_path):
  nbdir, out = tmp_path / "notebooks", tmp_path / "build" / "ci"
  text = "see [clock](../docs/tpu.md#the-clock), [01](01_x.ipynb) and [web](https://x.org/a)"
  assert workbook.rebase_links(text, nbdir, out) == (
      "see [clock](../../docs/tpu.md#the-clock), [01](../../notebooks/01_x.ipynb) and [web](https://x.org/a)")


def test_the_landing_page_numbers_each_title_by_its_file():
  assert workbook.numbered_title("Kernel walkthrough: the steps", "03_k.ipynb") == (
      "03 · Kernel walkthrough: the steps")
  assert workbook.numbered_title("08 · The selection stage", "07_topk.ipynb") == (
      "07 · The selection stage")
  assert workbook.numbered_title("", "05_x.ipynb") == "05"


def test_the_landing_page_headline_is_the_measured_step_else_the_model(nbdir, tmp_path):
  # The committed chip records decide: measured where they hold the step's
  # shape on the chip, else the model, titled so.
  from streamidx import records
  measured = bool(records.calls(chip=workbook.STEP_CHIP, shape=workbook.STEP_SHAPE))
  make_notebook(nbdir, "01_a.ipynb", "output_dir = 'x'")
  out = tmp_path / "out"
  page = workbook.write_index(nbdir, out).read_text()
  head = page.split("<section")[0]
  assert f'<img src="{workbook.STEP_FIGURE}"' in head
  assert (out / workbook.STEP_FIGURE).read_bytes().startswith(b"\x89PNG")
  if measured:
    assert "measured (device time by the profiler, from the chip records)" in head
    assert "by the model" not in head
  else:
    assert "by the model" in head and "no chip measurement is recorded" in head
  assert "lean + blocktop" in head and "vendored pipeline" in head


def test_step_rows_without_a_measured_call_are_the_models_step():
  rows, measured = workbook.step_rows([])
  assert not measured
  assert set(rows) == {f"{v} + {m}" for v in workbook.STEP_VARIANTS
                       for m in workbook.STEP_METHODS}
  assert all(sb.share("scoring") > 0 and sb.share("selection") > 0 for sb in rows.values())


def test_step_rows_take_the_newest_measured_call_per_variant_and_method():
  call = lambda v, m, sc, sel: dict(variant=v, method=m, parts=dict(scoring=sc, selection=sel))
  rows, measured = workbook.step_rows([call("lean", "blocktop", 1.0, 1.0),
                                       call("lean", "blocktop", 2.0, 0.5),
                                       call("vendored", "sort", 3.0, 2.0),
                                       call("lean", "top_k", 0.5, 0.5)])
  assert measured
  assert rows == {"lean + blocktop": dict(scoring=2.0, selection=0.5),
                  "vendored + sort": dict(scoring=3.0, selection=2.0)}


def test_kernels_run_over_unix_sockets_where_no_tcp_socket_opens(nbdir, tmp_path,
                                                                monkeypatch):
  """A TPU host here allows no TCP socket, loopback included: the runner
  then talks to its kernels over ZeroMQ's ipc transport ("auto" picks it).
  Where `unshare -n` works (a network namespace whose loopback is down), a
  whole run is made there, over ipc, end to end."""
  import shutil
  import socket
  import subprocess
  import sys

  class NoTCP(socket.socket):
    def bind(self, address):
      if self.family == socket.AF_INET:
        raise OSError(97, "Address family not supported by protocol")
      return super().bind(address)

  assert workbook.kernel_transport("auto") == "tcp"
  with monkeypatch.context() as m:
    m.setattr(socket, "socket", NoTCP)
    assert workbook.kernel_transport("auto") == "ipc"
  with pytest.raises(workbook.WorkbookError, match="--transport: must be one"):
    workbook.kernel_transport("udp")

  path = make_notebook(nbdir, "01_ipc.ipynb", "output_dir = 'out'", OK_CODE)
  unshare = shutil.which("unshare")
  if not (unshare and subprocess.run([unshare, "-n", "true"], check=False,
                                     capture_output=True).returncode == 0):
    result = workbook.run_notebook(path, profile="ci", out_dir=tmp_path,
                                   timeout=60, transport="ipc")
    assert result.ok, result.describe()
    pytest.skip("no network namespace here (unshare -n): an ipc run with "
                "the network up was the check")
  out = subprocess.run(
      [unshare, "-n", sys.executable, "-m", "streamidx.workbook", "--profile",
       "ci", "--notebooks", str(nbdir), "--out", str(tmp_path / "nonet"),
       "--only", "01"], capture_output=True, text=True, timeout=120,
      check=False)
  assert out.returncode == 0, out.stdout + out.stderr
  assert "1 passed, 0 failed" in out.stdout


# What the v5e host does to a process (gVisor, no network): no AF_INET or
# AF_INET6 socket opens, and getifaddrs fails, so libzmq's interface lookup
# for a tcp:// endpoint aborts the process ("Address family not supported by
# protocol (src/ip_resolver.cpp:542)"): ipykernel's IOPub pipe bind did so.
NO_INET_SHIM = r"""
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <ifaddrs.h>
#include <sys/socket.h>
int socket(int domain, int type, int protocol) {
  static int (*real)(int, int, int);
  if (!real) real = (int (*)(int, int, int))dlsym(RTLD_NEXT, "socket");
  if (domain == AF_INET || domain == AF_INET6) { errno = EAFNOSUPPORT; return -1; }
  return real(domain, type, protocol);
}
int getifaddrs(struct ifaddrs **ifap) { (void)ifap; errno = EAFNOSUPPORT; return -1; }
"""


def test_an_ipc_kernel_starts_where_no_internet_socket_exists(nbdir, tmp_path):
  """The TPU host's sandbox, emulated by an LD_PRELOAD shim: an ipc run
  passes end to end (the kernel starts as `workbook.IPC_KERNEL`)."""
  import os
  import shutil
  import subprocess
  import sys

  cc = shutil.which("cc") or shutil.which("gcc")
  if cc is None:
    pytest.skip("no C compiler to build the no-network shim")
  src, lib = tmp_path / "noinet.c", tmp_path / "noinet.so"
  src.write_text(NO_INET_SHIM)
  subprocess.run([cc, "-shared", "-fPIC", "-o", str(lib), str(src), "-ldl"],
                 check=True, capture_output=True)
  make_notebook(nbdir, "01_ipc.ipynb", "output_dir = 'out'", OK_CODE)
  out = subprocess.run(
      [sys.executable, "-m", "streamidx.workbook", "--profile", "ci",
       "--notebooks", str(nbdir), "--out", str(tmp_path / "noinet"),
       "--transport", "ipc", "--only", "01"],
      env=dict(os.environ, LD_PRELOAD=str(lib)), capture_output=True,
      text=True, timeout=120, check=False)
  log = (tmp_path / "noinet" / "01_ipc.kernel.log")
  assert out.returncode == 0, (out.stdout + out.stderr
                               + (log.read_text() if log.exists() else ""))
  assert "1 passed, 0 failed" in out.stdout
