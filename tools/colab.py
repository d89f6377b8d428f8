"""Colab: the notebooks' install cell and the install it runs.

`REPOSITORY` is the one place the repository's URL is set. `INSTALL_CELL`
(`install_cell(REPOSITORY)`) is every notebook's first code cell; `make
strip` (tools/strip_notebooks.py) writes it into each, so publishing is: set
`REPOSITORY`, run `make strip`. Where `import streamidx` fails, the cell
finds a checkout, in this order: the one whose `notebooks/` folder it runs
in (`../tools/colab.py`); one under the working folder (`*/tools/colab.py`:
on Colab the working folder stays /content, whichever notebook is open, so
an uploaded and unpacked checkout sits at /content/NAME); the clone
`streamidx-repo/`. With none, `STREAMIDX_REPO` (default `REPOSITORY`) says
what to fetch: a git URL is cloned into `streamidx-repo/`; a pip
requirement (`git+URL`, or a path or URL ending in .whl, .tar.gz or .zip)
is pip-installed as it is, with no checkout (the notebook then stays in the
working folder). A checkout's `tools/colab.py` (this file) then runs in the
notebook's own kernel:

- it changes into the checkout's `notebooks/` folder, so relative paths such
  as `../build` mean what they mean in a checkout;
- where `import streamidx` fails (a bare folder named streamidx is no
  package), it pip-installs the checkout (its dependencies are ranges: the
  runtime's jax, jaxlib and libtpu are kept) and imports it, no restart.

Where streamidx already imports and no checkout is found, the cell does
nothing. A rerun does nothing more.
"""

import importlib
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

REPOSITORY = "https://github.com/OWNER/streamidx.git"
CLONE = "streamidx-repo"

PIP_SUFFIXES = (".whl", ".tar.gz", ".zip")


def install_cell(repository: str = REPOSITORY) -> str:
  """The install cell's source, with `repository` as STREAMIDX_REPO's default."""
  return f"""\
# Install streamidx where this kernel cannot import it (a fresh Colab runtime): tools/colab.py.
import glob, importlib, importlib.util, os, runpy, subprocess, sys
STREAMIDX_REPO = os.environ.get("STREAMIDX_REPO", "{repository}")  # git URL; or git+URL / wheel: pip installs it
setup = (glob.glob("../tools/colab.py") + glob.glob("*/tools/colab.py") + ["{CLONE}/tools/colab.py"])[0]  # a checkout
found = importlib.util.find_spec("streamidx")  # (a bare folder named streamidx is no package)
if (found is None or found.origin is None) and not os.path.exists(setup):
    pip = STREAMIDX_REPO.startswith("git+") or STREAMIDX_REPO.endswith({PIP_SUFFIXES!r})
    cmd = [sys.executable, "-m", "pip", "install", "-q"] if pip else ["git", "clone", "-q", "--depth=1"]
    if subprocess.run(cmd + [STREAMIDX_REPO] + ([] if pip else ["{CLONE}"]), env=dict(os.environ, GIT_TERMINAL_PROMPT="0")).returncode:
        raise RuntimeError(f"{{'pip install' if pip else 'git clone'}} {{STREAMIDX_REPO}} failed: set os.environ['STREAMIDX_REPO'] and rerun this cell")
    importlib.invalidate_caches()
if os.path.exists(setup):  # a checkout: work in its notebooks/ folder, install it if need be
    runpy.run_path(setup, run_name="colab")"""


INSTALL_CELL = install_cell()


def install() -> None:
  """Works in this checkout's notebooks/ folder, with streamidx importable."""
  checkout = Path(__file__).resolve().parents[1]
  os.chdir(checkout / "notebooks")
  spec = importlib.util.find_spec("streamidx")
  if spec is not None and spec.origin is not None:
    return
  subprocess.check_call([sys.executable, "-m", "pip", "install", "-q", str(checkout)])
  importlib.invalidate_caches()
  try:
    import streamidx  # pylint: disable=import-outside-toplevel
  except ImportError as e:
    raise RuntimeError("streamidx is installed but this kernel cannot import it: restart it "
                       "(Runtime > Restart session) and run the notebook again") from e
  print(f"streamidx {streamidx.__version__} installed; working directory {os.getcwd()}")


if __name__ == "colab":
  install()
