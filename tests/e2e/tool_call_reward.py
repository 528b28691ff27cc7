"""The reward of the multi-turn e2e runs (``reward.custom_reward_function``): 1.0 when the exchange holds the test
tool's answer (the model called the tool and verl's tool agent loop put its response in), else 0.0.

So every stored trajectory is a multi-turn one (model turn, tool output, model turn), and a group's success count is
how many of its K exchanges called the tool: about a third of them with the test model (tests/e2e/tool_assets.py),
so most groups are partly solved and stored. The replayed member is re-scored by the same rule from its tokens.
"""

from __future__ import annotations

from typing import Any

#: tests/e2e/lookup_tool.py's answer (a file of its own: verl loads this one by path, without the package)
TOOL_ANSWER = "LOOKED-UP"


def compute_score(
    data_source: str, solution_str: str, ground_truth: str, extra_info: dict[str, Any] | None = None, **kwargs: Any
) -> float:
    return 1.0 if TOOL_ANSWER in (solution_str or "") else 0.0
