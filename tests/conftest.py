import gc
import os
import sys

import jax
import pytest

# Test helpers (oracle.py, cases.py, kernel_scores.py) are plain modules.
sys.path.insert(0, os.path.dirname(__file__))


@pytest.fixture(autouse=True, scope="module")
def _release_compiled_programs():
  """Free each module's compiled kernels when it ends.

  Every interpreted kernel configuration is a large compiled program; a
  single process that keeps hundreds of them alive has crashed inside
  XLA:CPU (seen as SIGSEGV/SIGABRT deep into a full run). Test modules share
  no compiled state, so dropping it between modules costs nothing.
  """
  yield
  jax.clear_caches()
  gc.collect()
