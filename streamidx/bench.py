"""`python -m streamidx.bench`: the benchmark (code in `streamidx.lab.bench`)."""

if __name__ == "__main__":
  import sys

  from streamidx.lab.bench.cli import main

  sys.exit(main())
