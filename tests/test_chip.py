"""The TPU tier (`make test-tpu`): every variant compiled by Mosaic and run on
the chip this process holds, against its reference.

- every token variant x cache format x exact top-k method, and every page
  variant x cache format, on named batches (the README's, DeepSeek-V4
  decode at 64 heads, a mixed prefill batch; GLM page mode at 32 heads and
  page mode at 64), block sizes from the table's row for this chip: the
  kernel's scores within the derived summation bound of the reference's,
  its indices an exact top-k of its own scores and the reference's
  tie-aware (`kernel_scores.assert_kernel_matches_reference`);
- every exact method and the reference identical to the tie rule's NumPy
  oracle on DeepSeek-V4 decode's score buffer (64 x 262,144, k 512 and
  2,048), whatever `lax.top_k` does with ties on this chip;
- `physical_slots` in both modes, and bad input refused before it runs.

`make test-tpu` runs it in one process (one program at a time holds a chip)
and appends its counts to the chip records (`streamidx.records`, "test_runs";
conftest.py). Off a TPU the module skips, with one line saying why.
"""

import functools

import jax
import numpy as np
import pytest

if jax.devices()[0].platform != "tpu":
  pytest.skip(f"the TPU tier needs a TPU (this machine's JAX devices: "
              f"{jax.devices()[0].platform}); run `make test-tpu` on one",
              allow_module_level=True)

import streamidx as si  # pylint: disable=g-import-not-at-top,wrong-import-position
from streamidx import metrics, topk  # pylint: disable=g-import-not-at-top,wrong-import-position
from streamidx.lab import shapes  # pylint: disable=g-import-not-at-top,wrong-import-position
from streamidx.lab.bench import topk as topk_bench  # pylint: disable=g-import-not-at-top,wrong-import-position

import oracle  # pylint: disable=g-import-not-at-top,wrong-import-position
from kernel_scores import KernelWithScores, assert_kernel_matches_reference  # pylint: disable=g-import-not-at-top,wrong-import-position

# name -> (batch arguments, heads, k): token batches (ratio 4) and page
# batches (k is k_pages).
TOKEN_BATCHES = {
    "readme": (dict(decode=[900, 2048], prefill=[(24, 700)],
                    mixed=[(12, 400)], page_size=16, compression_ratio=4,
                    allocation="fragmented"), 16, 32),
    "dsv4_decode": (dict(decode=[32768, 20000, 4096, 777, 65536, 1500, 9000,
                                 30001], page_size=128, compression_ratio=4,
                         allocation="fragmented"), 64, 512),
    "mixed_prefill": (dict(decode=[16384, 3001], prefill=[(512, 16384)],
                           mixed=[(128, 8192)], page_size=128,
                           compression_ratio=4), 64, 512),
}
PAGE_BATCHES = {
    "glm_page": (dict(decode=[8192, 3000, 20000, 65536], prefill=[(256, 8192)],
                      page_size=shapes.GLM_PAGE.page_size,
                      compression_ratio=shapes.GLM_PAGE.compression_ratio),
                 shapes.GLM_PAGE.num_heads, 32),
    "page_64_heads": (dict(decode=[16384, 5000], prefill=[(128, 8192)],
                           page_size=shapes.GLM_PAGE.page_size,
                           compression_ratio=1), 64, 32),
}
TOKEN = [(v, f) for v, var in si.VARIANTS.items() if var.mode == "token"
         for f in var.cache_formats]
PAGE = [(v, f) for v, var in si.VARIANTS.items() if var.mode == "page"
        for f in var.cache_formats]


@functools.lru_cache(maxsize=None)
def _inputs(name: str, fmt: str):
  kw, heads, _ = {**TOKEN_BATCHES, **PAGE_BATCHES}[name]
  return si.make_inputs(si.make_mixed_batch(**kw), num_heads=heads, fmt=fmt)


@functools.lru_cache(maxsize=None)
def _reference(variant: str, name: str, fmt: str):
  """(indices, masked scores, the summation bound) of the variant's
  reference on batch `name`."""
  v = si.VARIANTS[variant]
  kw, _, k = {**TOKEN_BATCHES, **PAGE_BATCHES}[name]
  inputs, ratio = _inputs(name, fmt), kw["compression_ratio"]
  idx = v.reference(*v.args(inputs, fmt), **{v.k_name: k},
                    compression_ratio=ratio)
  return (np.asarray(idx),
          np.asarray(v.scores(inputs, compression_ratio=ratio, fmt=fmt)),
          metrics.summation_error_bound(inputs, compression_ratio=ratio,
                                        mode=v.mode))


