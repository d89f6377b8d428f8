"""The roofline model: bytes, FLOPs and bounds, checked against hand counts."""

import pytest

import streamidx as si
from streamidx.lab.model import hardware, roofline, tiling

SPECS = hardware.load_specs()
# The hand counts below are for the block-size table's vendored row at page
# size 128 (`tiling.plan`'s default): 3-page decode KV blocks.
DECODE_BKV_P = 3


def test_the_table_row_is_the_one_the_hand_counts_assume():
  for num_heads in (8, 16, 64):
    row = si.block_sizes("vendored", cache_format="fp8", num_heads=num_heads,
                         page_size=128)
    assert row.num_kv_pages_per_block[0] == DECODE_BKV_P


def _small_decode():
  # 2 decode sequences of 2048 tokens at ratio 4: 512 entries = 4 pages of
  # 128; bkv_p 2 -> bkv_sz 256 entries -> 2 KV blocks each; one program of 2.
  b = si.make_mixed_batch(decode=[2048, 2048], page_size=128, compression_ratio=4)
  return tiling.plan(b, fmt="fp8", num_heads=8, num_kv_pages_per_block=2,
                     num_queries_per_block=1, decode_req_batch_size=2)


def test_small_decode_costs_by_hand():
  fill, kernel, topk = roofline.costs(_small_decode(), k=16)
  # KV: 2 seqs x 2 blocks x 2 pages x 128 entries x 256 B per FP8 record.
  assert kernel.bytes_read["kv_cache"] == 2 * 2 * 2 * 128 * 256
  assert kernel.bytes_read["q"] == 2 * 8 * 128 * 2  # one bf16 row per seq
  assert kernel.bytes_read["weights"] == 2 * 8 * 4
  # Scores: 2 steps, each one DMA of 2 rows x 256 f32.
  assert kernel.bytes_written == {"scores": 2 * 2 * 256 * 4}
  # MXU: per seq and step, [8 heads, 128] x [128, 256 entries].
  assert kernel.flops == 2 * 2 * (2 * 8 * 128 * 256)
  assert kernel.useful_flops == kernel.flops  # lengths fill the blocks
  assert kernel.useful_bytes == kernel.bytes_read["kv_cache"]
  # Score buffer: T = 2 rows x (4 pages aligned to bkv_p 2) x 128 entries.
  assert fill.bytes_written == {"scores": 2 * 512 * 4}
  assert topk.bytes_read["scores"] == 2 * 512 * 4
  assert topk.bytes_written["indices"] == 2 * 16 * 4


@pytest.mark.parametrize("gen", hardware.GENERATIONS)
def test_bound_is_max_of_memory_and_math_time(gen):
  p = _small_decode()
  s = SPECS[gen]
  stage_costs = roofline.costs(p, k=16)
  for c, b in zip(stage_costs, roofline.bounds(stage_costs, s)):
    bw = s.kernel_bandwidth if c.name == "kernel" else s.device_bandwidth
    assert b.t_mem == pytest.approx(c.bytes / bw, rel=1e-12)
    if c.name == "kernel":
      assert b.t_math == pytest.approx(c.flops / s.kernel_peak("bf16"), rel=1e-12)
    else:
      assert b.t_math == 0.0
    assert b.bound == max(b.t_mem, b.t_math)
  pred = roofline.predict(p, k=16, generations=[gen])[gen]
  assert pred["total"] == pytest.approx(pred["fill"] + pred["kernel"] + pred["topk"])


def test_wasted_decode_blocks_are_counted_as_executed_not_useful():
  b = si.make_mixed_batch(decode=[4 * 384 * 5, 40], page_size=128,
                          compression_ratio=4)
  p = tiling.plan(b, num_heads=8, decode_req_batch_size=2)
  kernel = roofline.costs(p, k=8)[1]
  # Both sequences are run for 5 blocks of 3 pages.
  assert kernel.bytes_read["kv_cache"] == 2 * 5 * 3 * 128 * 256
  assert kernel.useful_bytes == (384 * 5 + 10) * 256
  assert kernel.useful_flops < kernel.flops


