"""The "blocktop" selection kernel (`streamidx.kernels.select_blocktop`),
interpreted: each block's best entries, the second round's tie rule (in
VMEM, by score then index), the checked fallback where a block overflows,
and race-freedom. Its exactness
on rows built to break selections: tests/test_topk_exact.py (every exact
registered method)."""

import numpy as np
import pytest

from streamidx import modes, topk
from streamidx.kernels import select_blocktop as sb

import oracle


def _block_best(x, keep, tile):
  """NumPy: per (row, tile, lane) block the `keep` best (value, index) by
  value descending, index ascending (zeros canonical), -inf / 2**31 - 1
  after; laid out as the kernel writes them."""
  t, n = x.shape
  tiles = -(-n // tile)
  xp = np.full((t, tiles * tile), -np.inf, np.float32)
  xp[:, :n] = np.where(np.abs(x) < np.finfo(np.float32).tiny, 0, x)
  vals = np.full((t, tiles, keep, 128), -np.inf, np.float32)
  idx = np.full((t, tiles, keep, 128), 2**31 - 1, np.int64)
  for r in range(t):
    for b in range(tiles):
      for lane in range(128):
        pos = b * tile + lane + 128 * np.arange(tile // 128)
        pos = [p for p in sorted(pos, key=lambda p: (-xp[r, p], p))
               if xp[r, p] > -np.inf][:keep]
        vals[r, b, :len(pos), lane] = xp[r, pos]
        idx[r, b, :len(pos), lane] = pos
  return vals.reshape(t, -1), idx.reshape(t, -1)


def test_blocktop_round_keeps_each_blocks_best_in_index_order():
  rng = np.random.default_rng(0)
  x = rng.integers(-2, 3, size=(3, 2000)).astype(np.float32)  # ties
  x[rng.random(x.shape) < 0.2] = -np.inf
  x[0, :7] = [-0.0, 1e-45, 0.0, -1e-45, 2.0, 2.0, -0.0]
  vals, idx, drop_v, drop_i = sb.block_candidates(x, keep=3, tile=1024)
  want_v, want_i = _block_best(x, 4, 1024)  # the 4th: the best dropped
  t = x.shape[0]
  np.testing.assert_array_equal(
      np.asarray(vals), want_v.reshape(t, -1, 4, 128)[:, :, :3].reshape(t, -1))
  np.testing.assert_array_equal(
      np.asarray(idx), want_i.reshape(t, -1, 4, 128)[:, :, :3].reshape(t, -1))
  np.testing.assert_array_equal(
      np.asarray(drop_v), want_v.reshape(t, -1, 4, 128)[:, :, 3].reshape(t, -1))
  np.testing.assert_array_equal(
      np.asarray(drop_i), want_i.reshape(t, -1, 4, 128)[:, :, 3].reshape(t, -1))


def test_blocktop_second_round_ranks_ties_by_index():
  # Integer scores: the k-th score is tied across many candidates, which
  # the second round meets out of index order.
  rng = np.random.default_rng(1)
  x = rng.integers(0, 4, size=(2, 16384)).astype(np.float32)
  assert sb.plan(16384, 40, keep=4, rounds=2)[2] is not None  # two rounds
  got = np.asarray(topk.select_topk(x, 40, "blocktop", keep=4, rounds=2))
  np.testing.assert_array_equal(got, oracle.topk_rule(x, 40))


def test_blocktop_block_holding_more_winners_than_it_keeps_falls_back():
  # Row 0's 16 best entries share lane 5 of the first tile: one block holds
  # 16 winners and keeps 2.
  x = np.random.default_rng(2).standard_normal((2, 2048)).astype(np.float32)
  x[0, 5 + 128 * np.arange(16)] = 10 + np.arange(16)
  _, _, drop_v, _ = sb.block_candidates(x, keep=2, tile=2048)
  assert np.asarray(drop_v)[0, 5] >= 10  # it dropped a winner
  assert sb.plan(2048, 16, keep=2)[2] is None  # one round: its check
  got = np.asarray(topk.select_topk(x, 16, "blocktop", keep=2))
  np.testing.assert_array_equal(got, oracle.topk_rule(x, 16))


def test_blocktop_options_are_checked():
  x = np.zeros((2, 1024), np.float32)
  with pytest.raises(ValueError, match=r"tile: must be a positive multiple "
                     r"of 128 \(got 100\)"):
    topk.select_topk(x, 4, "blocktop", tile=100)
  with pytest.raises(ValueError, match=r"keep: 1 candidates in each of the "
                     r"128 blocks are fewer than k \(200\)"):
    topk.select_topk(x, 200, "blocktop", keep=1, tile=1024)


def test_blocktop_is_race_free():
  x = np.random.default_rng(3).standard_normal((9, 4096)).astype(np.float32)
  assert sb.plan(4096, 24, tile=1024, rounds=2)[2] is not None  # two rounds
  with modes.race_check() as report:
    got = np.asarray(topk.select_topk(x, 24, "blocktop", tile=1024,
                                      rounds=2))
  assert report.launches == 1 and not report.races_found, report
  np.testing.assert_array_equal(got, oracle.topk_rule(x, 24))


def test_blocktop_second_round_block_overflow_falls_back():
  # Lane 3 holds 3 winners in each of the two tiles: each first-round block
  # keeps them (4 a block), the second round's block of both tiles (8
  # candidates, 5 kept) drops one.
  x = np.random.default_rng(4).standard_normal((2, 16384)).astype(np.float32)
  x[0, [3, 131, 259, 8195, 8323, 8451]] = 100 + np.arange(6)
  assert sb.plan(16384, 40, keep=4, rounds=2) == (4, 8192, (5, 2))
  _, _, drop1, _, drop2, _ = sb.block_candidates(x, keep=4, tile=8192,
                                                 second=(5, 2))
  assert np.asarray(drop1)[0, [3, 131]].max() < 100  # round 1 drops none
  assert np.asarray(drop2)[0, 3] == 100  # round 2 drops one
  got = np.asarray(topk.select_topk(x, 40, "blocktop", keep=4, rounds=2))
  np.testing.assert_array_equal(got, oracle.topk_rule(x, 40))


def test_blocktop_model_reads_the_scores_once():
  from streamidx.lab.model import topk as topk_model
  t, n, k = 64, 262144, 512
  c = topk_model.cost("blocktop", t, n, k)
  buf = t * n * 4
  assert c.passes == 1 and buf < c.bytes_read < 1.07 * buf
  assert c.sort_work < topk_model.cost("sort", t, n, k).sort_work / 50
  assert "4224 candidates" in c.detail
