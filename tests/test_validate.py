"""Where the kernels' contract ends: every bad input gets a clear error.

Static rules (shapes, dtypes, block sizes, options) are tried through the
public kernels, `streamidx.streamindex_topk` / `streamindex_page_topk`, on
`jax.ShapeDtypeStruct`s under `jax.eval_shape`: the `ValueError` must come at
trace time, before any `pallas_call` is built. Value rules are tried through
`si.validate_topk_inputs` / `validate_page_topk_inputs` on concrete
arrays, and through the checkify entry points inside `jit`. Every case asserts
the whole message ("<argument>: <rule> (got <what>)") and that the valid
neighbour of the bad input (the smallest change that fixes it) is accepted.
"""

from __future__ import annotations

import dataclasses
import functools
import re
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import checkify
from jax.experimental import pallas as pl

import streamidx as si
from streamidx import validate

# --- the valid inputs every case starts from --------------------------------

# Token kernel: 3 decode (seq_lens 37, 64, 20), 1 prefill-only (7, 50), 1 mixed
# (20, 90) and one padding sequence slot; ratio 4, pages of 16 entries, 3
# page-table columns (48 entries, seq_len <= 195); 6 physical pages; 32 rows.
TOKEN_BATCH = si.make_mixed_batch(
    decode=[37, 64, 20], prefill=[(7, 50)], mixed=[(20, 90)], page_size=16,
    compression_ratio=4, allocation="shuffled", max_num_seqs=6,
    pages_per_seq=3, num_tokens=32, seed=1)
TOKEN = si.make_inputs(TOKEN_BATCH, num_heads=4, fmt="fp8", seed=2)
TOKEN_KW = dict(k=8, compression_ratio=4, num_kv_pages_per_block=8,
                num_queries_per_block=(1, 8, 8), decode_req_batch_size=2)
# Page kernel: 4 sequences (3, 40), (1, 17), (12, 30), (0, 3) and a padding
# slot; pages of 16, 4 columns; 8 physical pages; 20 rows.
PAGE_BATCH = si.make_batch(
    [(3, 40), (1, 17), (12, 30), (0, 3)], page_size=16, compression_ratio=1,
    allocation="shuffled", max_num_seqs=5, num_tokens=20, pages_per_seq=4,
    seed=1)
PAGE = si.make_inputs(PAGE_BATCH, num_heads=4, fmt="bf16", seed=2)
PAGE_KW = dict(k_pages=3, num_queries_per_block=8)

NAMES = ("q", "indexer_weights", "cache_kv", "seq_lens", "page_indices",
         "cu_q_lens")
TOKEN_NAMES = NAMES + ("distribution",)
PAGE_NAMES = NAMES + ("num_seqs",)


def test_base_inputs_are_what_the_cases_assume():
  np.testing.assert_array_equal(TOKEN_BATCH.cu_q_lens, [0, 1, 2, 3, 10, 30, 30])
  np.testing.assert_array_equal(TOKEN_BATCH.seq_lens, [37, 64, 20, 50, 90, 0])
  np.testing.assert_array_equal(TOKEN_BATCH.distribution, [3, 4, 5])
  assert TOKEN_BATCH.total_num_pages == 6
  np.testing.assert_array_equal(PAGE_BATCH.cu_q_lens, [0, 3, 4, 16, 16, 16])
  assert PAGE_BATCH.total_num_pages == 8
  si.validate_topk_inputs(*TOKEN.args, **TOKEN_KW)
  si.validate_page_topk_inputs(*PAGE.page_args, **PAGE_KW)


# --- static rules -----------------------------------------------------------


def spec(x, shape=None, dtype=None):
  return jax.ShapeDtypeStruct(x.shape if shape is None else shape,
                              x.dtype if dtype is None else dtype)


def token_specs():
  return dict(zip(TOKEN_NAMES, (spec(a) for a in TOKEN.args)))


def page_specs():
  return dict(zip(PAGE_NAMES, (spec(a) for a in PAGE.page_args)))


@dataclasses.dataclass(frozen=True)
class StaticCase:
  """A bad input (`bad` edits the specs and keyword arguments) with the
  message it must raise, and its valid neighbour (`good`)."""

  id: str
  bad: Callable[[dict, dict], None]
  message: str
  good: Callable[[dict, dict], None]


def edit(**changes):
  """An editor that sets specs (ShapeDtypeStruct or (shape, dtype)) and
  keyword arguments."""

  def apply(specs, kw):
    for name, value in changes.items():
      if name in specs:
        specs[name] = (jax.ShapeDtypeStruct(*value)
                       if isinstance(value, tuple) else value)
      else:
        kw[name] = value

  return apply


NOTHING = edit()
T, H, D = TOKEN.q.shape  # 32, 4, 128
S, CACHE = 6, TOKEN.cache.shape  # (6, 4, 4, 256)
BF16, F32, U8, I32 = jnp.bfloat16, jnp.float32, jnp.uint8, jnp.int32