def _run(variant: str, name: str, fmt: str, **extra):
  v = si.VARIANTS[variant]
  kw, heads, k = {**TOKEN_BATCHES, **PAGE_BATCHES}[name]
  inputs = _inputs(name, fmt)
  blocks = v.block_sizes(cache_format=fmt, num_heads=heads,
                         page_size=kw["page_size"]).kwargs()
  base = variant.removesuffix("_page")
  kernel = KernelWithScores(v.mode, variant=base)
  return kernel(*v.args(inputs, fmt), **{v.k_name: k},
                compression_ratio=kw["compression_ratio"], **blocks, **extra)


@pytest.mark.parametrize("method", topk.EXACT_TOPK_METHODS)
@pytest.mark.parametrize("variant,fmt", TOKEN)
@pytest.mark.parametrize("name", TOKEN_BATCHES)
def test_token_variant_matches_reference_on_the_chip(name, variant, fmt,
                                                     method):
  idx, scores = _run(variant, name, fmt, topk_method=method)
  ref_idx, ref_scores, bound = _reference(variant, name, fmt)
  assert_kernel_matches_reference(idx, scores, ref_idx, ref_scores,
                                  score_bound=bound,
                                  label=f"{name} {variant} {fmt} {method}")


@pytest.mark.parametrize("variant,fmt", PAGE)
@pytest.mark.parametrize("name", PAGE_BATCHES)
def test_page_variant_matches_reference_on_the_chip(name, variant, fmt):
  idx, scores = _run(variant, name, fmt)
  ref_idx, ref_scores, bound = _reference(variant, name, fmt)
  assert_kernel_matches_reference(idx, scores, ref_idx, ref_scores,
                                  score_bound=bound,
                                  label=f"{name} {variant} {fmt}")


STRADDLING_ROWS = topk.base.AGAIN_ROWS + 1  # two trips of `base.again`


@functools.lru_cache(maxsize=None)
def _decode_scores(k: int):
  """DeepSeek-V4 decode's buffer, its first `STRADDLING_ROWS` rows with k + 3
  equal scores above the rest, spread over the row: a tie straddling the
  k-th place, which those rows alone are ranked again for."""
  s = shapes.DSV4_DECODE_1M
  x = topk_bench.score_buffer(shapes.Shape("decode", "decode", s.rows, 1,
                                           s.seq_len, k))
  for r in range(STRADDLING_ROWS):
    visible = int(np.sum(x[r] > -np.inf))
    x[r, np.linspace(0, visible - 1, k + 3).astype(int)] = 1e6
  return x


@pytest.mark.parametrize("k", [512, 2048])
@pytest.mark.parametrize("method", ("reference",) + topk.EXACT_TOPK_METHODS)
def test_exact_methods_equal_the_rule_on_the_chip(method, k):
  """DeepSeek-V4 decode's buffer (64 x 262,144, a tenth of it 0.0, ragged
  -inf tails; `STRADDLING_ROWS` rows with a tie across the k-th place):
  identical to the rule's oracle on every row."""
  x = _decode_scores(k)
  got = np.asarray(si.ref.topk_from_scores(x, k) if method == "reference"
                   else topk.select_topk(jax.numpy.asarray(x), k, method))
  want = oracle.topk_rule(x, k)
  same = (got == want).all(axis=1)
  assert same.all(), (f"{method}: {int(same.sum())} of {same.size} rows "
                      f"identical to the rule; first differing row "
                      f"{int(np.argmin(same))}")


@pytest.mark.parametrize("variant,name", [("vendored", "dsv4_decode"),
                                          ("vendored_page", "glm_page")])
def test_physical_slots_on_the_chip(variant, name):
  v = si.VARIANTS[variant]
  kw, _, k = {**TOKEN_BATCHES, **PAGE_BATCHES}[name]
  inputs = _inputs(name, "fp8")
  args = v.args(inputs, "fp8")
  static = {v.k_name: k, "compression_ratio": kw["compression_ratio"],
            "physical_slots": True}
  got = np.asarray(v.kernel(*args, **static))
  want = np.asarray(v.reference(*args, **static))
  # Slots of the same entries: compare the entries they hold, tie-aware.
  idx, _ = _run(variant, name, "fp8")
  ref_idx, ref_scores, bound = _reference(variant, name, "fp8")
  metrics.assert_topk_match(idx, ref_idx, ref_scores,
                            atol=4.0 * float(bound.max()))
  assert got.shape == want.shape
  same_entries = (idx == ref_idx)
  np.testing.assert_array_equal(got[same_entries], want[same_entries])


def test_bad_input_is_refused_before_the_chip_runs():
  inputs = _inputs("readme", "fp8")
  with pytest.raises(ValueError, match="k"):
    si.streamindex_topk(*inputs.args, k=0, compression_ratio=4)
  with pytest.raises(ValueError, match="topk_method"):
    si.streamindex_topk(*inputs.args, k=8, compression_ratio=4,
                        topk_method="no_such_method")
  with pytest.raises(ValueError, match="compression_ratio"):
    si.streamindex_page_topk(*inputs.page_args, k_pages=8, compression_ratio=4)
