"""`physical_slots`: the kernels and references return physical cache slots
(the page table applied to the k winners; page mode: physical pages).

The kernels run interpreted on the case matrix's shapes (tests/test_kernel.py
compiles the same launches; a call differing only in `physical_slots` reuses
them: a launch reads none of the selection's fields, `driver.Launch`). The slots are checked against the page table
in NumPy, and kernel against reference tie-aware in slot
space (`metrics.compare_topk` over the scores placed at their slots).
"""

from __future__ import annotations

import functools

import jax
import numpy as np
import pytest

import streamidx as si
from streamidx import metrics, sharded
from streamidx.kernels import driver
from streamidx.lab.studies import cases


@functools.lru_cache(maxsize=None)
def _inputs(ratio: int) -> si.IndexerInputs:
  b = cases.BATCHES["all_three_ranges"].build(ratio)
  return si.make_inputs(b, num_heads=cases.NUM_HEADS, fmt="fp8", seed=ratio)


def _slots_numpy(ids, batch, ids_per_page):
  """NumPy: row t's id e -> page_table[seq(t), e // n] * n + e % n, -1 kept."""
  seqs = np.maximum(batch.token_seq_ids(), 0)[:, None]
  e = np.maximum(ids, 0)
  slots = (batch.page_table[seqs, e // ids_per_page] * ids_per_page
           + e % ids_per_page)
  return np.where(ids >= 0, slots, -1)


def _scores_at_slots(scores, batch, ids_per_page, num_slots):
  """f32[T, num_slots]: each visible score moved to its slot (-inf
  elsewhere; a sequence's visible entries have distinct slots)."""
  scores = np.asarray(scores, np.float32)
  ids = np.where(scores > -np.inf, np.arange(scores.shape[1]), -1)
  slots = _slots_numpy(ids, batch, ids_per_page)
  out = np.full((scores.shape[0], num_slots), -np.inf, np.float32)
  r, c = np.nonzero(slots >= 0)
  out[r, slots[r, c]] = scores[r, c]
  return out


def _check(got, ids, want, scores, batch, ids_per_page, num_slots, atol):
  got, ids, want = (np.asarray(x) for x in (got, ids, want))
  np.testing.assert_array_equal(got, _slots_numpy(ids, batch, ids_per_page))
  np.testing.assert_array_equal(got < 0, ids < 0)
  assert (got != ids).any()  # the table is not the identity here
  metrics.assert_topk_match(
      got, want, _scores_at_slots(scores, batch, ids_per_page, num_slots),
      atol=atol)


def test_token_mode_slots_are_the_page_table_applied_and_match_the_reference():
  inp = _inputs(4)
  b = inp.batch
  assert len(np.unique(b.page_indices)) > 1 and b.distribution[0] > 4
  kw = dict(k=cases.K_TESTS, compression_ratio=4,
            **cases.blocks_for("vendored"))
  ids = si.streamindex_topk(*inp.args, **kw)
  got = si.streamindex_topk(*inp.args, physical_slots=True, **kw)
  want = si.streamindex_topk_ref(*inp.args, physical_slots=True, **kw)
  scores = si.token_scores(*inp.args, compression_ratio=4)
  _check(got, ids, want, scores, b, b.page_size,
         b.total_num_pages * b.page_size,
         metrics.summation_atol(inp, compression_ratio=4))


def test_page_mode_slots_are_physical_pages_and_match_the_reference():
  inp = _inputs(1)
  b = inp.batch
  kw = dict(k_pages=cases.K_PAGES_TESTS, compression_ratio=1,
            **cases.blocks_for("vendored_page"))
  ids = si.streamindex_page_topk(*inp.page_args, **kw)
  got, got_scores = si.streamindex_page_topk(
      *inp.page_args, physical_slots=True, return_scores=True, **kw)
  want = si.streamindex_page_topk_ref(*inp.page_args, physical_slots=True, **kw)
  scores = si.page_scores(*inp.page_args)
  _check(got, ids, want, scores, b, 1, b.total_num_pages,
         metrics.summation_atol(inp, compression_ratio=1))
  # The scores are those of the pages selected, whatever ids name them.
  np.testing.assert_array_equal(
      got_scores, si.topk.scores_at(scores, ids))


def test_physical_slots_must_be_a_bool():
  inp = _inputs(4)
  with pytest.raises(ValueError,
                     match=r"physical_slots: must be True or False \(got 1\)"):
    si.streamindex_topk(*inp.args, k=8, compression_ratio=4, physical_slots=1)
  with pytest.raises(ValueError, match=r"physical_slots: must be True or"):
    si.streamindex_page_topk_ref(*inp.page_args, k_pages=2,
                                 physical_slots="yes")


def test_context_parallel_refuses_physical_slots():
  mesh = jax.sharding.Mesh(np.array(jax.devices()[:1]).reshape(1, 1),
                           ("data", "context"))
  with pytest.raises(ValueError,
                     match=r"physical_slots: not with a context_axis"):
    sharded.sharded_topk("vendored", mesh, k=8, compression_ratio=4,
                    data_axis="data", context_axis="context",
                    physical_slots=True)


def test_physical_slots_is_read_by_the_selection_only():
  inp = _inputs(4)
  a = si.streamindex_topk.call(*inp.args, k=8, compression_ratio=4)
  b = si.streamindex_topk.call(*inp.args, k=8, compression_ratio=4,
                               physical_slots=True)
  specs = [[spec for _, _, spec in driver.launches(
      c, tuple(int(d) for d in inp.batch.distribution),
      page_size=inp.batch.page_size)] for c in (a, b)]
  assert a != b and specs[0] == specs[1]
  assert "physical_slots" not in si.call.TOKEN_ONLY
