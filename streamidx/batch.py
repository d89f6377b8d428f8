"""Ragged paged batches: everything the kernels take, built in one place.

Sequence b has `q_len` query tokens (rows `cu_q_lens[b] : cu_q_lens[b + 1]`
of q, the i-th at absolute position `seq_len - q_len + i`) and `seq_len`
tokens in the cache, `seq_len // compression_ratio` entries in pages of
`page_size`: entry s is in physical page `page_indices[b * pages_per_seq +
s // page_size]` (unused slots: page 0). `distribution = (i, j, n)` as in
docs/semantics.md; the launches: `streamidx.semantics.token_launches`.
"""

from __future__ import annotations

import dataclasses
from typing import Literal, Sequence

import jax.numpy as jnp
import numpy as np

from streamidx import cache as cache_lib
from streamidx.call import TopkCall

Allocation = Literal["contiguous", "shuffled", "fragmented"]


@dataclasses.dataclass(frozen=True, eq=False)
class RaggedBatch:
  """A ragged paged batch, as NumPy arrays (int32)."""

  q_lens: np.ndarray  # [num_seqs] query tokens per sequence
  seq_lens: np.ndarray  # [max_num_seqs] tokens in the cache (0 = padding)
  cu_q_lens: np.ndarray  # [max_num_seqs + 1] cumulative query lengths
  distribution: np.ndarray  # [3] (decode, decode + prefill-only, num_seqs)
  page_indices: np.ndarray  # [max_num_seqs * pages_per_seq] page table
  page_size: int  # entries per page
  compression_ratio: int  # tokens per compressed entry
  num_tokens: int  # rows of q (>= cu_q_lens[num_seqs]; the rest padding)
  total_num_pages: int  # physical pages in the cache
  decode_q_len: int = TopkCall.decode_q_len  # query rows of a decode sequence

  num_seqs = property(lambda self: int(self.distribution[2]))
  max_num_seqs = property(lambda self: int(self.seq_lens.shape[0]))
  pages_per_seq = property(
      lambda self: int(self.page_indices.shape[0] // self.max_num_seqs))
  # [max_num_seqs, pages_per_seq] view of `page_indices`.
  page_table = property(lambda self: self.page_indices.reshape(
      self.max_num_seqs, self.pages_per_seq))
  # [max_num_seqs] compressed entries, and pages holding one, per sequence.
  num_entries = property(lambda self: self.seq_lens // self.compression_ratio)
  num_pages_used = property(lambda self: -(-self.num_entries // self.page_size))
  num_query_tokens = property(lambda self: int(self.cu_q_lens[self.num_seqs]))

  def token_seq_ids(self) -> np.ndarray:
    """[num_tokens] the sequence each query row belongs to (-1: padding)."""
    ids = np.full(self.num_tokens, -1, np.int32)
    for b in range(self.num_seqs):
      ids[self.cu_q_lens[b]:self.cu_q_lens[b + 1]] = b
    return ids

  def token_positions(self) -> np.ndarray:
    """[num_tokens] absolute position p of each query row (-1: padding)."""
    pos = np.full(self.num_tokens, -1, np.int32)
    for b in range(self.num_seqs):
      lo, hi = self.cu_q_lens[b], self.cu_q_lens[b + 1]
      pos[lo:hi] = self.seq_lens[b] - (hi - lo) + np.arange(hi - lo)
    return pos

  def kernel_arrays(self):
    """(seq_lens, page_indices, cu_q_lens, distribution) as jnp int32."""
    return tuple(
        jnp.asarray(a, jnp.int32) for a in (self.seq_lens, self.page_indices,
                                            self.cu_q_lens, self.distribution))

  def describe(self) -> str:
    d = self.distribution
    return (f"{self.num_seqs} seqs (decode {d[0]}, prefill-only {d[1] - d[0]}, "
            f"mixed {d[2] - d[1]}), {self.num_query_tokens} query tokens "
            f"(T={self.num_tokens}), ratio {self.compression_ratio}, page_size "
            f"{self.page_size}, pages_per_seq {self.pages_per_seq}, "
            f"{self.total_num_pages} physical pages")


def make_batch(pairs: Sequence[tuple[int, int]], *, page_size: int,
               compression_ratio: int, distribution: Sequence[int] | None = None,
               allocation: Allocation = "contiguous",
               pages_per_seq: int | None = None, max_num_seqs: int | None = None,
               num_tokens: int | None = None, extra_pages: int = 0,
               total_num_pages: int | None = None, seed: int = 0,
               decode_q_len: int = TopkCall.decode_q_len) -> RaggedBatch:
  """Builds a ragged paged batch from (q_len, seq_len) pairs, in kernel
  order. distribution (i, j, n) default: the leading q_len == decode_q_len
  sequences decode, the rest mixed. allocation: "contiguous" (in order),
  "shuffled" (the same pages in a random order) or "fragmented" (a random
  subset of a pool twice as large). Defaults: pages_per_seq what the
  longest needs, max_num_seqs len(pairs) (more: padding sequences),
  num_tokens the query tokens (>= 1); extra_pages unused pages added;
  total_num_pages pads the cache to exactly that many (one compiled kernel
  then serves several batches); seed for the random allocations.
  """
  q_lens = np.array([p[0] for p in pairs], np.int64).reshape(-1)
  seq_lens = np.array([p[1] for p in pairs], np.int64).reshape(-1)
  n = len(pairs)
  if np.any(q_lens < 0) or np.any(seq_lens < 0):
    raise ValueError("q_len and seq_len must be >= 0")
  if np.any(q_lens > seq_lens):
    bad = int(np.argmax(q_lens > seq_lens))
    raise ValueError(f"sequence {bad}: q_len ({q_lens[bad]}) > seq_len "
                     f"({seq_lens[bad]})")
  if page_size <= 0 or compression_ratio <= 0:
    raise ValueError("page_size and compression_ratio must be positive")
  max_num_seqs = n if max_num_seqs is None else max_num_seqs
  if max_num_seqs < max(n, 1):
    raise ValueError(f"max_num_seqs ({max_num_seqs}) < number of sequences "
                     f"({n}) (and must be >= 1)")
  if distribution is None:
    i = 0
    while i < n and q_lens[i] == decode_q_len:
      i += 1
    distribution = (i, i, n)
  distribution = np.asarray(distribution, np.int32)
  if distribution.shape != (3,) or distribution[2] != n:
    raise ValueError(f"distribution must be (i, j, {n}), got {distribution}")
  if np.any(q_lens[:distribution[0]] != decode_q_len):
    raise ValueError(f"decode sequences [0, {distribution[0]}) must have "
                     f"q_len == decode_q_len ({decode_q_len})")

  entries = seq_lens // compression_ratio
  need = -(-entries // page_size)
  min_cols = max(int(need.max(initial=0)), 1)
  pages_per_seq = min_cols if pages_per_seq is None else pages_per_seq
  if pages_per_seq < min_cols:
    raise ValueError(f"pages_per_seq ({pages_per_seq}) < pages the longest "
                     f"sequence needs ({min_cols})")

  used = int(need.sum())
  rng = np.random.default_rng(seed)
  if allocation not in ("contiguous", "shuffled", "fragmented"):
    raise ValueError(f"unknown allocation {allocation!r}")
  pool = 2 * used if allocation == "fragmented" else used
  physical = (np.sort(rng.choice(pool, size=used, replace=False))
              if allocation == "fragmented" else np.arange(used))
  if allocation != "contiguous":
    physical = rng.permutation(physical)
  need_pages = max(pool + extra_pages, 1)
  if total_num_pages is None:
    total_num_pages = need_pages
  elif total_num_pages < need_pages:
    raise ValueError(f"total_num_pages ({total_num_pages}) < pages the "
                     f"allocation needs ({need_pages})")

  table = np.zeros((max_num_seqs, pages_per_seq), np.int32)
  cursor = 0
  for b in range(n):
    table[b, :need[b]] = physical[cursor:cursor + need[b]]
    cursor += need[b]

  seq_lens_full = np.zeros(max_num_seqs, np.int32)
  seq_lens_full[:n] = seq_lens
  cu = np.zeros(max_num_seqs + 1, np.int32)
  cu[1:n + 1] = np.cumsum(q_lens)
  cu[n + 1:] = cu[n]
  total_q = int(cu[n])
  num_tokens = max(total_q, 1) if num_tokens is None else num_tokens
  if num_tokens < total_q:
    raise ValueError(f"num_tokens ({num_tokens}) < query tokens ({total_q})")
  return RaggedBatch(q_lens.astype(np.int32), seq_lens_full, cu,
                     distribution, table.reshape(-1), page_size,
                     compression_ratio, num_tokens, total_num_pages,
                     int(decode_q_len))


def make_mixed_batch(*, decode: Sequence[int] = (),
                     prefill: Sequence[tuple[int, int]] = (),
                     mixed: Sequence[tuple[int, int]] = (),
                     decode_q_len: int = TopkCall.decode_q_len,
                     **kwargs) -> RaggedBatch:
  """A batch from its three ranges: decode seq_lens (`decode_q_len` query
  rows each), prefill and mixed (q_len, seq_len) pairs; `make_batch`'s
  keyword arguments."""
  pairs = [(decode_q_len, s) for s in decode] + list(prefill) + list(mixed)
  i, j = len(decode), len(decode) + len(prefill)
  return make_batch(pairs, distribution=(i, j, len(pairs)),
                    decode_q_len=decode_q_len, **kwargs)


@dataclasses.dataclass(frozen=True, eq=False)
class IndexerInputs:
  """A batch with its queries, weights, keys and packed cache; `args`: the
  positional arguments of `streamindex_topk` (and its reference),
  `page_args` those of the page variants."""

  batch: RaggedBatch
  q: jnp.ndarray  # [num_tokens, num_heads, head_dim] (bf16 by default)
  weights: jnp.ndarray  # f32[num_tokens, num_heads]
  keys: jnp.ndarray  # f32[total_num_pages, page_size, head_dim], unquantized
  cache: jnp.ndarray | tuple  # one array, or the pair of a two-array format
  fmt: str

  args = property(lambda self: (self.q, self.weights, self.cache,
                                *self.batch.kernel_arrays()))
  page_args = property(lambda self: (
      self.q, self.weights, self.cache, *self.batch.kernel_arrays()[:3],
      jnp.int32(self.batch.num_seqs)))
  head_dim = property(lambda self: int(self.q.shape[-1]))

  def with_cache_format(self, fmt: str) -> "IndexerInputs":
    """The same keys packed in another cache format."""
    return dataclasses.replace(self, cache=_pack(self.keys, fmt), fmt=fmt)


def _pack(keys, fmt: str):
  """The cache of `keys` in `fmt`: one array, or a two-array format's tuple."""
  if fmt in cache_lib.CACHE_FORMATS:
    arrays = cache_lib.CACHE_FORMATS[fmt].pack(keys)
    return arrays[0] if len(arrays) == 1 else tuple(arrays)
  return cache_lib.pack_cache(keys, fmt)  # "f32", the reference's baseline


def make_inputs(batch: RaggedBatch, *, num_heads: int = 8, head_dim: int = 128,
                fmt: str = "fp8", seed: int = 0, q_dtype=jnp.bfloat16,
                key_distribution: Literal["gaussian", "outliers"] = "gaussian",
                outlier_channels: int = 4,
                outlier_scale: float = 20.0) -> IndexerInputs:
  """Seeded random queries, weights and keys for `batch`, with the cache:
  queries and keys standard normal ("outliers": `outlier_channels` key
  channels times `outlier_scale`), weights |N(0, 1)| / sqrt(num_heads);
  padding rows zero."""
  rng = np.random.default_rng(seed)
  t = batch.num_tokens
  q = rng.standard_normal((t, num_heads, head_dim), np.float32)
  w = np.abs(rng.standard_normal((t, num_heads), np.float32)) / np.sqrt(num_heads)
  live = batch.token_seq_ids() >= 0
  q[~live] = 0.0
  w[~live] = 0.0
  keys = rng.standard_normal((batch.total_num_pages, batch.page_size, head_dim),
                             np.float32)
  if key_distribution == "outliers":
    channels = rng.choice(head_dim, size=outlier_channels, replace=False)
    keys[..., channels] *= outlier_scale
  elif key_distribution != "gaussian":
    raise ValueError(f"unknown key_distribution {key_distribution!r}")
  keys = jnp.asarray(keys)
  return IndexerInputs(batch, jnp.asarray(q).astype(q_dtype), jnp.asarray(w),
                       keys, _pack(keys, fmt), fmt)
