"""streamidx.lab.studies.costs: recorded calls and the bytes they count."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from streamidx.lab.model import timeline
from streamidx.lab.studies import costs


def test_recorded_call_records_where_the_interpreter_has_the_internals():
  out, rec = costs.recorded_call(lambda: jnp.arange(3) * 2)
  np.testing.assert_array_equal(out, [0, 2, 4])
  assert isinstance(rec, timeline.Recorder)


def test_recorded_call_still_returns_the_result_without_the_internals(monkeypatch):
  monkeypatch.setattr(costs.modes, "interpreter_internals_missing",
                      lambda *f: "jax X lacks Y")
  out, rec = costs.recorded_call(lambda: jnp.arange(3) * 2)
  np.testing.assert_array_equal(out, [0, 2, 4])
  assert rec is None


def test_recorded_bytes_of_an_empty_recording_are_zero():
  with timeline.record() as rec:
    pass
  got = costs.recorded_bytes(rec, page_size=16)
  assert (got["kv_bytes"], got["kv_pages"], got["entries_fetched"]) == (0, 0, 0)
  assert np.isnan(got["bytes_per_entry"])
