"""Input checks for the StreamIndex kernels (docs/validation.md).

Each bad input raises `ValueError("<argument>: <rule> (got <what>)")`:
`static_validate(call, *arrays)` checks shapes, dtypes, block sizes and
options (tracer-safe); `validate_inputs` then evaluates `VALUE_RULES` in the
mode's order on concrete arrays; inside `jit`, `check_inputs` issues them as
`checkify.check`s. The value rules are written once (`_value_rules`).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import checkify

from streamidx import blocks
from streamidx import cache as cache_lib
from streamidx import modes
from streamidx import semantics

KERNEL_QUERY_DTYPES = (jnp.bfloat16, jnp.float32)
KERNEL_CACHE_DTYPES = (jnp.uint8, jnp.bfloat16)
_INDEX_DTYPE = jnp.int32
INT32_LIMIT = 2**31  # the kernel's block arithmetic (_check_block_arithmetic)
# Scores must stay below 2**127, half the float32 maximum (room for rounding).
SCORE_LOG2_LIMIT = 127

# ---------------------------------------------------------------------------
# Static checks (shapes, dtypes, options): plain Python, tracer-safe.


def _fail(name: str, rule: str, got) -> None:
  raise ValueError(f"{name}: {rule} (got {got})")


def _dtype_name(x) -> str:
  return jnp.dtype(x.dtype).name


def _check_rank(name, x, rank, layout):
  if not hasattr(x, "shape") or not hasattr(x, "dtype"):
    _fail(name, "must be an array (jax.Array or numpy.ndarray)",
          type(x).__name__)
  if len(x.shape) != rank:
    _fail(name, f"must have rank {rank}, {layout}", f"shape {tuple(x.shape)}")


def _check_index_array(name, x, layout):
  _check_rank(name, x, 1, layout)
  if jnp.dtype(x.dtype) != jnp.dtype(_INDEX_DTYPE):
    _fail(name, "must be int32", _dtype_name(x))


def _is_int_scalar(d) -> bool:
  if isinstance(d, (bool, np.bool_)):
    return False
  return isinstance(d, (int, np.integer)) or (
      hasattr(d, "dtype") and len(getattr(d, "shape", ())) == 0
      and jnp.issubdtype(d.dtype, jnp.integer))


def _check_distribution(distribution):
  if isinstance(distribution, (tuple, list)):
    # As the vendored kernel: `jax.jit` passes it as three int32 scalars.
    if len(distribution) != 3:
      _fail("distribution", "must have length 3: (i, j, n)",
            f"length {len(distribution)}")
    for i, d in enumerate(distribution):
      if not _is_int_scalar(d):
        _fail(f"distribution[{i}]", "must be an integer scalar", repr(d))
    return
  _check_index_array("distribution", distribution, "[3] = (i, j, n)")
  if distribution.shape[0] != 3:
    _fail("distribution", "must have length 3: (i, j, n)",
          f"length {distribution.shape[0]}")


def distribution_array(distribution):
  """`distribution` as i32[3]: an int32 array, or a tuple/list of three
  integer scalars (as the vendored kernel accepts), stacked."""
  _check_distribution(distribution)
  if isinstance(distribution, (tuple, list)):
    return jnp.stack([jnp.asarray(d, jnp.int32) for d in distribution])
  return distribution


def _check_block_arithmetic(page_size, pages_per_seq, bkv_p, case=None):
  """A sequence's entries must fit the kernel's int32 block count."""
  bkv_sz = page_size * bkv_p
  limit = INT32_LIMIT - bkv_sz
  capacity = pages_per_seq * page_size
  if capacity > limit:
    where = f" for the {case} case" if case else ""
    _fail("page_indices", f"pages_per_seq * page_size, the entries a "
          f"sequence can hold, must be <= 2**31 - page_size * "
          f"num_kv_pages_per_block = {limit}{where} (the kernel counts KV "
          f"blocks as (entries + bkv_sz - 1) // bkv_sz in int32)",
          f"{pages_per_seq} * {page_size} = {capacity}")


def _check_u8(name, x, what):
  if jnp.dtype(x.dtype) != jnp.dtype(jnp.uint8):
    _fail(name, f"must be uint8 ({what})", _dtype_name(x))


def _check_pair(cache, head_dim, mxfp4):
  """The dense FP8 or the MXFP4 pair (cache_values, cache_scales)."""
  if len(cache) != 2:
    _fail("cache", "a dense FP8 cache is the pair (cache_values, "
          "cache_scales)", f"{len(cache)} arrays")
  values, scales = cache
  per_row = 8 if mxfp4 else cache_lib.DENSE_KV_PACKING  # entries per 4 rows
  _check_rank("cache_values", values, 4,
              f"[total_num_pages, page_size // {per_row}, 4, padded head_dim]")
  _check_u8("cache_values", values,
            "e2m1 code pairs" if mxfp4 else "bytes of float8_e4m3fn")
  pages, rows, packing, width = values.shape
  if packing != cache_lib.DENSE_KV_PACKING:
    _fail("cache_values", f"axis 2 (kv_packing) must be "
          f"{cache_lib.DENSE_KV_PACKING}", packing)
  if pages < 1 or rows < 1:
    _fail("cache_values", "needs at least one page of at least one row",
          f"shape {tuple(values.shape)}")
  padded = cache_lib.padded_head_dim(head_dim)  # as the kernel pads q
  if width != padded:
    _fail("cache_values", f"last axis must be q's head_dim padded to 128 "
          f"lanes ({head_dim} -> {padded})", width)
  page_size = cache_lib.cache_pages(cache)[1]
  if mxfp4:
    want = (pages, padded // cache_lib.MXFP4_GROUP, page_size)
    layout = "[total_num_pages, padded head_dim // 32, page_size]"
  else:
    lanes = cache_lib.dense_scale_lanes(page_size)
    want = (pages, cache_lib.dense_scale_rows(page_size), lanes)
    layout = ("[total_num_pages, R, L], L = 128 when page_size is a "
              "multiple of 128, else page_size; R = page_size // L rounded "
              "up to a multiple of 4")
  _check_rank("cache_scales", scales, 3, layout)
  _check_u8("cache_scales", scales, "e8m0 exponent bytes")
  if tuple(scales.shape) != want:
    _fail("cache_scales", f"shape must be {want} for cache_values of page "
          f"size {page_size} (streamidx.pack_"
          f"{'mxfp4' if mxfp4 else 'dense_fp8'}_cache)",
          f"shape {tuple(scales.shape)}")


def _check_common(q, indexer_weights, cache_kv, seq_lens, page_indices,
                  cu_q_lens, inline=True):
  """Rules every kernel shares; returns (page_size, pages_per_seq).
  `cache_kv`: one array (packed FP8 or bf16; inline FP8 where `inline`)
  or a pair."""
  _check_rank("q", q, 3, "[max_num_tokens, num_q_heads, head_dim]")
  if jnp.dtype(q.dtype) not in [jnp.dtype(d) for d in KERNEL_QUERY_DTYPES]:
    _fail("q", "dtype must be bfloat16 or float32", _dtype_name(q))
  num_tokens, num_heads, head_dim = q.shape
  if num_tokens < 1 or num_heads < 1:
    _fail("q", "needs at least one token row and one head",
          f"shape {tuple(q.shape)}")
  if head_dim < 1:
    _fail("q", "head_dim (last axis) must be positive", head_dim)
  _check_rank("indexer_weights", indexer_weights, 2,
              "[max_num_tokens, num_q_heads]")
  if not jnp.issubdtype(indexer_weights.dtype, jnp.floating):
    _fail("indexer_weights", "must be floating point",
          _dtype_name(indexer_weights))
  if tuple(indexer_weights.shape) != (num_tokens, num_heads):
    _fail("indexer_weights",
          f"shape must be q's [max_num_tokens, num_q_heads] = "
          f"{(num_tokens, num_heads)}", tuple(indexer_weights.shape))

  if isinstance(cache_kv, (tuple, list)):
    _check_pair(cache_kv, head_dim, cache_lib.is_mxfp4(cache_kv))
  elif cache_lib.is_inline(cache_kv) and inline:
    _check_inline(cache_kv, head_dim)
  else:
    _check_packed_cache(cache_kv, head_dim)
  _check_metadata(seq_lens, page_indices, cu_q_lens)
  return cache_lib.page_geometry(cache_kv, seq_lens, page_indices)[1:]


def _check_inline(cache_kv, head_dim):
  """The inline FP8 array: a page's value rows, then its scale row."""
  pages, rows, packing, _ = cache_kv.shape
  if packing != cache_lib.DENSE_KV_PACKING:
    _fail("cache_kv", f"axis 2 (kv_packing) must be "
          f"{cache_lib.DENSE_KV_PACKING}", packing)
  if pages < 1 or rows < 2:
    _fail("cache_kv", "the inline FP8 cache needs at least one page of a "
          "value row and its scale row", f"shape {tuple(cache_kv.shape)}")
  if cache_lib.padded_head_dim(head_dim) != semantics.LANES:
    _fail("q", f"head_dim must be <= {semantics.LANES} for the inline FP8 "
          f"cache (its rows are {semantics.LANES} lanes)", head_dim)
  page_size = (rows - 1) * packing
  if page_size > cache_lib.INLINE_MAX_PAGE:
    _fail("cache_kv", f"page_size (value rows x {packing}) must be <= "
          f"{cache_lib.INLINE_MAX_PAGE} for the inline FP8 cache (one row "
          f"holds a page's scale bytes)", page_size)


