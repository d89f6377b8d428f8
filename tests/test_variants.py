"""The variant registry: every variant, driven from one logical batch.

One test body runs each registered variant (and each cache format it reads)
through `Variant.run` against `Variant.run_reference` on the same inputs,
tie-aware within the derived summation tolerance. A new variant is tested
here by registering it.
"""

import subprocess
import sys
import zipfile

import jax
import pytest

import streamidx as si
from streamidx import blocks, metrics, semantics

from streamidx.lab.studies import cases
import tiers

# Token variants see every launch and a ratio that compresses; page variants
# are defined at ratio 1 (GLM). The case matrix's small test blocks keep the
# interpreter fast.
BATCH = "all_three_ranges"
NUM_HEADS = cases.NUM_HEADS
VARIANT_FORMATS = [(name, fmt) for name, v in sorted(si.VARIANTS.items())
                   for fmt in v.cache_formats]


def _inputs(variant, fmt):
  ratio = 4 if variant.mode == "token" else 1
  b = cases.BATCHES[BATCH].build(ratio)
  return si.make_inputs(b, num_heads=NUM_HEADS, fmt=fmt, seed=3), ratio


def test_registry_lists_the_token_and_page_variants():
  assert sorted(si.VARIANTS) == ["dense", "dense_page", "fp4", "fp4_page",
                                 "inline", "lean", "lean_page",
                                 "vendored", "vendored_page"]
  assert {v.mode for v in si.VARIANTS.values()} == {"token", "page"}
  for name, v in si.VARIANTS.items():
    assert v.name == name
    assert v.cache_formats and all(f in si.cache.CACHE_FORMATS
                                   for f in v.cache_formats)


# Every variant and format also runs through `Variant.run` in the case matrix
# (tests/test_kernel.py), so this one-batch check is in the full tier
# (tests/tiers.py); the validator's check of the same call is its own test
# (test_every_variant_validates_its_own_call), in both tiers.
@tiers.FULL
@pytest.mark.parametrize("name,fmt", VARIANT_FORMATS)
def test_variant_matches_its_reference(name, fmt):
  v = si.VARIANTS[name]
  inp, ratio = _inputs(v, fmt)
  static = cases.blocks_for(v)
  k = 24 if v.mode == "token" else 5
  got = jax.block_until_ready(
      v.run(inp, k=k, compression_ratio=ratio, fmt=fmt, **static))
  want = v.run_reference(inp, k=k, compression_ratio=ratio, fmt=fmt, **static)
  assert got.shape == (inp.batch.num_tokens, k)
  scores = v.scores(inp, compression_ratio=ratio, fmt=fmt)
  atol = metrics.summation_atol(inp.with_cache_format(fmt),
                                compression_ratio=ratio, mode=v.mode)
  metrics.assert_topk_match(got, want, scores, atol=atol, label=f"{name}/{fmt}")


@pytest.mark.parametrize("name,fmt", VARIANT_FORMATS)
def test_every_variant_validates_its_own_call(name, fmt):
  """The value validator accepts the call test_variant_matches_its_reference
  makes."""
  v = si.VARIANTS[name]
  inp, ratio = _inputs(v, fmt)
  k = 24 if v.mode == "token" else 5
  v.validate(*v.args(inp, fmt), **v.static(inp, k=k, compression_ratio=ratio,
                                           fmt=fmt, **cases.blocks_for(v)))


@pytest.mark.parametrize("name", sorted(si.VARIANTS))
def test_a_default_given_or_left_out_is_one_call(name):
  """Every spelling of one call is one `TopkCall` / `PageCall` (equal and
  of equal hash): the driver's one static argument, so one compiled
  program however the call is spelled."""
  v = si.VARIANTS[name]
  inp, ratio = _inputs(v, v.cache_formats[0])
  args = v.args(inp)
  static = v.static(inp, k=8, compression_ratio=ratio, **cases.blocks_for(v))
  given = {f: getattr(v.kernel.call(*args, **static), f)
           for f in ("vmem_limit_bytes", "causal_rule", "return_scores")}
  spellings = [v.kernel.call(*args, **static),
               v.kernel.call(*args, **static, **given)]
  assert spellings[0] == spellings[1]
  assert hash(spellings[0]) == hash(spellings[1])
  assert v.kernel.call(*args, **{**static, "return_scores": True}) != (
      spellings[0])


