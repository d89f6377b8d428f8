"""The kernel variants, by name: what tests, benchmark and compile checks run.

`VARIANTS` maps a name to a `Variant`; each drives from one logical batch:

    inputs = si.make_inputs(batch, num_heads=8, fmt="fp8")
    for v in si.VARIANTS.values():
      for fmt in v.cache_formats:
        got = v.run(inputs, k=16, compression_ratio=4, fmt=fmt)
        want = v.run_reference(inputs, k=16, compression_ratio=4, fmt=fmt)

A `Variant` is an entry point of `kernels.entries.ENTRIES`; its twins follow
from its mode and cache layout (adding one: ARCHITECTURE.md).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Mapping

import jax.numpy as jnp

from streamidx import blocks as blocks_lib
from streamidx import cache as cache_lib
from streamidx import ref as ref_lib
from streamidx.call import KERNEL_ONLY, MODES
from streamidx.semantics import DEFAULT_CAUSAL_RULE
from streamidx.kernels import driver, entries


@dataclasses.dataclass(frozen=True)
class Variant:
  """One kernel variant: `kernel(q, weights, *cache, <metadata>, **static)`
  (a `driver.Entry`: a kernel body in one mode). Derived: its name (the
  body's, "_page" in page mode), mode ("token": entry indices, `k`;
  "page": page indices, `k_pages`), the `cache.CACHE_FORMATS` it reads,
  `reference` (its mode's exact reference, same arguments), `validate`,
  `checked` (checkify: (err, idx)), `topk_methods`."""

  kernel: driver.Entry

  name = property(lambda self: self.kernel.variant)
  mode = property(lambda self: self.kernel.mode)
  cache_formats = property(lambda self: self.kernel.body.cache_formats)
  # The kernel body's `topk_method`s; page mode has none (top_k of pages).
  topk_methods = property(lambda self: self.kernel.body.topk_methods
                          if self.mode == "token" else ())
  # The module holding the kernel body (for docs and schedule dumps).
  module = property(lambda self: self.kernel.body.launch.__module__)
  checked = property(lambda self: self.kernel.checked)
  validate = property(lambda self: self.kernel.validate)
  # The keyword that sets the number of results: "k" or "k_pages".
  k_name = property(lambda self: "k" if self.mode == "token" else "k_pages")

  def _regrouped(self, fn):
    """`fn` (a reference: the cache as one argument, an array or a tuple,
    and no kernel-only option) on the kernel's arguments."""
    n = len(self.kernel.body.cache_args)

    def call(q, w, *rest, **static):
      for name in KERNEL_ONLY:
        static.pop(name, None)
      cache = rest[0] if n == 1 else tuple(rest[:n])
      return fn(q, w, cache, *rest[n:], **static)

    return functools.update_wrapper(call, fn)  # its keywords are fn's

  reference = property(lambda self: self._regrouped(  # pylint: disable=protected-access
      ref_lib.streamindex_topk_ref if self.mode == "token"
      else ref_lib.streamindex_page_topk_ref))

  # -- driving it from a logical batch ------------------------------------

  def cache_arrays(self, inputs, fmt: str | None = None) -> tuple:
    """The cache arrays of `inputs.keys` in format `fmt` (`inputs.cache` when
    it was packed in `fmt`)."""
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

  def block_sizes(self, **geometry) -> blocks_lib.BlockSizes:
    """The block-size table's row for this variant at `geometry`, `blocks.lookup`'s
    keywords (cache_format, num_heads, page_size; generation None: the chip the call
    runs on; decode_q_len, head_dim, pages_per_seq)."""
    return blocks_lib.lookup(self.name, mode=self.mode, **geometry)

  def static(self, inputs=None, *, k: int, compression_ratio: int,
             fmt: str | None = None, generation: str | None = None,
             **overrides) -> dict:
    """The keyword arguments of a call: k, ratio, the table's block sizes
    for `inputs` (its format, heads and page size; `generation` None: the
    chip the call runs on, the row the entry point takes), then `overrides`
    (the kernel's call checks them)."""
    out = {self.k_name: k, "compression_ratio": compression_ratio}
    dq = (inputs.batch.decode_q_len if inputs is not None
          and self.mode == "token" else 1)
    if dq != 1:  # M17: the batch's decode rows per sequence (else the default)
      out["decode_q_len"] = dq
    if inputs is not None:
      row = self.block_sizes(
          cache_format=fmt or self.cache_formats[0],
          num_heads=int(inputs.q.shape[1]),
          page_size=int(inputs.batch.page_size), generation=generation,
          decode_q_len=dq, head_dim=int(inputs.q.shape[2]),
          pages_per_seq=int(inputs.batch.pages_per_seq))
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
    fn = (ref_lib.token_scores if self.mode == "token" else ref_lib.page_scores)
    return self._regrouped(fn)(*self.args(inputs, fmt),
                               compression_ratio=compression_ratio,
                               causal_rule=causal_rule)


_REGISTRY = tuple(Variant(entry) for entry in entries.ENTRIES)

VARIANTS: Mapping[str, Variant] = {v.name: v for v in _REGISTRY}

for _v in _REGISTRY:
  assert _v.mode in MODES, _v
  assert all(f in cache_lib.CACHE_FORMATS for f in _v.cache_formats), _v


def get(name) -> Variant:
  """`VARIANTS[name]` (a `Variant` is returned as it is), with a clear error
  for an unknown name."""
  if isinstance(name, Variant):
    return name
  try:
    return VARIANTS[name]
  except KeyError:
    raise ValueError(f"variant: must be one of {sorted(VARIANTS)} "
                     f"(got {name!r})") from None


def block_sizes(variant: str, **geometry) -> blocks_lib.BlockSizes:
  """The block-size table's row for `variant` at `geometry` (`Variant.block_sizes`)."""
  return get(variant).block_sizes(**geometry)
