"""The benchmark's shapes (`streamidx.lab.shapes`: `SWEEP`, the default run,
`QUICK` for CI, `LONG_CONTEXT`), and `--shapes`' `parse_shape`.
"""

from __future__ import annotations

from streamidx.lab.shapes import QUICK, SWEEP, Shape


def parse_shape(text: str) -> Shape:
  """'decode:SEQSxSEQ_LEN:K', 'prefill:QxSEQ_LEN:K' or a named shape."""
  named = {s.name: s for s in SWEEP + QUICK}
  if text in named:
    return named[text]
  try:
    kind, dims, k = text.split(":")
    a, seq_len = (int(x) for x in dims.lower().split("x"))
    seqs, q_len = {"decode": (a, 1), "prefill": (1, a)}[kind]
    shape = Shape(text, kind, seqs, q_len, seq_len, int(k))
  except (ValueError, KeyError):
    shape = None
  if shape is None or min(a, seq_len, shape.k) < 1:
    raise ValueError(
        f"--shapes: {text!r} is neither a named shape ({sorted(named)}) nor "
        "'decode:SEQSxSEQ_LEN:K' / 'prefill:QxSEQ_LEN:K' with positive sizes")
  return shape
