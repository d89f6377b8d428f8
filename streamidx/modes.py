"""How the Pallas kernels execute: compiled on a TPU, interpreted elsewhere.

When a call is traced, the mode is: the innermost of `interpreter(...)` and
`compile_for(generation)` (compiled Mosaic for that TPU generation, on any
host), or `set_interpreter(...)` (process-wide); else compiled Mosaic on a
TPU backend; else Pallas's TPU interpreter. Both are part of the jit cache
key (docs/usage.md, docs/tpu.md).
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.util
import os
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any

import jax
from jax._src import config as _jax_config
import numpy as np
from jax.experimental.pallas import tpu as pltpu

from streamidx import records


def on_tpu() -> bool:
  """True when JAX's default backend is a TPU."""
  return jax.default_backend() == "tpu"


def _params(params, **options) -> pltpu.InterpretParams:
  return dataclasses.replace(params or pltpu.InterpretParams(), **options)


def on_host():
  """A block whose JAX calls run on the host CPU (the interpreter's
  simulation, float64 studies, oracles); a no-op where JAX has no CPU
  backend (JAX_PLATFORMS without cpu)."""
  try:
    return jax.default_device(jax.local_devices(backend="cpu")[0])
  except RuntimeError:
    return contextlib.nullcontext()


@contextlib.contextmanager
def interpreter(params: pltpu.InterpretParams | None = None, **options):
  """Forces Pallas's TPU interpreter (also on a TPU) for calls traced inside
  the block: `params` (default `InterpretParams()`) with `**options` (its
  fields, e.g. `detect_races=True`, `uninitialized_memory="nan"`) set. On a
  TPU host the block's default device is the host CPU: the simulation is
  host work, which on the chip would cross to the host at every simulated
  load, store and DMA."""
  host = on_host() if on_tpu() else contextlib.nullcontext()
  with pltpu.force_tpu_interpret_mode(_params(params, **options)), host:
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
  """The `interpret=` of a `pallas_call` traced now: False (compiled
  Mosaic) or an `InterpretParams` (then with `numpy_callbacks` on)."""
  forced = _forced()
  if forced is None and (compile_target() is not None or on_tpu()):
    return False
  numpy_callbacks()
  return pltpu.InterpretParams() if forced is None else forced


def kernel_mode() -> str:
  """"compiled" or "interpreted": what a call traced now would use."""
  return "compiled" if resolve_interpret() is False else "interpreted"


def describe_machine() -> str:
  """One line naming the device and how the kernel runs on it."""
  dev = jax.devices()[0]
  kind = getattr(dev, "device_kind", dev.platform)
  target = compile_target()
  if target is not None and _forced() is None:
    how = (f"compiled Mosaic kernel for {target.generation} "
           f"({target.device.device_kind}, compile only: nothing runs)")
  elif kernel_mode() == "compiled":
    how = "compiled Mosaic kernel"
  else:
    how = "Pallas TPU interpreter (simulated TPU, timings are not TPU timings)"
  return f"{dev.platform.upper()} ({kind}), jax {jax.__version__}: {how}"


# ---------------------------------------------------------------------------
# Compiling for a TPU generation without a TPU.

# Generation -> the smallest topology libtpu describes for it (one chip is
# enough for the kernel, whose grid runs on one TensorCore).
TOPOLOGIES: dict[str, str] = {
    "v4": "v4:2x2x1",
    "v5e": "v5e:2x2",
    "v5p": "v5p:2x2x1",
    "v6e": "v6e:2x2",
    "v7x": "tpu7x:2x2x1",
}

# The generation `compile_for` traces for (None: not compiling for a target).
# Part of the jit cache key, like the forced interpreter.
_COMPILE_TARGET = _jax_config.config_ext.Config(
    "streamidx_compile_target", None, include_in_jit_key=True,
    include_in_trace_context=True)

_LIBTPU_DIR = "tpu-compile"  # under sys.prefix: where `make venv` puts libtpu
_topologies: dict[str, Any] = {}
_topology_lock = threading.Lock()


