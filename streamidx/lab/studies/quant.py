"""FP8 for the indexer, looked at closely: the e4m3 grid, power-of-two
(ue8m0) scales against exact float scales, FP8 queries, Hadamard rotation,
and the kernel's in-register unpack.

Terms:
- e4m3 (`float8_e4m3fn`): 1 sign, 4 exponent (bias 7), 3 mantissa bits; no
  infinities, one NaN pattern per sign (S.1111.111); largest finite 448.
- ue8m0 (`float8_e8m0fnu`): an unsigned 8-bit exponent, value 2**(byte - 127);
  the vendored kernel's per-record scale (`streamidx.cache`).
- exact float scale: amax / 448 as a float32, the scale that maps a record's
  largest magnitude exactly onto 448 (what a float32-scale layout can store).
- key/query variant: how a score is computed in a recall study, see
  `VARIANTS` and `variant_inputs`; `STUDY_VARIANTS` adds the Hadamard-rotated
  ones ("+H").

The recall study (`recall_study`, notebook 03, the workbook's one FP8 recall
study): recall@k of each variant against the exact float32 top-k, per query
row, over several seeds (each an independent draw of queries, weights and
keys), summarized over seeds with a t-interval (`mean_ci`).

Packing, unpacking and the ue8m0 exponent itself come from `streamidx.cache`;
this module only adds what the studies need around them.
"""

from __future__ import annotations

import dataclasses
import functools
import time

import jax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu
import jax.numpy as jnp
import numpy as np

from streamidx import batch as batch_lib
from streamidx import cache as cache_lib
from streamidx import metrics
from streamidx import ref
from streamidx.lab.studies import addressing

__all__ = [
    "E4M3_MAX",
    "e4m3_table",
    "e4m3_fields",
    "e4m3_from_fields",
    "e4m3_finite_values",
    "relative_spacing",
    "pow2",
    "quantize_float_scale",
    "quantize_ue8m0",
    "record_error",
    "scores_scale_after",
    "scores_scale_before",
    "quantize_queries_fp8",
    "hadamard",
    "rotate",
    "VARIANTS",
    "variant_inputs",
    "float64_scores",
    "unpack_block_in_kernel",
    "e4m3_summary",
    "key_records",
    "STUDY_VARIANTS",
    "MeanCI",
    "mean_ci",
    "RecallStudy",
    "recall_study",
    "scale_study",
    "scale_commutes",
]

E4M3_MAX = cache_lib.E4M3_MAX


def e4m3_table():
  """All 256 e4m3fn bit patterns and their values.

  Returns:
    (bytes u8[256], values f32[256]) with values[b] the value of pattern b
    (NaN for the two NaN patterns, -0.0 for 0x80).
  """
  b = np.arange(256, dtype=np.uint8)
  v = np.asarray(jax.lax.bitcast_convert_type(jnp.asarray(b),
                                              jnp.float8_e4m3fn)
                 .astype(jnp.float32))
  return b, v


def e4m3_fields(byte):
  """Bit fields of e4m3fn patterns: (sign, exponent, mantissa) int arrays.

  byte = sign << 7 | exponent << 3 | mantissa (4 exponent bits, bias 7;
  3 mantissa bits).
  """
  b = np.asarray(byte, np.int64)
  return b >> 7, (b >> 3) & 0xF, b & 0x7


def e4m3_from_fields(sign, exponent, mantissa) -> np.ndarray:
  """The value the e4m3fn format defines for its bit fields, f64.

  exponent 0: subnormal, (-1)**sign * 2**-6 * mantissa / 8;
  exponent 15 with mantissa 7: NaN (no infinities in the "fn" variant);
  otherwise (-1)**sign * 2**(exponent - 7) * (1 + mantissa / 8).
  Written from the format's definition, to check `e4m3_table` against.
  """
  s, e, m = (np.asarray(a, np.float64) for a in (sign, exponent, mantissa))
  sign_f = np.where(s > 0, -1.0, 1.0)
  normal = np.exp2(e - 7) * (1 + m / 8)
  sub = np.exp2(-6.0) * m / 8
  v = sign_f * np.where(e == 0, sub, normal)
  return np.where((e == 15) & (m == 7), np.nan, v)


def e4m3_finite_values(nonnegative: bool = True) -> np.ndarray:
  """Sorted distinct finite e4m3fn values, f32 (0 counted once).

  nonnegative=True: 0 and the 126 positive values (127 in all);
  False: all 253 distinct finite values.
  """
  _, v = e4m3_table()
  v = v[np.isfinite(v)]
  if nonnegative:
    v = v[v >= 0]
  return np.unique(v)


def relative_spacing(grid) -> np.ndarray:
  """(next - x) / x for each positive x of a sorted grid but the last."""
  g = np.asarray(grid, np.float64)
  g = g[g > 0]
  return (g[1:] - g[:-1]) / g[:-1]


