"""The "blocktop" selection kernel (`streamidx.topk.blocktop`),
interpreted: each block's best entries and best dropped one, the checked
fallbacks (a block holding more winners than it keeps; more candidates at
the bound than the slots sorted), rows whose winners crowd a short prefix,
race-freedom, the model. Its exactness on rows
built to break selections: tests/test_topk_exact.py (every exact registered
method)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from streamidx import modes, topk
from streamidx.topk import blocktop as sb

import oracle
import tiers

B = sb.BLOCKS


def _block_best(x, keep):
  """NumPy: per row and block p (entries p, p + 1024, ...) the `keep` best
  (value, index) by value descending, index ascending (zeros canonical),
  -inf / 2**31 - 1 after: [T, keep, 1024] each."""
  t, n = x.shape
  x = np.where(np.abs(x) < np.finfo(np.float32).tiny, 0, x)
  vals = np.full((t, keep, B), -np.inf, np.float32)
  idx = np.full((t, keep, B), 2**31 - 1, np.int64)
  for r in range(t):
    for p in range(B):
      pos = [q for q in range(p, n, B) if x[r, q] > -np.inf]
      pos = sorted(pos, key=lambda q: (-x[r, q], q))[:keep]
      vals[r, :len(pos), p] = x[r, pos]
      idx[r, :len(pos), p] = pos
  return vals, idx


def test_blocktop_keeps_each_blocks_best_and_its_best_dropped():
  rng = np.random.default_rng(0)
  x = rng.integers(-2, 3, size=(3, 5000)).astype(np.float32)  # ties
  x[rng.random(x.shape) < 0.2] = -np.inf
  x[0, :7] = [-0.0, 1e-45, 0.0, -1e-45, 2.0, 2.0, -0.0]
  vals, idx, drop_v, drop_i = sb.block_candidates(x, keep=2, tile=2048)
  want_v, want_i = _block_best(x, 3)  # the third: the best dropped
  np.testing.assert_array_equal(np.asarray(vals),
                                want_v[:, :2].reshape(3, -1))
  np.testing.assert_array_equal(np.asarray(idx), want_i[:, :2].reshape(3, -1))
  np.testing.assert_array_equal(np.asarray(drop_v), want_v[:, 2])
  np.testing.assert_array_equal(np.asarray(drop_i), want_i[:, 2])


@pytest.mark.parametrize("lane_rows,tile,keep", [
    (False, 5120, 3), (True, 5120, 3), (False, 8192, 3), (False, 8192, 9)])
def test_blocktop_pass_in_groups_of_four_keeps_each_blocks_best(lane_rows,
                                                                tile, keep):
  """The tournaments (`sb._scan`; 2 tiles a row: of 5 vregs, a group of 4
  unpaired and one vreg alone; of 8, two groups paired) keep each block's
  best and best dropped, keep 3 (every list, `sb.list_lengths`; keep 9: two
  loops, `sb._sweeps`), in both layouts: ties in and across groups (row 2
  all equal: a group's places out of index order, ordered by the merge),
  -inf (row 1 all), -0.0 beside +0.0 (row 3)."""
  n = 2 * tile
  rng = np.random.default_rng(11)
  x = rng.integers(-2, 3, size=(8, n)).astype(np.float32)
  x[rng.random(x.shape) < 0.2] = -np.inf
  x[1], x[2] = -np.inf, 1.0
  x[3] = np.where(rng.random(n) < 0.5, -0.0, 0.0)
  x[3, rng.random(n) < 0.3] = -np.inf
  assert sb.list_lengths(4) == (4, 2, 2, 2, 1)
  assert len(sb._sweeps(sb.list_lengths(keep + 1))) == (2 if keep == 9 else 1)
  scores = jnp.asarray(x).reshape(8, n // 128, 128) if lane_rows else x
  vals, idx, drop_v, drop_i = sb.block_candidates(scores, keep=keep,
                                                  tile=tile)
  want_v, want_i = _block_best(x, keep + 1)
  np.testing.assert_array_equal(np.asarray(vals),
                                want_v[:, :keep].reshape(8, -1))
  np.testing.assert_array_equal(np.asarray(idx),
                                want_i[:, :keep].reshape(8, -1))
  np.testing.assert_array_equal(np.asarray(drop_v), want_v[:, keep])
  np.testing.assert_array_equal(np.asarray(drop_i), want_i[:, keep])


def _pass_model(x, levels, nv):
  """NumPy model of the pass and merge on one block's entries x (index
  order, chunks of nv of them: tournaments of 4, two in a row paired by
  their bests, the rest alone), checking at each insert of the merge that
  it goes no higher than `sb._merge_skip`. Returns the merged (values,
  indices), `levels` of them."""
  lists = [[] for _ in sb.AHEAD]
  lengths = sb.list_lengths(levels)

  def deal(p, e):  # e: (value, index); -inf never kept
    if x[e[1]] > -np.inf:
      lists[p] = sorted(lists[p] + [e], key=lambda f: (-f[0], f[1]))[
          :lengths[p]]

  def match(a, b):  # (winner, loser); a's index the lower
    return (b, a) if b[0] > a[0] else (a, b)

  def tournament(e):  # best, second, third, last
    (w0, l0), (w1, l1) = match(e[0], e[1]), match(e[2], e[3])
    return match(w0, w1) + match(l0, l1)

  for c in range(0, len(x), nv):
    e = [(x[i], i) for i in range(c, min(c + nv, len(x)))]
    pairs, groups = len(e) // 8 * 8, len(e) // 4 * 4
    for g in range(0, pairs, 8):
      a, b = tournament(e[g:g + 4]), tournament(e[g + 4:g + 8])
      for p, f in zip((0, 1), match(a[0], b[0])):
        deal(p, f)
      for q in range(1, 4):
        deal(sb.LIST_OF[q], a[q])
        deal(sb.LIST_OF[q], b[q])
    for g in range(pairs, groups, 4):
      for p, f in zip(sb.LIST_OF, tournament(e[g:g + 4])):
        deal(p, f)
    for f in e[groups:]:
      deal(0, f)
  merged = lists[0] + [(-np.inf, 2**31 - 1)] * (levels - len(lists[0]))
  for p in range(1, len(sb.AHEAD)):
    for i, e in enumerate(lists[p]):
      at = sum(1 for f in merged if (f[0], -f[1]) > (e[0], -e[1]))
      assert at >= sb._merge_skip(p, i), (p, i, at)
      merged = (merged[:at] + [e] + merged[at:])[:levels]
  return merged


def test_blocktop_merge_skip_bound_holds_in_a_model():
  # NumPy: blocks of tied scores and -inf, every keep from 1 to 16 (levels
  # 2 to 17) and chunk widths 1 to 17 (pairs of groups, a group unpaired,
  # vregs alone): the lists merged, each insert below its skip, are the
  # block's best `levels` by (value, index). Some blocks ascend (each entry
  # beats the last), some raise 2 or 4 entries of each group (chunks of 4
  # to 16) so that one list fills the top.
  rng = np.random.default_rng(4)
  raised = np.array([[1, 0, 1, 0], [1, 1, 0, 0], [1, 1, 1, 1]])
  for levels in range(2, 18):
    for trial in range(60):
      n, nv = int(rng.integers(1, 80)), int(rng.integers(1, 18))
      x = rng.integers(-3, 4, n).astype(np.float32)
      if trial % 3 == 0:
        x = np.sort(x)
      elif trial % 3 == 1:
        nv = 4 * int(rng.integers(1, 5))
        x += 10 * np.resize(raised[trial % 9 // 3], n)
      x[rng.random(n) < 0.15] = -np.inf
      got = _pass_model(x, levels, nv)
      live = sorted((i for i in range(n) if x[i] > -np.inf),
                    key=lambda i: (-x[i], i))[:levels]
      want = [(x[i], i) for i in live]
      want += [(-np.inf, 2**31 - 1)] * (levels - len(want))
      assert got == want, (levels, x)


def test_blocktop_block_holding_more_winners_than_it_keeps_falls_back():
  # Row 0's 4 best entries share block 5: it keeps 2 and drops a winner.
  x = np.random.default_rng(2).standard_normal((2, 8192)).astype(np.float32)
  x[0, 5 + B * np.arange(4)] = 10 + np.arange(4)
  _, _, drop_v, _ = sb.block_candidates(x, keep=2, tile=4096)
  assert np.asarray(drop_v)[0, 5] >= 10
  got = np.asarray(topk.select_topk(x, 16, "blocktop", keep=2, tile=4096))
  np.testing.assert_array_equal(got, oracle.topk_rule(x, 16))


def test_blocktop_tiles_past_one_chunk_read_every_entry():
  # A tile of 9,216 entries (9 vregs a row, past one chunk of 8) is read in
  # 9 chunks of one vreg (`sb.chunk_for`): the winners, in its last vreg,
  # are found; rows of 9,216 entries get a tile of whole chunks by default.
  x = np.random.default_rng(9).standard_normal((8, 9216)).astype(np.float32)
  x[:, 8192:] += 10
  assert sb.chunk_for(9216) == 1024 and sb.tile_for(9216) == 16384
  assert sb.chunk_for(5120) == 5120
  got = np.asarray(topk.select_topk(x, 16, "blocktop", keep=2, tile=9216))
  np.testing.assert_array_equal(got, oracle.topk_rule(x, 16))


def test_blocktop_more_candidates_at_the_bound_than_slots_falls_back():
  # Row 0: entry m * 1024 + p scores p + m / 1000, so the 512 blocks above
  # the bound (the 512th best block maximum) hold 4 candidates each above
  # it: 2,048 for the 1,024 slots sorted. No block drops an entry (keep 4
  # of 4), so only the slots' check flags it. Row 1 is random.
  m, p = np.divmod(np.arange(4096), B)
  x = np.stack([p + m / 1000, np.random.default_rng(6).standard_normal(4096)]
               ).astype(np.float32)
  assert sb.capacity(512) == 1024
  winners, bad = sb.block_select(x, 512, keep=4, tile=4096)
  assert np.asarray(bad).tolist() == [True, False]
  want = oracle.topk_rule(x, 512)
  np.testing.assert_array_equal(np.asarray(winners)[1], want[1])
  got = np.asarray(topk.select_topk(x, 512, "blocktop", keep=4, tile=4096))
  np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("t", [1, 3, 8, 20])
def test_blocktop_fallback_selects_the_flagged_rows_alone(t):
  """Only the rows the kernel flagged are selected again by the rule,
  `base.AGAIN_ROWS` at a time (at 20 rows, 11 flagged: two trips, the last
  padded); the others keep the kernel's winners, untouched."""
  rng = np.random.default_rng(t)
  x = jnp.asarray(rng.integers(-3, 4, (t, 300)).astype(np.float32))  # ties
  kernel = jnp.full((t, 16), -7, jnp.int32)  # what no rule returns
  bad = jnp.asarray(rng.random(t) < 0.6).at[0].set(True)
  got = np.asarray(jax.jit(sb.fallback, static_argnums=1)(x, 16, kernel, bad))
  flagged = np.asarray(bad)
  assert t < 20 or flagged.sum() > topk.base.AGAIN_ROWS
  np.testing.assert_array_equal(got[flagged],
                                oracle.topk_rule(np.asarray(x), 16)[flagged])
  assert (got[~flagged] == -7).all()


