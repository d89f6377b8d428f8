"""streamidx.lab.studies.quant: the e4m3 grid, scales, FP8 queries, Hadamard, unpack."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import streamidx as si
from streamidx import cache, metrics, ref
from streamidx.lab.studies import quant


# --------------------------------------------------------------------------
# The e4m3fn grid.


def test_e4m3_table_is_the_formats_definition_for_all_256_patterns():
  patterns, values = quant.e4m3_table()
  want = quant.e4m3_from_fields(*quant.e4m3_fields(patterns))
  np.testing.assert_array_equal(values, want)  # NaNs compare equal here
  assert np.flatnonzero(np.isnan(values)).tolist() == [0x7F, 0xFF]


def test_e4m3_grid_has_127_nonnegative_and_253_distinct_finite_values():
  grid = quant.e4m3_finite_values()
  positive = grid[grid > 0]
  assert len(grid) == 127 and grid[0] == 0
  assert len(positive[positive < 2.0**-6]) == 7      # subnormals
  assert len(positive[positive >= 2.0**-6]) == 119   # normals
  assert len(quant.e4m3_finite_values(nonnegative=False)) == 253
  assert grid.max() == 448 == cache.E4M3_MAX
  assert positive.min() == 2.0**-9


def test_pow2_is_exact_over_the_normal_float32_exponents():
  e = np.arange(-126, 128)
  np.testing.assert_array_equal(np.asarray(quant.pow2(e), np.float64),
                                np.ldexp(1.0, e))


def test_relative_spacing_of_normals_is_between_1_15_and_1_8():
  grid = quant.e4m3_finite_values()
  spacing = quant.relative_spacing(grid)
  normals = spacing[grid[grid > 0][:-1] >= 2.0**-6]
  assert np.isclose(normals.min(), 1 / 15) and normals.max() == 1 / 8
  assert spacing.max() == 1.0  # 2**-9 -> 2**-8


# --------------------------------------------------------------------------
# Scales.

AMAX_CASES = [2.0**-100, 1e-3, 0.5, 1.0, 3.7, 224.0, 447.9, 448.0, 448.1,
              896.0, 1e5, 2.0**100]


@pytest.mark.parametrize("amax", AMAX_CASES)
def test_ue8m0_scale_never_saturates_and_is_the_smallest_power_of_two(amax):
  rng = np.random.default_rng(0)
  x = rng.uniform(-1, 1, (8, 128)).astype(np.float32) * np.float32(amax)
  x[:, 5] = np.float32(amax) * np.array([1, -1] * 4, np.float32)
  values, scales = quant.quantize_ue8m0(x)
  stored = np.asarray(values.astype(jnp.float32))
  assert np.isfinite(stored).all() and np.abs(stored).max() <= 448
  s = np.asarray(scales, np.float64)
  assert (np.log2(s) == np.round(np.log2(s))).all()     # powers of two
  ratio = np.float64(np.float32(amax)) / s
  assert (ratio <= 448).all() and (ratio > 224).all()   # the smallest one


@pytest.mark.parametrize("amax", AMAX_CASES)
def test_float_scale_puts_amax_exactly_on_448(amax):
  rng = np.random.default_rng(1)
  x = rng.uniform(-1, 1, (4, 128)).astype(np.float32) * np.float32(amax)
  values, _ = quant.quantize_float_scale(x)
  stored = np.abs(np.asarray(values.astype(jnp.float32)))
  np.testing.assert_array_equal(stored.max(axis=1), 448.0)


def test_record_error_is_zero_for_records_e4m3_holds_exactly():
  grid = quant.e4m3_finite_values()
  exact = np.resize(grid[grid > 2.0**-6], (3, 128)).astype(np.float32)
  exact[:, 0] = 448.0  # amax 448: scale exactly 1 either way
  exact = exact * np.float32([[2.0**-5], [1.0], [2.0**7]])
  for scale in ("ue8m0", "float"):
    np.testing.assert_array_equal(quant.record_error(exact, scale), 0.0)
  assert quant.record_error(np.zeros((2, 128), np.float32)).tolist() == [0, 0]


def test_record_error_rejects_unknown_scales():
  with pytest.raises(ValueError, match="scale must be"):
    quant.record_error(np.ones((1, 128), np.float32), "int8")


def _scoring_operands(seed=0, t=3, h=4, e=32, d=128):
  rng = np.random.default_rng(seed)
  q = rng.standard_normal((t, h, d)).astype(np.float32)
  w = np.abs(rng.standard_normal((t, h))).astype(np.float32)
  values, _ = cache.quantize_fp8(rng.standard_normal((e, d)).astype(np.float32))
  return q, w, np.asarray(values.astype(jnp.float32))


@pytest.mark.parametrize("exponent", [-20, -7, -1, 0, 3, 30])
def test_a_power_of_two_scale_commutes_with_relu_and_the_head_sum(exponent):
  q, w, values = _scoring_operands(seed=exponent + 50)
  scales = np.full(values.shape[0], 2.0**exponent, np.float32)
  scales[::3] *= 2  # mixed exponents across entries
  after = quant.scores_scale_after(q, w, values, scales)
  before = quant.scores_scale_before(q, w, values, scales)
  np.testing.assert_array_equal(after, before)


def test_a_non_power_of_two_scale_does_not_commute_bit_for_bit():
  # The same check fails for an ordinary float scale: the test above can fail.
  q, w, values = _scoring_operands(seed=7)
  scales = np.full(values.shape[0], 0.3, np.float32)
  after = quant.scores_scale_after(q, w, values, scales)
  before = quant.scores_scale_before(q, w, values, scales)
  assert (after != before).any()
  np.testing.assert_allclose(after, before, rtol=1e-5)


# --------------------------------------------------------------------------
# FP8 queries.


@pytest.mark.parametrize("granularity", ["head", "token"])
def test_fp8_query_scale_folds_into_weights_exactly(granularity):
  rng = np.random.default_rng(2)
  q = (rng.standard_normal((5, 4, 128)) * 3).astype(np.float32)
  w = np.abs(rng.standard_normal((5, 4))).astype(np.float32)
  q8, w_folded, s = quant.quantize_queries_fp8(q, w, granularity=granularity)
  q8 = np.asarray(q8.astype(jnp.float32))
  s = np.asarray(s)
  assert np.abs(q8).max() <= 448
  if granularity == "token":
    assert (s == s[:, :1]).all()
  np.testing.assert_array_equal(np.asarray(w_folded), w * s)
  _, _, values = _scoring_operands(seed=3)
  ones = np.ones(values.shape[0], np.float32)
  folded = quant.scores_scale_after(q8, np.asarray(w_folded), values, ones)
  dequantized = quant.scores_scale_after(q8 * s[:, :, None], w, values, ones)
  np.testing.assert_array_equal(folded, dequantized)


def test_fp8_queries_through_the_reference_score_exactly_like_dequantized_ones():
  batch = si.make_mixed_batch(decode=[70, 33], prefill=[(6, 50)],
                              mixed=[(4, 64)], page_size=8,
                              compression_ratio=4)
  inp = si.make_inputs(batch, num_heads=4, fmt="fp8", q_dtype=jnp.float32)
  q8, w_folded, s = quant.quantize_queries_fp8(inp.q, inp.weights)
  # e4m3 values, and e4m3 values times powers of two, are exact in bf16.
  q8_bf16 = q8.astype(jnp.bfloat16)
  assert (q8_bf16.astype(jnp.float8_e4m3fn) == q8).all()
  deq_bf16 = (q8.astype(jnp.float32) * s[..., None]).astype(jnp.bfloat16)
  np.testing.assert_array_equal(
      np.asarray(deq_bf16, np.float32),
      np.asarray(q8.astype(jnp.float32) * s[..., None]))
  args = list(inp.args)
  kw = dict(compression_ratio=4, chunk_bytes=1)
  args[0], args[1] = q8_bf16, w_folded
  folded = np.asarray(ref.token_scores(*args, **kw))
  args[0], args[1] = deq_bf16, inp.weights
  dequantized = np.asarray(ref.token_scores(*args, **kw))
  np.testing.assert_array_equal(folded, dequantized)


def test_quantize_queries_rejects_unknown_options():
  q = np.ones((1, 2, 128), np.float32)
  w = np.ones((1, 2), np.float32)
  with pytest.raises(ValueError, match="granularity"):
    quant.quantize_queries_fp8(q, w, granularity="page")
  with pytest.raises(ValueError, match="scale"):
    quant.quantize_queries_fp8(q, w, scale="e5m2")


# --------------------------------------------------------------------------
# Hadamard rotation.


@pytest.mark.parametrize("n", [1, 2, 4, 8, 64, 128, 256])
def test_hadamard_is_symmetric_orthonormal_with_entries_1_over_sqrt_n(n):
  h = quant.hadamard(n).astype(np.float64)
  np.testing.assert_allclose(h @ h.T, np.eye(n), atol=1e-6)
  np.testing.assert_array_equal(h, h.T)
  np.testing.assert_allclose(np.abs(h), 1 / np.sqrt(n), rtol=1e-6)
  assert (h[0] > 0).all() and (h[:, 0] > 0).all()  # Sylvester's sign pattern


@pytest.mark.parametrize("bad", [0, 3, 6, 100, -4, 2.0, True])
def test_hadamard_rejects_sizes_that_are_not_powers_of_two(bad):
  with pytest.raises(ValueError, match="power of two"):
    quant.hadamard(bad)


def test_rotation_preserves_dot_products_and_spreads_outlier_channels():
  rng = np.random.default_rng(4)
  q = rng.standard_normal((6, 128)).astype(np.float32)
  k = rng.standard_normal((9, 128)).astype(np.float32)
  k[:, 3] *= 50  # one outlier channel
  qr, kr = np.asarray(quant.rotate(q)), np.asarray(quant.rotate(k))
  np.testing.assert_allclose(qr @ kr.T, q @ k.T, rtol=1e-4, atol=1e-3)
  assert np.abs(kr).max() < 0.5 * np.abs(k).max()


# --------------------------------------------------------------------------
# Variants of a recall study.


@pytest.mark.parametrize("rotated", [False, True])
@pytest.mark.parametrize("variant", sorted(quant.VARIANTS))
def test_variant_inputs_pack_the_cache_and_cast_the_queries(variant, rotated):
  batch = si.make_batch([(2, 64)], page_size=8, compression_ratio=4)
  inp = si.make_inputs(batch, num_heads=2, fmt="f32", q_dtype=jnp.float32)
  got = quant.variant_inputs(inp, variant, rotated=rotated)
  fmt, q_form = quant.VARIANTS[variant]
  keys = quant.rotate(inp.keys) if rotated else inp.keys
  np.testing.assert_array_equal(np.asarray(got.cache),
                                np.asarray(cache.pack_cache(keys, fmt)))
  assert got.q.dtype == {"f32": jnp.float32, "bf16": jnp.bfloat16,
                         "fp8": jnp.bfloat16}[q_form]
  if q_form == "fp8":
    assert (got.q.astype(jnp.float8_e4m3fn).astype(jnp.bfloat16) == got.q).all()
    assert not np.array_equal(np.asarray(got.weights), np.asarray(inp.weights))
  else:
    np.testing.assert_array_equal(np.asarray(got.weights),
                                  np.asarray(inp.weights))


def test_variant_inputs_need_float32_queries_and_a_known_variant():
  batch = si.make_batch([(1, 32)], page_size=8, compression_ratio=4)
  inp = si.make_inputs(batch, num_heads=2, fmt="f32")  # bf16 queries
  with pytest.raises(ValueError, match="float32"):
    quant.variant_inputs(inp, "fp8")
  with pytest.raises(ValueError, match="variant must be one of"):
    quant.variant_inputs(inp, "int4")


# --------------------------------------------------------------------------
# The kernel's unpack.


@pytest.mark.parametrize("page_size", [4, 16])
def test_unpack_block_in_kernel_reads_what_cache_unpacks(page_size):
  keys = jax.random.normal(jax.random.key(page_size), (2, page_size, 128)) * 5
  keys = keys.at[1].multiply(2.0**-20)  # other scale exponents
  packed = cache.pack_cache(keys, "fp8")
  values, scales = cache.unpack_cache_raw(packed)
  for page in range(2):
    got_v, got_s = quant.unpack_block_in_kernel(packed[page])
    np.testing.assert_array_equal(np.asarray(got_v),
                                  np.asarray(values[page].astype(jnp.float32)))
    np.testing.assert_array_equal(np.asarray(got_s)[0], np.asarray(scales[page]))


def test_unpack_block_in_kernel_rejects_non_uint8_blocks():
  block = cache.pack_cache(jnp.ones((1, 4, 128)), "bf16")[0]
  with pytest.raises(ValueError, match="block must be u8"):
    quant.unpack_block_in_kernel(block)


def test_float64_scores_match_the_reference_and_mask_like_it():
  b = si.make_batch([(3, 40), (5, 37)], page_size=8, compression_ratio=4,
                    allocation="fragmented", seed=2)
  inp = si.make_inputs(b, num_heads=4, fmt="f32", q_dtype=jnp.float32, seed=5)
  want = np.asarray(ref.token_scores(*inp.args, compression_ratio=4))
  for seq in range(b.num_seqs):
    lo, hi = b.cu_q_lens[seq], b.cu_q_lens[seq + 1]
    got = quant.float64_scores(inp, compression_ratio=4, seq=seq)
    assert got.dtype == np.float64 and got.shape == (hi - lo, want.shape[1])
    np.testing.assert_array_equal(np.isfinite(got), np.isfinite(want[lo:hi]))
    # float32 (the reference) vs float64: within the float32 summation bound,
    # (head_dim + num_heads + 2) roundings of the sum of magnitudes.
    keys = np.abs(np.asarray(inp.keys, np.float64)[b.page_table[seq]]).reshape(-1, 128)
    mag = np.einsum("th,thd,sd->ts", np.abs(np.asarray(inp.weights, np.float64)[lo:hi]),
                    np.abs(np.asarray(inp.q, np.float64)[lo:hi]), keys)
    finite = np.isfinite(got)
    bound = (128 + 4 + 2) * 2.0**-24 * mag
    assert np.all(np.abs(want[lo:hi][finite] - got[finite]) <= bound[finite])
  seed_rule = quant.float64_scores(inp, compression_ratio=4, seq=1,
                                   causal_rule="seed")
  model = quant.float64_scores(inp, compression_ratio=4, seq=1)
  assert np.isfinite(seed_rule).sum() > np.isfinite(model).sum()


# --------------------------------------------------------------------------
# Notebook 03's studies.


def test_e4m3_summary_counts_the_grid():
  s = quant.e4m3_summary()
  assert s["definition_matches"]
  assert (s["finite_patterns"], s["nan_patterns"], s["distinct_finite"]) == (254, 2, 253)
  assert (s["subnormals"], s["normals"], s["max"]) == (7, 119, 448.0)
  assert s["min_subnormal"] == 2.0**-9 and len(s["positive"]) == 126


def test_key_records_are_make_inputs_keys_with_outlier_channels():
  g = quant.key_records(300, dist="gaussian", seed=1)
  o = quant.key_records(300, dist="outliers", seed=1, outlier_channels=3,
                        outlier_scale=50.0)
  assert g.shape == o.shape == (300, 128) and g.dtype == np.float32
  assert np.sum(np.abs(o).mean(axis=0) > 10) == 3
  np.testing.assert_array_equal(g, quant.key_records(300, dist="gaussian", seed=1))


def test_scale_study_reports_errors_headroom_and_stored_values():
  keys = {"k": np.array([[3.0] + [1.0] * 127, [448.0] * 128], np.float32)}
  st = quant.scale_study(keys)["k"]
  # Record 1: amax 3 -> scale 2**-7, amax lands on 384; record 2 is exact.
  np.testing.assert_allclose(st["amax_over_scale"], [384.0, 448.0])
  assert st["err_pow2"][1] == 0 and st["max_stored"] == 448.0 and st["finite"]
  assert st["stored"].shape == (256,)


def test_scale_commutes_for_the_ue8m0_scale_only():
  b = si.make_batch([(4, 4 * 16)], page_size=16, compression_ratio=4)
  inp = si.make_inputs(b, num_heads=4, fmt="fp8", seed=0)
  c = quant.scale_commutes(inp, int(b.page_table[0, 0]), 4)
  assert c["pow2_mismatch"] == 0 and c["size"] == 4 * 16
  assert c["float_mismatch"] > 0 and 0 < c["float_max_rel"] < 1e-5


def test_mean_ci_is_the_student_t_interval_of_the_mean():
  s = quant.mean_ci([1.0, 2.0, 3.0, 4.0])
  assert s.mean == 2.5 and s.n == 4
  assert s.std == pytest.approx(np.std([1, 2, 3, 4], ddof=1))
  # t(0.975, 3 dof) = 3.1824
  assert s.half_width == pytest.approx(3.1824 * s.std / 2, rel=1e-4)
  assert (s.lo, s.hi) == (s.mean - s.half_width, s.mean + s.half_width)
  one = quant.mean_ci([0.5])
  assert one.mean == 0.5 and np.isnan(one.half_width)
  with pytest.raises(ValueError, match="samples"):
    quant.mean_ci([])


def test_recall_study_measures_each_row_of_each_seed_and_pairs_seeds():
  st = quant.recall_study(seeds=[0, 1], num_heads=2, compression_ratio=1,
                          page_size=16, query_tokens=2, contexts=[64],
                          ks=[4, 16, 128], dists=("gaussian",),
                          variants=("bf16", "fp8"))
  assert st.n_rows == 4 and st.float64_rel_diff < 1e-5
  assert set(st.recall) == {("gaussian", 64, v, k) for v in ("bf16", "fp8")
                            for k in (4, 16)}  # k = 128 > 64 entries: left out
  r = st.recall[("gaussian", 64, "fp8", 16)]
  assert r.shape == (2, 2) and np.all((r >= 0) & (r <= 1))
  np.testing.assert_allclose(st.per_seed("gaussian", 64, "fp8", 16), r.mean(axis=1))
  # Seed 1, row 1, recomputed by hand.
  b = si.make_batch([(2, 64)], page_size=16, compression_ratio=1)
  inp = si.make_inputs(b, num_heads=2, fmt="f32", q_dtype=jnp.float32, seed=1)
  exact = np.asarray(ref.token_scores(*quant.variant_inputs(inp, "exact").args,
                                      compression_ratio=1))
  fp8 = np.asarray(ref.token_scores(*quant.variant_inputs(inp, "fp8").args,
                                    compression_ratio=1))
  want = metrics.recall_at_k(np.asarray(ref.topk_from_scores(fp8, 16))[1:2],
                             np.asarray(ref.topk_from_scores(exact, 16))[1:2],
                             exact[1:2])
  assert r[1, 1] == want
  d = st.difference("gaussian", 64, "fp8", "bf16", 16)
  assert d.mean == pytest.approx(np.mean(r.mean(axis=1) - st.recall[
      ("gaussian", 64, "bf16", 16)].mean(axis=1)))
  assert {row["variant"] for row in st.records()} == {"bf16", "fp8"}
  with pytest.raises(ValueError, match="variant"):
    quant.recall_study(seeds=[0], num_heads=1, compression_ratio=1, page_size=16,
                       query_tokens=1, contexts=[64], ks=[4], variants=("exact",))


# --------------------------------------------------------------------------
# Notebook 03's tables and answer.


def _fake_study(recall_by_variant):
  """A `RecallStudy` of two seeds x two rows at (64 entries, k 16), each
  (dist, variant)'s rows filled with one recall per seed."""
  recall, errors = {}, {}
  for (dist, v), per_seed in recall_by_variant.items():
    recall[(dist, 64, v, 16)] = np.repeat(np.asarray(per_seed, float)[:, None], 2, axis=1)
    errors[(dist, 64, v)] = {"median": np.array([1e-3, 3e-3]), "p99": np.zeros(2)}
  dists = tuple(dict.fromkeys(d for d, _ in recall_by_variant))
  variants = tuple(dict.fromkeys(v for _, v in recall_by_variant))
  return quant.RecallStudy(seeds=(0, 1), query_tokens=2, num_heads=2, compression_ratio=4,
                           dists=dists, contexts=(64,), ks=(16,), variants=variants,
                           recall=recall, score_error=errors, float64_rel_diff=1e-7, seconds=0.0)


