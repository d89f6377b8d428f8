"""The indexer's paged KV cache: FP8 quantization, packing and unpacking.

Vocabulary (the kernel's own terms, defined once here):

- entry: one compressed KV position (a key vector of `head_dim` values). A
  sequence of `seq_len` tokens has `seq_len // compression_ratio` entries.
- page: `page_size` consecutive entries of one sequence, stored together.
  Physical pages are shared by all sequences; a page table maps each
  sequence's local page p to a physical page.
- record: the bytes of one entry in the cache, `lkv_dim` elements wide.
- kv_packing: how many records share one 32-bit sublane word
  (`32 // bitwidth(cache dtype)`): 4 for the uint8 FP8 cache, 2 for bf16.
- page_size_per_kv_packing: `page_size // kv_packing`, the number of packed
  rows of a page.

Cache array: `[total_num_pages, page_size_per_kv_packing, kv_packing, lkv_dim]`.
Entry t of physical page P is `cache[P, t // kv_packing, t % kv_packing, :]`,
which is also the order in which the kernel unpacks a block
(`bkv.reshape(-1, lkv_dim)`: row r, slot j -> entry r * kv_packing + j).

FP8 record (DeepSeek-V4's packed FP8 format, uint8, `lkv_dim = 256` for
head_dim 128)::

    byte:  0 1 2 ...              127 | 128        | 129 ...          255
           e4m3 e4m3 ...         e4m3 | e8m0 scale | zero padding
           \\_ key / 2**e, head_dim _/  \\_ e + 127 _/ \\_ to a multiple of 128 _/

The key is `e4m3_values * 2**e`: one power-of-two (ue8m0) scale per record,
the smallest power of two >= amax / 448 (448 is e4m3fn's largest finite
value), so no value saturates, with e clamped to [-126, 127] (see
`ue8m0_exponent`).

bf16 record: `head_dim` bf16 values, no scale (`lkv_dim = head_dim`).

head_dim below a multiple of 128 (e.g. 16, 32, 64): the kernel pads each
query to `padded_head_dim(head_dim)` lanes with zeros and reads that many
key values per record, so a record is laid out for the padded width: the
head_dim values, zeros up to the padded width, then (FP8) the scale byte at
byte `padded_head_dim(head_dim)`. head_dim 64 gives a 256-byte FP8 record
(scale at byte 128) and a 128-element bf16 record. The padding lanes meet
the query's zero padding, so any finite value there scores 0; a NaN there
(or an inf in a bf16 record) would make the score NaN, which
`streamidx.validate` rejects.

Dense FP8 cache ("dense_fp8", `pack_dense_fp8_cache`): the same e4m3 values
and e8m0 exponents as the FP8 record (`quantize_fp8`), without the padding,
in two arrays (129 B per entry at head_dim 128 instead of 256; head_dim
below a multiple of 128 is padded with zero values to `padded_head_dim`, as
the record is)::

    cache_values  u8[total_num_pages, page_size // 4, 4, padded head_dim]
                  reshapes to [total_num_pages, page_size, padded head_dim]: entry t
                  of page P at [P, t // 4, t % 4, :] (the FP8 record's
                  packing, lkv_dim = padded_head_dim(head_dim))
    cache_scales  u8[total_num_pages, page_size // L, L], L = 128 when
                  page_size is a multiple of 128, else page_size; reshapes to
                  [total_num_pages, page_size]: entry t's e + 127 at t

Why these shapes (checked with libtpu's compiler for v6e, see
`dense_tpu_bytes_per_entry`): XLA tiles the two minor dimensions of a uint8
array passed to a Pallas kernel as (4, 128) rows of 32-bit words,
`T(4,128)(4,1)`. The values' minor dimensions (4, head_dim) are exactly one
such row per 4 entries, so they carry no padding and a page is a slice of
the leading (untiled) dimension: one DMA per page, at any page index, as for
the FP8 record. A page's scales are its own leading-dimension slice too
(`[page_size // L, L]`): a flat `[pages, page_size]` array is tiled
`T(32, 128)` and a one-page DMA there is a sub-tile offset Mosaic rejects
("Offsets along tiled dimensions must be aligned to tiles"). Each page's
scale rows are padded to a multiple of 4 rows of 128 lanes in HBM: at page
size 128 a page's 128 scale bytes occupy 512, so an entry costs 128 + 4 =
132 B on the TPU (129 B of data), 128 + 2 at page size 256 and 129 from
page size 512 up.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Literal

import jax
import jax.numpy as jnp
import numpy as np

from streamidx.semantics import LANES

__all__ = [
    "CacheFormat",
    "FORMATS",
    "REFERENCE_FORMATS",
    "E4M3_MAX",
    "E8M0_BIAS",
    "E8M0_MIN_EXPONENT",
    "padded_head_dim",
    "cache_dtype",
    "kv_packing",
    "lkv_dim",
    "record_bytes",
    "ue8m0_exponent",
    "quantize_fp8",
    "dequantize_fp8",
    "pack_fp8_records",
    "unpack_fp8_records",
    "pack_cache",
    "unpack_cache",
    "unpack_cache_raw",
    "entry_location",
    "e8m0_scales",
    "dense_scale_lanes",
    "pack_dense_fp8_cache",
    "dense_tpu_bytes_per_entry",
    "cache_pages",
    "CacheLayout",
    "CACHE_FORMATS",
    "E2M1_VALUES",
    "mxfp4_exponent",
    "quantize_mxfp4",
    "dequantize_mxfp4",
    "pack_mxfp4_cache",
    "unpack_mxfp4_cache",
    "is_mxfp4",
]

CacheFormat = Literal["fp8", "bf16", "f32"]
# Formats the kernel reads. "f32" (unquantized float32 records) is accepted
# by `pack_cache` and the reference only: the exact baseline of recall studies.
FORMATS: tuple[str, ...] = ("fp8", "bf16")
REFERENCE_FORMATS: tuple[str, ...] = ("fp8", "bf16", "f32")

E4M3_MAX = 448.0
E8M0_BIAS = 127
# The smallest exponent the quantizer emits: 2**-126 is float32's (and
# bfloat16's) smallest normal number. e8m0 also holds 2**-127 (byte 0), but
# that is subnormal in float32/bfloat16 and XLA:CPU (and the TPU) flush it to
# zero where the kernel applies the scale, which zeroes every score.
E8M0_MIN_EXPONENT = -126
E8M0_MAX_EXPONENT = 127


def _as_keys(keys) -> jax.Array:
  """keys as f32[total_num_pages, page_size, head_dim], or a ValueError."""
  keys = jnp.asarray(keys, jnp.float32)
  if keys.ndim != 3:
    raise ValueError(
        "keys must be [total_num_pages, page_size, head_dim], got shape "
        f"{keys.shape}")
  return keys


def _check_format(fmt: str):
  if fmt not in REFERENCE_FORMATS:
    raise ValueError(f"fmt must be one of {REFERENCE_FORMATS}, got {fmt!r}")


def cache_dtype(fmt: CacheFormat):
  """The cache array's dtype: uint8 for packed FP8, bfloat16 for bf16."""
  _check_format(fmt)
  return {"fp8": jnp.uint8, "bf16": jnp.bfloat16, "f32": jnp.float32}[fmt]


