"""Exercises that check the reader: a value the reader writes in a notebook cell (`my_x =
None  # EXERCISE ...`), checked by `check(name, my_x, expected, hint=...)`; the worked
solution asserts `check(name + " (worked solution)", formula, expected)` on every run.
"""

from __future__ import annotations

import math
from typing import Any


def _close(got: Any, want: Any, rel: float) -> bool:
  if isinstance(want, str):
    return isinstance(got, str) and got.strip().lower() == want.strip().lower()
  if isinstance(want, (list, tuple)):
    return (isinstance(got, (list, tuple)) and len(got) == len(want)
            and all(_close(g, w, rel) for g, w in zip(got, want)))
  try:
    return math.isclose(float(got), float(want), rel_tol=rel, abs_tol=0.0 if want else 1e-12)
  except (TypeError, ValueError):
    return False


def _off(got: Any, want: Any) -> str:
  """How far a wrong numeric answer is, in words; '' for anything else."""
  try:
    g, w = float(got), float(want)
  except (TypeError, ValueError):
    return ""
  return f" (yours is {g / w:.3g}x the computed value)" if w and g else ""


def check(name: str, answer: Any, expected: Any, *, rel: float = 1e-3, hint: str = "") -> bool | None:
  """Prints the verdict on the reader's `answer` and returns it: None (not answered), True
  when it matches `expected` (numbers within `rel`, lists element by element, strings
  ignoring case and space), else False with how far off and `hint`."""
  if not 0 <= rel < 1:
    raise ValueError(f"rel: must be in [0, 1) (got {rel})")
  if answer is None:
    print(f"{name}: not answered yet: write your answer in the cell above and rerun"
          + (f". Hint: {hint}" if hint else ""))
    return None
  if _close(answer, expected, rel):
    print(f"{name}: right ({answer!r})")
    return True
  print(f"{name}: not yet: {answer!r}{_off(answer, expected)}" + (f". Hint: {hint}" if hint else ""))
  return False
