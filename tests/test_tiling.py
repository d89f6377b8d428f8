"""The tiling model against the kernel itself.

- VMEM: the scratch buffers `tiling.plan` predicts for every launch equal the
  ones the kernel's own `pallas_call`s declare (read from `jax.make_jaxpr` of
  the kernel, so production sizes cost nothing), and the ones the
  interpreter allocates when the kernel runs.
- DMAs: the full sequence of DMA starts and waits `tiling.expected_dma_events`
  predicts (kind, slot, sequence in batch, bytes, physical page, output
  position) equals the sequence recorded from a real interpreted run.
- Decode batching: the waste counts, and the optimal batching order against
  brute force over every order.
- Launches (the project's one model of them): every sequence covered once,
  block sizes from the block-size table by default, launch names equal to
  the kernel's pallas_call names, grid points equal to an interpreted run's.
"""

import dataclasses
import functools
import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import streamidx as si
from streamidx import metrics
from streamidx.lab.model import tiling, timeline

import tiers
from streamidx.lab.studies import cases

# ---------------------------------------------------------------------------
# VMEM scratch: model vs the kernel's declared scratch_shapes.

SMALL = cases.blocks_for("vendored")


def _blocks(b, fmt="fp8", num_heads=8):
  """The case matrix's small blocks at page size 16, else the block-size
  table's row (what `tiling.plan` takes by default)."""
  if b.page_size == 16:
    return SMALL
  row = si.block_sizes("vendored", cache_format=fmt, num_heads=num_heads,
                       page_size=b.page_size)
  return dict(num_kv_pages_per_block=row.num_kv_pages_per_block,
              num_queries_per_block=row.num_queries_per_block)


def _shapes(inp_batch, fmt, num_heads, q_dtype):
  """Kernel arguments as ShapeDtypeStructs (no cache is allocated)."""
  b = inp_batch
  g = tiling.geometry(b, fmt=fmt, num_heads=num_heads, q_dtype=q_dtype)
  cache = jax.ShapeDtypeStruct(
      (b.total_num_pages, g.page_size_per_kv_packing, g.kv_packing, g.lkv_dim),
      g.cache_dtype)
  q = jax.ShapeDtypeStruct((b.num_tokens, num_heads, 128), jnp.dtype(q_dtype))
  w = jax.ShapeDtypeStruct((b.num_tokens, num_heads), jnp.float32)
  seq_lens, page_indices, cu_q_lens, distribution = b.kernel_arrays()
  return (q, w, cache, seq_lens, page_indices, cu_q_lens, distribution)


def _batches():
  return {
      "dsv4_decode_64x128k": si.make_mixed_batch(
          decode=[131072] * 64, page_size=128, compression_ratio=4),
      "all_three_ranges": si.make_mixed_batch(
          decode=[4096, 512, 9000], prefill=[(300, 5000)], mixed=[(1, 700), (40, 2048)],
          page_size=128, compression_ratio=4),
      "small_pages": si.make_mixed_batch(
          decode=[37, 64, 100, 400, 7], prefill=[(7, 50)], mixed=[(20, 90)],
          page_size=16, compression_ratio=4),
  }


@pytest.mark.parametrize("fmt,num_heads,q_dtype", [
    ("fp8", 64, "bfloat16"),  # DeepSeek-V4's indexer
    ("bf16", 8, "float32"),
    ("fp8", 5, "bfloat16"),   # heads padded to the bf16 packing (6)
])
@pytest.mark.parametrize("decode_req_batch_size", [1, 4])
@pytest.mark.parametrize("name", ["dsv4_decode_64x128k", "all_three_ranges",
                                  "small_pages"])
