"""The one kernel driver (ARCHITECTURE.md, "One call, one driver"):

    run(call, body, q, weights, cache, seq_lens, page_indices, cu_q_lens, last)

`call` is a `TopkCall` (`last` is `distribution`) or `PageCall` (`last` is
`num_seqs`), `body` a `KernelBody`, `cache` the tuple of its layout's
arrays. `_pipeline` composes the stages (`_prepare`, the `launches`, each
`_launch`, `_select`) in one trace; interpreted and called eagerly, it jits
them apart and waits for the result (docs/limitations.md). `checked_run` is
the same call behind the value rules; an `Entry` builds its call once.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
from typing import Callable

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import checkify

from streamidx import cache as cache_lib
from streamidx import modes, semantics, topk, validate
from streamidx.call import PageCall, TopkCall
from streamidx.kernels import tpu
from streamidx.kernels.vendored import prepare_index_weights, prepare_q_inputs
from streamidx.semantics import LANES

# The named scopes the compiled pipeline runs its stages under, so that a
# profile attributes each device op to its stage (`lab.model.profiling`);
# the selection's is `select_topk`'s own.
STAGE_SCOPES = {"fill": "streamidx_fill", "scoring": "streamidx_scoring"}


@dataclasses.dataclass(frozen=True)
class Output:
  """An output a kernel body can write beside the scores, by name; `buffer`
  (num_tokens, score rows of 128 lanes per query row, score rows of a KV
  block per case) -> the buffer aliased to it (each launch writes its rows)."""

  name: str
  buffer: Callable


@dataclasses.dataclass(frozen=True)
class Launch:
  """The static description of one launch: what a body's `launch` receives
  (the tiling model's `PlannedLaunch` holds one too). The block fields are
  upstream `run_topk_kernel`'s for this launch; the call's fields are the
  only ones a launch reads (calls differing in others share a compile)."""

  case: str  # "decode", "decode_rest", "prefill", "mixed" or "page"
  seq_batch_size: int
  static_q_len: int | None
  bq_sz: int
  bkv_p: int
  num_queries_per_block: int
  page_size: int  # entries per page
  compression_ratio: int  # the call's, as the next three
  causal_rule: str
  num_cores: int = 1
  vmem_limit_bytes: int | None = None
  interpret: object = False  # False (compiled) or the interpreter's params
  segment_pool: bool = False  # page mode's v4 pooling (M15)
  outputs: tuple[str, ...] = ()  # extra outputs, buffers after the scores

  page_mode = property(lambda self: self.case == "page")


@dataclasses.dataclass(frozen=True)
class KernelBody:
  """A kernel body and its cache layout, as the driver needs them. `launch`
  (spec, q, weights, cache, prefetch, start, end, outputs) -> the buffers
  written (the scores f32[T, rows, 128], then one per `spec.outputs`): one
  `pallas_call`, `spec` its `Launch`."""

  name: str  # its variants' ("<name>", "<name>_page") and errors'
  launch: Callable
  cache_formats: tuple[str, ...]  # the `CACHE_FORMATS` it reads, one layout's
  emits: tuple[Output, ...] = ()  # the extra outputs it can write
  # (spec, generation=None) -> the KV blocks a launch buffers (its scratch,
  # `semantics.launch_scratch`'s kv_slots); None: 2, double-buffered.
  kv_slots: Callable | None = None

  def variant(self, mode: str) -> str:
    """Its variant's name in `mode`: "<name>", or "<name>_page"."""
    return self.name + ("_page" if mode == "page" else "")

  # Its cache arrays' names in the drop-in signature.
  cache_args = property(
      lambda self: cache_lib.CACHE_FORMATS[self.cache_formats[0]].arrays)

  @property
  def topk_methods(self) -> tuple[str, ...]:
    """The `topk_method` values its token mode takes: every method that
    needs nothing beside the scores or an output it emits."""
    names = {None, *(o.name for o in self.emits)}
    return tuple(m for m in topk.TOPK_METHODS if topk.METHODS[m].needs in names)


def _outputs(call, body: KernelBody) -> tuple[Output, ...]:
  """The output beyond the scores that `call`'s selection reads, from
  `body.emits`."""
  needs = topk.METHODS[call.topk_method].needs
  return tuple(o for o in body.emits if o.name == needs)


def _geometry(call, cache, seq_lens, page_indices, interpret):
  """Static sizes: (page_size, pages_per_seq, score rows of 128 lanes per
  query row, M15 lane-segment pooling, page columns per page)."""
  _, page_size, pages_per_seq = cache_lib.page_geometry(cache, seq_lens,
                                                        page_indices)
  num_sublanes = semantics.score_rows(call.mode, pages_per_seq, page_size,
                                      call.num_kv_pages_per_block)
  if call.mode == "token":
    return page_size, pages_per_seq, num_sublanes, False, None
  cols_per_page = page_size // call.compression_ratio
  segment_pool = tpu.pool_by_lane_segments_for(cols_per_page, interpret)
  return page_size, pages_per_seq, num_sublanes, segment_pool, cols_per_page


def _prepare(q, indexer_weights, cache, seq_lens, page_indices, cu_q_lens,
             last, *, call, body, interpret):
  """Stages 1-2 and the decode order: (q, weights, prefetch, order, bufs),
  bufs the -inf score buffer f32[T, rows, 128] [and the block maxima's]."""
  validate.static_validate(call, q, indexer_weights, cache, seq_lens,
                           page_indices, cu_q_lens, last,
                           formats=body.cache_formats)
  num_tokens = q.shape[0]
  weights = prepare_index_weights(indexer_weights, q.dtype)
  q = prepare_q_inputs(q)
  page_size, _, num_sublanes, _, _ = _geometry(call, cache, seq_lens,
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
  kv_rows = ([p * page_size // LANES for p in call.num_kv_pages_per_block]
             if call.mode == "token" else [])
  bufs += tuple(o.buffer(num_tokens, num_sublanes, kv_rows)
                for o in _outputs(call, body))
  return q, weights, prefetch, order, bufs


def launches(call, last, *, page_size: int, interpret=False,
             segment_pool: bool = False, outputs: tuple[str, ...] = ()):
  """Stage 3, the launches of `call`: [(start, end, its `Launch`)]; `last`
  the distribution (i, j, n) (page mode: num_seqs), traced or not."""
  common = dict(page_size=page_size, interpret=interpret, outputs=outputs,
                compression_ratio=call.compression_ratio,
                causal_rule=call.causal_rule, num_cores=call.num_cores,
                vmem_limit_bytes=call.vmem_limit_bytes)
  if call.mode == "page":
    return [(0, jnp.asarray(last, jnp.int32), Launch(
        case="page", seq_batch_size=1, static_q_len=None,
        bq_sz=call.num_queries_per_block, bkv_p=call.num_kv_pages_per_block,
        num_queries_per_block=call.num_queries_per_block,
        segment_pool=segment_pool, **common))]
  kv_blocks, q_blocks = call.num_kv_pages_per_block, call.num_queries_per_block
  return [(launch.start, launch.end, Launch(
      case=launch.case, seq_batch_size=launch.seq_batch_size,
      static_q_len=launch.static_q_len,
      bq_sz=launch.bq_sz(q_blocks[launch.block_case]),
      bkv_p=kv_blocks[launch.block_case],
      num_queries_per_block=q_blocks[launch.block_case], **common))
          for launch in semantics.token_launches(
              last, call.decode_req_batch_size, call.decode_q_len)]


def _runs(call, body, cache, seq_lens, page_indices, last, interpret):
  """`launches` for the call's arrays."""
  page_size, _, _, segment_pool, _ = _geometry(call, cache, seq_lens,
                                               page_indices, interpret)
  return launches(
      call, last if call.mode == "page" else validate.distribution_array(last),
      page_size=page_size, interpret=interpret, segment_pool=segment_pool,
      outputs=tuple(o.name for o in _outputs(call, body)))


def _launch(q, weights, cache, bufs, prefetch, start, end, *, body, spec):
  """Stage 4 for one launch: its `pallas_call` (`body.launch`) -> bufs."""
  out = body.launch(spec, q, weights, cache, prefetch, start, end, bufs)
  return tuple(out) if isinstance(out, (tuple, list)) else (out,)


def _select(bufs, order, cache, seq_lens, page_indices, cu_q_lens, last, *,
            call, body, interpret):
  """Stages 5-6: the top-k of the scores, rows in the caller's order; with
  `physical_slots`, the page table applied to the winners (`_slots`)."""
  num_tokens = bufs[0].shape[0]
  page_size, pages_per_seq, _, segment_pool, cols_per_page = (
      _geometry(call, cache, seq_lens, page_indices, interpret))
  scores = bufs[0].reshape(num_tokens, -1)
  if segment_pool:  # M15
    scores = tpu.unpermute_lane_segment_pages(scores, cols_per_page)
  if call.mode == "page":
    scores = scores[:, :pages_per_seq]
  else:  # M24: the entries the page table addresses, not the KV blocks' padding
    scores = scores[:, :semantics.align_to(pages_per_seq * page_size, LANES)]
  method = topk.METHODS[call.topk_method]  # "top_k" in page mode
  extra = None
  if method.needs == "block_max":  # the kernel's block maxima (M16, M21)
    extra = bufs[1].reshape(num_tokens, -1)[:, :scores.shape[1] // LANES]
  entries = scores.shape[1]
  if call.mode == "token" and method.reads_as_written(num_tokens, entries,
                                                      call.k):
    scores = bufs[0]  # M25: as written, its first `entries` read: no relayout
  idx = topk.select(scores, call.k, method, extra, entries=entries)[:, :call.k]
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
  each row (docs/topk-methods.md, "Physical slots")."""
  num_seqs = (jnp.asarray(last, jnp.int32) if call.mode == "page"
              else validate.distribution_array(last)[2])
  seqs = semantics.row_sequences(cu_q_lens, num_seqs, idx.shape[0])
  table = page_indices.reshape(cu_q_lens.shape[0] - 1, -1)
  return cache_lib.physical_slots(idx, table, seqs, ids_per_page)


def _pipeline(q, indexer_weights, cache, seq_lens, page_indices, cu_q_lens,
              last, *, call, body, staged=False, scores_only=False):
  """The whole call in one trace; `staged` (interpreted, eager): its stages
  jitted apart, each launch waited for, an empty one not made;
  `scores_only`: stages 1-4 (`scoring`)."""
  interpret = modes.resolve_interpret()  # M1
  prepare, launch, select = ((_prepare_jit, _launch_jit, _select_jit)
                             if staged else (_prepare, _launch, _select))
  arrays = (q, indexer_weights, cache, seq_lens, page_indices, cu_q_lens, last)
  with jax.named_scope(STAGE_SCOPES["fill"]):
    q, weights, prefetch, order, bufs = prepare(*arrays, call=call,
                                                body=body, interpret=interpret)
  for start, end, spec in _runs(call, body, cache, seq_lens, page_indices,
                                last, interpret):
    def step(b, start=start, end=end, spec=spec):
      return launch(q, weights, cache, b, prefetch,
                    jnp.asarray(start, jnp.int32), jnp.asarray(end, jnp.int32),
                    body=body, spec=spec)
    with jax.named_scope(STAGE_SCOPES["scoring"]):
      if staged:
        if int(end) > int(start) or not call.skip_empty_launches:
          bufs = jax.block_until_ready(step(bufs))
      elif call.skip_empty_launches:  # M14: an empty range launches nothing
        bufs = lax.cond(end > start, step, lambda b: b, bufs)
      else:
        bufs = step(bufs)
  if scores_only:
    return bufs
  return select(bufs, order, cache, seq_lens, page_indices, cu_q_lens, last,
                call=call, body=body, interpret=interpret)


_STATIC = ("call", "body", "interpret")
_prepare_jit = jax.jit(_prepare, static_argnames=_STATIC)
_launch_jit = jax.jit(_launch, static_argnames=("body", "spec"))
_select_jit = jax.jit(_select, static_argnames=_STATIC)
_jitted = jax.jit(_pipeline, static_argnames=("call", "body"))


def _eager_interpreted(arrays) -> bool:
  """Interpreted with concrete arrays: the staged pipeline, waited for (an
  interpreted call under a trace returns tracers, nothing to wait for)."""
  return modes.kernel_mode() == "interpreted" and not any(
      isinstance(leaf, jax.core.Tracer)
      for leaf in jax.tree_util.tree_leaves(arrays))


def run(call, body, *arrays):
  """The kernel call: i32[T, k] indices (and f32[T, k] scores when
  `call.return_scores`). Interpreted and eager, the staged pipeline."""
  if _eager_interpreted(arrays):
    return jax.block_until_ready(_pipeline(*arrays, call=call, body=body,
                                           staged=True))
  return _jitted(*arrays, call=call, body=body)


def scoring(call, body, *arrays):
  """Stages 1-4 traced without the selection (jit it): the buffers the
  launches wrote, the scores f32[T, rows, 128] (decode rows in slot order,
  M13) then one per extra output; what `lab.bench.ablate` times."""
  return _pipeline(*arrays, call=call, body=body, scores_only=True)


def _unchecked_result(call, num_tokens):
  idx = jnp.full((num_tokens, call.k), -1, jnp.int32)
  if call.return_scores:
    return idx, jnp.full((num_tokens, call.k), -jnp.inf, jnp.float32)
  return idx


def _checks(*arrays, call, body):
  """The static checks, then the value rules: (err, ok bool[])."""
  validate.static_validate(call, *arrays, formats=body.cache_formats)
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
  """`run` behind the value rules (`validate.VALUE_RULES`), usable in `jit`:
  (err, out), `err` a `checkify.Error` (`err.throw()` raises the first
  broken rule's message), `out` as `run`'s when every rule holds, else all
  -1 (scores -inf) and the kernel not launched."""
  if _eager_interpreted(arrays):
    err, ok = _checks_jit(*arrays, call=call, body=body)
    if bool(ok):
      return err, jax.block_until_ready(
          _pipeline(*arrays, call=call, body=body, staged=True))
    return err, _unchecked_result(call, arrays[0].shape[0])
  return _checked_jitted(*arrays, call=call, body=body)


class Entry:
  """A public entry point: `spell(body, *arrays, **fields)` spells the
  drop-in signature (less `drop`): its positional parameters the arrays,
  its keyword-only ones the call's fields (`k_pages`: k); `bind` builds the
  call; calling it runs the driver (`run`, or `checked_run` when
  `checked`); `lower`, `trace`, `eval_shape` are the jitted driver's."""

  def __init__(self, spell, body: KernelBody, mode: str, name: str, doc=None,
               *, drop=(), checked: bool = False):
    sig = inspect.signature(spell)
    self.__signature__ = sig.replace(parameters=[
        p for p in list(sig.parameters.values())[1:] if p.name not in drop])
    self.__name__ = self.__qualname__ = name
    self.__doc__ = doc or spell.__doc__
    self.__module__ = spell.__module__
    self.spell, self.body, self.mode, self.is_checked = (spell, body, mode,
                                                         checked)
    self._init = (spell, body, mode, name, doc, drop)
    self._jit = _checked_jitted if checked else _jitted
    # Instance attributes: `jax.jit(entry)` (what `jax.eval_shape(entry,
    # ...)` makes) copies them onto the jitted function, so its `trace`
    # keeps the keyword arguments static.
    for method in ("lower", "trace", "eval_shape"):
      setattr(self, method, functools.partial(self._jit_method, method))

  variant = property(lambda self: self.body.variant(self.mode))

  def bind(self, *args, **kwargs):
    """(call, arrays) for these arguments (a TypeError for arguments the
    signature lacks)."""
    bound = self.__signature__.bind(*args, **kwargs)
    bound.apply_defaults()
    params = self.__signature__.parameters
    q, w, *cache, seq_lens, pages, cu_q_lens, last = (
        v for n, v in bound.arguments.items()
        if params[n].kind is not inspect.Parameter.KEYWORD_ONLY)
    fields = {"k" if n == "k_pages" else n: v
              for n, v in bound.arguments.items()
              if params[n].kind is inspect.Parameter.KEYWORD_ONLY}
    return bind_call(TopkCall if self.mode == "token" else PageCall,
                     self.body, (q, w, tuple(cache), seq_lens, pages,
                                 cu_q_lens, last), **fields)

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
    spell, body, mode, name, doc, drop = self._init
    return Entry(spell, body, mode, name, doc, drop=drop, checked=True)

  def validate(self, *args, **kwargs) -> None:
    """Checks concrete inputs of this entry, values included
    (`streamidx.validate.validate_inputs`); raises ValueError."""
    call, arrays = self.bind(*args, **kwargs)
    validate.validate_inputs(call, *arrays, formats=self.body.cache_formats)

  def _jit_method(self, name, *args, **kwargs):
    call, arrays = self.bind(*args, **kwargs)
    return getattr(self._jit, name)(*arrays, call=call, body=self.body)


def bind_call(cls, body: KernelBody, arrays, **fields):
  """(call, arrays): the `cls` call (`TopkCall` or `PageCall`) of an entry
  point's keyword arguments `fields` (built for `body`), block sizes left
  None from the block-size table for the arrays' format, heads, head_dim
  and page size (when their ranks are right: `validate` refuses others).
  arrays: (q, weights, cache tuple, seq_lens, page_indices, cu_q_lens,
  distribution or num_seqs)."""
  call = cls(**fields, body=body)
  q, _, cache, seq_lens, page_indices = arrays[:5]
  if not call.has_blocks and len(getattr(q, "shape", ())) == 3 and all(
      len(getattr(c, "shape", ())) == 4 - i for i, c in enumerate(cache)):
    seqs, pages = (getattr(a, "shape", ()) for a in (seq_lens, page_indices))
    pages_per_seq = (cache_lib.page_geometry(cache, seq_lens, page_indices)
                     .pages_per_seq if len(seqs) == len(pages) == 1
                     and seqs[0] else None)
    call = call.with_table_blocks(
        body.variant(call.mode),
        cache_format=cache_lib.format_of(cache), num_heads=int(q.shape[1]),
        page_size=cache_lib.cache_pages(cache)[1], head_dim=int(q.shape[2]),
        pages_per_seq=pages_per_seq)
  return call, arrays
