"""Trace capture and parsing.

The capture test runs a tiny interpreted kernel call under `jax.profiler` on
this CPU and parses the trace it writes. The device-line parser is checked on
a synthetic trace laid out as JAX's profiler lays out a TPU trace (a
"/device:TPU:0" process with an "XLA Ops" thread): no TPU was available to
record a real one.
"""

import gzip
import json

import pytest

import streamidx as si
from streamidx import records
from streamidx.lab.model import profiling


@pytest.fixture(scope="module")
def captured(tmp_path_factory):
  b = si.make_mixed_batch(decode=[64, 100], page_size=16, compression_ratio=4)
  inp = si.make_inputs(b, num_heads=4, fmt="fp8")
  kw = dict(k=8, compression_ratio=4, num_kv_pages_per_block=8,
            num_queries_per_block=(1, 8, 8), decode_req_batch_size=2)
  d = tmp_path_factory.mktemp("trace")
  return profiling.capture(lambda: si.streamindex_topk(*inp.args, **kw),
                           log_dir=d, iterations=2)


def test_capture_writes_a_perfetto_trace_and_an_xplane(captured):
  assert captured.perfetto_path.endswith("perfetto_trace.json.gz")
  assert captured.xplane_paths and captured.iterations == 2
  assert len(captured.host_wall_s) == 2 and min(captured.host_wall_s) > 0


def test_trace_of_cpu_run_has_no_device_lines_and_says_so(captured):
  trace = profiling.load_trace(captured.perfetto_path)
  assert trace.events and trace.device_pids() == []
  t = profiling.stage_times(trace, iterations=captured.iterations)
  assert t["device"] is False and t["total_s"] is None and t["scoring_s"] is None
  assert "not a TPU run" in t["source"]
  # One annotation per iteration; their mean is the host-side call time.
  assert t["host_call_events"] == 2
  assert 0 < t["host_call_s"] <= max(captured.host_wall_s) * 1.5


def _synthetic_tpu_trace(path, iterations=2, modules=True):
  """Two iterations of one call as a TPU trace lays them out: the module on
  "XLA Modules", its ops on "XLA Ops", the scoring launch inside the M14
  `conditional` that spans it (nested events on one line)."""
  ev = [
      {"ph": "M", "pid": 1, "name": "process_name", "args": {"name": "/device:TPU:0"}},
      {"ph": "M", "pid": 1, "tid": 2, "name": "thread_name", "args": {"name": "XLA Ops"}},
      {"ph": "M", "pid": 1, "tid": 3, "name": "thread_name", "args": {"name": "XLA Modules"}},
      {"ph": "M", "pid": 9, "name": "process_name", "args": {"name": "/host:CPU"}},
  ]
  scope = "jit(_pipeline)/jit(main)/"
  for i in range(iterations):
    t0 = 1000.0 * i
    if modules:
      ev.append({"ph": "X", "pid": 1, "tid": 3, "ts": t0, "dur": 500.0,
                 "name": "jit__pipeline(123)"})
    ev += [
        {"ph": "X", "pid": 1, "tid": 2, "ts": t0, "dur": 10.0, "name": "broadcast.1",
         "args": {"tf_op": scope + "streamidx_fill/broadcast_in_dim"}},
        {"ph": "X", "pid": 1, "tid": 2, "ts": t0 + 10, "dur": 305.0,
         "name": "conditional.2", "args": {"tf_op": scope + "streamidx_scoring/cond"}},
        {"ph": "X", "pid": 1, "tid": 2, "ts": t0 + 12, "dur": 300.0,
         "name": "custom-call.3",
         "args": {"long_name": "jit(streamindex_topk)/StreamIdxTC-d-bq_1-bkvp_3/pallas_call"}},
        {"ph": "X", "pid": 1, "tid": 2, "ts": t0 + 320, "dur": 20.0, "name": "copy.4"},
        {"ph": "X", "pid": 1, "tid": 2, "ts": t0 + 340, "dur": 40.0,
         "name": "sort.2", "args": {"tf_op": scope + "select_topk_sort/sort"}},
        {"ph": "X", "pid": 1, "tid": 2, "ts": t0 + 380, "dur": 5.0, "name": "gather.9"},
        {"ph": "X", "pid": 9, "tid": 7, "ts": t0, "dur": 900.0,
         "name": profiling.ITERATION_ANNOTATION},
    ]
  with gzip.open(path, "wt") as f:
    json.dump({"traceEvents": ev}, f)
  return path