def _check_format(cache, formats):
  """The cache in one of the kernel's `formats` (`CACHE_FORMATS` names)."""
  if formats is None:
    return
  got = cache_lib.format_of(cache if isinstance(cache, (tuple, list))
                            else (cache,))
  if got not in formats:
    _fail("cache_kv" if len(cache_lib.CACHE_FORMATS[formats[0]].arrays) == 1
          else "cache_values", f"this kernel reads the {' or '.join(formats)} "
          f"cache (streamidx.cache.CACHE_FORMATS)", f"the {got} cache")


def _check_packed_cache(cache_kv, head_dim):
  """The packed FP8 or bf16 cache array."""
  # The kernel pads q to 128 lanes (`prepare_q_inputs`) and reads that many
  # key values per record; the record is laid out for the padded width.
  padded = cache_lib.padded_head_dim(head_dim)
  _check_rank("cache_kv", cache_kv, 4,
              "[total_num_pages, page_size_per_kv_packing, kv_packing, "
              "lkv_dim]")
  cdt = jnp.dtype(cache_kv.dtype)
  if cdt not in [jnp.dtype(d) for d in KERNEL_CACHE_DTYPES]:
    _fail("cache_kv", "dtype must be uint8 (packed FP8) or bfloat16", cdt.name)
  pages, rows, packing, lkv = cache_kv.shape
  want_packing = 32 // (cdt.itemsize * 8)
  if packing != want_packing:
    _fail("cache_kv", f"axis 2 (kv_packing) must be {want_packing} for a "
          f"{cdt.name} cache", packing)
  if pages < 1 or rows < 1:
    _fail("cache_kv", "needs at least one page of at least one row",
          f"shape {tuple(cache_kv.shape)}")
  if lkv % 128:
    _fail("cache_kv", "lkv_dim (last axis) must be a multiple of 128", lkv)
  fp8 = cdt == jnp.dtype(jnp.uint8)
  if lkv < padded + fp8:
    _fail("cache_kv", f"a{'n FP8' if fp8 else ' bf16'} record needs {padded} "
          f"value{' byte' * fp8}s (head_dim {head_dim} padded to 128 lanes, "
          "as the kernel pads q)" + (f" and the e8m0 scale at byte {padded}: "
                                     f"{padded + 1} bytes" if fp8 else ""),
          f"lkv_dim {lkv}")