# Rules both kernels share, tried through the token kernel.
COMMON_STATIC = [
    StaticCase("q_not_an_array", edit(q=[[1.0]]),
               "q: must be an array (jax.Array or numpy.ndarray) (got list)",
               NOTHING),
    StaticCase("q_rank", edit(q=((T, H, 1, D), BF16)),
               "q: must have rank 3, [max_num_tokens, num_q_heads, head_dim] "
               "(got shape (32, 4, 1, 128))", NOTHING),
    StaticCase("q_dtype", edit(q=((T, H, D), jnp.float16)),
               "q: dtype must be bfloat16 or float32 (got float16)",
               edit(q=((T, H, D), F32))),
    StaticCase("q_no_rows",
               edit(q=((0, H, D), BF16), indexer_weights=((0, H), F32)),
               "q: needs at least one token row and one head (got shape "
               "(0, 4, 128))",
               edit(q=((1, H, D), BF16), indexer_weights=((1, H), F32))),
    StaticCase("q_head_dim", edit(q=((T, H, 0), BF16)),
               "q: head_dim (last axis) must be positive (got 0)",
               # head_dim below 128 is padded to 128 lanes, as upstream does
               edit(q=((T, H, 64), BF16))),
    StaticCase("indexer_weights_rank", edit(indexer_weights=((T,), F32)),
               "indexer_weights: must have rank 2, [max_num_tokens, "
               "num_q_heads] (got shape (32,))", NOTHING),
    StaticCase("indexer_weights_dtype", edit(indexer_weights=((T, H), I32)),
               "indexer_weights: must be floating point (got int32)",
               edit(indexer_weights=((T, H), BF16))),
    StaticCase("indexer_weights_shape_vs_q",
               edit(indexer_weights=((T, H + 1), F32)),
               "indexer_weights: shape must be q's [max_num_tokens, "
               "num_q_heads] = (32, 4) (got (32, 5))", NOTHING),
    StaticCase("cache_rank", edit(cache_kv=((6, 16, 256), U8)),
               "cache_kv: must have rank 4, [total_num_pages, "
               "page_size_per_kv_packing, kv_packing, lkv_dim] (got shape "
               "(6, 16, 256))", NOTHING),
    StaticCase("cache_dtype", edit(cache_kv=((6, 16, 1, 128), F32)),
               "cache_kv: dtype must be uint8 (packed FP8) or bfloat16 (got "
               "float32)", edit(cache_kv=((6, 8, 2, 128), BF16))),
    StaticCase("cache_kv_packing", edit(cache_kv=((6, 8, 2, 256), U8)),
               "cache_kv: axis 2 (kv_packing) must be 4 for a uint8 cache "
               "(got 2)", NOTHING),
    StaticCase("cache_no_pages", edit(cache_kv=((0, 4, 4, 256), U8)),
               "cache_kv: needs at least one page of at least one row (got "
               "shape (0, 4, 4, 256))", edit(cache_kv=((1, 4, 4, 256), U8))),
    StaticCase("cache_lkv_multiple_of_128", edit(cache_kv=((6, 4, 4, 200), U8)),
               "cache_kv: lkv_dim (last axis) must be a multiple of 128 (got "
               "200)", edit(cache_kv=((6, 4, 4, 384), U8))),
    StaticCase("cache_fp8_record_width", edit(cache_kv=((6, 4, 4, 128), U8)),
               "cache_kv: an FP8 record needs 128 value bytes (head_dim 128 "
               "padded to 128 lanes, as the kernel pads q) and the e8m0 scale "
               "at byte 128: 129 bytes (got lkv_dim 128)", NOTHING),
    StaticCase("cache_fp8_record_width_head_dim_64",
               edit(q=((T, H, 64), BF16), cache_kv=((6, 4, 4, 128), U8)),
               "cache_kv: an FP8 record needs 128 value bytes (head_dim 64 "
               "padded to 128 lanes, as the kernel pads q) and the e8m0 scale "
               "at byte 128: 129 bytes (got lkv_dim 128)",
               edit(q=((T, H, 64), BF16))),
    StaticCase("cache_bf16_record_width",
               edit(q=((T, H, 256), BF16), cache_kv=((6, 8, 2, 128), BF16)),
               "cache_kv: a bf16 record needs 256 values (head_dim 256 padded "
               "to 128 lanes, as the kernel pads q) (got lkv_dim 128)",
               edit(q=((T, H, 256), BF16), cache_kv=((6, 8, 2, 256), BF16))),
    StaticCase("seq_lens_dtype", edit(seq_lens=((S,), F32)),
               "seq_lens: must be int32 (got float32)", NOTHING),
    StaticCase("seq_lens_rank", edit(seq_lens=((S, 1), I32)),
               "seq_lens: must have rank 1, [max_num_seqs] (got shape (6, 1))",
               NOTHING),
    StaticCase("seq_lens_empty",
               edit(seq_lens=((0,), I32), cu_q_lens=((1,), I32)),
               "seq_lens: needs at least one sequence slot (got shape (0,))",
               edit(seq_lens=((1,), I32), cu_q_lens=((2,), I32),
                    page_indices=((3,), I32))),
    StaticCase("page_indices_dtype", edit(page_indices=((18,), jnp.int16)),
               "page_indices: must be int32 (got int16)", NOTHING),
    StaticCase("page_indices_vs_seq_lens", edit(page_indices=((19,), I32)),
               "page_indices: length must be a positive multiple of "
               "max_num_seqs (6), one row of pages per sequence (got 19)",
               edit(page_indices=((24,), I32))),
    StaticCase("cu_q_lens_vs_seq_lens", edit(cu_q_lens=((6,), I32)),
               "cu_q_lens: length must be len(seq_lens) + 1 = 7 (got 6)",
               NOTHING),
    StaticCase("cu_q_lens_dtype", edit(cu_q_lens=((7,), jnp.uint32)),
               "cu_q_lens: must be int32 (got uint32)", NOTHING),
    StaticCase("causal_rule", edit(causal_rule="exact"),
               "causal_rule: must be one of ('model', 'seed') (got 'exact')",
               edit(causal_rule="seed")),
]

