"""FP8 formats beside the vendored cache's (e4m3 values, ue8m0 scale per
record) for notebooks 01 and 02; the studies themselves are notebook cells.
"""

from __future__ import annotations

import jax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu
import jax.numpy as jnp
import numpy as np

from streamidx import cache as cache_lib


def pow2(e):
  """2.0**e as f32, exactly, for int e in [-126, 127] (on CPU, jax 0.10.2,
  `jnp.exp2(-18.0) != 2**-18`; e = -127, a subnormal, flushes to 0)."""
  e = jnp.asarray(e, jnp.int32)
  return jnp.ldexp(jnp.ones(e.shape, jnp.float32), e)


def quantize_ue8m0(x):
  """`streamidx.cache.quantize_fp8` with the scale as a float: (values
  f8e4m3fn[..., D], scales 2**e f32[...])."""
  values, e = cache_lib.quantize_fp8(x)
  return values, pow2(e)


def quantize_float_scale(x):
  """x f32[..., D] -> (values f8e4m3fn[..., D], scales f32[...]): an exact
  float32 scale amax / 448 per record (1 if all zero), values x / scale."""
  x = jnp.asarray(x, jnp.float32)
  amax = jnp.max(jnp.abs(x), axis=-1)
  scale = jnp.where(amax > 0, amax / jnp.float32(cache_lib.E4M3_MAX), 1.0)
  return (x / scale[..., None]).astype(jnp.float8_e4m3fn), scale


_QUANTIZERS = {"ue8m0": quantize_ue8m0, "float": quantize_float_scale}


def quantize_queries_fp8(q, weights, *, scale: str = "ue8m0"):
  """FP8 queries q [T, H, D] with their scale folded into weights f32[T, H]
  (w ReLU(q . k) = (w s) ReLU(q8 . k), s > 0): (q8 f8e4m3fn[T, H, D], folded
  weights, scales f32[T, H]); scale "ue8m0" or "float", one per token and head."""
  if scale not in _QUANTIZERS:
    raise ValueError(f"scale must be 'ue8m0' or 'float', got {scale!r}")
  v, s = _QUANTIZERS[scale](jnp.asarray(q, jnp.float32))
  return v, jnp.asarray(weights, jnp.float32) * s, s


def hadamard(n: int) -> np.ndarray:
  """The normalized Sylvester Hadamard matrix f32[n, n] (n a power of 2):
  symmetric, orthonormal: (q H) . (k H) = q . k in exact arithmetic."""
  if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1 \
      or n & (n - 1):
    raise ValueError(f"n must be a power of two >= 1, got {n!r}")
  h = np.ones((1, 1), np.float64)
  while h.shape[0] < n:
    h = np.block([[h, h], [h, -h]])
  return (h / np.sqrt(n)).astype(np.float32)


def rotate(x, h=None):
  """x @ H over the last axis (f32), H = hadamard(x.shape[-1]) by default."""
  x = jnp.asarray(x, jnp.float32)
  if h is None:
    h = hadamard(x.shape[-1])
  return jnp.einsum("...d,de->...e", x, jnp.asarray(h, jnp.float32),
                    precision=jax.lax.Precision.HIGHEST)


def unpack_block_in_kernel(block, head_dim: int = 128):
  """The vendored FP8 `load_bkv`'s ops on one block u8[rows, kv_packing,
  lkv_dim] in the TPU interpreter: (values f32[rows * kv_packing, head_dim],
  scales f32[1, rows * kv_packing]); entry r * kv_packing + j: row r, slot j."""
  block = jnp.asarray(block)
  if block.dtype != jnp.uint8 or block.ndim != 3:
    raise ValueError(f"block must be u8[rows, kv_packing, lkv_dim], got "
                     f"{block.dtype}{list(block.shape)}")
  entries = block.shape[0] * block.shape[1]

  def unpack(block_ref, values_ref, scales_ref):  # load_bkv's FP8 branch
    bkv = block_ref[...]
    flat_bkv = bkv.reshape(-1, bkv.shape[-1])
    fp8_val = pltpu.bitcast(flat_bkv[:, :head_dim], jnp.float8_e4m3fn)
    scale_val = pltpu.bitcast(flat_bkv[:, head_dim:head_dim + 1].T,
                              jnp.float8_e8m0fnu).astype(jnp.bfloat16)
    values_ref[...] = fp8_val.astype(jnp.float32)
    scales_ref[...] = scale_val.astype(jnp.float32)

  call = pl.pallas_call(
      unpack,
      out_shape=(jax.ShapeDtypeStruct((entries, head_dim), jnp.float32),
                 jax.ShapeDtypeStruct((1, entries), jnp.float32)),
      in_specs=[pl.BlockSpec(memory_space=pltpu.VMEM)],
      out_specs=(pl.BlockSpec(memory_space=pltpu.VMEM),) * 2,
      interpret=pltpu.InterpretParams(),
  )
  return call(block)