def test_vmem_model_equals_kernel_scratch_shapes(name, decode_req_batch_size,
                                                 num_heads, fmt, q_dtype):
  b = _batches()[name]
  blocks = _blocks(b, fmt, num_heads)
  vmem_limit = 48 * 1024 * 1024
  declared = tiling.kernel_scratch(
      _shapes(b, fmt, num_heads, q_dtype), k=64, compression_ratio=4,
      decode_req_batch_size=decode_req_batch_size, vmem_limit_bytes=vmem_limit,
      **blocks)
  p = tiling.plan(b, fmt=fmt, num_heads=num_heads, q_dtype=q_dtype,
                  decode_req_batch_size=decode_req_batch_size, **blocks)
  assert [d["case"] for d in declared] == ["decode", "decode", "prefill", "mixed"]
  assert len(declared) == len(p.launches)
  for d, launch in zip(declared, p.launches):
    assert d["scratch"] == [(s, dt) for _, s, dt in launch.scratch], launch.case
    assert d["vmem_limit_bytes"] == vmem_limit
    want = sum(int(np.prod(s)) * np.dtype(dt).itemsize for s, dt in d["scratch"])
    assert launch.vmem_bytes == want


@pytest.mark.parametrize("fmt", ["fp8", "bf16"])
@pytest.mark.parametrize("num_heads", [8, 32])
def test_vmem_model_equals_kernel_scratch_shapes_page_mode(num_heads, fmt):
  b = si.make_mixed_batch(decode=[300, 5000], prefill=[(64, 20000)],
                          page_size=16, compression_ratio=1)
  declared = tiling.kernel_scratch(
      _shapes(b, fmt, num_heads, "bfloat16")[:6] + (jnp.int32(b.num_seqs),),
      mode="page", k_pages=4, num_queries_per_block=64)
  p = tiling.plan(b, fmt=fmt, num_heads=num_heads, mode="page",
                  num_kv_pages_per_block=128, num_queries_per_block=64)
  assert len(declared) == 1 and declared[0]["name"].startswith("StreamIdxPageTC")
  assert declared[0]["scratch"] == [(s, dt) for _, s, dt in p.launches[0].scratch]


def test_production_decode_scratch_by_hand():
  """64 heads, FP8, page 128, decode batch 4, bkv_p 3 (the block-size
  table's row, `tiling.plan`'s default): each buffer by hand."""
  b = _batches()["dsv4_decode_64x128k"]
  p = tiling.plan(b, fmt="fp8", num_heads=64)
  assert (p.launches[0].bkv_p, p.launches[0].seq_batch_size) == (3, 4)
  s = tiling.scratch_bytes(p.launches[0].scratch)
  assert s == {
      "bkv_x2": 2 * 4 * 3 * 128 * 256,      # 2 slots x 4 seqs x 384 records x 256 B
      "bq_x2": 2 * 4 * 1 * 64 * 128 * 2,    # bf16 queries
      "bq_weights_x2": 2 * 4 * 1 * 64 * 4,  # f32 weights
      "scores_block_x2": 2 * 4 * 384 * 4,   # f32 scores of one step
  }


# ---------------------------------------------------------------------------
# DMAs: model vs a real interpreted run.

KW = dict(k=8, compression_ratio=4, num_kv_pages_per_block=(8, 8, 16),
          num_queries_per_block=(1, 8, 16), decode_req_batch_size=2)


@functools.lru_cache(maxsize=None)
def _recorded_token_run():
  # Decode (two programs of 2 + one alone), a prefill of 5 query blocks and
  # two mixed sequences; lengths chosen so blocks end mid-page and decode
  # batches mix 1- and 3-block sequences.
  b = si.make_mixed_batch(decode=[37, 900, 64, 100, 300],
                          prefill=[(40, 800)], mixed=[(1, 90), (20, 333)],
                          page_size=16, compression_ratio=4,
                          allocation="fragmented", seed=3)
  inp = si.make_inputs(b, num_heads=4, fmt="fp8", seed=1)
  with timeline.record() as rec:
    got = si.streamindex_topk(*inp.args, **KW)
    got = jax.block_until_ready(got)
  return inp, rec, got


@functools.lru_cache(maxsize=None)
def _recorded_page_run():
  b = si.make_mixed_batch(decode=[20], prefill=[(9, 2100)], mixed=[(3, 700)],
                          page_size=8, compression_ratio=1, seed=4)
  inp = si.make_inputs(b, num_heads=4, fmt="bf16", seed=2)
  kw = dict(k_pages=4, num_queries_per_block=8)
  with timeline.record() as rec:
    got = jax.block_until_ready(si.streamindex_page_topk(*inp.page_args, **kw))
  return inp, rec, got, kw


