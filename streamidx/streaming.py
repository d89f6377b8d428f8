"""Streaming exact reference: `streamidx.ref`'s engine over chunks of
`chunk_entries` entries with a running top-k merge, so a step holds Tc x
(chunk + k), not Tc x entries; the same indices, ties included.
"""

from __future__ import annotations

import functools

from streamidx import cache as cache_lib
from streamidx import ref as ref_lib

DEFAULT_CHUNK_ENTRIES = 4096


def one_chunk_temp_bytes(*, num_tokens: int, num_entries: int,
                         num_heads: int, head_dim: int, fmt: str, k: int,
                         chunk_bytes: int = ref_lib.DEFAULT_CHUNK_BYTES
                         ) -> tuple[int, int]:
  """(low, high): the one-chunk reference's temporary buffers, in bytes:
  a step holds W = Tc x `ref.step_bytes_per_row(num_entries, ...)`, of which
  XLA fuses part: (W / 2, W) (tests/test_streaming.py checks it)."""
  lkv = cache_lib.record_bytes(fmt, head_dim)
  tc = ref_lib.rows_per_block(num_tokens, num_entries, num_heads, head_dim,
                              lkv, chunk_bytes)
  w = tc * ref_lib.step_bytes_per_row(num_entries, num_heads, head_dim, lkv, k)
  return w // 2, w


def _streaming(reference):
  """`reference` (same arguments, `chunk_entries` and `chunk_tokens` among
  them) with chunks of DEFAULT_CHUNK_ENTRIES by default; jitted, so
  `.lower` works as on the reference."""
  return ref_lib.jit_static_keywords(
      functools.partial(reference, chunk_entries=DEFAULT_CHUNK_ENTRIES))


streamindex_topk_streaming = _streaming(ref_lib.streamindex_topk_ref)
streamindex_page_topk_streaming = _streaming(ref_lib.streamindex_page_topk_ref)
