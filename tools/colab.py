"""Colab: the notebooks' install cell and the install it runs.

`REPOSITORY` is the one place the repository's URL is set. `INSTALL_CELL`
is every notebook's first code cell; `make strip` (tools/strip_notebooks.py)
writes it into each, so publishing is: set `REPOSITORY`, run `make strip`.
On a fresh Colab runtime (working folder /content, no checkout) the cell
clones the repository into `streamidx-repo/` (`STREAMIDX_REPO` overrides
the URL) and runs this file, which, in the notebook's own kernel:

- changes into the checkout's `notebooks/` folder, so relative paths such as
  `../build` mean what they mean in a checkout;
- where `import streamidx` fails (a bare folder named streamidx is no
  package), pip-installs the checkout (its dependencies are ranges: the
  runtime's jax, jaxlib and libtpu are kept) and imports it, no restart.

In a checkout's notebooks/ folder the cell runs this file from `../tools/`
(nothing is installed where the package imports); elsewhere, with streamidx
installed, the cell does nothing. A rerun does nothing.
"""

import importlib
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

REPOSITORY = "https://github.com/OWNER/streamidx.git"
CLONE = "streamidx-repo"

INSTALL_CELL = f"""\
# Install streamidx where this kernel cannot import it (a fresh Colab runtime): tools/colab.py.
import importlib.util, os, runpy, subprocess
STREAMIDX_REPO = os.environ.get("STREAMIDX_REPO", "{REPOSITORY}")
setup = "../tools/colab.py" if os.path.exists("../tools/colab.py") else "{CLONE}/tools/colab.py"
found = importlib.util.find_spec("streamidx")  # (a bare folder named streamidx is no package)
if (found is None or found.origin is None) and not os.path.exists(setup) and subprocess.run(["git", "clone",
        "-q", "--depth=1", STREAMIDX_REPO, "{CLONE}"], env=dict(os.environ, GIT_TERMINAL_PROMPT="0")).returncode:
    raise RuntimeError(f"git clone {{STREAMIDX_REPO}} failed: set os.environ['STREAMIDX_REPO'] to the repository's URL and rerun this cell")
if os.path.exists(setup):  # a checkout: work in its notebooks/ folder, install it if need be
    runpy.run_path(setup, run_name="colab")"""


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