def test_recorded_run_still_returns_the_reference_topk():
  # The recorder only watches: the kernel's answer is unchanged.
  inp, rec, got = _recorded_token_run()
  assert not rec.errors()
  want = si.streamindex_topk_ref(*inp.args, **KW)
  scores = si.token_scores(*inp.args, compression_ratio=4)
  metrics.assert_topk_match(got, want, scores)


def test_dma_sequence_equals_interpreted_kernel_run_token_mode():
  inp, rec, _ = _recorded_token_run()
  p = tiling.plan(inp.batch, fmt="fp8", num_heads=4,
                  num_kv_pages_per_block=KW["num_kv_pages_per_block"],
                  num_queries_per_block=KW["num_queries_per_block"],
                  decode_req_batch_size=2)
  want = [e.key() for e in tiling.expected_dma_events(p)]
  got = [e.key() for e in rec.dma_events()]
  assert len(got) == len(want)
  first = next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), None)
  assert first is None, f"event {first}: recorded {got[first]}, model {want[first]}"
  # Every launch exercised something: decode batches, the alone one, a
  # prefill with several query blocks, mixed.
  c = p.counts()
  assert [l.grid for l in p.launches] == [2, 1, 1, 2]
  assert p.launches[2].programs[0].num_bq == 5  # 40 rows / bq 8
  assert c["dma_kv"] == sum(1 for e in got if e[1:3] == ("start", "kv"))
  assert c["dma_out"] == sum(1 for e in got if e[1:3] == ("start", "out"))
  # Each start is waited for, each kind in full.
  for kind in ("kv", "q", "w", "out"):
    starts = sum(e[5] for e in got if e[1:3] == ("start", kind))
    waits = sum(e[5] for e in got if e[1:3] == ("wait", kind))
    assert starts == waits, kind


@tiers.FULL
def test_dma_sequence_equals_interpreted_kernel_run_speculative_decode():
  """Speculative decoding (M17), 3 rows per decode sequence: batched decode
  programs hold 2 x 3 rows, one DMA of 6 score rows per KV block."""
  b = si.make_mixed_batch(decode=[37, 900, 64, 3, 300], prefill=[(9, 200)],
                          mixed=[(1, 90)], decode_q_len=3, page_size=16,
                          compression_ratio=4, allocation="fragmented",
                          seed=5)
  inp = si.make_inputs(b, num_heads=4, fmt="fp8", seed=2)
  kw = dict(KW, decode_q_len=3)
  with timeline.record() as rec:
    got = jax.block_until_ready(si.streamindex_topk(*inp.args, **kw))
  metrics.assert_topk_match(got, si.streamindex_topk_ref(*inp.args, **kw),
                            si.token_scores(*inp.args, compression_ratio=4))
  p = tiling.plan(b, fmt="fp8", num_heads=4,
                  num_kv_pages_per_block=KW["num_kv_pages_per_block"],
                  num_queries_per_block=KW["num_queries_per_block"],
                  decode_req_batch_size=2)
  assert [(l.grid, l.bq_sz) for l in p.launches[:2]] == [(2, 3), (1, 3)]
  want = [e.key() for e in tiling.expected_dma_events(p)]
  got = [e.key() for e in rec.dma_events()]
  assert got == want
  outs = [e for e in got if e[1:3] == ("start", "out") and e[0] == 0]
  assert outs and all(e[5] == 6 * 128 * 4 for e in outs)  # 6 rows x 128 f32


def test_dma_sequence_equals_interpreted_kernel_run_page_mode():
  inp, rec, got, kw = _recorded_page_run()
  want_idx = si.streamindex_page_topk_ref(*inp.page_args, **kw)
  np.testing.assert_array_equal(np.sort(np.asarray(got), 1),
                                np.sort(np.asarray(want_idx), 1))
  p = tiling.plan(inp.batch, fmt="bf16", num_heads=4, mode="page",
                  num_kv_pages_per_block=128, num_queries_per_block=8)
  want = [e.key() for e in tiling.expected_dma_events(p)]
  assert [e.key() for e in rec.dma_events()] == want
  assert p.launches[0].programs[1].num_bq == 2  # the 9-row prefill
  assert p.launches[0].programs[1].num_bkv == 3  # 2100 entries / (128 x 8)


