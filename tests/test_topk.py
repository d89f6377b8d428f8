"""The top-k stage (`streamidx.topk`): every method against one rule.

The rule (streamidx/topk/base.py): per row the min(k, visible) largest scores,
ties at the k-th score to the lowest indices, columns by score descending
then index ascending, -1 after; -0.0 ties +0.0. `oracle.topk_rule` spells
it out in NumPy. Exact methods must return it bit for bit, on random scores and on
integer scores with massive ties; through the kernel (`topk_method`) they
must match the reference as every kernel result does (tie-aware within the
derived summation tolerance) and equal the rule applied to the kernel's own
score matrix exactly.
"""

import functools
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import streamidx as si
from streamidx import metrics, modes, topk
from streamidx.lab.model import topk as topk_model

from streamidx.lab.studies import cases
from kernel_scores import KernelWithScores
import oracle
import tiers

EXACT = topk.EXACT_TOPK_METHODS
# Method options that change the algorithm's internals, not its result.
VARIANTS = [("sort", {}), ("top_k", {}), ("chunked", {}),
            ("chunked", {"chunk_size": 8}), ("chunked", {"chunk_size": 64}),
            ("blockmax", {}), ("blockmax", {"block_size": 1}),
            ("blockmax", {"block_size": 4}), ("radix", {}),
            ("radix", {"radix_bits": 1}), ("radix", {"radix_bits": 2}),
            ("radix", {"radix_bits": 8})]


DEFAULTS = [(m, {}) for m in EXACT]
# Options that move the chunk, block and digit boundaries into small rows.
SMALL = DEFAULTS + [("chunked", {"chunk_size": 8}),
                    ("blockmax", {"block_size": 4}), ("radix", {"radix_bits": 2})]


def _all_variants(scores, k, variants):
  x = jnp.asarray(scores, jnp.float32)
  return {(m, tuple(kw.items())): np.asarray(topk.select_topk(x, k, m, **kw))
          for m, kw in variants}


def _assert_all_equal_rule(scores, k, variants=VARIANTS):
  want = oracle.topk_rule(scores, k)
  np.testing.assert_array_equal(np.asarray(si.ref.topk_from_scores(
      jnp.asarray(scores), k)), want)
  for key, got in _all_variants(scores, k, variants).items():
    assert got.dtype == np.int32 and got.shape == want.shape, key
    np.testing.assert_array_equal(got, want, err_msg=str(key))


# Fixed shapes: each compiles once per method, whatever hypothesis draws.
SHAPES = [(3, 200, 16), (2, 37, 50), (4, 300, 7), (2, 96, 96)]


