"""The kernel variants, by name: what tests, benchmark and compile checks run.

`VARIANTS` maps a name to a `Variant`: its entry point, its reference (same
arguments), its value validator and checkify twin, the cache formats it
reads (each built from the same logical keys), token or page mode, and its
default block sizes (from `streamidx.blocks`). Every variant can be driven
from one logical batch with one call:

    inputs = si.make_inputs(batch, num_heads=8, fmt="fp8")
    for v in si.VARIANTS.values():
      for fmt in v.cache_formats:
        got = v.run(inputs, k=16, compression_ratio=4, fmt=fmt)
        want = v.run_reference(inputs, k=16, compression_ratio=4, fmt=fmt)

Adding a variant: one kernel body under `streamidx/kernels/` (its launch and
cache layout, a `driver.KernelBody`, and its entry point in
`kernels/entries.py`), one entry in `_REGISTRY` below (and a cache format in
`streamidx.cache.CACHE_FORMATS` if it reads a new layout), a row in
`streamidx.blocks.TABLE`; its reference, validator and checkify twin follow
from its mode and cache layout.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Mapping

import jax.numpy as jnp

from streamidx import blocks as blocks_lib
from streamidx import cache as cache_lib
from streamidx import ref as ref_lib
from streamidx import streaming as streaming_lib
from streamidx.call import MODES
from streamidx.semantics import DEFAULT_CAUSAL_RULE
from streamidx.kernels import driver, entries


# Options that shape the kernel's grid or launches only; the references
# compute the same result without them.
_KERNEL_ONLY = ("num_cores", "skip_empty_launches")


@dataclasses.dataclass(frozen=True)
class Variant:
  """One kernel variant and everything needed to drive and check it.

  Attributes:
    name: its key in `VARIANTS`.
    description: one line, for tables.
    mode: "token" (returns entry indices, `k`) or "page" (returns page
      indices, `k_pages`; compression ratio 1).
    kernel: the entry point, a `streamidx.kernels.driver.Entry`:
      `kernel(q, weights, *cache, <metadata>, **static)`.
    cache_formats: names of `streamidx.cache.CACHE_FORMATS` it reads (each
      built from the same logical keys).
    topk_methods (derived): the `topk_method` values its kernel takes
      (`streamidx.topk.KERNEL_TOPK_METHODS`, the selections from the score
      buffer, for every token kernel; `streamidx.topk.TOPK_METHODS` for one
      that also writes the block maxima "fused_blockmax" reads (dense);
      empty: the kernel has no such option, e.g. page mode's fixed `top_k`
      of pages).

  Derived from these (the same for every variant): `reference` and
  `streaming` (the exact references of its mode, same arguments),
  `validate` (value validation on concrete arrays) and `checked` (the
  checkify entry point, returns (err, idx)); `module`, the kernel body's.
  """

  name: str
  description: str
  mode: str
  kernel: driver.Entry
  cache_formats: tuple[str, ...]

  @property
  def topk_methods(self) -> tuple[str, ...]:
    return self.kernel.body.topk_methods if self.mode == "token" else ()

  @property
  def module(self) -> str:
    """The module holding the kernel body (for docs and schedule dumps)."""
    return self.kernel.body.launch.__module__

  @property
  def checked(self) -> driver.Entry:
    return self.kernel.checked

  @property
  def validate(self):
    return self.kernel.validate

  def _regrouped(self, fn):
    """`fn` (a reference: the cache as one argument, an array or a tuple,
    and no kernel-only option) on the kernel's arguments."""
    n = self.kernel.body.num_cache_arrays

    def call(q, w, *rest, **static):
      for name in _KERNEL_ONLY:
        static.pop(name, None)
      cache = rest[0] if n == 1 else tuple(rest[:n])
      return fn(q, w, cache, *rest[n:], **static)

    return functools.update_wrapper(call, fn)  # its keywords are fn's

  @property
  def reference(self):
    return self._regrouped(ref_lib.streamindex_topk_ref if self.mode == "token"
                           else ref_lib.streamindex_page_topk_ref)

  @property
  def streaming(self):
    if self.kernel.body.num_cache_arrays != 1:
      return None
    return (streaming_lib.streamindex_topk_streaming if self.mode == "token"
            else streaming_lib.streamindex_page_topk_streaming)

  @property
  def k_name(self) -> str:
    """The keyword that sets the number of results: "k" or "k_pages"."""
    return "k" if self.mode == "token" else "k_pages"

  # -- driving it from a logical batch ------------------------------------

  def cache_arrays(self, inputs, fmt: str | None = None) -> tuple:
    """The variant's cache arrays for `inputs.keys` in format `fmt`.

    Reuses `inputs.cache` when `fmt` is the format it was packed in.
    """
    fmt = fmt or self.cache_formats[0]
    if fmt not in self.cache_formats:
      raise ValueError(f"fmt: variant {self.name!r} reads "
                       f"{self.cache_formats} (got {fmt!r})")
    if fmt == inputs.fmt:
      cache = inputs.cache
      return tuple(cache) if isinstance(cache, (tuple, list)) else (cache,)
    return cache_lib.CACHE_FORMATS[fmt].pack(inputs.keys)

  def args(self, inputs, fmt: str | None = None) -> tuple:
    """Positional arguments of the kernel (and reference) for `inputs`."""
    seq_lens, page_indices, cu_q_lens, distribution = (
        inputs.batch.kernel_arrays())
    last = (distribution if self.mode == "token"
            else jnp.int32(inputs.batch.num_seqs))
    return (inputs.q, inputs.weights, *self.cache_arrays(inputs, fmt),
            seq_lens, page_indices, cu_q_lens, last)

  def block_sizes(self, *, cache_format: str, num_heads: int, page_size: int,
                  generation: str | None = None) -> blocks_lib.BlockSizes:
    """The block-size table's row for this variant and these inputs."""
    return blocks_lib.lookup(self.name, mode=self.mode,
                             cache_format=cache_format, num_heads=num_heads,
                             page_size=page_size, generation=generation)

  def static(self, inputs=None, *, k: int, compression_ratio: int,
             fmt: str | None = None, generation: str | None = None,
             **overrides) -> dict:
    """The keyword arguments of a call: k, ratio, table block sizes, overrides.

    Overrides pass through (`topk_method=` among them, checked against
    `topk_methods`).

    Block sizes come from `block_sizes(...)` for `inputs` (its format, heads
    and page size) unless `overrides` sets them.
    """
    if "topk_method" in overrides and (
        overrides["topk_method"] not in self.topk_methods):
      raise ValueError(
          f"topk_method: variant {self.name!r} takes "
          f"{self.topk_methods or 'no topk_method'} "
          f"(got {overrides['topk_method']!r})")
    out = {self.k_name: k, "compression_ratio": compression_ratio}
    if inputs is not None:
      row = self.block_sizes(
          cache_format=fmt or self.cache_formats[0],
          num_heads=int(inputs.q.shape[1]),
          page_size=int(inputs.batch.page_size), generation=generation)
      out.update(row.kwargs())
    out.update(overrides)
    return out

  def _call(self, fn, inputs, k, compression_ratio, fmt, generation,
            overrides):
    return fn(*self.args(inputs, fmt),
              **self.static(inputs, k=k, compression_ratio=compression_ratio,
                            fmt=fmt, generation=generation, **overrides))

  def run(self, inputs, *, k: int, compression_ratio: int,
          fmt: str | None = None, generation: str | None = None, **overrides):
    """The kernel on `inputs` (cache format `fmt`); i32[T, k] indices."""
    return self._call(self.kernel, inputs, k, compression_ratio, fmt,
                      generation, overrides)

  def run_reference(self, inputs, *, k: int, compression_ratio: int,
                    fmt: str | None = None, generation: str | None = None,
                    **overrides):
    """The reference on the same arguments as `run`."""
    return self._call(self.reference, inputs, k, compression_ratio, fmt,
                      generation, overrides)

  def scores(self, inputs, *, compression_ratio: int, fmt: str | None = None,
             causal_rule: str = DEFAULT_CAUSAL_RULE):
    """Exact masked scores the results are compared on: f32[T, entries or pages]."""
    cache = self.cache_arrays(inputs, fmt)
    q, w, *rest = self.args(inputs, fmt)
    # The references take a multi-array cache (dense FP8) as one tuple.
    args = (q, w, cache[0] if len(cache) == 1 else tuple(cache),
            *rest[len(cache):])
    if self.mode == "token":
      return ref_lib.token_scores(*args, compression_ratio=compression_ratio,
                                  causal_rule=causal_rule)
    return ref_lib.page_scores(*args, compression_ratio=compression_ratio,
                               causal_rule=causal_rule)


