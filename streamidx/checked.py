"""The kernels behind their value rules, usable inside `jit` (checkify).

`checked_streamindex_topk` / `checked_streamindex_page_topk` take the kernels'
arguments and return `(err, indices)`: the value rules of
`streamidx.validate.VALUE_RULES` run first (as `checkify.check`s), and when
one fails the kernel is not launched (`lax.cond`), the indices are all -1 and
`err.throw()` raises the rule's message. The static rules raise `ValueError`
at trace time, as the kernels' own do.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import checkify

from streamidx import topk as topk_lib
from streamidx import modes
from streamidx.kernels import dense as dense_lib
from streamidx.kernels import vendored as kernel_lib
from streamidx.semantics import DEFAULT_VMEM_LIMIT_BYTES
from streamidx.validate import (check_page_topk_inputs, check_topk_inputs,
                                distribution_array,
                                static_validate_page_topk,
                                static_validate_topk)

__all__ = ["checked_streamindex_topk", "checked_streamindex_page_topk",
           "checked_streamindex_topk_dense",
           "checked_streamindex_page_topk_dense"]

_TOPK_STATIC = ("k", "compression_ratio", "num_kv_pages_per_block",
                "num_queries_per_block", "vmem_limit_bytes",
                "decode_req_batch_size", "causal_rule", "topk_method",
                "sort_decode")
_PAGE_TOPK_STATIC = ("k_pages", "compression_ratio", "num_kv_pages_per_block",
                     "num_queries_per_block", "vmem_limit_bytes",
                     "causal_rule")


@modes.blocking_when_interpreted
@functools.partial(jax.jit, static_argnames=_TOPK_STATIC)
def checked_streamindex_topk(
    q, indexer_weights, cache_kv, seq_lens, page_indices, cu_q_lens,
    distribution, *, k, compression_ratio, num_kv_pages_per_block,
    num_queries_per_block,
    vmem_limit_bytes=DEFAULT_VMEM_LIMIT_BYTES,
    decode_req_batch_size=4, causal_rule="model",
    topk_method=topk_lib.DEFAULT_TOPK_METHOD, sort_decode=True):
  """`streamindex_topk` behind its value rules, usable inside `jit`.

  Same arguments as `streamidx.streamindex_topk`. Static rules raise
  `ValueError` at trace time, as the kernel's do.

  Returns:
    (err, indices): `err` a `checkify.Error`; `err.throw()` raises
    `checkify.JaxRuntimeError` (a ValueError) with the first broken rule's
    message, `err.get()` returns it (None when all hold). `indices`
    i32[max_num_tokens, k] as the kernel's when every rule holds; all -1
    when one fails (the kernel is not launched then: `lax.cond`).
  """
  static = dict(k=k, compression_ratio=compression_ratio,
                num_kv_pages_per_block=num_kv_pages_per_block,
                num_queries_per_block=num_queries_per_block,
                vmem_limit_bytes=vmem_limit_bytes,
                decode_req_batch_size=decode_req_batch_size,
                causal_rule=causal_rule, topk_method=topk_method,
                sort_decode=sort_decode)
  static_validate_topk(q, indexer_weights, cache_kv, seq_lens, page_indices,
                       cu_q_lens, distribution, **static)
  args = (q, indexer_weights, cache_kv, seq_lens, page_indices, cu_q_lens,
          distribution_array(distribution))  # a tuple too
  checks = functools.partial(check_topk_inputs,
                             compression_ratio=compression_ratio)
  err, ok = checkify.checkify(checks, errors=checkify.user_checks)(*args)
  indices = lax.cond(
      ok, lambda a: kernel_lib.streamindex_topk(*a, **static),
      lambda a: jnp.full((q.shape[0], k), -1, jnp.int32), args)
  return err, indices


@modes.blocking_when_interpreted
@functools.partial(jax.jit, static_argnames=_PAGE_TOPK_STATIC)
def checked_streamindex_page_topk(
    q, indexer_weights, cache_kv, seq_lens, page_indices, cu_q_lens,
    num_seqs, *, k_pages, compression_ratio=1, num_kv_pages_per_block=128,
    num_queries_per_block=512, vmem_limit_bytes=64 * 1024 * 1024,
    causal_rule="model"):
  """`streamindex_page_topk` behind its value rules, usable inside `jit`.

  Returns (err, indices) as `checked_streamindex_topk` does; indices
  i32[max_num_tokens, k_pages].
  """
  static = dict(k_pages=k_pages, compression_ratio=compression_ratio,
                num_kv_pages_per_block=num_kv_pages_per_block,
                num_queries_per_block=num_queries_per_block,
                vmem_limit_bytes=vmem_limit_bytes, causal_rule=causal_rule)
  num_seqs = jnp.asarray(num_seqs)
  args = (q, indexer_weights, cache_kv, seq_lens, page_indices, cu_q_lens,
          num_seqs)
  static_validate_page_topk(*args, **static)
  err, ok = checkify.checkify(check_page_topk_inputs,
                              errors=checkify.user_checks)(*args)
  indices = lax.cond(
      ok, lambda a: kernel_lib.streamindex_page_topk(*a, **static),
      lambda a: jnp.full((q.shape[0], k_pages), -1, jnp.int32), args)
  return err, indices


@modes.blocking_when_interpreted
@functools.partial(jax.jit, static_argnames=_TOPK_STATIC + ("num_cores",))
def checked_streamindex_topk_dense(
    q, indexer_weights, cache_values, cache_scales, seq_lens, page_indices,
    cu_q_lens, distribution, *, k, compression_ratio, num_kv_pages_per_block,
    num_queries_per_block, vmem_limit_bytes=DEFAULT_VMEM_LIMIT_BYTES,
    decode_req_batch_size=4, causal_rule="model",
    topk_method=topk_lib.DEFAULT_TOPK_METHOD, sort_decode=True, num_cores=1):
  """`streamindex_topk_dense` behind its value rules, usable inside `jit`.

  Same arguments as `streamidx.streamindex_topk_dense`; returns (err,
  indices) as `checked_streamindex_topk` does.
  """
  static = dict(k=k, compression_ratio=compression_ratio,
                num_kv_pages_per_block=num_kv_pages_per_block,
                num_queries_per_block=num_queries_per_block,
                vmem_limit_bytes=vmem_limit_bytes,
                decode_req_batch_size=decode_req_batch_size,
                causal_rule=causal_rule, topk_method=topk_method,
                sort_decode=sort_decode)
  cache = (cache_values, cache_scales)
  static_validate_topk(q, indexer_weights, cache, seq_lens, page_indices,
                       cu_q_lens, distribution, **static)
  rest = (seq_lens, page_indices, cu_q_lens,
          distribution_array(distribution))  # a tuple too
  checks = functools.partial(check_topk_inputs,
                             compression_ratio=compression_ratio)
  err, ok = checkify.checkify(checks, errors=checkify.user_checks)(
      q, indexer_weights, cache, *rest)
  args = (q, indexer_weights, cache_values, cache_scales) + rest
  indices = lax.cond(
      ok, lambda a: dense_lib.streamindex_topk_dense(
          *a, num_cores=num_cores, **static),
      lambda a: jnp.full((q.shape[0], k), -1, jnp.int32), args)
  return err, indices


@modes.blocking_when_interpreted
@functools.partial(jax.jit,
                   static_argnames=_PAGE_TOPK_STATIC + ("num_cores",))
def checked_streamindex_page_topk_dense(
    q, indexer_weights, cache_values, cache_scales, seq_lens, page_indices,
    cu_q_lens, num_seqs, *, k_pages, compression_ratio=1,
    num_kv_pages_per_block=128, num_queries_per_block=512,
    vmem_limit_bytes=64 * 1024 * 1024, causal_rule="model", num_cores=1):
  """`streamindex_page_topk_dense` behind its value rules (err, indices)."""
  static = dict(k_pages=k_pages, compression_ratio=compression_ratio,
                num_kv_pages_per_block=num_kv_pages_per_block,
                num_queries_per_block=num_queries_per_block,
                vmem_limit_bytes=vmem_limit_bytes, causal_rule=causal_rule)
  cache = (cache_values, cache_scales)
  rest = (seq_lens, page_indices, cu_q_lens, jnp.asarray(num_seqs))
  static_validate_page_topk(q, indexer_weights, cache, *rest, **static)
  err, ok = checkify.checkify(check_page_topk_inputs,
                              errors=checkify.user_checks)(
                                  q, indexer_weights, cache, *rest)
  args = (q, indexer_weights, cache_values, cache_scales) + rest
  indices = lax.cond(
      ok, lambda a: dense_lib.streamindex_page_topk_dense(
          *a, num_cores=num_cores, **static),
      lambda a: jnp.full((q.shape[0], k_pages), -1, jnp.int32), args)
  return err, indices
