"""`python -m streamidx.bench`: the benchmark's command line.

    python -m streamidx.bench                  # the sweep (make bench)
    python -m streamidx.bench --quick          # small shapes, for CI
    python -m streamidx.bench --shapes decode:8x16384:512 prefill:128x16384:512
    python -m streamidx.bench --impls kernel reference
    python -m streamidx.bench --long-context   # one chunk vs streamed, 1M tokens
    python -m streamidx.bench --list           # the named shapes and columns
    python -m streamidx.bench --topk [...]     # streamidx.lab.bench.topk

What is measured and checked: `streamidx.lab.bench` (package docstring).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from streamidx.lab.bench import harness, long_context, report
from streamidx.lab.bench.shapes import (LONG_CONTEXT, LONG_CONTEXT_KS, QUICK,
                                        SWEEP, parse_shape)

__all__ = ["main"]

_OTHERS = {
    "reference": "streamidx.streamindex_topk_ref (one chunk, jit)",
    "streaming": "streamidx.streaming.streamindex_topk_streaming (chunks, jit)",
    "oracle": "the float64 loop of streamidx.lab.bench.oracle",
}


def _list() -> int:
  for group, shapes in (("sweep", SWEEP), ("quick", QUICK),
                        ("long context", LONG_CONTEXT)):
    print(f"{group}:")
    for s in shapes:
      at = (f" (run at k {', '.join(map(str, LONG_CONTEXT_KS))})"
            if shapes is LONG_CONTEXT else "")
      print(f"  {s.name:28s} {s.describe()}{at}")
  print("implementations:")
  for impl in harness.IMPLEMENTATIONS:
    v = harness.column_variant(impl)
    print(f"  {impl:28s} " + (f"variant {v!r} of streamidx.VARIANTS" if v
                              else _OTHERS[impl]))
  return 0


def _exit_status(bad) -> int:
  """1 (and the list on stderr) when a result erred or disagrees."""
  if bad:
    print("\nFAILED (error, or disagrees with the oracle): "
          + ", ".join(bad), file=sys.stderr)
  return 1 if bad else 0


def _long_context(a) -> int:
  doc = long_context.run_long_context(one_shot=a.one_shot, out_dir=a.out,
                                      timeout=a.timeout,
                                      progress=not a.no_progress)
  print(doc["machine"]["describe"])
  print(report.format_long_table(doc))
  print(f"\nwrote {Path(a.out) / 'long_context.json'}")
  bad = [f"{row['shape']['name']} {impl}" for row in doc["results"]
         for impl in ("streaming", "reference")
         if row.get(impl, {}).get("status") == "error"
         or not row.get(impl, {}).get("spot_check", {"oracle_ok": True})[
             "oracle_ok"]]
  return _exit_status(bad)


def main(argv=None) -> int:
  argv = sys.argv[1:] if argv is None else list(argv)
  if "--topk" in argv:  # the top-k stage's own benchmark and flags
    from streamidx.lab.bench import topk as topk_bench  # pylint: disable=g-import-not-at-top
    return topk_bench.main([x for x in argv if x != "--topk"])
  p = argparse.ArgumentParser(
      prog="python -m streamidx.bench",
      description="Kernel variants, reference (one chunk), streaming "
      "reference (chunks) and oracle loop, side by side (streamidx.lab.bench).")
  p.add_argument("--quick", action="store_true",
                 help="small shapes and 3 repeats (CI)")
  p.add_argument("--out", default="build/bench",
                 help="output folder for bench.json / bench.png / "
                 "long_context.json (default build/bench)")
  p.add_argument("--shapes", nargs="+", metavar="SHAPE",
                 help="named shapes (--list) or decode:SEQSxSEQ_LEN:K / "
                 "prefill:QxSEQ_LEN:K")
  p.add_argument("--impls", nargs="+", choices=harness.IMPLEMENTATIONS,
                 default=list(harness.IMPLEMENTATIONS),
                 help="implementations to run (kernel:NAME: the token variant "
                 "NAME of streamidx.VARIANTS)")
  p.add_argument("--repeats", type=int, default=None,
                 help="timed calls after the warm-up (default 5, quick 3)")
  p.add_argument("--timeout", type=float, default=1800.0,
                 help="seconds allowed per implementation run")
  p.add_argument("--long-context", action="store_true",
                 help="the reference in streamed chunks and in one chunk at "
                 "1M tokens (decode) and 128K (prefill), with peak memory")
  p.add_argument("--one-shot", choices=("auto", "run", "skip"), default="auto",
                 help="--long-context: also run the one-chunk reference "
                 "(auto: when XLA predicts it fits in half of MemAvailable)")
  p.add_argument("--no-progress", action="store_true")
  p.add_argument("--no-plot", action="store_true")
  p.add_argument("--list", action="store_true",
                 help="list named shapes and implementations")
  p.add_argument("--topk", action="store_true",
                 help="instead: every streamidx.topk method timed on this "
                 "machine (its own flags: --topk --help; "
                 "streamidx.lab.bench.topk)")
  p.add_argument("--worker", help=argparse.SUPPRESS)
  a = p.parse_args(argv)

  if a.worker is not None:
    spec = json.loads(a.worker)
    res = (long_context.worker(spec) if spec.get("long")
           else harness.worker(spec))
    print(harness.RESULT_PREFIX + json.dumps(res), flush=True)
    return 0
  if a.list:
    return _list()
  if a.repeats is not None and a.repeats < 1:
    p.error("--repeats: must be >= 1")
  if a.long_context:
    return _long_context(a)
  try:
    shapes = ([parse_shape(s) for s in a.shapes] if a.shapes
              else (QUICK if a.quick else SWEEP))
  except ValueError as e:
    p.error(str(e))
  repeats = a.repeats if a.repeats is not None else (3 if a.quick else 5)
  doc = harness.run_sweep(shapes, implementations=a.impls, repeats=repeats,
                          out_dir=a.out, timeout=a.timeout,
                          progress=not a.no_progress, plot=not a.no_plot,
                          quick=a.quick)
  print(doc["machine"]["describe"])
  print(report.format_table(doc))
  print(f"\nwrote {Path(a.out) / 'bench.json'}"
        + ("" if a.no_plot else f" and {Path(a.out) / 'bench.png'}"))
  bad = [f"{r['shape']} {r['impl']}" for r in doc["results"]
         if r["status"] == "error"
         or not r.get("agreement", {}).get("vs_oracle", {"ok": True})["ok"]]
  return _exit_status(bad)


if __name__ == "__main__":
  sys.exit(main())
