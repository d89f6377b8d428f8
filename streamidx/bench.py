"""`python -m streamidx.bench`: the benchmark (code in `streamidx.lab.bench`)."""

if __name__ == "__main__":
  from streamidx.lab.bench.cli import main
  raise SystemExit(main())