TOKEN_STATIC = COMMON_STATIC + [
    StaticCase("distribution_length", edit(distribution=((2,), I32)),
               "distribution: must have length 3: (i, j, n) (got length 2)",
               NOTHING),
    StaticCase("distribution_dtype", edit(distribution=((3,), F32)),
               "distribution: must be int32 (got float32)", NOTHING),
    StaticCase("k_zero", edit(k=0), "k: must be a positive int (got 0)",
               edit(k=1)),
    StaticCase("k_float", edit(k=8.0), "k: must be a positive int (got 8.0)",
               edit(k=8)),
    StaticCase("k_bool", edit(k=True), "k: must be a positive int (got True)",
               edit(k=1)),
    StaticCase("compression_ratio_zero", edit(compression_ratio=0),
               "compression_ratio: must be a positive int (got 0)",
               edit(compression_ratio=1)),
    StaticCase("decode_req_batch_size_zero", edit(decode_req_batch_size=0),
               "decode_req_batch_size: must be a positive int (got 0)",
               edit(decode_req_batch_size=1)),
    StaticCase("vmem_limit_bytes_zero", edit(vmem_limit_bytes=0),
               "vmem_limit_bytes: must be a positive int (got 0)",
               edit(vmem_limit_bytes=None)),
    StaticCase("kv_block_not_multiple_of_128", edit(num_kv_pages_per_block=4),
               "num_kv_pages_per_block: page_size * num_kv_pages_per_block "
               "must be a multiple of 128 (TPU DMA tiles) for the decode case "
               "(got 16 * 4 = 64)", edit(num_kv_pages_per_block=16)),
    StaticCase("kv_block_prefill_case",
               edit(num_kv_pages_per_block=(8, 12, 8)),
               "num_kv_pages_per_block: page_size * num_kv_pages_per_block "
               "must be a multiple of 128 (TPU DMA tiles) for the prefill "
               "case (got 16 * 12 = 192)",
               edit(num_kv_pages_per_block=(8, 16, 8))),
    StaticCase("kv_block_pair", edit(num_kv_pages_per_block=(8, 8)),
               "num_kv_pages_per_block: must be a positive int or a (decode, "
               "prefill, mixed) tuple of three positive ints (got (8, 8))",
               edit(num_kv_pages_per_block=(8, 8, 8))),
    StaticCase("kv_block_numpy_int",
               edit(num_kv_pages_per_block=np.int64(8)),
               "num_kv_pages_per_block: must be a Python int or a (decode, "
               "prefill, mixed) tuple; a NumPy integer is not accepted, pass "
               "int(...) (got int64 8)", edit(num_kv_pages_per_block=8)),
    StaticCase("q_block_zero", edit(num_queries_per_block=(1, 0, 8)),
               "num_queries_per_block[1]: must be a positive int (got 0)",
               edit(num_queries_per_block=(1, 1, 8))),
]

PAGE_STATIC = [
    StaticCase("q_dtype", edit(q=((20, 4, 128), jnp.float16)),
               "q: dtype must be bfloat16 or float32 (got float16)", NOTHING),
    StaticCase("num_seqs_not_scalar", edit(num_seqs=((1,), I32)),
               "num_seqs: must be a scalar (got shape (1,))", NOTHING),
    StaticCase("num_seqs_float", edit(num_seqs=((), F32)),
               "num_seqs: must be an integer (got dtype float32)", NOTHING),
    StaticCase("k_pages_zero", edit(k_pages=0),
               "k_pages: must be a positive int (got 0)", edit(k_pages=1)),
    StaticCase("k_pages_past_columns", edit(k_pages=5),
               "k_pages: must be <= pages_per_seq (4), the page-table columns "
               "per sequence (got 5)", edit(k_pages=4)),
    StaticCase("compression_ratio_not_1", edit(compression_ratio=2),
               "compression_ratio: page mode supports compression_ratio == 1 "
               "only (GLM); use streamindex_page_topk_ref for other ratios "
               "(got 2)", edit(compression_ratio=1)),
    StaticCase("compression_ratio_zero", edit(compression_ratio=0),
               "compression_ratio: must be a positive int (got 0)",
               edit(compression_ratio=1)),
    StaticCase("kv_block_not_128", edit(num_kv_pages_per_block=64),
               "num_kv_pages_per_block: page mode requires exactly 128 (one "
               "lane row of pooled pages per block) (got 64)",
               edit(num_kv_pages_per_block=128)),
    StaticCase("q_block_tuple", edit(num_queries_per_block=(8, 8, 8)),
               "num_queries_per_block: must be a positive int (got (8, 8, 8))",
               edit(num_queries_per_block=16)),
    StaticCase("vmem_limit_bytes_negative", edit(vmem_limit_bytes=-1),
               "vmem_limit_bytes: must be a positive int (got -1)",
               edit(vmem_limit_bytes=None)),
    # streamidx.blocks.check_page_rows: 256 rows x 4 heads x 128 pages x 16
    # entries x 4 B = 8 MiB, summed over heads 2 MiB (of 1 MiB).
    StaticCase("q_block_past_the_page_score_bounds",
               edit(num_queries_per_block=256),
               "num_queries_per_block: page mode's f32 scores of one KV block "
               "must be <= 32.00 MiB over all heads (query rows x num_q_heads "
               "x 128 pages x page_size x 4 B) and <= 1.00 MiB summed over "
               "heads (query rows x 128 x page_size x 4 B): GLM's row, the "
               "work the compiler unrolls (streamidx.blocks.PAGE_BLOCK_SOURCE)"
               ": at most 128 query rows at 4 heads and page_size 16 (got "
               "256: score block 8.00 MiB (of 32.00 MiB), summed block 2.00 MiB (of "
               "1.00 MiB))",
               edit(num_queries_per_block=128)),
]


def exactly(message):
  """`pytest.raises(match=...)` for the whole message (jax may append a note
  about its filtered traceback on a line of its own)."""
  return f"^{re.escape(message)}(\n|$)"


def _applied(case_edit, specs, kw):
  specs, kw = dict(specs), dict(kw)
  case_edit(specs, kw)
  return specs, kw


@pytest.fixture
def no_kernel_built(monkeypatch):
  """Fails the test if a `pallas_call` is built."""

  def refuse(*args, **kwargs):
    raise AssertionError("a pallas_call was built before the input check")

  monkeypatch.setattr(pl, "pallas_call", refuse)


@pytest.mark.parametrize("case", TOKEN_STATIC, ids=lambda c: c.id)
def test_token_kernel_static_rule(case, no_kernel_built):
  specs, kw = _applied(case.bad, token_specs(), TOKEN_KW)
  with pytest.raises(ValueError, match=exactly(case.message)):
    jax.eval_shape(functools.partial(si.streamindex_topk, **kw),
                   *specs.values())
  specs, kw = _applied(case.good, token_specs(), TOKEN_KW)
  call, arrays = si.streamindex_topk.bind(*specs.values(), **kw)
  validate.static_validate(call, *arrays)


@pytest.mark.parametrize("case", PAGE_STATIC, ids=lambda c: c.id)
def test_page_kernel_static_rule(case, no_kernel_built):
  specs, kw = _applied(case.bad, page_specs(), PAGE_KW)
  with pytest.raises(ValueError, match=exactly(case.message)):
    jax.eval_shape(functools.partial(si.streamindex_page_topk, **kw),
                   *specs.values())
  specs, kw = _applied(case.good, page_specs(), PAGE_KW)
  call, arrays = si.streamindex_page_topk.bind(*specs.values(), **kw)
  validate.static_validate(call, *arrays)


