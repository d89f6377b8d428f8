"""How the Pallas kernels execute: compiled on a TPU, interpreted elsewhere.

`streamidx.streamindex_topk` and `streamidx.streamindex_page_topk` need no
argument to run anywhere. When a call is traced, the mode is resolved as:

1. a mode forced with `interpreter(...)` (a context manager) or
   `set_interpreter(...)` (process-wide), if any;
2. otherwise compiled Mosaic when JAX's default backend is a TPU;
3. otherwise Pallas's TPU interpreter with default `pltpu.InterpretParams()`
   (DMAs, semaphores, scalar prefetch and VMEM scratch simulated on the CPU).

The forced mode is stored in JAX's own `pallas_tpu_interpret_mode` config
state, which is part of the jit cache key: a function traced in one mode is
never reused in another, inside `jax.jit` of the caller's too.

Typical use::

    with streamidx.race_check() as report:    # every launch, race detector on
        idx = streamidx.streamindex_topk(...)
    print(report.races_found, report.launches)

    with streamidx.interpreter(uninitialized_memory="nan"):
        idx = streamidx.streamindex_topk(...)

Interpreted calls return finished results. XLA:CPU runs an interpreted
kernel asynchronously, and the interpreter's host callbacks dispatch XLA work
of their own (`io_callback` hands them `jax.Array`s, and the interpreter
computes with them, e.g. `device_id * num_cores_per_device` at the grid's
barriers). That dispatch waits for a slot in XLA:CPU's bound on in-flight
computations; when the caller has queued enough work behind the kernel, the
slots are held by computations that wait on results that cannot come, and
the process hangs. So the public entry points (`blocking_when_interpreted`)
wait for their own result when the call ran interpreted, before returning;
inside a caller's `jax.jit` (tracers) they return at once, as any traced
function does.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools

import jax
from jax._src import config as _jax_config
from jax.experimental.pallas import tpu as pltpu

__all__ = [
    "interpreter",
    "set_interpreter",
    "resolve_interpret",
    "kernel_mode",
    "describe_machine",
    "races_found",
    "race_check",
    "RaceReport",
    "reset_interpreter_state",
    "on_tpu",
    "blocking_when_interpreted",
]


def on_tpu() -> bool:
  """True when JAX's default backend is a TPU."""
  return jax.default_backend() == "tpu"


def _params(params, **options) -> pltpu.InterpretParams:
  if params is None:
    return pltpu.InterpretParams(**options)
  if options:
    return dataclasses.replace(params, **options)
  return params


@contextlib.contextmanager
def interpreter(params: pltpu.InterpretParams | None = None, **options):
  """Forces Pallas's TPU interpreter for calls traced inside the block.

  Args:
    params: an `InterpretParams`; default `InterpretParams()`.
    **options: fields of `InterpretParams` to set, e.g. `detect_races=True`,
      `uninitialized_memory="nan"`, `dma_execution_mode="eager"`,
      `grid_point_recorder=fn`.

  Works on a TPU too (the kernel then runs interpreted on the host).
  """
  with pltpu.force_tpu_interpret_mode(_params(params, **options)):
    yield


def set_interpreter(params: pltpu.InterpretParams | None = None, **options):
  """Process-wide version of `interpreter`; `set_interpreter(False)` undoes it."""
  if params is False:
    _jax_config.pallas_tpu_interpret_mode_context_manager.set_global(None)
    return
  pltpu.set_tpu_interpret_mode(_params(params, **options))


def _forced():
  return _jax_config.pallas_tpu_interpret_mode_context_manager.value


def resolve_interpret():
  """The `interpret=` value a `pallas_call` traced now should get.

  `False` means compiled Mosaic; otherwise an `InterpretParams`.
  """
  forced = _forced()
  if forced is not None:
    return forced
  if on_tpu():
    return False
  return pltpu.InterpretParams()


def kernel_mode() -> str:
  """"compiled" or "interpreted": what a call traced now would use."""
  return "compiled" if resolve_interpret() is False else "interpreted"


def describe_machine() -> str:
  """One line naming the device and how the kernel runs on it."""
  dev = jax.devices()[0]
  kind = getattr(dev, "device_kind", dev.platform)
  how = ("compiled Mosaic kernel" if kernel_mode() == "compiled"
         else "Pallas TPU interpreter (simulated TPU, timings are not TPU timings)")
  return f"{dev.platform.upper()} ({kind}), jax {jax.__version__}: {how}"


def races_found() -> bool:
  """Whether the LAST interpreted `pallas_call` run with `detect_races=True`
  saw a race.

  `streamindex_topk` makes four launches; this sees only the last one. Use
  `race_check()` to check every launch of a block of code.
  """
  # The races object is replaced on every run: read it through its module.
  from jax._src.pallas.mosaic.interpret import interpret_pallas_call as ipc

  return bool(ipc.races.races_found)


class RaceReport:
  """What `race_check` saw: one detector state per interpreted launch."""

  def __init__(self):
    self.states = []

  @property
  def launches(self) -> int:
    return len(self.states)

  @property
  def races_found(self) -> bool:
    return any(bool(s.races_found) for s in self.states)

  def __repr__(self):
    return (f"RaceReport(launches={self.launches}, "
            f"races_found={self.races_found})")


@contextlib.contextmanager
def race_check(params: pltpu.InterpretParams | None = None, **options):
  """Runs the block in the interpreter with the race detector on every launch.

  Yields a `RaceReport`; after the block, `report.races_found` is True if any
  interpreted launch inside saw a race, and `report.launches` counts them.
  Options are `InterpretParams` fields, as for `interpreter`.
  """
  from jax._src.pallas.mosaic.interpret import interpret_pallas_call as ipc

  report = RaceReport()
  base = ipc.RaceDetectionState

  class _Recording(base):  # pylint: disable=missing-class-docstring

    def __init__(self, *args, **kwargs):
      super().__init__(*args, **kwargs)
      report.states.append(self)

  ipc.RaceDetectionState = _Recording
  try:
    with interpreter(params, detect_races=True, **options):
      yield report
  finally:
    ipc.RaceDetectionState = base


def _is_traced(tree) -> bool:
  return any(isinstance(leaf, jax.core.Tracer)
             for leaf in jax.tree_util.tree_leaves(tree))


def blocking_when_interpreted(jitted):
  """Wraps a jitted entry point so an interpreted call returns a finished
  result (`jax.block_until_ready`); compiled calls and traced calls (inside
  `jax.jit`, `jax.eval_shape`, `shard_map`, `vmap`: the results are tracers)
  return as the jitted function does. `lower`, `trace`, `eval_shape` and
  `clear_cache` are the jitted function's own.

  Why: see the module docstring (an interpreted kernel left running while
  more work is queued can hang XLA:CPU).
  """

  @functools.wraps(jitted)
  def call(*args, **kwargs):
    interpreted = kernel_mode() == "interpreted"  # the mode it traces with
    out = jitted(*args, **kwargs)
    if interpreted and not _is_traced(out):
      out = jax.block_until_ready(out)
    return out

  for name in ("lower", "trace", "eval_shape", "clear_cache"):
    if hasattr(jitted, name):
      setattr(call, name, getattr(jitted, name))
  return call


def reset_interpreter_state():
  """Call after an exception inside an interpreted kernel."""
  pltpu.reset_tpu_interpret_mode_state()
