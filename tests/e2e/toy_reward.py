"""Minimal verifiable reward for the toy arithmetic task, wired into verl as ``reward.custom_reward_function``.

Score 1.0 when the content of the last ``\\boxed{...}`` in the response equals the ground truth exactly (after
stripping spaces), else 0.0. It never raises: a malformed response scores 0. The project's real reward
(recipe/exgrpo/reward.py, math-verify based) has the same entry-point signature and replaces this file by
changing ``reward.custom_reward_function.path``.
"""

from __future__ import annotations

import re
from typing import Any

_BOXED = re.compile(r"\\boxed\{([^{}]*)\}")


def last_boxed_content(text: str) -> str | None:
    found = _BOXED.findall(text or "")
    return found[-1].replace(" ", "") if found else None


def compute_score(
    data_source: str, solution_str: str, ground_truth: str, extra_info: dict[str, Any] | None = None, **kwargs: Any
) -> float:
    try:
        predicted = last_boxed_content(solution_str)
        return 1.0 if predicted is not None and predicted == str(ground_truth).replace(" ", "") else 0.0
    except Exception:
        return 0.0