def test_missing_block_sizes_come_from_the_table(no_kernel_built):
  specs = list(token_specs().values())
  call = si.streamindex_topk.call(*specs, k=8, compression_ratio=4)
  row = si.block_sizes("vendored", cache_format="fp8",
                       num_heads=int(specs[0].shape[1]),
                       page_size=int(specs[2].shape[1] * specs[2].shape[2]))
  assert call.block_source == row.source
  spelled = si.streamindex_topk.call(*specs, k=8, compression_ratio=4,
                                     **{n: row.kwargs()[n] for n in (
                                         "num_kv_pages_per_block",
                                         "num_queries_per_block")})
  assert spelled == call and hash(spelled) == hash(call)  # one program
  # A call description without block sizes is refused by the driver.
  _, arrays = si.streamindex_topk.bind(*specs, k=8, compression_ratio=4)
  with pytest.raises(ValueError, match="^num_kv_pages_per_block and "
                     "num_queries_per_block must be specified"):
    validate.static_validate(si.TopkCall(k=8, compression_ratio=4), *arrays)


@pytest.mark.parametrize("mode", ["token", "page"])
def test_kernels_trace_the_valid_neighbours(mode):
  # The neighbours above pass the validator; here the whole kernel traces
  # (every pallas_call built) on two of them and on the base inputs.
  if mode == "token":
    fn = si.streamindex_topk
    base, kw = token_specs(), TOKEN_KW
    neighbours = [NOTHING, edit(num_kv_pages_per_block=(8, 16, 8)),
                  edit(q=((T, H, D), F32), vmem_limit_bytes=None)]
    want = (T, TOKEN_KW["k"])
  else:
    fn = si.streamindex_page_topk
    base, kw = page_specs(), PAGE_KW
    neighbours = [NOTHING, edit(k_pages=4), edit(vmem_limit_bytes=None)]
    want = (20, None)
  for good in neighbours:
    specs, kw2 = _applied(good, base, kw)
    out = jax.eval_shape(functools.partial(fn, **kw2), *specs.values())
    assert out.dtype == jnp.int32
    assert out.shape[0] == want[0]
    assert out.shape[1] == kw2.get("k", kw2.get("k_pages"))


# --- value rules ------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class ValueCase:
  """A bad value (`bad` edits the NumPy arrays) with the rule it breaks and
  the message, and its valid neighbour."""

  id: str
  rule: str
  bad: Callable[[dict], None]
  message: str
  good: Callable[[dict], None]


def at(name, index, value):
  def apply(arrays):
    arrays[name][index] = value

  return apply


def put(name, value):
  def apply(arrays):
    arrays[name] = np.asarray(value, arrays[name].dtype)

  return apply


def arrays_of(names, args):
  arrays = {}
  for name, a in zip(names, args):
    a = np.array(a) if a.dtype != jnp.bfloat16 else np.array(
        a.astype(jnp.float32))
    arrays[name] = a
  return arrays


def to_args(arrays, inputs):
  out = []
  for name, a in arrays.items():
    dtype = inputs[name].dtype
    out.append(jnp.asarray(a).astype(dtype))
  return out


NAN, INF = float("nan"), float("inf")


def _visible_max_abs(inputs, seq, num_entries, scaled=False):
  """log2 of the largest |stored key value| (times its scale) among the
  first `num_entries` entries of sequence `seq`: what `dot_range` and
  `score_range` bound the keys by."""
  values, scales = si.cache.unpack_cache_raw(inputs.cache, inputs.head_dim)
  v = np.abs(np.asarray(values, np.float64))
  if scaled and scales is not None:
    v = v * np.asarray(scales, np.float64)[..., None]
  pages = inputs.batch.page_table[seq]
  per_entry = v[pages].reshape(-1, v.shape[-1])[:num_entries]
  return float(np.log2(per_entry.max()))


def _bound_e(q_row, w_row, log2_v, log2_vs=None, weighted=True):
  """ceil(log2) of the bound the numeric rules compute for one query row."""
  l1 = np.abs(np.asarray(q_row, np.float64)).sum(axis=-1)  # [H]
  if not weighted:
    return int(np.ceil(np.log2(l1.max()) + log2_v))
  s = np.log2((np.abs(np.asarray(w_row, np.float64)) * l1).sum())
  return int(np.ceil(max(s + log2_v, s + (log2_v if log2_vs is None
                                         else log2_vs))))


# Numeric-range cases: row 0 belongs to sequence 0 in both batches (token:
# 9 entries on physical page 4; page: 40 entries on pages 5, 0, 1).
_TOKEN_V0 = _visible_max_abs(TOKEN, 0, 9)
_TOKEN_VS0 = _visible_max_abs(TOKEN, 0, 9, scaled=True)
_PAGE_V0 = _visible_max_abs(PAGE, 0, 40)


def _q_row_with(inputs, row, head, value):
  q = np.array(np.asarray(inputs.q, np.float32)[row])
  q[head] = 0.0
  q[head, 3] = value
  return q


def _w_row_with(inputs, row, head, value):
  w = np.array(np.asarray(inputs.weights, np.float32)[row])
  w[head] = value
  return w


def put_row(name, row, value):
  def apply(arrays):
    arrays[name][row] = value

  return apply


TOKEN_DOT_E = _bound_e(_q_row_with(TOKEN, 0, 1, 2.0**120), None, _TOKEN_V0,
                       weighted=False)
TOKEN_SCORE_E = _bound_e(np.asarray(TOKEN.q, np.float32)[0],
                         _w_row_with(TOKEN, 0, 1, 2.0**120), _TOKEN_V0,
                         _TOKEN_VS0)
PAGE_DOT_E = _bound_e(_q_row_with(PAGE, 0, 0, 2.0**126), None, _PAGE_V0,
                      weighted=False)
PAGE_SCORE_E = _bound_e(np.asarray(PAGE.q, np.float32)[0],
                        _w_row_with(PAGE, 0, 0, 2.0**122), _PAGE_V0)
