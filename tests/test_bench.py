"""`python -m streamidx.bench --quick` runs end to end; its outputs hold.

Timings are never asserted (this machine is shared): only that the run
finished, that every implementation produced a result with the fields the
docs/benchmarks.md and the notebooks read, and that every result agrees with the NumPy
oracle (the bench's own exit status).
"""

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import streamidx as si
from streamidx.lab import shapes as shapes_lib
from streamidx.lab.bench import harness, record

import tiers

ROOT = Path(__file__).resolve().parents[1]


# CI: `--quick` on its decode shape only (each implementation on a shape is
# a process of its own, ~4 CPU-s); the full tier runs plain `--quick`.
if tiers.in_full_tier():
  QUICK_ARGS, QUICK_SHAPES = [], [s.name for s in shapes_lib.QUICK]
else:
  QUICK_ARGS, QUICK_SHAPES = ["--shapes", shapes_lib.QUICK[0].name], [shapes_lib.QUICK[0].name]


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory):
  out = tmp_path_factory.mktemp("bench")
  env = dict(os.environ, PYTHONPATH=str(ROOT))
  proc = subprocess.run(
      [sys.executable, "-m", "streamidx.bench", "--quick", *QUICK_ARGS, "--out",
       str(out), "--no-progress"], capture_output=True, text=True, env=env,
      timeout=600, check=False)
  return proc, out


def test_quick_run_exits_cleanly_and_prints_the_table(quick_run):
  proc, out = quick_run
  assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
  assert "median ms" in proc.stdout
  assert "geometric mean over shapes" in proc.stdout


def test_quick_json_has_every_implementation_on_every_shape(quick_run):
  _, out = quick_run
  doc = json.loads((out / "bench.json").read_text())
  assert doc["schema"] == harness.SCHEMA
  assert doc["settings"]["quick"] is True
  assert doc["machine"]["kernel_mode"] in ("interpreted", "compiled")
  shapes = [s["name"] for s in doc["shapes"]]
  assert shapes == QUICK_SHAPES
  tokens = {s["name"]: s["num_tokens"] for s in doc["shapes"]}
  assert all(s["visible_pairs"] > 0 for s in doc["shapes"])
  got = {(r["shape"], r["impl"]) for r in doc["results"]}
  assert got == {(s, i) for s in shapes for i in harness.IMPLEMENTATIONS}
  for r in doc["results"]:
    if r.get("variant") == "fp4":  # MXFP4 holds other (quantized) keys: the
      assert r["status"] == "skipped" and "mxfp4" in r["reason"], r  # FP8
      continue                     # shape's oracle cannot judge it
    assert r["status"] == "ok", r
    w = r["wall_s"]
    assert len(w["runs"]) == doc["settings"]["repeats"] == 3
    assert all(math.isfinite(x) and x > 0 for x in w["runs"])
    assert w["min"] <= w["median"] <= w["max"]
    assert r["entries_per_s"] > 0
    m = r["memory"]
    assert m["peak_rss_bytes"] >= m["rss_before_bytes"] > 0
    if r["impl"] == "oracle":
      assert m["xla"] is None
    else:
      assert m["xla"]["temp_bytes"] >= 0 and r["compile_s"] > 0
    a = r["agreement"]
    assert a["vs_oracle"]["ok"], (r["shape"], r["impl"], a)
    assert a["vs_oracle"]["atol"] > 0  # twice the derived float32 bound
    t = tokens[r["shape"]]  # every row of up to 32, else the first and last 8
    assert a["vs_oracle"]["rows_checked"] == (t if t <= 32 else 16)
    if r["impl"] != "reference":
      assert a["vs_reference"]["ok_exact_ties"], (r["shape"], r["impl"], a)
  ratios = doc["ratios"]["time_over_reference"]
  for s in shapes:
    assert ratios[s]["reference"] == 1.0
    assert set(ratios[s]) == set(harness.IMPLEMENTATIONS) - {"kernel:fp4"}


def test_kernel_and_streaming_are_identical_to_the_reference(quick_run):
  """On CPU the interpreted kernel and both references agree bit for bit."""
  _, out = quick_run
  doc = json.loads((out / "bench.json").read_text())
  for r in doc["results"]:
    if r["impl"] in ("kernel", "streaming"):
      assert r["agreement"]["vs_reference"]["identical"], r


@pytest.mark.parametrize("text,kind,num_seqs,q_len,seq_len,k", [
    ("decode:8x16384:512", "decode", 8, 1, 16384, 512),
    ("prefill:128x16384:2048", "prefill", 1, 128, 16384, 2048),
    ("decode_8x16K_k512", "decode", 8, 1, 16384, 512),
])
def test_parse_shape(text, kind, num_seqs, q_len, seq_len, k):
  s = shapes_lib.parse_shape(text)
  assert (s.kind, s.num_seqs, s.q_len, s.seq_len, s.k) == (
      kind, num_seqs, q_len, seq_len, k)
  assert (s.num_heads, s.head_dim, s.compression_ratio) == (64, 128, 4)


@pytest.mark.parametrize("text", ["decode:8:512", "sparse:8x16:4",
                                  "decode:axb:1", "decode:8x0:4", "nosuchshape"])
def test_parse_shape_rejects_bad_text_naming_the_flag(text):
  with pytest.raises(ValueError, match="--shapes"):
    shapes_lib.parse_shape(text)


def test_bad_arguments_stop_before_anything_runs(tmp_path):
  with pytest.raises(ValueError, match="implementations: 'gpu'"):
    harness.run(shapes_lib.QUICK, implementations=("gpu",), out_dir=tmp_path)
  with pytest.raises(ValueError, match="repeats: must be a positive int"):
    harness.run(shapes_lib.QUICK, repeats=0, out_dir=tmp_path)
  assert not list(tmp_path.iterdir())