def quantize_float_scale(x):
  """e4m3 values with an exact float32 scale per record (last axis).

  scale = amax / 448 (1 for an all-zero record), values = x / scale.

  Args:
    x: f32[..., D].
  Returns:
    (values f8e4m3fn[..., D], scales f32[...]).
  """
  x = jnp.asarray(x, jnp.float32)
  amax = jnp.max(jnp.abs(x), axis=-1)
  scale = jnp.where(amax > 0, amax / jnp.float32(E4M3_MAX), 1.0)
  return (x / scale[..., None]).astype(jnp.float8_e4m3fn), scale


def pow2(e):
  """2.0**e as f32, exactly, for int e in [-126, 127].

  (`jnp.exp2` is not exact on every backend: on CPU with jax 0.10.2,
  `jnp.exp2(-18.0) != 2**-18`.) e = -127, e8m0's smallest, is a float32
  subnormal, which XLA on CPU flushes to 0.
  """
  e = jnp.asarray(e, jnp.int32)
  return jnp.ldexp(jnp.ones(e.shape, jnp.float32), e)


def quantize_ue8m0(x):
  """`streamidx.cache.quantize_fp8` with the scale as a float: (values, 2**e)."""
  values, e = cache_lib.quantize_fp8(x)
  return values, pow2(e)


def _quantize(x, scale: str):
  """(values, per-record scale) with the "ue8m0" or the "float" scale."""
  if scale == "ue8m0":
    return quantize_ue8m0(x)
  if scale == "float":
    return quantize_float_scale(x)
  raise ValueError(f"scale must be 'ue8m0' or 'float', got {scale!r}")


def record_error(x, scale: str = "ue8m0") -> np.ndarray:
  """Relative L2 error per record, ||x - deq(q(x))|| / ||x||, f64[...].

  scale: "ue8m0" (the vendored kernel's power-of-two scale) or "float" (amax / 448).
  Records that are all zero get error 0.
  """
  x = jnp.asarray(x, jnp.float32)
  v, s = _quantize(x, scale)
  deq = np.asarray(v.astype(jnp.float32), np.float64) * np.asarray(
      s, np.float64)[..., None]
  xn = np.asarray(x, np.float64)
  num = np.linalg.norm(xn - deq, axis=-1)
  den = np.linalg.norm(xn, axis=-1)
  return np.where(den > 0, num / np.where(den > 0, den, 1.0), 0.0)


def scores_scale_after(q, w, values, scales) -> np.ndarray:
  """The kernel's order: f32 scores [T, E] = scale[e] * sum_h w ReLU(q . v).

  Args:
    q: f32[T, H, D]; w: f32[T, H]; values: f32[E, D] (e4m3 values as f32);
    scales: f32[E]. All float32 NumPy arithmetic, in a fixed order.
  """
  q, w, values, scales = (np.asarray(a, np.float32) for a in
                          (q, w, values, scales))
  s = np.einsum("thd,ed->the", q, values)
  s = np.maximum(s, np.float32(0)) * w[:, :, None]
  return s.sum(axis=1, dtype=np.float32) * scales[None, :]


def scores_scale_before(q, w, values, scales) -> np.ndarray:
  """The same scores with each key dequantized first (value * scale)."""
  keys = np.asarray(values, np.float32) * np.asarray(scales,
                                                     np.float32)[:, None]
  return scores_scale_after(q, w, keys, np.ones(keys.shape[0], np.float32))


def quantize_queries_fp8(q, weights, *, scale: str = "ue8m0",
                         granularity: str = "head"):
  """FP8 queries with their scale folded into the indexer weights.

  score = sum_h w[t,h] * ReLU(q[t,h] . k) = sum_h (w[t,h] * s) * ReLU(q8 . k)
  for q = q8 * s with s > 0, so the kernel keeps its arithmetic and only the
  weights change. DeepSeek-V3.2's reference indexer does the same: one scale
  per 128 values (here: per token and head), multiplied into the weights.

  Args:
    q: [T, H, D] queries (any float dtype).
    weights: f32[T, H].
    scale: "ue8m0" (power of two, `streamidx.cache.ue8m0_exponent`) or
      "float" (amax / 448).
    granularity: "head" (one scale per token and head) or "token" (one per
      token, shared by its heads).

  Returns:
    (q8 f8e4m3fn[T, H, D], folded weights f32[T, H], scales f32[T, H]).
    `q8.astype(bf16)` is exact (every e4m3 value is a bf16 value), so the
    bf16 kernel input `q8.astype(bf16)` with the folded weights computes the
    scores of the FP8 queries.
  """
  q = jnp.asarray(q, jnp.float32)
  t, h, d = q.shape
  if granularity == "head":
    x = q
  elif granularity == "token":
    x = q.reshape(t, h * d)
  else:
    raise ValueError(f"granularity must be 'head' or 'token', got "
                     f"{granularity!r}")
  v, s = _quantize(x, scale)
  v = v.reshape(t, h, d)
  s = jnp.broadcast_to(s.reshape(t, -1), (t, h))
  w = jnp.asarray(weights, jnp.float32) * s
  return v, w, s


