"""Notebook 04's study helpers (streamidx.lab.studies.tiling_study)."""

import numpy as np
import pytest

import streamidx as si
from streamidx.lab.model import hardware, roofline, tiling
from streamidx.lab.studies import tiling_study as study

SPECS = hardware.load_specs()


def _decode_plan(lens, variant="vendored", fmt="fp8", **kw):
  b = si.make_mixed_batch(decode=lens, page_size=128, compression_ratio=4)
  return tiling.plan(b, fmt=fmt, variant=variant, num_heads=8,
                     num_kv_pages_per_block=(3, 2, 2),
                     num_queries_per_block=(1, 128, 128),
                     decode_req_batch_size=4, **kw)


def test_core_split_bound_on_one_core_is_the_roofline_kernel_bound():
  p = _decode_plan([8192] * 8)
  want = roofline.predict(p, k=64, generations=["v5p"])["v5p"]["kernel"]
  got = study.core_split_bound(p, SPECS["v5p"], k=64, num_cores=1)
  assert got == pytest.approx(want, rel=1e-12)


def test_core_split_bound_halves_two_equal_programs_and_keeps_an_odd_one():
  two = _decode_plan([8192] * 8)  # 2 programs of 4: one per core
  one = study.core_split_bound(two, SPECS["v5p"], k=64, num_cores=1)
  assert study.core_split_bound(two, SPECS["v5p"], k=64,
                                num_cores=2) == pytest.approx(one / 2)
  single = _decode_plan([8192] * 4)  # 1 program: the second core idles
  assert study.core_split_bound(single, SPECS["v5p"], k=64, num_cores=2) == (
      pytest.approx(study.core_split_bound(single, SPECS["v5p"], k=64,
                                           num_cores=1)))


def test_launch_rows_count_the_empty_launches_m14_removes():
  p = _decode_plan([4000, 900, 300])  # B=4: all three run alone
  without, with_ = study.launch_rows(p)
  assert (without["launches"], without["empty_launches"]) == (4, 3)
  assert (with_["launches"], with_["empty_launches"]) == (1, 0)
  assert without["grid_steps"] == with_["grid_steps"] == 3
  assert without["kv_page_dmas"] == with_["kv_page_dmas"] == p.counts()["dma_kv"]


def test_recorded_costs_refuses_counts_of_another_call():
  p = _decode_plan([4000, 900, 300])
  with pytest.raises(ValueError, match="counts: 2 launches ran"):
    study.recorded_costs([{}, {}], p)


def test_recorded_costs_from_counts():
  p = _decode_plan([4000, 900, 300])
  kv = p.counts()["dma_kv"]
  counts = [dict(grid_points=3, dma_starts={"kv": kv}, bytes={"kv": kv * 128 * 256},
                 kv_blocks=tiling.block_waste(p)["blocks_computed"])]
  r = study.recorded_costs(counts, p)
  assert r["bytes_per_entry"] == 256 and r["waste"] == 0.0
  assert (r["launches"], r["grid_points"], r["empty_launches"]) == (1, 3, 0)


def test_sorted_order_never_computes_more_on_random_batches():
  rows = study.random_order_rows(3, trials=6, num_seqs=13, max_tokens=65536,
                                 batch_sizes=[2, 4], page_size=128,
                                 compression_ratio=4, bkv_p=3)
  assert all(r["worst_sorted_over_given"] <= 1.0 for r in rows)


def test_order_rows_compare_the_given_and_the_sorted_order():
  lens = [40000, 1000, 39000, 2000, 38000, 500, 37000, 1500]
  given, sorted_ = study.order_rows(lens, k=64, page_size=128,
                                    compression_ratio=4, fmt="fp8",
                                    num_heads=8,
                                    num_kv_pages_per_block=(3, 2, 2),
                                    num_queries_per_block=(1, 128, 128),
                                    decode_req_batch_size=4)
  assert (given["blocks_computed"], sorted_["blocks_computed"]) == (208, 116)
  assert sorted_["KV_MB"] < given["KV_MB"]


def test_variant_rows_dense_bytes_and_the_second_core_only_where_split():
  b = si.make_mixed_batch(decode=[16384] * 8, page_size=128, compression_ratio=4)
  plans = study.variant_plans(b, num_heads=8, num_kv_pages_per_block=(3, 2, 2),
                              num_queries_per_block=(1, 128, 128),
                              decode_req_batch_size=4)
  rows = {(r["variant"], r["generation"]): r for r in study.variant_step_rows(
      plans, k=64, generations=["v4", "v5p", "v6e"])}
  assert rows["vendored", "v6e"]["B per entry"] == 256
  assert rows["dense", "v6e"]["B per entry"] == 132
  assert rows["dense", "v5p"]["HBM bound us (num_cores=2)"] == pytest.approx(
      rows["dense", "v5p"]["HBM bound us (1 core)"] / 2)
  assert rows["dense", "v4"]["HBM bound us (num_cores=2)"] is None
  assert rows["vendored", "v5p"]["HBM bound us (num_cores=2)"] is None
  pb = roofline.page_bound("v5e", bundles_per_page=400, page_bytes=128 * 256)
  (row,) = study.variant_step_rows({"vendored": plans["vendored"]}, k=64,
                                   generations=["v5e"],
                                   page_bounds={("vendored", "v5e"): pb})
  pages = plans["vendored"].counts()["dma_kv"]
  assert row["static bound us"] == pytest.approx(pages * 400 / SPECS["v5e"].clock_hz * 1e6)