_REGISTRY = (
    Variant(
        name="vendored",
        description=("the vendored streamindex_topk: token top-k over the "
                     "packed FP8 (256 B/entry) or bf16 cache"),
        mode="token", kernel=entries.streamindex_topk,
        cache_formats=("fp8", "bf16")),
    Variant(
        name="vendored_page",
        description=("the vendored streamindex_page_topk: page top-k "
                     "(max-pooled token scores), ratio 1 (GLM)"),
        mode="page", kernel=entries.streamindex_page_topk,
        cache_formats=("fp8", "bf16")),
    Variant(
        name="dense",
        description=("streamindex_topk_dense: token top-k over the dense "
                     "FP8 cache (e4m3 values + separate e8m0 scales, 129 "
                     "B/entry)"),
        mode="token", kernel=entries.streamindex_topk_dense,
        cache_formats=("dense_fp8",)),
    Variant(
        name="dense_page",
        description=("streamindex_page_topk_dense: page top-k over the "
                     "dense FP8 cache, ratio 1 (GLM)"),
        mode="page", kernel=entries.streamindex_page_topk_dense,
        cache_formats=("dense_fp8",)),
    Variant(
        name="fp4",
        description=("streamindex_topk_fp4: token top-k over the MXFP4 "
                     "cache (e2m1 values + an e8m0 scale per 32, 68 "
                     "B/entry)"),
        mode="token", kernel=entries.streamindex_topk_fp4,
        cache_formats=("mxfp4",)),
    Variant(
        name="fp4_page",
        description=("streamindex_page_topk_fp4: page top-k over the MXFP4 "
                     "cache, ratio 1 (GLM)"),
        mode="page", kernel=entries.streamindex_page_topk_fp4,
        cache_formats=("mxfp4",)),
)

VARIANTS: Mapping[str, Variant] = {v.name: v for v in _REGISTRY}

for _v in _REGISTRY:
  assert _v.mode in MODES, _v
  assert all(f in cache_lib.CACHE_FORMATS for f in _v.cache_formats), _v


def get(name: str) -> Variant:
  """`VARIANTS[name]`, with a clear error for an unknown name."""
  try:
    return VARIANTS[name]
  except KeyError:
    raise ValueError(f"variant: must be one of {sorted(VARIANTS)} "
                     f"(got {name!r})") from None


def block_sizes(variant: str, *, cache_format: str, num_heads: int,
                page_size: int, generation: str | None = None
                ) -> blocks_lib.BlockSizes:
  """The block-size table's row for `variant` (see `streamidx.blocks`)."""
  return get(variant).block_sizes(cache_format=cache_format,
                                  num_heads=num_heads, page_size=page_size,
                                  generation=generation)
