"""The reward of the CPU tool demo (``python -m recipe.exgrpo.cpu_demo --tools``): the recipe's binary reward, plus
what the exchange did with the calculator.

``reward.custom_reward_function.path=pkg://recipe.exgrpo.harness.tool_reward`` (name ``compute_score``). The score is
the recipe's (``exgrpo.reward.grade``: the last ``\\boxed{}`` after ``</think>``, math-verify equivalence, graded in
the calling thread like the demo's one-turn runs), on the decoded exchange: the model's turns and the calculator's
answer between them. The calculator answers only with a bare number, so its turn never holds a box; the model has to
copy the number into its own. Extra keys, which verl logs per data source in validation (``val-aux/<source>/
tool_call/mean@N``), so the demo draws the call rate per difficulty level:

- ``tool_call``: the exchange holds a calculator call the hermes parser reads;
- ``tool_answered``: and the calculator answered it with a number (a well-formed call of the right expression
  kind; an ``error: ...`` answer does not count).

Never raises: anything unexpected scores 0 with the same keys.
"""

from __future__ import annotations

from typing import Any

from exgrpo.reward import grade
from recipe.exgrpo.harness.tool_task import TOOL_CALL_CLOSE, parse_tool_call, tool_answer

KEYS = ("score", "acc", "think_closed", "tool_call", "tool_answered")


def tool_use(solution_str: str) -> tuple[bool, bool]:
    """(called, answered) for one decoded exchange (see the module docstring)."""
    call = parse_tool_call(solution_str)
    if call is None:
        return False, False
    answer = tool_answer(*call)
    after = solution_str.split(TOOL_CALL_CLOSE, 1)[1]
    # the tool's turn follows the call: its answer is in the exchange only when the agent loop ran the call
    return True, answer.lstrip("-").isdigit() and answer in after


def compute_score(
    data_source: str, solution_str: str, ground_truth: str, extra_info: dict | None = None, **kwargs: Any
) -> dict[str, float]:
    """verl's reward-function entry point."""
    try:
        result = grade(solution_str or "", ground_truth, data_source=data_source, think_gate=True, timeout_s=None)
        called, answered = tool_use(solution_str or "")
        return {
            "score": float(result.score),
            "acc": float(result.score),
            "think_closed": float(result.think_closed),
            "tool_call": float(called),
            "tool_answered": float(answered),
        }
    except Exception:
        return dict.fromkeys(KEYS, 0.0)