@pytest.mark.parametrize("k,mean", [(512, 708), (1024, 1172), (2048, 2136)])
def test_blocktop_candidates_at_the_bound_fit_the_slots(k, mean):
  # NumPy, random rows of 262,144 entries: each block's `keep` best, the
  # bound (the k-th best of the first bound_levels levels), the candidates
  # ranking at or before it. docs/topk-methods.md quotes the means; the
  # slots sorted (capacity) hold them with room to spare.
  n, rng = 262144, np.random.default_rng(k)
  keep, levels = sb.keep_for(n, k), sb.bound_levels(k, sb.keep_for(n, k))
  live = []
  for _ in range(12):
    x = rng.standard_normal(n).astype(np.float32)
    best = -np.sort(-x.reshape(-1, B), axis=0)[:keep]  # [keep, blocks]
    bound = -np.sort(-best[:levels].ravel())[k - 1]
    live.append((best >= bound).sum())
  assert abs(np.mean(live) - mean) < 0.03 * mean, live
  assert max(live) < 0.8 * sb.capacity(k)


@pytest.mark.parametrize("held", [2, 4])
def test_blocktop_compacts_the_levels_that_hold_a_candidate(held):
  # keep 4: the compaction runs over 2, 3 or 4 levels (`COMPACT_PATHS`),
  # the fewest that hold every block's candidates. Row 3's block 5 holds
  # `held` entries above every other (so at or before the bound): 2 takes
  # the shortest path (no block of these rows holds more than 2), 4 the
  # whole. Exact either way, and no row flagged.
  assert sb.COMPACT_PATHS == 3
  x = np.random.default_rng(held).standard_normal((8, 8192)).astype(np.float32)
  x[3, 5 + B * np.arange(held)] = 100 + np.arange(held)
  got, bad = sb.block_select(x, 16, keep=4, tile=8192)
  assert not np.asarray(bad).any()
  np.testing.assert_array_equal(np.asarray(got), oracle.topk_rule(x, 16))


