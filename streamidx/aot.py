"""`python -m streamidx.aot`: the compile matrix (see `streamidx.lab.aot`)."""

import sys

if __name__ == "__main__":
  from streamidx.lab import aot

  sys.exit(aot.main())