def _check_metadata(seq_lens, page_indices, cu_q_lens):
  _check_index_array("seq_lens", seq_lens, "[max_num_seqs]")
  max_num_seqs = seq_lens.shape[0]
  if max_num_seqs < 1:
    _fail("seq_lens", "needs at least one sequence slot", "shape (0,)")
  _check_index_array("page_indices", page_indices,
                     "[max_num_seqs * pages_per_seq]")
  if page_indices.shape[0] < max_num_seqs or (
      page_indices.shape[0] % max_num_seqs):
    _fail("page_indices", f"length must be a positive multiple of "
          f"max_num_seqs ({max_num_seqs}), one row of pages per sequence",
          page_indices.shape[0])
  _check_index_array("cu_q_lens", cu_q_lens, "[max_num_seqs + 1]")
  if cu_q_lens.shape[0] != max_num_seqs + 1:
    _fail("cu_q_lens", f"length must be len(seq_lens) + 1 = "
          f"{max_num_seqs + 1}", cu_q_lens.shape[0])


def _check_num_seqs(num_seqs):
  if isinstance(num_seqs, bool):
    _fail("num_seqs", "must be an integer", repr(num_seqs))
  if len(getattr(num_seqs, "shape", ())) != 0:
    _fail("num_seqs", "must be a scalar", f"shape {tuple(num_seqs.shape)}")
  dtype = (num_seqs.dtype if hasattr(num_seqs, "dtype")
           else np.asarray(num_seqs).dtype)
  if not jnp.issubdtype(dtype, jnp.integer):
    _fail("num_seqs", "must be an integer", f"dtype {jnp.dtype(dtype).name}")