@pytest.mark.parametrize("chunk,seed", [(1, 7), (2, 8)])
def test_blocktop_chunked_finish_matches_the_rule(monkeypatch, chunk, seed):
  # The finish's paths past one chunk of slot vregs, at 512 slots (k 200, 4
  # vregs): chunk 1, the sort in chunks (at k 2,048 its 32 vregs go through
  # registers 16 at a time: steps between two chunks, a loop over them; the
  # compaction's rounds 1 vreg a loop step); chunk 2, the compaction wider
  # than a chunk (k above 512: whole vregs moved by their low vreg bits,
  # then a gather from every other vreg).
  x = np.random.default_rng(seed).integers(-3, 4, (3, 6000)).astype(np.float32)
  monkeypatch.setattr(sb, "_CHUNK", chunk)
  got, bad = sb.block_select(x, 200, keep=3, tile=2048)
  assert not np.asarray(bad).any()
  np.testing.assert_array_equal(np.asarray(got), oracle.topk_rule(x, 200))


def test_blocktop_prefix_rows_drop_no_winner():
  # Visible entries a 4,096-entry prefix of 65,536, k 512: the winners
  # spread over every block, as in a long row.
  x = np.random.default_rng(5).standard_normal((2, 65536)).astype(np.float32)
  x[:, 4096:] = -np.inf
  keep, tile = sb.plan(65536, 512)
  vals, idx, drop_v, drop_i = sb.block_candidates(x, keep=keep, tile=tile)
  want = oracle.topk_rule(x, 512)
  kth = x[np.arange(2), want[:, -1]]
  assert (np.asarray(drop_v) < kth[:, None]).all()
  got = np.asarray(topk.select_topk(x, 512, "blocktop"))
  np.testing.assert_array_equal(got, want)