def test_kernel_bytes_equal_the_dma_model():
  b = si.make_mixed_batch(decode=[900, 5000, 77], prefill=[(300, 4000)],
                          mixed=[(5, 1200)], page_size=128, compression_ratio=4)
  p = tiling.plan(b, num_heads=16)
  c = p.counts()
  kernel = roofline.costs(p, k=64)[1]
  assert kernel.bytes_read["kv_cache"] == c["bytes_kv"] == c["dma_kv"] * 128 * 256
  assert kernel.bytes_written["scores"] == c["bytes_out"]


def test_dsv4_decode_step_is_hbm_not_mxu_bound_by_the_two_roofline_terms():
  b = si.make_mixed_batch(decode=[131072] * 64, page_size=128, compression_ratio=4)
  p = tiling.plan(b, fmt="fp8", num_heads=64)
  kernel = roofline.costs(p, k=512)[1]
  # 64 seqs x ceil(32768 / 384) = 86 blocks x 3 pages x 32 KiB.
  assert kernel.bytes_read["kv_cache"] == 64 * 86 * 3 * 128 * 256
  for gen, row in roofline.predict(p, k=512).items():
    kb = next(x for x in row["bounds"] if x.stage == "kernel")
    assert kb.limiter == "memory", gen
  # Arithmetic intensity ~ 2 * 64 heads * 128 / 256 B = 64 FLOP/B, below
  # every generation's ridge point.
  assert 60 < kernel.intensity < 64
  assert all(kernel.intensity < s.ridge_point("bf16") for s in SPECS.values())


def test_unpublished_peak_is_an_error_not_a_guess():
  with pytest.raises(ValueError, match="v5e: no published fp8 peak"):
    roofline.predict(_small_decode(), k=16, generations=["v5e"],
                     matmul_dtype="fp8")
  # Where FP8 is published (v7x), the bound uses it.
  out = roofline.predict(_small_decode(), k=16, generations=["v7x"],
                         matmul_dtype="fp8")
  kb = next(x for x in out["v7x"]["bounds"] if x.stage == "kernel")
  assert kb.peak == SPECS["v7x"].peak_fp8_flops / 2


def test_page_mode_writes_pooled_pages_not_token_scores():
  b = si.make_mixed_batch(prefill=[(512, 20000)], page_size=16,
                          compression_ratio=1)
  p = tiling.plan(b, mode="page", num_kv_pages_per_block=128,
                  num_queries_per_block=256, num_heads=8)
  fill, kernel, topk = roofline.costs(p, k=32)
  # 1250 pages -> 10 blocks of 128 -> 1280 page columns; one DMA per bq block.
  assert p.num_score_cols == 1280
  assert kernel.bytes_written["scores"] == 512 * 1280 * 4
  assert topk.bytes_read["scores"] == 512 * 1250 * 4
  assert fill.bytes_written["scores"] == 512 * 1280 * 4


# ---------------------------------------------------------------------------
# The step with the vector unit (recorded static schedule).


def test_recorded_schedule_names_its_command_and_date():
  doc = si.records.load("decode_schedule")
  assert doc["command"].startswith("python -m streamidx.lab.schedule")
  assert doc["date"] and doc["libtpu"]
  keys = {(r["variant"], r["generation"], r["fmt"], r["bkv_p"]) for r in doc["rows"]}
  assert len(keys) == len(doc["rows"])  # one row per launch
  # Every chip's production decode row is recorded, for every token variant
  # the tiling model covers.
  for gen in hardware.GENERATIONS:
    for variant, fmt in (("vendored", "fp8"), ("dense", "dense_fp8"),
                         ("lean", "dense_fp8")):
      row = si.block_sizes(variant, cache_format=fmt, num_heads=64,
                           page_size=128, generation=gen)
      assert (variant, gen, fmt, row.num_kv_pages_per_block[0]) in keys


