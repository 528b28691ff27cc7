"""The calculator of the CPU tool demo (``python -m recipe.exgrpo.cpu_demo --tools``), as a verl function tool.

verl loads this file by path (``actor_rollout_ref.rollout.multi_turn.function_tool_path``) in every agent-loop
worker; its hermes parser reads the model's ``<tool_call>{"name":"calculator","arguments":{"expression":"523 + 47"}}
</tool_call>``, and the answer goes back into the exchange as context tokens (loss mask 0). The arithmetic, and what
each bad call answers, is ``exgrpo.calculator``.
"""

from verl.tools.function_tool import function_tool

from exgrpo.calculator import calculate


@function_tool
def calculator(expression: str) -> str:
    """Compute an integer arithmetic expression exactly.

    Args:
        expression: An expression such as "523 + 47" (integers, + - * / // % ** and parentheses).
    """
    return calculate(expression)
