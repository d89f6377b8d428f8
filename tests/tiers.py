"""Marks for the two test tiers (see conftest.py: `make test` runs "ci",
`make test-full` adds the tests marked `full`), and `needs_libtpu` for the
tests that compile for a TPU generation without a TPU.

A parametrized test keeps a representative subset in the CI tier and the
rest of its points in the full tier: every point is an interpreted kernel
to trace and compile (3-4 CPU-s each on the CI machine).
"""

import os

import pytest

from streamidx import modes

FULL = pytest.mark.full
# libtpu's compile-only devices (`streamidx.compile_for`), where installed.
needs_libtpu = pytest.mark.skipif(
    modes.libtpu_path() is None,
    reason="libtpu is not installed (make venv puts it in .venv/tpu-compile)")
TIERS = ("ci", "full")
# The tier this run is (conftest.py refuses another value).
TIER = os.environ.get("STREAMIDX_TESTS", "ci")


def in_full_tier() -> bool:
  """For a test that sizes its own run by tier (a subprocess's arguments)."""
  return TIER == "full"


def split(values, ci, *, ids=None):
  """`values` as pytest params, those for which `ci(value)` is false marked
  `full`. ids: a function of the value, as pytest's `ids=`."""
  out = []
  for v in values:
    marks = () if ci(v) else (FULL,)
    out.append(pytest.param(*(v if isinstance(v, tuple) else (v,)),
                            marks=marks, id=None if ids is None else ids(v)))
  return out


def first(values, n=1, *, ids=None):
  """The first `n` of `values` in the CI tier, the rest in the full tier."""
  keep = list(values)[:n]
  return split(values, lambda v: v in keep, ids=ids)