def test_interpreter_allocates_exactly_the_modelled_vmem():
  inp, rec, _ = _recorded_token_run()
  p = tiling.plan(inp.batch, fmt="fp8", num_heads=4,
                  num_kv_pages_per_block=KW["num_kv_pages_per_block"],
                  num_queries_per_block=KW["num_queries_per_block"],
                  decode_req_batch_size=2)
  assert rec.allocations("vmem") == [[(s, d) for _, s, d in l.scratch]
                                     for l in p.launches]


def test_grid_points_and_compute_steps_match_the_plan():
  inp, rec, _ = _recorded_token_run()
  p = tiling.plan(inp.batch, fmt="fp8", num_heads=4,
                  num_kv_pages_per_block=KW["num_kv_pages_per_block"],
                  num_queries_per_block=KW["num_queries_per_block"],
                  decode_req_batch_size=2)
  grids = [sum(1 for op in rec.ops if op.kind == "grid" and op.launch == i)
           for i in range(len(p.launches))]
  assert grids == [l.grid for l in p.launches]
  computes = [l for l in rec.lanes() if l["lane"] == "compute"]
  assert len(computes) == sum(l.num_steps for l in p.launches)
  assert len(computes) == len(list(tiling.steps(p)))


# ---------------------------------------------------------------------------
# Model rules.


def test_plan_rejects_blocks_the_kernel_rejects():
  b = si.make_mixed_batch(decode=[100], page_size=16, compression_ratio=4)
  with pytest.raises(ValueError, match="multiple of 128"):
    tiling.plan(b, num_kv_pages_per_block=(3, 8, 8), num_queries_per_block=8)
  with pytest.raises(ValueError, match="page mode requires"):
    tiling.plan(b, mode="page", num_kv_pages_per_block=64,
                num_queries_per_block=8)


def test_decode_batch_longest_sequence_sets_the_blocks_of_all():
  # bkv_sz = 3 x 128 = 384 entries (the table's row); lengths in tokens at
  # ratio 4.
  b = si.make_mixed_batch(decode=[4 * 384 * 5, 4 * 10, 4 * 400, 4 * 384],
                          page_size=128, compression_ratio=4)
  p = tiling.plan(b)
  assert p.launches[0].bkv_sz == 384
  (pr,) = p.launches[0].programs
  assert pr.num_bkv == 5
  w = tiling.block_waste(p)
  assert w["blocks_needed"] == 5 + 1 + 2 + 1
  assert w["blocks_computed"] == 4 * 5
  assert w["blocks_wasted"] == 20 - 9


def test_equal_lengths_waste_nothing():
  w = tiling.decode_batch_waste([4 * 768] * 12, page_size=128,
                                compression_ratio=4, num_kv_pages_per_block=3,
                                decode_req_batch_size=4)
  assert w["blocks_wasted"] == 0 and w["entry_efficiency"] == 1.0


def _cost(blocks, b):
  end = len(blocks) // b * b
  return (sum(b * max(blocks[i:i + b]) for i in range(0, end, b))
          + sum(blocks[end:]))


@pytest.mark.parametrize("seed", range(6))
def test_optimal_batching_order_is_optimal_by_brute_force(seed):
  rng = np.random.default_rng(seed)
  for _ in range(60):
    n, b = int(rng.integers(1, 8)), int(rng.integers(1, 5))
    blocks = rng.integers(1, 12, size=n).tolist()
    order = tiling.batching_order(blocks, b, "optimal")
    assert sorted(order) == list(range(n))
    best = min(_cost(list(p), b) for p in itertools.permutations(blocks))
    assert _cost([blocks[i] for i in order], b) == best