def test_variant_rejects_a_format_it_does_not_read():
  v = si.VARIANTS["vendored"]
  inp, _ = _inputs(v, "fp8")
  with pytest.raises(ValueError, match=r"fmt: variant 'vendored' reads"):
    v.args(inp, "f32")
  with pytest.raises(ValueError, match=r"variant: must be one of"):
    si.variants.get("nope")


def test_block_table_gives_the_vendored_production_sizes():
  row = si.block_sizes("vendored", cache_format="fp8", num_heads=64,
                       page_size=128, generation="v7x")
  assert row.kwargs() == dict(num_kv_pages_per_block=(3, 2, 2),
                              num_queries_per_block=(1, 128, 128),
                              decode_req_batch_size=4)
  assert "tpu-inference" in row.source
  page = si.block_sizes("vendored_page", cache_format="bf16", num_heads=16,
                        page_size=64)
  assert page.kwargs() == dict(num_kv_pages_per_block=128,
                               num_queries_per_block=32)
  assert page.source.startswith("derived (streamidx.blocks.page_query_rows)")


@pytest.mark.parametrize("variant,fmt", [("vendored_page", "fp8"),
                                         ("dense_page", "dense_fp8"),
                                         ("lean_page", "dense_fp8"),
                                         ("fp4_page", "mxfp4")])
def test_page_rows_are_derived_for_the_call_s_heads(variant, fmt):
  """Page mode's query rows from the bounds on a KV block's scores (GLM's
  row: 32 rows of 32 heads at 64-entry pages): 64 heads take 16 rows at
  64-entry pages and 8 at 128-entry pages, which the vendored 512 rows
  exceeded (E1001 on v5e); few heads and small pages take more rows, up to
  the vendored 512; every derived row passes the static rule."""
  rows = lambda heads, page, gen="v5e": si.block_sizes(  # noqa: E731
      variant, cache_format=fmt, num_heads=heads, page_size=page,
      generation=gen).num_queries_per_block
  assert rows(32, 64) == 32
  assert rows(64, 64) == 16 and rows(64, 128) == 8
  assert rows(16, 128) == 16 and rows(4, 16) == 128 and rows(2, 8) == 256
  assert rows(1, 2 if fmt == "bf16" else 8) <= blocks.PAGE_MAX_QUERY_ROWS
  for heads, page in ((1, 8), (3, 24), (12, 40), (64, 128), (128, 256)):
    r = rows(heads, page, "v7x")
    blocks.check_page_rows(r, heads, page)
    with pytest.raises(ValueError, match=r"^num_queries_per_block: page "
                       r"mode's f32 scores .* at most \d+ query rows"):
      blocks.check_page_rows(2 * r, heads, page)  # r: a power of two


def test_page_rows_that_cannot_fit_are_refused_naming_the_limit():
  """No row fits: one query row's scores of a 128-page block over too many
  heads, or a launch's KV block beyond the chip's VMEM; a ValueError before
  anything is compiled, naming the argument and the limit."""
  with pytest.raises(ValueError, match=r"^q: page mode's f32 scores .* <= "
                     r"32.00 MiB over all heads .* \(got 512 heads, "
                     r"page_size 256: score block 64.00 MiB"):
    si.block_sizes("vendored_page", cache_format="fp8", num_heads=512,
                   page_size=256, generation="v6e")
  with pytest.raises(ValueError, match=r"^cache: a page-mode launch's VMEM "
                     r"scratch at one query row .* must fit 16.00 MiB \(v4:"):
    si.block_sizes("vendored_page", cache_format="bf16", num_heads=1,
                   page_size=512, generation="v4")
  # v4's packed FP8 page kernel: its widened KV block's bound comes first.
  with pytest.raises(ValueError, match=r"^page_size: on TPU v4 the packed FP8 "
                     r"page kernel .* \(got 128 x 512 = 65536\)"):
    si.block_sizes("vendored_page", cache_format="fp8", num_heads=1,
                   page_size=512, generation="v4")
  assert si.block_sizes("vendored_page", cache_format="fp8", num_heads=1,
                        page_size=512, generation="v5e"
                        ).num_queries_per_block == 4


