"""The notebooks' install cell (code cell 1, `INSTALL_CELL` of tools/colab.py), run
the way a fresh Colab runtime runs it.

On Colab a notebook opened from GitHub runs in `/content`, with no checkout
beside it, in a Python that already has jax, jaxlib (and libtpu), numpy,
matplotlib and IPython but not streamidx. The cell must clone the repository
from `STREAMIDX_REPO`, pip-install it without replacing the runtime's
packages, and make `import streamidx` work in the SAME process (no restart).

How the test builds that runtime, offline (no registry, no pip cache needed):

- a fresh venv (`python -m venv --without-pip`, no system site-packages);
- "what the runtime has preinstalled": a folder of links to every entry of
  this project's own environment (`.venv`, i.e. requirements.lock: jax and
  jaxlib 0.10.2, numpy, matplotlib, pip, setuptools, ...), streamidx left
  out, put on the venv's path by a `.pth` line. The packages are importable
  and pip sees their metadata, as pip sees Colab's; streamidx is not there;
- the "GitHub repository": a git repository made from this working tree's
  files (tracked and untracked-but-not-ignored, i.e. what a commit would
  hold), cloned by the cell through a `file://` URL in `STREAMIDX_REPO`;
- `/content`: an empty folder, except for a bare folder named `streamidx`
  (what `git clone` under the repository's default name leaves), which
  Python would import as an empty namespace package: the cell must not be
  fooled by it.

Two more runs cover the other ways in: a checkout uploaded and unpacked under
`/content` (no clone: `STREAMIDX_REPO` points at nothing), and the cell
written by `tools/colab.py`'s `install_cell` with a `git+file://` URL set once,
as `REPOSITORY` sets it, which pip installs with no checkout (the working
folder stays `/content`). Each is a fresh runtime venv and one wheel build.

The cell's source, taken from notebook 00, then runs twice (a rerun must do
nothing) in one fresh `python` process whose working directory is that
folder, followed by `import streamidx; streamidx.streamindex_topk` in the
same process. Two settings differ from Colab, for the test to run without a
network: `PIP_NO_INDEX=1` (pip may fetch nothing, so the test also proves
the dependency ranges are met by the preinstalled packages: nothing but
streamidx lands in the venv, and jax stays the runtime's), and build
isolation off (`PIP_NO_BUILD_ISOLATION=0`, which pip reads as the default
of `--no-build-isolation`: isolation off), so the wheel is built with the
runtime's setuptools; on Colab pip fetches `setuptools>=77` from PyPI into
an isolated build environment. About 20 s, most of it pip building the
wheel.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import nbformat

import colab  # tools/ (conftest.py)

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
CLONE_DIR = "streamidx-repo"  # where the cell clones to, relative to /content


def install_cell(path: Path) -> str:
  nb = nbformat.read(str(path), as_version=4)
  return next(c for c in nb.cells if c.cell_type == "code").source


def test_every_notebook_has_the_install_cell_of_tools_colab():
  different = [p.name for p in NOTEBOOKS if install_cell(p) != colab.INSTALL_CELL]
  assert not different, f"install cell is not tools/colab.py's (run `make strip`): {different}"
  compile(colab.INSTALL_CELL, "install cell", "exec")  # plain Python: no magics
  assert len(colab.INSTALL_CELL.splitlines()) <= 13
  assert colab.install_cell() == colab.INSTALL_CELL
  # The repository's URL is set once, in tools/colab.py (the cells are written from it).
  assert colab.INSTALL_CELL.count(colab.REPOSITORY) == 1
  assert (ROOT / "tools" / "colab.py").read_text().count(colab.REPOSITORY.split("//")[1]) == 1


def _runtime(tmp: Path) -> Path:
  """A venv whose path holds this environment's packages except streamidx."""
  here = Path(sysconfig.get_paths()["purelib"])
  runtime = tmp / "runtime-packages"
  runtime.mkdir()
  for entry in here.iterdir():
    if "streamidx" in entry.name or entry.name == "__pycache__":
      continue  # the dist-info, the editable finder and its .pth
    (runtime / entry.name).symlink_to(entry)
  venv = tmp / "venv"
  subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
  python = venv / "bin" / "python"
  purelib = subprocess.run(
      [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
      check=True, capture_output=True, text=True).stdout.strip()
  Path(purelib, "colab-runtime.pth").write_text(f"{runtime}\n")
  return python


SKIP_DIRS = {".git", ".venv", "build", ".pytest_cache", ".hypothesis", "__pycache__",
             ".ipynb_checkpoints"}


def _files(tmp: Path, name: str) -> Path:
  """tmp/name holding this working tree's files, as GitHub would: git's own
  list (tracked and untracked-but-not-ignored) in a checkout, else (an
  unpacked archive) every file outside build outputs and caches."""
  listed = subprocess.run(
      ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
      cwd=ROOT, capture_output=True)
  if listed.returncode == 0:
    names = [n for n in listed.stdout.decode().split("\0") if n]
  else:
    names = [str(p.relative_to(ROOT)) for p in ROOT.rglob("*") if p.is_file()
             and not SKIP_DIRS & set(p.relative_to(ROOT).parts)
             and not p.parts[-2].endswith(".egg-info")]
  repo = tmp / name
  for n in names:
    if (ROOT / n).is_file():
      (repo / n).parent.mkdir(parents=True, exist_ok=True)
      shutil.copy2(ROOT / n, repo / n)
  return repo


def _repository(tmp: Path) -> Path:
  """A git repository of this working tree's files (the "GitHub repository")."""
  repo = _files(tmp, "github")
  git = ["git", "-c", "user.name=streamidx", "-c", "user.email=dev@streamidx"]
  subprocess.run(["git", "init", "-q", str(repo)], check=True)
  subprocess.run(git + ["add", "-A"], cwd=repo, check=True)
  subprocess.run(git + ["commit", "-q", "-m", "snapshot"], cwd=repo, check=True)
  return repo


def _run_in_content(python: Path, content: Path, code: str, repo_url: str | None):
  """Runs `code` in /content; `repo_url` None leaves STREAMIDX_REPO unset."""
  env = {k: v for k, v in os.environ.items()
         if not k.startswith(("PIP_", "PYTHON", "VIRTUAL_ENV", "STREAMIDX_REPO"))}
  env.update(JAX_PLATFORMS="cpu", PIP_NO_INDEX="1",
             PIP_NO_BUILD_ISOLATION="0", PIP_DISABLE_PIP_VERSION_CHECK="1")
  if repo_url is not None:
    env["STREAMIDX_REPO"] = repo_url
  return subprocess.run([str(python), "-c", code], cwd=content, env=env,
                        capture_output=True, text=True, timeout=300)


def _lock_pin(name: str) -> str:
  text = (ROOT / "requirements.lock").read_text()
  return re.search(rf"^{name}==(\S+)$", text, re.M).group(1)


CHECK = ("\nimport os, jax, streamidx\n"
         "print('topk', callable(streamidx.streamindex_topk))\n"
         "print('module', streamidx.__file__)\n"
         "print('jax', jax.__version__, jax.__file__)\n"
         "print('cwd', os.getcwd())\n")


def _installed(tmp_path: Path, run) -> dict:
  """What the check printed, after asserting pip added streamidx and
  nothing else to the runtime (its jax, numpy, ... kept)."""
  assert run.returncode == 0, run.stdout + run.stderr
  printed = dict(line.split(" ", 1) for line in run.stdout.splitlines() if " " in line)
  assert printed["topk"] == "True"
  venv_site = next((tmp_path / "venv" / "lib").glob("python*/site-packages"))
  assert Path(printed["module"]).is_relative_to(venv_site), printed["module"]
  jax_version, jax_file = printed["jax"].split(" ")
  assert jax_version == _lock_pin("jax")
  assert Path(jax_file).is_relative_to(tmp_path / "runtime-packages"), jax_file
  added = sorted(p.name for p in venv_site.iterdir() if p.name != "__pycache__")
  assert [re.sub(r"-[\d.]+\.dist-info$", "-*.dist-info", a) for a in added] == [
      "colab-runtime.pth", "streamidx", "streamidx-*.dist-info"], added
  return printed


def test_install_cell_on_a_fresh_colab_like_runtime(tmp_path):
  python = _runtime(tmp_path)
  repo = _repository(tmp_path)
  content = tmp_path / "content"
  (content / "streamidx").mkdir(parents=True)  # a bare folder: a namespace package
  (content / "streamidx" / "README.md").write_text("not the package\n")
  before = _run_in_content(python, content, (
      "import importlib.util, jax; s = importlib.util.find_spec('streamidx'); "
      "print(jax.__version__, s is None or s.origin is None)"), "unused")
  assert before.stdout.split() == [_lock_pin("jax"), "True"], before.stderr

  cell = install_cell(NOTEBOOKS[0])
  run = _run_in_content(python, content, cell + "\n" + cell + CHECK, repo.as_uri())

  printed = _installed(tmp_path, run)
  assert printed["cwd"] == str(content / CLONE_DIR / "notebooks")
  assert (content / CLONE_DIR / "pyproject.toml").is_file()
  # The first run says what it did; the rerun prints nothing more.
  assert run.stdout.count("installed; working directory") == 1, run.stdout


def test_install_cell_names_the_variable_when_the_clone_fails(tmp_path):
  python = _runtime(tmp_path)
  content = tmp_path / "content"
  content.mkdir()
  run = _run_in_content(python, content, install_cell(NOTEBOOKS[0]),
                        (tmp_path / "no-such-repository").as_uri())
  assert run.returncode != 0
  assert "RuntimeError: git clone file://" in run.stderr, run.stderr
  assert "set os.environ['STREAMIDX_REPO']" in run.stderr
  assert not (content / CLONE_DIR).exists()


def test_install_cell_finds_a_checkout_uploaded_to_content(tmp_path):
  # Colab's working folder stays /content whichever notebook is open: a
  # checkout uploaded there (GitHub's "Download ZIP", unpacked) is found under
  # it, and nothing is cloned (STREAMIDX_REPO points at nothing).
  python = _runtime(tmp_path)
  content = tmp_path / "content"
  uploaded = _files(content, "streamidx-main")
  cell = install_cell(NOTEBOOKS[0])
  run = _run_in_content(python, content, cell + "\n" + cell + CHECK,
                        (tmp_path / "no-such-repository").as_uri())

  printed = _installed(tmp_path, run)
  assert printed["cwd"] == str(uploaded / "notebooks")
  assert not (content / CLONE_DIR).exists()
  assert run.stdout.count("installed; working directory") == 1, run.stdout


def test_install_cell_pip_installs_a_git_url_set_once(tmp_path):
  # The URL set once, in tools/colab.py (`install_cell(REPOSITORY)` writes
  # every notebook's cell): here a git+file:// URL, which pip installs with
  # no checkout; STREAMIDX_REPO is unset, so the cell's default is used.
  python = _runtime(tmp_path)
  repo = _repository(tmp_path)
  content = tmp_path / "content"
  content.mkdir()
  cell = colab.install_cell("git+" + repo.as_uri())
  assert cell.count("git+" + repo.as_uri()) == 1
  run = _run_in_content(python, content, cell + "\n" + cell + CHECK, None)

  printed = _installed(tmp_path, run)
  assert printed["cwd"] == str(content)  # no checkout to work in
  assert sorted(p.name for p in content.iterdir()) == []


def test_the_jax_floor_is_the_version_the_tests_run():
  # pyproject's floor is the oldest jax tested: the lock's (docs/colab.md).
  floor = re.search(r'"jax>=([\w.]+)"', (ROOT / "pyproject.toml").read_text()).group(1)
  assert floor == _lock_pin("jax")
