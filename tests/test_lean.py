"""The vector-lean kernel body (`streamidx.kernels.lean`) beyond the case
matrix, which runs the "lean" and "lean_page" variants over every test batch
against the reference (tests/test_kernel.py: ratio 4 and the seed's rule in
CI, the other ratios in the full tier): its FP8 arithmetic over every
byte, races, two cores, random batches."""

from __future__ import annotations

import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import streamidx as si
from streamidx import cache, metrics, ref
from streamidx.kernels import lean
from streamidx.lab.studies import cases

from kernel_scores import KernelWithScores, assert_kernel_matches_reference
import test_dense
import test_properties as props
import tiers

BYTES = np.arange(256, dtype=np.uint8)


def test_e4m3b11fnuz_reads_every_dense_cache_byte_as_e4m3fn_over_16():
  """The v5e/v6e path: the same byte as e4m3b11fnuz, widened to bf16 (what
  the kernel multiplies) and times 16, is the e4m3fn value, for every byte
  but -0 (0x80, NaN there) and e4m3fn's NaNs (0x7F, 0xFF)."""
  fn = BYTES.view(ml_dtypes.float8_e4m3fn).astype(np.float32)
  fnuz = (BYTES.view(ml_dtypes.float8_e4m3b11fnuz).astype(ml_dtypes.bfloat16)
          .astype(np.float32))
  kept = ~np.isnan(fn) & (BYTES != cache.NEG_ZERO_BYTE)
  assert kept.sum() == 253
  np.testing.assert_array_equal(fnuz[kept] * lean.FNUZ_SCALE, fn[kept])
  assert np.isnan(fnuz[cache.NEG_ZERO_BYTE])


def test_the_dense_cache_never_stores_minus_zero_or_nan_bytes():
  keys = jnp.array([[[-0.0, 0.0, -1e-30, 1e-30, -3.0, 448.0, -1e9, 7.0]] * 4])
  values, _ = si.pack_dense_fp8_cache(jnp.pad(keys, ((0, 0), (0, 0), (0, 120))))
  got = np.asarray(values).ravel()
  assert not np.isin(got, [cache.NEG_ZERO_BYTE, 0x7F, 0xFF]).any()


def _args(inp):
  q, w, _, *rest = inp.args
  return (q, w, *si.pack_dense_fp8_cache(inp.keys), *rest)


def _token_inputs():
  b = si.make_mixed_batch(decode=[37, 900, 64, 100, 300, 500, 1],
                          prefill=[(20, 300)],
                          mixed=[(1, 90), (9, 333), (0, 40)], page_size=16,
                          compression_ratio=4, allocation="fragmented",
                          max_num_seqs=13, num_tokens=48, seed=3)
  return si.make_inputs(b, num_heads=4, fmt="fp8", seed=1)


@pytest.mark.parametrize("num_cores", tiers.split([1, 2], lambda c: c == 2))
def test_lean_token_kernel_is_race_free_and_exact(num_cores, capsys):
  """Every launch, sequences without queries, cross-program prefetch and
  the extra block past the last; on two cores each core's pipeline."""
  inp = _token_inputs()
  kw = dict(k=8, compression_ratio=4, num_kv_pages_per_block=8,
            num_queries_per_block=(1, 8, 8), decode_req_batch_size=2)
  args = _args(inp)
  with si.race_check(num_cores_or_threads=num_cores,
                     uninitialized_memory="nan") as report:
    idx, scores = KernelWithScores("token", variant="lean")(
        *args, num_cores=num_cores, **kw)
  assert report.launches == 4 and not report.races_found, report
  assert "RACE DETECTED" not in capsys.readouterr().out
  assert_kernel_matches_reference(
      idx, scores, si.streamindex_topk_dense_ref(*args, **kw),
      ref.token_scores(*inp.args, compression_ratio=4),
      score_bound=metrics.summation_error_bound(inp, compression_ratio=4))
  si.reset_interpreter_state()


# The lean page kernel's race check: test_dense.py's, parametrised over the
# dense cache's page variants.
LEAN_KERNELS = {"token": KernelWithScores("token", variant="lean"),
                "page": KernelWithScores("page", variant="lean")}


# CI: the page profile, as for the dense kernel (test_dense.DENSE_CI).
@pytest.mark.parametrize("name", tiers.split(
    list(test_dense.DENSE_EXAMPLES), lambda n: n in test_dense.DENSE_CI))
def test_lean_random_batches_match_reference(name):
  p = props.PROFILES[name]

  @settings(max_examples=test_dense.DENSE_EXAMPLES[name], derandomize=True,
            database=None, deadline=None, print_blob=False,
            suppress_health_check=[HealthCheck.too_slow,
                                   HealthCheck.data_too_large])
  @given(data=st.data())
  def run(data):
    batch_kw, input_kw, ties = data.draw(props.batches(p), label="batch")
    test_dense._check_random(p, batch_kw, input_kw, ties, LEAN_KERNELS)  # pylint: disable=protected-access

  run()


def test_the_case_matrix_runs_the_lean_variants_in_both_tiers():
  seen = {(c.variant, c.compression_ratio) for c in cases.case_matrix("tests")}
  assert {("lean", r) for r in cases.RATIOS} | {("lean_page", 1)} <= seen


@tiers.FULL
@pytest.mark.parametrize("name", ["lean/all_three_ranges_r4_dense_fp8_k40",
                                  "lean_page/mixed_only_r1_dense_fp8_k6"])
def test_lean_on_v4_paths_matches_reference(name):
  """v4's code (keys widened to bf16 by chunks, M10; pages pooled by lane
  segments, M15): the arithmetic of v7x's native e4m3 too."""
  from streamidx.kernels import tpu  # pylint: disable=g-import-not-at-top
  case = cases.case_by_name(name)
  with tpu.force_v4_paths():
    out = cases.case_outputs(case)
  metrics.assert_topk_match(out.got, out.want, out.scores, label=name,
                            atol=case.atol(out.inputs))


def test_a_dense_cache_with_a_minus_zero_byte_is_refused():
  """A packer other than pack_dense_fp8_cache may store -0 (0x80): the lean
  kernel would read it as NaN on v5e/v6e, so the value rules refuse it
  (for every body of the dense layout: its arrays hold no 0x80)."""
  inp = _token_inputs()
  q, w, values, scales, *rest = _args(inp)
  page_indices = np.asarray(rest[1])
  page = int(page_indices[0])  # sequence 0 sees its first entry
  values = values.at[page, 0, 0, 5].set(cache.NEG_ZERO_BYTE)
  kw = dict(k=8, compression_ratio=4)
  with pytest.raises(ValueError, match="cache_kv: .*no byte 0x80"):
    si.VARIANTS["lean"].kernel.validate(q, w, values, scales, *rest, **kw)
