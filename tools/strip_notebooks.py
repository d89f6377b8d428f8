"""Strips notebooks for review: outputs, execution counts, Colab run metadata.

    python tools/strip_notebooks.py [--check] [PATH ...]   (default: notebooks/)

PATH is a notebook or a folder of them. Keeps cell tags, cell ids, the
notebook's kernelspec and its Colab runtime choice: the notebook-level
`accelerator` ("TPU") and the `colab` keys that select the runtime
(`COLAB_RUNTIME_KEYS`: `gpuType`, e.g. "V5E1", and `machine_shape`). Removes:
  - outputs and execution counts of code cells;
  - Colab's per-user and per-run metadata: every other `colab` key
    (`provenance`, `authorship_tag`, `name`, ...), and per cell `colab`,
    `executionInfo`, `outputId`;
  - run-time metadata: `papermill`, `execution` (JupyterLab cell timing),
    `widgets` (saved widget state, e.g. tqdm bars);
  - cells papermill adds to executed copies (`injected-parameters`, error
    markers), so an executed copy strips back to its source.
And it writes the install cell of tools/colab.py (`INSTALL_CELL`, with the
repository's URL) over a first code cell that starts "# Install streamidx".
With --check, writes nothing and exits 1 if any notebook would change
(`tests/test_notebooks.py` checks the same things).
"""

from __future__ import annotations

import argparse
import copy
import importlib.util
import sys
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOK_KEYS = ("executionInfo", "papermill", "widgets")
COLAB_RUNTIME_KEYS = ("gpuType", "machine_shape")
CELL_KEYS = ("colab", "executionInfo", "outputId", "papermill", "execution")
PAPERMILL_TAGS = {"injected-parameters", "papermill-error-cell-tag"}
_spec = importlib.util.spec_from_file_location("streamidx_colab", ROOT / "tools" / "colab.py")
COLAB = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(COLAB)


def strip(nb: nbformat.NotebookNode) -> nbformat.NotebookNode:
  """Strips `nb` in place and returns it."""
  for key in NOTEBOOK_KEYS:
    nb.metadata.pop(key, None)
  colab = {k: v for k, v in nb.metadata.pop("colab", {}).items()
           if k in COLAB_RUNTIME_KEYS}
  if colab:
    nb.metadata["colab"] = colab
  nb.cells = [c for c in nb.cells
              if not PAPERMILL_TAGS & set(c.get("metadata", {}).get("tags", []))]
  code = [c for c in nb.cells if c.cell_type == "code"]
  if code and code[0].source.startswith("# Install streamidx"):
    code[0].source = COLAB.INSTALL_CELL
  for cell in nb.cells:
    for key in CELL_KEYS:
      cell.metadata.pop(key, None)
    if cell.metadata.get("tags") == []:
      del cell.metadata["tags"]
    if cell.cell_type == "code":
      cell.outputs = []
      cell.execution_count = None
  return nb


def notebooks(paths: list[str]) -> list[Path]:
  found = []
  for p in map(Path, paths):
    found += sorted(p.glob("*.ipynb")) if p.is_dir() else [p]
  return found


def main(argv: list[str] | None = None) -> int:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("paths", nargs="*", default=[str(ROOT / "notebooks")])
  ap.add_argument("--check", action="store_true",
                  help="change nothing; exit 1 if a notebook is not stripped")
  args = ap.parse_args(argv)
  dirty = []
  for path in notebooks(args.paths):
    original = nbformat.read(str(path), as_version=nbformat.NO_CONVERT)
    stripped = strip(copy.deepcopy(original))
    if stripped != original:  # content, not JSON formatting
      dirty.append(path)
      if not args.check:
        nbformat.write(stripped, str(path))
  verb = "not stripped" if args.check else "stripped"
  for path in dirty:
    print(f"{verb}: {path}")
  return 1 if (args.check and dirty) else 0


if __name__ == "__main__":
  sys.exit(main())
