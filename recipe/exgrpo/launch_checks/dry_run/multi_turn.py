"""Checker 9 of the dry run: verl's multi-turn keys, as its agent-loop workers read them once Ray runs.

A run whose rollouts may call tools (``recipe.exgrpo.tool_turns.runs_tools``: ``multi_turn.enable``, or a tool
file set) needs a tool-call format verl registers (``multi_turn.format``) and, with ``--check-paths``, tool files that
exist; a function-tool file must define at least one ``@function_tool`` (verl's loader only warns when it finds
none, and the model then calls tools that are not there). What the recipe refuses outright (stateful tools with
re-scored replayed members) is a start-up check (``config_bridge.UNSUPPORTED_VERL_SETTINGS``).

Two more failures would not stop such a run, only void it: data rows that never reach a loop with tools (no
``agent_name`` column: verl serves them with its single-turn default), and, with the recipe's Python tool, sandbox
limits that make every call answer an error (a bad ``EXGRPO_SANDBOX_*`` value; a kernel without the isolation
``EXGRPO_SANDBOX_REQUIRE_ISOLATION=1`` requires). The tool never raises, so the model would train on the errors.
"""

from __future__ import annotations

import os
from pathlib import Path

from omegaconf import DictConfig, ListConfig, OmegaConf

from recipe.exgrpo import verl_compat
from recipe.exgrpo.launch_checks.dry_run.startup import error_text, stdout_to_stderr
from recipe.exgrpo.tool_turns import runs_tools

MULTI_TURN = "actor_rollout_ref.rollout.multi_turn"
DEFAULT_AGENT_LOOP = "actor_rollout_ref.rollout.agent.default_agent_loop"
#: the recipe's sandboxed Python tool (scripts/train/*_tir.sh), whose limits come from EXGRPO_SANDBOX_* variables
PYTHON_TOOL = Path(__file__).resolve().parents[2] / "agent_tools" / "python_tool.py"
WORKER_ENV = "ray_kwargs.ray_init.runtime_env.env_vars"


def multi_turn_problems(config: DictConfig, check_files: bool) -> list[str]:
    """One line per problem of the multi-turn keys (none when the rollouts call no tools)."""
    if not runs_tools(config):
        return []
    problems = []
    fmt = str(OmegaConf.select(config, f"{MULTI_TURN}.format", default="hermes"))
    names = verl_compat.tool_parser_names()
    if fmt not in names:
        problems.append(f"{MULTI_TURN}.format={fmt} is not a tool-call format verl reads (registered: {names})")
    if not check_files:
        return problems
    for key in ("function_tool_path", "tool_config_path"):
        path = OmegaConf.select(config, f"{MULTI_TURN}.{key}", default=None)
        if path and not os.path.isfile(os.path.expanduser(str(path))):
            problems.append(f"{MULTI_TURN}.{key}={path} is not a file")
    path = OmegaConf.select(config, f"{MULTI_TURN}.function_tool_path", default=None)
    if path and os.path.isfile(os.path.expanduser(str(path))):
        from verl.tools.function_tool import load_function_tools_from_path

        try:
            with stdout_to_stderr():
                tools = load_function_tools_from_path(os.path.expanduser(str(path)))
        except Exception as e:  # the user's file: anything it raises is the problem to name
            problems.append(f"{MULTI_TURN}.function_tool_path={path} does not load: {error_text(e)}")
        else:
            if not tools:
                problems.append(f"{MULTI_TURN}.function_tool_path={path} defines no @function_tool")
    return problems


def data_agent_problems(config: DictConfig) -> list[str]:
    """Each data file here (not a placeholder, readable parquet) of a run with tools must have an ``agent_name``
    column, unless verl's default loop is another than its single-turn one: without it every row of the file is
    served by ``agent.default_agent_loop`` and no tool is ever called. Only the files' schemas are read."""
    if not runs_tools(config):
        return []
    default = str(OmegaConf.select(config, DEFAULT_AGENT_LOOP, default="single_turn_agent"))
    if default != "single_turn_agent":
        return []
    import pyarrow.parquet as pq

    problems = []
    for key in ("data.train_files", "data.val_files"):
        value = OmegaConf.select(config, key)
        for f in list(value) if isinstance(value, (list, ListConfig)) else [value]:
            path = os.path.expanduser(str(f))
            if "://" in path or not os.path.isfile(path):
                continue  # the path checks report it
            try:
                names = pq.read_schema(path).names
            except Exception:  # not parquet, or unreadable: verl reports it with its own message
                continue
            if "agent_name" not in names:
                problems.append(
                    f"{key}: {f} has no agent_name column, so verl serves its rows with {DEFAULT_AGENT_LOOP}="
                    f"{default}, which calls no tool, although this run configures tools ({MULTI_TURN}): make the "
                    "file with --prompt-style tir (PROMPT_STYLE=tir bash scripts/prepare_data.sh), or give it the "
                    "column (--agent-name single_turn_agent keeps its rows single-turn on purpose)"
                )
    return problems


def sandbox_problems(config: DictConfig, check_files: bool) -> list[str]:
    """With the recipe's Python tool: its sandbox limits as the workers will read them (the job's runtime_env
    variables over this environment) must parse; with ``--check-paths`` (the pre-flight, on the launch machine),
    this kernel must offer the isolation they require. Either failure would answer every tool call with an error."""
    path = OmegaConf.select(config, f"{MULTI_TURN}.function_tool_path", default=None)
    if not path or not runs_tools(config) or Path(os.path.expanduser(str(path))).resolve() != PYTHON_TOOL:
        return []
    try:
        from exgrpo.sandbox import SandboxLimits, isolation_available
    except ImportError:  # no sandbox in this checkout: loading the tool file (--check-paths) names what is missing
        return []
    env_vars = OmegaConf.select(config, WORKER_ENV, default=None) or {}
    environ = {**os.environ, **{str(k): str(v) for k, v in env_vars.items()}}
    try:
        limits = SandboxLimits.from_env(environ=environ)
    except ValueError as e:
        return [f"the python tool's sandbox limits ({WORKER_ENV}, else this environment): {e}"]
    if not check_files or not limits.require_isolation:
        return []
    available = isolation_available()
    if available.get("landlock_abi") and available.get("seccomp"):
        return []
    return [
        f"EXGRPO_SANDBOX_REQUIRE_ISOLATION is on, but this machine's kernel offers landlock_abi="
        f"{available.get('landlock_abi')} seccomp={available.get('seccomp')}: the python tool would refuse every "
        "call (exgrpo/sandbox/runner.py needs Landlock and seccomp-BPF). Run on a kernel with both, or set "
        "EXGRPO_SANDBOX_REQUIRE_ISOLATION=0 to run the model's code with what this kernel offers "
        "(docs/troubleshooting.md#the-sandboxs-isolation-check)"
    ]


def multi_turn_summary(config: DictConfig) -> list[str]:
    """The dry run's line for a multi-turn launch (nothing for a single-turn one)."""
    if not runs_tools(config):
        return []
    mt = OmegaConf.select(config, MULTI_TURN)
    tools = [
        f"{kind}={mt.get(key)}"
        for kind, key in (("function", "function_tool_path"), ("stateful", "tool_config_path"))
        if mt.get(key)
    ]
    turns = f"max_assistant_turns={mt.get('max_assistant_turns')} max_user_turns={mt.get('max_user_turns')}"
    return [f"multi-turn: format={mt.get('format')} tools=[{', '.join(tools) or 'none'}] {turns}"]
