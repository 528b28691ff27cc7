"""The test tool of the multi-turn e2e runs (``actor_rollout_ref.rollout.multi_turn.function_tool_path``): a
stateless function tool, loaded by verl's ``@function_tool`` loader in each agent-loop worker."""

from verl.tools.function_tool import function_tool

#: what the tool answers; the test reward looks for it in the exchange (tests/e2e/tool_call_reward.py)
TOOL_ANSWER = "LOOKED-UP"


@function_tool
def lookup() -> str:
    """Look the answer up."""
    return TOOL_ANSWER
