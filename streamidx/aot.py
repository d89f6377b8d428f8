"""`python -m streamidx.aot`: the compile matrix (see `streamidx.lab.aot`)."""

if __name__ == "__main__":
  from streamidx.lab.aot import main
  raise SystemExit(main())
