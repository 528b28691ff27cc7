"""The toy task's continuous reward (recipe/exgrpo/harness/partial_credit.py): hand-computed credits, the keys verl
logs, and it never raises."""

from __future__ import annotations

import pytest

from recipe.exgrpo.harness.partial_credit import compute_score, digit_credit

KEYS = {"score", "acc", "think_closed", "digit_credit"}


@pytest.mark.parametrize(
    ("predicted", "truth", "credit"),
    [
        ("81", "81", 1.0),
        ("71", "81", 0.5),  # units right, tens wrong
        ("810", "81", 0.0),  # right-aligned: 0|1, 1|8, 8|- all differ
        ("1081", "81", 0.5),  # 1 and 8 right of four positions
        ("081", "81", 1.0),  # leading zeros do not count
        ("-81", "81", 0.0),  # a wrong sign
        ("8 1", "81", 1.0),
        ("8.1", "81", 0.0),  # not an integer
        (None, "81", 0.0),
    ],
)
def test_digit_credit(predicted, truth, credit):
    assert digit_credit(predicted, truth) == pytest.approx(credit)


@pytest.mark.parametrize(
    ("response", "score", "acc"),
    [
        ("</think>\\boxed{81}", 1.0, 1.0),  # the binary think-gated reward's 1
        ("\\boxed{81}", 0.5, 0.0),  # right digits, think block not closed
        ("</think>\\boxed{71}", 0.75, 0.0),
        ("</think>no answer", 0.5, 0.0),
        ("\\boxed{1}</think>\\boxed{91}", 0.75, 0.0),  # graded after the last </think>
        ("", 0.0, 0.0),
        (None, 0.0, 0.0),
    ],
)
def test_compute_score(response, score, acc):
    out = compute_score("toy_arithmetic_easy", response, "81")
    assert set(out) == KEYS and out["score"] == pytest.approx(score) and out["acc"] == acc


def test_never_raises_and_keeps_its_keys():
    out = compute_score("toy", object(), object())  # type: ignore[arg-type]
    assert set(out) == KEYS and out["score"] == 0.0
