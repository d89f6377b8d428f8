"""lab.studies.device_timing (notebook 08's harness): the check of a call
against its reference at the derived tolerance, and its trace.

The sweep, the configurations and the text built from them are notebook 08's
cells; its own asserts check them (CI runs it)."""

import jax.numpy as jnp
import numpy as np
import pytest

import streamidx as si
from streamidx.lab.studies import device_timing

KW = dict(k=8, compression_ratio=4, num_kv_pages_per_block=(8, 8, 8),
          num_queries_per_block=(1, 16, 16), decode_req_batch_size=2)


@pytest.fixture(scope="module")
def call():
  b = si.make_mixed_batch(decode=[256, 200], page_size=16, compression_ratio=4)
  inp = si.make_inputs(b, num_heads=2, fmt="fp8", seed=0)
  v = si.VARIANTS["vendored"]
  return v, inp, np.asarray(v.reference(*v.args(inp, "fp8"), **KW))


def test_check_accepts_the_reference_at_a_derived_tolerance(call):
  v, inp, want = call
  c = device_timing.check_topk(want, v, inp, KW, "fp8", 4, on_tpu=False)
  assert c["ok"] and c["atol"] > 0  # derived, never 0
  assert c["rows_identical"] + c["rows_tied"] == c["rows"] == 2
  assert "recall" not in c


def test_check_raises_off_a_tpu_and_reports_on_one(call):
  v, inp, want = call
  bad = want.copy()
  bad[0] = -1  # row 0 selects nothing
  with pytest.raises(AssertionError, match="derived tolerance"):
    device_timing.check_topk(bad, v, inp, KW, "fp8", 4, on_tpu=False)
  c = device_timing.check_topk(bad, v, inp, KW, "fp8", 4, on_tpu=True)
  assert not c["ok"] and c["rows_mismatched"] == 1 and c["detail"]


def test_check_reports_approx_by_its_recall(call):
  v, inp, want = call
  kw = dict(KW, topk_method="approx")
  bad = want.copy()
  bad[0] = -1
  c = device_timing.check_topk(bad, v, inp, kw, "fp8", 4, on_tpu=False)
  assert c["recall"] == pytest.approx(0.5)  # one row of two found nothing


def test_trace_point_off_a_tpu_parses_events_but_reads_no_device_time(tmp_path):
  cap, t, events = device_timing.trace_point(
      lambda: jnp.arange(4) + 1, log_dir=str(tmp_path), iterations=1, warmup=1)
  assert cap.iterations == 1 and events > 0
  assert t["scoring_s"] is None and t["total_s"] is None