def test_e4m3_pattern_rows_show_each_bytes_fields_and_value():
  rows = quant.e4m3_pattern_rows((0x38, 0x7E, 0x01))
  assert rows[0] == dict(byte="0x38", sign=0, exponent="0111", mantissa="000", value="1")
  assert (rows[1]["exponent"], rows[1]["mantissa"], rows[1]["value"]) == ("1111", "110", "448")
  assert float(rows[2]["value"]) == pytest.approx(2.0**-9, rel=1e-5)
  assert len(quant.e4m3_pattern_rows()) == len(quant.E4M3_EXAMPLE_BYTES)
  text = quant.e4m3_grid_markdown(quant.e4m3_summary())
  assert text.startswith("254 finite patterns, 2 NaN, 253 distinct finite values; 7 positive")


def test_scale_study_rows_quote_where_amax_lands_and_the_largest_stored_value():
  keys = {"k": np.array([[3.0] + [1.0] * 127, [448.0] * 128], np.float32)}
  (row,) = quant.scale_study_rows(quant.scale_study(keys))
  assert row["keys"] == "k" and row["amax_over_scale"] == "[384.0, 448.0]"
  assert row["largest_stored"] == "448"


def test_recall_rows_give_mean_interval_spread_and_worst_row_per_variant():
  st = _fake_study({("gaussian", "bf16"): [1.0, 1.0], ("gaussian", "fp8"): [0.75, 0.8125]})
  rows = quant.recall_rows(st, 64, 16)
  assert [(r["keys"], r["variant"]) for r in rows] == [("gaussian", "bf16"), ("gaussian", "fp8")]
  assert rows[1]["recall"] == str(st.summary("gaussian", 64, "fp8", 16))
  assert rows[1]["worst_row"] == "0.7500" and rows[1]["median_score_error"] == "2.0e-03"
  assert rows[0]["std_over_seeds"] == "0.0000"


