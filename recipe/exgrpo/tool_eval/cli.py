"""``python -m recipe.exgrpo.tool_eval``: ``python -m exgrpo.eval`` with the tool loop (the same subcommands, output
directory, resuming and reports), plus the tool settings of the training run.

The settings come from the training run's own hydra overrides (``--training-overrides``: the launch script's, composed
with the recipe's config as training composes them; keys other than the tool loop's are ignored), then from the
flags below, which win; what neither sets is verl's default, as in training. The dataset's system message is kept
unless a flag says otherwise (training hands the loop the row's messages as they are: a TIR row's system message
offers the tool). The response length is the whole exchange's (``data.max_response_length``), so
``--max-new-tokens`` is not used; the tool's answers are cut out before grading (``--no-strip-tool-responses`` keeps
them), as the TIR runs' reward does.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from exgrpo.eval import cli as eval_cli
from exgrpo.eval.config import EvalConfig
from recipe.exgrpo.tool_eval.loop import FACTORY
from recipe.exgrpo.tool_eval.settings import FLAG_KEYS, settings_from_training


def add_tool_options(sub: argparse.ArgumentParser) -> None:
    """The tool settings' options of ``run`` and ``generate``."""
    g = sub.add_argument_group("tools (the training run's settings)")
    g.add_argument(
        "--training-overrides",
        nargs="*",
        default=[],
        metavar="KEY=VALUE",
        help="the training run's hydra overrides; the tool loop's keys are read from them "
        "(actor_rollout_ref.rollout.multi_turn.*, data.max_prompt_length, data.max_response_length, "
        "data.apply_chat_template_kwargs)",
    )
    g.add_argument("--tools", help=f"the verl function-tool file ({FLAG_KEYS['tools']})")
    g.add_argument("--tool-format", help=f"the tool-call parser ({FLAG_KEYS['tool_format']}; verl: hermes)")
    for flag in ("max_user_turns", "max_assistant_turns", "max_parallel_calls", "max_tool_response_length"):
        g.add_argument("--" + flag.replace("_", "-"), type=int, help=FLAG_KEYS[flag])
    g.add_argument("--tool-response-truncate-side", choices=("left", "right", "middle"))
    g.add_argument("--max-prompt-length", type=int, help=FLAG_KEYS["max_prompt_length"])
    g.add_argument("--max-response-length", type=int, help=f"{FLAG_KEYS['max_response_length']}: the whole exchange")


def build_parser() -> argparse.ArgumentParser:
    return eval_cli.build_parser(
        add_tool_options,
        prog="python -m recipe.exgrpo.tool_eval",
        description="ExGRPO evaluation with the tool: each answer a run of verl's tool agent loop.",
    )


def configure(cfg: EvalConfig, a: argparse.Namespace) -> None:
    """The run's tool settings into ``cfg`` (``cfg.agent``), with the defaults of an evaluation with tools."""
    flags = {name: getattr(a, name) for name in FLAG_KEYS}
    settings = settings_from_training(a.training_overrides, flags)
    if a.max_new_tokens is not None and a.max_new_tokens != settings.response_length:
        raise ValueError(
            f"--max-new-tokens {a.max_new_tokens}: with tools the exchange's length is the training run's response "
            f"length (data.max_response_length = {settings.response_length}); set --max-response-length instead"
        )
    cfg.sampling.max_new_tokens = settings.response_length
    if a.system_prompt is None and not a.no_system_prompt:  # training hands the loop the row's messages as they are
        cfg.prompt_format.system_prompt = None
    if getattr(a, "strip_tool_responses", None) is None:
        cfg.strip_tool_responses = True
    cfg.agent = {"factory": FACTORY, **settings.as_dict()}


def main(argv: Sequence[str] | None = None) -> int:
    return eval_cli.main(argv, parser=build_parser(), configure=configure)