def test_step_bound_terms_by_hand():
  """v5e (published clock): HBM = kernel bytes / bandwidth, vector = pages x
  bundles / clock; the headline is the larger plus the XLA stages."""
  sb = roofline.dsv4_step("v5e")
  s = SPECS["v5e"]
  p = tiling.plan(si.make_mixed_batch(decode=[131072] * 64, page_size=128,
                                      compression_ratio=4),
                  fmt="fp8", num_heads=64, variant="vendored", generation="v5e")
  kernel = roofline.costs(p, k=512)[1]
  assert sb.t_hbm == pytest.approx(kernel.bytes / s.kernel_bandwidth)
  assert sb.kv_pages == p.counts()["dma_kv"]  # one DMA per page
  bpp = roofline.recorded_bundles("vendored", "v5e", "fp8", bkv_p=4,
                                  seq_batch_size=4, num_heads=64,
                                  head_dim=128, page_size=128)
  assert sb.bundles_per_page == bpp["bundles_per_page"]
  assert sb.t_vector == pytest.approx(sb.kv_pages * bpp["bundles_per_page"]
                                      / s.clock_hz)
  assert sb.binding == "vector" and sb.t_vector > sb.t_hbm > sb.t_mxu
  # The headline: the stages (fill, scoring, selection[, copies]), each the
  # larger of its bounds; the scoring stage holds the kernel's terms.
  assert sb.total_s == pytest.approx(sum(st.bound for st in sb.stages))
  scoring = next(st for st in sb.stages if st.name == "scoring")
  # the whole launch: its KV loops (the per-page record) and the rest
  assert scoring.t_hbm == sb.t_hbm and scoring.bundles > sb.bundles and not scoring.floor
  assert "vector-bound" in sb.verdict and "scoring" in sb.sum_text


def test_without_a_public_clock_the_kernel_verdict_names_the_break_even_clock():
  # v6e publishes no clock: the kernel's terms (`step_bound`) use a published
  # clock only, so its verdict is the break-even clock (docs/tpu.md, the clock).
  sb = roofline.dsv4_step("v6e")
  assert sb.clock_hz is None and sb.t_vector is None
  assert sb.break_even_clock_hz == pytest.approx(
      sb.bundles_per_page * sb.kv_pages / sb.t_hbm)
  # Far above every published TPU clock: vector-bound.
  assert sb.break_even_clock_hz > roofline.max_published_clock_hz()
  assert sb.binding == "vector"
  assert f"{sb.break_even_clock_hz / 1e9:.2f} GHz" in sb.verdict
  # The staged step times its bundles at v6e's one inferred clock: complete.
  hz, src = roofline.clock("v6e")
  assert hz and src.startswith("inferred from ")
  assert not sb.at_least and "at least" not in sb.sum_text
  assert all(st.clock_hz == hz for st in sb.stages)
  assert sb.total_s == pytest.approx(sum(
      max(st.t_hbm, st.t_mxu, (st.bundles or 0) / hz) for st in sb.stages))


def test_a_staged_step_without_a_clock_is_its_hbm_bounds_and_a_floor():
  sb = roofline.dsv4_step("v6e", clock_hz=0)  # 0: no clock
  assert sb.at_least and sb.sum_text.startswith("at least ")
  assert sb.clock_source.startswith("none")
  assert sb.total_s == pytest.approx(sum(max(st.t_hbm, st.t_mxu) for st in sb.stages))


def test_a_plan_without_a_recorded_row_says_so():
  b = si.make_mixed_batch(decode=[4096] * 4, page_size=128, compression_ratio=4)
  p = tiling.plan(b, fmt="fp8", num_heads=8)  # 8 heads: nothing recorded
  sb = roofline.step_bound(p, "v5e", variant="vendored", k=64)
  assert sb.t_vector is None and "no recorded schedule" in sb.vector_note
  assert sb.binding in ("HBM", "MXU")


