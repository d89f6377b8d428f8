"""FP8 formats beside the vendored cache's (e4m3 values, ue8m0 scale per
record) for notebooks 01 and 02; the studies themselves are notebook cells.
"""

from __future__ import annotations

import dataclasses

import jax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu
import jax.numpy as jnp
import numpy as np

from streamidx import cache as cache_lib
from streamidx import ref
from streamidx.lab.studies import addressing


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


# Key/query variants of a recall study: (cache format, query form).
VARIANTS: dict[str, tuple[str, str]] = {
    "exact": ("f32", "f32"),       # float32 keys and queries: the baseline
    "bf16": ("bf16", "bf16"),      # bf16 cache, bf16 queries
    "fp8": ("fp8", "bf16"),        # vendored: packed FP8 cache, bf16 queries
    "fp8_q8": ("fp8", "fp8"),      # FP8 cache, FP8 queries (scale in weights)
}


def variant_inputs(inp, variant: str, *, rotated: bool = False,
                   query_scale: str = "ue8m0"):
  """`IndexerInputs` of one `VARIANTS` key/query variant from `inp` (f32
  queries), optionally Hadamard-rotated first."""
  if variant not in VARIANTS:
    raise ValueError(f"variant must be one of {tuple(VARIANTS)}, got "
                     f"{variant!r}")
  if inp.q.dtype != jnp.float32:
    raise ValueError(f"inp.q must be float32 (make_inputs(..., q_dtype="
                     f"jnp.float32)), got {inp.q.dtype}")
  fmt, q_form = VARIANTS[variant]
  q, keys, w = inp.q, inp.keys, inp.weights
  if rotated:
    q, keys = rotate(q), rotate(keys)
  if q_form == "bf16":
    q = q.astype(jnp.bfloat16)
  elif q_form == "fp8":
    q8, w, _ = quantize_queries_fp8(q, w, scale=query_scale)
    q = q8.astype(jnp.bfloat16)
  return dataclasses.replace(inp, q=q, weights=w, keys=keys,
                             cache=cache_lib.pack_cache(keys, fmt), fmt=fmt)


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


def float64_scores(inp, *, compression_ratio: int, seq: int = 0,
                   causal_rule: str = "model") -> np.ndarray:
  """f64[q_len of seq, pages_per_seq * page_size]: sequence `seq`'s rows against
  its unquantized keys in float64; -inf where an entry is hidden."""
  b = inp.batch
  lo, hi = int(b.cu_q_lens[seq]), int(b.cu_q_lens[seq + 1])
  keys = np.asarray(inp.keys, np.float64)[b.page_table[seq]]
  keys = keys.reshape(-1, inp.head_dim)  # [entries, head_dim], sequence order
  q = np.asarray(inp.q.astype(jnp.float32), np.float64)[lo:hi]
  w = np.asarray(inp.weights, np.float64)[lo:hi]
  with jax.enable_x64(True):
    s = np.stack([np.asarray(ref.score_entries(
        jnp.asarray(qt), jnp.asarray(wt), jnp.asarray(keys), None), np.float64)
                  for qt, wt in zip(q, w)])
  visible = addressing.visibility_mask(
      b.token_positions()[lo:hi], keys.shape[0], compression_ratio,
      causal_rule, seq_len=int(b.seq_lens[seq]))
  return np.where(visible, s, -np.inf)
