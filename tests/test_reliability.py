"""Defects found by adversarial testing (issue 11), each pinned by its
reproducer.

1. head_dim below 128: tests/test_upstream_shapes.py.
2. A sequence without queries anywhere in a batch: the race detector
   crashed on the kernel's zero-row DMAs (kernel M7 removes every DMA of an
   empty sequence); the fixed reproducers and a hypothesis property over
   batches with empty sequences, under `race_check`.
3. int32 overflow in the page-table rule: the fixed reproducer through the
   value validator and checkify; the static limit of the kernel's int32
   block arithmetic.
4. Numbers the scoring path cannot represent: the quantizer's clamped
   exponent (scores of tiny keys are right, not all 0), and the value rules
   that reject a subnormal scale, a NaN key, and a finite query whose dot
   product overflows (0 * inf = NaN).
5. The interpreter deadlock: the public entry points return finished
   results when interpreted; the reproducer runs in a subprocess with a
   timeout.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import re
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import HealthCheck, given, note, settings
from hypothesis import strategies as st

import streamidx as si
from streamidx import cache, metrics
from streamidx.lab.model import tiling

import tiers

TOKEN_KW = dict(k=8, compression_ratio=1, num_kv_pages_per_block=2,
                num_queries_per_block=8)
PAGE_KW = dict(k_pages=1, num_queries_per_block=8)


def _run_under_race_check(inp, mode):
  with si.race_check() as report:
    if mode == "token":
      got = si.streamindex_topk(*inp.args, **TOKEN_KW)
    else:
      got = si.streamindex_page_topk(*inp.page_args, **PAGE_KW)
  return np.asarray(got), report


def _assert_matches_reference(inp, got, mode):
  if mode == "token":
    want = si.streamindex_topk_ref(*inp.args, **TOKEN_KW)
    scores = si.token_scores(*inp.args, compression_ratio=1)
    atol = metrics.summation_atol(inp, compression_ratio=1)
  else:
    want = si.streamindex_page_topk_ref(*inp.page_args, **PAGE_KW)
    scores = si.page_scores(*inp.page_args)
    atol = metrics.summation_atol(inp, compression_ratio=1, mode="page")
  metrics.assert_topk_match(got, want, scores, atol=atol)


# --- 2. empty sequences under the race detector -----------------------------

EMPTY_SEQUENCE_BATCHES = {
    "middle": [(3, 100), (0, 50), (4, 80)],
    "first": [(0, 3), (3, 100), (4, 80)],
    "decode_then_empty": [(1, 3), (0, 100), (3, 80)],
    "last_two_empty_one": [(2, 3), (0, 100)],
    "last": [(3, 4), (4, 80), (0, 3)],
}


# CI: an empty sequence in the middle (token) and after a decode (page);
# the other positions and modes in the full tier (tests/tiers.py).
@pytest.mark.parametrize("name,mode", tiers.split(
    [(n, m) for n in EMPTY_SEQUENCE_BATCHES for m in ("token", "page")],
    lambda nm: nm in (("middle", "token"), ("decode_then_empty", "page")),
    ids=lambda nm: f"{nm[0]}-{nm[1]}"))
def test_race_check_passes_with_an_empty_sequence(name, mode):
  batch = si.make_batch(EMPTY_SEQUENCE_BATCHES[name], page_size=64,
                        compression_ratio=1)
  inp = si.make_inputs(batch, num_heads=8)
  got, report = _run_under_race_check(inp, mode)
  # Every launch that has sequences runs (an empty range launches nothing).
  if mode == "token":
    plan = tiling.plan(batch, num_heads=8, **{
        k: v for k, v in TOKEN_KW.items() if k not in ("k",
                                                        "compression_ratio")})
    assert report.launches == len(plan.executed) >= 1
  else:
    assert report.launches == 1
  assert not report.races_found
  _assert_matches_reference(inp, got, mode)


# A fixed shape for every drawn batch: one compile per mode.
MAX_SEQS, NUM_TOKENS, PAGE_SIZE, PAGES_PER_SEQ = 4, 12, 64, 2


@st.composite
def batches_with_empty_sequences(draw):
  n = draw(st.integers(1, MAX_SEQS))
  pairs = []
  for _ in range(n):
    q_len = draw(st.sampled_from([0, 0, 1, 2, 3]))
    seq_len = draw(st.integers(q_len, PAGE_SIZE * PAGES_PER_SEQ))
    pairs.append((q_len, seq_len))
  if sum(q for q, _ in pairs) > NUM_TOKENS or all(q for q, _ in pairs):
    # keep within the query rows, and always at least one empty sequence
    pairs[draw(st.integers(0, n - 1))] = (0, draw(st.integers(0, 100)))
    while sum(q for q, _ in pairs) > NUM_TOKENS:
      pairs[int(np.argmax([q for q, _ in pairs]))] = (0, 5)
  return pairs


@pytest.mark.parametrize("mode", tiers.first(["token", "page"]))
@settings(max_examples=5, derandomize=True, database=None, deadline=None,
          suppress_health_check=[HealthCheck.too_slow,
                                 HealthCheck.function_scoped_fixture])
@given(pairs=batches_with_empty_sequences(), seed=st.integers(0, 2**16))
def test_race_check_passes_on_random_batches_with_empty_sequences(
    mode, pairs, seed):
  note(f"si.make_batch({pairs}, page_size={PAGE_SIZE}, compression_ratio=1, "
       f"max_num_seqs={MAX_SEQS}, num_tokens={NUM_TOKENS}, "
       f"pages_per_seq={PAGES_PER_SEQ}, allocation='shuffled', seed={seed})")
  batch = si.make_batch(pairs, page_size=PAGE_SIZE, compression_ratio=1,
                        max_num_seqs=MAX_SEQS, num_tokens=NUM_TOKENS,
                        pages_per_seq=PAGES_PER_SEQ,
                        total_num_pages=MAX_SEQS * PAGES_PER_SEQ,
                        allocation="shuffled", seed=seed)
  inp = si.make_inputs(batch, num_heads=4, seed=seed)
  if mode == "token":
    si.validate_topk_inputs(*inp.args, **TOKEN_KW)
  else:
    si.validate_page_topk_inputs(*inp.page_args, **PAGE_KW)
  got, report = _run_under_race_check(inp, mode)
  assert not report.races_found
  _assert_matches_reference(inp, got, mode)


# --- 3. int32 overflow ------------------------------------------------------

HUGE_SEQ_LEN = 2**31 - 8


def _huge_sequence_args(pages_per_seq=4):
  q = jnp.ones((1, 8, 128), jnp.bfloat16)
  w = jnp.ones((1, 8), jnp.float32)
  c = cache.pack_cache(jnp.ones((4, 64, 128), jnp.float32), "fp8")
  return (q, w, c, jnp.array([HUGE_SEQ_LEN], jnp.int32),
          jnp.zeros((pages_per_seq,), jnp.int32),
          jnp.array([0, 1], jnp.int32), jnp.array([0, 0, 1], jnp.int32))


HUGE_MESSAGE = (
    "page_indices: too few page-table columns: every sequence needs "
    "pages_per_seq (4) >= ceil((seq_len // compression_ratio) / page_size) "
    f"(got sequence 0: seq_len {HUGE_SEQ_LEN} -> {HUGE_SEQ_LEN} entries -> "
    "33554432 pages of 64)")


def test_page_table_rule_does_not_overflow_near_int32_max():
  # (entries + page_size - 1) wrapped to a negative page count, so this
  # four-column table for a 2**31 - 8 entry sequence was accepted.
  with pytest.raises(ValueError, match=f"^{re.escape(HUGE_MESSAGE)}$"):
    si.validate_topk_inputs(*_huge_sequence_args(), **TOKEN_KW)
  err, idx = si.checked_streamindex_topk(*_huge_sequence_args(),
                                               **TOKEN_KW)
  assert err.get() == f"{HUGE_MESSAGE} (`check` failed)"
  np.testing.assert_array_equal(idx, -1)


def test_page_table_rule_in_page_mode_does_not_overflow():
  q, w, c, s, p, cu, _ = _huge_sequence_args()
  with pytest.raises(ValueError, match=r"got sequence 0: seq_len 2147483640 "
                     r"-> 2147483640 entries -> 33554432 pages of 64\)$"):
    si.validate_page_topk_inputs(q, w, c, s, p, cu, jnp.int32(1),
                                 k_pages=1)


def test_a_table_past_the_int32_block_arithmetic_is_rejected_statically():
  # Enough columns for 2**31 - 8 entries: the kernel's int32
  # (entries + bkv_sz - 1) // bkv_sz would overflow, so the static check
  # names the limit (shapes only: nothing is allocated).
  q, w, c, s, _, cu, d = _huge_sequence_args()
  table = jax.ShapeDtypeStruct((2**31 // 64,), jnp.int32)
  with pytest.raises(ValueError, match=re.escape(
      "page_indices: pages_per_seq * page_size, the entries a sequence can "
      "hold, must be <= 2**31 - page_size * num_kv_pages_per_block = "
      "2147483520 for the decode case (the kernel counts KV blocks as "
      "(entries + bkv_sz - 1) // bkv_sz in int32) (got 33554432 * 64 = "
      "2147483648)")):
    jax.eval_shape(functools.partial(si.streamindex_topk, **TOKEN_KW),
                   q, w, c, s, table, cu, d)
  ok_table = jax.ShapeDtypeStruct((2**31 // 64 - 2,), jnp.int32)
  jax.eval_shape(functools.partial(si.streamindex_topk, **TOKEN_KW),
                 q, w, c, s, ok_table, cu, d)


# --- 4. numeric range -------------------------------------------------------


def _tiny_key_inputs():
  batch = si.make_batch([(2, 40), (1, 30)], page_size=64, compression_ratio=1,
                        pages_per_seq=1)
  inp = si.make_inputs(batch, num_heads=4, fmt="fp8", seed=3)
  # amax ~ 1e-36: ue8m0 gives 2**-128, clamped to 2**-126 (the seed's
  # clip gave byte 0, 2**-127, which zeroed every score); the true scores
  # (~1e-35) are normal float32 numbers.
  tiny = inp.keys * 3e-37
  return dataclasses.replace(inp, keys=tiny, cache=cache.pack_cache(tiny, "fp8"))


def test_tiny_keys_keep_their_scale_and_rank_correctly():
  inp = _tiny_key_inputs()
  raw = np.asarray(inp.cache).reshape(inp.keys.shape[:2] + (-1,))
  assert raw[..., 128].min() == 1  # 2**-126, never byte 0
  si.validate_topk_inputs(*inp.args, **TOKEN_KW)
  scores = np.asarray(si.token_scores(*inp.args, compression_ratio=1))
  visible = scores[scores > -np.inf]
  assert (visible != 0).mean() > 0.5  # were all exactly 0 with byte 0
  got = si.streamindex_topk(*inp.args, **TOKEN_KW)
  atol = metrics.summation_atol(inp, compression_ratio=1)
  metrics.assert_topk_match(
      got, si.streamindex_topk_ref(*inp.args, **TOKEN_KW), scores, atol=atol)
  # and against the exact (float64) scores of the dequantized keys
  keys = np.asarray(cache.unpack_cache(inp.cache), np.float64)
  b = inp.batch
  q = np.asarray(inp.q, np.float64)
  w = np.asarray(inp.weights, np.float64)
  exact = np.full(scores.shape, -np.inf)
  for row in range(b.num_query_tokens):
    seq, pos = b.token_seq_ids()[row], b.token_positions()[row]
    kv = keys[b.page_table[seq]].reshape(-1, keys.shape[-1])[:pos + 1]
    exact[row, :pos + 1] = (w[row][:, None]
                            * np.maximum(q[row] @ kv.T, 0)).sum(0)
  # the true scores are ordinary (normal) float32 numbers
  assert (np.abs(exact[exact > -np.inf]) > 2.0**-126).mean() > 0.5
  want = np.where(np.sort(exact, axis=1)[:, ::-1][:, :8] > -np.inf,
                  np.argsort(-exact, axis=1, kind="stable")[:, :8], -1)
  metrics.assert_topk_match(got, want, exact, atol=atol)


def _token_inputs():
  batch = si.make_batch([(2, 40), (1, 30)], page_size=64, compression_ratio=1,
                        pages_per_seq=1)
  return si.make_inputs(batch, num_heads=4, fmt="fp8", seed=3)


def _with(inp, **arrays):
  args = dict(zip(("q", "w", "cache"), inp.args[:3]))
  args.update(arrays)
  return (args["q"], args["w"], args["cache"]) + tuple(inp.args[3:])


def test_subnormal_scale_byte_is_rejected():
  inp = _token_inputs()
  page = int(inp.batch.page_table[0, 0])
  c = np.array(inp.cache)
  c[page, 0, 0, 128] = 0
  with pytest.raises(ValueError, match=r"^cache_kv: every FP8 record \(MXFP4: 32-value group\) a query "
                     r"sees needs an e8m0 scale byte in \[1, 254\].*got "
                     rf"sequence 0, entry 0 \(physical page {page}, slot 0\): "
                     r"scale byte 0\)$"):
    si.validate_topk_inputs(*_with(inp, cache=jnp.asarray(c)),
                            **TOKEN_KW)


def test_page_validator_rejects_a_subnormal_scale():
  inp = _token_inputs()
  page = int(inp.batch.page_table[1, 0])
  c = np.array(inp.cache)
  c[page, 0, 1, 128] = 0
  args = _with(inp, cache=jnp.asarray(c))
  page_args = args[:6] + (jnp.int32(inp.batch.num_seqs),)
  with pytest.raises(ValueError, match=rf"got sequence 1, entry 1 \(physical "
                     rf"page {page}, slot 1\): scale byte 0\)$"):
    si.validate_page_topk_inputs(*page_args, k_pages=1)
  err, _ = si.checked_streamindex_page_topk(*page_args, k_pages=1)
  assert "scale byte 0" in err.get()


def test_nan_key_in_the_cache_is_rejected():
  inp = _token_inputs()
  page = int(inp.batch.page_table[1, 0])
  c = np.array(inp.cache)
  c[page, 1, 2, 7] = 0x7F  # e4m3 NaN: would rank first
  with pytest.raises(ValueError, match=rf"^cache_kv: every key value the "
                     rf"kernel reads .*got sequence 1, entry 6 \(physical page "
                     rf"{page}, slot 6\)\)$"):
    si.validate_topk_inputs(*_with(inp, cache=jnp.asarray(c)),
                            **TOKEN_KW)


def test_finite_query_whose_dot_overflows_is_rejected():
  # 3e37 on a head with weight 0: the dot overflows to inf, 0 * inf = NaN.
  inp = _token_inputs()
  q = np.array(np.asarray(inp.q, np.float32))
  w = np.array(np.asarray(inp.weights))
  q[0, 2, :] = 3e37
  w[0, 2] = 0.0
  args = _with(inp, q=jnp.asarray(q, jnp.float32), w=jnp.asarray(w))
  with pytest.raises(ValueError, match=r"^q: each head's dot product with a "
                     r"key it sees must stay below 2\*\*127 .*\(got row 0 "
                     r"\(sequence 0\): bound up to 2\*\*1[3-4][0-9]\)$"):
    si.validate_topk_inputs(*args, **TOKEN_KW)
  err, idx = si.checked_streamindex_topk(*args, **TOKEN_KW)
  assert err.get().startswith("q: each head's dot product")
  np.testing.assert_array_equal(idx, -1)


# --- 5. the interpreter deadlock --------------------------------------------

DEADLOCK_REPRODUCER = textwrap.dedent("""
    import streamidx as si
    from streamidx import metrics
    from streamidx.lab.studies import cases
    kw = dict(k_pages=6, num_queries_per_block=8)
    batch = cases.BATCHES["prefill_only"].build(1, seed=len("prefill_only"))
    for it in range(4):
      inp = si.make_inputs(batch, num_heads=cases.NUM_HEADS,
                           fmt=("fp8", "bf16")[it % 2], seed=1)
      # Nothing waits for the interpreted kernel before more work is queued.
      got = si.streamindex_page_topk(*inp.page_args, **kw)
      want = si.streamindex_page_topk_ref(*inp.page_args, **kw)
      scores = si.page_scores(*inp.page_args)
      atol = metrics.summation_atol(inp, compression_ratio=1, mode="page")
      metrics.assert_topk_match(got, want, scores, atol=atol)
      print("iteration", it, flush=True)