def static_validate(call, q, indexer_weights, cache, seq_lens, page_indices,
                    cu_q_lens, last, *, formats=None):
  """The static rules of a `TopkCall` (`last`: distribution) or `PageCall`
  (`last`: num_seqs) on arrays, tracers or `ShapeDtypeStruct`s, the cache
  in one of `formats` (the kernel's `CACHE_FORMATS`; None: any); raises
  ValueError naming the argument."""
  if isinstance(cache, (tuple, list)) and len(cache) == 1:
    cache = cache[0]
  if not call.has_blocks:
    raise ValueError("num_kv_pages_per_block and num_queries_per_block must "
                     "be specified.")
  page_size, pages_per_seq = _check_common(
      q, indexer_weights, cache, seq_lens, page_indices, cu_q_lens,
      inline=formats is None or "inline_fp8" in formats)
  _check_format(cache, formats)
  if call.mode == "page":
    _check_num_seqs(last)
    if call.k > pages_per_seq:
      _fail("k_pages", f"must be <= pages_per_seq ({pages_per_seq}), the "
            "page-table columns per sequence", call.k)
    _check_block_arithmetic(page_size, pages_per_seq, 128)
    # A KV block's scores and (MXFP4) values: streamidx.blocks' bounds.
    blocks.check_page_rows(call.num_queries_per_block, q.shape[1], page_size)
    fmt = ("mxfp4" if cache_lib.is_mxfp4(cache) else
           "fp8" if not isinstance(cache, (tuple, list))
           and cache.dtype == jnp.uint8 else None)
    if fmt:
      blocks.check_page_kv_block(fmt, page_size, q.shape[2],
                                 modes.current_generation())
    return
  _check_distribution(last)
  cases = list(zip(semantics.CASES, call.num_kv_pages_per_block))
  for case, bkv_p in cases:  # every case's tiles before any int32 limit
    if (page_size * bkv_p) % semantics.LANES:
      _fail("num_kv_pages_per_block",
            f"page_size * num_kv_pages_per_block must be a multiple of 128 "
            f"(TPU DMA tiles) for the {case} case",
            f"{page_size} * {bkv_p} = {page_size * bkv_p}")
  for case, bkv_p in cases:
    _check_block_arithmetic(page_size, pages_per_seq, bkv_p, case)


# ---------------------------------------------------------------------------
# Value rules: written once in traceable JAX, evaluated eagerly (layer 2) or
# under checkify (layer 3).


class ValueRule(NamedTuple):
  """One value rule: its argument, the rule, and what was found (`got`, a
  template of the first offending element's values)."""

  argument: str
  rule: str
  got: str

  # The message as a `str.format` (and `checkify.check`) template.
  template = property(lambda self: f"{self.argument}: {self.rule} (got "
                      f"{self.got})")

  def message(self, **values) -> str:
    return self.template.format(**values)


