"""The calculator of the CPU tool demo (exgrpo/calculator.py): exact answers, and an ``error: ...`` text for every
bad call a model can make (never an exception: verl would turn one into a tool error too, but the message the model
reads should say what was wrong), with no call able to take the worker's CPU or memory."""

from __future__ import annotations

import time

import pytest

from exgrpo.calculator import MAX_EXPRESSION_CHARS, MAX_RESULT_DIGITS, calculate


@pytest.mark.parametrize(
    ("expression", "expected"),
    [
        ("523 + 47", "570"),
        ("  10 + 93 ", "103"),
        ("999 + 99", "1098"),
        ("(1 + 2) * 3", "9"),
        ("-5 // 2", "-3"),
        ("7 % 3", "1"),
        ("2 ** 10", "1024"),
        ("84 / 4", "21"),
        ("12345678901234567890 + 1", "12345678901234567891"),  # exact, no float rounding
    ],
)
def test_exact_answers(expression, expected):
    assert calculate(expression) == expected


@pytest.mark.parametrize(
    ("expression", "says"),
    [
        (570, "must be a string, got int"),
        (None, "must be a string, got NoneType"),
        (["523", "47"], "must be a string, got list"),
        ({"a": 1}, "must be a string, got dict"),
        ("", "empty expression"),
        ("   ", "empty expression"),
        ("523 +", "cannot parse"),
        ('{"expression": "1+1"}', "Dict is not allowed"),
        ("1 / 0", "division by zero"),
        ("1 // 0", "division by zero"),
        ("1 % 0", "division by zero"),
        ("7 / 2", "not an integer"),
        ("1.5 + 1", "only integers"),
        ("True + 1", "only integers"),
        ("'a' * 3", "only integers"),
        ("__import__('os').system('true')", "Call is not allowed"),
        ("x + 1", "Name is not allowed"),
        ("2 ** -1", "negative exponents"),
        ("1 << 5", "LShift is not allowed"),
        ("[1, 2]", "List is not allowed"),
        ("1 if 1 else 2", "IfExp is not allowed"),
    ],
)
def test_bad_calls_answer_an_error_text(expression, says):
    answer = calculate(expression)
    assert answer.startswith("error: ") and says in answer, answer


def test_huge_numbers_are_refused_at_once():
    # 9 ** 9 ** 9 has ~370 million digits: evaluating it would hold an agent-loop worker for minutes
    t0 = time.perf_counter()
    for expression in ("9 ** 9 ** 9", "10 ** 10 ** 10", "(10 ** 60) * (10 ** 60)", "2 ** 1000", "9" * 70):
        answer = calculate(expression)
        assert answer.startswith("error: ") and ("digits" in answer or "exponent" in answer), (expression, answer)
    assert time.perf_counter() - t0 < 5.0  # a bound on a hang, not a speed figure
    assert calculate("9" * MAX_RESULT_DIGITS) == "9" * MAX_RESULT_DIGITS


def test_long_and_deep_expressions_are_refused():
    assert calculate("1 + " * MAX_EXPRESSION_CHARS + "1").startswith("error: expression is longer")
    deep = "(" * 90 + "1" + ")" * 90
    answer = calculate(deep)
    assert answer == "1" or answer.startswith("error: "), answer
