"""Causal masks (NumPy): which entries a query sees under either causal rule,
from `streamidx.semantics.causal_visible_bound`, the rules' one definition.
"""

from __future__ import annotations

import numpy as np

from streamidx.semantics import causal_visible_bound, check_causal_rule


def visibility_mask(q_positions, num_entries: int, compression_ratio: int,
                    causal_rule: str = "model", seq_len: int | None = None):
  """bool[T, num_entries]: the sequence-local entries each of `q_positions`
  int[T] may see under `causal_rule`; `seq_len`: also hiding entries at or
  past seq_len // ratio (the kernel's length mask)."""
  check_causal_rule(causal_rule)
  pos = np.asarray(q_positions, np.int64).reshape(-1)
  bound = causal_visible_bound(pos, compression_ratio, causal_rule)
  s = np.arange(num_entries)
  mask = s[None, :] < bound[:, None]
  if seq_len is not None:
    mask &= s[None, :] < seq_len // compression_ratio
  return mask

