"""The indexer's paged KV cache: FP8 and MXFP4 quantization, packing and
unpacking, and the cache formats the kernels read (`CACHE_FORMATS`); every
layout byte by byte: docs/cache-formats.md. Packed cache array:
`[total_num_pages, page_size // kv_packing, kv_packing, lkv_dim]`, entry t
of page P at `cache[P, t // kv_packing, t % kv_packing, :]`; an FP8 record
is the e4m3 values, zeros to `padded_head_dim`, the e8m0 byte e + 127.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable, Literal, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from streamidx.semantics import LANES, align_to

CacheFormat = Literal["fp8", "bf16", "f32"]
# The kernel reads the first two; "f32", the exact baseline, the reference only.
FORMATS: tuple[str, ...] = ("fp8", "bf16")
REFERENCE_FORMATS: tuple[str, ...] = ("fp8", "bf16", "f32")

E4M3_MAX = 448.0
E8M0_BIAS = 127
E8M0_MIN_EXPONENT = -126  # float32's smallest normal: byte 0 is flushed to 0
E8M0_MAX_EXPONENT = 127


def _as_keys(keys, fmt: str, multiple: int, what: str = "") -> jax.Array:
  """keys as f32[total_num_pages, page_size, head_dim], page_size a multiple
  of `multiple` (`fmt`'s entries per row of words), or a ValueError."""
  keys = jnp.asarray(keys, jnp.float32)
  if keys.ndim != 3:
    raise ValueError(
        "keys must be [total_num_pages, page_size, head_dim], got shape "
        f"{keys.shape}")
  if keys.shape[1] % multiple:
    raise ValueError(f"page_size ({keys.shape[1]}) must be a multiple of "
                     f"{what}{multiple} for the {fmt} cache")
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
  """Elements per record: FP8 the padded value bytes + 1 scale byte in whole 128
  lanes (256 at head_dim 128); bf16 the padded head_dim; f32 head_dim."""
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
  """Smallest e with 2**e >= amax / 448, clamped to [-126, 127], exactly:
  with amax = m * 2**x, m in [0.5, 1), e = x - 9 + (m > 0.875). An all-zero
  record gets e = 0."""
  amax = jnp.asarray(amax, jnp.float32)
  mant, exp = jnp.frexp(amax)
  e = exp - 9 + (mant > 0.875).astype(exp.dtype)
  e = jnp.where(amax > 0, e, 0)
  return jnp.clip(e, E8M0_MIN_EXPONENT, E8M0_MAX_EXPONENT).astype(jnp.int32)


def quantize_fp8(keys):
  """keys f32[..., head_dim] -> (values f8e4m3fn[..., head_dim], exponents
  i32[...]) with keys ~= values * 2**exponents, one scale per record."""
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
  """values f8e4m3fn[..., head_dim], exponents i32[...] in [-127, 127] ->
  u8[..., lkv_dim("fp8", head_dim)] records: value bytes, zeros up to
  `padded_head_dim(head_dim)`, the scale byte, zero padding."""
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
  """The kernel's cache array, [total_num_pages, page_size // kv_packing,
  kv_packing, lkv_dim] of `cache_dtype(fmt)`, from keys f32[total_num_pages,
  page_size, head_dim] (keys[P, t]: entry t of physical page P)."""
  _check_format(fmt)
  packing = kv_packing(fmt)
  keys = _as_keys(keys, fmt, packing, "kv_packing = ")
  total_pages, page_size, head_dim = keys.shape
  if fmt == "fp8":
    records = pack_fp8_records(*quantize_fp8(keys))
  else:
    width = lkv_dim(fmt, head_dim)
    records = jnp.pad(keys, ((0, 0), (0, 0), (0, width - head_dim)))
    records = records.astype(cache_dtype(fmt))
  return records.reshape(total_pages, page_size // packing, packing,
                         records.shape[-1])


def unpack_cache_raw(cache, head_dim: int = 128):
  """A cache (one array or a pair) -> the kernel's operands per entry:
  (values [total_num_pages, page_size, head_dim], f32 scales [pages,
  page_size] or None): FP8 the e4m3 values and 2**e; bf16 the keys; MXFP4
  the dequantized f32 keys."""
  if is_mxfp4(cache):  # dequantized here: its scales are per group
    return dequantize_mxfp4(*unpack_mxfp4_cache(cache))[..., :head_dim], None
  if is_inline(cache):
    cache = inline_to_pair(cache)
  dense = isinstance(cache, (tuple, list))
  arr = jnp.asarray(cache[0] if dense else cache)
  pages, rows, packing, width = arr.shape
  flat = arr.reshape(pages, rows * packing, width)
  if arr.dtype != jnp.uint8:
    return flat[..., :head_dim], None
  values = jax.lax.bitcast_convert_type(flat[..., :head_dim], jnp.float8_e4m3fn)
  scale_bytes = (entry_scale_bytes(cache[1], rows * packing) if dense
                 else flat[..., padded_head_dim(head_dim)])
  return values, e8m0_scales(scale_bytes)


def e8m0_scales(scale_bytes):
  """u8 e8m0 bytes -> f32 scales 2**(byte - 127), the kernels' conversion
  (e8m0 -> bf16 -> f32: exact for every power of two; byte 255 is NaN)."""
  scales = jax.lax.bitcast_convert_type(
      jnp.asarray(scale_bytes, jnp.uint8), jnp.float8_e8m0fnu)
  return scales.astype(jnp.bfloat16).astype(jnp.float32)


def cache_pages(cache) -> tuple[int, int]:
  """(total_num_pages, page_size) of a kernel's cache (one array or the
  tuple of its layout's): the one formula of a page's entries, rows x
  packing axis x entries per element (MXFP4: two codes a byte)."""
  pair = isinstance(cache, (tuple, list)) and len(cache) == 2
  values = cache[0] if isinstance(cache, (tuple, list)) else cache
  per_element = 2 if pair and is_mxfp4(cache) else 1
  rows = values.shape[1] - is_inline(cache)  # inline: the scale row
  return (int(values.shape[0]),
          int(rows * values.shape[2] * per_element))


class PageGeometry(NamedTuple):
  """A paged cache's static sizes (`page_geometry`)."""

  total_pages: int
  page_size: int  # entries per page (`cache_pages`)
  pages_per_seq: int  # page-table columns per sequence


def page_geometry(cache, seq_lens, page_indices) -> PageGeometry:
  """`cache_pages` and the page table's columns per sequence (arrays or
  shapes)."""
  total_pages, page_size = cache_pages(cache)
  return PageGeometry(total_pages, page_size,
                      int(page_indices.shape[0]) // int(seq_lens.shape[0]))


def format_of(cache) -> str:
  """The `CACHE_FORMATS` name of a kernel's cache, the tuple of its arrays."""
  if len(cache) == 2:
    return "mxfp4" if is_mxfp4(cache) else "dense_fp8"
  if is_inline(cache):
    return "inline_fp8"
  return "fp8" if jnp.dtype(cache[0].dtype) == jnp.dtype(jnp.uint8) else "bf16"


def unpack_cache(cache, head_dim: int = 128):
  """Cache array -> dequantized keys f32[total_num_pages, page_size, head_dim]."""
  values, scales = unpack_cache_raw(cache, head_dim)
  keys = values.astype(jnp.float32)
  if scales is not None:
    keys = keys * scales[..., None]
  return keys


# ---------------------------------------------------------------------------
# The dense FP8 cache: values and scales in two arrays (docs/cache-formats.md).

DENSE_KV_PACKING = 4  # e4m3 bytes per 32-bit word, as for the FP8 record
NEG_ZERO_BYTE = 0x80  # e4m3fn -0, never in a dense cache


def dense_scale_lanes(page_size: int) -> int:
  """L, the minor dimension of `cache_scales`: 128 or the whole page."""
  return LANES if page_size % LANES == 0 else page_size


def dense_scale_data_rows(page_size: int) -> int:
  """Rows of L lanes that hold a page's scale bytes: page_size // L."""
  return page_size // dense_scale_lanes(page_size)


def dense_scale_rows(page_size: int) -> int:
  """Rows of a page's `cache_scales`: its data rows rounded up to whole
  (4, 128) u8 tiles (`DENSE_KV_PACKING` rows), the padding zero, so that
  the array a TPU stores is the kernels' operand as it is (XLA's layout
  for u8[pages, 1, 128] packs the rows and every call copied them)."""
  return align_to(dense_scale_data_rows(page_size), DENSE_KV_PACKING)


def entry_scale_bytes(cache_scales, page_size: int):
  """The dense pair's `cache_scales` u8[pages, R, L] -> u8[pages, page_size]:
  entry t's byte at t, the padding rows left out."""
  scales = jnp.asarray(cache_scales)
  return scales[:, :dense_scale_data_rows(page_size)].reshape(
      scales.shape[0], page_size)


def pack_dense_fp8_cache(keys):
  """The dense FP8 pair (cache_values, cache_scales) of keys f32[pages,
  page_size, head_dim]: the packed "fp8" format's values and exponents, so
  both decode to identical keys."""
  keys = _as_keys(keys, "dense_fp8", DENSE_KV_PACKING)
  total_pages, page_size, head_dim = keys.shape
  values, exponents = quantize_fp8(keys)
  value_bytes = jax.lax.bitcast_convert_type(values, jnp.uint8)
  # +0 for -0 (0x80): the same key, and the lean kernel's e4m3b11fnuz view
  # of the bytes (`streamidx.kernels.lean`) reads 0x80 as NaN.
  value_bytes = jnp.where(value_bytes == NEG_ZERO_BYTE, 0, value_bytes)
  width = padded_head_dim(head_dim)  # zero lanes, as the record has
  value_bytes = jnp.pad(value_bytes, ((0, 0), (0, 0), (0, width - head_dim)))
  scale_bytes = (exponents + E8M0_BIAS).astype(jnp.uint8)
  rows = dense_scale_data_rows(page_size)
  scales = scale_bytes.reshape(total_pages, rows, page_size // rows)
  return (value_bytes.reshape(total_pages, page_size // DENSE_KV_PACKING,
                              DENSE_KV_PACKING, width),
          jnp.pad(scales, ((0, 0), (0, dense_scale_rows(page_size) - rows),
                           (0, 0))))


def dense_tpu_bytes_per_entry(head_dim: int = 128, page_size: int = 128) -> int:
  """HBM bytes per entry of the dense FP8 cache as a TPU stores it (the
  scale rows padded to whole (4, 128) tiles)."""
  lanes = dense_scale_lanes(page_size)
  return (padded_head_dim(head_dim)
          + tpu_scale_bytes(dense_scale_data_rows(page_size), lanes)
          // page_size)


def tpu_scale_bytes(rows: int, lanes: int) -> int:
  """HBM bytes of one page's u8 scale block [rows, lanes] as a TPU stores it:
  whole (4, 128) tiles (the dense FP8 and MXFP4 layouts' second array)."""
  return (-(-rows // DENSE_KV_PACKING) * DENSE_KV_PACKING
          * -(-lanes // LANES) * LANES)


# ---------------------------------------------------------------------------
# The inline FP8 cache: each page's dense values, then its scale bytes, in
# one array (docs/cache-formats.md), so that a page comes in one DMA.

INLINE_MAX_PAGE = DENSE_KV_PACKING * LANES  # scale bytes one row holds


def is_inline(cache) -> bool:
  """Whether `cache` is the inline FP8 array (one uint8 array 128 lanes
  wide: the packed FP8 record is at least 256)."""
  if isinstance(cache, (tuple, list)):
    if len(cache) != 1:
      return False
    cache = cache[0]
  return (len(cache.shape) == 4 and cache.shape[-1] == LANES
          and jnp.dtype(cache.dtype) == jnp.dtype(jnp.uint8))


def pair_to_inline(values, scales):
  """The dense FP8 pair -> the inline array u8[pages, page_size // 4 + 1,
  4, 128]: a page's value rows, then one row whose byte [slot c, lane l] is
  entry 128 c + l's e8m0 byte (zero past the page). head_dim <= 128 and
  page_size <= `INLINE_MAX_PAGE`, or a ValueError."""
  values = jnp.asarray(values)
  pages, rows, packing, width = values.shape
  page_size = rows * packing
  if width != LANES or page_size > INLINE_MAX_PAGE:
    raise ValueError(
        f"the inline FP8 cache holds head_dim <= {LANES} and page_size <= "
        f"{INLINE_MAX_PAGE} (one row of scale bytes a page) (got head_dim "
        f"padded to {width}, page_size {page_size})")
  row = jnp.pad(entry_scale_bytes(scales, page_size),
                ((0, 0), (0, INLINE_MAX_PAGE - page_size)))
  return jnp.concatenate(
      [values, row.reshape(pages, 1, packing, LANES)], axis=1)


def inline_to_pair(cache):
  """The inline array (or its 1-tuple) -> the dense FP8 pair it holds
  (`pack_dense_fp8_cache`'s arrays, bit for bit)."""
  arr = jnp.asarray(cache[0] if isinstance(cache, (tuple, list)) else cache)
  pages, rows = arr.shape[0], arr.shape[1] - 1
  page_size = rows * DENSE_KV_PACKING
  data_rows = dense_scale_data_rows(page_size)
  scales = arr[:, rows].reshape(pages, INLINE_MAX_PAGE)[:, :page_size]
  scales = scales.reshape(pages, data_rows, page_size // data_rows)
  return arr[:, :rows], jnp.pad(
      scales, ((0, 0), (0, dense_scale_rows(page_size) - data_rows), (0, 0)))


def pack_inline_fp8_cache(keys):
  """The inline FP8 array of keys f32[pages, page_size, head_dim <= 128]:
  the dense pair's bytes (`pack_dense_fp8_cache`), a page in one slice."""
  return pair_to_inline(*pack_dense_fp8_cache(keys))


def physical_slots(entries, page_table, seqs, page_size: int):
  """The page table applied: sequence-local entries i32[T, n] (-1: none)
  of rows whose sequences are seqs i32[T] -> i32[T, n] slots,
  `page_table[seqs[t], e // page_size] * page_size + e % page_size` (vLLM's
  slot mapping; page_size 1: pages), -1 kept, the table i32[max_num_seqs,
  pages_per_seq] applied as given."""
  e = jnp.maximum(entries, 0)
  s = jnp.maximum(seqs, 0)[:, None]
  slot = page_table[s, e // page_size] * page_size + e % page_size
  return jnp.where(entries >= 0, slot, -1).astype(jnp.int32)


def entry_location(entry: int, page_table_row, page_size: int,
                   fmt: CacheFormat):
  """Where sequence-local entry `entry` of a sequence (its page-table row)
  lives: (physical page, row, slot in the row)."""
  packing = kv_packing(fmt)
  slot = int(physical_slots(np.array([[entry]]),
                            np.asarray(page_table_row)[None, :],
                            np.zeros(1, np.int32), page_size)[0, 0])
  page, t = divmod(slot, page_size)
  return page, t // packing, t % packing


# ---------------------------------------------------------------------------
# The MXFP4 cache: e2m1 values two per byte, one ue8m0 scale per 32 values.

MXFP4_GROUP = 32
E2M1_MAX = 6.0
# The decode table: code c -> (-1)**(c >> 3) * e2m1 magnitude of c & 7.
E2M1_VALUES = np.array([0, .5, 1, 1.5, 2, 3, 4, 6], np.float32)
E2M1_VALUES = np.concatenate([E2M1_VALUES, -E2M1_VALUES])
# 0.5 * 2**-125 = 2**-126 keeps the smallest nonzero value a float32 normal;
# 6 * 2**125 stays finite (2**126 would round an amax near 2**128 to inf).
MXFP4_MIN_EXPONENT, MXFP4_MAX_EXPONENT = -125, 125


def mxfp4_exponent(amax):
  """Smallest e with 2**e >= amax / 6, clamped to [-125, 125]: e = x - 3 +
  (m > 0.75) for amax = m * 2**x, m in [0.5, 1); 0 for an all-zero group."""
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
  keys = _as_keys(keys, "mxfp4", 8)
  pages, page_size, head_dim = keys.shape
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
  """A cache format, by name (its key in `CACHE_FORMATS`)."""

  name: str
  description: str
  pack: Callable[..., tuple]  # f32 keys [pages, page_size, D] -> arrays
  bytes_per_entry: Callable[[int], int]  # head_dim -> what a DMA moves
  decodes_as: str = ""  # the format whose decoded keys this one's equal
  arrays: tuple[str, ...] = ("cache_kv",)  # names in the signatures


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
        "head_dim] and e8m0 scale bytes u8[pages, R, L] (page_size/L rows, "
        "zero rows to whole TPU tiles) in two arrays, 129 B/entry of data "
        "(132 B stored at page 128)",
        pack_dense_fp8_cache, lambda head_dim: padded_head_dim(head_dim) + 1,
        "fp8", ("cache_values", "cache_scales")),
    "inline_fp8": CacheLayout(
        "inline_fp8", "inline FP8: each page's dense FP8 values u8[page_size"
        "/4, 4, 128], then one row of its e8m0 scale bytes, in one array "
        "u8[pages, page_size/4 + 1, 4, 128] (head_dim <= 128, page_size <= "
        "512): the dense pair's bytes, a page in one DMA",
        lambda keys: (pack_inline_fp8_cache(keys),),
        lambda head_dim: padded_head_dim(head_dim) + 1, "fp8"),
    "mxfp4": CacheLayout(
        "mxfp4", "MXFP4: e2m1 values two per byte u8[pages, page_size/8, 4, "
        "head_dim] and e8m0 bytes per 32 values u8[pages, head_dim/32, "
        "page_size], 68 B/entry (no tile padding at page sizes of 128k)",
        pack_mxfp4_cache,
        lambda head_dim: (padded_head_dim(head_dim) // 2
                          + padded_head_dim(head_dim) // MXFP4_GROUP), "mxfp4",
        ("cache_values", "cache_scales")),
}


class PageLayout(NamedTuple):
  """One page of a cache format's arrays (`page_layout`)."""

  rows: int  # value rows of a page (page_size_per_kv_packing)
  packing: int  # the packing axis (kv_packing)
  width: int  # a row's elements (lkv_dim; the pairs: head_dim padded)
  dtype: Any  # the values' (or records') dtype
  scale_block: tuple[int, ...] | None  # a page's scales (two arrays)


@functools.lru_cache(maxsize=None)
def page_layout(fmt: str, page_size: int, head_dim: int = 128) -> PageLayout:
  """One page of `CACHE_FORMATS[fmt].pack`'s arrays, shapes only."""
  keys = jax.ShapeDtypeStruct((1, page_size, head_dim), jnp.float32)
  arrays = jax.eval_shape(CACHE_FORMATS[fmt].pack, keys)
  scales = tuple(arrays[1].shape[1:]) if len(arrays) == 2 else None
  return PageLayout(*arrays[0].shape[1:], jnp.dtype(arrays[0].dtype), scales)