def test_ascending_sort_can_compute_more_than_no_sort():
  # The remainder (n % B) runs alone: ascending order leaves the longest
  # sequence there and batches the second longest with the short ones.
  lens = [3360, 4452, 998, 3791, 4710, 243]
  kw = dict(page_size=16, compression_ratio=4, num_kv_pages_per_block=8,
            decode_req_batch_size=5)
  none = tiling.decode_batch_waste(lens, sort="none", **kw)
  asc = tiling.decode_batch_waste(lens, sort="ascending", **kw)
  opt = tiling.decode_batch_waste(lens, sort="optimal", **kw)
  assert asc["blocks_computed"] > none["blocks_computed"] >= opt["blocks_computed"]
  assert asc["blocks_needed"] == none["blocks_needed"] == opt["blocks_needed"]


def test_vmem_budget_totals():
  b = _batches()["dsv4_decode_64x128k"]
  g = tiling.geometry(b, fmt="fp8", num_heads=64)
  v = tiling.vmem_budget(g, bq_sz=128, bkv_p=2, case="prefill")
  assert v["logits"] == 128 * 64 * 256 * 4
  assert v["scratch"] == (2 * 2 * 128 * 256 + 2 * 128 * 64 * 128 * 2
                          + 2 * 128 * 64 * 4 + 2 * 128 * 256 * 4)
  assert v["total"] == v["scratch"] + v["logits"]
  # As Mosaic tiles it: the f32 weights' 64 heads pad to 128 lanes.
  assert v["scratch_tiled"] == v["scratch"] + 2 * 128 * 64 * 4


def _event_counts(p):
  c = {}
  for kind in ("kv", "q", "w", "out"):
    starts = [e for e in tiling.expected_dma_events(p)
              if e.op == "start" and e.kind == kind]
    c[f"dma_{kind}"] = len(starts)
    c[f"bytes_{kind}"] = sum(e.nbytes for e in starts)
  return c


@pytest.mark.parametrize("name", ["all_three_ranges", "small_pages"])
@pytest.mark.parametrize("decode_req_batch_size", [1, 2, 4])
def test_closed_form_counts_equal_walking_every_dma(name, decode_req_batch_size):
  b = _batches()[name]
  p = tiling.plan(b, num_heads=8, decode_req_batch_size=decode_req_batch_size,
                  **_blocks(b))
  c = p.counts()
  assert {k: c[k] for k in _event_counts(p)} == _event_counts(p)


def test_closed_form_counts_equal_walking_every_dma_page_mode():
  b = si.make_mixed_batch(decode=[20], prefill=[(9, 2100), (0, 40)],
                          mixed=[(300, 700)], page_size=8, compression_ratio=1)
  p = tiling.plan(b, fmt="bf16", num_heads=4, mode="page",
                  num_kv_pages_per_block=128, num_queries_per_block=64)
  c = p.counts()
  assert {k: c[k] for k in _event_counts(p)} == _event_counts(p)


# ---------------------------------------------------------------------------
# The launches (the model notebook 01 draws and the case matrix names).

DISTRIBUTION_FORMS = {
    "empty": (0, 0, 0),
    "decode_only": (7, 7, 7),
    "prefill_only": (0, 5, 5),
    "mixed_only": (0, 0, 6),
    "decode_prefill": (5, 8, 8),
    "decode_mixed": (6, 6, 9),
    "prefill_mixed": (0, 3, 7),
    "all_three": (9, 11, 14),
}


def _form_batch(i, j, n):
  return si.make_mixed_batch(decode=[400 + 64 * s for s in range(i)],
                             prefill=[(5 + s, 900) for s in range(j - i)],
                             mixed=[(1 + s % 3, 700) for s in range(n - j)],
                             page_size=128, compression_ratio=4,
                             max_num_seqs=max(n, 1))