VALUE_RULES: dict[str, ValueRule] = {
    "distribution_order": ValueRule(
        "distribution",
        "must be ordered 0 <= i <= j <= n <= max_num_seqs "
        "({max_num_seqs})",
        "(i, j, n) = ({i}, {j}, {n})"),
    "num_seqs_range": ValueRule(
        "num_seqs", "must be in [0, max_num_seqs] = [0, {max_num_seqs}]",
        "{n}"),
    "cu_q_lens_start": ValueRule(
        "cu_q_lens", "must start at 0", "cu_q_lens[0] = {v}"),
    "cu_q_lens_order": ValueRule(
        "cu_q_lens",
        "must be non-decreasing over its whole length (query lengths are "
        ">= 0; slots past the n sequences repeat cu_q_lens[n])",
        "cu_q_lens[{b}] = {lo} > cu_q_lens[{b1}] = {hi}"),
    "cu_q_lens_fit": ValueRule(
        "cu_q_lens",
        "the n sequences' query rows must fit in q's max_num_tokens ({t})",
        "cu_q_lens[n = {n}] = {v}"),
    "seq_lens_nonnegative": ValueRule(
        "seq_lens", "must be >= 0 for each of the n sequences",
        "seq_lens[{b}] = {s}"),
    "q_len_le_seq_len": ValueRule(
        "seq_lens",
        "each sequence's q_len (cu_q_lens[b + 1] - cu_q_lens[b]) must be <= "
        "its seq_len: its queries are its last q_len tokens",
        "sequence {b}: q_len {q} > seq_len {s}"),
    "decode_q_len": ValueRule(
        "cu_q_lens / distribution",
        "every sequence of the decode range [0, i) must have exactly "
        "decode_q_len = {dq} query rows (cu_q_lens[b + 1] - cu_q_lens[b]; "
        "decode_q_len > 1 is gamma + 1 under speculative decoding)",
        "i = {i}, sequence {b} has q_len {q}"),
    "page_table_columns": ValueRule(
        "page_indices",
        "too few page-table columns: every sequence needs pages_per_seq "
        "({p}) >= ceil((seq_len // compression_ratio) / page_size)",
        "sequence {b}: seq_len {s} -> {e} entries -> {need} pages of {ps}"),
    "page_index_range": ValueRule(
        "page_indices",
        "every slot must name a page of cache_kv, in [0, total_num_pages = "
        "{pages}) (the kernel silently clamps indices past the cache to the "
        "last page and prefetches unused slots too)",
        "page_indices[{x}] = {v}"),
    "q_finite": ValueRule(
        "q", "must be finite on the query rows of the n sequences",
        "a NaN or inf in row {t}"),
    "indexer_weights_finite": ValueRule(
        "indexer_weights",
        "must be finite on the query rows of the n sequences",
        "a NaN or inf in row {t}"),
    "cache_values_finite": ValueRule(
        "cache_kv",
        "every key value the kernel reads (the first padded_head_dim = "
        "{padded} of each record) must be finite for the entries a query "
        "sees (entry < seq_len // compression_ratio of a sequence with "
        "queries): an e4m3 NaN byte (0x7f, 0xff) or a bf16 NaN/inf (MXFP4's "
        "e2m1 codes are all finite) makes the "
        "score NaN, and NaN ranks first; the dense FP8 pair stores +0 for -0 "
        "(no byte 0x80: the lean kernel reads it as e4m3b11fnuz on v5e/v6e, "
        "where 0x80 is NaN; `streamidx.pack_dense_fp8_cache` never writes it)",
        "sequence {b}, entry {s} (physical page {page}, slot {slot})"),
    "cache_scale_range": ValueRule(
        "cache_kv",
        "every FP8 record (MXFP4: 32-value group) a query sees needs an "
        "e8m0 scale byte in [1, 254] "
        "(2**-126 .. 2**127): byte 0 (2**-127) is subnormal in float32 and "
        "is flushed to zero where the kernel applies it, byte 255 is NaN",
        "sequence {b}, entry {s} (physical page {page}, slot {slot}): scale "
        "byte {v}"),
    "dot_range": ValueRule(
        "q",
        f"each head's dot product with a key it sees must stay below "
        f"2**{SCORE_LOG2_LIMIT} (half the float32 maximum): the check bounds "
        "|q[t, h] . k[s]| by ||q[t, h]||_1 * max_d |k[s, d]| (stored key "
        "values); past it the dot can overflow to inf, and inf times a "
        "weight of 0 is NaN",
        "row {t} (sequence {b}): bound up to 2**{e}"),
    "score_range": ValueRule(
        "indexer_weights",
        f"each score must stay below 2**{SCORE_LOG2_LIMIT} (half the float32 "
        "maximum), before and after the FP8 scale: the check bounds it by "
        "sum_h |w[t, h]| * ||q[t, h]||_1 * max_d |k[s, d]| (times the "
        "record's scale)",
        "row {t} (sequence {b}): bound up to 2**{e}"),
}

_COMMON_RULES = ("cu_q_lens_start", "cu_q_lens_order", "cu_q_lens_fit",
                 "seq_lens_nonnegative", "q_len_le_seq_len")
_TABLE_RULES = ("page_table_columns", "page_index_range", "q_finite",
                "indexer_weights_finite", "cache_values_finite",
                "cache_scale_range", "dot_range", "score_range")
# The value rules each kernel's inputs must satisfy, in the order checked.
TOPK_VALUE_RULES = (("distribution_order",) + _COMMON_RULES
                    + ("decode_q_len",) + _TABLE_RULES)
PAGE_TOPK_VALUE_RULES = ("num_seqs_range",) + _COMMON_RULES + _TABLE_RULES


def _first(bad):
  """(any bad, index of the first bad element) of a bool vector."""
  return jnp.any(bad), jnp.argmax(bad).astype(jnp.int32)


