"""Multi-chip StreamIndex: any registered variant under `jax.shard_map`,
sequence parallel (mesh axis "data": whole sequences per device, no
communication) and context parallel (axis "context": a share of every
sequence's pages per device, the top-k lists merged exactly by `merge_topk`
over `MERGES`), or both on a 2-D mesh. The layouts, the input contract, why
a share's masks are the global ones, and an example: docs/multichip.md.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.sharding import Mesh, PartitionSpec as P

from streamidx import modes
from streamidx import variants as variants_lib
from streamidx.semantics import cdiv

MERGES = ("all_gather", "tree")
IMPLS = ("kernel", "reference")
_INT32_MAX = np.iinfo(np.int32).max


def _check_int(name, value, need, why=""):
  """`value` if an int >= need; else a ValueError naming `name` and why."""
  if not isinstance(value, int) or isinstance(value, bool) or value < need:
    what = "a positive int" if need == 1 and not why else f"an int >= {need}"
    raise ValueError(f"{name}: must be {what}{why} (got {value!r})")
  return value


def _at_least(name, value, need):  # None: what the fullest device needs
  return need if value is None else _check_int(
      name, value, need, ", what the fullest device needs")


def _check_counts(num_data, num_context):
  for name, v in (("num_data", num_data), ("num_context", num_context)):
    _check_int(name, v, 1)


def make_mesh(num_data: int = 1, num_context: int = 1, *,
              devices=None) -> Mesh:
  """A (num_data, num_context) `Mesh` over the first devices of `devices`
  (default `jax.devices()`; a TPU topology's for ahead-of-time compiles)."""
  _check_counts(num_data, num_context)
  devices = list(jax.devices() if devices is None else devices)
  need = num_data * num_context
  if len(devices) < need:
    raise ValueError(f"devices: a {num_data} x {num_context} mesh needs "
                     f"{need} devices (got {len(devices)})")
  return Mesh(np.array(devices[:need], dtype=object).reshape(
      num_data, num_context), ("data", "context"))


# ---------------------------------------------------------------------------
# The sharded layout, built from one logical batch.


@dataclasses.dataclass(frozen=True, eq=False)
class ShardedInputs:
  """A batch laid out for `sharded_topk` (module docstring): `args`, the
  variant's positional arguments stacked over the devices; D, C and P
  (`num_data`, `num_context`, `pages_per_share`); `rows` i32[T_global], each
  logical row's row in the stacked result (-1: padding); G (`cache_pages`)
  and the cache bytes each device holds."""

  variant: str
  args: tuple
  num_data: int
  num_context: int
  pages_per_share: int
  page_size: int
  rows: np.ndarray
  cache_pages: int
  cache_bytes_per_device: int

  # Entries of each sequence per context share.
  share_entries = property(lambda self: self.pages_per_share * self.page_size)

  def gather_rows(self, out) -> np.ndarray:
    """The stacked result [D * T, k] in the batch's row order (padding rows
    all -1, as a one-device call returns them)."""
    out = np.asarray(out)
    got = np.full((self.rows.shape[0],) + out.shape[1:], -1, out.dtype)
    live = self.rows >= 0
    got[live] = out[self.rows[live]]
    return got


def _class_ranges(batch, mode: str):
  n = batch.num_seqs
  if mode == "page":
    return ((0, n),)
  i, j, _ = (int(x) for x in batch.distribution)
  return ((0, i), (i, j), (j, n))


def shard_inputs(inputs, variant, *, num_data: int = 1, num_context: int = 1,
                 fmt: str | None = None, pages_per_share: int | None = None,
                 slots: int | None = None, rows: int | None = None,
                 cache_pages: int | None = None) -> ShardedInputs:
  """Lays out `inputs` (an `IndexerInputs`) for `sharded_topk`
  (docs/multichip.md): each device's pages copied, unused table slots at
  page 0. pages_per_share: default ceil(pages_per_seq / num_context);
  slots, rows, cache_pages: pad each device's sequence slots, query rows
  and cache pages to these (default: the fullest device's)."""
  v = variants_lib.get(variant)
  _check_counts(num_data, num_context)
  b = inputs.batch
  need = b.num_pages_used.astype(np.int64)
  min_share = max(1, cdiv(int(need.max(initial=0)), num_context))
  if pages_per_share is None:
    pages_per_share = max(min_share, cdiv(b.pages_per_seq, num_context))
  _check_int("pages_per_share", pages_per_share, min_share, (
      f" (the longest sequence uses {int(need.max(initial=0))} pages over "
      f"{num_context} shares)"))
  cache = v.cache_arrays(inputs, fmt)
  n = b.num_seqs
  q_lens = b.cu_q_lens[1:n + 1] - b.cu_q_lens[:n]

  # Sequences per data shard, in kernel order: decode, prefill, mixed.
  local = [[[] for _ in _class_ranges(b, v.mode)] for _ in range(num_data)]
  for ci, (lo, hi) in enumerate(_class_ranges(b, v.mode)):
    for s in range(lo, hi):  # one rotation over all classes
      local[s % num_data][ci].append(s)
  order = [[s for cls in shard for s in cls] for shard in local]
  slots = _at_least("slots", slots, max(1, max(len(o) for o in order)))
  t_loc = _at_least("rows", rows, max(
      1, max(int(sum(q_lens[s] for s in o)) for o in order)))

  row_src = np.full((num_data, t_loc), -1, np.int64)  # global row per slot
  row_of = np.full(b.num_tokens, -1, np.int32)
  seq_lens = np.zeros((num_data, slots), np.int32)
  cu = np.zeros((num_data, slots + 1), np.int32)
  dist = np.zeros((num_data, 3), np.int32)
  for d, o in enumerate(order):
    cursor = 0
    for j, s in enumerate(o):
      lo, ql = int(b.cu_q_lens[s]), int(q_lens[s])
      row_src[d, cursor:cursor + ql] = np.arange(lo, lo + ql)
      row_of[lo:lo + ql] = d * t_loc + cursor + np.arange(ql)
      cursor += ql
      seq_lens[d, j] = b.seq_lens[s]
      cu[d, j + 1] = cursor
    cu[d, len(o) + 1:] = cursor
    dist[d] = np.cumsum([len(c) for c in local[d]])  # page mode: [2] used

  table = b.page_table
  pages = [[[] for _ in range(num_context)] for _ in range(num_data)]
  local_table = np.zeros((num_data, num_context, slots, pages_per_share),
                         np.int32)
  for d, o in enumerate(order):
    for c in range(num_context):
      for j, s in enumerate(o):
        for col in range(pages_per_share):
          g = c * pages_per_share + col
          if g < need[s]:
            local_table[d, c, j, col] = len(pages[d][c])
            pages[d][c].append(int(table[s, g]))
  g_loc = _at_least("cache_pages", cache_pages,
                    max(1, max(len(p) for shard in pages for p in shard)))
  page_src = np.full((num_data, num_context, g_loc), -1, np.int64)
  for d in range(num_data):
    for c in range(num_context):
      page_src[d, c, :len(pages[d][c])] = pages[d][c]

  def take(x, src):
    src = jnp.asarray(src.reshape(-1))
    got = jnp.take(x, jnp.maximum(src, 0), axis=0)
    mask = (src >= 0).reshape((-1,) + (1,) * (x.ndim - 1))
    return jnp.where(mask, got, jnp.zeros((), x.dtype))

  q = take(inputs.q, row_src)
  weights = take(inputs.weights, row_src)
  cache_loc = tuple(take(a, page_src) for a in cache)
  last = (jnp.asarray(dist.reshape(-1)) if v.mode == "token"
          else jnp.asarray(dist[:, 2].copy()))
  args = (q, weights, *cache_loc, jnp.asarray(seq_lens.reshape(-1)),
          jnp.asarray(local_table.reshape(-1)), jnp.asarray(cu.reshape(-1)),
          last)
  per_device = sum(int(a.size) * a.dtype.itemsize for a in cache_loc) // (
      num_data * num_context)
  return ShardedInputs(v.name, args, num_data, num_context, pages_per_share,
                       int(b.page_size), row_of, g_loc, per_device)


