"""The one kernel driver: the wrapper pipeline every kernel body shares.

    run(call, body, q, weights, cache, seq_lens, page_indices, cu_q_lens, last)

`call` is a `streamidx.call.TopkCall` (token mode; `last` is `distribution`)
or `PageCall` (page mode; `last` is `num_seqs`), `body` a `KernelBody` (the
kernel body and its cache layout), `cache` the tuple of the layout's arrays.
The pipeline, jitted once with (call, body) as its static arguments:

  1. the static checks (`streamidx.validate.static_validate`, M5);
  2. q padded to whole lanes and packed heads, the weights to f32 (upstream's
     `prepare_q_inputs` / `prepare_index_weights`);
  3. the launches: token mode `semantics.token_launches` (M4, M6), decode
     range length-sorted when `sort_decode` (M13); page mode one launch over
     the `num_seqs` sequences;
  4. each launch's `pallas_call` (`body.launch`), under `lax.cond` on its
     range being non-empty (M14);
  5. the selection (`streamidx.topk.select_topk`, M12; page mode "top_k",
     page columns restored first where v4 pooled by lane segments, M15);
  6. the caller's row order restored (M13), and the scores when
     `return_scores` (M9).

`run` is what the public entry points call; an interpreted call returns a
finished result (see `streamidx.modes`: an interpreted kernel left running
while more work is queued can hang XLA:CPU). `checked_run` is the same call
behind the value rules (checkify), for every variant alike.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Callable

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import checkify

from streamidx import modes, semantics, topk, validate
from streamidx.kernels import tpu
from streamidx.kernels.vendored import prepare_index_weights, prepare_q_inputs
from streamidx.semantics import LANES, align_to, cdiv

__all__ = ["KernelBody", "run", "checked_run", "Entry"]


@dataclasses.dataclass(frozen=True)
class KernelBody:
  """A kernel body and its cache layout, as the driver needs them.

  Attributes:
    name: for error messages.
    launch: `launch(q, weights, cache, scores, bmax, prefetch, *, start, end,
      seq_batch_size, static_q_len, bq_sz, bkv_p, num_queries_per_block,
      case, call, interpret, segment_pool)` -> scores f32[T, rows, 128] (or
      (scores, bmax) when `bmax` is not None): one `pallas_call`.
    page_size: cache tuple -> entries per page.
    cache_format: cache tuple -> its `streamidx.cache.CACHE_FORMATS` name.
    topk_methods: the `topk_method` values its token mode takes.
    block_max_rows: (score rows, KV-block rows) -> rows of block maxima,
      for a body that writes them (`topk_method="fused_blockmax"`), or None.
    num_cache_arrays: how many arrays its cache layout has.
  """

  name: str
  launch: Callable
  page_size: Callable
  cache_format: Callable
  topk_methods: tuple[str, ...] = topk.KERNEL_TOPK_METHODS
  block_max_rows: Callable | None = None
  num_cache_arrays: int = 1


def _pipeline(q, indexer_weights, cache, seq_lens, page_indices, cu_q_lens,
              last, *, call, body):
  validate.static_validate(call, q, indexer_weights, cache, seq_lens,
                           page_indices, cu_q_lens, last,
                           topk_methods=body.topk_methods)
  interpret = modes.resolve_interpret()  # M1
  num_tokens = q.shape[0]
  weights = prepare_index_weights(indexer_weights, q.dtype)
  q = prepare_q_inputs(q)
  page_size = body.page_size(cache)
  pages_per_seq = page_indices.shape[0] // seq_lens.shape[0]
  prefetch = (seq_lens, page_indices, cu_q_lens, cu_q_lens[:-1])
  order, segment_pool = None, False
  pallas = functools.partial(body.launch, q, weights, cache, call=call,
                             interpret=interpret)
  runs = []  # (start, end, the launch's pallas_call)
  if call.mode == "token":
    distribution = validate.distribution_array(last)  # a tuple too
    kv_blocks, q_blocks = call.num_kv_pages_per_block, call.num_queries_per_block
    num_sublanes = max(align_to(pages_per_seq, p) * page_size // LANES
                       for p in kv_blocks)
    if call.sort_decode and call.decode_req_batch_size > 1:  # M13
      order, _, _ = semantics.decode_order(
          seq_lens, distribution[0], compression_ratio=call.compression_ratio,
          bkv_sz=kv_blocks[0] * page_size,
          decode_req_batch_size=call.decode_req_batch_size)
      lens, pages, q_rows = semantics.apply_decode_order(
          order, seq_lens, page_indices, cu_q_lens)
      prefetch = (lens, pages, cu_q_lens, q_rows)
    for launch in semantics.token_launches(
        distribution, call.decode_req_batch_size, call.decode_q_len):
      c = launch.block_case
      runs.append((launch.start, launch.end, functools.partial(
          pallas, seq_batch_size=launch.seq_batch_size,
          static_q_len=launch.static_q_len, bq_sz=launch.bq_sz(q_blocks[c]),
          bkv_p=kv_blocks[c], num_queries_per_block=q_blocks[c],
          case=launch.case)))
  else:
    bkv_p = call.num_kv_pages_per_block
    num_sublanes = align_to(cdiv(pages_per_seq, bkv_p) * bkv_p, LANES) // LANES
    cols_per_page = page_size // call.compression_ratio
    segment_pool = tpu.pool_by_lane_segments_for(cols_per_page, interpret)
    num_seqs = jnp.asarray(last, jnp.int32)
    runs.append((0, num_seqs, functools.partial(
        pallas, seq_batch_size=1, static_q_len=None,
        bq_sz=call.num_queries_per_block, bkv_p=bkv_p,
        num_queries_per_block=call.num_queries_per_block, case="page",
        segment_pool=segment_pool)))

  fused = call.topk_method in topk.FUSED_TOPK_METHODS
  bufs = (jnp.full((num_tokens, num_sublanes, LANES), -jnp.inf, jnp.float32),)
  if fused:  # the block maxima "fused_blockmax" ranks blocks by
    rows = body.block_max_rows(num_sublanes,
                               [p * page_size // LANES for p in kv_blocks])
    bufs += (jnp.full((num_tokens, rows, LANES), -jnp.inf, jnp.float32),)

  for start, end, run_one in runs:
    def step(b, run_one=run_one, start=start, end=end):
      out = run_one(b[0], b[1] if fused else None, prefetch, start=start,
                    end=end)
      return out if fused else (out,)
    if call.skip_empty_launches:  # M14: an empty range launches nothing
      bufs = lax.cond(end > start, step, lambda b: b, bufs)
    else:
      bufs = step(bufs)

  scores = bufs[0].reshape(num_tokens, -1)
  if call.mode == "page":
    if segment_pool:  # M15
      scores = tpu.unpermute_lane_segment_pages(scores, cols_per_page)
    scores = scores[:, :pages_per_seq]
    idx = topk.select_topk(scores, call.k, "top_k")
  elif fused:
    idx = topk.select_topk(
        scores, call.k, call.topk_method,
        block_max=bufs[1].reshape(num_tokens, -1)[:, :num_sublanes],
        block_max_width=topk.FUSED_BLOCK_WIDTH)[:, :call.k]
  else:
    idx = topk.select_topk(scores, call.k, call.topk_method)[:, :call.k]
  top_scores = topk.scores_at(scores, idx) if call.return_scores else None
  if order is not None:  # M13: the caller's row order
    idx = semantics.restore_decode_rows(idx, order, call.decode_q_len)
    if call.return_scores:
      top_scores = semantics.restore_decode_rows(top_scores, order,
                                                 call.decode_q_len)
  return (idx, top_scores) if call.return_scores else idx


_jitted = jax.jit(_pipeline, static_argnames=("call", "body"))


def _is_traced(tree) -> bool:
  return any(isinstance(leaf, jax.core.Tracer)
             for leaf in jax.tree_util.tree_leaves(tree))


def _finished(fn, *args, **kwargs):
  """fn(...), waited for when it ran interpreted and is not traced."""
  interpreted = modes.kernel_mode() == "interpreted"  # the mode it traces with
  out = fn(*args, **kwargs)
  if interpreted and not _is_traced(out):
    out = jax.block_until_ready(out)
  return out


def run(call, body, *arrays):
  """The kernel call: i32[T, k] indices (and f32[T, k] scores when
  `call.return_scores`)."""
  return _finished(_jitted, *arrays, call=call, body=body)


def _unchecked_result(call, num_tokens):
  idx = jnp.full((num_tokens, call.k), -1, jnp.int32)
  if call.return_scores:
    return idx, jnp.full((num_tokens, call.k), -jnp.inf, jnp.float32)
  return idx


def _checked_pipeline(q, indexer_weights, cache, seq_lens, page_indices,
                      cu_q_lens, last, *, call, body):
  validate.static_validate(call, q, indexer_weights, cache, seq_lens,
                           page_indices, cu_q_lens, last,
                           topk_methods=body.topk_methods)
  last = (validate.distribution_array(last) if call.mode == "token"
          else jnp.asarray(last))
  args = (q, indexer_weights, cache, seq_lens, page_indices, cu_q_lens, last)
  checks = functools.partial(validate.check_inputs, call=call)
  err, ok = checkify.checkify(checks, errors=checkify.user_checks)(*args)
  out = lax.cond(ok, lambda a: _pipeline(*a, call=call, body=body),
                 lambda a: _unchecked_result(call, q.shape[0]), args)
  return err, out


_checked_jitted = jax.jit(_checked_pipeline, static_argnames=("call", "body"))


def checked_run(call, body, *arrays):
  """`run` behind the value rules (`validate.VALUE_RULES`), usable in `jit`.

  Returns (err, out): `err` a `checkify.Error` (`err.throw()` raises the
  first broken rule's message, `err.get()` returns it, None when all hold);
  `out` as `run`'s when every rule holds, all -1 (scores -inf) when one
  fails: the kernel is not launched then (`lax.cond`).
  """
  return _finished(_checked_jitted, *arrays, call=call, body=body)


class Entry:
  """A public entry point: `bind(*args, **kwargs) -> (call, arrays)` spells
  the drop-in signature; calling it runs the driver (`run`, or `checked_run`
  when `checked`). `lower`, `trace` and `eval_shape` are the jitted
  driver's, for the same arguments."""

  def __init__(self, bind, body: KernelBody, *, checked: bool = False):
    functools.update_wrapper(self, bind)
    self.bind, self.body, self.is_checked = bind, body, checked
    self._jit = _checked_jitted if checked else _jitted
    # Instance attributes: `jax.jit(entry)` (what `jax.eval_shape(entry,
    # ...)` makes) copies them onto the jitted function, so its `trace`
    # keeps the keyword arguments static.
    for name in ("lower", "trace", "eval_shape"):
      setattr(self, name, functools.partial(self._jit_method, name))

  def call(self, *args, **kwargs):
    """The `TopkCall` / `PageCall` these arguments make (block sizes from
    the table where left None; `.block_source` names the row)."""
    return self.bind(*args, **kwargs)[0]

  def __call__(self, *args, **kwargs):
    call, arrays = self.bind(*args, **kwargs)
    return (checked_run if self.is_checked else run)(call, self.body, *arrays)

  @functools.cached_property
  def checked(self) -> "Entry":
    """This entry behind the value rules: returns (err, out), see
    `checked_run`."""
    return Entry(self.bind, self.body, checked=True)

  def validate(self, *args, **kwargs) -> None:
    """Checks concrete inputs of this entry, values included
    (`streamidx.validate.validate_inputs`); raises ValueError."""
    call, arrays = self.bind(*args, **kwargs)
    validate.validate_inputs(call, *arrays,
                             topk_methods=self.body.topk_methods)

  def _jit_method(self, name, *args, **kwargs):
    call, arrays = self.bind(*args, **kwargs)
    return getattr(self._jit, name)(*arrays, call=call, body=self.body)