def test_topk_rows_put_the_scoring_bound_beside_every_shape():
  from streamidx.lab.model import topk as topk_model
  shapes = topk_model.SHAPES[:2]
  rows = study.topk_rows(shapes, ["v6e"])
  scoring = [r for r in rows if r["method"] == "(scoring kernel, roofline)"]
  assert len(scoring) == 2 and all(r["v6e us"] > 0 for r in scoring)
  # 128K entries at k 512: blockmax has no more blocks than k, so it is top_k.
  assert "blockmax (= top_k)" in {r["method"] for r in rows
                                  if r["shape"] == shapes[1].name}


def _answer(measured, run_check):
  waste = {(4, o): [0.5, 0.4] if o == "none" else [0.1, 0.1]
           for o in study.ORDERS}
  b = si.make_mixed_batch(decode=[16384] * 8, page_size=128, compression_ratio=4)
  plans = study.variant_plans(b, num_heads=8, num_kv_pages_per_block=(3, 2, 2),
                              num_queries_per_block=(1, 128, 128),
                              decode_req_batch_size=4)
  from streamidx.lab.model import topk as topk_model
  g = tiling.geometry(b, fmt="fp8", num_heads=8)
  return study.answer_markdown(
      host="test host", waste=waste, batch_size=4,
      random_table=[dict(worst_sorted_over_given=0.9)], measured=measured,
      launches=(4, 1),
      variant_table=study.variant_step_rows(plans, k=64, generations=["v5p", "v6e"]),
      megacore=[], sched_rows=[],
      topk_table=study.topk_rows(topk_model.SHAPES[:1], ["v6e"]),
      topk_shape=topk_model.SHAPES[0].name,
      production=study.production_vmem(g, num_kv_pages_per_block=(3, 2, 2),
                                       num_queries_per_block=(1, 128, 128),
                                       decode_req_batch_size=4),
      run_check=run_check, vmem_limit_bytes=100 * 2**20, over=["v4"],
      step=(8, 16384, 64), trials=2)


def test_answer_states_the_sorted_order_saving_computed_from_the_waste():
  text = _answer(None, None)
  # 1 - (1 - 0.5) / 0.9 = 44%, 1 - 0.6 / 0.9 = 33%: mean 39%.
  assert "**39% fewer KV blocks computed and read**" in text
  assert "makes 1 launch(es) instead of 4 (the recording was skipped here)" in text
  assert "Double buffering" not in text and "*Measured*" not in text


def test_answer_quotes_the_recorded_runs_when_there_are_some():
  m = dict(launches=1, grid_points=2, empty_launches=0, bytes_per_entry=129.0,
           blocks_fetched=4, blocks_needed=4)
  text = _answer({"vendored": dict(m, bytes_per_entry=256.0), "dense": m},
                 dict(events=99, overlapped=2, computes=6))
  assert "129 vs 256 B per entry fetched" in text
  assert "2 of 6 compute steps" in text


def _vmem_row(gen, launch, bkv_p, bq, ours, scratch, total, default="ok", at_limit="ok"):
  return {"gen": gen, "launch": launch, "bkv_p": bkv_p, "bq": bq, "scratch MiB (ours)": ours,
          "compiler scratch MiB": scratch, "compiler total MiB": total,
          "lab model MiB": 0.0, "model / compiler": 0.5 if launch == "decode" else 1.5,
          "at default limit": default, "at 100 MiB": at_limit}


KIB = 1 / 1024
VMEM_ROWS = [  # as the compiler printed them for v4 (16 MiB of VMEM per TensorCore)
    _vmem_row("v4", "decode", 1, 1, 392 * KIB, 428 * KIB, 564 * KIB),
    _vmem_row("v4", "decode", 4, 1, 1.1445, 1.18, 1.33),
    _vmem_row("v4", "prefill", 2, 128, 4.5, 4.54, 6.61),
    _vmem_row("v4", "prefill", 2, 512, 17.62, 42.47, 42.47, "Ran out of memory", "Ran out of memory"),
]


def test_vmem_findings_quote_the_rows():
  text = study.vmem_findings(VMEM_ROWS, vmem_limit_bytes=100 * 2**20)
  scratch, beyond, internal, model, at_default, at_limit = text.splitlines()
  assert "36 KiB on v4 (each of its 3 launches)" in scratch
  assert "the same for every block size" in scratch
  assert "v4 prefill bq=512 needs 17.62 MiB" in beyond and "42.47 MiB used on a chip of 16 MiB" in beyond
  assert "decode 0.13-0.15" in internal and "bq=128 2.07 (1.04 per 64 query rows)" in internal
  assert "bq=512" not in internal  # beyond the chip: no internal scratch to tell
  assert "decode 0.50; prefill 1.50" in model
  assert "default scoped limit**: v4 prefill bq=512 (Ran out of memory)" in at_default
  assert "`vmem_limit_bytes` = 100 MiB**: v4 prefill bq=512" in at_limit
  assert study.vmem_findings([], vmem_limit_bytes=1) == ""


def test_vmem_findings_say_so_when_the_compiler_adds_different_amounts():
  rows = [_vmem_row("v5e", "decode", 1, 1, 392 * KIB, 428 * KIB, None),
          _vmem_row("v5e", "decode", 4, 1, 1.1445, 1.30, None)]
  text = study.vmem_findings(rows, vmem_limit_bytes=100 * 2**20)
  assert "36.0-159.2 KiB on v5e (2 launches)" in text
  assert "same for every block size" not in text and "internal scratch" not in text
  assert "limit**: none." in text
