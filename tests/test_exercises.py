"""streamidx.lab.exercises: the verdicts a notebook's checked exercise prints."""

import pytest

from streamidx.lab import exercises


def test_check_says_not_answered_while_the_answer_is_none(capsys):
  assert exercises.check("ex", None, 5, hint="count the pages") is None
  assert "not answered yet" in capsys.readouterr().out


def test_check_accepts_a_number_within_the_relative_tolerance(capsys):
  assert exercises.check("ex", 1000.4, 1000, rel=1e-3) is True
  assert "right" in capsys.readouterr().out


def test_check_rejects_a_wrong_number_with_the_ratio_and_the_hint(capsys):
  assert exercises.check("ex", 2000, 1000, hint="per entry, not per page") is False
  out = capsys.readouterr().out
  assert "not yet" in out and "2x the computed value" in out and "per entry, not per page" in out


def test_check_compares_lists_element_by_element_and_strings_without_case():
  assert exercises.check("ex", [30, 1, 0], (30, 1, 0)) is True
  assert exercises.check("ex", [30, 0, 1], [30, 1, 0]) is False
  assert exercises.check("ex", [30, 1], [30, 1, 0]) is False
  assert exercises.check("ex", " Vector ", "vector") is True
  assert exercises.check("ex", "seven", 7) is False


def test_check_rejects_a_bad_tolerance():
  with pytest.raises(ValueError, match="rel"):
    exercises.check("ex", 1, 1, rel=1.5)