def test_unpack_rows_name_each_entrys_value_byte_and_scale():
  b = si.make_batch([(1, 4 * 16)], page_size=16, compression_ratio=4)
  inp = si.make_inputs(b, num_heads=1, fmt="fp8", seed=0)
  page = int(b.page_table[0, 0])
  values, scales = cache.unpack_cache_raw(inp.cache, inp.head_dim)
  k_values = np.asarray(values[page].astype(jnp.float32))
  k_scales = np.asarray(scales[page], np.float32)[None]
  rows = quant.unpack_rows(inp.cache[page], k_values, k_scales, inp.head_dim, entries=2)
  flat = np.asarray(inp.cache[page]).reshape(-1, inp.cache.shape[-1])
  assert [r["entry"] for r in rows] == [0, 1]
  assert rows[0]["value_byte"] == f"0x{flat[0, 0]:02x}"
  assert rows[0]["kernel_e4m3"] == rows[0]["table_e4m3"]
  assert rows[1]["kernel_scale"].endswith(f"= 2**{int(flat[1, inp.head_dim]) - 127}")


def test_answer_markdown_says_whether_the_rotation_pays_off():
  recall = {(d, v): [0.9, 0.9] for d in ("gaussian", "outliers")
            for v in ("bf16", "fp8", "fp8_q8", "fp8+H")}
  recall[("gaussian", "bf16")] = [1.0, 1.0]
  recall[("outliers", "fp8")] = [0.5, 0.5]
  st = _fake_study(recall)
  scale = {d: dict(extra=0.02, max_stored=448.0) for d in ("gaussian", "outliers")}
  kw = dict(machine="cpu", entries=64, k=16, num_heads=2, outlier_channels=4, outlier_scale=20.0,
            scale_study_result=scale, commutes=dict(pow2_mismatch=0, size=64, float_mismatch=3),
            unpack_matches=True, seconds=1.0)
  text = quant.answer_markdown(study=st, **kw)
  assert "**FP8 keys keep 90.00% of the exact top-16**" in text
  assert "FP8 costs 10.00% of the top-k against bf16" in text
  assert "the rotation pays off on keys with outlier channels" in text
  recall[("outliers", "fp8")] = [0.9, 0.9]
  assert "no evidence either way" in quant.answer_markdown(study=_fake_study(recall), **kw)