CACHE_FINITE_RULE = (
    "cache_kv: every key value the kernel reads (the first padded_head_dim = "
    "128 of each record) must be finite for the entries a query sees (entry "
    "< seq_len // compression_ratio of a sequence with queries): an e4m3 NaN "
    "byte (0x7f, 0xff) or a bf16 NaN/inf (MXFP4's e2m1 codes are all finite) "
    "makes the score NaN, and NaN ranks first; the dense FP8 pair stores +0 "
    "for -0 (no byte 0x80: the lean kernel reads it as e4m3b11fnuz on "
    "v5e/v6e, where 0x80 is NaN; `streamidx.pack_dense_fp8_cache` never "
    "writes it)")
SCALE_RULE = (
    "cache_kv: every FP8 record (MXFP4: 32-value group) a query sees needs an "
    "e8m0 scale byte in [1, 254] (2**-126 .. 2**127): byte 0 (2**-127) is "
    "subnormal in float32 and is flushed to zero where the kernel applies "
    "it, byte 255 is NaN")
DOT_RULE = (
    "q: each head's dot product with a key it sees must stay below 2**127 "
    "(half the float32 maximum): the check bounds |q[t, h] . k[s]| by "
    "||q[t, h]||_1 * max_d |k[s, d]| (stored key values); past it the dot "
    "can overflow to inf, and inf times a weight of 0 is NaN")
SCORE_RULE = (
    "indexer_weights: each score must stay below 2**127 (half the float32 "
    "maximum), before and after the FP8 scale: the check bounds it by sum_h "
    "|w[t, h]| * ||q[t, h]||_1 * max_d |k[s, d]| (times the record's scale)")
D_MSG = "distribution: must be ordered 0 <= i <= j <= n <= max_num_seqs (6)"
PAGE_IDX_RULE = ("page_indices: every slot must name a page of cache_kv, in "
                 "[0, total_num_pages = {}) (the kernel silently clamps "
                 "indices past the cache to the last page and prefetches "
                 "unused slots too)")
ORDER_RULE = ("cu_q_lens: must be non-decreasing over its whole length (query"
              " lengths are >= 0; slots past the n sequences repeat "
              "cu_q_lens[n])")
Q_LEN_RULE = ("seq_lens: each sequence's q_len (cu_q_lens[b + 1] - "
              "cu_q_lens[b]) must be <= its seq_len: its queries are its last "
              "q_len tokens")
COLUMNS_RULE = ("page_indices: too few page-table columns: every sequence "
                "needs pages_per_seq ({}) >= ceil((seq_len // "
                "compression_ratio) / page_size)")

TOKEN_VALUE = [
    ValueCase("i_after_j", "distribution_order", put("distribution", [4, 3, 5]),
              f"{D_MSG} (got (i, j, n) = (4, 3, 5))",
              put("distribution", [3, 3, 5])),
    ValueCase("n_past_max_num_seqs", "distribution_order",
              put("distribution", [3, 4, 7]),
              f"{D_MSG} (got (i, j, n) = (3, 4, 7))",
              # the padding slot (q_len 0, seq_len 0) as a mixed sequence
              put("distribution", [3, 4, 6])),
    ValueCase("negative_i", "distribution_order",
              put("distribution", [-1, 4, 5]),
              f"{D_MSG} (got (i, j, n) = (-1, 4, 5))",
              # decode sequences may run in the prefill path
              put("distribution", [0, 4, 5])),
    ValueCase("prefill_sequence_in_decode_range", "decode_q_len",
              put("distribution", [4, 4, 5]),
              "cu_q_lens / distribution: every sequence of the decode range "
              "[0, i) must have exactly decode_q_len = 1 query rows "
              "(cu_q_lens[b + 1] - cu_q_lens[b]; decode_q_len > 1 is gamma "
              "+ 1 under speculative decoding) (got i = 4, sequence 3 has "
              "q_len 7)",
              put("distribution", [3, 3, 5])),
    ValueCase("cu_q_lens_not_from_0", "cu_q_lens_start",
              put("cu_q_lens", [1, 2, 3, 4, 11, 31, 31]),
              "cu_q_lens: must start at 0 (got cu_q_lens[0] = 1)",
              put("cu_q_lens", [0, 1, 2, 3, 11, 31, 31])),
    ValueCase("cu_q_lens_decreasing", "cu_q_lens_order",
              at("cu_q_lens", 4, 31),
              f"{ORDER_RULE} (got cu_q_lens[4] = 31 > cu_q_lens[5] = 30)",
              at("cu_q_lens", 4, 30)),
    ValueCase("cu_q_lens_decreasing_in_padding", "cu_q_lens_order",
              at("cu_q_lens", 6, 29),
              f"{ORDER_RULE} (got cu_q_lens[5] = 30 > cu_q_lens[6] = 29)",
              at("cu_q_lens", 6, 31)),
    ValueCase("query_rows_past_q", "cu_q_lens_fit",
              put("cu_q_lens", [0, 1, 2, 3, 10, 33, 33]),
              "cu_q_lens: the n sequences' query rows must fit in q's "
              "max_num_tokens (32) (got cu_q_lens[n = 5] = 33)",
              put("cu_q_lens", [0, 1, 2, 3, 10, 32, 32])),
    ValueCase("negative_seq_len", "seq_lens_nonnegative",
              at("seq_lens", 4, -1),
              "seq_lens: must be >= 0 for each of the n sequences (got "
              "seq_lens[4] = -1)",
              # a padding slot is never read
              at("seq_lens", 5, -1)),
    ValueCase("q_len_past_seq_len", "q_len_le_seq_len",
              at("seq_lens", 4, 19),
              f"{Q_LEN_RULE} (got sequence 4: q_len 20 > seq_len 19)",
              at("seq_lens", 4, 20)),
    ValueCase("too_few_page_columns", "page_table_columns",
              at("seq_lens", 4, 196),
              COLUMNS_RULE.format(3) + " (got sequence 4: seq_len 196 -> 49 "
              "entries -> 4 pages of 16)",
              at("seq_lens", 4, 195)),
    ValueCase("page_past_the_cache", "page_index_range",
              at("page_indices", 12, 6),
              PAGE_IDX_RULE.format(6) + " (got page_indices[12] = 6)",
              at("page_indices", 12, 5)),
    ValueCase("negative_page", "page_index_range",
              at("page_indices", 0, -1),
              PAGE_IDX_RULE.format(6) + " (got page_indices[0] = -1)",
              at("page_indices", 0, 0)),
    ValueCase("unused_slot_past_the_cache", "page_index_range",
              at("page_indices", 15, 100),
              PAGE_IDX_RULE.format(6) + " (got page_indices[15] = 100)",
              at("page_indices", 15, 0)),
    ValueCase("nan_query", "q_finite", at("q", (11, 2, 5), NAN),
              "q: must be finite on the query rows of the n sequences (got a "
              "NaN or inf in row 11)",
              # padding rows are never read
              at("q", (31, 2, 5), NAN)),
    ValueCase("inf_weight", "indexer_weights_finite",
              at("indexer_weights", (0, 1), INF),
              "indexer_weights: must be finite on the query rows of the n "
              "sequences (got a NaN or inf in row 0)",
              at("indexer_weights", (30, 1), INF)),
    ValueCase("nan_key_byte", "cache_values_finite",
              at("cache_kv", (4, 0, 0, 5), 0x7F),
              f"{CACHE_FINITE_RULE} (got sequence 0, entry 0 (physical page "
              "4, slot 0))",
              # entry 9 of page 4 is past sequence 0's 9 entries
              at("cache_kv", (4, 2, 1, 5), 0x7F)),
    ValueCase("subnormal_scale", "cache_scale_range",
              at("cache_kv", (4, 0, 0, 128), 0),
              f"{SCALE_RULE} (got sequence 0, entry 0 (physical page 4, slot "
              "0): scale byte 0)",
              at("cache_kv", (4, 0, 0, 128), 1)),
    ValueCase("dot_overflows", "dot_range",
              put_row("q", 0, _q_row_with(TOKEN, 0, 1, 2.0**120)),
              f"{DOT_RULE} (got row 0 (sequence 0): bound up to "
              f"2**{TOKEN_DOT_E})",
              put_row("q", 0, _q_row_with(TOKEN, 0, 1, 2.0**110))),
    ValueCase("weighted_sum_overflows", "score_range",
              put_row("indexer_weights", 0, _w_row_with(TOKEN, 0, 1, 2.0**120)),
              f"{SCORE_RULE} (got row 0 (sequence 0): bound up to "
              f"2**{TOKEN_SCORE_E})",
              put_row("indexer_weights", 0, _w_row_with(TOKEN, 0, 1, 2.0**100))),
]