@functools.lru_cache(maxsize=None)
def _hadamard_np(n: int) -> np.ndarray:
  h = np.ones((1, 1), np.float64)
  while h.shape[0] < n:
    h = np.block([[h, h], [h, -h]])
  return h / np.sqrt(n)


def hadamard(n: int) -> np.ndarray:
  """The normalized Sylvester Hadamard matrix, f32[n, n] (n a power of 2).

  H_1 = [1], H_2m = [[H_m, H_m], [H_m, -H_m]], divided by sqrt(n): symmetric
  and orthonormal, so (q H) . (k H) = q . k in exact arithmetic.
  """
  if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1 \
      or n & (n - 1):
    raise ValueError(f"n must be a power of two >= 1, got {n!r}")
  return _hadamard_np(int(n)).astype(np.float32)


def rotate(x, h=None):
  """x @ H over the last axis (f32), H = hadamard(x.shape[-1]) by default."""
  x = jnp.asarray(x, jnp.float32)
  if h is None:
    h = hadamard(x.shape[-1])
  return jnp.einsum("...d,de->...e", x, jnp.asarray(h, jnp.float32),
                    precision=jax.lax.Precision.HIGHEST)


# Key/query variants of a recall study: (cache format, query form).
VARIANTS: dict[str, tuple[str, str]] = {
    "exact": ("f32", "f32"),       # float32 keys and queries: the baseline
    "bf16": ("bf16", "bf16"),      # bf16 cache, bf16 queries
    "fp8": ("fp8", "bf16"),        # vendored: packed FP8 cache, bf16 queries
    "fp8_q8": ("fp8", "fp8"),      # FP8 cache, FP8 queries (scale in weights)
}


def variant_inputs(inp, variant: str, *, rotated: bool = False,
                   query_scale: str = "ue8m0"):
  """The kernel inputs of one key/query variant, from float32 inputs.

  Args:
    inp: `IndexerInputs` with float32 queries (`make_inputs(...,
      q_dtype=jnp.float32)`); its `keys` are the float32 truth.
    variant: a key of `VARIANTS`.
    rotated: Hadamard-rotate queries and keys (in f32) first.
    query_scale: for "fp8_q8", the query scale ("ue8m0" or "float").

  Returns:
    `IndexerInputs` whose `args` feed `streamidx.ref` (every variant) and
    the kernel ("bf16", "fp8", "fp8_q8"): the cache packed by
    `streamidx.cache.pack_cache`, queries as bf16 (FP8 queries as their exact
    bf16 values, with the scale folded into the weights).
  """
  if variant not in VARIANTS:
    raise ValueError(f"variant must be one of {tuple(VARIANTS)}, got "
                     f"{variant!r}")
  if inp.q.dtype != jnp.float32:
    raise ValueError(f"inp.q must be float32 (make_inputs(..., q_dtype="
                     f"jnp.float32)), got {inp.q.dtype}")
  fmt, q_form = VARIANTS[variant]
  q, keys, w = inp.q, inp.keys, inp.weights
  if rotated:
    q, keys = rotate(q), rotate(keys)
  if q_form == "bf16":
    q = q.astype(jnp.bfloat16)
  elif q_form == "fp8":
    q8, w, _ = quantize_queries_fp8(q, w, scale=query_scale)
    q = q8.astype(jnp.bfloat16)
  return dataclasses.replace(inp, q=q, weights=w, keys=keys,
                             cache=cache_lib.pack_cache(keys, fmt), fmt=fmt)


def float64_scores(inp, *, compression_ratio: int, seq: int = 0,
                   causal_rule: str = "model") -> np.ndarray:
  """The exact scores of one sequence, in float64 NumPy: a recall study's truth.

  Scores sequence `seq`'s query rows against its own entries from the
  unquantized keys (`inp.keys`, the float32 truth) and `inp.q` /
  `inp.weights` widened to float64: sum_h w[t, h] * ReLU(q[t, h] . k[s]),
  one matrix product per row, independent of `streamidx.ref` (float32,
  JAX). Entries a row may not see (causal rule, sequence length) are -inf.

  Args:
    inp: `IndexerInputs`.
    seq: the sequence (its rows `cu_q_lens[seq]:cu_q_lens[seq + 1]`).

  Returns:
    f64[q_len of seq, pages_per_seq * page_size].
  """
  b = inp.batch
  lo, hi = int(b.cu_q_lens[seq]), int(b.cu_q_lens[seq + 1])
  keys = np.asarray(inp.keys, np.float64)[b.page_table[seq]]
  keys = keys.reshape(-1, inp.head_dim)  # [entries, head_dim], sequence order
  q = np.asarray(inp.q.astype(jnp.float32), np.float64)[lo:hi]
  w = np.asarray(inp.weights, np.float64)[lo:hi]
  s = np.stack([w[t] @ np.maximum(q[t] @ keys.T, 0) for t in range(hi - lo)])
  visible = addressing.visibility_mask(
      b.token_positions()[lo:hi], keys.shape[0], compression_ratio,
      causal_rule, seq_len=int(b.seq_lens[seq]))
  return np.where(visible, s, -np.inf)


