"""One description of a kernel call: its static arguments, each default once.

`TopkCall` (token mode: `k` entries per query row) and `PageCall` (page mode:
`k` pages per query row, `k_pages` in the drop-in signature) are frozen,
hashable dataclasses, the jitted driver's static argument. `__post_init__`
checks what needs no arrays, resolves `topk_method`'s default and
normalises the per-case block sizes; block sizes left None come from
`streamidx.blocks` (`with_table_blocks`; `block_source` names the row).
"""

from __future__ import annotations

import dataclasses
import numbers
from typing import Any

from streamidx import blocks, semantics, topk

MODES = ("token", "page")
MAX_DECODE_Q_LEN = 8  # TopkCall.decode_q_len's bound (docs/semantics.md: why)

# Fields that shape the kernel's grid or launches only: the references take
# no such argument (`Variant.reference`).
KERNEL_ONLY = ("num_cores", "skip_empty_launches")
# Token mode's fields that the page-mode signature lacks (`PageCall.kwargs`).
TOKEN_ONLY = ("decode_req_batch_size", "decode_q_len", "topk_method",
              "sort_decode")

def _fail(name, rule, got):
  raise ValueError(f"{name}: {rule} (got {got})")


def check_bool(name, v):
  """The rule of a flag argument: True or False, nothing else."""
  if not isinstance(v, bool):
    _fail(name, "must be True or False", repr(v))


def _positive_int(name, v):
  if not isinstance(v, numbers.Integral) or isinstance(v, bool) or v <= 0:
    _fail(name, "must be a positive int", repr(v))


@dataclasses.dataclass(frozen=True)
class TopkCall:
  """The static arguments of one token-mode call (`streamindex_topk`).

  Fields are the drop-in keyword arguments (see `streamindex_topk`);
  num_kv_pages_per_block / num_queries_per_block are (decode, prefill,
  mixed) triples after construction, or None until `with_table_blocks`.
  topk_method None takes the default of the chip the call is built for
  (`topk.defaults.lookup()`; `topk_source` its row, not hashed), checked
  against the `topk_methods` of `body` (not a field: the
  `kernels.driver.KernelBody` the call is built for; None: every method).
  """

  k: int
  compression_ratio: int
  num_kv_pages_per_block: Any = None
  num_queries_per_block: Any = None
  vmem_limit_bytes: int | None = semantics.DEFAULT_VMEM_LIMIT_BYTES
  decode_req_batch_size: int = 4
  decode_q_len: int = 1
  causal_rule: str = semantics.DEFAULT_CAUSAL_RULE
  topk_method: str | None = None
  return_scores: bool = False
  physical_slots: bool = False
  sort_decode: bool = True
  skip_empty_launches: bool = True
  num_cores: int = 1
  block_source: str | None = dataclasses.field(default=None, compare=False)
  topk_source: str | None = dataclasses.field(default=None, compare=False)
  body: dataclasses.InitVar[Any] = None

  mode = "token"
  k_name = "k"

  def __post_init__(self, body):
    _positive_int(self.k_name, self.k)
    _positive_int("compression_ratio", self.compression_ratio)
    _positive_int("decode_req_batch_size", self.decode_req_batch_size)
    _positive_int("decode_q_len", self.decode_q_len)
    if self.decode_q_len > MAX_DECODE_Q_LEN:
      _fail("decode_q_len", f"must be in [1, {MAX_DECODE_Q_LEN}] (gamma + 1 "
            "query rows per decode sequence; a longer window is a prefill "
            "chunk)", self.decode_q_len)
    _positive_int("num_cores", self.num_cores)
    if self.vmem_limit_bytes is not None:
      _positive_int("vmem_limit_bytes", self.vmem_limit_bytes)
    semantics.check_causal_rule(self.causal_rule)
    if self.topk_method is None:  # the chip's default, resolved once here
      row = topk.defaults.lookup()
      object.__setattr__(self, "topk_method", row.method)
      object.__setattr__(self, "topk_source", row.source)
    topk.check_topk_method(self.topk_method, *self._methods(body))
    for name in ("return_scores", "physical_slots", "sort_decode",
                 "skip_empty_launches"):
      check_bool(name, getattr(self, name))
    for name in ("num_kv_pages_per_block", "num_queries_per_block"):
      if getattr(self, name) is not None:
        object.__setattr__(self, name, self._blocks(getattr(self, name), name))

  def _methods(self, body):
    """(the `topk_method` values allowed, where) for `check_topk_method`."""
    if body is None:
      return topk.TOPK_METHODS, ""
    return body.topk_methods, f"the {body.name!r} kernel body"

  def _blocks(self, value, name):
    return semantics.normalize_per_case(value, name)

  has_blocks = property(lambda self: self.num_kv_pages_per_block is not None
                        and self.num_queries_per_block is not None)

  def with_table_blocks(self, variant: str, *, cache_format: str,
                        num_heads: int, page_size: int, head_dim: int = 128,
                        pages_per_seq: int | None = None) -> "TopkCall":
    """This call with the block sizes it left None from `streamidx.blocks` (the
    row for `variant` on the chip traced for, `modes.current_generation()`; page
    mode's query rows derived for head_dim and pages_per_seq too);
    `block_source` says which row. Sizes the call sets are kept."""
    if self.has_blocks:
      return self
    row = blocks.lookup(variant, mode=self.mode, cache_format=cache_format,
                        num_heads=num_heads, page_size=page_size,
                        decode_q_len=self.decode_q_len, head_dim=head_dim,
                        pages_per_seq=pages_per_seq)
    return dataclasses.replace(
        self, block_source=row.source,
        num_kv_pages_per_block=(self.num_kv_pages_per_block
                                or row.num_kv_pages_per_block),
        num_queries_per_block=(self.num_queries_per_block
                               or row.num_queries_per_block))

  def kwargs(self) -> dict:
    """The drop-in keyword arguments this call stands for."""
    out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
           if f.compare}
    out[self.k_name] = out.pop("k")
    return out


@dataclasses.dataclass(frozen=True)
class PageCall(TopkCall):
  """The static arguments of one page-mode call (`streamindex_page_topk`):
  `k` pages (`k_pages`), compression ratio 1, 128 pages per KV block, one
  int of query rows per block (None: derived for the call's shapes,
  `streamidx.blocks.page_query_rows`; the vendored default was 512), the
  selection `select_topk(..., "top_k")`."""

  compression_ratio: int = 1
  num_kv_pages_per_block: Any = None
  num_queries_per_block: Any = None
  vmem_limit_bytes: int | None = semantics.PAGE_VMEM_LIMIT_BYTES
  decode_req_batch_size: int = 1
  topk_method: str = "top_k"
  sort_decode: bool = False

  mode = "page"
  k_name = "k_pages"

  def __post_init__(self, body):
    super().__post_init__(body)
    if self.compression_ratio != 1:
      _fail("compression_ratio", "page mode supports compression_ratio == 1 "
            "only (GLM); use streamindex_page_topk_ref for other ratios",
            self.compression_ratio)
    if self.sort_decode:
      _fail("sort_decode", "page mode selects pages unsorted, by top_k",
            repr(self.sort_decode))

  def _methods(self, body):
    return ("top_k",), "page mode (pages by top_k, unsorted)"

  def _blocks(self, value, name):
    if name == "num_kv_pages_per_block" and value != 128:
      _fail("num_kv_pages_per_block", "page mode requires exactly 128 (one "
            "lane row of pooled pages per block)", repr(value))
    _positive_int(name, value)
    return value

  def kwargs(self) -> dict:
    out = super().kwargs()
    for name in TOKEN_ONLY:
      del out[name]
    return out