# ---------------------------------------------------------------------------
# The exact merge of per-device top-k lists.


def merge_topk(scores, indices, k: int):
  """The top `k` (<= n) of candidate lists by (score desc, index asc), exact:
  scores f32[T, n] (-inf: none), indices i32[T, n] global, unique per row
  (-1: none) -> (f32[T, k], i32[T, k]), -inf / -1 past the candidates;
  -0.0 counts as 0.0."""
  valid = indices >= 0
  s = jnp.where(valid, jnp.where(scores == 0, 0.0, scores), -jnp.inf)
  key = jnp.where(valid, indices, _INT32_MAX)
  neg, _, idx = lax.sort((-s, key, indices.astype(jnp.int32)), dimension=1,
                         num_keys=2)
  top = -neg[:, :k]
  return top, jnp.where(top == -jnp.inf, -1, idx[:, :k])


def _pack(scores, indices):
  """(f32[T, n], i32[T, n]) -> i32[T, n, 2]: one array, one collective."""
  return jnp.stack([lax.bitcast_convert_type(scores, jnp.int32), indices],
                   axis=-1)


def _unpack(pairs):
  return lax.bitcast_convert_type(pairs[..., 0], jnp.float32), pairs[..., 1]


def _merge(scores, indices, k, axis, size, merge):
  """The exact top k over mesh axis `axis` (of `size` devices), by `merge`."""
  if merge == "all_gather":
    pairs = lax.all_gather(_pack(scores, indices), axis, axis=1, tiled=True)
    return merge_topk(*_unpack(pairs), k)
  for r in range(int(math.log2(size))):
    perm = [(c, c ^ (1 << r)) for c in range(size)]
    other_s, other_i = _unpack(lax.ppermute(_pack(scores, indices), axis, perm))
    scores, indices = merge_topk(jnp.concatenate([scores, other_s], axis=1),
                                 jnp.concatenate([indices, other_i], axis=1),
                                 k)
  return scores, indices