def _log2_l1(x, axis):
  """log2 of sum |x| over `axis`, without overflow: max * sum(|x| / max)."""
  a = jnp.abs(x.astype(jnp.float32))
  m = jnp.max(a, axis=axis, keepdims=True)
  safe = jnp.where(m > 0, m, 1.0)
  l1 = jnp.log2(jnp.squeeze(m, axis)) + jnp.log2(jnp.sum(a / safe, axis=axis))
  return jnp.where(jnp.squeeze(m, axis) > 0, l1, -jnp.inf)


def _log2_sum_exp2(logs, axis):
  """log2(sum 2**logs) over `axis`, stable; -inf when every term is -inf."""
  m = jnp.max(logs, axis=axis, keepdims=True)
  safe = jnp.where(jnp.isfinite(m), m, 0.0)
  out = jnp.squeeze(safe, axis) + jnp.log2(
      jnp.sum(jnp.exp2(logs - safe), axis=axis))
  return jnp.where(jnp.isneginf(jnp.squeeze(m, axis)), -jnp.inf, out)


def _entry_stats(cache_kv, head_dim):
  """Per cache entry, [total_num_pages, page_size] each: (a value lane the
  kernel reads is NaN/inf, the scale byte (127 for bf16), log2 max |stored
  value| (NaN lanes ignored), log2 of the scale)."""
  padded = cache_lib.padded_head_dim(head_dim)
  if cache_lib.is_mxfp4(cache_kv):  # no NaN codes; the worst group's byte
    codes, e = cache_lib.unpack_mxfp4_cache(cache_kv)
    byte = e + cache_lib.E8M0_BIAS
    keys = jnp.abs(cache_lib.dequantize_mxfp4(codes, jnp.clip(e, -127, 127)))
    # The kernel forms q . (64 * code value) before the 2**e (fp4.py).
    log2_max = jnp.maximum(jnp.log2(jnp.max(keys, axis=-1)), np.log2(384.0))
    return (jnp.zeros(byte.shape[:2], bool),
            jnp.where(jnp.any(byte == 0, axis=-1), 0, jnp.max(byte, axis=-1)),
            log2_max, jnp.zeros(byte.shape[:2], jnp.float32))
  if cache_lib.is_inline(cache_kv):  # the same bytes as its pair
    cache_kv = cache_lib.inline_to_pair(cache_kv)
  dense = isinstance(cache_kv, (tuple, list))  # the dense FP8 pair
  arr = cache_kv[0] if dense else cache_kv
  pages, rows, packing, lkv = arr.shape
  flat = arr.reshape(pages, rows * packing, lkv)
  if jnp.dtype(arr.dtype) == jnp.dtype(jnp.uint8):
    read = flat[..., :padded]
    bad_value = jnp.any(((read & 0x7F) == 0x7F)
                        | (dense & (read == cache_lib.NEG_ZERO_BYTE)), axis=-1)
    scale_byte = (cache_lib.entry_scale_bytes(cache_kv[1], rows * packing)
                  if dense else flat[..., padded]).astype(jnp.int32)
  else:
    read = flat[..., :padded].astype(jnp.float32)
    bad_value = ~jnp.all(jnp.isfinite(read), axis=-1)
    scale_byte = jnp.full(flat.shape[:2], cache_lib.E8M0_BIAS, jnp.int32)
  values, _ = cache_lib.unpack_cache_raw(cache_kv, head_dim)  # e4m3 or bf16
  v = jnp.abs(values.astype(jnp.float32))
  v = jnp.where(jnp.isfinite(v), v, 0.0)
  log2_max_abs = jnp.log2(jnp.max(v, axis=-1))
  log2_scale = (scale_byte - cache_lib.E8M0_BIAS).astype(jnp.float32)
  return bad_value, scale_byte, log2_max_abs, log2_scale


def _log2_report(x):
  """ceil(x) as int32 for a message; NaN/inf become 0 / +-2**30."""
  x = jnp.nan_to_num(x, nan=0.0, posinf=2.0**30, neginf=-2.0**30)
  return jnp.ceil(x).astype(jnp.int32)


