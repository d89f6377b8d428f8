"""Checking a notebook's parameters before anything runs.

Each notebook's first cell after its `parameters` cell calls these, so that a
papermill run with a bad `-p` value stops there, naming the parameter::

    from streamidx.lab.params import check
    check.integer("num_seqs", num_seqs, min=1)
    check.choice("fmt", fmt, ("fp8", "bf16"))
"""

from __future__ import annotations

import numbers
from typing import Iterable

__all__ = ["ParameterError", "check"]


class ParameterError(ValueError):
  """A notebook parameter breaks its rule."""


def _fail(name, rule, value):
  raise ParameterError(f"notebook parameter {name!r}: {rule} (got {value!r})")


class check:  # pylint: disable=invalid-name
  """Namespace of parameter checks; each returns the value it accepted."""

  @staticmethod
  def integer(name, value, *, min=None, max=None, multiple_of=None):  # pylint: disable=redefined-builtin
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
      _fail(name, "must be an int", value)
    if min is not None and value < min:
      _fail(name, f"must be >= {min}", value)
    if max is not None and value > max:
      _fail(name, f"must be <= {max}", value)
    if multiple_of is not None and value % multiple_of:
      _fail(name, f"must be a multiple of {multiple_of}", value)
    return int(value)

  @staticmethod
  def number(name, value, *, min=None, max=None):  # pylint: disable=redefined-builtin
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
      _fail(name, "must be a number", value)
    if min is not None and value < min:
      _fail(name, f"must be >= {min}", value)
    if max is not None and value > max:
      _fail(name, f"must be <= {max}", value)
    return value

  @staticmethod
  def choice(name, value, options: Iterable):
    options = tuple(options)
    if value not in options:
      _fail(name, f"must be one of {options}", value)
    return value

  @staticmethod
  def boolean(name, value):
    if not isinstance(value, bool):
      _fail(name, "must be True or False", value)
    return value

  @staticmethod
  def integers(name, values, *, min=None, max=None, nonempty=True):  # pylint: disable=redefined-builtin
    if isinstance(values, (str, bytes)) or not isinstance(values, Iterable):
      _fail(name, "must be a list of ints", values)
    values = list(values)
    if nonempty and not values:
      _fail(name, "must not be empty", values)
    for i, v in enumerate(values):
      check.integer(f"{name}[{i}]", v, min=min, max=max)
    return [int(v) for v in values]

  @staticmethod
  def string(name, value):
    if not isinstance(value, str) or not value:
      _fail(name, "must be a non-empty string", value)
    return value
