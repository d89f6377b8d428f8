"""`python -m streamidx.workbook`: the notebook runner (`streamidx.lab.workbook`)."""

if __name__ == "__main__":
  from streamidx.lab.workbook import main
  raise SystemExit(main())
