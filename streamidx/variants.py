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

Adding a variant: one kernel module under `streamidx/kernels/`, one entry in
`_REGISTRY` below (and a cache format in `streamidx.cache.CACHE_FORMATS` if
it reads a new layout), a row in `streamidx.blocks.TABLE`; nothing else.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Mapping

import jax.numpy as jnp

from streamidx import blocks as blocks_lib
from streamidx import cache as cache_lib
from streamidx import checked as checked_lib
from streamidx import modes
from streamidx import ref as ref_lib
from streamidx import streaming as streaming_lib
from streamidx import topk as topk_lib
from streamidx import validate as validate_lib
from streamidx.kernels import dense, vendored

MODES = ("token", "page")


@dataclasses.dataclass(frozen=True)
class Variant:
  """One kernel variant and everything needed to drive and check it.

  Attributes:
    name: its key in `VARIANTS`.
    description: one line, for tables.
    mode: "token" (returns entry indices, `k`) or "page" (returns page
      indices, `k_pages`; compression ratio 1).
    kernel: the entry point: `kernel(q, weights, *cache, <metadata>, **static)`.
    reference: the exact pure-JAX twin, same arguments.
    streaming: the streaming exact reference (same arguments, bounded
      memory), or None.
    validate: value validation on concrete arrays, same arguments.
    checked: the checkify entry point, same arguments, returns (err, idx).
    cache_formats: names of `streamidx.cache.CACHE_FORMATS` it reads.
    module: the module holding the kernel (for docs and schedule dumps).
    topk_methods: the `topk_method` values its kernel takes
      (`streamidx.topk.KERNEL_TOPK_METHODS`, the selections from the score
      buffer, for every token kernel; `streamidx.topk.TOPK_METHODS` for one
      that also writes the block maxima "fused_blockmax" reads (dense);
      empty: the kernel has no such option, e.g. page mode's fixed `top_k`
      of pages).
  """

  name: str
  description: str
  mode: str
  kernel: Callable
  reference: Callable
  streaming: Callable | None
  validate: Callable
  checked: Callable
  cache_formats: tuple[str, ...]
  module: str
  topk_methods: tuple[str, ...] = ()

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
             causal_rule: str = "model"):
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
        mode="token",
        kernel=vendored.streamindex_topk,
        reference=ref_lib.streamindex_topk_ref,
        streaming=streaming_lib.streamindex_topk_streaming,
        validate=validate_lib.validate_topk_inputs,
        checked=checked_lib.checked_streamindex_topk,
        cache_formats=("fp8", "bf16"),
        module=vendored.__name__,
        topk_methods=topk_lib.KERNEL_TOPK_METHODS,
    ),
    Variant(
        name="vendored_page",
        description=("the vendored streamindex_page_topk: page top-k "
                     "(max-pooled token scores), ratio 1 (GLM)"),
        mode="page",
        kernel=vendored.streamindex_page_topk,
        reference=ref_lib.streamindex_page_topk_ref,
        streaming=streaming_lib.streamindex_page_topk_streaming,
        validate=validate_lib.validate_page_topk_inputs,
        checked=checked_lib.checked_streamindex_page_topk,
        cache_formats=("fp8", "bf16"),
        module=vendored.__name__,
    ),
    Variant(
        name="dense",
        description=("streamindex_topk_dense: token top-k over the dense "
                     "FP8 cache (e4m3 values + separate e8m0 scales, 129 "
                     "B/entry)"),
        mode="token",
        kernel=dense.streamindex_topk_dense,
        reference=ref_lib.streamindex_topk_dense_ref,
        streaming=None,
        validate=validate_lib.validate_topk_dense_inputs,
        checked=checked_lib.checked_streamindex_topk_dense,
        cache_formats=("dense_fp8",),
        module=dense.__name__,
        topk_methods=topk_lib.TOPK_METHODS,
    ),
    Variant(
        name="dense_page",
        description=("streamindex_page_topk_dense: page top-k over the "
                     "dense FP8 cache, ratio 1 (GLM)"),
        mode="page",
        kernel=dense.streamindex_page_topk_dense,
        reference=ref_lib.streamindex_page_topk_dense_ref,
        streaming=None,
        validate=validate_lib.validate_page_topk_dense_inputs,
        checked=checked_lib.checked_streamindex_page_topk_dense,
        cache_formats=("dense_fp8",),
        module=dense.__name__,
    ),
)

# Every registered kernel returns finished results when it runs interpreted
# (`modes.blocking_when_interpreted`: queuing more work behind a running
# interpreted kernel can hang XLA:CPU); compiled and traced calls are as the
# jitted function's.
VARIANTS: Mapping[str, Variant] = {
    v.name: dataclasses.replace(
        v, kernel=modes.blocking_when_interpreted(v.kernel))
    for v in _REGISTRY}

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