@pytest.mark.parametrize("decode_req_batch_size", [1, 2, 3, 4, 8])
@pytest.mark.parametrize("form", sorted(DISTRIBUTION_FORMS))
def test_launches_cover_each_sequence_exactly_once(form, decode_req_batch_size):
  i, j, n = DISTRIBUTION_FORMS[form]
  p = tiling.plan(_form_batch(i, j, n), num_queries_per_block=(1, 128, 64),
                  decode_req_batch_size=decode_req_batch_size)
  assert [l.case for l in p.launches] == list(tiling.TOKEN_CASES)
  covered = [s for _, pr in p.programs() for s in pr.seqs]
  assert sorted(covered) == list(range(n)) and len(covered) == n
  case_of = {s: l.case for l in p.launches for pr in l.programs
             for s in pr.seqs}
  assert all(case_of[s] in ("decode", "decode_rest") for s in range(i))
  assert all(case_of[s] == "prefill" for s in range(i, j))
  assert all(case_of[s] == "mixed" for s in range(j, n))
  batched, rest, prefill, mixed = p.launches
  assert batched.seq_batch_size == decode_req_batch_size
  assert batched.grid == i // decode_req_batch_size
  assert rest.grid == i % decode_req_batch_size
  assert (batched.static_q_len, rest.static_q_len) == (1, 1)
  assert (prefill.static_q_len, mixed.static_q_len) == (None, None)
  # The table's row at page size 128: (3, 2, 2) pages.
  assert (batched.bkv_p, prefill.bkv_p, mixed.bkv_p) == (3, 2, 2)
  assert (batched.bq_sz, prefill.bq_sz, mixed.bq_sz) == (1, 128, 64)


def test_launch_names_are_the_kernels_scope_names():
  b = _form_batch(2, 3, 4)
  p = tiling.plan(b, num_kv_pages_per_block=8,
                  num_queries_per_block=(4, 16, 32))
  # Decode: bq = min(num_queries_per_block, static q_len 1).
  assert [l.name for l in p.launches] == [
      "StreamIdxTC-d-bq_1-bkvp_8", "StreamIdxTC-d-bq_1-bkvp_8",
      "StreamIdxTC-p-bq_16-bkvp_8", "StreamIdxTC-m-bq_32-bkvp_8"]
  page = si.make_mixed_batch(prefill=[(9, 300)], page_size=16,
                             compression_ratio=1)
  (launch,) = tiling.plan(page, mode="page", num_queries_per_block=8).launches
  assert launch.name == "StreamIdxPageTC-bq_8-bkvp_128"


def test_launch_names_equal_the_kernels_pallas_call_names():
  b = _batches()["all_three_ranges"]
  p = tiling.plan(b, fmt="fp8", num_heads=8, decode_req_batch_size=2)
  declared = tiling.kernel_scratch(_shapes(b, "fp8", 8, "bfloat16"), k=64,
                                   compression_ratio=4,
                                   decode_req_batch_size=2, **_blocks(b))
  assert [d["name"] for d in declared] == [l.name for l in p.launches]


def test_plan_rejects_bad_block_sizes_and_batch_size():
  b = _form_batch(1, 1, 1)
  with pytest.raises(ValueError, match="num_queries_per_block"):
    tiling.plan(b, num_kv_pages_per_block=8, num_queries_per_block=(1, 8))
  with pytest.raises(ValueError, match="decode_req_batch_size"):
    tiling.plan(b, decode_req_batch_size=0)


def test_plan_rejects_a_variant_it_does_not_model_or_a_wrong_mode():
  b = _form_batch(1, 1, 1)
  with pytest.raises(ValueError, match="mode: variant 'vendored' runs in"):
    tiling.plan(b, variant="vendored", mode="page")
  with pytest.raises(ValueError, match="variant: must be one of"):
    tiling.plan(b, variant="no_such_kernel")


def test_block_sizes_default_to_the_table_row():
  b = _batches()["small_pages"]  # page size 16: the table's heuristic row
  row = si.block_sizes("vendored", cache_format="bf16", num_heads=8,
                       page_size=16)
  p = tiling.plan(b, fmt="bf16", num_heads=8)
  q = tiling.plan(b, fmt="bf16", num_heads=8, **row.kwargs())
  assert ([(l.bkv_p, l.bq_sz, l.seq_batch_size) for l in p.launches]
          == [(l.bkv_p, l.bq_sz, l.seq_batch_size) for l in q.launches])
  nkv = row.num_kv_pages_per_block
  assert [l.bkv_p for l in p.launches] == [nkv[0], nkv[0], nkv[1], nkv[2]]


