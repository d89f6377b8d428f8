"""Length-sorted decode batching (`sort_decode`) and no empty launches.

- `semantics.decode_order`: a permutation of the decode range (the identity
  past it) that never computes more KV blocks than the given order, and no
  more than the simple sorted orders; within 10% wasted blocks on notebook
  02's log-normal mixes (decode batch 4), where the given order wastes half.
- The kernels with `sort_decode` return exactly the indices of the given
  order, in the caller's row order, and match the reference.
- Wasted KV blocks counted from the DMAs the interpreter executes equal the
  tiling model's, given and sorted.
- A launch whose range is empty does not run: no launch, grid point or DMA
  in the interpreter's recording (vendored and dense, token and page).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import streamidx as si
from streamidx import metrics, semantics
from streamidx.lab.model import tiling, timeline
from streamidx.lab.studies import costs
import tiers


def _blocks_computed(blocks, order, d):
  n = len(blocks)
  grouped = n // d * d
  b = [blocks[o] for o in order]
  return (sum(d * max(b[g:g + d]) for g in range(0, grouped, d))
          + sum(b[grouped:]))


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("d", [2, 3, 4])
def test_decode_order_is_a_permutation_never_worse_than_given(seed, d):
  rng = np.random.default_rng(seed)
  max_num_seqs = 12
  n = int(rng.integers(0, max_num_seqs + 1))
  seq_lens = np.zeros(max_num_seqs, np.int32)
  seq_lens[:max_num_seqs] = rng.integers(1, 2000, size=max_num_seqs)
  order, given, best = semantics.decode_order(
      seq_lens, n, compression_ratio=4, bkv_sz=64, decode_req_batch_size=d)
  order = [int(x) for x in np.asarray(order)]
  assert sorted(order) == list(range(max_num_seqs))
  assert order[n:] == list(range(n, max_num_seqs))
  blocks = [max(1, -(-(int(s) // 4) // 64)) for s in seq_lens[:n]]
  assert int(given) == _blocks_computed(blocks, range(n), d)
  assert int(best) == _blocks_computed(blocks, order[:n], d)
  assert int(best) <= int(given)
  for sort in ("ascending", "descending"):
    other = tiling.batching_order(blocks, d, sort)
    assert int(best) <= _blocks_computed(blocks, other, d), sort
  optimal = tiling.batching_order(blocks, d, "optimal")
  assert _blocks_computed(blocks, optimal, d) <= int(best)


def test_decode_order_keeps_the_given_order_when_nothing_is_gained():
  lens = np.array([400, 400, 100, 100, 7, 0], np.int32)  # already grouped
  order, given, best = semantics.decode_order(
      lens, 4, compression_ratio=1, bkv_sz=128, decode_req_batch_size=2)
  assert np.asarray(order).tolist() == list(range(6))
  assert int(given) == int(best) == 2 * 4 + 2 * 1


def _notebook03_mixes():
  # Notebook 05's default parameters (section 4): 40 log-normal mixes of 62
  # sequences, median 16384 tokens, sigma 1, clipped to [512, 131072].
  rng = np.random.default_rng(0)
  return [np.clip(rng.lognormal(np.log(16384), 1.0, 62), 512,
                  131072).astype(int) for _ in range(40)]


def test_sorted_order_wastes_under_ten_percent_on_notebook03_mixes():
  waste = {}
  for sort in ("none", tiling.KERNEL_SORT):
    waste[sort] = [tiling.decode_batch_waste(
        m, page_size=128, compression_ratio=4, num_kv_pages_per_block=3,
        decode_req_batch_size=4, sort=sort)["waste_fraction"]
                   for m in _notebook03_mixes()]
  assert np.mean(waste["none"]) > 0.45
  assert np.mean(waste[tiling.KERNEL_SORT]) <= 0.10
  assert all(s <= g for s, g in zip(waste[tiling.KERNEL_SORT], waste["none"]))


# ---------------------------------------------------------------------------
# The kernels.

KW = dict(k=8, compression_ratio=4, num_kv_pages_per_block=(8, 8, 8),
          num_queries_per_block=(1, 8, 8), decode_req_batch_size=2)


@functools.lru_cache(maxsize=None)
def _decode_inputs():
  # Blocks of 128 entries: [3, 1, 2, 1, 3, 1, 1] -> the given pairs waste.
  b = si.make_mixed_batch(decode=[1500, 40, 700, 90, 1300, 300, 10],
                          mixed=[(5, 200)], page_size=16, compression_ratio=4,
                          allocation="shuffled", seed=2)
  return si.make_inputs(b, num_heads=4, fmt="fp8", seed=3)


def _dense_args(inp):
  q, w, _, *rest = inp.args
  return (q, w, *si.pack_dense_fp8_cache(inp.keys), *rest)


# CI: one token kernel each for the three tests below, the other in the full
# tier (tests/tiers.py).
@pytest.mark.parametrize("variant", tiers.first(["vendored", "dense"]))
def test_sorted_decode_returns_the_given_order_s_indices(variant):
  inp = _decode_inputs()
  b = inp.batch
  order, given, best = semantics.decode_order(
      b.seq_lens, int(b.distribution[0]), compression_ratio=4,
      bkv_sz=128, decode_req_batch_size=2)
  assert int(best) < int(given)  # the batch is reordered
  fn = si.streamindex_topk if variant == "vendored" else si.streamindex_topk_dense
  args = inp.args if variant == "vendored" else _dense_args(inp)
  got = np.asarray(jax.block_until_ready(fn(*args, sort_decode=True, **KW)))
  given_idx = np.asarray(fn(*args, sort_decode=False, **KW))
  # Each row is scored by the same block arithmetic in either order.
  np.testing.assert_array_equal(got, given_idx)
  metrics.assert_topk_match(
      got, si.streamindex_topk_ref(*inp.args, **KW),
      si.token_scores(*inp.args, compression_ratio=4),
      atol=metrics.summation_atol(inp, compression_ratio=4))


@pytest.mark.parametrize("sort_decode", tiers.split([False, True], bool))
def test_measured_waste_equals_the_tiling_model(sort_decode):
  inp = _decode_inputs()
  kw = {k: v for k, v in KW.items() if k != "k"}
  _, rec = costs.run_recorded("vendored", inp, k=KW["k"], sort_decode=sort_decode, **kw)
  p = tiling.plan(inp.batch, fmt="fp8", num_heads=4, sort_decode=sort_decode,
                  **{n: v for n, v in kw.items() if n != "compression_ratio"})
  m, model = costs.recorded_costs(rec, p), tiling.block_waste(p)
  assert m["blocks_fetched"] == model["blocks_computed"]
  # Needed, by hand: [3, 1, 2, 1, 3, 1, 1] blocks of 128 entries.
  assert m["blocks_needed"] == model["blocks_needed"] == 12
  # given: pairs (3,1) (2,1) (3,1) and 1 alone = 6+4+6+1; sorted: 13.
  assert m["blocks_fetched"] == (13 if sort_decode else 17)


# ---------------------------------------------------------------------------
# Empty launches.


def _recorded(fn, *args, **kw):
  with timeline.record() as rec:
    out = jax.block_until_ready(fn(*args, **kw))
  return out, costs.totals(costs.launch_counts(rec))


@pytest.mark.parametrize("variant", tiers.split(["vendored", "dense"],
                                                lambda v: v == "dense"))
def test_pure_decode_batch_launches_only_its_decode_range(variant):
  b = si.make_mixed_batch(decode=[300, 40, 200, 90], page_size=16,
                          compression_ratio=4, seed=1)
  inp = si.make_inputs(b, num_heads=4, fmt="fp8", seed=1)
  fn = si.streamindex_topk if variant == "vendored" else si.streamindex_topk_dense
  args = inp.args if variant == "vendored" else _dense_args(inp)
  got, t = _recorded(fn, *args, **KW)
  # decode [0, 4): two programs of 2; decode_rest, prefill, mixed empty.
  assert t["launches"] == 1 and t["grid_points"] == 2
  p = tiling.plan(b, num_heads=4, **{k: v for k, v in KW.items()
                                     if k not in ("k", "compression_ratio")})
  assert [l.case for l in p.executed] == ["decode"]
  metrics.assert_topk_match(
      got, si.streamindex_topk_ref(*inp.args, **KW),
      si.token_scores(*inp.args, compression_ratio=4),
      atol=metrics.summation_atol(inp, compression_ratio=4))


@pytest.mark.parametrize("variant", tiers.first(["vendored", "dense"]))
def test_a_batch_of_no_sequences_launches_nothing(variant):
  b = si.make_batch([], page_size=16, compression_ratio=1, max_num_seqs=2,
                    num_tokens=4, pages_per_seq=2, total_num_pages=4)
  inp = si.make_inputs(b, num_heads=4, fmt="fp8")
  if variant == "vendored":
    token_args, page_args = inp.args, inp.page_args
    token, page = si.streamindex_topk, si.streamindex_page_topk
  else:
    token_args = _dense_args(inp)
    q, w, _, *rest = inp.page_args
    page_args = (q, w, *si.pack_dense_fp8_cache(inp.keys), *rest)
    token, page = si.streamindex_topk_dense, si.streamindex_page_topk_dense
  got, t = _recorded(token, *token_args, **dict(KW, compression_ratio=1))
  assert t["launches"] == 0 and (np.asarray(got) == -1).all()
  got, t = _recorded(page, *page_args, k_pages=2, num_queries_per_block=8)
  assert t["launches"] == 0 and (np.asarray(got) == -1).all()


@pytest.mark.parametrize("q_len", [1, 2, 4])
def test_decode_order_moves_whole_draft_windows(q_len):
  """Speculative decoding (M17): slot j reads sequence order[j]'s q_len rows
  from q_rows[j] and writes them to its own rows [q_len j, q_len j + q_len);
  `restore_decode_rows` gives every row back to its sequence."""
  b = si.make_mixed_batch(decode=[900, 40, 600, 7, 300], mixed=[(3, 50)],
                          decode_q_len=q_len, page_size=16,
                          compression_ratio=4)
  order, given, best = semantics.decode_order(
      b.seq_lens, int(b.distribution[0]), compression_ratio=4, bkv_sz=128,
      decode_req_batch_size=2)
  assert int(best) < int(given)
  order = np.asarray(order)
  _, _, q_rows = semantics.apply_decode_order(
      order, jnp.asarray(b.seq_lens), jnp.asarray(b.page_indices),
      jnp.asarray(b.cu_q_lens))
  np.testing.assert_array_equal(q_rows, b.cu_q_lens[:-1][order])
  owner = b.token_seq_ids()  # row -> sequence, in the caller's order
  slot_rows = np.concatenate([
      owner[q_rows[j]:q_rows[j] + b.q_lens[order[j]]]
      for j in range(int(b.distribution[0]))] + [owner[5 * q_len:]])
  restored = semantics.restore_decode_rows(
      jnp.asarray(slot_rows)[:, None], jnp.asarray(order), q_len)
  np.testing.assert_array_equal(np.asarray(restored)[:, 0], owner)
