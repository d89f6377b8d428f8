"""The bounds notebooks 05 and 08 share (streamidx.lab.studies.tiling_study).

The tables notebook 05 builds from the tiling model are checked by the
notebook's own asserts (CI runs it); `megacore_rows` and `decode_page_bounds`
need libtpu's compiler and run there.
"""

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


def test_core_split_bound_of_the_dense_kernel_halves_its_even_programs():
  dense = _decode_plan([16384] * 8, variant="dense", fmt="dense_fp8")
  one = study.core_split_bound(dense, SPECS["v5p"], k=64, num_cores=1)
  assert study.core_split_bound(dense, SPECS["v5p"], k=64,
                                num_cores=2) == pytest.approx(one / 2)


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
  assert study.static_bound_s(p, bound) == sb.t_vector
  assert study.static_bound_s(p, None) is None


def test_a_compiled_page_schedules_every_launch_and_counts_the_pages_it_fetches():
  b = si.make_mixed_batch(decode=[4096, 300, 2000], prefill=[(64, 3000)],
                          mixed=[(2, 5000), (2, 700)], page_size=16, compression_ratio=4)
  p = tiling.plan(b, fmt="fp8", num_heads=8, num_kv_pages_per_block=(16, 8, 8),
                  num_queries_per_block=(1, 16, 16))
  page = roofline.page_bound("v5e", bundles_per_page=50.0, page_bytes=16 * 256)
  sb = roofline.step_bound(p, "v5e", variant="vendored", k=8, page=page)
  assert sb.kv_pages == p.counts()["dma_kv"] == 400 and not sb.vector_note