def _unpack_kernel(block_ref, values_ref, scales_ref, *, head_dim):
  # The FP8 branch of the kernel's `load_bkv`, op for op.
  bkv = block_ref[...]
  flat_bkv = bkv.reshape(-1, bkv.shape[-1])
  fp8_val = pltpu.bitcast(flat_bkv[:, :head_dim], jnp.float8_e4m3fn)
  scale_val = pltpu.bitcast(flat_bkv[:, head_dim:head_dim + 1].T,
                            jnp.float8_e8m0fnu).astype(jnp.bfloat16)
  values_ref[...] = fp8_val.astype(jnp.float32)
  scales_ref[...] = scale_val.astype(jnp.float32)


def unpack_block_in_kernel(block, head_dim: int = 128):
  """Runs the kernel's FP8 unpack (`load_bkv`) on one block, in Pallas.

  The ops are those of `streamidx/kernels/vendored.py`'s `load_bkv`: reshape the
  [rows, kv_packing, lkv_dim] uint8 block to [entries, lkv_dim], bitcast the
  first head_dim bytes to e4m3, and the scale byte column, transposed, to
  e8m0, converted to bf16. It always runs in Pallas's TPU interpreter (on a
  TPU too), so the demonstration does not depend on the chip.

  Args:
    block: u8[rows, kv_packing, lkv_dim], e.g. one page `cache[page]`.

  Returns:
    (values f32[rows * kv_packing, head_dim], scales f32[1, rows *
    kv_packing]): entry r * kv_packing + j is row r, slot j.
  """
  block = jnp.asarray(block)
  if block.dtype != jnp.uint8 or block.ndim != 3:
    raise ValueError(f"block must be u8[rows, kv_packing, lkv_dim], got "
                     f"{block.dtype}{list(block.shape)}")
  entries = block.shape[0] * block.shape[1]
  call = pl.pallas_call(
      functools.partial(_unpack_kernel, head_dim=head_dim),
      out_shape=(jax.ShapeDtypeStruct((entries, head_dim), jnp.float32),
                 jax.ShapeDtypeStruct((1, entries), jnp.float32)),
      in_specs=[pl.BlockSpec(memory_space=pltpu.VMEM)],
      out_specs=(pl.BlockSpec(memory_space=pltpu.VMEM),) * 2,
      interpret=pltpu.InterpretParams(),
  )
  return call(block)


# ---------------------------------------------------------------------------
# The studies of notebook 03.


def e4m3_summary() -> dict:
  """The e4m3fn grid in numbers, checked against the format's definition.

  Returns:
    dict: definition_matches (JAX's bitcast of all 256 patterns equals
    `e4m3_from_fields`, NaNs included), finite_patterns, nan_patterns,
    distinct_finite (+0 = -0), nonnegative (0 and the positives),
    subnormals, min_subnormal, max_subnormal, normals, min_normal, max
    (448), positive (f32[126] the positive values, sorted), spacing
    (`relative_spacing` of the grid).
  """
  patterns, values = e4m3_table()
  by_definition = e4m3_from_fields(*e4m3_fields(patterns))
  nan = np.isnan(values)
  matches = bool(np.array_equal(nan, np.isnan(by_definition)) and
                 np.array_equal(values[~nan], by_definition[~nan]))
  grid = e4m3_finite_values()
  positive = grid[grid > 0]
  sub = positive[positive < 2.0 ** -6]
  return dict(definition_matches=matches, finite_patterns=int((~nan).sum()),
              nan_patterns=int(nan.sum()),
              distinct_finite=len(e4m3_finite_values(nonnegative=False)),
              nonnegative=len(grid), subnormals=len(sub),
              min_subnormal=float(sub.min()), max_subnormal=float(sub.max()),
              normals=len(positive) - len(sub), min_normal=2.0 ** -6,
              max=float(grid.max()), positive=positive,
              spacing=relative_spacing(grid))


def key_records(num_records: int, *, dist: str, seed: int,
                outlier_channels: int = 4, outlier_scale: float = 20.0,
                head_dim: int = 128) -> np.ndarray:
  """`num_records` float32 keys as `streamidx.make_inputs` draws them.

  Returns:
    f32[num_records, head_dim]: the first records of the keys of a
    one-sequence batch (ratio 1), key distribution `dist` ("gaussian" or
    "outliers").
  """
  page_size = 64
  b = batch_lib.make_batch([(1, num_records)], page_size=page_size,
                           compression_ratio=1)
  inp = batch_lib.make_inputs(b, num_heads=1, head_dim=head_dim, fmt="f32",
                              q_dtype=jnp.float32, seed=seed,
                              key_distribution=dist,
                              outlier_channels=outlier_channels,
                              outlier_scale=outlier_scale)
  return np.asarray(inp.keys).reshape(-1, head_dim)[:num_records]


