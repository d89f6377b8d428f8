"""FP8 quantization, record packing and cache layout round trips."""

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

from streamidx import cache

import oracle


def _keys(shape, seed=0, scale=1.0):
  return np.random.default_rng(seed).standard_normal(shape).astype(
      np.float32) * scale


@pytest.mark.parametrize("amax", [448.0, 449.0, 1.0, 3.5, 1e-3, 896.0,
                                  2.0**-20, 1e30, 1e-30, 447.99, 0.875 * 2.0**-100])
def test_ue8m0_exponent_is_the_smallest_power_of_two_that_fits(amax):
  e = int(cache.ue8m0_exponent(amax))
  assert 2.0**e * 448.0 >= np.float32(amax)
  assert 2.0**(e - 1) * 448.0 < np.float32(amax)


def test_ue8m0_exponent_of_zero_and_clipping():
  assert int(cache.ue8m0_exponent(0.0)) == 0
  # 2**-131 is clamped to 2**-126, float32's smallest normal: e8m0's 2**-127
  # (byte 0) would be flushed to zero where the kernel applies the scale.
  assert int(cache.ue8m0_exponent(1e-37)) == -126
  assert int(cache.ue8m0_exponent(2.6e-36)) == -126


@pytest.mark.parametrize("scale", [1.0, 1e-4, 300.0])
def test_quantize_never_saturates_and_error_is_bounded(scale):
  keys = _keys((64, 128), scale=scale)
  vals, e = cache.quantize_fp8(keys)
  assert np.all(np.isfinite(np.asarray(vals, np.float32)))
  assert np.abs(np.asarray(vals, np.float32)).max() <= 448.0
  deq = np.asarray(cache.dequantize_fp8(vals, e))
  # e4m3 has 3 mantissa bits: relative error <= 2**-4 for normal values;
  # below the smallest normal (2**-6 * scale) the absolute step is 2**-9.
  step = 2.0**np.asarray(e, np.float64)[:, None]
  err = np.abs(deq - keys)
  assert np.all(err <= np.maximum(np.abs(keys) * 2.0**-4, step * 2.0**-10))


def test_quantize_scales_by_exact_powers_of_two():
  """values == e4m3(keys / 2**e) and dequantize == values * 2**e, exactly."""
  keys = _keys((512, 128), seed=5, scale=1e-3)
  vals, e = cache.quantize_fp8(keys)
  e = np.asarray(e)
  assert len(np.unique(e)) > 1
  want = (keys / np.float32(2.0)**e[:, None].astype(np.float32)).astype(
      ml_dtypes.float8_e4m3fn)
  np.testing.assert_array_equal(np.asarray(vals).view(np.uint8),
                                want.view(np.uint8))
  deq = np.asarray(cache.dequantize_fp8(vals, e), np.float64)
  np.testing.assert_array_equal(
      deq, want.astype(np.float64) * 2.0**e[:, None].astype(np.float64))


def test_fp8_record_layout_byte_by_byte():
  keys = _keys((3, 128), seed=1)
  vals, e = cache.quantize_fp8(keys)
  rec = np.asarray(cache.pack_fp8_records(vals, e))
  assert rec.shape == (3, 256) and rec.dtype == np.uint8
  np.testing.assert_array_equal(rec[:, :128],
                                np.asarray(vals).view(np.uint8))
  np.testing.assert_array_equal(rec[:, 128], np.asarray(e) + 127)
  assert (rec[:, 129:] == 0).all()
  v2, e2 = cache.unpack_fp8_records(rec)
  np.testing.assert_array_equal(np.asarray(v2).view(np.uint8),
                                np.asarray(vals).view(np.uint8))
  np.testing.assert_array_equal(e2, e)


def test_record_sizes():
  assert cache.record_bytes("fp8") == 256
  assert cache.record_bytes("bf16") == 256
  assert cache.lkv_dim("fp8", 256) == 384
  assert cache.kv_packing("fp8") == 4 and cache.kv_packing("bf16") == 2