@settings(derandomize=True, max_examples=25, deadline=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(shape=st.sampled_from(SHAPES), seed=st.integers(0, 2**31 - 1),
       levels=st.integers(1, 6), p_hidden=st.floats(0.0, 0.95),
       p_neg_zero=st.floats(0.0, 0.5))
def test_exact_methods_agree_on_integer_scores_with_massive_ties(
    shape, seed, levels, p_hidden, p_neg_zero):
  t, n, k = shape
  rng = np.random.default_rng(seed)
  x = rng.integers(-levels, levels + 1, size=(t, n)).astype(np.float32)
  x[rng.random((t, n)) < p_neg_zero] = -0.0
  x[rng.random((t, n)) < p_hidden] = -np.inf
  _assert_all_equal_rule(x, k, SMALL)


@pytest.mark.parametrize("t,n,k,variants", [
    (4, 1000, 32, VARIANTS), (3, 4096, 100, DEFAULTS), (2, 64, 64, DEFAULTS)])
def test_exact_methods_agree_on_random_scores(t, n, k, variants):
  rng = np.random.default_rng(n)
  x = rng.standard_normal((t, n)).astype(np.float32)
  x[:, rng.random(n) < 0.2] = -np.inf
  _assert_all_equal_rule(x, k, variants)


@pytest.mark.parametrize("name,scores,k", [
    ("all_hidden_rows", np.full((3, 50), -np.inf, np.float32), 8),
    ("no_rows", np.zeros((0, 50), np.float32), 8),
    ("k_above_entries", np.arange(12, dtype=np.float32).reshape(2, 6), 10),
    ("one_entry", np.array([[2.0], [-np.inf]], np.float32), 3),
    ("k_is_one", np.array([[1.0, 3.0, 3.0, -np.inf]], np.float32), 1),
    ("infinite_scores",
     np.array([[np.inf, 1.0, np.inf, -np.inf, -1.0, np.inf]], np.float32), 4),
    ("zeros_of_both_signs",
     np.array([[-0.0, 0.0, -0.0, 0.0, -1.0, 5.0]], np.float32), 3),
    ("float_extremes", np.array([[3e38, -3e38, 1e-45, -1e-45, 0.0, 1.0]],
                                np.float32), 4),
])
def test_exact_methods_on_edge_rows(name, scores, k):
  _assert_all_equal_rule(scores, k, DEFAULTS)
  if name == "k_above_entries":  # padded with -1 like the kernel
    assert (oracle.topk_rule(scores, k)[:, 6:] == -1).all()


def test_sort_takes_the_lowest_index_ties_whatever_the_sort_returns(
    ties_backwards):
  """approx_max_k's comparator leaves ties unordered; XLA:CPU happens to
  return the lowest indices, so a sort that returns the highest ones (the
  fixture's) stands in for a TPU's here: "sort" must still give the rule's
  indices."""
  del ties_backwards
  rng = np.random.default_rng(7)
  x = rng.integers(-2, 3, size=(4, 120)).astype(np.float32)
  x[0] = 1.0  # one row of a single value
  x[1, 60:] = -np.inf
  for k in (5, 40, 119):
    got = np.asarray(topk.sort.select(jnp.asarray(x), k))
    np.testing.assert_array_equal(got, oracle.topk_rule(x, k), err_msg=str(k))


def test_radix_row_loop_equals_the_rule(monkeypatch):
  """Past `STEP_ENTRIES` entries radix selects a block of rows at a time
  (here 2 rows of 7, the last block padded)."""
  monkeypatch.setattr(topk.radix, "STEP_ENTRIES", 2 * 90)
  rng = np.random.default_rng(11)
  x = rng.integers(-3, 4, size=(7, 90)).astype(np.float32)
  x[2] = -np.inf
  got = np.asarray(topk.radix.select(jnp.asarray(x), 20))
  np.testing.assert_array_equal(got, oracle.topk_rule(x, 20))


@tiers.needs_libtpu
def test_radix_fits_a_v5e_at_a_prefill_chunk(monkeypatch):
  """All 2,048 rows of 262,144 entries at once needed 16.5 GB of HBM
  temporaries: the chip refused them (RESOURCE_EXHAUSTED); the compiler
  refuses them here too (about 6 CPU-s)."""
  monkeypatch.setenv("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
  with modes.compile_for("v5e") as target:
    fn = jax.jit(functools.partial(topk.radix.select, k=512))
    mem = fn.lower(target.spec((2048, 262144), jnp.float32)).compile(
        ).memory_analysis()
  used = mem.temp_size_in_bytes + mem.argument_size_in_bytes
  assert used < topk_model.hardware.spec("v5e").hbm_capacity_bytes / 2, used


def test_order_key_preserves_the_float_order():
  vals = np.array([-np.inf, -3e38, -1.0, -1e-45, -0.0, 0.0, 1e-45, 1.0,
                   3e38, np.inf], np.float32)
  keys = np.asarray(topk.order_key(jnp.asarray(vals)))
  assert (np.diff(keys.astype(np.int64)) > 0).all()
  assert keys[0] == topk.base.NEG_INF_KEY


def test_bad_method_and_options_are_rejected():
  x = jnp.zeros((2, 8), jnp.float32)
  with pytest.raises(ValueError, match=r"topk_method: must be one of "
                     r"\('sort', 'top_k'.*\(got 'heap'\)"):
    topk.select_topk(x, 2, "heap")
  for kw, match in [({"k": 0}, r"k: must be a positive int"),
                    ({"radix_bits": 3, "method": "radix"},
                     r"radix_bits: must be one of"),
                    ({"chunk_size": 0, "method": "chunked"},
                     r"chunk_size: must be a positive"),
                    ({"radix_bits": 4}, r"radix_bits: not an option of "
                     r"topk_method 'sort' \(its options: none\)"),
                    ({"recall_target": 1.0, "method": "approx"},
                     r"recall_target: must be in \(0, 1\)")]:
    kw = {"k": 2, **kw}
    with pytest.raises(ValueError, match=match):
      topk.select_topk(x, **kw)
  with pytest.raises(ValueError, match=r"scores: must be a 2-D"):
    topk.select_topk(jnp.zeros((8,)), 2)


def test_model_sizes_pick_a_real_split():
  # The chunk keeps at least k per chunk and splits long rows; blocks
  # leave more than k of them.
  assert topk.chunk_size_for(262144, 512) >= 512
  assert 262144 // topk.chunk_size_for(262144, 512) > 1
  b = topk.block_size_for(262144, 512)
  assert 262144 // b > 512 and b % 128 == 0
  assert topk.block_size_for(32768, 2048) == 32768  # one block: one top_k
  assert topk_model.cost("blockmax", 64, 32768, 2048).detail == (
      topk_model.cost("top_k", 64, 32768, 2048).detail)


# ---------------------------------------------------------------------------
# approx: not exact on a TPU; its recall is reported.


def test_approx_returns_a_valid_selection_and_reports_recall():
  rng = np.random.default_rng(1)
  x = rng.standard_normal((8, 8192)).astype(np.float32)
  k = 256
  got = np.asarray(topk.select_topk(jnp.asarray(x), k, "approx",
                                    recall_target=0.9))
  want = oracle.topk_rule(x, k)
  assert all(len(set(r.tolist())) == k for r in got)
  # Off-TPU XLA's approx_max_k falls back to an exact sort.
  if jax.default_backend() != "tpu":
    np.testing.assert_array_equal(got, want)
  # The TPU algorithm (bins -> maxima -> exact top-k), emulated: its recall
  # against the exact top-k, and XLA's expected recall for its bin count.
  r = topk_model.approx_recall(x, k, recall_target=0.9)
  assert 0.0 < r["emulated_recall"] <= 1.0
  assert r["bins"] < x.shape[1]
  assert r["emulated_recall"] >= r["expected_recall"] - 0.05
  assert r["expected_recall"] >= 0.9 - 1e-6
  exact = topk_model.approx_recall(x, k, recall_target=0.999999)
  assert exact["emulated_recall"] >= r["emulated_recall"]


# ---------------------------------------------------------------------------
# Through the kernel: `topk_method` on the whole case matrix.

# Each test batch of the case matrix (`streamidx.lab.studies.cases`) runs
# the (interpreted) kernel once, with one method, cycling through the exact
# methods, and its score matrix is captured; every exact method is then also
# applied to that matrix. "ties_at_zero_all_launches" with one head puts
# the k-th score of many rows inside a group of exact zeros.
BLOCKS = cases.blocks_for("vendored")
K = cases.K_TESTS
# The methods that select from the score buffer alone ("fused_blockmax"
# reads the kernel's block maxima too: tests/test_topk_fused.py).
KERNEL_EXACT = tuple(m for m in EXACT if m in topk.KERNEL_TOPK_METHODS)
KERNEL_RUNS = [(b, KERNEL_EXACT[i % len(KERNEL_EXACT)], 4, cases.NUM_HEADS)
               for i, b in enumerate(cases.TEST_BATCHES)] + [
                   ("ties_at_zero_all_launches", "radix", 1, 1),
                   ("ties_at_zero_all_launches", "sort", 4, 1)]


@functools.lru_cache(maxsize=None)
def _inputs(batch_name, ratio=4, num_heads=cases.NUM_HEADS, fmt="fp8"):
  b = cases.BATCHES[batch_name].build(ratio)
  return si.make_inputs(b, num_heads=num_heads, fmt=fmt, seed=ratio)


# CI: the two tie runs, then the first batch of each method not yet run;
# the other batches in the full tier (tests/tiers.py).
KERNEL_RUNS_CI = [r for r in KERNEL_RUNS if r[0] == "ties_at_zero_all_launches"]
for _run in KERNEL_RUNS:
  if _run[1] not in {r[1] for r in KERNEL_RUNS_CI}:
    KERNEL_RUNS_CI.append(_run)


@pytest.mark.parametrize("case,method,ratio,heads", tiers.split(
    KERNEL_RUNS, lambda r: r in KERNEL_RUNS_CI,
    ids=lambda r: "-".join(map(str, r))))
def test_kernel_topk_method_matches_reference(case, method, ratio, heads):
  inp = _inputs(case, ratio, heads)
  kw = dict(k=K, compression_ratio=ratio, **BLOCKS)
  idx, kernel_scores = KernelWithScores("token")(*inp.args, topk_method=method,
                                                 **kw)
  want = si.streamindex_topk_ref(*inp.args, topk_method=method, **kw)
  scores = si.token_scores(*inp.args, compression_ratio=ratio)
  metrics.assert_topk_match(
      idx, want, scores, label=f"{case}/{method}",
      atol=metrics.summation_atol(inp, compression_ratio=ratio))
  # On the kernel's own scores every exact method returns its indices.
  np.testing.assert_array_equal(idx, oracle.topk_rule(kernel_scores, K))
  for m in EXACT:
    np.testing.assert_array_equal(
        np.asarray(topk.select_topk(jnp.asarray(kernel_scores), K, m)), idx,
        err_msg=m)


def test_kernel_hands_blocktop_its_score_buffer_unreshaped(monkeypatch):
  """M25: 8 decode rows of 1,024 entries (whole groups, one whole tile) in
  3-page blocks, which widen the buffer to 9 pages: blocktop reads the
  kernel's f32[T, W / 128, 128] as written, its first 1,024 entries (M24's
  cut, without a copy), and returns the rule's indices on the kernel's own
  scores."""
  seen = []
  real = topk.blocktop.kernel_call
  monkeypatch.setattr(topk.blocktop, "kernel_call", lambda x, *a, **kw: (
      seen.append(x.shape), real(x, *a, **kw))[1])
  b = si.make_mixed_batch(decode=[4096 - 40 * i for i in range(8)],
                          page_size=128, compression_ratio=4)
  inp = si.make_inputs(b, num_heads=4, fmt="fp8", seed=3)
  idx, kernel_scores = KernelWithScores("token")(
      *inp.args, k=K, compression_ratio=4, topk_method="blocktop",
      num_kv_pages_per_block=(3, 8, 8), num_queries_per_block=(1, 8, 8))
  assert seen == [(8, 9, 128)]
  np.testing.assert_array_equal(idx, oracle.topk_rule(kernel_scores, K))


def test_kernel_approx_method_reports_recall():
  inp = _inputs("decode_only_full_batches")
  kw = dict(k=K, compression_ratio=4, **BLOCKS)
  got = np.asarray(si.streamindex_topk(*inp.args, topk_method="approx", **kw))
  want = np.asarray(si.streamindex_topk_ref(*inp.args, **kw))
  scores = np.asarray(si.token_scores(*inp.args, compression_ratio=4))
  recall = metrics.recall_at_k(got, want, scores)
  assert 0.0 < recall <= 1.0
  if jax.default_backend() != "tpu":  # the exact fallback
    assert recall == 1.0


def test_kernel_and_references_reject_a_bad_topk_method():
  inp = _inputs("decode_only_fewer_than_batch")
  kw = dict(k=K, compression_ratio=4, topk_method="bogus", **BLOCKS)
  for fn in (si.streamindex_topk, si.streamindex_topk_ref,
             si.streaming.streamindex_topk_streaming):
    with pytest.raises(ValueError, match=r"topk_method: must be one of"):
      fn(*inp.args, **kw)
  with pytest.raises(ValueError, match=r"topk_method: must be one of"):
    si.validate_topk_inputs(*inp.args, **kw)


def test_variant_passes_topk_method_through():
  v = si.VARIANTS["vendored"]
  inp = _inputs("decode_only_fewer_than_batch")
  static = v.static(inp, k=K, compression_ratio=4, topk_method="radix")
  assert static["topk_method"] == "radix"
  assert v.topk_methods == topk.TOPK_METHODS
  assert si.VARIANTS["dense"].topk_methods == topk.TOPK_METHODS
  page = si.VARIANTS["vendored_page"]
  assert page.topk_methods == ()  # pages by top_k: no such argument
  with pytest.raises(TypeError, match="topk_method"):
    page.kernel.call(*inp.page_args, k_pages=4, topk_method="radix")


def test_topk_methods_are_exported():
  assert si.TOPK_METHODS == topk.TOPK_METHODS
  assert {"sort", "top_k", "chunked", "blockmax", "fused_blockmax", "radix",
          "blocktop"} <= set(EXACT)
  assert "approx" in topk.TOPK_METHODS and "approx" not in EXACT
  assert topk.VENDORED_TOPK_METHOD == "sort"


# ---------------------------------------------------------------------------
# The benchmark and the compile check.


def test_topk_bench_times_every_method_and_checks_them(tmp_path, capsys):
  from streamidx.lab.bench import topk as topk_bench
  rc = topk_bench.main(["--shapes", "decode:4x4000:100", "--repeats", "1",
                        "--out", str(tmp_path)])
  assert rc == 0
  doc = json.loads((tmp_path / "topk.json").read_text())
  assert doc["schema"] == topk_bench.SCHEMA
  impls = [r["impl"] for r in doc["results"]]
  assert impls == ["reference", *topk.TOPK_METHODS]
  # Each one against the rule's NumPy oracle, not against the reference.
  for r in doc["results"]:
    assert r["exact"] == (r["impl"] == "reference" or r["impl"] in EXACT)
    assert r["rows"] == 4
    if r["exact"]:
      assert r["rows_identical"] == 4, r
  assert topk_bench.failures(doc) == []
  approx = doc["results"][-1]
  assert not approx["exact"] and 0.0 < approx["recall"] <= 1.0
  assert 0.0 < approx["tpu_recall_model"]["emulated_recall"] <= 1.0
  # A method (or the reference) off the rule on a row fails the run.
  doc["results"][0]["rows_identical"] = 3
  assert topk_bench.failures(doc) == ["4x1000:100 reference"]
  assert "rule: DIFFERS (3/4 rows identical)" in topk_bench.format_table(doc)
  if jax.default_backend() != "tpu":
    assert doc["timings_are"].startswith("CPU timings")
  assert "CPU timings" in capsys.readouterr().out or (
      jax.default_backend() == "tpu")
  with pytest.raises(SystemExit):
    topk_bench.main(["--shapes", "decode:4x0:1"])


@tiers.FULL  # about 30 CPU-s: every method compiled for v5e
@tiers.needs_libtpu
def test_every_method_compiles_for_a_tpu_generation(monkeypatch):
  monkeypatch.setenv("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
  from streamidx.lab import calibration
  with modes.compile_for("v5e") as target:
    for m in topk.TOPK_METHODS:
      extra = calibration.extra_input(m, 8, 2048)
      specs = [target.spec((8, 2048), jnp.float32)] + (
          [target.spec(*extra)] if extra else [])
      fn = jax.jit(functools.partial(calibration.selection_program, k=64,
                                     method=m))
      assert fn.lower(*specs).compile() is not None, m


# ---------------------------------------------------------------------------
# The model.


def test_model_counts_reads_passes_and_work():
  t, n, k = 64, 262144, 512
  buf = t * n * 4
  top = topk_model.cost("top_k", t, n, k)
  assert top.bytes_read == buf and top.passes == 1
  assert top.sort_work == t * (n / 2) * 18 * 19 / 2  # bitonic, n = 2^18
  assert topk_model.cost("sort", t, n, k).bytes_read == 2 * buf
  radix = topk_model.cost("radix", t, n, k, radix_bits=4)
  assert radix.passes == 8 + 3 and radix.sort_work < top.sort_work
  chunked = topk_model.cost("chunked", t, n, k)
  assert chunked.sort_work < top.sort_work and chunked.passes == 1
  fused = topk_model.cost("fused_blockmax", t, n, k)
  assert fused.bytes_read < topk_model.cost("blockmax", t, n, k).bytes_read
  # Too few entries to split: the method is one top_k.
  assert topk_model.cost("chunked", 4, 300, 512).detail == top.detail
  spec = topk_model.hardware.spec("v7x")
  assert topk_model.hbm_bound(top, spec) == top.bytes / spec.device_bandwidth


def test_model_refuses_an_unknown_method_or_option():
  with pytest.raises(ValueError, match=r"topk_method: must be one of .*"
                     r"\(got 'heap'\)"):
    topk_model.cost("heap", 64, 262144, 512)
  with pytest.raises(ValueError, match=r"chunk_size: not an option of "
                     r"topk_method 'radix'"):
    topk_model.cost("radix", 64, 262144, 512, chunk_size=4096)


def test_compile_matrix_has_a_row_per_topk_method():
  from streamidx.lab import aot
  rows = aot.matrix(quick=True, variants=["vendored"], formats=["fp8"],
                    generations=["v6e"], topk_methods=topk.TOPK_METHODS)
  methods = [r.topk_method for r in rows]
  assert methods == [None, *topk.TOPK_METHODS]  # the vendored's: all
  assert rows[3].static["topk_method"] == topk.TOPK_METHODS[2]
  assert all(r.table for r in rows)
  assert "topk_method" not in rows[0].static
  page = aot.matrix(quick=True, variants=["vendored_page"], formats=["fp8"],
                    generations=["v6e"], topk_methods=topk.TOPK_METHODS)
  assert [r.topk_method for r in page] == [None]  # page mode takes none


def test_a_fused_method_gets_its_extra_output_as_a_compiled_input():
  from streamidx.lab import calibration
  assert calibration.extra_input("sort", 64, 262144) is None
  w = topk.METHODS["fused_blockmax"].options["block_max_width"].default
  assert calibration.extra_input("fused_blockmax", 64, 262144) == (
      (64, 262144 // w), "float32")