def scale_study(key_sets) -> dict:
  """ue8m0 against exact float scales on sets of records.

  Args:
    key_sets: name -> f32[records, D] (e.g. "gaussian", "outliers").

  Returns:
    name -> dict: err_pow2, err_float (f64[records] relative L2 error per
    record, `record_error`), mean_err_ue8m0, mean_err_float, extra (the
    ue8m0 scale's mean error over the float scale's, minus 1),
    amax_over_scale (f[records] amax / 2**e: where amax lands on the e4m3
    range), headroom_min / headroom_max (its extremes), max_stored (the
    largest |stored e4m3 value|), stored (f32[records * D] every stored
    |value|, for the grid figure), finite (every stored value finite).
  """
  out = {}
  for name, keys in key_sets.items():
    keys = np.asarray(keys, np.float32)
    err_pow2 = record_error(keys, "ue8m0")
    err_float = record_error(keys, "float")
    v8, s8 = quantize_ue8m0(keys)
    stored = np.asarray(v8.astype(jnp.float32))
    amax_over_scale = np.abs(keys).max(axis=1) / np.asarray(s8)
    out[name] = dict(
        err_pow2=err_pow2, err_float=err_float,
        mean_err_ue8m0=float(err_pow2.mean()),
        mean_err_float=float(err_float.mean()),
        extra=float(err_pow2.mean() / err_float.mean() - 1),
        amax_over_scale=amax_over_scale,
        headroom_min=float(amax_over_scale.min()),
        headroom_max=float(amax_over_scale.max()),
        max_stored=float(np.abs(stored).max()),
        stored=np.abs(stored).ravel(), finite=bool(np.isfinite(stored).all()))
  return out


def scale_commutes(inp, page: int, rows: int) -> dict:
  """Does scaling after the reduction give the dequantize-first scores?

  On one page of `inp`'s packed FP8 cache (the vendored kernel's ue8m0
  scales) and on the same keys with exact float scales, scores `rows` query
  rows both ways in float32 (`scores_scale_after`, `scores_scale_before`).

  Args:
    inp: `IndexerInputs` with an "fp8" cache.
    page: the physical page.
    rows: query rows (the first `rows` of `inp.q`).

  Returns:
    dict: pow2_mismatch and float_mismatch (scores that differ, of `size`),
    float_max_rel (the float scale's largest difference over the largest
    score).
  """
  raw_values, raw_scales = cache_lib.unpack_cache_raw(inp.cache, inp.head_dim)
  q = np.asarray(inp.q.astype(jnp.float32))[:rows]
  w = np.asarray(inp.weights)[:rows]
  v = np.asarray(raw_values[page].astype(jnp.float32))
  s = np.asarray(raw_scales[page])
  after = scores_scale_after(q, w, v, s)
  before = scores_scale_before(q, w, v, s)
  v_f, s_f = quantize_float_scale(inp.keys[page])
  v_f = np.asarray(v_f.astype(jnp.float32))
  s_f = np.asarray(s_f)
  after_f = scores_scale_after(q, w, v_f, s_f)
  before_f = scores_scale_before(q, w, v_f, s_f)
  return dict(pow2_mismatch=int((after != before).sum()),
              float_mismatch=int((after_f != before_f).sum()),
              float_max_rel=float(np.max(np.abs(after_f - before_f))
                                  / np.abs(before_f).max()),
              size=int(after.size))


# The recall study's variants: `VARIANTS` but "exact" (the truth), and the
# FP8 ones again with queries and keys Hadamard-rotated first ("+H").
STUDY_VARIANTS = ("bf16", "fp8", "fp8_q8", "fp8+H", "fp8_q8+H")


def _split_variant(name: str) -> tuple[str, bool]:
  base, rotated = (name[:-2], True) if name.endswith("+H") else (name, False)
  if base not in VARIANTS or base == "exact":
    raise ValueError(f"variant must be one of {STUDY_VARIANTS} (got {name!r})")
  return base, rotated


@dataclasses.dataclass(frozen=True)
class MeanCI:
  """A mean with its spread over n independent samples.

  mean, std (sample standard deviation, ddof 1), half_width (of the `level`
  Student-t confidence interval of the mean: t * std / sqrt(n)), n; std and
  half_width are NaN for n = 1.
  """

  mean: float
  std: float
  half_width: float
  n: int
  level: float = 0.95

  @property
  def lo(self) -> float:
    return self.mean - self.half_width

  @property
  def hi(self) -> float:
    return self.mean + self.half_width

  def __str__(self) -> str:
    return f"{self.mean:.4f} ± {self.half_width:.4f}"