@dataclasses.dataclass(frozen=True)
class CompileTarget:
  """What `compile_for` yields: the TPU generation and its topology's
  compile-only devices (arguments are `ShapeDtypeStruct`s on them, `spec`,
  `specs`; never `device_put` onto them)."""

  generation: str  # "v4", "v5e", "v5p", "v6e" or "v7x"
  topology: str  # libtpu's topology name, e.g. "v6e:2x2"
  devices: tuple  # every device of the topology
  tpu_generation: int  # the chip's generation number (4, 5, 6, 7)

  device = property(lambda self: self.devices[0])  # the one compiled for

  def spec(self, shape, dtype) -> jax.ShapeDtypeStruct:
    """A `ShapeDtypeStruct` on the target device."""
    return jax.ShapeDtypeStruct(
        tuple(shape), dtype,
        sharding=jax.sharding.SingleDeviceSharding(self.device))

  def specs(self, args):
    """`args` (arrays or `ShapeDtypeStruct`s, any pytree) as specs on the target."""
    return jax.tree.map(lambda a: self.spec(a.shape, a.dtype), args)


def compile_target() -> CompileTarget | None:
  """The `CompileTarget` of the innermost `compile_for` block, or None."""
  return _COMPILE_TARGET.value


def device_generation(device=None) -> str | None:
  """The TPU generation (`TOPOLOGIES`' keys) of `device` (default: JAX's first) by
  its `device_kind`, one of its generation's `device_kinds` in data/tpu_specs.json
  ('TPU v5 lite' -> 'v5e'); None off-TPU or for a kind the table does not name."""
  device = jax.devices()[0] if device is None else device
  if getattr(device, "platform", None) != "tpu":
    return None
  kind = getattr(device, "device_kind", "").strip().lower()
  return next((g for g, s in records.load("tpu_specs")["generations"].items()
               if kind in (k.lower() for k in s["device_kinds"])), None)


def current_generation() -> str | None:
  """The TPU generation a call traced now runs on: None under a forced
  interpreter (it simulates no one chip, on a TPU host too), else
  `compile_for`'s target, else the default TPU device's
  (`device_generation`); None off-TPU. The one answer every block-size and
  top-k-method lookup takes by default (`streamidx.blocks.lookup`,
  `streamidx.topk.defaults.lookup`)."""
  if _forced() is not None:
    return None
  target = compile_target()
  return device_generation() if target is None else target.generation


def libtpu_path() -> str | None:
  """The libtpu `compile_for` loads, or None: `$TPU_LIBRARY_PATH`, an
  importable `libtpu` package, or `<venv>/tpu-compile/libtpu/libtpu.so`
  (`make venv`: off the import path)."""
  env = os.environ.get("TPU_LIBRARY_PATH")
  if env and os.path.isfile(env):
    return env
  if importlib.util.find_spec("libtpu") is not None:
    import libtpu  # pylint: disable=g-import-not-at-top

    return libtpu.get_library_path()
  local = Path(sys.prefix) / _LIBTPU_DIR / "libtpu" / "libtpu.so"
  return str(local) if local.is_file() else None


@contextlib.contextmanager
def _quiet_stderr(sink: list):
  """fd 2 to a temporary file for the block, appended to `sink` after it
  (libtpu's start-up warnings are noise off-TPU)."""
  sys.stderr.flush()
  saved = os.dup(2)
  with tempfile.TemporaryFile(mode="w+b") as tmp:
    os.dup2(tmp.fileno(), 2)
    try:
      yield
    finally:
      sys.stderr.flush()
      os.dup2(saved, 2)
      os.close(saved)
      tmp.seek(0)
      sink.append(tmp.read().decode(errors="replace"))


@contextlib.contextmanager
def _keep_signal_handlers():
  """Restores SIGTERM's and SIGINT's handlers after the block: libtpu's
  failure-signal handler would print a stack trace on a plain SIGTERM or
  Ctrl-C (crash signals keep it)."""
  import signal  # pylint: disable=g-import-not-at-top

  if threading.current_thread() is not threading.main_thread():
    yield
    return
  saved = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
  try:
    yield
  finally:
    for sig, handler in saved.items():
      if handler is not None:
        signal.signal(sig, handler)