def test_dsv4_step_names_its_model_and_row():
  with pytest.raises(ValueError, match="model must be one of"):
    roofline.dsv4_step("v6e", model="DeepSeek-V5")
  pro = roofline.dsv4_step("v6e", model="DeepSeek-V4-Pro")
  flash = roofline.dsv4_step("v6e")
  assert pro.t_hbm == flash.t_hbm and pro.t_xla > flash.t_xla  # k only moves the top-k
  assert "v6e vendored row" in flash.blocks
  dense = roofline.dsv4_step("v6e", "dense")
  assert dense.fmt == "dense_fp8" and dense.t_hbm < flash.t_hbm
  # lean: the dense layout's bytes (8-page blocks: no padded page), fewer
  # scheduled bundles.
  lean = roofline.dsv4_step("v6e", "lean")
  assert lean.fmt == "dense_fp8" and "v6e lean row" in lean.blocks
  assert lean.t_hbm == pytest.approx(dense.t_hbm, rel=0.01)
  assert lean.bundles < dense.bundles / 2 and lean.binding == "vector"
  prefill = roofline.dsv4_step("v5e", batch=1, q_len=2048)  # no decode launch: HBM and MXU
  assert prefill.kv_pages == 0 and prefill.t_vector is None
  assert prefill.kernel_s == max(prefill.t_hbm, prefill.t_mxu) > 0


def test_step_bound_with_a_compiled_page_is_pages_fetched_times_compute_per_page():
  b = si.make_mixed_batch(decode=[4096] * 4, page_size=128, compression_ratio=4)
  p = tiling.plan(b, fmt="fp8", num_heads=8, num_kv_pages_per_block=(2, 2, 2),
                  num_queries_per_block=(1, 128, 128))
  bound = roofline.page_bound("v5e", bundles_per_page=120.0,
                              page_bytes=128 * 256, binding_slot="VALU")
  pages = p.counts()["hbm_bytes_kv"] / (128 * 256)
  assert pages == 4 * 8  # 1024 entries = 8 pages of 128 per sequence
  assert pages == p.counts()["dma_kv"]  # one DMA per page
  sb = roofline.step_bound(p, "v5e", variant="vendored", k=64, page=bound)
  assert (sb.kv_pages, sb.binding_slot) == (pages, "VALU")
  assert sb.t_vector == pytest.approx(pages * 120.0 / bound.clock_hz)
  # No public clock (v6e): no vector time in seconds, the break-even clock.
  v6e = roofline.step_bound(p, "v6e", variant="vendored", k=64, page=roofline.page_bound(
      "v6e", bundles_per_page=120.0, page_bytes=128 * 256))
  assert v6e.t_vector is None
  assert v6e.break_even_clock_hz == pytest.approx(pages * 120.0 / v6e.t_hbm)


def test_a_compiled_page_schedules_every_launch_and_counts_the_pages_it_fetches():
  b = si.make_mixed_batch(decode=[4096, 300, 2000], prefill=[(64, 3000)],
                          mixed=[(2, 5000), (2, 700)], page_size=16, compression_ratio=4)
  p = tiling.plan(b, fmt="fp8", num_heads=8, num_kv_pages_per_block=(16, 8, 8),
                  num_queries_per_block=(1, 16, 16))
  page = roofline.page_bound("v5e", bundles_per_page=50.0, page_bytes=16 * 256)
  sb = roofline.step_bound(p, "v5e", variant="vendored", k=8, page=page)
  assert sb.kv_pages == p.counts()["dma_kv"] == 400 and not sb.vector_note


def test_implied_clock_counts_bundles_over_the_time_the_hbm_only_stages_leave():
  fill = roofline.Stage("fill", 1e-3, None, None, hbm_only=True)
  scoring = roofline.Stage("scoring", 0.0, 2_000_000, None)
  assert roofline.implied_clock([fill, scoring], 3e-3) == pytest.approx(1e9)
  assert roofline.implied_clock([fill, scoring], 1e-3) is None  # no time left


def test_no_relayout_where_blocktop_reads_the_kernels_buffer():
  """M25: the relayout stage is the buffer read and written for the sort;
  none for blocktop, which takes f32[T, E / 128, 128] as the kernel wrote
  it (`Method.lane_rows`), also where the dense kernel's 3-page blocks
  widen it past the table's entries."""
  def relayout(method, variant="lean"):
    st = roofline.dsv4_step("v5e", variant, method=method).stages
    return next(s.t_hbm for s in st if s.name == "relayout")
  s = SPECS["v5e"]
  assert relayout("sort") == pytest.approx(2 * 64 * 32768 * 4 / s.device_bandwidth)
  assert relayout("sort", "dense") == relayout("sort")  # the entries alone
  assert relayout("blocktop") == relayout("blocktop", "dense") == 0