def kv_packing(fmt: CacheFormat) -> int:
  """Records per 32-bit word: 4 for FP8 (uint8), 2 for bf16 (1 for f32)."""
  return 32 // jax.dtypes.itemsize_bits(cache_dtype(fmt))


def padded_head_dim(head_dim: int) -> int:
  """head_dim rounded up to 128 lanes: what the kernel reads per record."""
  return -(-head_dim // LANES) * LANES


def lkv_dim(fmt: CacheFormat, head_dim: int = 128) -> int:
  """Elements per record.

  FP8: padded head_dim value bytes + 1 scale byte, rounded up to 128 lanes
  (256 for head_dim <= 128, 384 for 256); bf16: the padded head_dim; f32
  (reference only): head_dim.
  """
  _check_format(fmt)
  if fmt == "fp8":
    return -(-(padded_head_dim(head_dim) + 1) // LANES) * LANES
  if fmt == "bf16":
    return padded_head_dim(head_dim)
  return head_dim


def record_bytes(fmt: CacheFormat, head_dim: int = 128) -> int:
  """Bytes one entry occupies in the cache (256 for both formats at 128)."""
  return lkv_dim(fmt, head_dim) * jnp.dtype(cache_dtype(fmt)).itemsize


def ue8m0_exponent(amax):
  """Smallest e with 2**e >= amax / 448, clamped to [-126, 127].

  Exact (no floating-point log or division): with amax = m * 2**x,
  m in [0.5, 1), and 448 = 0.875 * 2**9, e = x - 9 + (m > 0.875). An
  all-zero record gets e = 0 (any scale would do). The lower clamp is
  `E8M0_MIN_EXPONENT`'s: keys with amax < 448 * 2**-126 (about 5.3e-36) are
  stored as e4m3 values below 448 (subnormals, or 0), losing precision but
  never the scale. The upper end never binds for float32 keys (e <= 120).
  """
  amax = jnp.asarray(amax, jnp.float32)
  mant, exp = jnp.frexp(amax)
  e = exp - 9 + (mant > 0.875).astype(exp.dtype)
  e = jnp.where(amax > 0, e, 0)
  return jnp.clip(e, E8M0_MIN_EXPONENT, E8M0_MAX_EXPONENT).astype(jnp.int32)


def quantize_fp8(keys):
  """Quantizes keys to e4m3fn values with one power-of-two scale per record.

  Args:
    keys: f32[..., head_dim].

  Returns:
    (values f8e4m3fn[..., head_dim], exponents i32[...]) with
    keys ~= values * 2**exponents.
  """
  keys = jnp.asarray(keys, jnp.float32)
  e = ue8m0_exponent(jnp.max(jnp.abs(keys), axis=-1))
  # ldexp scales exactly; jnp.exp2 is not an exact power of two on CPU.
  scaled = jnp.ldexp(keys, -e[..., None])
  return scaled.astype(jnp.float8_e4m3fn), e


def dequantize_fp8(values, exponents):
  """values f8e4m3fn[..., D], exponents i32[...] -> f32[..., D]."""
  return jnp.ldexp(values.astype(jnp.float32),
                   jnp.asarray(exponents, jnp.int32)[..., None])


def pack_fp8_records(values, exponents):
  """Packs e4m3 values and exponents into uint8 records.

  Args:
    values: f8e4m3fn[..., head_dim].
    exponents: i32[...] in [-127, 127] (`quantize_fp8` gives [-126, 127]).

  Returns:
    u8[..., lkv_dim("fp8", head_dim)]: value bytes, zeros up to
    `padded_head_dim(head_dim)`, the scale byte, zero padding.
  """
  head_dim = values.shape[-1]
  padded = padded_head_dim(head_dim)
  width = lkv_dim("fp8", head_dim)
  val_bytes = jax.lax.bitcast_convert_type(values, jnp.uint8)
  scale_byte = (jnp.asarray(exponents, jnp.int32) + E8M0_BIAS).astype(jnp.uint8)
  lead = values.shape[:-1]
  return jnp.concatenate([
      val_bytes, jnp.zeros(lead + (padded - head_dim,), jnp.uint8),
      scale_byte[..., None], jnp.zeros(lead + (width - padded - 1,), jnp.uint8)
  ], axis=-1)


def unpack_fp8_records(records, head_dim: int = 128):
  """Inverse of `pack_fp8_records`: u8[..., lkv] -> (f8e4m3fn[..., D], i32[...])."""
  records = jnp.asarray(records)
  values = jax.lax.bitcast_convert_type(records[..., :head_dim],
                                        jnp.float8_e4m3fn)
  scale_at = padded_head_dim(head_dim)
  exponents = records[..., scale_at].astype(jnp.int32) - E8M0_BIAS
  return values, exponents


def pack_cache(keys, fmt: CacheFormat):
  """Builds the kernel's cache array from keys laid out by physical page.

  Args:
    keys: f32[total_num_pages, page_size, head_dim]; keys[P, t] is entry t
      of physical page P.
    fmt: "fp8" (packed uint8 records) or "bf16".

  Returns:
    [total_num_pages, page_size // kv_packing, kv_packing, lkv_dim] array of
    `cache_dtype(fmt)`.
  """
  _check_format(fmt)
  keys = _as_keys(keys)
  total_pages, page_size, head_dim = keys.shape
  packing = kv_packing(fmt)
  if page_size % packing:
    raise ValueError(
        f"page_size ({page_size}) must be a multiple of kv_packing "
        f"({packing}) for the {fmt} cache")
  if fmt == "fp8":
    records = pack_fp8_records(*quantize_fp8(keys))
  else:
    width = lkv_dim(fmt, head_dim)
    records = jnp.pad(keys, ((0, 0), (0, 0), (0, width - head_dim)))
    records = records.astype(cache_dtype(fmt))
  return records.reshape(total_pages, page_size // packing, packing,
                         records.shape[-1])


def unpack_cache_raw(cache, head_dim: int = 128):
  """Cache array -> the kernel's own operands, per entry.

  `cache` is one array (the packed formats), the dense FP8 pair
  `(cache_values, cache_scales)` or the MXFP4 pair.

  Returns:
    (values [total_num_pages, page_size, head_dim], scales or None): for FP8
    the e4m3 values and the f32 per-entry scales 2**e ([pages, page_size]),
    read from byte `padded_head_dim(head_dim)` as the kernel does; for bf16
    the bf16 keys and None; for MXFP4 the dequantized f32 keys and None.
  """
  if is_mxfp4(cache):  # dequantized here: its scales are per group
    return dequantize_mxfp4(*unpack_mxfp4_cache(cache))[..., :head_dim], None
  dense = isinstance(cache, (tuple, list))
  arr = jnp.asarray(cache[0] if dense else cache)
  pages, rows, packing, width = arr.shape
  flat = arr.reshape(pages, rows * packing, width)
  if arr.dtype != jnp.uint8:
    return flat[..., :head_dim], None
  values = jax.lax.bitcast_convert_type(flat[..., :head_dim],
                                        jnp.float8_e4m3fn)
  scale_bytes = (jnp.asarray(cache[1]).reshape(pages, -1) if dense
                 else flat[..., padded_head_dim(head_dim)])
  return values, e8m0_scales(scale_bytes)


def e8m0_scales(scale_bytes):
  """u8 e8m0 bytes -> f32 scales 2**(byte - 127), the kernels' conversion
  (e8m0 -> bf16 -> f32: exact for every power of two; byte 255 is NaN)."""
  scales = jax.lax.bitcast_convert_type(
      jnp.asarray(scale_bytes, jnp.uint8), jnp.float8_e8m0fnu)
  return scales.astype(jnp.bfloat16).astype(jnp.float32)


def cache_pages(cache) -> tuple[int, int]:
  """(total_num_pages, page_size) of a cache array or a dense FP8 pair."""
  if isinstance(cache, (tuple, list)):
    values = cache[0]
    per_row = 8 if is_mxfp4(cache) else values.shape[2]
    return int(values.shape[0]), int(values.shape[1] * per_row)
  return int(cache.shape[0]), int(cache.shape[1] * cache.shape[2])


def unpack_cache(cache, head_dim: int = 128):
  """Cache array -> dequantized keys f32[total_num_pages, page_size, head_dim]."""
  values, scales = unpack_cache_raw(cache, head_dim)
  keys = values.astype(jnp.float32)
  if scales is not None:
    keys = keys * scales[..., None]
  return keys


# ---------------------------------------------------------------------------
# The dense FP8 cache: values and scales in two arrays (see the module
# docstring).

DENSE_KV_PACKING = 4  # e4m3 bytes per 32-bit word, as for the FP8 record
NEG_ZERO_BYTE = 0x80  # e4m3fn -0, never in a dense cache


def dense_scale_lanes(page_size: int) -> int:
  """L, the minor dimension of `cache_scales`: 128 or the whole page."""
  return LANES if page_size % LANES == 0 else page_size


def pack_dense_fp8_cache(keys):
  """The dense FP8 pair (cache_values, cache_scales) (module docstring) of
  keys f32[total_num_pages, page_size, head_dim] (page_size a multiple of 4):
  `quantize_fp8(keys)`'s values and exponents, as the packed "fp8" format's,
  so both decode to identical keys."""
  keys = _as_keys(keys)
  total_pages, page_size, head_dim = keys.shape
  if page_size % DENSE_KV_PACKING:
    raise ValueError(f"page_size ({page_size}) must be a multiple of "
                     f"{DENSE_KV_PACKING} for the dense_fp8 cache")
  values, exponents = quantize_fp8(keys)
  value_bytes = jax.lax.bitcast_convert_type(values, jnp.uint8)
  # +0 for -0 (0x80): the same key, and the lean kernel's e4m3b11fnuz view
  # of the bytes (`streamidx.kernels.lean`) reads 0x80 as NaN.
  value_bytes = jnp.where(value_bytes == NEG_ZERO_BYTE, 0, value_bytes)
  width = padded_head_dim(head_dim)  # zero lanes, as the record has
  value_bytes = jnp.pad(value_bytes, ((0, 0), (0, 0), (0, width - head_dim)))
  scale_bytes = (exponents + E8M0_BIAS).astype(jnp.uint8)
  lanes = dense_scale_lanes(page_size)
  return (value_bytes.reshape(total_pages, page_size // DENSE_KV_PACKING,
                              DENSE_KV_PACKING, width),
          scale_bytes.reshape(total_pages, page_size // lanes, lanes))


def dense_tpu_bytes_per_entry(head_dim: int = 128, page_size: int = 128) -> int:
  """HBM bytes per entry of the dense FP8 cache as a TPU stores it: the
  values unpadded, a page's scale rows padded to whole (4, 128) tiles (module
  docstring)."""
  lanes = dense_scale_lanes(page_size)
  rows = page_size // lanes
  scale_bytes = -(-rows // DENSE_KV_PACKING) * DENSE_KV_PACKING * LANES
  return padded_head_dim(head_dim) + scale_bytes // page_size


def entry_location(entry: int, page_table_row, page_size: int,
                   fmt: CacheFormat):
  """Where sequence-local entry `entry` lives: (physical page, row, slot).

  `page_table_row` is the sequence's row of the page table
  (`page_indices.reshape(max_num_seqs, pages_per_seq)[b]`).
  """
  packing = kv_packing(fmt)
  page = int(np.asarray(page_table_row)[entry // page_size])
  t = entry % page_size
  return page, t // packing, t % packing


# ---------------------------------------------------------------------------
# The MXFP4 cache ("mxfp4"): e2m1 values two per byte, one ue8m0 scale per
# group of 32 values (OCP MX block size), in two arrays, 68 B per entry at
# head_dim 128 (64 value bytes + 4 scale bytes)::
#
#   cache_values  u8[total_pages, page_size // 8, 4, W]   W = padded head_dim
#                 reshapes to [pages, page_size // 2, W]: byte d of row i
#                 holds entry i's code for value d (low nibble) and entry
#                 i + page_size // 2's (high nibble)
#   cache_scales  u8[total_pages, W // 32, page_size]     group g of entry t
#                 at [P, g, t]: e + 127
#
# Why these shapes (the dense FP8 layout's reasons, `pack_dense_fp8_cache`):
# XLA tiles the two minor dimensions of a uint8 Pallas operand as (4, 128)
# rows of 32-bit words. The values' (4, W) is one such row per 8 entries, so
# a page is a slice of the untiled leading dimension (one DMA per page, no
# padding: 64 B per entry), and the vendored pipeline's DMA and buffers read
# it unchanged (rows of W bytes, 8 entries per 4 rows). Pairing entry i with
# entry i + page_size // 2 (not value d with d + 1) makes the unpack two
# nibble masks of whole 32-bit words and a concatenation along sublanes, no
# lane shuffle. The scales' (W // 32, page_size) = (4, page_size) at head_dim
# 128 is one tile row per 128 entries: a page is again one leading-dimension
# DMA, with no padding when page_size is a multiple of 128 (4 B per entry;
# below that a page's 4 x page_size bytes occupy 4 x 128 in HBM: 8 B per
# entry at page size 64). Entries run along lanes there, as the kernel
# applies a group's scales to score columns.
#
# Quantizer (`quantize_mxfp4`): per group of 32, e is the smallest exponent
# with 2**e >= amax / 6 (6 is e2m1's largest value, so nothing saturates:
# OCP MX's floor(log2 amax) - 2 saturates values in (6, 8) x 2**e to 6),
# clamped to [MXFP4_MIN_EXPONENT, MXFP4_MAX_EXPONENT]; values / 2**e round to
# nearest, ties to even, onto the e2m1 grid (0, 0.5, 1, 1.5, 2, 3, 4, 6; as
# ml_dtypes' float4_e2m1fn), past 6 (only under the clamp) saturating to 6.
# e2m1 has no NaN or inf code: every value byte is a finite pair.
# An optional Hadamard rotation of queries and keys before quantizing (as
# DeepSeek-V3.2's indexer does, `lab.studies.quant.hadamard`) is the
# caller's: scores are invariant under the orthogonal rotation.

MXFP4_GROUP = 32
E2M1_MAX = 6.0
# The decode table: code c -> (-1)**(c >> 3) * e2m1 magnitude of c & 7.
E2M1_VALUES = np.array([0, .5, 1, 1.5, 2, 3, 4, 6], np.float32)
E2M1_VALUES = np.concatenate([E2M1_VALUES, -E2M1_VALUES])
# 0.5 * 2**-125 = 2**-126 keeps the smallest nonzero value a float32 normal;
# 6 * 2**125 stays finite (2**126 would round an amax near 2**128 to inf).
MXFP4_MIN_EXPONENT, MXFP4_MAX_EXPONENT = -125, 125


def mxfp4_exponent(amax):
  """Smallest e with 2**e >= amax / 6, clamped to [-125, 125]: with amax =
  m * 2**x, m in [0.5, 1), and 6 = 0.75 * 2**3, e = x - 3 + (m > 0.75).
  An all-zero group gets e = 0."""
  mant, exp = jnp.frexp(jnp.asarray(amax, jnp.float32))
  e = jnp.where(amax > 0, exp - 3 + (mant > 0.75).astype(exp.dtype), 0)
  return jnp.clip(e, MXFP4_MIN_EXPONENT, MXFP4_MAX_EXPONENT).astype(jnp.int32)


def quantize_mxfp4(keys):
  """f32[..., D] (D a multiple of 32) -> (codes u8[..., D] in [0, 16),
  exponents i32[..., D // 32]) with keys ~= E2M1_VALUES[codes] * 2**e."""
  keys = jnp.asarray(keys, jnp.float32)
  groups = keys.reshape(keys.shape[:-1] + (-1, MXFP4_GROUP))
  e = mxfp4_exponent(jnp.max(jnp.abs(groups), axis=-1))
  a = jnp.minimum(jnp.abs(jnp.ldexp(groups, -e[..., None])), E2M1_MAX)
  # Round half to even on each binade's grid (steps 0.5, 1, 2: all exact),
  # then the magnitude code (0, .5, 1, 1.5, 2, 3, 4, 6 -> 0..7). Written out:
  # XLA:CPU's fast-compile f32 -> float4_e2m1fn convert rounds twice.
  mag = jnp.where(a < 2, jnp.round(2 * a) / 2,
                  jnp.where(a < 4, jnp.round(a), 2 * jnp.round(a / 2)))
  code = jnp.where(mag < 2, 2 * mag, jnp.where(mag < 4, mag + 2, mag / 2 + 4))
  codes = code.astype(jnp.uint8) | jnp.where((groups < 0) & (mag > 0), 8, 0
                                             ).astype(jnp.uint8)
  return codes.reshape(keys.shape), e


def dequantize_mxfp4(codes, exponents):
  """codes u8[..., D], exponents i32[..., D // 32] -> f32[..., D]."""
  values = jnp.asarray(E2M1_VALUES)[jnp.asarray(codes, jnp.int32)]
  groups = values.reshape(values.shape[:-1] + (-1, MXFP4_GROUP))
  return jnp.ldexp(groups, jnp.asarray(exponents, jnp.int32)[..., None]
                   ).reshape(values.shape)


def pack_mxfp4_cache(keys):
  """The MXFP4 pair (cache_values, cache_scales) (see above) of keys
  f32[total_num_pages, page_size, head_dim], page_size a multiple of 8."""
  keys = _as_keys(keys)
  pages, page_size, head_dim = keys.shape
  if page_size % 8:
    raise ValueError(f"page_size ({page_size}) must be a multiple of 8 for "
                     "the mxfp4 cache")
  width = padded_head_dim(head_dim)
  keys = jnp.pad(keys, ((0, 0), (0, 0), (0, width - head_dim)))
  codes, e = quantize_mxfp4(keys)
  half = page_size // 2
  value_bytes = codes[:, :half] | (codes[:, half:] << 4)
  scale_bytes = (e + E8M0_BIAS).astype(jnp.uint8).transpose(0, 2, 1)
  return value_bytes.reshape(pages, page_size // 8, 4, width), scale_bytes


def is_mxfp4(cache) -> bool:
  """Whether `cache` is the MXFP4 pair (its scales' last axis is the page,
  8 entries per 4 value rows; the dense FP8 pair's is 128 or 4 per 4)."""
  return (isinstance(cache, (tuple, list)) and len(cache) == 2
          and cache[1].shape[-1] == cache[0].shape[1] * 8)


def unpack_mxfp4_cache(cache):
  """The MXFP4 pair -> (codes u8[pages, page_size, W], e i32[pages,
  page_size, W // 32])."""
  values, scales = (jnp.asarray(a) for a in cache)
  pages, rows, _, width = values.shape
  flat = values.reshape(pages, rows * 4, width)
  codes = jnp.concatenate([flat & 0xF, flat >> 4], axis=1)
  return codes, scales.transpose(0, 2, 1).astype(jnp.int32) - E8M0_BIAS


# ---------------------------------------------------------------------------
# The cache formats the kernel variants read, by name.


@dataclasses.dataclass(frozen=True)
class CacheLayout:
  """A cache format: how its arrays are built from the logical keys.

  Attributes:
    name: its key in `CACHE_FORMATS` (a variant lists the names it reads).
    description: one line.
    pack: f32 keys [total_num_pages, page_size, head_dim] -> the tuple of
      cache arrays a kernel takes (one array for the packed formats).
    bytes_per_entry: head_dim -> bytes of one entry's data (what a DMA of
      it moves; `dense_tpu_bytes_per_entry` adds the TPU tile padding of
      the dense format's scales).
    decodes_as: the format whose decoded keys (and so scores and summation
      bound) this one's equal.
  """

  name: str
  description: str
  pack: Callable[..., tuple]
  bytes_per_entry: Callable[[int], int]
  decodes_as: str = ""


CACHE_FORMATS: dict[str, CacheLayout] = {
    "fp8": CacheLayout(
        "fp8", "packed uint8 records: e4m3 values + one e8m0 scale byte, "
        "padded to whole 128-lane rows, kv_packing 4",
        lambda keys: (pack_cache(keys, "fp8"),),
        lambda head_dim: record_bytes("fp8", head_dim), "fp8"),
    "bf16": CacheLayout(
        "bf16", "bf16 keys, no scale, kv_packing 2",
        lambda keys: (pack_cache(keys, "bf16"),),
        lambda head_dim: record_bytes("bf16", head_dim), "bf16"),
    "dense_fp8": CacheLayout(
        "dense_fp8", "dense FP8: e4m3 values u8[pages, page_size/4, 4, "
        "head_dim] and e8m0 scale bytes u8[pages, page_size/L, L] in two "
        "arrays, 129 B/entry (132 B with the TPU's tile padding at page 128)",
        pack_dense_fp8_cache, lambda head_dim: padded_head_dim(head_dim) + 1,
        "fp8"),
    "mxfp4": CacheLayout(
        "mxfp4", "MXFP4: e2m1 values two per byte u8[pages, page_size/8, 4, "
        "head_dim] and e8m0 bytes per 32 values u8[pages, head_dim/32, "
        "page_size], 68 B/entry (no tile padding at page sizes of 128k)",
        pack_mxfp4_cache,
        lambda head_dim: (padded_head_dim(head_dim) // 2
                          + padded_head_dim(head_dim) // MXFP4_GROUP), "mxfp4"),
}

