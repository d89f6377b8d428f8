"""The benchmark's shapes, one batch each at DeepSeek-V4's indexer sizes: `SWEEP`
(the default run), `QUICK` (CI), `LONG_CONTEXT`, and `--shapes`' `parse_shape`.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from streamidx import semantics


@dataclasses.dataclass(frozen=True)
class Shape:
  """One batch: `num_seqs` decode sequences of `seq_len` tokens, or one prefill
  sequence whose last `q_len` tokens query; defaults: DeepSeek-V4's indexer."""

  name: str
  kind: str  # "decode" or "prefill"
  num_seqs: int
  q_len: int
  seq_len: int
  k: int
  num_heads: int = 64
  head_dim: int = 128
  compression_ratio: int = 4
  page_size: int = 128
  fmt: str = "fp8"

  entries_per_seq = property(lambda self: self.seq_len // self.compression_ratio)
  num_tokens = property(lambda self: self.num_seqs * self.q_len)

  def batch(self):
    """The `RaggedBatch` (contiguous pages) this shape describes."""
    from streamidx import batch as batch_lib  # pylint: disable=g-import-not-at-top
    ranges = ({"decode": [self.seq_len] * self.num_seqs}
              if self.kind == "decode"
              else {"prefill": [(self.q_len, self.seq_len)]})
    return batch_lib.make_mixed_batch(
        **ranges, page_size=self.page_size,
        compression_ratio=self.compression_ratio)

  def visible_pairs(self) -> int:
    """(query row, entry) pairs visible under the model rule."""
    pos = self.seq_len - self.q_len + np.arange(self.q_len)
    bound = semantics.causal_visible_bound(pos, self.compression_ratio,
                                           "model")
    return self.num_seqs * int(np.minimum(bound, self.entries_per_seq).sum())

  def flops(self) -> int:
    """q.k dot products of the visible pairs (2 per multiply-add)."""
    return 2 * self.visible_pairs() * self.num_heads * self.head_dim

  def kernel_kwargs(self) -> dict:
    """The static arguments every implementation takes: k and the ratio."""
    return dict(k=self.k, compression_ratio=self.compression_ratio)

  def describe(self) -> str:
    rows = (f"decode {self.num_seqs} seqs x" if self.kind == "decode"
            else f"prefill {self.q_len} queries at")
    return (f"{rows} {self.seq_len} tokens ({self.entries_per_seq} entries), "
            f"k {self.k}")


SWEEP = [
    Shape("decode_8x16K_k512", "decode", 8, 1, 16384, 512),
    Shape("decode_32x16K_k512", "decode", 32, 1, 16384, 512),
    Shape("decode_8x64K_k2048", "decode", 8, 1, 65536, 2048),
    Shape("prefill_128q_16K_k512", "prefill", 1, 128, 16384, 512),
    Shape("prefill_512q_32K_k2048", "prefill", 1, 512, 32768, 2048),
]
QUICK = [
    Shape("decode_4x4K_k512", "decode", 4, 1, 4096, 512),
    Shape("prefill_32q_2K_k256", "prefill", 1, 32, 2048, 256),
]
LONG_CONTEXT = [
    Shape("decode_64x1M", "decode", 64, 1, 2**20, 512),
    Shape("prefill_1024q_128K", "prefill", 1, 1024, 2**17, 512),
]
LONG_CONTEXT_KS = (512, 2048)


def parse_shape(text: str) -> Shape:
  """'decode:SEQSxSEQ_LEN:K', 'prefill:QxSEQ_LEN:K' or a named shape."""
  named = {s.name: s for s in SWEEP + QUICK}
  if text in named:
    return named[text]
  try:
    kind, dims, k = text.split(":")
    a, seq_len = (int(x) for x in dims.lower().split("x"))
    seqs, q_len = {"decode": (a, 1), "prefill": (1, a)}[kind]
    return Shape(text, kind, seqs, q_len, seq_len, int(k))
  except (ValueError, KeyError):
    raise ValueError(
        f"--shapes: {text!r} is neither a named shape ({sorted(named)}) nor "
        "'decode:SEQSxSEQ_LEN:K' / 'prefill:QxSEQ_LEN:K'") from None