def test_page_rows_leave_room_for_a_long_sequence_s_score_rows():
  """The launch's scratch holds a query block's page scores of the longest
  sequence: at 1M tokens of 8-entry pages (131072 pages per sequence) the
  derived rows shrink until it fits the chip (M11 would refuse more)."""
  key = dict(cache_format="bf16", num_heads=1, page_size=8)
  short = si.block_sizes("vendored_page", **key, generation="v7x")
  long = si.block_sizes("vendored_page", **key, generation="v7x",
                        pages_per_seq=2**20 // 8)
  assert short.num_queries_per_block == 256
  assert long.num_queries_per_block < short.num_queries_per_block
  assert blocks.page_scratch_bytes(
      long.num_queries_per_block, **key, pages_per_seq=2**20 // 8,
      tpu_generation=7) <= blocks.page_vmem_budget("v7x")[0]


def test_rows_from_the_static_schedule_say_so():
  """v5e/v6e DeepSeek-V4 rows and the GLM page row were chosen from the
  compiler's static schedule (streamidx.lab.schedule), not a TPU run."""
  for gen in ("v5e", "v6e"):
    row = si.block_sizes("vendored", cache_format="fp8", num_heads=64,
                         page_size=128, generation=gen)
    assert row.num_kv_pages_per_block == (4, 4, 4)
    assert row.source in blocks.STATIC_SCHEDULE_SOURCES
    assert row.source.startswith("static schedule (no TPU timing")
  glm = si.block_sizes("vendored_page", cache_format="fp8", num_heads=32,
                       page_size=64)
  assert glm.kwargs() == dict(num_kv_pages_per_block=128,
                              num_queries_per_block=32)
  assert glm.source in blocks.STATIC_SCHEDULE_SOURCES


@pytest.mark.parametrize("page_size", [16, 32, 64, 128, 256])
def test_block_table_sizes_are_legal_for_every_page_size(page_size):
  row = si.block_sizes("vendored", cache_format="fp8", num_heads=8,
                       page_size=page_size)
  for bkv_p in semantics.normalize_per_case(row.num_kv_pages_per_block, "b"):
    assert (page_size * bkv_p) % semantics.LANES == 0
  if page_size % semantics.LANES:
    assert row.source.startswith("heuristic")


def test_most_specific_row_wins(monkeypatch):
  generic = blocks.TABLE[0]
  tuned = blocks.BlockSizes("v6e", "vendored", "fp8", 64, 128,
                            num_kv_pages_per_block=(4, 2, 2),
                            num_queries_per_block=(1, 64, 64),
                            source="test row")
  monkeypatch.setattr(blocks, "TABLE", (generic, tuned))
  pick = lambda gen: si.block_sizes("vendored", cache_format="fp8",  # noqa: E731
                                    num_heads=64, page_size=128,
                                    generation=gen)
  assert pick("v6e") is tuned
  assert pick("v5e") is generic
  assert pick(None) is generic


@pytest.mark.parametrize("gen", ["v5e", "v6e", "v7x"])
@pytest.mark.parametrize("variant,fmt", [("vendored", "fp8"),
                                         ("lean", "dense_fp8")])
def test_every_path_takes_the_block_row_of_the_chip_it_runs_on(
    monkeypatch, gen, variant, fmt):
  """The generation simulated through the lookup's one input
  (`modes.current_generation`): the drop-in entry point, `Variant.static`
  (what `run` passes), the benchmark and the tiling model take one row."""
  from streamidx.lab import shapes  # pylint: disable=g-import-not-at-top
  from streamidx.lab.model import tiling  # pylint: disable=g-import-not-at-top
  monkeypatch.setattr(si.modes, "current_generation", lambda: gen)
  want = si.block_sizes(variant, cache_format=fmt, num_heads=64,
                        page_size=128, generation=gen)
  v = si.VARIANTS[variant]
  batch = si.make_mixed_batch(decode=[512, 300], page_size=128,
                              compression_ratio=4)
  inputs = si.make_inputs(batch, num_heads=64, fmt=fmt, seed=0)
  drop_in = v.kernel.call(*v.args(inputs, fmt), k=8, compression_ratio=4)
  static = v.static(inputs, k=8, compression_ratio=4)
  bench = shapes.table_blocks(
      shapes.Shape("s", "decode", 2, 1, 2048, 8, fmt=fmt), variant, fmt)
  plan = tiling.plan(batch, fmt=fmt, num_heads=64, variant=variant)
  kv = tuple(want.num_kv_pages_per_block)
  assert drop_in.block_source == want.source
  assert tuple(drop_in.num_kv_pages_per_block) == kv
  assert static["num_kv_pages_per_block"] == want.num_kv_pages_per_block
  assert bench == want
  assert {l.bkv_p for l in plan.launches
          if l.case.startswith("decode")} == {kv[0]}


def test_variant_static_takes_block_sizes_from_the_table():
  v = si.VARIANTS["vendored"]
  inp, _ = _inputs(v, "fp8")
  kw = v.static(inp, k=8, compression_ratio=4)
  row = v.block_sizes(cache_format="fp8", num_heads=NUM_HEADS,
                      page_size=inp.batch.page_size)
  assert kw == {"k": 8, "compression_ratio": 4, **row.kwargs()}
  assert v.static(inp, k=8, compression_ratio=4,
                  num_queries_per_block=2)["num_queries_per_block"] == 2


def test_import_streamidx_loads_no_notebook_code():
  code = ("import streamidx, sys; "
          "bad = [m for m in ('matplotlib', 'papermill', 'nbformat', "
          "'streamidx.lab') if m in sys.modules]; "
          "assert not bad, bad")
  subprocess.run([sys.executable, "-c", code], check=True)


def test_wheel_ships_the_hardware_table(tmp_path):
  root = si.__file__.rsplit("/streamidx/", 1)[0]
  subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps",
                  "--no-build-isolation", "-q", "-w", str(tmp_path), root],
                 check=True, capture_output=True)
  (wheel,) = tmp_path.glob("streamidx-*.whl")
  names = zipfile.ZipFile(wheel).namelist()
  assert "streamidx/data/tpu_specs.json" in names
  assert "streamidx/lab/model/hardware.py" in names
  assert not [n for n in names if n.startswith(("tests/", "notebooks/"))]
  # Installed outside the checkout, the hardware model still finds it.
  site = tmp_path / "site"
  zipfile.ZipFile(wheel).extractall(site)
  code = ("import streamidx.lab.model.hardware as h; "
          "assert h.__file__.startswith(%r), h.__file__; "
          "print(sorted(h.load_specs()))" % str(site))
  out = subprocess.run([sys.executable, "-c", code], check=True, cwd=tmp_path,
                       capture_output=True, text=True,
                       env={"PYTHONPATH": str(site), "PATH": "/usr/bin:/bin",
                            "JAX_PLATFORMS": "cpu"})
  assert out.stdout.strip() == str(["v4", "v5e", "v5p", "v6e", "v7x"])


