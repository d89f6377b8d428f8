"""Notebook 06's measurement harness: a kernel call checked, then traced.

The sweep and the configurations notebook 06 runs, their tables and its
answer are written in the notebook; these two steps are shared by both of
its loops:

- `check_topk`: a kernel's top-k indices i32[T, k] against its variant's
  reference, tie-aware within the derived tolerance
  (`metrics.summation_atol`); an `approx` method by its recall;
- `trace_point`: `fn` run under the profiler (`lab.model.profiling.capture`)
  and its device seconds per stage read from the trace
  (`profiling.stage_times`: on a TPU the device's op lines; elsewhere the
  trace has none and the device times are None).
"""

from __future__ import annotations

__all__ = ["check_topk", "trace_point"]


def check_topk(got, v, inputs, kw, fmt: str, ratio: int, *,
               on_tpu: bool) -> dict:
  """`got` (the kernel `v`'s indices for `inputs` called with `kw`) against
  `v.reference` of the same call, tie-aware at `metrics.summation_atol`.

  Returns rows, rows_identical, rows_tied, rows_mismatched, atol, ok and
  detail; for a `topk_method` "approx..." (exact only off a TPU by design)
  also "recall" (`metrics.recall_at_k`, ties at the k-th score count as
  hits). Off a TPU an exact method that differs raises AssertionError.
  """
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
  """(capture, stage times, trace events parsed) of `fn` traced.

  `warmup` untraced calls, then `iterations` traced ones
  (`profiling.capture`); stage times: `profiling.stage_times` (kernel_s,
  topk_s, other_s, total_s: None off a TPU; host_call_s; source; ops).
  """
  from streamidx.lab.model import profiling  # pylint: disable=g-import-not-at-top
  cap = profiling.capture(fn, log_dir=log_dir, iterations=iterations,
                          warmup=warmup)
  trace = profiling.load_trace(cap.perfetto_path)
  return (cap, profiling.stage_times(trace, iterations=cap.iterations),
          len(trace.events))
