"""Causal masks (NumPy): which entries a query sees under either causal rule,
from `streamidx.semantics.causal_visible_bound`, the rules' one definition.
"""

from __future__ import annotations

import dataclasses

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


def causal_rule_difference(q_positions, num_entries: int,
                           compression_ratio: int, seq_len: int | None = None):
  """bool[T, E]: entries the seed's rule shows and the model's rule hides (the
  whole difference, the model's set being a subset of the seed's: the block
  that holds the query's own future tokens)."""
  args = (q_positions, num_entries, compression_ratio)
  return (visibility_mask(*args, "seed", seq_len)
          & ~visibility_mask(*args, "model", seq_len))


@dataclasses.dataclass(frozen=True)
class ChunkMasks:
  """One prefill chunk's visibility over its last entries: masks[rule] and leak
  (the cells only the "seed" rule shows) are bool[q_len, n_entries -
  first_entry], column c entry first_entry + c."""

  seq: int
  positions: np.ndarray
  seq_len: int
  n_entries: int
  first_entry: int
  masks: dict
  leak: np.ndarray

  leak_rows = property(lambda self: int(self.leak.any(axis=1).sum()))
  leak_cells = property(lambda self: int(self.leak.sum()))


def prefill_chunk_masks(batch, seq: int, *, window: int) -> ChunkMasks:
  """Both causal rules on the chunk of sequence `seq`, its last `window`
  entries (no cell left of the window differs: checked)."""
  ratio = int(batch.compression_ratio)
  lo, hi = int(batch.cu_q_lens[seq]), int(batch.cu_q_lens[seq + 1])
  seq_len = int(batch.seq_lens[seq])
  positions = batch.token_positions()[lo:hi]
  n = seq_len // ratio
  first = max(0, n - window)
  leak = causal_rule_difference(positions, n, ratio, seq_len=seq_len)
  if leak[:, :first].any():
    raise AssertionError("the rules differ left of the window")
  masks = {rule: visibility_mask(positions, n, ratio, rule,
                                 seq_len=seq_len)[:, first:]
           for rule in ("model", "seed")}
  return ChunkMasks(seq, positions, seq_len, n, first, masks, leak[:, first:])