def test_programs_count_query_and_kv_blocks_like_the_kernel():
  # page_size 16, bkv_p 8: 128 entries per KV block.
  batch = si.make_mixed_batch(decode=[4 * 300, 4 * 100, 4 * 129],
                              prefill=[(9, 4 * 128)], mixed=[(1, 40)],
                              page_size=16, compression_ratio=4)
  # The given order (sort_decode=False): sorted, the 129-entry sequence
  # would share a program with the 300-entry one (7 blocks instead of 8).
  p = tiling.plan(batch, num_kv_pages_per_block=8,
                  num_queries_per_block=(1, 4, 4), decode_req_batch_size=2,
                  sort_decode=False)
  got = [(li, pr.seqs, pr.num_bq, pr.num_bkv, pr.q_rows)
         for li, pr in p.programs()]
  assert got == [
      (0, (0, 1), 1, 3, ((0, 1), (1, 2))),  # max(300, 100) entries: 3 blocks
      (1, (2,), 1, 2, ((2, 3),)),           # 129 entries: 2 blocks
      (2, (3,), 3, 1, ((3, 12),)),          # 9 rows / bq 4: 3 query blocks
      (3, (4,), 1, 1, ((12, 13),)),         # 10 entries: still 1 block
  ]
  assert p.covered_rows().sum() == 13
  assert p.summary() == "decode[2] x1, decode[1] x1, prefill x1, mixed x1"


def test_grid_points_match_the_interpreted_kernels():
  recorded = []

  def recorder(token, grid_point, core):
    recorded.append(tuple(int(g) for g in grid_point))
    return token

  batch = si.make_mixed_batch(decode=[37, 64, 100, 20, 30], prefill=[(7, 50)],
                              mixed=[(5, 90)], page_size=16,
                              compression_ratio=4, allocation="fragmented")
  inp = si.make_inputs(batch, num_heads=2, fmt="fp8")
  kw = dict(k=8, compression_ratio=4, num_kv_pages_per_block=8,
            num_queries_per_block=(1, 8, 8), decode_req_batch_size=2)
  args = list(inp.args)
  # Same shapes, other distributions: one compile, several launch plans.
  for distribution in [(5, 6, 7), (3, 5, 7), (0, 0, 7), (4, 7, 7)]:
    recorded.clear()
    args[6] = jnp.asarray(distribution, jnp.int32)
    with si.interpreter(grid_point_recorder=recorder):
      si.streamindex_topk(*args, **kw).block_until_ready()
    p = tiling.plan(dataclasses.replace(
        batch, distribution=np.asarray(distribution, np.int32)),
                    fmt="fp8", num_heads=2,
                    **{k: v for k, v in kw.items()
                       if k not in ("k", "compression_ratio")})
    assert recorded == p.grid_points(), distribution


@pytest.mark.parametrize("q_len", [2, 4])
def test_vmem_model_equals_kernel_scratch_shapes_speculative_decode(q_len):
  """M17: the decode launches hold all q_len rows of each of their B
  sequences (bq = q_len); the model's scratch is the kernel's (traced at
  DeepSeek-V4 sizes, nothing runs)."""
  b = si.make_mixed_batch(decode=[131072] * 6, mixed=[(1, 700)],
                          decode_q_len=q_len, page_size=128,
                          compression_ratio=4)
  blocks = _blocks(b, "fp8", 64)
  declared = tiling.kernel_scratch(
      _shapes(b, "fp8", 64, "bfloat16"), k=512, compression_ratio=4,
      decode_req_batch_size=4, decode_q_len=q_len, **blocks)
  p = tiling.plan(b, fmt="fp8", num_heads=64, decode_req_batch_size=4,
                  **blocks)
  assert [(l.grid, l.bq_sz, l.seq_batch_size) for l in p.launches[:2]] == [
      (1, q_len, 4), (2, q_len, 1)]
  for d, launch in zip(declared, p.launches):
    assert d["scratch"] == [(s, dt) for _, s, dt in launch.scratch]
  assert {n: s for n, s, _ in p.launches[0].scratch}["bq_x2"] == (
      2, 4, q_len, 64, 128)
