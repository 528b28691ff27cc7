"""A continuous reward any policy can learn in a few steps: (9 − d) / 9 for the last digit d of the last
``\\boxed{...}`` integer (1 for a final 0, 0 for a final 9; no boxed integer: 0).

The continuous mode's learnability check (tests/e2e/test_continuous_cpu.py) uses it: like tests/e2e/even_reward.py it
needs no arithmetic, only a shift of the last digit's distribution, and every response gets a graded reward, so a
group of K answers spreads (what the continuous mode's buckets measure). The warmed-up model's last digits are about
uniform (mean reward ~0.5). Never raises: a malformed response scores 0.
"""

from __future__ import annotations

from typing import Any

from exgrpo.reward.extract import last_boxed


def compute_score(
    data_source: str, solution_str: str, ground_truth: str, extra_info: dict[str, Any] | None = None, **kwargs: Any
) -> float:
    found = last_boxed(solution_str or "")
    if found is None:
        return 0.0
    digits = found.strip()
    if not digits.lstrip("-").isdigit():
        return 0.0
    return (9 - int(digits[-1])) / 9
