"""The top-k stage: indices of the k largest masked scores of each row.

Every token kernel (and its reference) ends with `select_topk(scores, k,
method)` over its f32[T, N] score buffer. The methods are `base.Method`
records in a registry (`registry.METHODS`), one module each; `TOPK_METHODS`
lists them (docs/topk-methods.md). The output contract and tie rule:
`streamidx.topk.base`; each chip's default: `streamidx.topk.defaults`.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from streamidx.topk import base, defaults, registry
from streamidx.topk.approx import APPROX_RECALL_TARGET
from streamidx.topk.base import canonical_zero, order_key, scores_at
from streamidx.topk.blockmax import block_size_for
from streamidx.topk.chunked import chunk_size_for
from streamidx.topk.defaults import VENDORED_TOPK_METHOD, default_method
from streamidx.topk.fused_blockmax import (FUSED_BLOCK_WIDTH,
                                           fused_block_size_for)
from streamidx.topk.radix import RADIX_BITS
from streamidx.topk.registry import (EXACT_TOPK_METHODS, FUSED_TOPK_METHODS,
                                     KERNEL_TOPK_METHODS, METHODS,
                                     TOPK_METHODS, check_topk_method, get)

__all__ = [
    "TOPK_METHODS", "EXACT_TOPK_METHODS", "FUSED_TOPK_METHODS",
    "KERNEL_TOPK_METHODS", "FUSED_BLOCK_WIDTH",
    "VENDORED_TOPK_METHOD", "default_method", "defaults",
    "APPROX_RECALL_TARGET", "RADIX_BITS", "METHODS", "get",
    "check_topk_method", "canonical_zero", "order_key", "select_topk",
    "select", "scores_at", "chunk_size_for", "block_size_for",
    "fused_block_size_for",
]

def select_topk(scores, k: int, method: str | None = None, *,
                extra=None, block_max=None, **options):
  """Top-k indices of masked scores: i32[T, k], -1 where the score is -inf.

  scores: f32[T, N] (-inf: not visible); k: entries per row (N < k pads
  with -1); method: one of `TOPK_METHODS`, None: the chip's default
  (`defaults.lookup`); options: the method's own (`METHODS[method].options`),
  each checked. extra (or block_max, for "block_max"): the output the method
  `needs` from the scoring kernel (None: its `extra_ref` of `scores`).
  Identical for every exact method.
  """
  m = get(defaults.default_method() if method is None else method)
  if not isinstance(k, int) or isinstance(k, bool) or k < 1:
    raise ValueError(f"k: must be a positive int (got {k!r})")
  if getattr(scores, "ndim", None) != 2:
    raise ValueError(f"scores: must be a 2-D array [T, N] "
                     f"(got shape {getattr(scores, 'shape', None)})")
  if not jnp.issubdtype(scores.dtype, jnp.floating):
    raise ValueError(f"scores: must be floating point (got {scores.dtype})")
  if block_max is not None:
    if m.needs != "block_max" or extra is not None:
      raise ValueError(f"block_max: only for a method that reads block "
                       f"maxima, {tuple(n for n, r in METHODS.items() if r.needs == 'block_max')} "
                       f"(got method {m.name!r})")
    extra = block_max
  if extra is not None and m.needs is None:
    raise ValueError(f"extra: method {m.name!r} reads nothing but the scores")
  return select(scores, k, m, extra, **options)


def select(scores, k: int, method: base.Method, extra=None, *,
           entries: int | None = None, **options):
  """`select_topk` by a `METHODS` record, its arguments taken as checked
  (the kernels' selection stage: their call checked `topk_method` when it
  was built); the options are checked (`Method.resolve`). scores: also
  the kernels' f32[T, W / 128, 128] where `method.reads_as_written`, of
  which each row's first `entries` (None: all W) are read."""
  if scores.ndim == 2 and entries not in (None, scores.shape[1]):
    raise ValueError(f"entries: only for the kernels' f32[T, W / 128, 128]; "
                     f"f32[T, N] is read whole (got N {scores.shape[1]}, "
                     f"entries {entries})")
  opts = method.resolve(options)
  return _select(scores, extra, k=k, method=method.name,
                 entries=entries if scores.ndim == 3 else None,
                 options=tuple(sorted(opts.items())))


@functools.partial(jax.jit,
                   static_argnames=("k", "method", "entries", "options"))
def _select(scores, extra, *, k, method, entries, options):
  # The scope names the stage's ops in profiles (op metadata), whatever
  # XLA fuses them into.
  with jax.named_scope(f"select_topk_{method}"):
    if scores.ndim == 3:  # `Method.lane_rows`
      return METHODS[method].select(scores, k, extra, entries=entries,
                                    **dict(options))
    x = base.pad_to(scores.astype(jnp.float32), k)
    return METHODS[method].select(x, k, extra, **dict(options))