PAGE_VALUE = [
    ValueCase("num_seqs_past_max", "num_seqs_range", put("num_seqs", 6),
              "num_seqs: must be in [0, max_num_seqs] = [0, 5] (got 6)",
              put("num_seqs", 5)),
    ValueCase("negative_num_seqs", "num_seqs_range", put("num_seqs", -1),
              "num_seqs: must be in [0, max_num_seqs] = [0, 5] (got -1)",
              put("num_seqs", 0)),
    ValueCase("cu_q_lens_not_from_0", "cu_q_lens_start",
              at("cu_q_lens", 0, -1),
              "cu_q_lens: must start at 0 (got cu_q_lens[0] = -1)",
              at("cu_q_lens", 0, 0)),
    ValueCase("cu_q_lens_decreasing", "cu_q_lens_order",
              at("cu_q_lens", 2, 17),
              f"{ORDER_RULE} (got cu_q_lens[2] = 17 > cu_q_lens[3] = 16)",
              at("cu_q_lens", 2, 16)),
    ValueCase("query_rows_past_q", "cu_q_lens_fit",
              put("cu_q_lens", [0, 3, 4, 21, 21, 21]),
              "cu_q_lens: the n sequences' query rows must fit in q's "
              "max_num_tokens (20) (got cu_q_lens[n = 4] = 21)",
              put("cu_q_lens", [0, 3, 4, 20, 20, 20])),
    ValueCase("negative_seq_len", "seq_lens_nonnegative",
              at("seq_lens", 3, -1),
              "seq_lens: must be >= 0 for each of the n sequences (got "
              "seq_lens[3] = -1)", at("seq_lens", 4, -1)),
    ValueCase("q_len_past_seq_len", "q_len_le_seq_len",
              at("seq_lens", 2, 11),
              f"{Q_LEN_RULE} (got sequence 2: q_len 12 > seq_len 11)",
              at("seq_lens", 2, 12)),
    ValueCase("too_few_page_columns", "page_table_columns",
              at("seq_lens", 0, 65),
              COLUMNS_RULE.format(4) + " (got sequence 0: seq_len 65 -> 65 "
              "entries -> 5 pages of 16)", at("seq_lens", 0, 64)),
    ValueCase("page_past_the_cache", "page_index_range",
              at("page_indices", 0, 8),
              PAGE_IDX_RULE.format(8) + " (got page_indices[0] = 8)",
              at("page_indices", 0, 7)),
    ValueCase("unused_slot_past_the_cache", "page_index_range",
              at("page_indices", 16, 8),
              PAGE_IDX_RULE.format(8) + " (got page_indices[16] = 8)",
              at("page_indices", 16, 0)),
    ValueCase("nan_query", "q_finite", at("q", (2, 0, 0), NAN),
              "q: must be finite on the query rows of the n sequences (got a "
              "NaN or inf in row 2)", at("q", (19, 0, 0), NAN)),
    ValueCase("nan_weight", "indexer_weights_finite",
              at("indexer_weights", (15, 3), NAN),
              "indexer_weights: must be finite on the query rows of the n "
              "sequences (got a NaN or inf in row 15)",
              at("indexer_weights", (16, 3), NAN)),
    ValueCase("nan_key", "cache_values_finite",
              at("cache_kv", (5, 0, 0, 3), NAN),
              f"{CACHE_FINITE_RULE} (got sequence 0, entry 0 (physical page "
              "5, slot 0))",
              # sequence 3 (page 7) has no queries: its keys are never read
              at("cache_kv", (7, 0, 0, 3), NAN)),
    ValueCase("dot_overflows", "dot_range",
              put_row("q", 0, _q_row_with(PAGE, 0, 0, 2.0**126)),
              f"{DOT_RULE} (got row 0 (sequence 0): bound up to "
              f"2**{PAGE_DOT_E})",
              put_row("q", 0, _q_row_with(PAGE, 0, 0, 2.0**115))),
    ValueCase("weighted_sum_overflows", "score_range",
              put_row("indexer_weights", 0, _w_row_with(PAGE, 0, 0, 2.0**122)),
              f"{SCORE_RULE} (got row 0 (sequence 0): bound up to "
              f"2**{PAGE_SCORE_E})",
              put_row("indexer_weights", 0, _w_row_with(PAGE, 0, 0, 2.0**100))),
]


