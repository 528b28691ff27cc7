"""Multi-turn rollouts: whether a trajectory's exchange was cut in a tool call (docs/algorithm.md, "Multi-turn").

verl 0.9.1's tool agent loop ends an exchange when the model's turn holds no tool call, when the response length is
reached (the last turn is cut where it stands, possibly inside a tool call), when a tool's response would not fit
(the response then ends on the model's call, unanswered), or when ``multi_turn.max_assistant_turns`` /
``max_user_turns`` is reached (its last turn's calls are never run). In the last three the model asked for a tool and
got no answer: the stored exchange would teach "call, then stop". :class:`ToolCallDetector` finds them with the run's
own tool-call parser (``multi_turn.format``): the exchange's last model turn holds the parser's tool-call marker (a
cut call has its opening marker and no end), or, for a parser without a marker, a call the parser reads.
"""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
from omegaconf import OmegaConf

__all__ = ["ToolCallDetector", "last_model_turn", "runs_tools"]

#: where verl 0.9.1's parsers keep the text that opens a tool call (hermes, qwen3_coder, glm, seed, minimax, gemma4:
#: tool_call_start_token; kimi: tool_calls_section_start_token; deepseek_v4: tool_calls_start_token)
_MARKER_ATTRIBUTES = ("tool_call_start_token", "tool_calls_section_start_token", "tool_calls_start_token")


def runs_tools(config: Any) -> bool:
    """Whether a run's rollouts may hold tool turns: multi-turn is on, or tools are configured (verl's agent loop
    picks the loop per row from the data's ``agent_name``, and loads the tools whatever ``multi_turn.enable`` says)."""
    mt = OmegaConf.select(config, "actor_rollout_ref.rollout.multi_turn", default=None)
    if mt is None:
        return False
    return bool(mt.get("enable", False) or mt.get("function_tool_path") or mt.get("tool_config_path"))


def last_model_turn(mask: np.ndarray) -> tuple[int, int] | None:
    """[start, stop) of the last run of model tokens (mask 1), None when there is none."""
    model = np.flatnonzero(np.asarray(mask, dtype=bool))
    if model.size == 0:
        return None
    stop = int(model[-1]) + 1
    gaps = np.flatnonzero(np.diff(model) > 1)
    start = int(model[gaps[-1] + 1]) if gaps.size else int(model[0])
    return start, stop


class ToolCallDetector:
    """``detector(response_ids, loss_mask) -> bool``: the exchange's last model turn holds a tool call (so it got no
    answer: a tool's answer would have been followed by another model turn)."""

    def __init__(self, parser: Any, tokenizer: Any):
        self.parser = parser
        self.tokenizer = tokenizer
        self.marker = next(
            (getattr(parser, a) for a in _MARKER_ATTRIBUTES if isinstance(getattr(parser, a, None), str)), None
        )

    @classmethod
    def from_config(cls, config: Any, tokenizer: Any) -> ToolCallDetector | None:
        """The detector of a run whose rollouts may call tools (:func:`runs_tools`), with its ``multi_turn.format``
        parser; None otherwise. ValueError naming the key for a parser verl does not know."""
        if not runs_tools(config):
            return None
        from verl.experimental.agent_loop.tool_parser import ToolParser

        fmt = str(OmegaConf.select(config, "actor_rollout_ref.rollout.multi_turn.format", default="hermes"))
        try:
            parser = ToolParser.get_tool_parser(fmt, tokenizer)
        except ValueError as e:
            raise ValueError(f"actor_rollout_ref.rollout.multi_turn.format={fmt}: {e}") from None
        return cls(parser, tokenizer)

    def __call__(self, response_ids: np.ndarray, loss_mask: np.ndarray) -> bool:
        span = last_model_turn(loss_mask)
        if span is None:
            return False
        ids = [int(t) for t in np.asarray(response_ids)[span[0] : span[1]]]
        if self.marker is not None:
            return self.marker in self.tokenizer.decode(ids, skip_special_tokens=False)
        # a parser without a marker: ask it (a coroutine; on a thread of its own, whatever loop this one runs)
        with ThreadPoolExecutor(1) as pool:
            _, calls = pool.submit(asyncio.run, self.parser.extract_tool_calls(ids)).result()
        return bool(calls)