def merge_bytes_per_row(k: int, num_context: int, merge: str = "all_gather"
                        ) -> int:
  """Bytes one device receives per query row in the merge (f32 + i32 pairs)."""
  if merge == "all_gather":
    return 8 * k * (num_context - 1)
  if merge == "tree":
    return 8 * k * int(math.ceil(math.log2(num_context))) if num_context > 1 else 0
  raise ValueError(f"merge: must be one of {MERGES} (got {merge!r})")


# ---------------------------------------------------------------------------
# The sharded call.


def _axis_size(mesh, axis):
  return 1 if axis is None else int(mesh.shape[axis])


def sharded_topk(variant, mesh: Mesh, *, data_axis: str | None = "data",
                 context_axis: str | None = None, k: int,
                 compression_ratio: int, merge: str = "all_gather",
                 impl: str = "kernel", **static) -> Callable:
  """The variant over `mesh`, jitted: sequences split over `data_axis`,
  each sequence's entries over `context_axis` (None: not split), merged by
  `merge` (`MERGES`); `k` the variant's k / k_pages, `static` its other
  keywords; impl "reference": its exact twin, same layout and merge.
  fn(q, weights, *cache, seq_lens, page_indices, cu_q_lens, last) ->
  i32[D * T, k], on `ShardedInputs.args`."""
  v = variants_lib.get(variant)
  if data_axis is None and context_axis is None:
    raise ValueError("data_axis, context_axis: at least one must name a mesh "
                     "axis (got both None)")
  for name, ax in (("data_axis", data_axis), ("context_axis", context_axis)):
    if ax is not None and ax not in mesh.axis_names:
      raise ValueError(f"{name}: must be one of the mesh axes "
                       f"{tuple(mesh.axis_names)} or None (got {ax!r})")
  if data_axis is not None and data_axis == context_axis:
    raise ValueError(f"context_axis: must differ from data_axis (both "
                     f"{data_axis!r})")
  if merge not in MERGES:
    raise ValueError(f"merge: must be one of {MERGES} (got {merge!r})")
  if impl not in IMPLS:
    raise ValueError(f"impl: must be one of {IMPLS} (got {impl!r})")
  for name in (v.k_name, "return_scores"):
    if name in static:
      raise ValueError(f"{name}: set by sharded_topk, not in **static")
  if context_axis is not None and static.get("physical_slots"):
    raise ValueError(
        "physical_slots: not with a context_axis (the merge ranks "
        "sequence-local ids across the shares; apply "
        "streamidx.cache.physical_slots to the merged result)")
  num_context = _axis_size(mesh, context_axis)
  fn = v.kernel if impl == "kernel" else v.reference
  if (context_axis is not None and merge == "tree"
      and num_context & (num_context - 1)):
    raise ValueError(f"merge: 'tree' needs a power-of-two context axis "
                     f"(got {context_axis!r} of size {num_context})")
  call_static = {v.k_name: k, "compression_ratio": compression_ratio, **static}
  page_mode = v.mode == "page"

  def body(q, weights, *rest):
    *cache, seq_lens, page_indices, cu_q_lens, last = rest
    if page_mode:
      last = last.reshape(())
    if impl == "kernel" and modes.resolve_interpret() is not False:
      # The TPU interpreter holds every simulated device at each launch:
      # devices whose shards skip different empty launches (M14) would wait
      # for each other forever. Interpreted, every device makes them all.
      call_static["skip_empty_launches"] = False
    if context_axis is None:
      return fn(q, weights, *cache, seq_lens, page_indices, cu_q_lens, last,
                **call_static)
    share_pages = page_indices.shape[0] // seq_lens.shape[0]
    page_size = cache[0].shape[1] * cache[0].shape[2]
    if page_mode and k > share_pages:
      raise ValueError(
          f"k_pages: page-mode context parallelism needs k_pages <= the "
          f"pages of one share ({share_pages}) (got {k})")
    c = lax.axis_index(context_axis)
    lo_entries = c * share_pages * page_size
    local_lens = jnp.maximum(seq_lens - lo_entries * compression_ratio, 0)
    idx, scores = fn(q, weights, *cache, local_lens, page_indices, cu_q_lens,
                     last, return_scores=True, **call_static)
    offset = c * share_pages if page_mode else lo_entries
    gidx = jnp.where(idx >= 0, idx + offset, -1).astype(jnp.int32)
    scores = scores.astype(jnp.float32)
    return _merge(scores, gidx, k, context_axis, num_context, merge)[1]

  rows_spec = P(data_axis)
  both = tuple(a for a in (data_axis, context_axis) if a is not None)
  pages_spec = P(both if len(both) > 1 else both[0])

  @jax.jit
  def run(q, weights, *rest):
    *cache, seq_lens, page_indices, cu_q_lens, last = rest
    _check_layout(v, mesh, data_axis, context_axis, q, weights, cache,
                  seq_lens, page_indices, cu_q_lens, last)
    in_specs = ((rows_spec, rows_spec) + (pages_spec,) * len(cache)
                + (rows_spec, pages_spec, rows_spec, rows_spec))
    mapped = jax.shard_map(body, mesh=mesh, in_specs=in_specs,
                           out_specs=rows_spec, check_vma=False)
    return mapped(q, weights, *cache, seq_lens, page_indices, cu_q_lens, last)

  return run