def test_blocktop_takes_the_kernels_lane_rows_as_they_are(monkeypatch):
  """The scoring kernels' buffer f32[T, W / 128, 128], unreshaped (M25):
  the same levels as its f32[T, N] view, the rule's winners (ties, a row
  all -inf, 2 tiles of 2 DMAs, a fallback with keep 2); of a buffer wider
  than the entries, the first N alone (M24's cut: the columns past them
  would win)."""
  monkeypatch.setattr(sb, "CHUNK", 1024)
  rng = np.random.default_rng(5)
  x = rng.integers(-3, 4, size=(16, 4096)).astype(np.float32)
  x[rng.random(x.shape) < 0.2] = -np.inf
  x[1] = -np.inf
  lanes = jnp.asarray(x).reshape(16, 32, 128)
  assert sb.reads_lane_rows(16, 4096, 64)
  assert not sb.reads_lane_rows(12, 4096, 64)  # a group of 8 rows cut
  assert not sb.reads_lane_rows(16, 4096 + 128, 64)  # a tile to pad
  assert not sb.reads_lane_rows(16, 65536 + 1024, 64)  # a second tile to pad
  for a, b in zip(sb.block_candidates(lanes, keep=2, tile=2048),
                  sb.block_candidates(x, keep=2, tile=2048)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  got = sb.select(lanes, 64, keep=2, tile=2048)
  np.testing.assert_array_equal(np.asarray(got), oracle.topk_rule(x, 64))
  np.testing.assert_array_equal(np.asarray(topk.scores_at(lanes, got)),
                                np.asarray(topk.scores_at(x, got)))
  wide = jnp.concatenate([lanes, jnp.full((16, 3, 128), 9.0)], axis=1)
  got = sb.select(wide, 64, keep=2, tile=2048, entries=4096)
  np.testing.assert_array_equal(np.asarray(got), oracle.topk_rule(x, 64))
  with pytest.raises(ValueError, match=r"scores: f32\[T, W / 128, 128\] "
                     r"needs whole groups of 8 rows"):
    sb.select(lanes[:12], 64)
  with pytest.raises(ValueError, match=r"at most W .*entries 8192"):
    sb.select(lanes, 64, entries=8192)
  with pytest.raises(ValueError, match=r"entries: only for the kernels'"):
    topk.select(x, 64, topk.METHODS["blocktop"], entries=2048)


@tiers.needs_libtpu
def test_blocktop_on_lane_rows_compiles_for_v5e(monkeypatch):
  """Mosaic, not the interpreter, judges the lane-rows pass (its 3-D DMAs,
  the levels' transpose): compiled for v5e, 16 rows of 16,384 entries, 2
  DMAs a tile; and of a buffer one page wider (the dense kernel's 3-page
  blocks), its first 16,384 entries."""
  monkeypatch.setenv("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
  with modes.compile_for("v5e") as target:
    for lane_rows in (128, 129):
      spec = target.spec((16, lane_rows, 128), jnp.float32)
      assert jax.jit(lambda x: sb.select(x, 512, entries=16384)).lower(
          spec).compile()


def test_blocktop_options_are_checked():
  x = np.zeros((2, 4096), np.float32)
  with pytest.raises(ValueError, match=r"tile: must be a positive multiple "
                     r"of 1024 \(got 100\)"):
    topk.select_topk(x, 4, "blocktop", tile=100)
  with pytest.raises(ValueError, match=r"keep: 1 candidates in each of the "
                     r"1024 blocks are fewer than k \(2000\)"):
    topk.select_topk(x, 2000, "blocktop", keep=1)


def test_blocktop_is_race_free():
  """Two grid steps of three tiles: the first step's last tile starts the
  second's first (`sb.PREFETCH_CHIPS`, the interpreter's order), whose
  tiles then take the buffers in the other parity."""
  x = np.random.default_rng(3).standard_normal((9, 6000)).astype(np.float32)
  with modes.race_check() as report:
    got = np.asarray(topk.select_topk(x, 24, "blocktop", keep=2, tile=2048))
  assert report.launches == 1 and not report.races_found, report
  np.testing.assert_array_equal(got, oracle.topk_rule(x, 24))


def test_blocktop_model_reads_the_scores_once():
  from streamidx.lab.model import topk as topk_model
  t, n, k = 64, 262144, 512
  c = topk_model.cost("blocktop", t, n, k)
  buf = t * n * 4
  # one read of the scores, the winners written: nothing else leaves VMEM
  assert c.passes == 1 and c.bytes_read == buf and c.bytes_written == t * k * 4
  assert c.sort_work < topk_model.cost("sort", t, n, k).sort_work / 200
  assert "1024 best-placed of its 7168 candidates" in c.detail
  # the pass at keep 7: 9 exchanges and inserts into 8, 4, 4 (twice), 4
  # (twice), 2 (twice) levels for 8 vregs; at keep 13, two loops (the
  # second does the tournaments again, not the bests' match)
  assert c.scan_ops == t * n * (45 + 38 + 18 + 2 * (18 + 18 + 8)) / 8
  assert sb.pass_ops(14) == (7 * 5 + 8 * 5 + 68 + 33 + 2 * (33 + 33 + 13)) / 8


def _drops_a_winner(x, k):
  keep, tile = sb.plan(x.shape[1], k)
  _, _, drop_v, drop_i = sb.block_candidates(x, keep=keep, tile=tile)
  want = oracle.topk_rule(x, k)
  kth = np.where(want[:, -1:] >= 0,
                 np.take_along_axis(x, np.maximum(want[:, -1:], 0), axis=1),
                 -np.inf)
  kth = np.where(np.abs(kth) < np.finfo(np.float32).tiny, 0, kth)
  dv = np.asarray(drop_v)
  return ((dv > kth) | ((dv == kth) & (np.asarray(drop_i) < want[:, -1:])
                        & (want[:, -1:] >= 0))).any(1)


@pytest.mark.parametrize("k", [512, 1024, 2048])
@tiers.FULL
def test_blocktop_drops_no_winner_on_breaking_and_short_rows(k):
  # The rows built to break selections, and a 4,096-entry visible prefix of
  # random scores, at 262,144 entries: the fast path holds (no fallback).
  from test_topk_exact import breaking_rows
  rows = breaking_rows(262144, k, seed=k)
  x = np.stack(list(rows.values()))
  short = np.random.default_rng(k).standard_normal((1, 262144)).astype(
      np.float32)
  short[:, 4096:] = -np.inf
  x = np.concatenate([x, short])
  dropped = _drops_a_winner(x, k)
  assert not dropped.any(), [n for n, d in zip([*rows, "short"], dropped) if d]
