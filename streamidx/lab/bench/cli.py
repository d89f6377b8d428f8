"""`python -m streamidx.bench`: the benchmark's command line (its runs and flags:
docs/benchmarks.md, `--help`). Exit status 1 when a result erred or disagrees
with the oracle.
"""

from __future__ import annotations

import argparse
import sys

from streamidx.lab import worker
from streamidx.lab.bench import harness, report
from streamidx.lab.shapes import QUICK, SWEEP, parse_shape


def main(argv=None) -> int:
  argv = sys.argv[1:] if argv is None else list(argv)
  if "--topk" in argv:  # the top-k stage's own benchmark and flags
    from streamidx.lab.bench import topk as topk_bench  # pylint: disable=g-import-not-at-top
    return topk_bench.main([x for x in argv if x != "--topk"])
  if "--ablate-select" in argv:  # blocktop's kernel taken apart on a TPU
    from streamidx.lab.bench import ablate_select  # pylint: disable=g-import-not-at-top
    return ablate_select.main([x for x in argv if x != "--ablate-select"])
  if "--ablate" in argv:  # the lean kernel taken apart on a TPU
    from streamidx.lab.bench import ablate  # pylint: disable=g-import-not-at-top
    return ablate.main([x for x in argv if x != "--ablate"])
  if {"--record", "--records", "--experiments"} & set(argv):  # the records
    from streamidx.lab.bench import record  # pylint: disable=g-import-not-at-top
    if "--records" in argv or "--experiments" in argv:
      return record.print_records([x for x in argv if x != "--records"])
    return record.main([x for x in argv if x != "--record"])
  p = argparse.ArgumentParser(
      prog="python -m streamidx.bench",
      description="Kernel variants, reference (one chunk), streaming "
      "reference (chunks) and oracle loop, side by side (streamidx.lab.bench).")
  add = p.add_argument
  add("--quick", action="store_true", help="small shapes, 3 repeats (CI)")
  add("--out", default="build/bench", help="output folder")
  add("--shapes", nargs="+", metavar="SHAPE", help="named (shapes.SWEEP, "
      "QUICK), decode:SEQSxSEQ_LEN:K or prefill:QxSEQ_LEN:K")
  add("--impls", nargs="+", choices=harness.IMPLEMENTATIONS,
      default=list(harness.IMPLEMENTATIONS))
  add("--repeats", type=int, help="timed calls (default 5, quick 3)")
  add("--no-progress", action="store_true")
  add("--topk", action="store_true", help="instead: the top-k stage "
      "(its own flags: --topk --help)")
  add("--record", action="store_true", help="instead: measure on this TPU "
      "into the chip records (its own flags: --record --help)")
  add("--records", action="store_true", help="instead: print the chip "
      "records (--json: every row as JSON)")
  add("--ablate", action="store_true", help="instead: time the lean "
      "kernel with one piece removed on this TPU (its own flags: --ablate "
      "--help); --experiments prints them")
  add("--ablate-select", action="store_true", help="instead: time "
      "blocktop's kernel with pieces removed on this TPU (its own flags: "
      "--ablate-select --help)")
  if worker.serve(argv, harness.worker):
    return 0
  a = p.parse_args(argv)
  try:
    shapes = ([parse_shape(s) for s in a.shapes] if a.shapes
              else (QUICK if a.quick else SWEEP))
    if a.repeats is not None and a.repeats < 1:
      raise ValueError("--repeats: must be >= 1")
  except ValueError as e:
    p.error(str(e))
  repeats = a.repeats or (3 if a.quick else 5)
  doc = harness.run(shapes, implementations=a.impls, repeats=repeats,
                    out_dir=a.out, progress=not a.no_progress, quick=a.quick)
  print(doc["machine"]["describe"])
  print(report.format_table(doc))
  print(f"\nwrote {a.out}/bench.json")
  bad = [f"{r['shape']} {r['impl']}" for r in doc["results"]
         if r["status"] == "error" or not r.get("agreement", {}).get(
             "vs_oracle", {"ok": True})["ok"]]
  if bad:
    print("\nFAILED (error, or disagrees with the oracle): " + ", ".join(bad),
          file=sys.stderr)
  return 1 if bad else 0