@pytest.mark.parametrize("gen", ["v4", "v5e", "v5p", "v6e", "v7x"])
def test_block_table_has_a_speculative_decode_row_per_generation(gen):
  """decode_q_len = 2 (M17) at DeepSeek-V4's shape: a row keyed by it on
  every generation, from the static schedule; the production top-k sizes
  (k is no key) and other row counts keep the q_len-1 rows."""
  for variant, fmt in (("vendored", "fp8"), ("dense", "dense_fp8")):
    key = dict(cache_format=fmt, num_heads=64, page_size=128, generation=gen)
    mtp = si.block_sizes(variant, **key, decode_q_len=2)
    one = si.block_sizes(variant, **key)
    assert mtp.decode_q_len == 2 and one.decode_q_len is None
    assert mtp.source in blocks.STATIC_SCHEDULE_SOURCES
    assert mtp.source.startswith("static schedule (no TPU timing")
    assert mtp.num_kv_pages_per_block[1:] == one.num_kv_pages_per_block[1:]
    assert si.block_sizes(variant, **key, decode_q_len=3) == one
  call = si.TopkCall(k=512, compression_ratio=4, decode_q_len=2)
  with si.compile_for(gen):
    got = call.with_table_blocks("vendored", cache_format="fp8",
                                 num_heads=64, page_size=128)
  assert got.block_source == si.block_sizes(
      "vendored", cache_format="fp8", num_heads=64, page_size=128,
      generation=gen, decode_q_len=2).source
