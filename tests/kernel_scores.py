"""Test helper: run a kernel and see the score matrix it ranked.

The kernels return indices only; their score matrix (the operand of the
final selection (`streamidx.topk.select`) of `streamindex_topk` and
`streamindex_page_topk`) never leaves them. `KernelWithScores` re-jits the
kernel's own Python function (the driver's pipeline,
`streamidx.kernels.driver`, unmodified) while `topk.select` is replaced by
one that also sends its operand to the host (`jax.debug.callback`). The
callback is compiled into this private jit only; `streamidx`'s own jitted
kernels are never traced with it.

`assert_kernel_matches_reference` is the parity check the race, property and
kernel tests share. Kernel and reference compute the same f32 sums in
different XLA programs, which may order or fuse them differently, so their
scores need not be bit-identical. Each is within `score_bound[t]` =
`metrics.summation_error_bound(inputs, ...)[t]` of the exact score (a bound
derived from the arithmetic, not from observed differences), so the check is:
- no NaN, nothing but -inf past the reference's columns, and the same -inf
  pattern as the reference (masking exact);
- on every visible entry of row t, |kernel - reference| <= 2 * score_bound[t];
- the kernel's indices are an exact (atol=0) top-k of the kernel's own
  scores;
- they match the reference's tie-aware (`metrics.assert_topk_match`), with
  tie tolerance 4 * max_t score_bound[t] (`metrics.summation_atol`): an entry
  one side selects and the other does not scores within that of the
  reference's k-th score.
"""

from __future__ import annotations

import contextlib

import jax
import jax.numpy as jnp
import numpy as np

import streamidx as si
from streamidx import metrics, semantics
from streamidx import topk as topk_lib
from streamidx.kernels import driver


@contextlib.contextmanager
def _tap(sink, block_max_sink=None):
  original = topk_lib.select  # the driver's selection stage

  def tapped(operand, k, method, extra=None, *, entries=None, **options):
    # f32[T, N], or the kernels' f32[T, W / 128, 128] of which the selection
    # reads each row's first `entries` (`Method.lane_rows`): the same N
    jax.debug.callback(lambda s: sink.append(
        np.asarray(s).reshape(s.shape[0], -1)[:, :entries]), operand)
    if block_max_sink is not None and method.needs == "block_max":
      # "fused_blockmax": the block maxima the kernel wrote.
      jax.debug.callback(lambda m: block_max_sink.append(np.asarray(m)),
                         extra)
    return original(operand, k, method, extra, entries=entries, **options)

  topk_lib.select = tapped
  try:
    yield
  finally:
    topk_lib.select = original


class KernelWithScores:
  """`streamindex_topk` ("token") or `streamindex_page_topk` ("page") that
  returns (indices, scores) as NumPy arrays.

  scores: f32[T, columns] for "token" (the kernel's padded columns; the
  first pages_per_seq * page_size are the reference's), f32[T,
  pages_per_seq] for "page". With `sort_decode` (the default) the kernel
  ranks the decode rows in its slot order; they are put back in the
  caller's order here (`semantics.decode_order`, as the kernel computes it),
  so that row t is token t's scores, as in the reference.
  """

  def __init__(self, mode: str, *, dense: bool = False, variant=None):
    # dense: the dense FP8 kernels (`streamidx.kernels.dense`), whose cache
    # is two arguments (cache_values, cache_scales); variant: any token
    # variant's name (its page variant for "page").
    token = si.streamindex_topk_dense if dense else si.streamindex_topk
    page = si.streamindex_page_topk_dense if dense else si.streamindex_page_topk
    if variant is not None:
      token = si.VARIANTS[variant].kernel
      twin = si.VARIANTS.get(variant + "_page")  # none: token mode only
      page = twin.kernel if twin else None
    self._mode = mode
    if mode not in ("token", "page"):
      raise ValueError(f"mode must be 'token' or 'page', got {mode!r}")
    self._entry = token if mode == "token" else page
    self._cache_args = len(self._entry.body.cache_args)
    # A function of this instance's own: jax shares traces between jit
    # objects of one function, so jitting the driver's pipeline itself could
    # reuse a trace made without the tap (or with another instance's sink).
    def traced(*args, call, body):
      return driver._pipeline(*args, call=call, body=body)  # pylint: disable=protected-access

    self._jit = jax.jit(traced, static_argnames=("call", "body"))
    self._sink: list[np.ndarray] = []
    self._block_max_sink: list[np.ndarray] = []
    # After a "fused_blockmax" call of a token kernel: the block maxima
    # it wrote, f32[T, score rows] (caller's row order); else None.
    self.block_max = None

  def __call__(self, *args, **kwargs):
    self._sink.clear()
    self._block_max_sink.clear()
    with _tap(self._sink, self._block_max_sink):
      call, arrays = self._entry.bind(*args, **kwargs)
      idx = np.asarray(self._jit(*arrays, call=call, body=self._entry.body))
    jax.effects_barrier()
    assert len(self._sink) == 1, f"{len(self._sink)} score matrices captured"
    scores = self._sink[0]
    self.block_max = (self._block_max_sink[0] if self._block_max_sink
                      else None)
    if self._mode == "token":
      scores = _caller_row_order(scores, args, kwargs, self._cache_args)
      if self.block_max is not None:
        self.block_max = _caller_row_order(self.block_max, args, kwargs,
                                           self._cache_args)
    return idx, scores


