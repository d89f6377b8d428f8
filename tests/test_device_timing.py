"""lab.studies.device_timing (notebook 06): configurations, checks against
the references at the derived tolerance, the model beside each, the text."""

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
import pytest  # pylint: disable=g-import-not-at-top

import streamidx as si  # pylint: disable=g-import-not-at-top
from streamidx import topk as topk_lib  # pylint: disable=g-import-not-at-top
from streamidx.lab import plots  # pylint: disable=g-import-not-at-top
from streamidx.lab.studies import device_timing  # pylint: disable=g-import-not-at-top

SIZES = dict(batch_sizes=[2], context_tokens=[256], num_heads=2, page_size=16,
             k=8, kv_blocks=[8, 8, 8], q_blocks=[1, 16, 16], page_q_block=1,
             iterations=1, topk_methods=["sort"])


def test_configs_cover_both_kernels_sort_decode_and_every_method():
  labels = [c.label for c in device_timing.configs()]
  assert labels[:4] == ["vendored", "vendored, sort_decode off", "dense",
                        "dense, sort_decode off"]
  # The vendored kernel takes every method but the fused one, which runs
  # on the dense kernel (it writes the block maxima).
  assert labels[4:] == [
      f"{'vendored' if m in topk_lib.KERNEL_TOPK_METHODS else 'dense'}, "
      f"topk_method={m}" for m in topk_lib.TOPK_METHODS if m != "sort"]
  assert "dense, topk_method=fused_blockmax" in labels
  short = device_timing.configs(["sort"], sort_decode_off=False)
  assert [(c.variant, c.fmt) for c in short] == [("vendored", "fp8"),
                                                 ("dense", "dense_fp8")]


@pytest.fixture(scope="module")
def records(tmp_path_factory):
  cfgs = [c for c in device_timing.configs(["sort", "approx"])
          if c.label in ("vendored", "dense, sort_decode off",
                         "vendored, topk_method=approx")]
  recs, batch, bounds = device_timing.variant_study(
      SIZES, cfgs, generation="v5e", want_schedule=False, compression_ratio=4,
      decode_req_batch_size=2, seed=0,
      output_dir=str(tmp_path_factory.mktemp("dt")), warmup=1, on_tpu=False)
  return recs, batch, bounds


def test_every_configuration_is_checked_and_modelled_off_tpu(records):
  recs, batch, bounds = records
  assert bounds == {} and batch.num_seqs == 2
  for r in recs:
    c = r["check"]
    assert c["ok"] and c["atol"] > 0, r["label"]  # derived, never 0
    assert c["rows_identical"] + c["rows_tied"] == c["rows"]
    assert r["total_us"] is None and r["kernel_us"] is None  # no TPU
    assert r["roofline us"] > r["kernel roofline us"] > 0
    assert r["static schedule us"] is None
  by = {r["label"]: r for r in recs}
  assert "recall" in by["vendored, topk_method=approx"]["check"]
  # The dense format reads fewer cache bytes than the packed record.
  assert by["dense, sort_decode off"]["kv MB"] < by["vendored"]["kv MB"]


def test_the_text_says_no_device_timing_exists_off_tpu(records):
  recs, _, _ = records
  title = device_timing.variant_title(recs, measured=False)
  assert title.startswith("No TPU here, model only (v5e)")
  rows = device_timing.variant_rows(recs)
  assert rows[0]["measured total us"] is None
  assert rows[2]["vs reference"].startswith("recall ")
  _, preds = device_timing.predictions(["token"], SIZES, fmt="fp8",
                                       compression_ratio=4,
                                       decode_req_batch_size=2)
  key = next(iter(preds))
  text = device_timing.answer_markdown(
      machine="CPU", on_tpu=False, generation=None, sweep_records=[],
      variant_records=recs, model_point=key, model_pred=preds[key])
  assert "no device timing exists" in text
  assert f"3 of {len(recs)}" in text


def test_variant_figure_draws_the_model_only_without_a_tpu(records):
  recs, _, _ = records
  fig = plots.variant_timing_figure(recs, measured=False, title="t")
  ax = fig.axes[0]
  assert len(ax.patches) == len(recs)  # hollow roofline bars only
  assert [p.get_width() for p in ax.patches] == pytest.approx(
      [r["roofline us"] for r in recs])
  assert any("no device timing" in t.get_text() for t in ax.texts)
  plt.close(fig)


