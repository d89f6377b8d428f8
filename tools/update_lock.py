"""Regenerate requirements.lock: exact pins for the development venv.

The lock holds everything `make venv` installs: the package's runtime
dependencies, its `notebooks`, `test`, `profile` and `tpu-compile` extras
(libtpu, which `make venv` installs into .venv/tpu-compile, off the import
path), all of their
transitive dependencies, the build backend (setuptools, since the package
is installed with --no-build-isolation) and uv (which `make venv` installs
the lock with). It is resolved by pip itself
(`pip install --dry-run --report`), for the interpreter that runs this script,
so run it with the Python the venv uses (3.11):

    python3.11 tools/update_lock.py                  # newest versions
    python3.11 tools/update_lock.py -c old.txt       # extra args go to pip

then `make venv test`. jax resolves to the CPU jaxlib: no CUDA plugin is
asked for.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LOCK = ROOT / "requirements.lock"
EXTRAS = "notebooks,test,profile,tpu-compile"
BUILD_REQUIREMENTS = ["setuptools", "uv"]
HEADER = """\
# Exact pins for the development venv (`make venv`, CI, environment.yml).
# Resolved for CPython {py} on {platform}: jax with the CPU jaxlib, no CUDA.
# The package itself declares ranges (pyproject.toml) so that a Colab TPU
# runtime keeps its own jax/jaxlib/libtpu.
# Regenerate with: python3.11 tools/update_lock.py   (do not edit by hand)
"""


def resolve(pip_args: list[str]) -> list[tuple[str, str]]:
  """Returns sorted (name, version) pairs that pip would install."""
  with tempfile.TemporaryDirectory() as tmp:
    report = Path(tmp) / "report.json"
    cmd = [
        sys.executable, "-m", "pip", "install", "--quiet", "--dry-run",
        "--ignore-installed", "--report", str(report),
        f"{ROOT}[{EXTRAS}]", *BUILD_REQUIREMENTS, *pip_args,
    ]
    subprocess.run(cmd, check=True)
    data = json.loads(report.read_text())
  pins = []
  for item in data["install"]:
    meta = item["metadata"]
    if meta["name"].lower() == "streamidx":
      continue
    pins.append((meta["name"], meta["version"]))
  return sorted(pins, key=lambda p: p[0].lower())


def main(argv: list[str]) -> int:
  pins = resolve(argv)
  names = {name.lower().replace("_", "-") for name, _ in pins}
  cuda = sorted(n for n in names if "cuda" in n or n.startswith("nvidia-"))
  if cuda:
    print(f"update_lock: refusing CUDA packages {cuda}", file=sys.stderr)
    return 1
  header = HEADER.format(py=".".join(map(str, sys.version_info[:2])),
                         platform=sys.platform)
  LOCK.write_text(header + "".join(f"{n}=={v}\n" for n, v in pins))
  print(f"update_lock: wrote {len(pins)} pins to {LOCK.relative_to(ROOT)}")
  return 0


if __name__ == "__main__":
  sys.exit(main(sys.argv[1:]))
