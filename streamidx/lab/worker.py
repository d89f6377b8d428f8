"""One child process per compile or measurement (libtpu's dump flags, a fresh
backend, virtual CPU devices, a memory probe are per process): `python -m
MODULE --worker JSON` answers `RESULT_PREFIX` + JSON on stdout; `run` starts
it, `serve` is the child's side in a module's `main`.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

RESULT_PREFIX = "STREAMIDX_WORKER_RESULT "
_ROOT = str(Path(__file__).resolve().parents[2])  # holds this streamidx/


def run(module: str, payload: Any, *, env: Mapping[str, str] | None = None,
        timeout: float = 3600.0) -> Any:
  """`python -m module --worker JSON(payload)` with os.environ updated by
  `env` (this checkout first on PYTHONPATH): the JSON it answered.
  RuntimeError with the tail of its output if it fails or times out."""
  full = dict(os.environ, **(env or {}))
  full["PYTHONPATH"] = os.pathsep.join(filter(None, (_ROOT,
                                                     full.get("PYTHONPATH"))))
  cmd = [sys.executable, "-m", module, "--worker", json.dumps(payload)]
  try:
    p = subprocess.run(cmd, env=full, capture_output=True, text=True,
                       timeout=timeout, check=False)
  except subprocess.TimeoutExpired:
    raise RuntimeError(f"{module} worker timed out after {timeout:.0f} s") from None
  for line in reversed(p.stdout.splitlines()):
    if line.startswith(RESULT_PREFIX):
      return json.loads(line[len(RESULT_PREFIX):])
  tail = (p.stderr or p.stdout).strip().splitlines()[-8:]
  raise RuntimeError(f"{module} worker failed (exit {p.returncode}): "
                     + " | ".join(tail))


def serve(argv: Sequence[str] | None, fn: Callable[[Any], Any]) -> bool:
  """In a module's `main`: when `argv` (None: `sys.argv[1:]`) is `--worker
  JSON`, prints `RESULT_PREFIX` + JSON(fn(payload)) and returns True (the
  caller exits); else False."""
  argv = sys.argv[1:] if argv is None else argv
  if len(argv) != 2 or argv[0] != "--worker":
    return False
  print(RESULT_PREFIX + json.dumps(fn(json.loads(argv[1]))), flush=True)
  return True
