"""`streamidx.interpreter_internals_missing`: the guard for cells that read the
internals of JAX's Pallas TPU interpreter (a Colab runtime keeps its own jax);
`modes.numpy_callbacks`: what it changes for the interpreter's callbacks and
for everyone else's.

A JAX without those internals is simulated by deleting names from the
interpreter's module (monkeypatch restores them).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax._src import callback as jax_callback
from jax.experimental import io_callback
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu
from jax._src.pallas.mosaic.interpret import interpret_pallas_call as ipc

import streamidx as si
from streamidx import modes
from streamidx.lab.model import timeline


def test_the_locked_jax_has_every_internal_streamidx_reads():
  assert jax.__version__ == modes.INTERPRETER_INTERNALS_JAX
  assert si.interpreter_internals_missing() is None
  for feature in modes.INTERPRETER_INTERNALS:
    assert si.interpreter_internals_missing(feature) is None, feature


def test_timeline_wraps_only_listed_internals():
  listed = set(modes.INTERPRETER_INTERNALS["timeline"])
  assert {f"interpret_pallas_call.{n}" for n in timeline._WRAPPED} <= listed


def test_missing_detector_state_is_explained_and_race_check_refuses(monkeypatch):
  monkeypatch.delattr(ipc, "RaceDetectionState")
  reason = si.interpreter_internals_missing("race_check")
  assert reason.startswith(f"jax {jax.__version__}'s Pallas TPU interpreter lacks "
                           "interpret_pallas_call.RaceDetectionState")
  assert "jax 0.10.2" in reason
  assert si.interpreter_internals_missing("grid_point_recorder") is None
  with pytest.raises(RuntimeError, match="lacks interpret_pallas_call.RaceDetectionState"):
    with si.race_check():
      pass


def test_missing_dma_function_is_explained_and_timeline_refuses(monkeypatch):
  monkeypatch.delattr(ipc, "dma_wait")
  assert "interpret_pallas_call.dma_wait" in si.interpreter_internals_missing("timeline")
  assert si.interpreter_internals_missing("race_check") is None
  with pytest.raises(RuntimeError, match="timeline.record: .*lacks interpret_pallas_call.dma_wait"):
    with timeline.record():
      pass
  assert callable(getattr(ipc, "dma_start"))  # nothing was left wrapped


def test_unknown_feature_is_a_value_error():
  with pytest.raises(ValueError, match=r"features: must be among .*\(got \['profiler'\]\)"):
    si.interpreter_internals_missing("profiler")


def _tiny_kernel_output():
  """A fresh (so traced again) interpreted kernel: a DMA, a load, a store."""
  def kernel(x_hbm, o_ref, buf, sem):
    copy = pltpu.make_async_copy(x_hbm, buf, sem)
    copy.start()
    copy.wait()
    o_ref[...] = buf[...] * 2.0

  x = jnp.arange(8 * 128, dtype=jnp.float32).reshape(8, 128)
  return np.asarray(pl.pallas_call(
      kernel, in_specs=[pl.BlockSpec(memory_space=pltpu.HBM)],
      out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
      scratch_shapes=[pltpu.VMEM(x.shape, jnp.float32),
                      pltpu.SemaphoreType.DMA(())],
      interpret=modes.resolve_interpret())(x))


def _user_callback_gets_jax_arrays() -> bool:
  got = []
  jax.jit(lambda x: io_callback(lambda a: got.append(a) or a, x, x))(
      jnp.ones(3))
  return isinstance(got[0], jax.Array)


def test_numpy_callbacks_change_the_interpreters_arguments_only(monkeypatch):
  """On: the interpreter's callbacks get NumPy arrays, a user's io_callback
  still a jax.Array, and the kernel's output is the same as on JAX's path."""
  numpy_args = []
  get = ipc.get

  @functools.wraps(get)
  def recording_get(*args, **kwargs):
    numpy_args.append(isinstance(args[0], np.ndarray))  # the token
    return get(*args, **kwargs)

  monkeypatch.setattr(ipc, "get", recording_get)
  assert modes.numpy_callbacks()
  fast = _tiny_kernel_output()
  assert numpy_args and all(numpy_args)
  assert _user_callback_gets_jax_arrays()

  numpy_args.clear()
  numpy_callbacks = modes.numpy_callbacks
  assert numpy_callbacks(False) is False
  monkeypatch.setattr(modes, "numpy_callbacks", lambda enable=True: False)
  slow = _tiny_kernel_output()
  assert numpy_args and not any(numpy_args)
  np.testing.assert_array_equal(fast, slow)
  np.testing.assert_array_equal(fast, 2 * np.arange(8 * 128).reshape(8, 128))
  assert numpy_callbacks()  # on again for the tests after this one


def test_numpy_callbacks_stay_off_on_another_jax(monkeypatch):
  monkeypatch.setattr(jax, "__version__", "0.0.0")
  assert modes.numpy_callbacks() is False
  assert not hasattr(jax_callback.io_callback_impl, "jax_impl")
  monkeypatch.undo()
  assert modes.numpy_callbacks()
  assert jax_callback.io_callback_impl.jax_impl is not None