def _caller_row_order(scores, args, kwargs, cache_args):
  """The token kernel's score rows (slot order) in the caller's order."""
  d = kwargs.get("decode_req_batch_size", 4)
  if not kwargs.get("sort_decode", True) or d == 1:
    return scores
  seq_lens, distribution = args[2 + cache_args], args[5 + cache_args]
  # The cache's page size (the MXFP4 values pack 8 entries a sublane).
  page_size = si.cache.cache_pages(tuple(args[2:2 + cache_args]))[1]
  bkv_p = semantics.normalize_per_case(kwargs["num_kv_pages_per_block"],
                                       "num_kv_pages_per_block")[0]
  order, _, _ = semantics.decode_order(
      np.asarray(seq_lens), int(np.asarray(distribution)[0]),
      compression_ratio=kwargs["compression_ratio"], bkv_sz=bkv_p * page_size,
      decode_req_batch_size=d)
  # slot j holds sequence order[j]'s decode_q_len rows
  return np.asarray(semantics.restore_decode_rows(
      jnp.asarray(scores), order, kwargs.get("decode_q_len", 1)))


def assert_kernel_matches_reference(idx, scores, ref_idx, ref_scores, *,
                                    score_bound, label=""):
  """Parity of a kernel run (indices, scores) with the reference's.

  Args:
    idx: i32[T, k] the kernel's indices; scores: f32[T, columns] the score
      matrix it ranked (`KernelWithScores`).
    ref_idx: i32[T, k] the reference's indices; ref_scores: f32[T, E] its
      masked scores (E <= columns).
    score_bound: f64[T] `metrics.summation_error_bound` of the inputs (same
      compression_ratio, causal_rule and mode ("token" or "page") as the call).
    label: prefixes failure messages.

  Returns the largest |kernel - reference| score difference over visible
  entries (0.0 when the scores are bit-identical).
  """
  idx, scores = np.asarray(idx), np.asarray(scores)
  ref_idx, ref_scores = np.asarray(ref_idx), np.asarray(ref_scores)
  score_bound = np.asarray(score_bound, np.float64)
  where = f"{label}: " if label else ""
  assert score_bound.shape == (ref_scores.shape[0],), score_bound.shape
  assert not np.isnan(scores).any(), f"{where}NaN in the kernel's scores"
  entries = ref_scores.shape[1]
  assert scores.shape[1] >= entries
  tail = scores[:, entries:]
  assert np.all(tail == -np.inf), f"{where}score past the table columns"
  got = scores[:, :entries]
  visible = np.isfinite(ref_scores)
  bad_mask = np.argwhere(np.isfinite(got) != visible)
  assert not len(bad_mask), (
      f"{where}masking differs at (row, entry) {bad_mask[:5].tolist()}")
  diff = np.abs(np.where(visible, got, 0.0).astype(np.float64)
                - np.where(visible, ref_scores, 0.0).astype(np.float64))
  # Both sides are within score_bound of the exact score.
  excess = diff > 2.0 * score_bound[:, None]
  assert not excess.any(), (
      f"{where}scores differ beyond twice the summation bound at (row, "
      f"entry) {np.argwhere(excess)[:5].tolist()}")
  # The kernel's own top-k is exact for its own scores ...
  own = metrics.compare_topk(idx, _topk(got, idx.shape[1]), got)
  assert own.ok, f"{where}not a top-k of the kernel's own scores: {own.detail}"
  # ... and matches the reference's, ties within the summation atol.
  atol = 4.0 * float(score_bound.max(initial=0.0))
  metrics.assert_topk_match(idx, ref_idx, ref_scores, atol=atol, label=label)
  return float(diff.max(initial=0.0))


def _topk(scores, k):
  from streamidx import ref  # pylint: disable=g-import-not-at-top

  return np.asarray(ref.topk_from_scores(scores, k))
