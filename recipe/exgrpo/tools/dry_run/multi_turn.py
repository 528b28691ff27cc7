"""Checker 9 of the dry run: verl's multi-turn keys, as its agent-loop workers read them once Ray runs.

A run whose rollouts may call tools (``recipe.exgrpo.tool_turns.runs_tools``: ``multi_turn.enable``, or a tool
file set) needs a tool-call format verl registers (``multi_turn.format``) and, with ``--check-paths``, tool files that
exist; a function-tool file must define at least one ``@function_tool`` (verl's loader only warns when it finds
none, and the model then calls tools that are not there). What the recipe refuses outright (stateful tools with
re-scored replayed members) is a start-up check (``config_bridge.UNSUPPORTED_VERL_SETTINGS``).
"""

from __future__ import annotations

import os

from omegaconf import DictConfig, OmegaConf

from recipe.exgrpo import verl_compat
from recipe.exgrpo.tool_turns import runs_tools
from recipe.exgrpo.tools.dry_run.startup import error_text, stdout_to_stderr

MULTI_TURN = "actor_rollout_ref.rollout.multi_turn"


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
