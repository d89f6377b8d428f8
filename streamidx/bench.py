"""`python -m streamidx.bench`: the benchmark (code in `streamidx.lab.bench`).

`--topk` runs the top-k stage's benchmark instead (`streamidx.lab.bench.topk`).
"""

if __name__ == "__main__":
  import sys

  if "--topk" in sys.argv[1:]:
    from streamidx.lab.bench.topk import main
    sys.exit(main([a for a in sys.argv[1:] if a != "--topk"]))

  from streamidx.lab.bench.cli import main

  sys.exit(main())
