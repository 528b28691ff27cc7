"""A continuous reward for the toy arithmetic task: partial credit (the CPU demo of the continuous reward mode).

``reward.custom_reward_function.path=pkg://recipe.exgrpo.harness.partial_credit`` (name ``compute_score``) with
``exgrpo.reward_mode=continuous``; ``python -m recipe.exgrpo.cpu_demo --reward continuous`` sets both. Per response:

    score = 0.5 · think_closed + 0.5 · digit_credit

* ``think_closed``: the response closes its think block (``</think>``), the format the recipe's binary reward
  gates on (docs/algorithm.md §10);
* ``digit_credit``: the share of digit positions, aligned from the units, where the last ``\\boxed{}`` integer
  agrees with the ground truth, over the longer of the two numbers (``81`` for 81: 1; ``71``: 0.5; ``810``: 0;
  no boxed integer: 0). The box is read after the last ``</think>`` when there is one, else in the whole text.

So the exact answer with the think block closed scores 1 (the binary reward's 1), and the reward moves in steps of
a digit or of the format: a group of K answers to one question spreads, which is what the continuous mode's
buckets measure. The returned dict also has ``acc`` (1 exactly when the binary think-gated reward would give 1),
``think_closed`` and ``digit_credit``: verl logs them per data source in validation, and the trainer logs their
means as ``exgrpo/reward/extra/<key>``. It never raises: a malformed response scores 0.
"""

from __future__ import annotations

import re
from typing import Any

from exgrpo.reward.extract import last_boxed, split_after_think

__all__ = ["compute_score", "digit_credit", "partial_credit"]

_INTEGER = re.compile(r"^[+-]?\d+$")


def digit_credit(predicted: str | None, ground_truth: str) -> float:
    """Share of matching digit positions (aligned from the units) over the longer number; 0 unless both are
    integers (a sign must match too: a wrong sign scores 0)."""
    if predicted is None:
        return 0.0
    p, t = predicted.replace(" ", "").replace(",", ""), str(ground_truth).strip()
    if not (_INTEGER.match(p) and _INTEGER.match(t)):
        return 0.0
    if (p.startswith("-")) != (t.startswith("-")):
        return 0.0
    p, t = p.lstrip("+-").lstrip("0") or "0", t.lstrip("+-").lstrip("0") or "0"
    width = max(len(p), len(t))
    p, t = p.rjust(width, " "), t.rjust(width, " ")
    return sum(a == b for a, b in zip(p, t)) / width


def partial_credit(response: str, ground_truth: str) -> dict[str, float]:
    """The reward's parts for one response (see the module docstring)."""
    text = response or ""
    after = split_after_think(text)
    closed = after is not None
    credit = digit_credit(last_boxed(after if closed else text), ground_truth)
    return {
        "score": 0.5 * float(closed) + 0.5 * credit,
        "acc": float(closed and credit == 1.0),
        "think_closed": float(closed),
        "digit_credit": credit,
    }


def compute_score(
    data_source: str, solution_str: str, ground_truth: str, extra_info: dict | None = None, **kwargs: Any
) -> dict[str, float]:
    """verl's reward-function entry point; never raises (a failure scores 0 with the same keys)."""
    try:
        return partial_credit(solution_str, ground_truth)
    except Exception:
        return dict.fromkeys(("score", "acc", "think_closed", "digit_credit"), 0.0)