def mean_ci(samples, level: float = 0.95) -> MeanCI:
  """`MeanCI` of independent samples (a Student-t interval of the mean)."""
  x = np.asarray(samples, np.float64).ravel()
  if x.size == 0:
    raise ValueError("samples: must not be empty")
  if not 0 < level < 1:
    raise ValueError(f"level: must be in (0, 1) (got {level!r})")
  if x.size == 1:
    return MeanCI(float(x[0]), float("nan"), float("nan"), 1, level)
  from scipy import stats  # pylint: disable=g-import-not-at-top
  std = float(x.std(ddof=1))
  t = float(stats.t.ppf((1 + level) / 2, x.size - 1))
  return MeanCI(float(x.mean()), std, t * std / np.sqrt(x.size), int(x.size),
                level)


@dataclasses.dataclass(frozen=True)
class RecallStudy:
  """Recall@k of FP8 and bf16 variants against the exact float32 top-k.

  recall: (dist, entries, variant, k) -> f64[len(seeds), query_tokens], the
    recall of each query row (tie-aware, `metrics.recall_at_k`) for each
    seed; k only where k <= entries.
  score_error: (dist, entries, variant) -> {"median", "p99"} -> f64[seeds],
    the relative score error over visible entries (`metrics.score_error`).
  float64_rel_diff: the largest difference, over every seed and context,
    between the float32 exact scores (`streamidx.ref`) and a float64 NumPy
    computation (`float64_scores`), relative to the largest score.
  seconds: wall time.

  A seed is one independent draw of queries, weights and keys; its rows
  share the keys, so the unit of the error bars is the seed (`summary`,
  `difference`: a t-interval over the per-seed mean recalls).
  """

  seeds: tuple[int, ...]
  query_tokens: int
  num_heads: int
  compression_ratio: int
  dists: tuple[str, ...]
  contexts: tuple[int, ...]
  ks: tuple[int, ...]
  variants: tuple[str, ...]
  recall: dict
  score_error: dict
  float64_rel_diff: float
  seconds: float

  @property
  def n_rows(self) -> int:
    """Query rows per (dist, entries, variant, k): seeds x query_tokens."""
    return len(self.seeds) * self.query_tokens

  def per_seed(self, dist, entries, variant, k) -> np.ndarray:
    """f64[seeds]: each seed's recall, the mean over its rows."""
    return self.recall[(dist, entries, variant, k)].mean(axis=1)

  def summary(self, dist, entries, variant, k, level=0.95) -> MeanCI:
    """The mean recall over seeds, with its t-interval."""
    return mean_ci(self.per_seed(dist, entries, variant, k), level)

  def difference(self, dist, entries, variant, baseline, k,
                 level=0.95) -> MeanCI:
    """recall(variant) - recall(baseline), paired by seed (same keys)."""
    return mean_ci(self.per_seed(dist, entries, variant, k)
                   - self.per_seed(dist, entries, baseline, k), level)

  def worst_row(self, dist, entries, variant, k) -> float:
    """The smallest recall of any row of any seed."""
    return float(self.recall[(dist, entries, variant, k)].min())

  def records(self) -> list[dict]:
    """One JSON-ready row per (dist, entries, variant, k)."""
    out = []
    for (dist, entries, variant, k), r in self.recall.items():
      s = self.summary(dist, entries, variant, k)
      out.append(dict(dist=dist, entries=entries, variant=variant, k=k,
                      mean=s.mean, std_over_seeds=s.std,
                      ci95_half_width=s.half_width, seeds=len(self.seeds),
                      rows_per_seed=self.query_tokens,
                      worst_row=float(r.min()), per_seed=r.mean(axis=1).tolist()))
    return out


