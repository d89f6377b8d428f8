"""The kernel's DMA pipeline under the TPU interpreter's race detector, with
uninitialized memory poisoned.

Pallas's TPU interpreter can run a kernel with a happens-before race detector
(`InterpretParams(detect_races=True)`: every DMA gets its own vector clock;
a kernel access to a buffer that an un-awaited DMA also touches is a race)
and with every scratch buffer filled with NaN (`uninitialized_memory="nan"`).
Each real-kernel case below runs both modes and both cache formats, with a
batch that has batched decode launches and a decode remainder, prefill-only
and mixed sequences, several bq and bkv blocks, padding sequences and
padding token rows, under both options at once, and asserts:

- no race in any of the kernel's launches (the token kernel makes four
  `pallas_call`s; the detector's state is replaced at each, so the test keeps
  every launch's state, see `race_log`);
- the kernel's score matrix (the operand of its final top-k, observed
  through a test-only hook on `jax.lax`) holds no NaN, has the reference's
  -inf pattern, and is within twice the derived summation bound
  (`metrics.summation_error_bound`) of the reference's scores: no poisoned
  value reaches an output;
- the indices match the reference (tie-aware, tie tolerance
  `metrics.summation_atol`; see tests/kernel_scores.py).

A small double-buffered Pallas kernel, written here in the real kernel's
style, shows the detector is able to fail: two racy variants (a read before
its DMA wait, and a prefetch into the buffer being read) are flagged, the
correct variant is not. A third variant pins a blind spot of the detector:
reusing an output buffer before its outbound DMA has drained is NOT flagged
(the wrong output it gives under "on_wait" DMA execution is what catches it,
which is why every test here also checks parity).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

import streamidx as si
from streamidx import metrics, ref
from streamidx.lab.studies import cases

from kernel_scores import KernelWithScores, assert_kernel_matches_reference
import tiers

RACE_MARK = "RACE DETECTED"


# --- the real kernel --------------------------------------------------------

TOPK_CASES = {
    # 5 decode sequences with decode_req_batch_size=2: two batched launches
    # and one remainder; a prefill-only sequence over two bq blocks; mixed
    # sequences over two bkv blocks; a padding sequence slot and token rows.
    "fp8": dict(ratio=4, decode=[37, 64, 100, 20, 9], prefill=[(13, 50)],
                mixed=[(20, 90), (3, 600)]),
    "bf16": dict(ratio=2, decode=[37, 64, 100, 20, 9], prefill=[(13, 50)],
                 mixed=[(20, 90), (3, 300)]),
}


def topk_inputs(fmt):
  case = TOPK_CASES[fmt]
  b = si.make_mixed_batch(decode=case["decode"], prefill=case["prefill"],
                          mixed=case["mixed"], page_size=16,
                          compression_ratio=case["ratio"],
                          allocation="fragmented", max_num_seqs=9,
                          num_tokens=48, seed=3)
  kw = dict(k=12, compression_ratio=case["ratio"], num_kv_pages_per_block=8,
            num_queries_per_block=(1, 8, 8), decode_req_batch_size=2)
  return si.make_inputs(b, num_heads=4, fmt=fmt, seed=5), kw


def mtp_inputs(variant, fmt, q_len):
  """Speculative decoding (M17): 7 decode sequences of q_len rows (an empty
  one, several shorter than a KV block; decode_req_batch_size 2: three
  batched programs and a remainder), a prefill and a mixed sequence."""
  b = si.make_mixed_batch(decode=[q_len, 37, 64, 100, 20, 9, 300],
                          prefill=[(13, 50)], mixed=[(1, 90)],
                          decode_q_len=q_len, page_size=16,
                          compression_ratio=4, allocation="fragmented",
                          max_num_seqs=10, num_tokens=48, seed=4)
  kw = dict(k=12, compression_ratio=4, num_kv_pages_per_block=8,
            num_queries_per_block=(1, 8, 8), decode_req_batch_size=2,
            decode_q_len=q_len)
  return si.make_inputs(b, num_heads=4, fmt=fmt, seed=6), kw


# Every token variant x its cache formats x gamma + 1 in {2, 3, 4} (the
# registry's: a new variant is checked here). CI: gamma + 1 = 2 on the
# vendored FP8 kernel; the rest in the full tier.
MTP_RACE_CASES = [(v.name, fmt, q) for v in si.VARIANTS.values()
                  if v.mode == "token" for fmt in v.cache_formats
                  for q in cases.MTP_Q_LENS]


@pytest.mark.parametrize("variant,fmt,q_len", tiers.split(
    MTP_RACE_CASES, lambda c: c == ("vendored", "fp8", 2),
    ids=lambda v: f"mtp{v[2]}-{v[0]}-{v[1]}"))
def test_speculative_decode_has_no_race_and_no_poisoned_score(
    variant, fmt, q_len, race_log, capsys):
  inp, kw = mtp_inputs(variant, fmt, q_len)
  v = si.VARIANTS[variant]
  with si.interpreter(detect_races=True, uninitialized_memory="nan"):
    idx, scores = KernelWithScores("token", variant=variant)(
        *v.args(inp), **kw)
  assert len(race_log) == 4
  assert [s.races_found for s in race_log] == [False] * 4
  assert RACE_MARK not in capsys.readouterr().out
  assert_kernel_matches_reference(
      idx, scores, v.reference(*v.args(inp), **kw),
      v.scores(inp, compression_ratio=4),
      score_bound=metrics.summation_error_bound(inp, compression_ratio=4))


def page_inputs(fmt):
  b = si.make_batch([(3, 40), (1, 17), (12, 30), (0, 3), (5, 64)],
                    page_size=16, compression_ratio=1, allocation="shuffled",
                    max_num_seqs=6, num_tokens=24, pages_per_seq=4, seed=1)
  kw = dict(k_pages=3, num_queries_per_block=8)
  return si.make_inputs(b, num_heads=4, fmt=fmt, seed=2), kw


# CI: the token kernel on FP8 and the page kernel on bf16 (the other format
# of each in the full tier, tests/tiers.py).
@pytest.mark.parametrize("fmt", tiers.first(["fp8", "bf16"]))
def test_token_kernel_has_no_race_and_no_poisoned_score(fmt, race_log, capsys):
  inp, kw = topk_inputs(fmt)
  with si.interpreter(detect_races=True, uninitialized_memory="nan"):
    idx, scores = KernelWithScores("token")(*inp.args, **kw)
  printed = capsys.readouterr().out

  # decode batched, decode remainder, prefill-only, mixed: 4 launches.
  assert len(race_log) == 4
  assert [s.races_found for s in race_log] == [False] * 4
  assert not si.races_found()
  assert RACE_MARK not in printed

  # No NaN, the reference's -inf pattern, its values within the summation
  # bound: no poison got through.
  ratio = kw["compression_ratio"]
  assert_kernel_matches_reference(
      idx, scores, ref.streamindex_topk_ref(*inp.args, **kw),
      ref.token_scores(*inp.args, compression_ratio=ratio),
      score_bound=metrics.summation_error_bound(inp, compression_ratio=ratio))


@pytest.mark.parametrize("fmt", tiers.split(["fp8", "bf16"], lambda f: f == "bf16"))
def test_page_kernel_has_no_race_and_no_poisoned_score(fmt, race_log, capsys):
  inp, kw = page_inputs(fmt)
  with si.interpreter(detect_races=True, uninitialized_memory="nan"):
    idx, scores = KernelWithScores("page")(*inp.page_args, **kw)
  printed = capsys.readouterr().out

  assert len(race_log) == 1
  assert not race_log[0].races_found
  assert not si.races_found()
  assert RACE_MARK not in printed

  assert_kernel_matches_reference(
      idx, scores, ref.streamindex_page_topk_ref(*inp.page_args, **kw),
      ref.page_scores(*inp.page_args),
      score_bound=metrics.summation_error_bound(inp, compression_ratio=1,
                                                mode="page"))


# --- a double buffer that can be made racy ----------------------------------

NUM_TILES = 4
TILE = (8, 128)


def double_buffer_kernel(x_hbm, o_hbm, in_x2, out_x2, sems, *, variant):
  """o[i] = 2 * x[i], tile by tile, double-buffered both ways like the
  StreamIndex kernel: prefetch tile i + 1 while tile i is computed, and
  write tile i back while tile i + 1 is computed.

  variant:
    "correct"
    "read_before_wait": reads tile i before waiting for its DMA (a skipped
      wait).
    "prefetch_into_busy_buffer": starts tile i + 1's DMA into the buffer
      tile i is being read from (the buffer index not flipped).
    "reuse_output_before_drain": overwrites an output buffer without waiting
      for the DMA that still reads it (the wait the kernel's
      `wait_send_scores` does).
  """

  def fetch(i, sem_slot, buf_slot=None):
    buf_slot = sem_slot if buf_slot is None else buf_slot
    return pltpu.make_async_copy(x_hbm.at[i], in_x2.at[buf_slot],
                                 sems.at[0, sem_slot])

  def send(i, slot):
    return pltpu.make_async_copy(out_x2.at[slot], o_hbm.at[i],
                                 sems.at[1, slot])

  fetch(0, 0).start()

  def step(i, slot):
    nxt = 1 - slot

    @pl.when(i + 1 < NUM_TILES)
    def _():
      if variant == "prefetch_into_busy_buffer":
        fetch(i + 1, nxt, buf_slot=slot).start()
      else:
        fetch(i + 1, nxt).start()

    if variant == "read_before_wait":
      y = in_x2[slot] * 2.0
      fetch(i, slot).wait()
    else:
      fetch(i, slot).wait()
      y = in_x2[slot] * 2.0

    if variant != "reuse_output_before_drain":

      @pl.when(i >= 2)
      def _():
        send(i - 2, slot).wait()

    out_x2[slot] = y
    send(i, slot).start()
    return nxt

  lax.fori_loop(0, NUM_TILES, step, 0)
  drained = 0 if variant == "reuse_output_before_drain" else NUM_TILES - 2
  for i in range(drained, NUM_TILES):
    send(i, i % 2).wait()


def run_double_buffer(variant, **interpret_options):
  x = jnp.arange(NUM_TILES * TILE[0] * TILE[1], dtype=jnp.float32)
  x = x.reshape(NUM_TILES, *TILE)
  call = pl.pallas_call(
      functools.partial(double_buffer_kernel, variant=variant),
      in_specs=[pl.BlockSpec(memory_space=pltpu.HBM)],
      out_specs=pl.BlockSpec(memory_space=pltpu.HBM),
      out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
      scratch_shapes=[pltpu.VMEM((2, *TILE), jnp.float32),
                      pltpu.VMEM((2, *TILE), jnp.float32),
                      pltpu.SemaphoreType.DMA((2, 2))],
      interpret=pltpu.InterpretParams(detect_races=True, **interpret_options))
  out = np.asarray(call(x))
  return np.array_equal(out, 2 * np.asarray(x))


@pytest.mark.parametrize("variant,racy", [
    ("correct", False),
    ("read_before_wait", True),
    ("prefetch_into_busy_buffer", True),
])
def test_race_detector_flags_a_racy_double_buffer(variant, racy, race_log,
                                                  capsys):
  correct_output = run_double_buffer(variant)
  printed = capsys.readouterr().out
  assert si.races_found() is racy
  assert [s.races_found for s in race_log] == [racy]
  assert (RACE_MARK in printed) is racy
  if not racy:
    assert correct_output


def test_race_detector_misses_output_buffer_reuse_but_parity_catches_it(
    race_log):
  # A blind spot of jax's detector: the kernel's store into a buffer an
  # in-flight outbound DMA still reads is not flagged. With DMAs executed
  # when awaited ("on_wait", the default) the output is then wrong.
  assert not run_double_buffer("reuse_output_before_drain",
                               dma_execution_mode="on_wait")
  assert not si.races_found()


def test_races_found_reports_only_the_last_launch(race_log):
  # Why `race_log` exists: a race in one launch is forgotten by the next.
  run_double_buffer("read_before_wait")
  assert si.races_found()
  run_double_buffer("correct")
  assert not si.races_found()
  assert [s.races_found for s in race_log] == [True, False]
