"""streamidx.lab.studies.quant: scales, FP8 queries, Hadamard, the kernel's
unpack.

Notebook 02 asserts the rest on every run: the e4m3 grid decoded by the
format's definition (its counts and spacing), `record_error` on records e4m3
holds exactly, the power-of-two scale commuting with the reduction (and the
float scale not), the Student-t interval, the recall study's shapes, and its
float32 truth against the same scores in float64 (its `float64_scores`).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import streamidx as si
from streamidx import cache, ref
from streamidx.lab.studies import quant


def test_pow2_is_exact_over_the_normal_float32_exponents():
  e = np.arange(-126, 128)
  np.testing.assert_array_equal(np.asarray(quant.pow2(e), np.float64),
                                np.ldexp(1.0, e))


# --------------------------------------------------------------------------
# Scales.

AMAX_CASES = [2.0**-100, 1e-3, 0.5, 1.0, 3.7, 224.0, 447.9, 448.0, 448.1,
              896.0, 1e5, 2.0**100]


@pytest.mark.parametrize("amax", AMAX_CASES)
def test_ue8m0_scale_never_saturates_and_is_the_smallest_power_of_two(amax):
  rng = np.random.default_rng(0)
  x = rng.uniform(-1, 1, (8, 128)).astype(np.float32) * np.float32(amax)
  x[:, 5] = np.float32(amax) * np.array([1, -1] * 4, np.float32)
  values, scales = quant.quantize_ue8m0(x)
  stored = np.asarray(values.astype(jnp.float32))
  assert np.isfinite(stored).all() and np.abs(stored).max() <= 448
  s = np.asarray(scales, np.float64)
  assert (np.log2(s) == np.round(np.log2(s))).all()     # powers of two
  ratio = np.float64(np.float32(amax)) / s
  assert (ratio <= 448).all() and (ratio > 224).all()   # the smallest one


@pytest.mark.parametrize("amax", AMAX_CASES)
def test_float_scale_puts_amax_exactly_on_448(amax):
  rng = np.random.default_rng(1)
  x = rng.uniform(-1, 1, (4, 128)).astype(np.float32) * np.float32(amax)
  values, _ = quant.quantize_float_scale(x)
  stored = np.abs(np.asarray(values.astype(jnp.float32)))
  np.testing.assert_array_equal(stored.max(axis=1), 448.0)


def test_ue8m0_scale_of_a_record_puts_amax_in_the_top_binade():
  keys = np.array([[3.0] + [1.0] * 127, [448.0] * 128], np.float32)
  values, scales = quant.quantize_ue8m0(keys)
  # Record 1: amax 3 -> scale 2**-7, amax lands on 384; record 2 is exact.
  np.testing.assert_array_equal(np.asarray(scales), [2.0**-7, 1.0])
  np.testing.assert_array_equal(np.asarray(values.astype(jnp.float32))[1], 448.0)


def test_outlier_keys_have_that_many_large_channels():
  b = si.make_batch([(1, 300)], page_size=64, compression_ratio=1)
  o = si.make_inputs(b, num_heads=1, fmt="f32", q_dtype=jnp.float32, seed=1,
                     key_distribution="outliers", outlier_channels=3,
                     outlier_scale=50.0)
  keys = np.asarray(o.keys).reshape(-1, 128)[:300]
  assert np.sum(np.abs(keys).mean(axis=0) > 10) == 3


def _scores(q, w, values):
  """f32[T, E] = sum_h w[t, h] * ReLU(q[t, h] . values[e]), float32 NumPy."""
  s = np.maximum(np.einsum("thd,ed->the", q, values), np.float32(0))
  return (s * w[:, :, None]).sum(axis=1, dtype=np.float32)


def _scoring_operands(seed=0, t=3, h=4, e=32, d=128):
  rng = np.random.default_rng(seed)
  q = rng.standard_normal((t, h, d)).astype(np.float32)
  w = np.abs(rng.standard_normal((t, h))).astype(np.float32)
  values, _ = cache.quantize_fp8(rng.standard_normal((e, d)).astype(np.float32))
  return q, w, np.asarray(values.astype(jnp.float32))


# --------------------------------------------------------------------------
# FP8 queries.


def test_fp8_query_scale_folds_into_weights_exactly():
  rng = np.random.default_rng(2)
  q = (rng.standard_normal((5, 4, 128)) * 3).astype(np.float32)
  w = np.abs(rng.standard_normal((5, 4))).astype(np.float32)
  q8, w_folded, s = quant.quantize_queries_fp8(q, w)
  q8 = np.asarray(q8.astype(jnp.float32))
  s = np.asarray(s)
  assert np.abs(q8).max() <= 448
  np.testing.assert_array_equal(np.asarray(w_folded), w * s)
  _, _, values = _scoring_operands(seed=3)
  folded = _scores(q8, np.asarray(w_folded, np.float32), values)
  dequantized = _scores(q8 * s[:, :, None], w, values)
  np.testing.assert_array_equal(folded, dequantized)


def test_fp8_queries_through_the_reference_score_exactly_like_dequantized_ones():
  batch = si.make_mixed_batch(decode=[70, 33], prefill=[(6, 50)],
                              mixed=[(4, 64)], page_size=8,
                              compression_ratio=4)
  inp = si.make_inputs(batch, num_heads=4, fmt="fp8", q_dtype=jnp.float32)
  q8, w_folded, s = quant.quantize_queries_fp8(inp.q, inp.weights)
  # e4m3 values, and e4m3 values times powers of two, are exact in bf16.
  q8_bf16 = q8.astype(jnp.bfloat16)
  assert (q8_bf16.astype(jnp.float8_e4m3fn) == q8).all()
  deq_bf16 = (q8.astype(jnp.float32) * s[..., None]).astype(jnp.bfloat16)
  np.testing.assert_array_equal(
      np.asarray(deq_bf16, np.float32),
      np.asarray(q8.astype(jnp.float32) * s[..., None]))
  args = list(inp.args)
  kw = dict(compression_ratio=4, chunk_bytes=1)
  args[0], args[1] = q8_bf16, w_folded
  folded = np.asarray(ref.token_scores(*args, **kw))
  args[0], args[1] = deq_bf16, inp.weights
  dequantized = np.asarray(ref.token_scores(*args, **kw))
  np.testing.assert_array_equal(folded, dequantized)


def test_quantize_queries_rejects_unknown_options():
  q = np.ones((1, 2, 128), np.float32)
  w = np.ones((1, 2), np.float32)
  with pytest.raises(ValueError, match="scale"):
    quant.quantize_queries_fp8(q, w, scale="e5m2")


# --------------------------------------------------------------------------
# Hadamard rotation.


@pytest.mark.parametrize("n", [1, 2, 4, 8, 64, 128, 256])
def test_hadamard_is_symmetric_orthonormal_with_entries_1_over_sqrt_n(n):
  h = quant.hadamard(n).astype(np.float64)
  np.testing.assert_allclose(h @ h.T, np.eye(n), atol=1e-6)
  np.testing.assert_array_equal(h, h.T)
  np.testing.assert_allclose(np.abs(h), 1 / np.sqrt(n), rtol=1e-6)
  assert (h[0] > 0).all() and (h[:, 0] > 0).all()  # Sylvester's sign pattern


@pytest.mark.parametrize("bad", [0, 3, 6, 100, -4, 2.0, True])
def test_hadamard_rejects_sizes_that_are_not_powers_of_two(bad):
  with pytest.raises(ValueError, match="power of two"):
    quant.hadamard(bad)


def test_rotation_preserves_dot_products_and_spreads_outlier_channels():
  rng = np.random.default_rng(4)
  q = rng.standard_normal((6, 128)).astype(np.float32)
  k = rng.standard_normal((9, 128)).astype(np.float32)
  k[:, 3] *= 50  # one outlier channel
  qr, kr = np.asarray(quant.rotate(q)), np.asarray(quant.rotate(k))
  np.testing.assert_allclose(qr @ kr.T, q @ k.T, rtol=1e-4, atol=1e-3)
  assert np.abs(kr).max() < 0.5 * np.abs(k).max()


# --------------------------------------------------------------------------
# The kernel's unpack.


@pytest.mark.parametrize("page_size", [4, 16])
def test_unpack_block_in_kernel_reads_what_cache_unpacks(page_size):
  keys = jax.random.normal(jax.random.key(page_size), (2, page_size, 128)) * 5
  keys = keys.at[1].multiply(2.0**-20)  # other scale exponents
  packed = cache.pack_cache(keys, "fp8")
  values, scales = cache.unpack_cache_raw(packed)
  for page in range(2):
    got_v, got_s = quant.unpack_block_in_kernel(packed[page])
    np.testing.assert_array_equal(np.asarray(got_v),
                                  np.asarray(values[page].astype(jnp.float32)))
    np.testing.assert_array_equal(np.asarray(got_s)[0], np.asarray(scales[page]))


def test_unpack_block_in_kernel_rejects_non_uint8_blocks():
  block = cache.pack_cache(jnp.ones((1, 4, 128)), "bf16")[0]
  with pytest.raises(ValueError, match="block must be u8"):
    quant.unpack_block_in_kernel(block)

