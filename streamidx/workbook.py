"""`python -m streamidx.workbook`: the notebook runner (`streamidx.lab.workbook`)."""

if __name__ == "__main__":
  import sys

  from streamidx.lab.workbook import main

  sys.exit(main())