@pytest.mark.parametrize("fmt", ["fp8", "bf16", "f32"])
def test_pack_cache_places_entry_t_at_row_t_div_packing_slot_t_mod_packing(
    fmt):
  keys = _keys((5, 16, 128), seed=2)
  c = np.asarray(cache.pack_cache(keys, fmt))
  packing = cache.kv_packing(fmt)
  assert c.shape == (5, 16 // packing, packing, cache.lkv_dim(fmt))
  for page, t in [(0, 0), (3, 5), (4, 15), (2, 7)]:
    rec = c[page, t // packing, t % packing]
    if fmt == "fp8":
      want = np.asarray(cache.pack_cache(keys[page:page + 1, t:t + 1].repeat(
          4, 1), fmt))[0, 0, 0]
      np.testing.assert_array_equal(rec, want)
    else:
      np.testing.assert_array_equal(
          rec.astype(np.float32),
          keys[page, t].astype(c.dtype).astype(np.float32))
    # The kernel unpacks a block with reshape(-1, lkv_dim): same order.
    flat = c[page].reshape(-1, c.shape[-1])
    np.testing.assert_array_equal(flat[t], rec)


@pytest.mark.parametrize("fmt", ["fp8", "bf16"])
def test_unpack_cache_round_trip_against_independent_decoder(fmt):
  keys = _keys((4, 32, 128), seed=3, scale=7.0)
  c = cache.pack_cache(keys, fmt)
  got = np.asarray(cache.unpack_cache(c), np.float64)
  np.testing.assert_array_equal(got, oracle.decode_keys(np.asarray(c), 128))
  if fmt == "bf16":
    np.testing.assert_array_equal(
        got, keys.astype(ml_dtypes.bfloat16).astype(np.float64))
  # Quantization is idempotent: re-packing the dequantized keys loses
  # nothing. (The bytes may differ: a record whose largest value rounded to
  # exactly 224 * 2**e re-quantizes at scale 2**(e - 1), to the same values.)
  np.testing.assert_array_equal(
      np.asarray(cache.unpack_cache(cache.pack_cache(got, fmt))), got)


def test_every_e4m3_byte_decodes_like_the_independent_decoder():
  b = np.arange(256, dtype=np.uint8)
  mine = np.asarray(jax.lax.bitcast_convert_type(jnp.asarray(b),
                                                 jnp.float8_e4m3fn),
                    np.float64)
  theirs = np.array([oracle.decode_e4m3fn(int(x)) for x in b])
  np.testing.assert_array_equal(np.isnan(mine), np.isnan(theirs))
  ok = ~np.isnan(theirs)
  np.testing.assert_array_equal(mine[ok], theirs[ok])


def test_entry_location():
  table = np.array([7, 2, 9])
  assert cache.entry_location(0, table, 16, "fp8") == (7, 0, 0)
  assert cache.entry_location(21, table, 16, "fp8") == (2, 1, 1)
  assert cache.entry_location(47, table, 16, "bf16") == (9, 7, 1)


def test_bad_format_and_shapes_are_rejected():
  with pytest.raises(ValueError, match="fmt must be one of"):
    cache.pack_cache(_keys((1, 16, 128)), "fp4")
  with pytest.raises(ValueError, match="page_size .* multiple of kv_packing"):
    cache.pack_cache(_keys((1, 6, 128)), "fp8")
  with pytest.raises(ValueError, match=r"keys must be \[total_num_pages"):
    cache.pack_cache(_keys((16, 128)), "fp8")


# -- MXFP4 ----------------------------------------------------------------


def test_every_e2m1_code_decodes_like_ml_dtypes():
  codes = np.arange(16, dtype=np.uint8)
  want = (codes.view(np.uint8).astype(np.uint8)).astype(ml_dtypes.uint4).view(
      ml_dtypes.float4_e2m1fn).astype(np.float32)
  np.testing.assert_array_equal(cache.E2M1_VALUES, want)
  # the bit formula: sign bit 3, exponent bits 2-1 (bias 1), mantissa bit 0
  e, m = (codes >> 1) & 3, codes & 1
  mag = np.where(e == 0, m * 0.5, 2.0**(e.astype(np.float64) - 1) * (1 + m / 2))
  np.testing.assert_array_equal(cache.E2M1_VALUES,
                                np.where(codes & 8, -mag, mag))


def _group(first):
  """One 32-value group whose amax is 6 (so its exponent is 0)."""
  g = np.zeros(32, np.float32)
  g[0], g[1] = first, 6.0
  return g


def test_every_e2m1_code_round_trips_and_midpoints_round_to_even():
  for c in range(16):
    codes, e = cache.quantize_mxfp4(_group(cache.E2M1_VALUES[c]))
    assert int(e[0]) == 0
    assert cache.E2M1_VALUES[int(codes[0])] == cache.E2M1_VALUES[c]
  mags = cache.E2M1_VALUES[:8]
  for a, b, ca, cb in zip(mags[:-1], mags[1:], range(7), range(1, 8)):
    for sign in (1, -1):
      mid = np.float32(sign * (a + b) / 2)
      got = int(cache.quantize_mxfp4(_group(mid))[0][0]) & 7
      assert got == (ca if ca % 2 == 0 else cb), (a, b)  # the even mantissa
      for x, want in ((np.nextafter(mid, np.float32(0)), ca),
                      (np.nextafter(mid, 2 * mid), cb)):
        assert int(cache.quantize_mxfp4(_group(x))[0][0]) & 7 == want


@pytest.mark.parametrize("amax", [6.0, 6.01, 1.0, 4.5, 3.0, 1e-3, 1e30,
                                  1e-30, 0.75 * 2.0**-100])
def test_mxfp4_exponent_is_the_smallest_power_of_two_that_fits(amax):
  e = int(cache.mxfp4_exponent(amax))
  assert 2.0**e * 6.0 >= np.float32(amax) > 2.0**(e - 1) * 6.0


def test_mxfp4_exponent_clamps_and_saturates():
  assert int(cache.mxfp4_exponent(0.0)) == 0
  assert int(cache.mxfp4_exponent(2.0**-125)) == cache.MXFP4_MIN_EXPONENT
  assert int(cache.mxfp4_exponent(3e38)) == cache.MXFP4_MAX_EXPONENT
  big = np.full((1, 8, 128), 3e38, np.float32)  # clamped: saturates to 6
  keys = cache.unpack_cache(cache.pack_mxfp4_cache(big))
  assert np.all(keys == np.float32(6 * 2.0**125))


def test_mxfp4_layout_byte_by_byte_and_round_trip():
  keys = _keys((3, 16, 128), seed=4) * np.exp2(
      np.arange(4).repeat(32) * 3.0).astype(np.float32)  # a scale per group
  values, scales = cache.pack_mxfp4_cache(keys)
  assert values.shape == (3, 2, 4, 128) and scales.shape == (3, 4, 16)
  assert cache.CACHE_FORMATS["mxfp4"].bytes_per_entry(128) == 68
  assert cache.cache_pages((values, scales)) == (3, 16)
  codes, e = cache.quantize_mxfp4(keys)
  flat = np.asarray(values).reshape(3, 8, 128)
  np.testing.assert_array_equal(flat & 0xF, codes[:, :8])
  np.testing.assert_array_equal(flat >> 4, codes[:, 8:])
  np.testing.assert_array_equal(np.asarray(scales).transpose(0, 2, 1),
                                np.asarray(e) + 127)
  got = cache.unpack_cache((values, scales))
  want = cache.E2M1_VALUES[np.asarray(codes)] * np.exp2(
      np.asarray(e, np.float64)).repeat(32, axis=-1)
  np.testing.assert_array_equal(got, want.astype(np.float32))
  # error bound: half a grid step at the top, 6 * 2**e / 12 per group
  step = np.exp2(np.asarray(e, np.float64)).repeat(32, axis=-1)
  assert np.all(np.abs(got - keys) <= step + 1e-30)


# ---------------------------------------------------------------------------
# The inline FP8 cache: the dense pair's bytes, a page in one slice.


@pytest.mark.parametrize("page_size", [16, 100, 128, 256, 512])
def test_inline_cache_holds_the_dense_pairs_bytes_a_page_in_one_slice(
    page_size):
  keys = _keys((3, page_size, 64), seed=5, scale=np.float32(1e3))
  values, scales = cache.pack_dense_fp8_cache(keys)
  arr = cache.pack_inline_fp8_cache(keys)
  rows = page_size // 4
  assert arr.shape == (3, rows + 1, 4, 128) and arr.dtype == np.uint8
  assert cache.is_inline(arr) and cache.is_inline((arr,))
  assert cache.format_of((arr,)) == "inline_fp8"
  assert cache.cache_pages(arr) == cache.cache_pages((values, scales))
  np.testing.assert_array_equal(arr[:, :rows], values)  # the value rows
  # the scale row: entry 128 c + l's byte at [slot c, lane l], zero past
  row = np.asarray(arr[:, rows]).reshape(3, 512)
  np.testing.assert_array_equal(row[:, :page_size],
                                cache.entry_scale_bytes(scales, page_size))
  np.testing.assert_array_equal(row[:, page_size:], 0)
  for a, b in zip(cache.inline_to_pair(arr), (values, scales)):
    np.testing.assert_array_equal(a, b)
  np.testing.assert_array_equal(cache.unpack_cache(arr, 64),
                                cache.unpack_cache((values, scales), 64))
  # As a TPU stores it, the pair's bytes: no tile padding in one array.
  assert arr.nbytes == values.nbytes + 3 * cache.tpu_scale_bytes(
      cache.dense_scale_data_rows(page_size),
      cache.dense_scale_lanes(page_size))


def test_inline_cache_is_told_from_the_packed_record_by_its_width():
  keys = _keys((2, 16, 128))
  assert not cache.is_inline(cache.pack_cache(keys, "fp8"))  # 256 lanes
  assert not cache.is_inline(cache.pack_cache(keys, "bf16"))  # bf16
  assert not cache.is_inline(cache.pack_dense_fp8_cache(keys))  # a pair
  assert cache.format_of((cache.pack_cache(keys, "fp8"),)) == "fp8"


@pytest.mark.parametrize("shape", [(2, 16, 129), (2, 516, 128)])
def test_inline_cache_refuses_what_one_scale_row_cannot_hold(shape):
  with pytest.raises(ValueError, match=r"head_dim <= 128 and page_size <= "
                     r"512 \(one row of scale bytes a page\)"):
    cache.pack_inline_fp8_cache(np.ones(shape, np.float32))