def _check_layout(v, mesh, data_axis, context_axis, q, weights, cache,
                  seq_lens, page_indices, cu_q_lens, last):
  """Shape rules of the stacked layout; ValueError naming the argument."""
  nd = _axis_size(mesh, data_axis)
  nc = _axis_size(mesh, context_axis)

  def need(name, x, parts, what="data shards", each=None):
    if x.ndim < 1 or x.shape[0] % parts:
      raise ValueError(f"{name}: first axis must split into {parts} "
                       f"{what} (got shape {tuple(x.shape)})")
    if each is not None and x.shape[0] // parts != each:
      raise ValueError(f"{name}: needs {each} entries per data shard (got "
                       f"{x.shape[0] // parts})")
    return x.shape[0] // parts

  need("q", q, nd)
  if weights.shape[0] != q.shape[0]:
    raise ValueError(f"weights: must have q's rows ({q.shape[0]}) (got shape "
                     f"{tuple(weights.shape)})")
  if not cache:
    raise ValueError("cache: the variant takes at least one cache array")
  for a in cache:
    need("cache", a, nd * nc, "devices (data x context)")
  slots = need("seq_lens", seq_lens, nd)
  table = need("page_indices", page_indices, nd * nc, "devices")
  if table % slots:
    raise ValueError(f"page_indices: each device's table ({table}) must be "
                     f"seq_lens' {slots} slots x pages_per_share")
  need("cu_q_lens", cu_q_lens, nd, each=slots + 1)
  token = v.mode == "token"
  need("distribution" if token else "num_seqs", last, nd,
       each=3 if token else 1)
