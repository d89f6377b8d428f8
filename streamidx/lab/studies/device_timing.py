"""Notebook 08's measurement harness, shared by both of its loops: the check of
a kernel's indices and the traced calls.
"""

from __future__ import annotations


def check_topk(got, v, inputs, kw, fmt: str, ratio: int, *,
               on_tpu: bool) -> dict:
  """`got` (kernel `v`'s indices i32[T, k] for `inputs`, `kw`) against
  `v.reference`, tie-aware at `metrics.summation_atol`: rows, rows_identical,
  rows_tied, rows_mismatched, atol, ok, detail, and for an "approx..."
  `topk_method` its recall. Off a TPU an exact method that differs raises
  AssertionError."""
  from streamidx import metrics  # pylint: disable=g-import-not-at-top
  want = v.reference(*v.args(inputs, fmt), **kw)
  scores = v.scores(inputs, compression_ratio=ratio, fmt=fmt)
  atol = metrics.summation_atol(inputs, compression_ratio=ratio, mode=v.mode)
  c = metrics.compare_topk(got, want, scores, atol=atol)
  out = dict(rows=c.rows, rows_identical=c.rows_identical,
             rows_tied=c.rows_tied, rows_mismatched=c.rows_mismatched,
             atol=atol, ok=bool(c.ok), detail="" if c.ok else c.detail)
  if kw.get("topk_method", "").startswith("approx"):
    out["recall"] = metrics.recall_at_k(got, want, scores)
  elif not on_tpu and not c.ok:
    raise AssertionError(f"kernel differs from its reference beyond the "
                         f"derived tolerance {atol:.3g}: {c.detail}")
  return out


def trace_point(fn, *, log_dir: str, iterations: int, warmup: int):
  """(capture, `profiling.stage_times` (None off a TPU), trace events parsed) of
  `iterations` traced calls of `fn` after `warmup` untraced ones."""
  from streamidx.lab.model import profiling  # pylint: disable=g-import-not-at-top
  cap = profiling.capture(fn, log_dir=log_dir, iterations=iterations,
                          warmup=warmup)
  trace = profiling.load_trace(cap.perfetto_path)
  return (cap, profiling.stage_times(trace, iterations=cap.iterations),
          len(trace.events))
