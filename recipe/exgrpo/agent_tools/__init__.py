"""The recipe's verl function-tool files, each loaded by path through
``actor_rollout_ref.rollout.multi_turn.function_tool_path`` in every agent-loop worker (verl's ``@function_tool``
loader); the work each tool does lives in the framework-free core (``exgrpo.calculator``, ``exgrpo.sandbox``)."""