""")


def test_queuing_work_behind_an_interpreted_call_does_not_hang():
  # With the bare jitted kernel (`streamidx.kernels.vendored.streamindex_page_topk`)
  # this script hung (XLA:CPU, jax 0.10.2) within 2-4 iterations in every
  # run seen: the interpreter's callback dispatches XLA work that waits on
  # XLA:CPU's in-flight bound, held by the work queued behind the kernel.
  script = DEADLOCK_REPRODUCER
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  try:
    out = subprocess.run([sys.executable, "-c", script], capture_output=True,
                         text=True, timeout=420, env=env)
  except subprocess.TimeoutExpired as e:
    pytest.fail(f"hung: the script did not finish in {e.timeout} s")
  assert out.returncode == 0, out.stderr[-2000:]
  assert out.stdout.count("iteration") == 4


def test_blocking_wrapper_keeps_jit_eval_shape_and_lower():
  inp = _token_inputs()
  call = functools.partial(si.streamindex_topk, **TOKEN_KW)
  # traced: tracers are returned as they are, no wait
  shape = jax.eval_shape(call, *inp.args)
  assert shape.shape == (inp.batch.num_tokens, TOKEN_KW["k"])
  inside = jax.jit(lambda *a: call(*a) + 0)(*inp.args)
  np.testing.assert_array_equal(inside, call(*inp.args))
  assert si.streamindex_topk.lower(*inp.args, **TOKEN_KW) is not None
  # the checkify entry point returns (err, idx) ready, the pytree intact
  err, idx = si.checked_streamindex_topk(*inp.args, **TOKEN_KW)
  assert err.get() is None
  np.testing.assert_array_equal(idx, call(*inp.args))