def test_visible_pairs_match_the_reference_count():
  for s in shapes_lib.QUICK + shapes_lib.SWEEP:
    b = s.batch()
    want = si.ref.visible_counts(b.seq_lens, b.cu_q_lens, b.num_seqs,
                                 b.num_tokens,
                                 compression_ratio=s.compression_ratio).sum()
    assert s.visible_pairs() == want, s.name


def test_random_cache_is_seeded_and_tiles_the_pages():
  (a,) = record.random_cache(12, 16, 128, "fp8", seed=3, pages_per_step=8)
  (b,) = record.random_cache(12, 16, 128, "fp8", seed=3, pages_per_step=8)
  (c,) = record.random_cache(12, 16, 128, "fp8", seed=4, pages_per_step=8)
  assert a.shape == (12, 4, 4, 256) and a.dtype == np.uint8
  np.testing.assert_array_equal(a, b)
  assert not np.array_equal(a, c)
  keys = np.asarray(si.cache.unpack_cache(a))
  # Standard normal keys: every page drawn (gcd(12, 8) = 4 pages a step).
  assert np.all(keys.std(axis=(1, 2)) > 0.8)
  assert abs(keys.mean()) < 0.05
  # Every format from the same keys: the dense pair decodes to them too.
  values, scales = record.random_cache(12, 16, 128, "dense_fp8", seed=3,
                                      pages_per_step=8)
  np.testing.assert_array_equal(si.cache.unpack_cache((values, scales)), keys)


def test_every_token_variant_gets_a_kernel_column(monkeypatch):
  """A variant registered in streamidx.VARIANTS shows up with no bench edit."""
  import dataclasses
  from streamidx.kernels import driver
  base = si.VARIANTS["vendored"].kernel
  body = dataclasses.replace(base.body, name="fp8_twin",
                             cache_formats=("fp8",))
  extra = si.Variant(driver.Entry(base.spell, body, "token", "fp8_twin"))
  monkeypatch.setitem(si.variants.VARIANTS, "fp8_twin", extra)
  cols = harness.kernel_columns()
  assert list(cols)[0] == "kernel" and cols["kernel"] == "vendored"
  assert cols["kernel:fp8_twin"] == "fp8_twin"
  assert "vendored_page" not in cols.values()  # page mode: not a bench column
  # A variant reads the shape's format, or its own layout of that quantization.
  assert harness.variant_format("vendored", "fp8") == "fp8"
  assert harness.variant_format("fp8_twin", "fp8") == "fp8"
  assert harness.variant_format("fp8_twin", "bf16") is None
  assert harness.variant_format("vendored", "bf16") == "bf16"
  assert harness.variant_format("dense", "fp8") == "dense_fp8"  # decodes_as
  assert harness.variant_format("dense", "bf16") is None
  assert harness.IMPLEMENTATIONS == (*[c for c in cols if c != "kernel:fp8_twin"],
                                   "reference", "streaming", "oracle")


def test_memory_probes_read_proc():
  from streamidx.lab.bench import memory
  if not Path("/proc/self/status").exists():
    pytest.skip("no /proc on this system")
  rss = memory.proc_bytes("VmRSS")
  assert rss > 2**20
  assert memory.proc_bytes("NoSuchField") is None
  assert 0 < memory.proc_bytes("MemAvailable", "/proc/meminfo") <= (
      memory.proc_bytes("MemTotal", "/proc/meminfo"))
  peak = memory.PeakMemory()
  peak.start()
  assert peak.method.startswith("VmHWM") or peak.method.startswith("ru_")
  assert peak.peak() >= peak.rss_before > 0


def test_oracle_decodes_like_the_cache_module():
  from streamidx.lab.bench import oracle
  b = si.make_batch([(2, 64)], page_size=16, compression_ratio=4)
  for fmt in ("fp8", "bf16"):
    inp = si.make_inputs(b, num_heads=2, fmt=fmt, seed=1)
    keys = oracle.dequantize_cache(inp.cache, inp.head_dim)
    assert keys.dtype == np.float32
    np.testing.assert_array_equal(keys, np.asarray(si.cache.unpack_cache(inp.cache)))
    # Within FP8's (or bf16's) rounding of the logical keys.
    rel = 2.0**-3 if fmt == "fp8" else 2.0**-8
    np.testing.assert_allclose(keys, np.asarray(inp.keys), rtol=rel, atol=2.0**-9)


def test_oracle_topk_rule_equals_the_tests_oracle_on_tied_rows():
  """`bench.oracle.topk_rule` (what `--topk` checks every method against)
  is the rule: the tests' own oracle, row by row, on ties, zeros of both
  signs, subnormals, -inf and k above the entries."""
  from streamidx.lab.bench import oracle as bench_oracle
  import oracle
  rng = np.random.default_rng(3)
  x = rng.integers(-2, 3, (7, 300)).astype(np.float32)
  x[1] = rng.choice(np.array([0.0, -0.0, 1e-45, -1e-45, 1.0], np.float32), 300)
  x[2, 40:] = -np.inf
  x[3] = -np.inf
  x[4] = rng.standard_normal(300).astype(np.float32)
  for k in (1, 7, 64, 300, 310):
    np.testing.assert_array_equal(bench_oracle.topk_rule(x, k, rows_per_step=3),
                                  oracle.topk_rule(x, k), err_msg=str(k))
  with pytest.raises(ValueError, match="scores: the rule orders no NaN"):
    bench_oracle.topk_rule(np.full((1, 4), np.nan, np.float32), 2)

