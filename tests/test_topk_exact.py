"""Every exact registered top-k method and the reference
(`ref.topk_from_scores`) against the independent oracle (`oracle.topk_rule`:
NumPy, score descending then index ascending, -0.0 and subnormals as 0, -1
after the visible entries), on rows built to break a selection at its k-th
place; then again with a `lax.top_k` that breaks ties the other way. The
methods come from the registry (`streamidx.topk.METHODS`, exact ones at
their default options), so a new method is tested here by being registered.
"""

import jax.numpy as jnp
import numpy as np
import pytest

from streamidx import ref, topk

import oracle
import tiers

EXACT = tuple(m for m in topk.METHODS.values() if m.exact)
TINY = np.finfo(np.float32).tiny


def breaking_rows(n: int, k: int, seed: int = 0) -> dict:
  """name -> f32[n]: one row per way to break a selection at its k-th place."""
  rng = np.random.default_rng(seed)
  normal = lambda: rng.standard_normal(n).astype(np.float32)
  rows = {}
  # ReLU plateaus: exact 0.0 across the k-th place (k // 2 positives, then
  # zeros), and fewer positive scores than k with the rest hidden or negative.
  x = np.zeros(n, np.float32)
  x[rng.choice(n, k // 2, replace=False)] = rng.random(k // 2) + 1
  rows["relu_plateau_across_kth"] = x
  x = np.full(n, -np.inf, np.float32)
  x[rng.choice(n, k // 3 + 1, replace=False)] = 2.0
  x[rng.choice(n, n // 4, replace=False)] = 0.0
  rows["fewer_positive_than_k_zeros_after"] = x
  # Equal nonzero scores across the boundary: k - 3 above, 7 tied at the
  # k-th, spread over the row, the rest below.
  x = -np.abs(normal()) - 10
  pos = rng.choice(n, k + 4, replace=False)
  x[pos[:k - 3]] = 5 + rng.random(k - 3).astype(np.float32)
  x[pos[k - 3:]] = 1.5
  rows["equal_scores_across_boundary"] = x
  # Zeros of both signs and subnormals of both signs at the k-th place.
  x = np.full(n, -1.0, np.float32)
  pos = rng.choice(n, k + 8, replace=False)
  x[pos[:k // 2]] = 1.0
  x[pos[k // 2:]] = rng.choice(np.array(
      [0.0, -0.0, TINY / 2, -TINY / 2, 1e-45, -1e-45], np.float32),
      len(pos) - k // 2)
  rows["signed_zeros_and_subnormals"] = x
  # -inf tails: a long masked tail, fewer visible entries than k, none.
  x = normal()
  x[n // 3:] = -np.inf
  rows["neg_inf_tail"] = x
  x = np.full(n, -np.inf, np.float32)
  x[:k // 2] = normal()[:k // 2]
  rows["fewer_visible_than_k"] = x
  rows["no_visible_entry"] = np.full(n, -np.inf, np.float32)
  # A huge dynamic range: magnitudes from the smallest normal to the largest
  # finite float, both signs, +-inf beside them.
  x = (np.sign(normal()) * np.exp2(rng.uniform(-126, 127.9, n))).astype(
      np.float32)
  x[rng.choice(n, 3, replace=False)] = np.inf
  x[rng.choice(n, 3, replace=False)] = -np.inf
  rows["huge_dynamic_range"] = x
  # Integer scores: ties everywhere, the k-th inside a big group.
  rows["integer_ties_everywhere"] = rng.integers(-2, 3, n).astype(np.float32)
  return rows


def _assert_exact(n, k, seed=0):
  rows = breaking_rows(n, k, seed)
  names = list(rows)
  x = np.stack([rows[r] for r in names])
  want = oracle.topk_rule(x, k)
  got = {m.name: topk.select_topk(x, k, m.name) for m in EXACT}
  got["reference"] = ref.topk_from_scores(jnp.asarray(x), k)
  got["base.sort_top_k"] = topk.base.sort_top_k(jnp.asarray(x), k)  # blocktop's fallback
  for name, idx in got.items():
    idx = np.asarray(idx)
    assert idx.dtype == np.int32 and idx.shape == want.shape, name
    bad = [names[r] for r in range(len(names))
           if not np.array_equal(idx[r], want[r])]
    assert not bad, f"{name}: differs from the oracle on {bad}"


@pytest.mark.parametrize("n,k", [(2048, 8), (16384, 100)])
def test_exact_methods_match_the_oracle_on_breaking_rows(n, k):
  _assert_exact(n, k)


@pytest.mark.parametrize("k", [512, 1024, 2048])
@tiers.FULL
def test_exact_methods_match_the_oracle_on_262144_entry_rows(k):
  _assert_exact(262144, k, seed=k)


def test_oracle_orders_zeros_subnormals_and_ties_by_index():
  x = np.array([[-0.0, 1e-45, 0.0, 2.0, -np.inf, -1e-45, 2.0]], np.float32)
  np.testing.assert_array_equal(oracle.topk_rule(x, 8),
                                [[3, 6, 0, 1, 2, 5, -1, -1]])


def test_exact_methods_and_the_reference_keep_the_rule_whatever_top_k_does_with_ties(
    ties_backwards):
  """`lax.top_k` and `approx_max_k` break ties index-descending here (the
  fixture: the k-th place goes to the highest tied indices); every exact
  method and the reference still return the rule. Among them "top_k", the
  page kernel's selection, and "sort", the fallback of "blocktop" (whose
  kernel calls neither)."""
  del ties_backwards
  _assert_exact(2048, 8)


def _sort_shapes(jaxpr) -> list[tuple]:
  """The operand shapes of every `sort` in a jaxpr, its sub-jaxprs included."""
  out = []
  for eqn in jaxpr.eqns:
    if eqn.primitive.name == "sort":
      out.append(tuple(eqn.invars[0].aval.shape))
    for p in eqn.params.values():
      for sub in p if isinstance(p, (list, tuple)) else [p]:
        inner = getattr(sub, "jaxpr", sub)
        if hasattr(inner, "eqns"):
          out += _sort_shapes(inner)
  return out


def test_rows_whose_ties_straddle_the_kth_place_are_ranked_again_alone():
  """A straddling tie in one row of 64 ranks that row again (8 rows a loop
  trip, `base.AGAIN_ROWS`), not the batch: at 2,048 x 262,144 entries on
  the v5e, the whole batch's two-key sort took 2.5 s against the sort's
  0.38 s (docs/chip.md). Sorts: the k winners, the T flags (the flagged
  rows first), 8 whole rows; none of the batch's T whole rows."""
  import jax
  t, n, k = 64, 4096, 16
  x = np.asarray(np.random.default_rng(0).standard_normal((t, n)), np.float32)
  x[5, :k + 3] = 9.0  # row 5: k + 3 equal scores for k places
  shapes = _sort_shapes(jax.make_jaxpr(lambda s: topk.base.top_k(s, k))(x).jaxpr)
  assert sorted(set(shapes)) == [(topk.base.AGAIN_ROWS, n), (t,), (t, k)], shapes
  got = np.asarray(jax.jit(topk.base.top_k, static_argnums=1)(x, k))
  np.testing.assert_array_equal(got, oracle.topk_rule(x, k))
  np.testing.assert_array_equal(got[5], np.arange(k))
