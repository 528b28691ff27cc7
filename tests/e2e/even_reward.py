"""A reward any policy can learn in a few steps: 1.0 when the last ``\\boxed{...}`` holds an even integer.

The learnability check (tests/e2e/test_learnability_cpu.py) uses it: it needs no arithmetic, only a shift of
the last digit's distribution, so a working RL loop moves the batch reward from about 0.45 (the warmed-up
model's answers are even about half the time) to near 1.0 within ~20 steps. Never raises: a malformed
response scores 0.
"""

from __future__ import annotations

import re
from typing import Any

_BOXED = re.compile(r"\\boxed\{([^{}]*)\}")


def compute_score(
    data_source: str, solution_str: str, ground_truth: str, extra_info: dict[str, Any] | None = None, **kwargs: Any
) -> float:
    found = _BOXED.findall(solution_str or "")
    if not found:
        return 0.0
    try:
        return 1.0 if int(found[-1].strip()) % 2 == 0 else 0.0
    except ValueError:
        return 0.0
