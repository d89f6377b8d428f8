""""top_k": `lax.top_k` of the canonical scores, its ties at the k-th score
made canonical (`base.rule_top_k`: its tie order is not the rule's on a
TPU): i32[T, k]."""

from __future__ import annotations

from streamidx.topk import base


def cost(rows, entries, k):
  t, n = rows, entries
  return base.TopkCost("top_k", t * n * base.F32, base.winners_bytes(t, k), 1,
                       t * base.sort_work(n), 0, "full sort of each row")


METHOD = base.Method(
    name="top_k", exact=True,
    select=lambda scores, k, extra: base.top_k(scores, k), cost=cost,
    doc="`lax.top_k` (a full sort of each row), its ties at the k-th score "
    "made canonical")
