"""The registered top-k methods, by name: what `select_topk`, the kernels'
`topk_method`, the tests, the compile matrix, the benchmark and the model
iterate. Adding a method: its module (a `base.Method` named METHOD) and one
entry in `_REGISTRY`."""

from __future__ import annotations

from typing import Mapping

from streamidx.topk import (approx, base, blockmax, blocktop, chunked,
                            fused_blockmax, radix, sort, top_k)

_REGISTRY = (sort.METHOD, top_k.METHOD, chunked.METHOD, blockmax.METHOD,
             fused_blockmax.METHOD, radix.METHOD, blocktop.METHOD,
             approx.METHOD)

METHODS: Mapping[str, base.Method] = {m.name: m for m in _REGISTRY}
TOPK_METHODS = tuple(METHODS)
EXACT_TOPK_METHODS = tuple(m.name for m in _REGISTRY if m.exact)
# Methods that need more than the score buffer from the scoring kernel: a
# kernel takes them only if it writes what they read.
FUSED_TOPK_METHODS = tuple(m.name for m in _REGISTRY if m.needs is not None)
# The methods every token kernel takes: they select from the score buffer.
KERNEL_TOPK_METHODS = tuple(m.name for m in _REGISTRY if m.needs is None)


def check_topk_method(method, allowed=TOPK_METHODS, where: str = "") -> str:
  """Returns `method`, or raises the one ValueError for a `topk_method`
  naming the `allowed` ones, `where`, and what a method outside them needs."""
  if not isinstance(method, str) or method not in allowed:
    why = ""
    if isinstance(method, str) and method in METHODS and METHODS[method].needs:
      why = (f"; {method!r} reads the kernel's extra output "
             f"{METHODS[method].needs!r}, which only a kernel writing it "
             f"beside its scores gives")
    at = f" for {where}" if where else ""
    raise ValueError(f"topk_method: must be one of {tuple(allowed)}{at}{why} "
                     f"(got {method!r})")
  return method


def get(method) -> base.Method:
  """The registered method `method` (checked by `check_topk_method`)."""
  return METHODS[check_topk_method(method)]