def token_arrays(edit_fn):
  arrays = arrays_of(TOKEN_NAMES, TOKEN.args)
  edit_fn(arrays)
  return to_args(arrays, dict(zip(TOKEN_NAMES, TOKEN.args)))


def page_arrays(edit_fn):
  arrays = arrays_of(PAGE_NAMES, PAGE.page_args)
  edit_fn(arrays)
  return to_args(arrays, dict(zip(PAGE_NAMES, PAGE.page_args)))


@pytest.mark.parametrize("case", TOKEN_VALUE, ids=lambda c: c.id)
def test_token_value_rule(case):
  assert VALUE_RULE_IDS[case.rule] in case.message
  with pytest.raises(ValueError, match=exactly(case.message)):
    si.validate_topk_inputs(*token_arrays(case.bad), **TOKEN_KW)
  si.validate_topk_inputs(*token_arrays(case.good), **TOKEN_KW)


@pytest.mark.parametrize("case", PAGE_VALUE, ids=lambda c: c.id)
def test_page_value_rule(case):
  assert VALUE_RULE_IDS[case.rule] in case.message
  with pytest.raises(ValueError, match=exactly(case.message)):
    si.validate_page_topk_inputs(*page_arrays(case.bad), **PAGE_KW)
  si.validate_page_topk_inputs(*page_arrays(case.good), **PAGE_KW)


# Each rule's "<argument>: <rule>" head, with its static numbers left out.
VALUE_RULE_IDS = {
    rule_id: f"{r.argument}: {r.rule.split('{')[0]}"
    for rule_id, r in validate.VALUE_RULES.items()
}


def test_every_value_rule_has_a_case_in_each_mode():
  assert {c.rule for c in TOKEN_VALUE} == set(validate.TOPK_VALUE_RULES)
  # PAGE's cache is bf16, where the FP8 scale rule cannot fail; page mode's
  # FP8 scale case is tests/test_reliability.py's
  # test_page_validator_rejects_a_subnormal_scale.
  assert ({c.rule for c in PAGE_VALUE} | {"cache_scale_range"}
          == set(validate.PAGE_TOPK_VALUE_RULES))


def test_value_validators_run_the_static_checks_first():
  with pytest.raises(ValueError,
                     match=exactly("k: must be a positive int (got 0)")):
    si.validate_topk_inputs(*TOKEN.args, **{**TOKEN_KW, "k": 0})
  with pytest.raises(ValueError, match=r"^k_pages: must be a positive int"):
    si.validate_page_topk_inputs(*PAGE.page_args, k_pages=0)


# --- inside jit: checkify ---------------------------------------------------


def test_checked_token_kernel_runs_the_kernel_on_valid_input():
  err, idx = si.checked_streamindex_topk(*TOKEN.args, **TOKEN_KW)
  assert err.get() is None
  err.throw()  # no-op
  np.testing.assert_array_equal(idx, si.streamindex_topk(*TOKEN.args,
                                                         **TOKEN_KW))


@pytest.mark.parametrize("case", TOKEN_VALUE, ids=lambda c: c.id)
def test_checked_token_kernel_reports_the_rule_and_skips_the_kernel(case):
  err, idx = si.checked_streamindex_topk(*token_arrays(case.bad),
                                               **TOKEN_KW)
  assert err.get() == f"{case.message} (`check` failed)"
  with pytest.raises(checkify.JaxRuntimeError, match=re.escape(case.message)):
    err.throw()
  assert issubclass(checkify.JaxRuntimeError, ValueError)
  np.testing.assert_array_equal(idx, np.full((T, TOKEN_KW["k"]), -1))


def test_checked_page_kernel_runs_the_kernel_on_valid_input():
  err, idx = si.checked_streamindex_page_topk(*PAGE.page_args,
                                                    **PAGE_KW)
  assert err.get() is None
  np.testing.assert_array_equal(
      idx, si.streamindex_page_topk(*PAGE.page_args, **PAGE_KW))


@pytest.mark.parametrize("case", PAGE_VALUE, ids=lambda c: c.id)
def test_checked_page_kernel_reports_the_rule_and_skips_the_kernel(case):
  err, idx = si.checked_streamindex_page_topk(*page_arrays(case.bad),
                                                    **PAGE_KW)
  assert err.get() == f"{case.message} (`check` failed)"
  np.testing.assert_array_equal(idx, np.full((20, PAGE_KW["k_pages"]), -1))


def test_checked_kernel_inside_a_callers_jit():
  bad = token_arrays(at("page_indices", 12, 6))

  @jax.jit
  def serve_step(*args):
    err, idx = si.checked_streamindex_topk(*args, **TOKEN_KW)
    return err, idx

  err, _ = serve_step(*bad)
  assert err.get() == (PAGE_IDX_RULE.format(6) + " (got page_indices[12] = 6)"
                       " (`check` failed)")
  err, _ = serve_step(*TOKEN.args)
  assert err.get() is None


def test_check_inputs_inside_a_callers_checkify():
  def f(*args):
    ok = validate.check_inputs(*args, call=si.TopkCall(k=8,
                                                       compression_ratio=4))
    return ok

  checked = jax.jit(checkify.checkify(f, errors=checkify.user_checks))
  err, ok = checked(*token_arrays(put("distribution", [4, 3, 5])))
  assert not ok
  assert err.get().startswith(f"{D_MSG} (got (i, j, n) = (4, 3, 5))")
  err, ok = checked(*TOKEN.args)
  assert ok and err.get() is None


def test_checked_kernel_raises_static_rules_at_trace_time():
  with pytest.raises(ValueError,
                     match=exactly("k: must be a positive int (got 0)")):
    si.checked_streamindex_topk(*TOKEN.args, **{**TOKEN_KW, "k": 0})


# --- the clamp the validators exist for -------------------------------------


