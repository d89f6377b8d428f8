""""approx": `approx_max_k` at a recall target below 1 (not exact on a TPU;
exact elsewhere, where XLA falls back to a sort): i32[T, k]."""

from __future__ import annotations

from jax import lax

from streamidx.topk import base

APPROX_RECALL_TARGET = 0.95


def reduction_size(n: int, k: int, recall_target: float) -> int | None:
  """Candidates the TPU's ApproxTopK (arXiv:2206.14286: bin maxima, then an
  exact top-k of them) keeps from n: XLA's `ApproxTopKReductionOutputSize`
  (private jaxlib binding; None without it). n: an exact top-k."""
  try:
    from jax._src.lib import _jax  # pylint: disable=g-import-not-at-top
    fn = _jax.approx_top_k_reduction_output_size
  except (ImportError, AttributeError):
    return None
  return int(fn(n, 2, k, recall_target, False, -1)[0])  # rank 2: [T, n] scores


def bins(n: int, k: int, recall_target: float) -> int:
  """The bins (candidates) "approx" keeps from n entries (n: all)."""
  size = reduction_size(n, k, recall_target)
  return n if size is None else min(n, size)


def select(scores, k, extra=None, *, recall_target=APPROX_RECALL_TARGET):
  del extra
  vals, idx = lax.approx_max_k(scores, k, recall_target=recall_target)
  return base.order(base.order_key(base.canonical_zero(vals)), idx)


def cost(rows, entries, k, *, recall_target=APPROX_RECALL_TARGET):
  t, n = rows, entries
  m = bins(n, k, recall_target)
  pair = base.F32 + base.I32
  return base.TopkCost(
      "approx", t * n * base.F32 + t * m * pair,
      t * m * pair + base.winners_bytes(t, k), 1,
      t * (base.sort_work(m) + base.sort_work(k)), t * n,
      f"max of {m} bins (recall target {recall_target}), top-{k} of them")


METHOD = base.Method(
    name="approx", exact=False, select=select, cost=cost,
    doc="`approx_max_k` at a recall target below 1 (not exact on a TPU)",
    options=(base.Option("recall_target", "the recall XLA sizes its bins for",
                         APPROX_RECALL_TARGET, base.open_unit),))
