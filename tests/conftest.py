import gc
import os
import sys
import time

_STARTED = time.perf_counter()  # the run's wall time, for a recorded test run

# How the test processes run XLA:CPU (set before JAX starts a backend; the
# notebooks' kernels and the tests' subprocesses inherit them):
# - A persistent compilation cache (build/jax-cache, or $JAX_COMPILATION_CACHE_DIR).
#   Each module ends with `jax.clear_caches()` (below), and the xdist workers
#   and notebook kernels are separate processes: without it every one of them
#   recompiles the same references, packers and scorers. Interpreted kernels
#   are never cached (JAX does not persist programs with host callbacks), so
#   every kernel test still traces and compiles its kernel afresh.
# - XLA:CPU's cheapest code generation (`XLA_CPU_FAST_COMPILE`): LLVM at -O0,
#   the classic elemental emitters instead of the MLIR fusion emitters, one
#   LLVM module per program. An interpreted kernel is a program of ~10^4 HLO
#   ops (every simulated load, store and DMA a host callback) that runs
#   once; these flags halve the CPU time XLA spends compiling it (4.2 -> 1.9
#   CPU-s for a test-matrix kernel, measured with getrusage on this 2-core
#   host; see ARCHITECTURE.md, "Test-suite cost"). Results do not depend on
#   them: XLA:CPU compiles without fast-math either way, and the kernels'
#   arithmetic is the interpreter's, checked against the reference.
_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
os.environ.setdefault("JAX_COMPILATION_CACHE_DIR",
                      os.path.join(_ROOT, "build", "jax-cache"))
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "0")
XLA_CPU_FAST_COMPILE = ("--xla_backend_optimization_level=0 "
                        "--xla_llvm_disable_expensive_passes=true "
                        "--xla_cpu_use_fusion_emitters=false "
                        "--xla_cpu_parallel_codegen_split_count=1")
if "xla_backend_optimization_level" not in os.environ.get("XLA_FLAGS", ""):
  os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " +
                             XLA_CPU_FAST_COMPILE).strip()

import jax  # pylint: disable=g-import-not-at-top,wrong-import-position
import pytest  # pylint: disable=g-import-not-at-top,wrong-import-position

# Tracing a kernel for the interpreter builds large jaxprs: the cyclic
# garbage collector's full passes over a heap of imported modules and traced
# programs cost several percent of a test run. Objects alive now (the
# imports) are frozen out of its passes, and it runs less often.
gc.freeze()
gc.set_threshold(20_000, 50, 50)

# Test helpers (oracle.py, cases.py, kernel_scores.py) are plain modules, and
# so are the project's tools (tools/colab.py, strip_notebooks.py, ...).
sys.path.insert(0, os.path.dirname(__file__))
sys.path.insert(1, os.path.join(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))), "tools"))


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


_LAX_TOP_K = jax.lax.top_k


def _highest_index_ties(operand, k, **kwargs):
  """`lax.top_k`'s values with ties the other way: equal scores by index
  descending, so the highest-index ones take the k-th place."""
  del kwargs  # approx_max_k's recall_target, ...
  vals, idx = _LAX_TOP_K(operand[..., ::-1], k)
  return vals, operand.shape[-1] - 1 - idx


@pytest.fixture
def ties_backwards(monkeypatch):
  """For one test, `jax.lax.top_k` and `jax.lax.approx_max_k` break ties
  the other way (`_highest_index_ties`): the right values, the tie order
  of no backend in particular (a TPU's `lax.top_k` is not index-ascending
  either). Every module reaches them as `lax.top_k` (`from jax import
  lax`), so the patch reaches every caller. The compiled programs are
  dropped before (none traced with the real ops is reused) and after (none
  traced with these outlives the test)."""
  monkeypatch.setattr(jax.lax, "top_k", _highest_index_ties)
  monkeypatch.setattr(jax.lax, "approx_max_k", _highest_index_ties)
  jax.clear_caches()
  yield
  monkeypatch.undo()
  jax.clear_caches()


@pytest.fixture
def race_log(monkeypatch):
  """Every race-detector state the interpreter creates, one per launch.

  `streamidx.races_found()` reads the interpreter's module-level `races`,
  which each `pallas_call` replaces: after a multi-launch kernel it reports
  the last launch only. Recording each state keeps all of them.
  """
  import streamidx as si  # pylint: disable=g-import-not-at-top
  from jax._src.pallas.mosaic.interpret import interpret_pallas_call as ipc  # pylint: disable=g-import-not-at-top
  states = []

  class RecordingRaceDetectionState(ipc.RaceDetectionState):

    def __init__(self, *args, **kwargs):
      super().__init__(*args, **kwargs)
      states.append(self)

  monkeypatch.setattr(ipc, "RaceDetectionState", RecordingRaceDetectionState)
  yield states
  si.reset_interpreter_state()