def recall_study(*, seeds, num_heads: int, compression_ratio: int,
                 page_size: int, query_tokens: int, contexts, ks,
                 dists=("gaussian", "outliers"), variants=STUDY_VARIANTS,
                 outlier_channels: int = 4,
                 outlier_scale: float = 20.0) -> RecallStudy:
  """The FP8 recall study: each variant's top-k against the exact top-k.

  For each seed, key distribution and context (compressed entries), one
  sequence of `compression_ratio * entries` tokens whose last
  `query_tokens` tokens query its cache (`make_batch`, `make_inputs` with
  float32 queries and that seed). Every variant is scored by
  `streamidx.ref.token_scores` on `variant_inputs`; the truth is the
  "exact" variant (float32 keys and queries), itself compared with the
  float64 NumPy scores of `float64_scores`.

  Args:
    seeds: the RNG seeds (one independent draw each).
    contexts: compressed entries per sequence; ks: the k values (those
      <= a context's entries are measured there).
    dists: key distributions of `make_inputs` ("gaussian", "outliers").
    variants: names of `STUDY_VARIANTS`.

  Returns:
    `RecallStudy`.
  """
  seeds = tuple(int(s) for s in seeds)
  if not seeds:
    raise ValueError("seeds: must not be empty")
  variants = tuple(variants)
  parts = {v: _split_variant(v) for v in variants}
  t0 = time.perf_counter()
  recall, errors, rel = {}, {}, 0.0

  def scores_of(x):
    return np.asarray(ref.token_scores(*x.args,
                                       compression_ratio=compression_ratio))

  for i, seed in enumerate(seeds):
    for dist in dists:
      for entries in contexts:
        b = batch_lib.make_batch([(query_tokens, compression_ratio * entries)],
                                 page_size=page_size,
                                 compression_ratio=compression_ratio)
        inp = batch_lib.make_inputs(
            b, num_heads=num_heads, fmt="f32", q_dtype=jnp.float32, seed=seed,
            key_distribution=dist, outlier_channels=outlier_channels,
            outlier_scale=outlier_scale)
        exact = scores_of(variant_inputs(inp, "exact"))[:query_tokens]
        oracle = float64_scores(inp, compression_ratio=compression_ratio)
        finite = np.isfinite(oracle)
        if not np.array_equal(finite, np.isfinite(exact)):
          raise AssertionError("exact f32 and float64 scores mask differently")
        rel = max(rel, float(np.max(np.abs(exact[finite] - oracle[finite]))
                             / np.abs(oracle[finite]).max()))
        kk = [k for k in ks if k <= entries]
        want = np.asarray(ref.topk_from_scores(exact, max(kk)))
        for name in variants:
          base, rotated = parts[name]
          s = scores_of(variant_inputs(inp, base, rotated=rotated))
          s = s[:query_tokens]
          err = metrics.score_error(s, exact)
          e = errors.setdefault((dist, entries, name), {
              "median": np.zeros(len(seeds)), "p99": np.zeros(len(seeds))})
          e["median"][i], e["p99"][i] = err["median"], err["p99"]
          got = np.asarray(ref.topk_from_scores(s, max(kk)))
          for k in kk:
            r = recall.setdefault((dist, entries, name, k),
                                  np.zeros((len(seeds), query_tokens)))
            r[i] = [metrics.recall_at_k(got[t:t + 1, :k], want[t:t + 1, :k],
                                        exact[t:t + 1])
                    for t in range(query_tokens)]
  return RecallStudy(
      seeds=seeds, query_tokens=query_tokens, num_heads=num_heads,
      compression_ratio=compression_ratio, dists=tuple(dists),
      contexts=tuple(contexts), ks=tuple(ks), variants=variants, recall=recall,
      score_error=errors, float64_rel_diff=rel,
      seconds=time.perf_counter() - t0)


# ---------------------------------------------------------------------------
# Tables and the answer of notebook 03 (rows for `streamidx.lab.tables`).

E4M3_EXAMPLE_BYTES = (0x00, 0x01, 0x07, 0x08, 0x38, 0x77, 0x7E, 0x7F, 0x80, 0xFE)


def e4m3_pattern_rows(patterns=E4M3_EXAMPLE_BYTES) -> list[dict]:
  """One row per e4m3 byte in `patterns`: its sign, exponent and mantissa
  fields (binary) and its value as JAX decodes it (`e4m3_table`)."""
  all_patterns, values = e4m3_table()
  sign, exponent, mantissa = e4m3_fields(all_patterns)
  return [dict(byte=f"0x{b:02x}", sign=sign[b], exponent=f"{exponent[b]:04b}",
               mantissa=f"{mantissa[b]:03b}", value=f"{values[b]:g}")
          for b in patterns]


def e4m3_grid_markdown(grid: dict) -> str:
  """One sentence of `e4m3_summary()`'s counts: patterns, NaNs, distinct
  values, subnormal and normal ranges."""
  return (f"{grid['finite_patterns']} finite patterns, {grid['nan_patterns']} NaN, "
          f"{grid['distinct_finite']} distinct finite values; {grid['subnormals']} positive "
          f"subnormals ({grid['min_subnormal']:g} .. {grid['max_subnormal']:g}), "
          f"{grid['normals']} positive normals ({grid['min_normal']:g} .. {grid['max']:g})")


def scale_study_rows(study: dict) -> list[dict]:
  """One row per key set of `scale_study`: mean record error under each
  scale, the ue8m0 scale's extra error, the range of amax / scale and the
  largest stored e4m3 value."""
  return [dict(keys=d, mean_error_ue8m0=f"{st['mean_err_ue8m0']:.5f}",
               mean_error_float=f"{st['mean_err_float']:.5f}",
               ue8m0_extra=f"{st['extra']:+.1%}",
               amax_over_scale=f"[{st['headroom_min']:.1f}, {st['headroom_max']:.1f}]",
               largest_stored=f"{st['max_stored']:g}") for d, st in study.items()]


