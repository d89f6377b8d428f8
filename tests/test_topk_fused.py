"""The selection fused into the scoring: topk_method="fused_blockmax".

Every token kernel body (vendored over its fp8 and bf16 caches, dense, lean,
fp4) writes, besides the scores, the maximum of every 128-entry score row
(`streamidx.kernels.block_max`) when the selection reads it;
`streamidx.topk.select_topk(..., "fused_blockmax", block_max=...)` ranks
blocks by those maxima and runs "blockmax"'s second stage. Checked here:
- the selection alone, given maxima of small blocks (so that short rows have
  many blocks), returns the rule's indices bit for bit on integer scores with
  massive ties and on random scores (`oracle.topk_rule`);
- through each body (interpreted), on every test batch of the case matrix
  (CI: dense's all, one batch for each other body), a long decode batch
  whose maxima straddle two 128-lane rows of maxima and, dense, a seeded
  random batch on two simulated cores: the maxima it writes are the maxima
  of the scores it writes, its indices are the rule's on its own scores and
  match the reference tie-aware within the derived tolerance; race-free
  under the detector;
- a body that emits no maxima refuses the method, naming the argument;
- the interpreter-counted DMAs of the extra output, and the model.
"""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import streamidx as si
from streamidx import metrics, topk
from streamidx.lab import shapes
from streamidx.kernels import block_max as block_max_kernel
from streamidx.kernels import driver, entries
from streamidx.lab.model import topk as topk_model
from streamidx.lab.studies import cases, costs

from kernel_scores import KernelWithScores
import oracle
import tiers

W = topk.FUSED_BLOCK_WIDTH


def _block_max(x, width):
  """f32[T, cdiv(N, width)]: the maximum of each `width` entries (NumPy)."""
  t, n = x.shape
  pad = np.full((t, -n % width), -np.inf, np.float32)
  return np.concatenate([x, pad], axis=1).reshape(t, -1, width).max(axis=2)


def _fused(x, k, width, block_size, with_maxima=True):
  m = jnp.asarray(_block_max(x, width)) if with_maxima else None
  return np.asarray(topk.select_topk(
      jnp.asarray(x), k, "fused_blockmax", block_max=m,
      block_max_width=width, block_size=block_size))


# ---------------------------------------------------------------------------
# The selection, given the maxima.

SHAPES = [(3, 200, 16), (2, 37, 5), (4, 300, 7)]
# (block_max_width, block_size): blocks of one maximum, and of two.
WIDTHS = [(4, 4), (4, 8), (8, 8)]