@pytest.fixture
def chip_records(tmp_path, monkeypatch):
  """For one test, `streamidx.records` reads and appends a chip records file
  of the test's own (the other data files are data/'s); `write(doc)`
  replaces its contents."""
  import json  # pylint: disable=g-import-not-at-top
  from streamidx import records  # pylint: disable=g-import-not-at-top
  path, data_file = tmp_path / "chip.json", records.path
  monkeypatch.setattr(records, "path", lambda name: path if name == "chip"
                      else data_file(name))

  def write(doc):
    path.write_text(json.dumps(doc))
    records.load.cache_clear()

  write({"rows": [], "test_runs": [], "experiments": []})
  yield write
  records.load.cache_clear()


# ---------------------------------------------------------------------------
# Two tiers. `make test` (CI, and what README.md calls the tests) runs the
# "ci" tier: every module, every variant, cache format, launch and top-k
# method at least once. `make test-full` (STREAMIDX_TESTS=full) adds the
# tests marked `full`: the further points of the same matrices (more
# ratios, batches, block sizes, upstream shapes), each a kernel of its own
# for the interpreter to trace and compile, which is what a test here costs.

from tiers import TIER, TIERS  # pylint: disable=g-import-not-at-top,wrong-import-position

if TIER not in TIERS:
  raise pytest.UsageError(
      f"STREAMIDX_TESTS: one of {TIERS} (got {TIER!r})")


def pytest_report_header(config):
  del config
  return (f"streamidx test tier: {TIER}"
          + ("" if TIER == "full" else
             " (tests marked `full` deselected; STREAMIDX_TESTS=full or "
             "`make test-full` runs them)"))


def pytest_collection_modifyitems(config, items):
  dropped = [it for it in items if TIER != "full"
             and it.get_closest_marker("full")]
  if os.environ.get("STREAMIDX_TIER_RESUME"):  # `make test-tpu RESUME=1`
    passed = _passed_on_this_chip()
    dropped += [it for it in items if _test_id(it.nodeid) in passed]
  if dropped:
    config.hook.pytest_deselected(items=dropped)
    gone = set(dropped)
    items[:] = [it for it in items if it not in gone]


def _test_id(nodeid: str) -> str:
  """A tier test's id in the records: its node id less the file."""
  return nodeid.split("::", 1)[-1]


def _passed_on_this_chip() -> set[str]:
  """The TPU tier's tests whose newest recorded outcome on this process's
  chip passed (`records.tier_outcomes`); none off a TPU."""
  from streamidx import modes, records  # pylint: disable=g-import-not-at-top
  chip = modes.device_generation(jax.devices()[0])
  newest = records.tier_outcomes(r for r in records.test_runs()
                                 if r["chip"] == chip)
  return {t for t, o in newest.items() if o == "passed"} if chip else set()


# ---------------------------------------------------------------------------
# `make test-tpu` (STREAMIDX_RECORD_TEST_RUN=1) appends its counts and each
# finished test's outcome to the chip records (`streamidx.records`,
# "test_runs") when it ran on a TPU; a run cut short says so.

_SELECTED = []  # the tests this run selected (after -k)


def pytest_collection_finish(session):
  _SELECTED[:] = [it.nodeid for it in session.items]


def pytest_terminal_summary(terminalreporter, exitstatus, config):
  del config
  if not os.environ.get("STREAMIDX_RECORD_TEST_RUN"):
    return
  import datetime  # pylint: disable=g-import-not-at-top
  from streamidx import records  # pylint: disable=g-import-not-at-top
  from streamidx.lab.bench import record  # pylint: disable=g-import-not-at-top
  from streamidx import modes  # pylint: disable=g-import-not-at-top
  dev = jax.devices()[0]
  chip = modes.device_generation(dev)
  if chip is None:
    terminalreporter.write_line("test run not recorded: no TPU here")
    return
  outcomes = {}  # test id -> its outcome; a failed setup is a failure
  for key, outcome in (("passed", "passed"), ("skipped", "skipped"),
                       ("failed", "failed"), ("error", "failed")):
    for rep in terminalreporter.stats.get(key, ()):
      if getattr(rep, "nodeid", None) and (key != "passed"
                                           or rep.when == "call"):
        outcomes[_test_id(rep.nodeid)] = outcome
  run = dict(chip=chip, device_kind=dev.device_kind,
             **records.outcome_counts(outcomes), wall_s=time.perf_counter() - _STARTED,
             date=datetime.datetime.now(datetime.timezone.utc).isoformat(
                 timespec="seconds"),
             command=" ".join(["STREAMIDX_TIER_RESUME=1"] * bool(
                 os.environ.get("STREAMIDX_TIER_RESUME"))
                              + ["pytest"] + sys.argv[1:]),
             interrupted=exitstatus == pytest.ExitCode.INTERRUPTED,
             tier_tests=len(_SELECTED) + len(
                 terminalreporter.stats.get("deselected", ())),
             outcomes=outcomes, **record.versions())
  path = records.append_chip(runs=[run])
  terminalreporter.write_line(f"test run recorded in {path}: {run}")