def _value_rules(q, indexer_weights, cache_kv, seq_lens, page_indices,
                 cu_q_lens, count, *, compression_ratio: int, page_mode: bool,
                 decode_q_len: int = 1):
  """The mode's value rules, traceable: {rule id: (ok bool[], {placeholder:
  i32[]})}. count: `distribution` i32[3] (token) or `num_seqs` i32[] (page)."""
  i32 = lambda x: jnp.asarray(x, jnp.int32)
  num_tokens = q.shape[0]
  max_num_seqs = seq_lens.shape[0]
  total_num_pages, page_size, pages_per_seq = cache_lib.page_geometry(
      cache_kv, seq_lens, page_indices)
  seq_lens = i32(seq_lens)
  cu_q_lens = i32(cu_q_lens)
  page_indices = i32(page_indices)
  out: dict[str, Any] = {}

  if page_mode:
    n_raw = i32(count).reshape(())
    out["num_seqs_range"] = (
        (n_raw >= 0) & (n_raw <= max_num_seqs),
        dict(n=n_raw, max_num_seqs=i32(max_num_seqs)))
    num_decode = i32(0)
  else:
    d = i32(count)
    i, j, n_raw = d[0], d[1], d[2]
    out["distribution_order"] = (
        (0 <= i) & (i <= j) & (j <= n_raw) & (n_raw <= max_num_seqs),
        dict(i=i, j=j, n=n_raw, max_num_seqs=i32(max_num_seqs)))
    num_decode = jnp.clip(i, 0, max_num_seqs)
  n = jnp.clip(n_raw, 0, max_num_seqs)
  seq_ids = jnp.arange(max_num_seqs, dtype=jnp.int32)
  live_seq = seq_ids < n

  out["cu_q_lens_start"] = (cu_q_lens[0] == 0, dict(v=cu_q_lens[0]))
  ok, b = _first(cu_q_lens[1:] < cu_q_lens[:-1])
  out["cu_q_lens_order"] = (~ok, dict(b=b, b1=b + 1, lo=cu_q_lens[b],
                                      hi=cu_q_lens[b + 1]))
  end = cu_q_lens[n]
  out["cu_q_lens_fit"] = (end <= num_tokens,
                          dict(n=n, v=end, t=i32(num_tokens)))

  ok, b = _first(live_seq & (seq_lens < 0))
  out["seq_lens_nonnegative"] = (~ok, dict(b=b, s=seq_lens[b]))
  q_lens = cu_q_lens[1:] - cu_q_lens[:-1]
  ok, b = _first(live_seq & (q_lens > seq_lens))
  out["q_len_le_seq_len"] = (~ok, dict(b=b, q=q_lens[b], s=seq_lens[b]))
  if not page_mode:
    ok, b = _first((seq_ids < num_decode) & (q_lens != decode_q_len))
    out["decode_q_len"] = (~ok, dict(i=num_decode, b=b, q=q_lens[b],
                                     dq=i32(decode_q_len)))

  entries = jnp.maximum(seq_lens, 0) // compression_ratio
  # ceil(entries / page_size) without (entries + page_size - 1), which
  # overflows int32 for entries near 2**31.
  need = entries // page_size + (entries % page_size > 0).astype(jnp.int32)
  ok, b = _first(live_seq & (need > pages_per_seq))
  out["page_table_columns"] = (
      ~ok, dict(b=b, s=seq_lens[b], e=entries[b], need=need[b],
                ps=i32(page_size), p=i32(pages_per_seq)))
  ok, x = _first((page_indices < 0) | (page_indices >= total_num_pages))
  out["page_index_range"] = (~ok, dict(x=x, v=page_indices[x],
                                       pages=i32(total_num_pages)))

  live_row = jnp.arange(num_tokens, dtype=jnp.int32) < end
  q_bad = ~jnp.all(jnp.isfinite(q), axis=(1, 2))
  ok, t = _first(live_row & q_bad)
  out["q_finite"] = (~ok, dict(t=t))
  w_bad = ~jnp.all(jnp.isfinite(indexer_weights), axis=1)
  ok, t = _first(live_row & w_bad)
  out["indexer_weights_finite"] = (~ok, dict(t=t))

  # Numeric range: the keys each sequence's queries see (entries below its
  # seq_len // compression_ratio, read when it has queries; the last query,
  # at seq_len - 1, sees all of them), against its query rows.
  head_dim = q.shape[2]
  bad_value, scale_byte, log2_v, log2_scale = _entry_stats(cache_kv, head_dim)
  phys = jnp.clip(page_indices, 0, total_num_pages - 1).reshape(
      max_num_seqs, pages_per_seq)
  num_entries = pages_per_seq * page_size
  col = jnp.arange(num_entries, dtype=jnp.int32)
  seq_phys = phys[:, col // page_size]  # [S, E]
  slot = col % page_size
  seen = (live_seq & (q_lens > 0))[:, None] & (col[None, :] < entries[:, None])
  at = lambda a: a[seq_phys, slot[None, :]]  # [pages, page_size] -> [S, E]

  def first_entry(bad):
    ok, x = _first(bad.reshape(-1))
    b, e = x // num_entries, x % num_entries
    return ok, dict(b=b, s=e, page=seq_phys[b, e], slot=e % page_size)

  ok, where = first_entry(seen & at(bad_value))
  out["cache_values_finite"] = (~ok, dict(
      where, padded=i32(cache_lib.padded_head_dim(head_dim))))
  byte = at(scale_byte)
  ok, where = first_entry(seen & ((byte < 1) | (byte > 254)))
  out["cache_scale_range"] = (~ok, dict(where, v=byte[where["b"], where["s"]]))

  # Per sequence, the largest stored key value and the largest scaled one
  # (log2); per query row, its heads' L1 norms and the weighted sum of them.
  log2_v_seq = jnp.max(jnp.where(seen, at(log2_v), -jnp.inf), axis=1)
  log2_vs_seq = jnp.max(jnp.where(seen, at(log2_v + log2_scale), -jnp.inf),
                        axis=1)
  log2_q = _log2_l1(q, axis=2)  # [T, H]
  log2_dot_row = jnp.max(log2_q, axis=1)
  log2_w = jnp.log2(jnp.abs(indexer_weights.astype(jnp.float32)))  # -inf at 0
  log2_sum_row = _log2_sum_exp2(log2_w + log2_q, axis=1)
  row_seq = jnp.clip(
      jnp.searchsorted(cu_q_lens[1:], jnp.arange(num_tokens, dtype=jnp.int32),
                       side="right").astype(jnp.int32), 0, max_num_seqs - 1)
  dot = log2_dot_row + log2_v_seq[row_seq]
  score = jnp.maximum(log2_sum_row + log2_v_seq[row_seq],
                      log2_sum_row + log2_vs_seq[row_seq])
  # `~(x < limit)` would flag NaN; NaN inputs are the finiteness rules' job.
  ok, t = _first(live_row & (dot >= SCORE_LOG2_LIMIT))
  out["dot_range"] = (~ok, dict(t=t, b=row_seq[t], e=_log2_report(dot[t])))
  ok, t = _first(live_row & (score >= SCORE_LOG2_LIMIT))
  out["score_range"] = (~ok, dict(t=t, b=row_seq[t], e=_log2_report(score[t])))
  return out


_evaluate_value_rules = jax.jit(
    _value_rules, static_argnames=("compression_ratio", "page_mode",
                                   "decode_q_len"))


def _rules(call, evaluate, q, indexer_weights, cache, seq_lens, page_indices,
           cu_q_lens, last):
  """(`evaluate`'s results of the call's value rules, their order)."""
  if isinstance(cache, (tuple, list)) and len(cache) == 1:
    cache = cache[0]
  page_mode = call.mode == "page"
  last = (jnp.asarray(last, jnp.int32) if page_mode
          else distribution_array(last))
  results = evaluate(q, indexer_weights, cache, seq_lens, page_indices,
                     cu_q_lens, last, compression_ratio=call.compression_ratio,
                     page_mode=page_mode, decode_q_len=call.decode_q_len)
  return results, PAGE_TOPK_VALUE_RULES if page_mode else TOPK_VALUE_RULES


def validate_inputs(call, q, indexer_weights, cache, seq_lens, page_indices,
                    cu_q_lens, last, *, formats=None):
  """`static_validate`, then the mode's value rules in order on concrete
  inputs (not inside `jit`); the first broken rule raises ValueError."""
  static_validate(call, q, indexer_weights, cache, seq_lens, page_indices,
                  cu_q_lens, last, formats=formats)
  results, order = _rules(call, _evaluate_value_rules, q, indexer_weights,
                          cache, seq_lens, page_indices, cu_q_lens, last)
  results = jax.device_get(results)
  for rule_id in order:
    ok, values = results[rule_id]
    if not bool(ok):
      raise ValueError(VALUE_RULES[rule_id].message(
          **{k: int(v) for k, v in values.items()}))


def check_inputs(q, indexer_weights, cache, seq_lens, page_indices,
                 cu_q_lens, last, *, call):
  """`checkify.check`s of the mode's value rules (not the static ones);
  returns bool[]: all hold."""
  results, order = _rules(call, _value_rules, q, indexer_weights, cache,
                          seq_lens, page_indices, cu_q_lens, last)
  for rule_id in order:
    ok, values = results[rule_id]
    checkify.check(ok, VALUE_RULES[rule_id].template, **values)
  return jnp.all(jnp.stack([results[rule_id][0] for rule_id in order]))
