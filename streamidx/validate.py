"""Input checks for the StreamIndex kernels.

Static checks (shapes, ranks, dtypes, block sizes, static options) run at
trace time inside `streamidx.streamindex_topk` / `streamindex_page_topk`,
before any kernel is built, and raise `ValueError` naming the argument and
the rule it breaks. They read only shapes and dtypes, so they work on
tracers and `jax.ShapeDtypeStruct`s.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from streamidx.kernel import CAUSAL_RULES

__all__ = [
    "static_validate_topk",
    "static_validate_page_topk",
    "KERNEL_QUERY_DTYPES",
    "KERNEL_CACHE_DTYPES",
]

KERNEL_QUERY_DTYPES = (jnp.bfloat16, jnp.float32)
KERNEL_CACHE_DTYPES = (jnp.uint8, jnp.bfloat16)
_INDEX_DTYPE = jnp.int32


def _fail(name: str, rule: str, got) -> None:
  raise ValueError(f"{name}: {rule} (got {got})")


def _dtype_name(x) -> str:
  return jnp.dtype(x.dtype).name


def _check_rank(name, x, rank, layout):
  if len(x.shape) != rank:
    _fail(name, f"must have rank {rank}, {layout}", f"shape {tuple(x.shape)}")


def _check_index_array(name, x, layout):
  _check_rank(name, x, 1, layout)
  if jnp.dtype(x.dtype) != jnp.dtype(_INDEX_DTYPE):
    _fail(name, "must be int32", _dtype_name(x))


def _is_int(v) -> bool:
  return isinstance(v, (int, np.integer)) and not isinstance(v, bool)


def _check_positive_int(name, v):
  if not _is_int(v) or v <= 0:
    _fail(name, "must be a positive int", repr(v))


def _per_case(name, v):
  """An int or a (decode, prefill, mixed) triple of positive ints."""
  if _is_int(v):
    _check_positive_int(name, v)
    return [int(v)] * 3
  if isinstance(v, (tuple, list)) and len(v) == 3:
    for i, x in enumerate(v):
      _check_positive_int(f"{name}[{i}]", x)
    return [int(x) for x in v]
  _fail(name, "must be a positive int or a (decode, prefill, mixed) tuple of"
        " three positive ints", repr(v))


def _check_common(q, indexer_weights, cache_kv, seq_lens, page_indices,
                  cu_q_lens, causal_rule):
  _check_rank("q", q, 3, "[max_num_tokens, num_q_heads, head_dim]")
  if jnp.dtype(q.dtype) not in [jnp.dtype(d) for d in KERNEL_QUERY_DTYPES]:
    _fail("q", "dtype must be bfloat16 or float32", _dtype_name(q))
  num_tokens, num_heads, head_dim = q.shape
  if num_tokens < 1 or num_heads < 1:
    _fail("q", "needs at least one token row and one head",
          f"shape {tuple(q.shape)}")
  if head_dim < 1 or head_dim % 128:
    _fail("q", "head_dim (last axis) must be a positive multiple of 128",
          head_dim)

  _check_rank("indexer_weights", indexer_weights, 2,
              "[max_num_tokens, num_q_heads]")
  if not jnp.issubdtype(indexer_weights.dtype, jnp.floating):
    _fail("indexer_weights", "must be floating point",
          _dtype_name(indexer_weights))
  if tuple(indexer_weights.shape) != (num_tokens, num_heads):
    _fail("indexer_weights",
          f"shape must be q's [max_num_tokens, num_q_heads] = "
          f"{(num_tokens, num_heads)}", tuple(indexer_weights.shape))

  _check_rank("cache_kv", cache_kv, 4,
              "[total_num_pages, page_size_per_kv_packing, kv_packing, "
              "lkv_dim]")
  cdt = jnp.dtype(cache_kv.dtype)
  if cdt not in [jnp.dtype(d) for d in KERNEL_CACHE_DTYPES]:
    _fail("cache_kv", "dtype must be uint8 (packed FP8) or bfloat16",
          cdt.name)
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
  if cdt == jnp.dtype(jnp.uint8) and lkv < head_dim + 1:
    _fail("cache_kv", f"an FP8 record needs head_dim + 1 = {head_dim + 1} "
          "bytes (values and the e8m0 scale)", f"lkv_dim {lkv}")
  if cdt == jnp.dtype(jnp.bfloat16) and lkv < head_dim:
    _fail("cache_kv", f"a bf16 record needs head_dim = {head_dim} values",
          f"lkv_dim {lkv}")

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
  if causal_rule not in CAUSAL_RULES:
    _fail("causal_rule", f"must be one of {CAUSAL_RULES}", repr(causal_rule))
  page_size = rows * packing
  pages_per_seq = page_indices.shape[0] // max_num_seqs
  return page_size, pages_per_seq


def static_validate_topk(q, indexer_weights, cache_kv, seq_lens, page_indices,
                         cu_q_lens, distribution, *, k, compression_ratio,
                         num_kv_pages_per_block, num_queries_per_block,
                         vmem_limit_bytes, decode_req_batch_size,
                         causal_rule):
  """Static rules of `streamindex_topk`; raises ValueError naming the argument."""
  page_size, _ = _check_common(q, indexer_weights, cache_kv, seq_lens,
                               page_indices, cu_q_lens, causal_rule)
  _check_index_array("distribution", distribution, "[3] = (i, j, n)")
  if distribution.shape[0] != 3:
    _fail("distribution", "must have length 3: (i, j, n)",
          f"length {distribution.shape[0]}")
  _check_positive_int("k", k)
  _check_positive_int("compression_ratio", compression_ratio)
  _check_positive_int("decode_req_batch_size", decode_req_batch_size)
  _check_positive_int("vmem_limit_bytes", vmem_limit_bytes)
  kv_blocks = _per_case("num_kv_pages_per_block", num_kv_pages_per_block)
  _per_case("num_queries_per_block", num_queries_per_block)
  for case, bkv_p in zip(("decode", "prefill", "mixed"), kv_blocks):
    if (page_size * bkv_p) % 128:
      _fail("num_kv_pages_per_block",
            f"page_size * num_kv_pages_per_block must be a multiple of 128 "
            f"(TPU DMA tiles) for the {case} case",
            f"{page_size} * {bkv_p} = {page_size * bkv_p}")


def static_validate_page_topk(q, indexer_weights, cache_kv, seq_lens,
                              page_indices, cu_q_lens, num_seqs, *, k_pages,
                              compression_ratio, num_kv_pages_per_block,
                              num_queries_per_block, vmem_limit_bytes,
                              causal_rule):
  """Static rules of `streamindex_page_topk`; raises ValueError."""
  _, pages_per_seq = _check_common(q, indexer_weights, cache_kv, seq_lens,
                                   page_indices, cu_q_lens, causal_rule)
  if len(getattr(num_seqs, "shape", ())) != 0:
    _fail("num_seqs", "must be a scalar", f"shape {tuple(num_seqs.shape)}")
  if not jnp.issubdtype(jnp.asarray(num_seqs).dtype if not hasattr(
      num_seqs, "dtype") else num_seqs.dtype, jnp.integer):
    _fail("num_seqs", "must be an integer", repr(num_seqs))
  _check_positive_int("k_pages", k_pages)
  if k_pages > pages_per_seq:
    _fail("k_pages", f"must be <= pages_per_seq ({pages_per_seq}), the "
          "page-table columns per sequence", k_pages)
  _check_positive_int("compression_ratio", compression_ratio)
  if compression_ratio != 1:
    _fail("compression_ratio", "page mode supports compression_ratio == 1 "
          "only (GLM); use streamindex_page_topk_ref for other ratios",
          compression_ratio)
  if num_kv_pages_per_block != 128:
    _fail("num_kv_pages_per_block", "page mode requires exactly 128 (one "
          "lane row of pooled pages per block)", repr(num_kv_pages_per_block))
  _check_positive_int("num_queries_per_block", num_queries_per_block)
  if vmem_limit_bytes is not None:
    _check_positive_int("vmem_limit_bytes", vmem_limit_bytes)
