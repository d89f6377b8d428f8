"""The code TPU v4 compiles, run in the interpreter (ledger M10, M15).

v4's MXU takes no e4m3 operand (M10: the FP8 tile is widened to bf16, in
chunks of `WIDEN_CHUNK` entries) and Mosaic cannot split a lane row into
pages narrower than 128 lanes there (M15: pages pooled by lane segments and
a transpose, written segment-major and put back in page order by the
wrapper). Both are chosen at trace time from the target chip, so on a CPU
they would never run; `tpu.force_v4_paths()` traces them in the
interpreter, and every variant must still match its reference.
`tests/test_aot.py` compiles the same code for v4.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import streamidx as si
from streamidx import metrics
from streamidx.kernels import tpu
from streamidx.lab.studies import cases
import tiers

# Where v4's code differs: an FP8 or MXFP4 cache (M10, M18) or page pooling
# (M15). The
# vendored token kernel's widened FP8 is tests/test_aot.py's
# test_widened_fp8_kernel_matches_the_reference (one chunk per KV block).
VARIANT_FORMATS = [(name, fmt) for name, v in sorted(si.VARIANTS.items())
                   for fmt in v.cache_formats
                   if (fmt != "bf16" or v.mode == "page") and name != "vendored"]


@pytest.mark.parametrize("cols_per_page", [1, 2, 8, 16, 64, 128, 256])
def test_lane_segment_pooling_is_the_page_max(cols_per_page):
  rng = np.random.default_rng(cols_per_page)
  rows = 16
  s = rng.standard_normal((rows, 128 * cols_per_page)).astype(np.float32)
  s[3] = -np.inf  # a row with no visible entry
  s[5, : 7 * cols_per_page] = -np.inf  # its first seven pages masked
  want = s.reshape(rows, 128, cols_per_page).max(-1)
  pooled = jax.jit(tpu.pool_pages_by_lane_segments,
                   static_argnums=1)(jnp.asarray(s), cols_per_page)
  assert pooled.shape == (rows, 128)
  got = tpu.unpermute_lane_segment_pages(
      jnp.concatenate([pooled, pooled[::-1]], axis=1), cols_per_page)
  np.testing.assert_array_equal(np.asarray(got[:, :128]), want)
  np.testing.assert_array_equal(np.asarray(got[:, 128:]), want[::-1])


def test_segment_major_columns_are_not_page_order():
  """The unpermute step is needed: without it columns are other pages."""
  s = jnp.arange(128 * 64, dtype=jnp.float32)[None].repeat(8, 0)
  pooled = tpu.pool_pages_by_lane_segments(s, 64)
  page_max = np.asarray(s).reshape(8, 128, 64).max(-1)
  assert not np.array_equal(np.asarray(pooled), page_max)
  # Column j * 64 + r holds page 2 r + j.
  assert pooled[0, 1] == page_max[0, 2] and pooled[0, 64] == page_max[0, 1]


def test_force_v4_paths_selects_both_modifications():
  assert not tpu.widen_fp8_for_mxu(True)
  assert not tpu.pool_by_lane_segments_for(64, True)
  with tpu.force_v4_paths():
    assert tpu.widen_fp8_for_mxu(True)
    assert tpu.pool_by_lane_segments_for(64, True)
    assert tpu.pool_by_lane_segments_for(256, True)
    with pytest.raises(ValueError, match=r"^cache: page mode before TPU v5 "
                       r"pools pages .* \(got page_size 96\)"):
      tpu.pool_by_lane_segments_for(96, True)
  assert not tpu.widen_fp8_for_mxu(True)


# CI: the widened FP8 matmul (M10) and the lane-segment page pooling (M15);
# the other variants and formats in the full tier (tests/tiers.py).
@pytest.mark.parametrize("name,fmt", tiers.split(
    VARIANT_FORMATS, lambda nf: nf in (("vendored", "fp8"),
                                       ("vendored_page", "fp8"))))
def test_v4_code_matches_the_reference(name, fmt):
  v = si.VARIANTS[name]
  ratio = 4 if v.mode == "token" else 1
  inp = si.make_inputs(cases.BATCHES["all_three_ranges"].build(ratio),
                       num_heads=cases.NUM_HEADS, fmt=fmt, seed=5)
  static = cases.blocks_for(v)
  k = 24 if v.mode == "token" else 5
  with tpu.force_v4_paths():
    got = jax.block_until_ready(
        v.run(inp, k=k, compression_ratio=ratio, fmt=fmt, **static))
  want = v.run_reference(inp, k=k, compression_ratio=ratio, fmt=fmt, **static)
  scores = v.scores(inp, compression_ratio=ratio, fmt=fmt)
  atol = metrics.summation_atol(inp.with_cache_format(fmt),
                                compression_ratio=ratio, mode=v.mode)
  metrics.assert_topk_match(got, want, scores, atol=atol,
                            label=f"{name}/{fmt} (v4 code)")