def test_kernel_silently_clamps_a_page_past_the_cache():
  # What `page_past_the_cache` protects against: the kernel reads the last
  # page instead and raises nothing; the validator refuses the table.
  past = token_arrays(at("page_indices", 12, 6 + 40))
  last = token_arrays(at("page_indices", 12, 5))
  np.testing.assert_array_equal(si.streamindex_topk(*past, **TOKEN_KW),
                                si.streamindex_topk(*last, **TOKEN_KW))
  with pytest.raises(ValueError, match=r"got page_indices\[12\] = 46\)$"):
    si.validate_topk_inputs(*past, **TOKEN_KW)


# --- speculative decoding (M17) ----------------------------------------------

MTP_BATCH = si.make_mixed_batch(decode=[40, 9, 100], mixed=[(1, 30)],
                                decode_q_len=2, page_size=16,
                                compression_ratio=4)
MTP = si.make_inputs(MTP_BATCH, num_heads=4, fmt="fp8", seed=3)


@pytest.mark.parametrize("bad", [0, 9, True, 2.0])
def test_decode_q_len_is_a_small_positive_int(bad, no_kernel_built):
  with pytest.raises(ValueError, match=r"^decode_q_len: must be "):
    si.streamindex_topk.call(*MTP.args, **{**TOKEN_KW, "decode_q_len": bad})


def test_decode_range_must_have_decode_q_len_rows_each():
  """One rule, eager and under checkify: a batch of 2-row decode sequences
  declared as decode_q_len 1 (or 3) is refused, naming cu_q_lens and the
  rule; declared as 2 it passes."""
  si.streamindex_topk.validate(*MTP.args, **TOKEN_KW, decode_q_len=2)
  want = ("cu_q_lens / distribution: every sequence of the decode range "
          "[0, i) must have exactly decode_q_len = {} query rows")
  for declared in (1, 3):
    with pytest.raises(ValueError, match=re.escape(want.format(declared))
                       + r".*\(got i = 3, sequence 0 has q_len 2\)"):
      si.streamindex_topk.validate(*MTP.args, **TOKEN_KW,
                                   decode_q_len=declared)
    call = si.TopkCall(k=8, compression_ratio=4, decode_q_len=declared)
    f = functools.partial(validate.check_inputs, call=call)
    err, ok = jax.jit(checkify.checkify(f, errors=checkify.user_checks))(
        *MTP.args)
    assert not ok and err.get().startswith(want.format(declared))
  with pytest.raises(ValueError, match="must have q_len == decode_q_len"):
    si.make_batch([(2, 9), (1, 8)], page_size=16, compression_ratio=4,
                  distribution=(2, 2, 2), decode_q_len=2)


# --- the inline FP8 cache ---------------------------------------------------

INLINE = ((S, CACHE[1] + 1, 4, 128), U8)  # a page's 4 value rows, its scales
INLINE_STATIC = [
    StaticCase("inline_given_the_packed_record", NOTHING,
               "cache_kv: this kernel reads the inline_fp8 cache "
               "(streamidx.cache.CACHE_FORMATS) (got the fp8 cache)",
               edit(cache_kv=INLINE)),
    StaticCase("inline_head_dim",
               edit(cache_kv=INLINE, q=((T, H, 256), BF16)),
               "q: head_dim must be <= 128 for the inline FP8 cache (its rows "
               "are 128 lanes) (got 256)",
               edit(cache_kv=INLINE, q=((T, H, 64), BF16))),
    StaticCase("inline_kv_packing", edit(cache_kv=((S, 5, 2, 128), U8)),
               "cache_kv: axis 2 (kv_packing) must be 4 (got 2)",
               edit(cache_kv=INLINE)),
    StaticCase("inline_no_scale_row", edit(cache_kv=((S, 1, 4, 128), U8)),
               "cache_kv: the inline FP8 cache needs at least one page of a "
               "value row and its scale row (got shape (6, 1, 4, 128))",
               edit(cache_kv=INLINE)),
    StaticCase("inline_page_size", edit(cache_kv=((S, 130, 4, 128), U8)),
               "cache_kv: page_size (value rows x 4) must be <= 512 for the "
               "inline FP8 cache (one row holds a page's scale bytes) (got "
               "516)", edit(cache_kv=((S, 129, 4, 128), U8))),
]


@pytest.mark.parametrize("case", INLINE_STATIC, ids=lambda c: c.id)
def test_inline_kernel_static_rule(case, no_kernel_built):
  """The inline variant's own rules, and a packed FP8 record refused by
  name (an inline array given to the vendored kernel is refused as a
  record too narrow: cache_fp8_record_width)."""
  entry = si.VARIANTS["inline"].kernel
  specs, kw = _applied(case.bad, token_specs(), TOKEN_KW)
  with pytest.raises(ValueError, match=exactly(case.message)):
    jax.eval_shape(functools.partial(entry, **kw), *specs.values())
  specs, kw = _applied(case.good, token_specs(), TOKEN_KW)
  call, arrays = entry.bind(*specs.values(), **kw)
  validate.static_validate(call, *arrays, formats=("inline_fp8",))


def test_an_inline_cache_with_a_minus_zero_byte_is_refused():
  """The inline array holds the dense pair's bytes: no 0x80 there either
  (the lean body reads it as e4m3b11fnuz NaN), and a scale byte of 255
  (NaN) is refused as the pair's."""
  arr = si.pack_inline_fp8_cache(TOKEN.keys)
  page = int(np.asarray(TOKEN.args[4])[0])  # sequence 0's first entry
  args = (TOKEN.q, TOKEN.weights, arr, *TOKEN.args[3:])
  entry = si.VARIANTS["inline"].kernel
  entry.validate(*args, **TOKEN_KW)
  bad = arr.at[page, 0, 0, 5].set(0x80)
  with pytest.raises(ValueError, match="cache_kv: .*no byte 0x80"):
    entry.validate(*args[:2], bad, *args[3:], **TOKEN_KW)
  bad = arr.at[page, arr.shape[1] - 1, 0, 0].set(255)  # entry 0's scale
  with pytest.raises(ValueError, match="cache_kv: .*byte 255 is NaN"):
    entry.validate(*args[:2], bad, *args[3:], **TOKEN_KW)
