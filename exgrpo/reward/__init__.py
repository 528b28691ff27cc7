"""Verifiable rewards (docs/algorithm.md §10): binary math-verify equivalence with the ``</think>`` gate, option
labels for multiple-choice benchmarks, a per-call timeout that works off the main thread, and no exceptions.

The plain API is ``score`` (a float) / ``grade`` (a ``RewardResult``); verl's entry point is
``recipe/exgrpo/reward.py:compute_score``. Nothing here imports verl or ray.
"""

from exgrpo.reward.extract import (
    THINK_CLOSE,
    TOOL_RESPONSE_CLOSE,
    TOOL_RESPONSE_OPEN,
    canonical_answer,
    choice_labels,
    extract_choice_label,
    last_boxed,
    split_after_think,
    strip_tool_responses,
)
from exgrpo.reward.isolation import GraderCrashed, GraderPool, GradingTimeout, get_default_pool, shutdown_default_pool
from exgrpo.reward.score import (
    DEFAULT_TIMEOUT_S,
    MULTIPLE_CHOICE_SOURCES,
    OUTCOMES,
    RewardResult,
    RewardStats,
    grade,
    grade_batch,
    is_multiple_choice,
    normalize_ground_truths,
    reset_reward_stats,
    reward_stats,
    score,
)

__all__ = [
    "DEFAULT_TIMEOUT_S",
    "MULTIPLE_CHOICE_SOURCES",
    "OUTCOMES",
    "THINK_CLOSE",
    "TOOL_RESPONSE_CLOSE",
    "TOOL_RESPONSE_OPEN",
    "GraderCrashed",
    "GraderPool",
    "GradingTimeout",
    "RewardResult",
    "RewardStats",
    "canonical_answer",
    "choice_labels",
    "extract_choice_label",
    "get_default_pool",
    "grade",
    "grade_batch",
    "is_multiple_choice",
    "last_boxed",
    "normalize_ground_truths",
    "reset_reward_stats",
    "reward_stats",
    "score",
    "shutdown_default_pool",
    "split_after_think",
    "strip_tool_responses",
]
