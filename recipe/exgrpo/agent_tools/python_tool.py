"""A Python interpreter for tool-integrated reasoning, as a verl function tool.

Wiring: ``actor_rollout_ref.rollout.multi_turn.function_tool_path=recipe/exgrpo/agent_tools/python_tool.py``. verl
loads this file by path (``load_function_tools_from_path``) in each agent-loop worker and runs ``python`` in a
thread for every call the model makes; each call is a fresh confined interpreter (``exgrpo.sandbox``), with the
limits of ``SandboxLimits.from_env()`` (``EXGRPO_SANDBOX_TIMEOUT_S``, ``..._MEMORY_MB``, ``..._REQUIRE_ISOLATION``,
...: set them in the workers' environment, e.g. ``ray_kwargs.ray_init.runtime_env.env_vars``). The tool never raises:
a bad call or a failure of the sandbox is an answer that starts with ``error:``, and a timeout or a kill is a line in
the answer, so neither stops the training step.
"""

import sys
from pathlib import Path

from verl.tools.function_tool import function_tool

try:
    from exgrpo.sandbox import SandboxLimits, run_python
except ImportError:
    # the recipe's Ray workers import exgrpo (runtime_env.py_modules); a process that loads this file by path
    # from elsewhere (a dry run outside the checkout) finds it next to this file. Appended: a shipped copy wins.
    sys.path.append(str(Path(__file__).resolve().parents[3]))
    from exgrpo.sandbox import SandboxLimits, run_python


@function_tool
def python(code: str) -> str:
    """Run Python code in a sandbox and return what it printed.

    Args:
        code: Python source code; print() what you want to see.
    """
    if not isinstance(code, str):  # the model may send a number, a list or an object as the argument
        return f"error: code must be a string of Python source, got {type(code).__name__}"
    try:
        return run_python(code, SandboxLimits.from_env()).as_tool_text()
    except Exception as e:  # a bad EXGRPO_SANDBOX_* variable, no temp dir, ...: an answer, never a failed step
        return f"error: the sandbox could not run the code: {type(e).__name__}: {e}"[:1000]