def test_exercise_answers_quote_the_bound_and_the_public_sort():
  text = device_timing.exercise_answers([], generation="v5e")
  assert "512 MiB of cache" in text and "3.6 ms" in text


def test_sweep_rows_report_the_check_with_its_tolerance(tmp_path):
  recs, caps, skipped = device_timing.sweep(
      ["token"], SIZES, fmt="fp8", compression_ratio=4,
      decode_req_batch_size=2, seed=0, output_dir=str(tmp_path), warmup=1,
      check_results=True, max_host_key_bytes=2**30, on_tpu=False)
  assert not skipped and len(caps) == 1
  row = device_timing.sweep_rows(recs, None)[0]
  assert row["reference"].startswith("2/2 rows, atol ")
  assert row["device_kernel_us"] is None


def test_static_schedule_bound_is_pages_fetched_times_compute_per_page():
  from streamidx.lab.model import roofline, tiling  # pylint: disable=g-import-not-at-top
  b = si.make_mixed_batch(decode=[4096] * 4, page_size=128, compression_ratio=4)
  p = tiling.plan(b, fmt="fp8", num_heads=8, num_kv_pages_per_block=(2, 2, 2),
                  num_queries_per_block=(1, 128, 128))
  bound = roofline.page_bound("v5e", bundles_per_page=120.0,
                              page_bytes=128 * 256)
  pages = p.counts()["hbm_bytes_kv"] / (128 * 256)
  assert pages == 4 * 8  # 1024 entries = 8 pages of 128 per sequence
  got = device_timing._static_us(p, bound)  # pylint: disable=protected-access
  assert got == pytest.approx(pages * 120.0 / bound.clock_hz * 1e6)
  # No public clock (v6e): no static bound in seconds.
  assert device_timing._static_us(p, roofline.page_bound(  # pylint: disable=protected-access
      "v6e", bundles_per_page=120.0, page_bytes=128 * 256)) is None


def test_sweep_parameters_pick_one_machines_sizes():
  params = {f"{p}_{n}": (p, n) for p in ("tpu", "cpu") for n in device_timing.SWEEP_PARAMETERS}
  sizes = device_timing.sweep_parameters(params, "cpu")
  assert list(sizes) == list(device_timing.SWEEP_PARAMETERS)
  assert sizes["k"] == ("cpu", "k")
  with pytest.raises(ValueError, match="prefix"):
    device_timing.sweep_parameters(params, "gpu")


def test_largest_point_takes_the_largest_batch_then_context_of_a_mode():
  preds = {("page", 64, 131072): {}, ("token", 8, 131072): {}, ("token", 64, 16384): {},
           ("token", 64, 4096): {}}
  assert device_timing.largest_point(preds) == ("token", 64, 16384)
  assert device_timing.largest_point({("page", 8, 16): {}}) == ("page", 8, 16)


def test_variant_batch_and_top_ops_markdown_say_what_ran():
  import types  # pylint: disable=g-import-not-at-top
  vbatch = types.SimpleNamespace(num_seqs=2, seq_lens=[100, 300, 0])
  text = device_timing.variant_batch_markdown(vbatch, page_bounds={}, schedule_bound="tpu", generation="v5e")
  assert text == ("Batch: 2 decode sequences of 100-300 tokens; static-schedule bound not computed "
                  "(schedule_bound='tpu', v5e).")
  recs = [dict(mode="token", batch_size=2, context_tokens=256, device_time_source="XLA Ops",
               trace_events=5, top_ops=[dict(stage="kernel", count=1, total_us=3.0, name="x" * 90)])]
  assert device_timing.top_ops_markdown(recs, on_tpu=False) == (
      "No device ops off a TPU: 5 trace events parsed over 1 sweep points, none on a device line.")
  on_tpu = device_timing.top_ops_markdown(recs, on_tpu=True)
  assert on_tpu.startswith("**token B=2 L=256** (XLA Ops)") and "x" * 70 + " |" in on_tpu