def recall_rows(study: RecallStudy, entries: int, k: int) -> list[dict]:
  """One row per (key distribution, variant) of `study` at one context and
  k: recall (mean ± interval over seeds), its std over seeds, the worst
  row and the median relative score error (mean over seeds)."""
  rows = []
  for dist in study.dists:
    for v in study.variants:
      s = study.summary(dist, entries, v, k)
      rows.append(dict(
          keys=dist, variant=v, recall=str(s), std_over_seeds=f"{s.std:.4f}",
          worst_row=f"{study.worst_row(dist, entries, v, k):.4f}",
          median_score_error=f"{np.mean(study.score_error[(dist, entries, v)]['median']):.1e}"))
  return rows


def unpack_rows(block, k_values, k_scales, head_dim: int,
                entries: int = 3) -> list[dict]:
  """The first `entries` entries of a packed FP8 page as the kernel's
  unpack (`unpack_block_in_kernel`) saw them.

  Args:
    block: u8[..., lkv_dim] one packed page; k_values: f32[entries, D],
      k_scales: f32[1, entries] (the kernel's outputs).

  Returns:
    rows: the first value byte, the kernel's e4m3 value of it, the value
    the e4m3 table gives, the scale byte and the kernel's scale.
  """
  flat = np.asarray(block).reshape(-1, np.asarray(block).shape[-1])
  values = e4m3_table()[1]
  return [dict(entry=n, value_byte=f"0x{flat[n, 0]:02x}", kernel_e4m3=f"{k_values[n, 0]:g}",
               table_e4m3=f"{values[flat[n, 0]]:g}", scale_byte=int(flat[n, head_dim]),
               kernel_scale=f"{k_scales[0, n]:g} = 2**{int(flat[n, head_dim]) - 127}")
          for n in range(entries)]


def answer_markdown(*, machine: str, study: RecallStudy, entries: int, k: int,
                    num_heads: int, outlier_channels: int, outlier_scale: float,
                    scale_study_result: dict, commutes: dict,
                    unpack_matches: bool, seconds: float) -> str:
  """Notebook 03's answer, takeaways first, from this run's results.

  Args:
    study: the recall study; entries, k: the context and k it quotes.
    scale_study_result: `scale_study`; commutes: `scale_commutes`;
    unpack_matches: whether the kernel's unpack reproduced
    `streamidx.cache`; seconds: the notebook body's wall time.
  """
  from streamidx.lab.studies import formats  # pylint: disable=g-import-not-at-top
  g = lambda v: study.summary("gaussian", entries, v, k)
  gap = study.difference("gaussian", entries, "fp8", "bf16", k)
  outlier_gain = study.difference("outliers", entries, "fp8+H", "fp8", k)
  gaussian_gain = study.difference("gaussian", entries, "fp8+H", "fp8", k)
  pays = outlier_gain.lo > 0 and outlier_gain.lo > gaussian_gain.hi
  sc = scale_study_result
  n = f"n = {len(study.seeds)} seeds x {study.query_tokens} query rows"
  return f"""**Answer** (computed in this run on {machine}; recall@{k} over {entries} entries against
the exact float32 top-k, mean ± 95% interval over seeds, {n}, {num_heads} heads, ratio {study.compression_ratio}):

- **FP8 keys keep {g('fp8').mean:.2%} of the exact top-{k}** ({g('fp8')}; worst row
  {study.worst_row('gaussian', entries, 'fp8', k):.4f}); bf16 keys {g('bf16')}, FP8 keys and FP8
  queries {g('fp8_q8')}. FP8 costs {-gap.mean:.2%} of the top-k against bf16 ({gap}).
- **Outliers**: with {outlier_channels} outlier channels (x{outlier_scale:g}) FP8 keeps
  {study.summary('outliers', entries, 'fp8', k)}; a Hadamard rotation before quantizing changes that by
  {outlier_gain} (Gaussian keys: {gaussian_gain}): {"the rotation pays off on keys with outlier channels" if pays else
  "at these parameters the change is within the intervals, no evidence either way"}.
- **The ue8m0 scale** costs {sc['gaussian']['extra']:+.1%} mean record error over an exact float scale on
  Gaussian keys ({sc['outliers']['extra']:+.1%} with outliers), never saturates (largest stored value
  {sc['gaussian']['max_stored']:g}), fits in one byte and commutes exactly with ReLU and the weighted head sum
  ({commutes['pow2_mismatch']} of {commutes['size']} scores differ; {commutes['float_mismatch']} with a float scale),
  which is what lets the kernel scale after the reduction.
- **Bytes**: a packed FP8 entry costs {formats.bytes_per_entry('fp8_packed')} B (129 of data), as much as bf16's
  {formats.bytes_per_entry('bf16')} B; the dense FP8 cache stores {cache_lib.dense_tpu_bytes_per_entry(128, 128)} B on a TPU.
- **The unpack** is a reshape and two bitcasts; run on a real block they reproduce `streamidx.cache`'s decoding
  exactly ({unpack_matches}). The float32 truth agrees with float64 within {study.float64_rel_diff:.1e} (relative).
- Notebook body: {seconds:.0f} s.
"""