def _topology(generation: str):
  """The topology description of `generation`, loading libtpu on first use."""
  if generation not in TOPOLOGIES:
    raise ValueError(f"generation: must be one of {tuple(TOPOLOGIES)} "
                     f"(got {generation!r})")
  with _topology_lock:
    if generation in _topologies:
      return _topologies[generation]
    path = libtpu_path()
    if path is None:
      raise RuntimeError(
          "compile_for needs libtpu (the TPU compiler): `make venv` installs "
          "it into .venv/tpu-compile, or `pip install 'streamidx[tpu-compile]'`"
          " (then set JAX_PLATFORMS=cpu on hosts without a TPU)")
    from jax.experimental import topologies  # pylint: disable=g-import-not-at-top

    # Start JAX's own backends first, while no TPU library is visible to them.
    jax.devices()
    env = {"TPU_LIBRARY_PATH": path, "ALLOW_MULTIPLE_LIBTPU_LOAD": "1"}
    saved = {k: os.environ.get(k) for k in env}
    noise: list[str] = []
    try:
      os.environ.update(env)
      with _quiet_stderr(noise), _keep_signal_handlers():
        topo = topologies.get_topology_desc(
            topology_name=TOPOLOGIES[generation], platform="tpu")
    except Exception as e:
      raise RuntimeError(f"libtpu ({path}) could not describe topology "
                         f"{TOPOLOGIES[generation]!r}: {e}\n"
                         f"libtpu said: {''.join(noise)}") from e
    finally:
      for k, v in saved.items():
        if v is None:
          os.environ.pop(k, None)
        else:
          os.environ[k] = v
    _topologies[generation] = topo
    return topo


@contextlib.contextmanager
def no_persistent_cache_writes():
  """Nothing compiled inside the block (this thread) goes to JAX's
  persistent compilation cache: a compile-only TPU client's executables
  cannot be loaded back (jax 0.10.2), a later process warned and recompiled."""
  with _jax_config.persistent_cache_min_compile_time_secs(float("inf")):
    yield


@contextlib.contextmanager
def compile_for(generation: str):
  """Traces the kernels compiled (Mosaic) for TPU `generation` (one of
  `TOPOLOGIES`), on any host; yields a `CompileTarget`. Inside, JAX's default
  device is the target's, an outer forced interpreter does not apply, nothing
  goes to the persistent cache (docs/tpu.md). Needs libtpu."""
  topo = _topology(generation)
  devices = tuple(topo.devices)
  with jax.default_device(devices[0]):
    info_generation = pltpu.get_tpu_info().generation
  target = CompileTarget(generation, TOPOLOGIES[generation], devices,
                         int(info_generation))
  prev_interp = _jax_config.pallas_tpu_interpret_mode_context_manager.swap_local(
      None)
  prev_target = _COMPILE_TARGET.swap_local(target)
  try:
    with jax.default_device(target.device), no_persistent_cache_writes():
      yield target
  finally:
    _COMPILE_TARGET.set_local(prev_target)
    _jax_config.pallas_tpu_interpret_mode_context_manager.set_local(prev_interp)


# ---------------------------------------------------------------------------
# Internals of Pallas's TPU interpreter that streamidx reads.

# The jax version these were written and tested against (requirements.lock).
INTERPRETER_INTERNALS_JAX = "0.10.2"
_INTERPRETER_PACKAGE = "jax._src.pallas.mosaic.interpret"
# Feature -> the names it reads: `<module>.<name>` of `_INTERPRETER_PACKAGE`
# or `InterpretParams.<field>` (public Pallas API needs none of these).
_IPC = "interpret_pallas_call."
INTERPRETER_INTERNALS: dict[str, tuple[str, ...]] = {
    # race_check() subclasses the detector's state; races_found() reads `races`.
    "race_check": (_IPC + "RaceDetectionState", _IPC + "races",
                   "InterpretParams.detect_races"),
    # lab.model.timeline.record() wraps these to record the DMAs.
    "timeline": tuple(_IPC + n for n in (
        "_initialize_shared_memory", "_allocate_buffer", "_allocate_semaphores",
        "dma_start", "dma_wait", "get", "swap", "TPU_MEMORY_SPACE_NAMES")) + (
            "utils.to_range", "InterpretParams.grid_point_recorder"),
    # interpreter(grid_point_recorder=fn): a callback at each grid point.
    "grid_point_recorder": ("InterpretParams.grid_point_recorder",),
}