@settings(derandomize=True, max_examples=20, deadline=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(shape=st.sampled_from(SHAPES), widths=st.sampled_from(WIDTHS),
       seed=st.integers(0, 2**31 - 1), levels=st.integers(1, 6),
       p_hidden=st.floats(0.0, 0.95), p_neg_zero=st.floats(0.0, 0.5))
def test_fused_blockmax_on_integer_scores_with_massive_ties(
    shape, widths, seed, levels, p_hidden, p_neg_zero):
  t, n, k = shape
  rng = np.random.default_rng(seed)
  x = rng.integers(-levels, levels + 1, size=(t, n)).astype(np.float32)
  x[rng.random((t, n)) < p_neg_zero] = -0.0
  x[rng.random((t, n)) < p_hidden] = -np.inf
  want = oracle.topk_rule(x, k)
  np.testing.assert_array_equal(_fused(x, k, *widths), want)
  # The same from the buffer alone (the references' call).
  np.testing.assert_array_equal(_fused(x, k, *widths, with_maxima=False),
                                want)


@pytest.mark.parametrize("t,n,k", [(4, 1000, 32), (3, 4096, 12)])
def test_fused_blockmax_on_random_scores(t, n, k):
  rng = np.random.default_rng(n)
  x = rng.standard_normal((t, n)).astype(np.float32)
  x[:, rng.random(n) < 0.2] = -np.inf
  want = oracle.topk_rule(x, k)
  for width, block in [(W, W), (W, 2 * W), (8, 16)]:
    np.testing.assert_array_equal(_fused(x, k, width, block), want,
                                  err_msg=f"{width}/{block}")
  # Default block (fused_block_size_for) from the kernel's width.
  np.testing.assert_array_equal(_fused(x, k, W, None), want)


def test_fused_blockmax_ignores_maxima_columns_past_the_row():
  x = np.arange(40, dtype=np.float32).reshape(2, 20)
  m = np.concatenate([_block_max(x, 4), np.full((2, 3), 1e9, np.float32)], 1)
  got = topk.select_topk(jnp.asarray(x), 2, "fused_blockmax",
                         block_max=jnp.asarray(m), block_max_width=4)
  np.testing.assert_array_equal(got, oracle.topk_rule(x, 2))


def test_fused_blockmax_arguments_are_checked():
  x = jnp.zeros((2, 16), jnp.float32)
  m = jnp.zeros((2, 4), jnp.float32)
  with pytest.raises(ValueError, match=r"block_max: only for a method that "
                     r"reads block maxima, \('fused_blockmax',\) "
                     r"\(got method 'blockmax'\)"):
    topk.select_topk(x, 2, "blockmax", block_max=m, block_max_width=4)
  with pytest.raises(ValueError, match=r"block_max: must be f32\[T, >= "
                     r"cdiv\(N, block_max_width\)\] = \[2, >= 4\]"):
    topk.select_topk(x, 2, "fused_blockmax", block_max=m[:, :3],
                     block_max_width=4)
  with pytest.raises(ValueError, match=r"block_size: must be a multiple of "
                     r"block_max_width \(4\)"):
    topk.select_topk(x, 2, "fused_blockmax", block_max=m, block_max_width=4,
                     block_size=6)


# ---------------------------------------------------------------------------
# Through the kernel bodies (interpreted).

DENSE = si.VARIANTS["dense"]
# Every token body, each over each of its cache formats.
BODIES = tuple((v, fmt) for v in ("dense", "vendored", "lean", "fp4")
               for fmt in si.VARIANTS[v].cache_formats)
# CI: the dense body over the case matrix, each other body (its first cache
# format) over one batch; the rest in the full tier (tests/tiers.py).
CI_BATCH = "all_three_ranges"
BLOCKS = cases.blocks_for("dense")
# k 3 < the 4 blocks of 128 entries of the case matrix's 512 score columns:
# the two-stage path runs (at K_TESTS it would be one top_k of the row, the
# path the selection tests above cover with k >= blocks).
K_FUSED = 3


def _body_id(body):
  return "-".join(body)


@functools.lru_cache(maxsize=None)
def _inputs(batch_name, fmt="dense_fp8", ratio=4):
  b = cases.BATCHES[batch_name].build(ratio)
  return si.make_inputs(b, num_heads=cases.NUM_HEADS, fmt=fmt, seed=ratio)


# One instance per body: the case matrix's batches share their shapes, so
# each interpreted kernel is traced once for all of them.
@functools.lru_cache(maxsize=None)
def _run(variant):
  return KernelWithScores("token", variant=variant)


def _check_fused_run(inp, *, k, ratio, label, variant="dense", fmt=None,
                     **blocks):
  v = si.VARIANTS[variant]
  run = _run(variant)
  idx, scores = run(*v.args(inp, fmt), k=k, compression_ratio=ratio,
                    topk_method="fused_blockmax", **blocks)
  bmax = run.block_max
  assert bmax is not None, "no block maxima captured"
  # The maxima it wrote are the maxima of the scores it wrote.
  rows = scores.reshape(scores.shape[0], -1, W).max(axis=2)
  assert bmax.shape == rows.shape, (bmax.shape, rows.shape)
  np.testing.assert_array_equal(bmax, rows, err_msg=f"{label}: block maxima")
  # Its indices are the rule's on its own scores, bit for bit ...
  np.testing.assert_array_equal(idx, oracle.topk_rule(scores, k), err_msg=label)
  # ... and the reference's, tie-aware within the derived tolerance.
  want = v.run_reference(inp, k=k, compression_ratio=ratio, fmt=fmt,
                         topk_method="fused_blockmax", **blocks)
  metrics.assert_topk_match(
      idx, want, v.scores(inp, compression_ratio=ratio, fmt=fmt),
      atol=metrics.summation_atol(inp, compression_ratio=ratio), label=label)
  return idx, scores, bmax


def _matrix():
  """(variant, fmt, batch): the dense body over the case matrix and each
  other body's first format over `CI_BATCH` in CI, the rest full."""
  firsts = {v: fmt for v, fmt in reversed(BODIES)}
  return tiers.split(
      [(v, fmt, case) for v, fmt in BODIES for case in cases.TEST_BATCHES],
      lambda p: p[0] == "dense" or (p[2] == CI_BATCH
                                    and firsts[p[0]] == p[1]),
      ids=lambda p: "-".join(p))


@pytest.mark.parametrize("variant,fmt,case", _matrix())
def test_fused_blockmax_matches_reference(variant, fmt, case):
  _check_fused_run(_inputs(case, fmt), k=K_FUSED, ratio=4,
                   label=f"{variant}/{fmt}/{case}", variant=variant, fmt=fmt,
                   **cases.blocks_for(variant))


@functools.lru_cache(maxsize=None)
def _long_decode(fmt="dense_fp8"):
  # 130 score rows of 128 entries a sequence, KV blocks of 3 pages of 128
  # (3 maxima each): KV block 42's maxima are score rows 126-128, which
  # straddle the first two 128-lane rows of maxima.
  b = si.make_mixed_batch(decode=[130 * 128, 129 * 128 - 5, 700],
                          page_size=128, compression_ratio=1)
  return si.make_inputs(b, num_heads=2, fmt=fmt, seed=3)


LONG_BLOCKS = dict(num_kv_pages_per_block=(3, 3, 3),
                   num_queries_per_block=(1, 8, 8))


@pytest.mark.parametrize("variant,fmt", tiers.first(BODIES, ids=_body_id))
def test_fused_blockmax_long_decode_straddling_rows(variant, fmt):
  inp = _long_decode(fmt)
  _, _, bmax = _check_fused_run(inp, k=8, ratio=1, label="long decode",
                                variant=variant, fmt=fmt, **LONG_BLOCKS)
  # 130 pages a row of the table, aligned to 3-page blocks: 132 score rows in
  # the buffer, two rows of maxima, and the one a straddling KV block may
  # touch; the selection reads the table's 130 (M24).
  assert bmax.shape[1] == 130
  assert block_max_kernel.rows(132, [3]) == 3
  assert np.isfinite(bmax[0, 126:129]).all()  # the straddling maxima
  assert np.isfinite(bmax[0]).all()


@pytest.mark.parametrize("variant,fmt", tiers.first(BODIES, ids=_body_id))
def test_fused_blockmax_is_race_free(variant, fmt):
  v = si.VARIANTS[variant]
  inp = _inputs("all_three_ranges", fmt)
  blocks = cases.blocks_for(variant)
  with si.race_check() as report:
    got = v.run(inp, k=K_FUSED, compression_ratio=4, fmt=fmt,
                topk_method="fused_blockmax", **blocks)
  jax.block_until_ready(got)
  assert report.launches >= 3 and not report.races_found, report
  want = v.run_reference(inp, k=K_FUSED, compression_ratio=4, fmt=fmt,
                         **blocks)
  metrics.assert_topk_match(got, want,
                            v.scores(inp, compression_ratio=4, fmt=fmt),
                            atol=metrics.summation_atol(inp,
                                                        compression_ratio=4))


# Full tier (tests/tiers.py): one core's race check and the two-core dense
# kernel's (tests/test_dense.py) run in CI. The bodies that take num_cores.
@tiers.FULL
@pytest.mark.parametrize("variant", ["dense", "lean"])
def test_fused_blockmax_random_batch_on_two_cores_is_race_free(variant):
  # A seeded random ragged batch (every range, fragmented pages), its
  # programs split over two simulated cores: each core's prologue resets the
  # block-max slots it inherits.
  rng = np.random.default_rng(11)
  b = si.make_mixed_batch(
      decode=rng.integers(1, 2400, size=5).tolist(),
      prefill=[(int(rng.integers(2, 20)), int(rng.integers(400, 2400)))],
      mixed=[(int(rng.integers(1, 12)), int(rng.integers(60, 2400)))
             for _ in range(2)],
      page_size=16, compression_ratio=4, allocation="fragmented",
      max_num_seqs=10, num_tokens=48, seed=5)
  inp = si.make_inputs(b, num_heads=2, fmt="dense_fp8", seed=2)
  blocks = dict(num_kv_pages_per_block=8, num_queries_per_block=(1, 8, 8),
                decode_req_batch_size=2)
  with si.race_check(num_cores_or_threads=2) as report:
    _, scores, _ = _check_fused_run(inp, k=3, ratio=4, label="random",
                                    variant=variant, num_cores=2, **blocks)
  assert report.launches >= 3 and not report.races_found, report
  assert scores.shape[1] // W > 3  # more blocks than k: both stages ran
  si.reset_interpreter_state()


def test_block_maxima_dmas_are_small():
  """Interpreter-counted DMAs: one block-max DMA per query block, rows x G
  x 128 floats each, beside the score DMAs (one per KV block)."""
  inp = _long_decode()
  _, rec = costs.run_recorded("dense", inp, topk_method="fused_blockmax", k=8,
                              compression_ratio=1, **LONG_BLOCKS)
  fused = costs.recorded_bytes(rec, page_size=int(inp.batch.page_size))
  t1 = fused["totals"]
  # 3 decode sequences, fewer than a decode batch of 4: 3 programs of one
  # query row, each sending its row of maxima once: G = 3 rows of 128
  # floats. The scores: one DMA per KV block, 1 row x 3 x 128 floats, over
  # 44 + 43 + 2 KV blocks.
  assert t1["dma_starts"]["block_max"] == 3
  assert t1["bytes"]["block_max"] == 3 * (3 * 128 * 4)
  assert t1["bytes"]["out"] == (44 + 43 + 2) * (3 * 128 * 4)
  # At production sizes the maxima are 1/128 of the scores (lab.model.topk);
  # here the rows are short and padded to whole 128-lane rows of maxima.


# ---------------------------------------------------------------------------
# Who takes the method.


def test_a_body_that_emits_nothing_refuses_fused_blockmax():
  """The call's refusal, through an entry point's doors (run, checked,
  validate, call), for a body built here that emits no maxima (every
  registered token body emits them)."""
  silent = dataclasses.replace(entries.VENDORED, name="silent", emits=())
  entry = driver.Entry(si.streamindex_topk.spell, silent, "token", "silent")
  inp = si.make_inputs(cases.BATCHES["decode_only_fewer_than_batch"].build(4),
                       num_heads=cases.NUM_HEADS, fmt="fp8", seed=4)
  kw = dict(k=4, compression_ratio=4, topk_method="fused_blockmax",
            **cases.blocks_for("vendored"))
  match = (r"topk_method: must be one of \('sort', .*\) for the 'silent' "
           r"kernel body; 'fused_blockmax' reads the kernel's extra output "
           r"'block_max', which only a kernel writing it beside its scores "
           r"gives \(got 'fused_blockmax'\)")
  for fn in (entry, entry.checked, entry.validate, entry.call):
    with pytest.raises(ValueError, match=match):
      fn(*inp.args, **kw)
  assert "fused_blockmax" not in silent.topk_methods
  for name, v in si.VARIANTS.items():
    assert ("fused_blockmax" in v.topk_methods) == (v.mode == "token"), name


def test_a_body_takes_a_fused_method_only_if_it_emits_its_output():
  """The body contract: a body lists the outputs it can write beside the
  scores (`KernelBody.emits`); its methods follow, and a call for a body
  without the output its method needs is refused when it is built, with
  the body's name."""
  block_max = driver.Output("block_max", block_max_kernel.buffer)
  plain = driver.KernelBody("plain", launch=None, cache_formats=("fp8",))
  emitting = dataclasses.replace(plain, name="emitting", emits=(block_max,))
  assert plain.topk_methods == topk.KERNEL_TOPK_METHODS
  assert emitting.topk_methods == topk.TOPK_METHODS
  fused = si.TopkCall(k=4, compression_ratio=4, topk_method="fused_blockmax",
                      body=emitting)
  assert fused == si.TopkCall(k=4, compression_ratio=4,
                              topk_method="fused_blockmax")  # not a field
  si.TopkCall(k=4, compression_ratio=4, topk_method="sort", body=plain)
  with pytest.raises(ValueError, match=r"for the 'plain' kernel body; "
                     r"'fused_blockmax' reads the kernel's extra output "
                     r"'block_max'"):
    si.TopkCall(k=4, compression_ratio=4, topk_method="fused_blockmax",
                body=plain)


def test_compile_matrix_rows_for_fused_blockmax():
  from streamidx.lab import aot
  bodies = ["vendored", "dense", "lean", "fp4"]
  rows = aot.matrix(quick=True, variants=bodies, formats=None,
                    generations=["v6e"], topk_methods=("fused_blockmax",))
  by_body = {}
  for r in rows:
    by_body.setdefault((r.variant, r.fmt), []).append(r.topk_method)
  # Every body, each of its cache formats: the default row, then the fused.
  assert sorted(by_body) == sorted(BODIES)
  assert all(m == [None, "fused_blockmax"] for m in by_body.values()), by_body


# ---------------------------------------------------------------------------
# The model.


def test_model_of_fused_blockmax():
  t, n, k = 64, 262144, 512
  fused = topk_model.cost("fused_blockmax", t, n, k)
  blockmax = topk_model.cost("blockmax", t, n, k)
  b = topk.fused_block_size_for(n, k)
  assert b == W == topk.block_size_for(n, k)
  maxima = n // W
  # Read: the kernel's maxima, then k blocks' entries; no pass over the
  # buffer for the maxima.
  assert fused.bytes_read == t * maxima * 4 + t * k * b * 4
  assert fused.bytes_read == blockmax.bytes_read - t * n * 4
  assert fused.passes == k * b / n == blockmax.passes - 1
  # Written: the kernel's maxima (whole rows of 128), the k block indices,
  # the winners.
  assert fused.bytes_written == (t * maxima * 4 + t * k * 4
                                 + t * k * 8 + t * k * 4)
  assert fused.sort_work == blockmax.sort_work
  for gen in ("v5e", "v6e", "v7x"):
    spec = topk_model.hardware.spec(gen)
    assert (topk_model.hbm_bound(fused, spec)
            < topk_model.hbm_bound(blockmax, spec))
  # Too few blocks: the method is one top_k, as "blockmax".
  assert topk_model.cost("fused_blockmax", 64, 32768, 512).detail == (
      topk_model.cost("top_k", 64, 32768, 512).detail)
  s = shapes.DSV4_DECODE_1M
  at_shape = topk_model.cost("fused_blockmax", s.rows, s.entries, s.k)
  assert at_shape.method == "fused_blockmax"
  assert all(topk_model.hbm_bound(at_shape, topk_model.hardware.spec(g)) > 0
             for g in ("v6e", "v7x"))