def test_stage_times_counts_nested_ops_once_and_sums_to_the_module(tmp_path):
  trace = profiling.load_trace(_synthetic_tpu_trace(tmp_path / "t.json.gz"))
  t = profiling.stage_times(trace, iterations=2)
  assert t["device"] is True and "XLA Modules" in t["source"]
  assert t["total_s"] == pytest.approx(500e-6)  # the module, not 675 us of ops
  assert t["fill_s"] == pytest.approx(10e-6)
  assert t["scoring_s"] == pytest.approx(305e-6)  # the launch + its conditional
  assert t["copies_s"] == pytest.approx(20e-6)
  assert t["selection_s"] == pytest.approx(40e-6)
  assert t["other_s"] == pytest.approx(5e-6)
  assert t["idle_s"] == pytest.approx(120e-6)  # module time no op covers
  assert sum(t[f"{p}_s"] for p in records.PARTS) == pytest.approx(t["total_s"])
  assert t["host_call_s"] == pytest.approx(900e-6)
  assert {r["name"]: r["stage"] for r in t["ops"]}["conditional.2"] == "scoring"


def test_an_unscoped_sort_is_the_selection_and_unnamed_ops_go_where_told(tmp_path):
  """XLA's TPU sort passes drop the op's scope: an unscoped "sort" is the
  selection's; a program of one stage names where the rest goes."""
  assert profiling.stage_of({"name": "sort.16"}) == "selection"
  assert profiling.stage_of({"name": "gather.9"}) == "other"
  assert profiling.stage_of({"name": "gather.9"}, "selection") == "selection"
  trace = profiling.load_trace(_synthetic_tpu_trace(tmp_path / "t.json.gz"))
  t = profiling.stage_times(trace, iterations=2, unnamed="selection")
  assert t["other_s"] == 0.0 and t["selection_s"] == pytest.approx(45e-6)
  assert {r["name"]: r["stage"] for r in t["ops"]}["gather.9"] == "selection"


def test_stage_times_without_a_module_line_is_the_busy_time(tmp_path):
  trace = profiling.load_trace(_synthetic_tpu_trace(tmp_path / "t.json.gz",
                                                    modules=False))
  t = profiling.stage_times(trace, iterations=2)
  assert "module line is missing" in t["source"]
  assert t["total_s"] == pytest.approx(380e-6) and t["idle_s"] == 0.0


def test_compile_only_tpu_devices_are_not_device_lines(tmp_path):
  """After `compile_for` the process has libtpu's compile-only TPU devices;
  their empty planes in a CPU run's trace are no device run."""
  if si.modes.libtpu_path() is None:
    pytest.skip("libtpu is not installed (make venv puts it in .venv/tpu-compile)")
  import jax.numpy as jnp
  with si.compile_for("v5e"):
    pass
  cap = profiling.capture(lambda: jnp.ones(8) + 1, log_dir=tmp_path,
                          iterations=1)
  trace = profiling.load_trace(cap.perfetto_path)
  assert trace.device_pids() == []
  assert profiling.stage_times(trace, iterations=1)["device"] is False



def test_profile_of_a_cpu_run_is_the_stage_times_without_device_lines(tmp_path):
  import jax.numpy as jnp
  t = profiling.profile(lambda: jnp.ones(8) + 1, iterations=2,
                        trace_dir=str(tmp_path))
  assert t["device"] is False and t["total_s"] is None
  assert t["host_call_events"] == 2 and list(tmp_path.iterdir()) == []


def test_capture_paces_its_calls(tmp_path, monkeypatch):
  """`gap_s`: None, each call waited for; > 0, that long idle after each;
  0, dispatched back to back and waited for once; < 0 refused."""
  import jax.numpy as jnp
  waits, sleeps = [], []
  block = profiling.jax.block_until_ready
  monkeypatch.setattr(profiling.jax, "block_until_ready",
                      lambda x: waits.append(x) or block(x))
  monkeypatch.setattr(profiling.time, "sleep", sleeps.append)
  fn = lambda: jnp.ones(8) + 1
  for gap, calls, idle in ((None, 3, []), (0.25, 3, [0.25] * 3), (0.0, 1, [])):
    waits.clear(), sleeps.clear()
    cap = profiling.capture(fn, log_dir=tmp_path / str(gap), iterations=3,
                            warmup=0, gap_s=gap)
    assert len(waits) == len(cap.host_wall_s) == calls and sleeps == idle
  assert len(waits[0]) == 3  # back to back: the three results at once
  with pytest.raises(ValueError, match="gap_s"):
    profiling.capture(fn, log_dir=tmp_path, gap_s=-1.0)
