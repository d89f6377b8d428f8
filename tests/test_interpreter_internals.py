"""`streamidx.interpreter_internals_missing`: the guard for cells that read the
internals of JAX's Pallas TPU interpreter (a Colab runtime keeps its own jax).

A JAX without those internals is simulated by deleting names from the
interpreter's module (monkeypatch restores them).
"""

from __future__ import annotations

import jax
import pytest
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
