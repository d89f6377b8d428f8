"""Ragged batch construction."""

import numpy as np
import pytest

import streamidx as si


def test_cu_q_lens_distribution_and_positions():
  b = si.make_mixed_batch(decode=[10, 20], prefill=[(3, 9)], mixed=[(2, 5)],
                          page_size=4, compression_ratio=2, num_tokens=12,
                          max_num_seqs=6)
  np.testing.assert_array_equal(b.cu_q_lens, [0, 1, 2, 5, 7, 7, 7])
  np.testing.assert_array_equal(b.distribution, [2, 3, 4])
  np.testing.assert_array_equal(b.seq_lens, [10, 20, 9, 5, 0, 0])
  np.testing.assert_array_equal(
      b.token_seq_ids(), [0, 1, 2, 2, 2, 3, 3, -1, -1, -1, -1, -1])
  np.testing.assert_array_equal(
      b.token_positions(), [9, 19, 6, 7, 8, 3, 4, -1, -1, -1, -1, -1])
  assert b.num_seqs == 4 and b.num_query_tokens == 7
  assert b.pages_per_seq == 3  # 20 // 2 = 10 entries -> 3 pages of 4


@pytest.mark.parametrize("allocation", ["contiguous", "shuffled",
                                        "fragmented"])
def test_page_tables_give_each_sequence_its_own_pages(allocation):
  pairs = [(1, 100), (5, 33), (0, 0), (1, 64), (7, 250)]
  b = si.make_batch(pairs, page_size=8, compression_ratio=2,
                    allocation=allocation, seed=4)
  used = []
  for s in range(b.num_seqs):
    used.extend(b.page_table[s, :b.num_pages_used[s]].tolist())
  assert len(used) == len(set(used)) == int(b.num_pages_used.sum())
  assert max(used) < b.total_num_pages
  if allocation == "contiguous":
    assert used == list(range(len(used)))
  if allocation == "fragmented":
    assert b.total_num_pages == 2 * len(used)
    assert sorted(used) != list(range(len(used)))


def test_default_distribution_takes_leading_decode_sequences():
  b = si.make_batch([(1, 5), (1, 9), (4, 9), (1, 3)], page_size=4,
                    compression_ratio=1)
  np.testing.assert_array_equal(b.distribution, [2, 2, 4])


@pytest.mark.parametrize("kwargs,match", [
    (dict(pairs=[(5, 3)]), r"q_len \(5\) > seq_len \(3\)"),
    (dict(pairs=[(1, 3)], pages_per_seq=0), "pages_per_seq"),
    (dict(pairs=[(1, 3), (1, 4)], max_num_seqs=1), "max_num_seqs"),
    (dict(pairs=[(3, 3)], num_tokens=2), "num_tokens"),
    (dict(pairs=[(1, 3)], allocation="random"), "allocation"),
    (dict(pairs=[(1, 3)], distribution=(0, 0, 2)), "distribution"),
])
def test_bad_batches_are_rejected(kwargs, match):
  kwargs = dict(kwargs)
  pairs = kwargs.pop("pairs")
  with pytest.raises(ValueError, match=match):
    si.make_batch(pairs, page_size=4, compression_ratio=1, **kwargs)


def test_inputs_are_seeded_and_padding_rows_are_zero():
  b = si.make_batch([(2, 40), (1, 16)], page_size=8, compression_ratio=4,
                    num_tokens=6)
  a = si.make_inputs(b, num_heads=4, seed=7)
  c = si.make_inputs(b, num_heads=4, seed=7)
  np.testing.assert_array_equal(a.cache, c.cache)
  np.testing.assert_array_equal(a.q, c.q)
  assert a.q.shape == (6, 4, 128) and a.cache.shape == (b.total_num_pages,
                                                        2, 4, 256)
  assert (np.asarray(a.q[3:], np.float32) == 0).all()
  assert (np.asarray(a.weights[3:]) == 0).all()
  assert len(a.args) == 7 and len(a.page_args) == 7
  assert a.with_cache_format("bf16").cache.dtype.name == "bfloat16"