def _has_internal(name: str) -> bool:
  head, attr = name.split(".", 1)
  if head == "InterpretParams":
    return attr in {f.name for f in dataclasses.fields(pltpu.InterpretParams)}
  try:
    module = importlib.import_module(f"{_INTERPRETER_PACKAGE}.{head}")
  except ImportError:
    return False
  return hasattr(module, attr)


def interpreter_internals_missing(*features: str) -> str | None:
  """None when this JAX's interpreter has every name `features` (keys of
  `INTERPRETER_INTERNALS`; none: all) use, checked by name; else one line
  for a notebook to show instead of failing."""
  unknown = sorted(set(features) - set(INTERPRETER_INTERNALS))
  if unknown:
    raise ValueError(f"features: must be among {sorted(INTERPRETER_INTERNALS)} "
                     f"(got {unknown})")
  features = features or tuple(INTERPRETER_INTERNALS)
  wanted = dict.fromkeys(n for f in features for n in INTERPRETER_INTERNALS[f])
  missing = [n for n in wanted if not _has_internal(n)]
  if not missing:
    return None
  return (f"jax {jax.__version__}'s Pallas TPU interpreter lacks {', '.join(missing)} "
          f"({_INTERPRETER_PACKAGE}), which {', '.join(features)} reads: written "
          f"against the interpreter of jax {INTERPRETER_INTERNALS_JAX} (requirements.lock)")


def _require_internals(feature: str):
  reason = interpreter_internals_missing(feature)
  if reason:
    raise RuntimeError(reason)


def races_found() -> bool:
  """Whether the LAST interpreted `pallas_call` with `detect_races=True` saw
  a race (one launch of several: `race_check()` sees every launch)."""
  _require_internals("race_check")
  # The races object is replaced on every run: read it through its module.
  from jax._src.pallas.mosaic.interpret import interpret_pallas_call as ipc

  return bool(ipc.races.races_found)


class RaceReport:
  """What `race_check` saw: one detector state per interpreted launch."""

  def __init__(self):
    self.states = []

  launches = property(lambda self: len(self.states))
  races_found = property(lambda self: any(bool(s.races_found)
                                          for s in self.states))

  def __repr__(self):
    return (f"RaceReport(launches={self.launches}, "
            f"races_found={self.races_found})")


@contextlib.contextmanager
def race_check(params: pltpu.InterpretParams | None = None, **options):
  """Runs the block interpreted with the race detector on every launch;
  yields a `RaceReport` (`races_found`: any launch saw a race; `launches`).
  Options as for `interpreter`. RuntimeError on a JAX whose interpreter
  lacks the detector state it reads."""
  _require_internals("race_check")
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


def numpy_callbacks(enable: bool = True) -> bool:
  """The TPU interpreter's host callbacks get the NumPy arrays XLA passes,
  not JAX's `io_callback` round trip (ARCHITECTURE.md, "Test-suite cost");
  locked jax only; `enable=False` restores JAX's. Whether it is on."""
  from jax._src import callback as cb  # pylint: disable=g-import-not-at-top
  jax_impl = getattr(cb.io_callback_impl, "jax_impl", cb.io_callback_impl)
  if not enable or jax.__version__ != INTERPRETER_INTERNALS_JAX:
    cb.io_callback_impl = jax_impl
    return False
  if cb.io_callback_impl is not jax_impl:  # on already
    return True

  def impl(*args, callback, **params):
    func = getattr(callback.callback_func, "func", callback.callback_func)
    if not getattr(func, "__module__", "").startswith(_INTERPRETER_PACKAGE):
      return jax_impl(*args, callback=callback, **params)
    with on_host():
      return [np.asarray(x) for x in callback(*args)]  # it copies what it keeps

  impl.jax_impl, cb.io_callback_impl = jax_impl, impl
  return True


def reset_interpreter_state():
  """Call after an exception inside an interpreted kernel."""
  pltpu.reset_tpu_interpret_mode_state()
