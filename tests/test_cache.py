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
