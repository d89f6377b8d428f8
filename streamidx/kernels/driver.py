"""The one kernel driver: the wrapper pipeline every kernel body shares
(ARCHITECTURE.md, "One call, one driver", lists its stages).

    run(call, body, q, weights, cache, seq_lens, page_indices, cu_q_lens, last)

`call` is a `TopkCall` (`last` is `distribution`) or `PageCall` (`last` is
`num_seqs`), `body` a `KernelBody`, `cache` the tuple of its layout's arrays.
The stages: `_prepare` (static checks M5, q and weights prepared as
upstream's, the decode order M13, the -inf buffers), `_runs` (the launches,
M4, M6, each a `Launch` record), `_launch` (one `pallas_call`, skipped when
empty, M14) and `_select` (the top-k, M12, M15; rows restored, scores M9,
physical slots M22).
The body contract (M20): a body's `launch` receives its `Launch` and the
arrays and returns its output buffers; an output beyond the scores that a
selection reads is asked for in one place, `extra_outputs`, from the
body's `emits`. `_pipeline`
composes them in one trace (jit, `.lower`, a TPU); interpreted and called
eagerly, `_staged` jits them apart (one program per launch configuration,
an empty launch not compiled) and waits for the result (docs/limitations.md).
`checked_run` is the same call behind the value rules (checkify).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Callable

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import checkify

from streamidx import cache as cache_lib
from streamidx import modes, semantics, topk, validate
from streamidx.kernels import tpu
from streamidx.kernels.vendored import prepare_index_weights, prepare_q_inputs
from streamidx.semantics import LANES, align_to, cdiv

__all__ = ["KernelBody", "Output", "Launch", "extra_outputs", "run",
           "checked_run", "Entry", "STAGE_SCOPES"]

# The named scopes the compiled pipeline runs its stages under, so that a
# profile attributes each device op to its stage (`lab.model.profiling`);
# the selection's is `select_topk`'s own.
STAGE_SCOPES = {"fill": "streamidx_fill", "scoring": "streamidx_scoring"}


@dataclasses.dataclass(frozen=True)
class Output:
  """An output a kernel body can write beside the scores, by name.

  buffer: (num_tokens, score rows of 128 lanes per query row, score rows
    of a KV block per case) -> the buffer the driver fills before the
    launches, aliased to the output (each launch writes its own rows).
  """

  name: str
  buffer: Callable


@dataclasses.dataclass(frozen=True)
class Launch:
  """The static description of one launch: what a body's `launch` receives.

  call: the call as a launch reads it (`TopkCall.launch_view`); case:
  "decode", "decode_rest", "prefill", "mixed" (`semantics.token_launches`)
  or "page"; seq_batch_size, static_q_len, bq_sz, bkv_p,
  num_queries_per_block: upstream `run_topk_kernel`'s, for this launch;
  page_size: entries per page (`KernelBody.page_size`); interpret: False
  (compiled) or the interpreter's params; segment_pool: page mode's v4
  pooling (M15); outputs: the extra outputs asked of it (`Output.name`s of
  the body's `emits`), in the order of its buffers after the scores.
  """

  call: object
  case: str
  seq_batch_size: int
  static_q_len: int | None
  bq_sz: int
  bkv_p: int
  num_queries_per_block: int
  page_size: int
  interpret: object
  segment_pool: bool = False
  outputs: tuple[str, ...] = ()

  @property
  def page_mode(self) -> bool:
    return self.case == "page"


@dataclasses.dataclass(frozen=True)
class KernelBody:
  """A kernel body and its cache layout, as the driver needs them.

  Attributes:
    name: for error messages.
    launch: `launch(spec, q, weights, cache, prefetch, start, end, outputs)`
      -> the `outputs` buffers written (one array, or a tuple: the scores
      f32[T, rows, 128], then one per `spec.outputs`): one `pallas_call`,
      `spec` its `Launch`.
    cache_format: cache tuple -> its `streamidx.cache.CACHE_FORMATS` name.
    entries_per_element: entries an element of the first cache array's
      packing axis holds (1; MXFP4: 2, two e2m1 codes a byte); `page_size`
      is the one formula of a body's page size.
    emits: the extra `Output`s it can write (`topk.KERNEL_OUTPUTS` says
      which selection reads which); `topk_methods` follows from them.
    num_cache_arrays: how many arrays its cache layout has.
  """

  name: str
  launch: Callable
  cache_format: Callable
  entries_per_element: int = 1
  emits: tuple[Output, ...] = ()
  num_cache_arrays: int = 1

  def page_size(self, cache) -> int:
    """Entries per page: the first array's rows per page x entries per row
    group (its packing axis, u32 words of 4 bytes or 2 bf16)."""
    return cache[0].shape[1] * cache[0].shape[2] * self.entries_per_element

  @property
  def topk_methods(self) -> tuple[str, ...]:
    """The `topk_method` values its token mode takes: every method whose
    kernel outputs (`topk.KERNEL_OUTPUTS`, none for most) it emits."""
    names = {o.name for o in self.emits}
    return tuple(m for m in topk.TOPK_METHODS
                 if names.issuperset(topk.KERNEL_OUTPUTS.get(m, ())))


def extra_outputs(call, body: KernelBody) -> tuple[Output, ...]:
  """The outputs beyond the scores that `call`'s selection reads
  (`topk.KERNEL_OUTPUTS`), each of which `body` must emit: the one place a
  call asks a body for them. A ValueError names the body and the output."""
  emits = {o.name: o for o in body.emits}
  for name in topk.KERNEL_OUTPUTS.get(call.topk_method, ()):
    if name not in emits:
      raise ValueError(
          f"topk_method: {call.topk_method!r} reads the kernel output "
          f"{name!r}, which the {body.name!r} kernel body does not emit (it "
          f"emits {tuple(emits) or 'none'}; got {call.topk_method!r})")
  return tuple(emits[n] for n in topk.KERNEL_OUTPUTS.get(call.topk_method, ()))


def _geometry(call, body, cache, seq_lens, page_indices, interpret):
  """Static sizes: (page_size, pages_per_seq, score rows of 128 lanes per
  query row, M15 lane-segment pooling, page columns per page)."""
  page_size = body.page_size(cache)
  pages_per_seq = page_indices.shape[0] // seq_lens.shape[0]
  if call.mode == "token":
    num_sublanes = max(align_to(pages_per_seq, p) * page_size // LANES
                       for p in call.num_kv_pages_per_block)
    return page_size, pages_per_seq, num_sublanes, False, None
  bkv_p = call.num_kv_pages_per_block
  num_sublanes = align_to(cdiv(pages_per_seq, bkv_p) * bkv_p, LANES) // LANES
  cols_per_page = page_size // call.compression_ratio
  segment_pool = tpu.pool_by_lane_segments_for(cols_per_page, interpret)
  return page_size, pages_per_seq, num_sublanes, segment_pool, cols_per_page


def _prepare(q, indexer_weights, cache, seq_lens, page_indices, cu_q_lens,
             last, *, call, body, interpret):
  """Stages 1-2 and the decode order: (q, weights, prefetch, order, bufs),
  bufs the -inf score buffer f32[T, rows, 128], then the buffer of each
  `extra_outputs` (the block maxima for "fused_blockmax")."""
  outputs = extra_outputs(call, body)
  validate.static_validate(call, q, indexer_weights, cache, seq_lens,
                           page_indices, cu_q_lens, last,
                           topk_methods=body.topk_methods)
  num_tokens = q.shape[0]
  weights = prepare_index_weights(indexer_weights, q.dtype)
  q = prepare_q_inputs(q)
  page_size, _, num_sublanes, _, _ = _geometry(call, body, cache, seq_lens,
                                               page_indices, interpret)
  prefetch, order = (seq_lens, page_indices, cu_q_lens, cu_q_lens[:-1]), None
  if (call.mode == "token" and call.sort_decode
      and call.decode_req_batch_size > 1):  # M13
    order, _, _ = semantics.decode_order(
        seq_lens, validate.distribution_array(last)[0],
        compression_ratio=call.compression_ratio,
        bkv_sz=call.num_kv_pages_per_block[0] * page_size,
        decode_req_batch_size=call.decode_req_batch_size)
    lens, pages, q_rows = semantics.apply_decode_order(
        order, seq_lens, page_indices, cu_q_lens)
    prefetch = (lens, pages, cu_q_lens, q_rows)
  bufs = (jnp.full((num_tokens, num_sublanes, LANES), -jnp.inf, jnp.float32),)
  if outputs:  # what the selection reads beside the scores
    kv_rows = ([p * page_size // LANES for p in call.num_kv_pages_per_block]
               if call.mode == "token" else [])
    bufs += tuple(o.buffer(num_tokens, num_sublanes, kv_rows)
                  for o in outputs)
  return q, weights, prefetch, order, bufs


def _runs(call, body, cache, seq_lens, page_indices, last, interpret):
  """Stage 3, the launches: [(start, end, its `Launch`)]. start and end
  are traced when `last` is, ints or concrete arrays if not."""
  page_size, _, _, segment_pool, _ = _geometry(call, body, cache, seq_lens,
                                               page_indices, interpret)
  common = dict(call=call.launch_view(), page_size=page_size,
                interpret=interpret,
                outputs=tuple(o.name for o in extra_outputs(call, body)))
  if call.mode == "page":
    return [(0, jnp.asarray(last, jnp.int32), Launch(
        case="page", seq_batch_size=1, static_q_len=None,
        bq_sz=call.num_queries_per_block, bkv_p=call.num_kv_pages_per_block,
        num_queries_per_block=call.num_queries_per_block,
        segment_pool=segment_pool, **common))]
  kv_blocks, q_blocks = call.num_kv_pages_per_block, call.num_queries_per_block
  runs = []
  for launch in semantics.token_launches(validate.distribution_array(last),
                                         call.decode_req_batch_size,
                                         call.decode_q_len):
    c = launch.block_case
    runs.append((launch.start, launch.end, Launch(
        seq_batch_size=launch.seq_batch_size,
        static_q_len=launch.static_q_len, bq_sz=launch.bq_sz(q_blocks[c]),
        bkv_p=kv_blocks[c], num_queries_per_block=q_blocks[c],
        case=launch.case, **common)))
  return runs


def _launch(q, weights, cache, bufs, prefetch, start, end, *, body, spec):
  """Stage 4 for one launch: its `pallas_call` (`body.launch`) -> bufs."""
  out = body.launch(spec, q, weights, cache, prefetch, start, end, bufs)
  return tuple(out) if isinstance(out, (tuple, list)) else (out,)


def _select(bufs, order, cache, seq_lens, page_indices, cu_q_lens, last, *,
            call, body, interpret):
  """Stages 5-6: the top-k of the scores, rows in the caller's order; with
  `physical_slots`, the page table applied to the winners (`_slots`)."""
  num_tokens = bufs[0].shape[0]
  page_size, pages_per_seq, num_sublanes, segment_pool, cols_per_page = (
      _geometry(call, body, cache, seq_lens, page_indices, interpret))
  scores = bufs[0].reshape(num_tokens, -1)
  if call.mode == "page":
    if segment_pool:  # M15
      scores = tpu.unpermute_lane_segment_pages(scores, cols_per_page)
    scores = scores[:, :pages_per_seq]
    idx = topk.select_topk(scores, call.k, "top_k")
  elif len(bufs) > 1:  # "fused_blockmax": the kernel's block maxima
    (block_max,) = bufs[1:]
    idx = topk.select_topk(
        scores, call.k, call.topk_method,
        block_max=block_max.reshape(num_tokens, -1)[:, :num_sublanes],
        block_max_width=topk.FUSED_BLOCK_WIDTH)[:, :call.k]
  else:
    idx = topk.select_topk(scores, call.k, call.topk_method)[:, :call.k]
  top_scores = topk.scores_at(scores, idx) if call.return_scores else None
  if order is not None:  # M13: the caller's row order
    idx = semantics.restore_decode_rows(idx, order, call.decode_q_len)
    if call.return_scores:
      top_scores = semantics.restore_decode_rows(top_scores, order,
                                                 call.decode_q_len)
  if call.physical_slots:
    idx = _slots(idx, call, page_indices, cu_q_lens, last,
                 page_size if call.mode == "token" else 1)
  return (idx, top_scores) if call.return_scores else idx


def _slots(idx, call, page_indices, cu_q_lens, last, ids_per_page):
  """`physical_slots`: the caller's page table applied to the k winners of
  each row (caller's row order), a [T, k] gather after any method's
  selection (docs/topk-methods.md, "Physical slots": why not fused)."""
  num_seqs = (jnp.asarray(last, jnp.int32) if call.mode == "page"
              else validate.distribution_array(last)[2])
  seqs = semantics.row_sequences(cu_q_lens, num_seqs, idx.shape[0])
  table = page_indices.reshape(cu_q_lens.shape[0] - 1, -1)
  return cache_lib.physical_slots(idx, table, seqs, ids_per_page)


def _pipeline(q, indexer_weights, cache, seq_lens, page_indices, cu_q_lens,
              last, *, call, body):
  """The whole call in one trace (what `jax.jit`, `.lower` and TPUs run)."""
  interpret = modes.resolve_interpret()  # M1
  arrays = (q, indexer_weights, cache, seq_lens, page_indices, cu_q_lens, last)
  with jax.named_scope(STAGE_SCOPES["fill"]):
    q, weights, prefetch, order, bufs = _prepare(*arrays, call=call,
                                                 body=body, interpret=interpret)
  for start, end, spec in _runs(call, body, cache, seq_lens, page_indices,
                                last, interpret):
    def step(b, start=start, end=end, spec=spec):
      return _launch(q, weights, cache, b, prefetch, start, end, body=body,
                     spec=spec)
    with jax.named_scope(STAGE_SCOPES["scoring"]):
      if call.skip_empty_launches:  # M14: an empty range launches nothing
        bufs = lax.cond(end > start, step, lambda b: b, bufs)
      else:
        bufs = step(bufs)
  return _select(bufs, order, cache, seq_lens, page_indices, cu_q_lens, last,
                 call=call, body=body, interpret=interpret)


_STATIC = ("call", "body", "interpret")
_prepare_jit = jax.jit(_prepare, static_argnames=_STATIC)
_launch_jit = jax.jit(_launch, static_argnames=("body", "spec"))
_select_jit = jax.jit(_select, static_argnames=_STATIC)


def _staged(call, body, q, indexer_weights, cache, seq_lens, page_indices,
            cu_q_lens, last):
  """The same pipeline, interpreted and called eagerly, its stages jitted
  apart (module docstring); each interpreted launch is waited for."""
  interpret = modes.resolve_interpret()
  arrays = (q, indexer_weights, cache, seq_lens, page_indices, cu_q_lens, last)
  q, weights, prefetch, order, bufs = _prepare_jit(*arrays, call=call,
                                                   body=body,
                                                   interpret=interpret)
  for start, end, spec in _runs(call, body, cache, seq_lens, page_indices,
                                last, interpret):
    if int(end) > int(start) or not call.skip_empty_launches:
      bufs = jax.block_until_ready(_launch_jit(
          q, weights, cache, bufs, prefetch, jnp.asarray(start, jnp.int32),
          jnp.asarray(end, jnp.int32), body=body, spec=spec))
  return _select_jit(bufs, order, cache, seq_lens, page_indices, cu_q_lens,
                     last, call=call, body=body, interpret=interpret)


_jitted = jax.jit(_pipeline, static_argnames=("call", "body"))


def _is_traced(tree) -> bool:
  return any(isinstance(leaf, jax.core.Tracer)
             for leaf in jax.tree_util.tree_leaves(tree))


def _eager_interpreted(arrays) -> bool:
  """Interpreted with concrete arrays: the staged pipeline, waited for (an
  interpreted call under a trace returns tracers, nothing to wait for)."""
  return modes.kernel_mode() == "interpreted" and not _is_traced(arrays)


def run(call, body, *arrays):
  """The kernel call: i32[T, k] indices (and f32[T, k] scores when
  `call.return_scores`). Interpreted and eager, the staged pipeline."""
  if _eager_interpreted(arrays):
    return jax.block_until_ready(_staged(call, body, *arrays))
  return _jitted(*arrays, call=call, body=body)


def _unchecked_result(call, num_tokens):
  idx = jnp.full((num_tokens, call.k), -1, jnp.int32)
  if call.return_scores:
    return idx, jnp.full((num_tokens, call.k), -jnp.inf, jnp.float32)
  return idx


def _checks(*arrays, call, body):
  """The static checks, then the value rules: (err, ok bool[])."""
  extra_outputs(call, body)
  validate.static_validate(call, *arrays, topk_methods=body.topk_methods)
  checks = functools.partial(validate.check_inputs, call=call)
  return checkify.checkify(checks, errors=checkify.user_checks)(*arrays)


def _checked_pipeline(*arrays, call, body):
  err, ok = _checks(*arrays, call=call, body=body)
  out = lax.cond(ok, lambda a: _pipeline(*a, call=call, body=body),
                 lambda a: _unchecked_result(call, arrays[0].shape[0]), arrays)
  return err, out


_checked_jitted = jax.jit(_checked_pipeline, static_argnames=("call", "body"))
_checks_jit = jax.jit(_checks, static_argnames=("call", "body"))


def checked_run(call, body, *arrays):
  """`run` behind the value rules (`validate.VALUE_RULES`), usable in `jit`.

  Returns (err, out): `err` a `checkify.Error` (`err.throw()` raises the
  first broken rule's message, `err.get()` returns it, None when all hold);
  `out` as `run`'s when every rule holds, all -1 (scores -inf) when one
  fails: the kernel is not launched then (`lax.cond`; interpreted and
  eager, the rules are evaluated first and the staged pipeline runs only
  when they hold).
  """
  if _eager_interpreted(arrays):
    err, ok = _checks_jit(*arrays, call=call, body=body)
    if bool(ok):
      return err, jax.block_until_ready(_staged(call, body, *arrays))
    return err, _unchecked_result(call, arrays[0].shape[0])
  return _checked_jitted(*arrays, call=call, body=body)


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
    extra_outputs(call, self.body)
    validate.validate_inputs(call, *arrays,
                             topk_methods=self.body.topk_methods)

  def _jit_method(self, name, *args, **kwargs):
    call, arrays = self.bind(*args, **kwargs)
    return getattr(self._jit, name)(*arrays, call=call, body=self.body)
