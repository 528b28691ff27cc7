"""verl 0.9.1 custom reward function of the ExGRPO recipe (docs/algorithm.md §10).

Wiring (``main_exgrpo`` fills path/name when left null)::

    reward.custom_reward_function.path=pkg://recipe.exgrpo.reward   # or the file path of this module
    reward.custom_reward_function.name=compute_score
    +reward.custom_reward_function.reward_kwargs.think_gate=false   # Llama base
    +reward.custom_reward_function.reward_kwargs.timeout_s=10
    +reward.custom_reward_function.reward_kwargs.strip_tool_responses=true   # tool-calling runs

How verl calls it: ``verl.trainer.ppo.reward.get_custom_reward_fn`` wraps this function so that
``reward_kwargs`` are merged into every call (and win over verl's own keyword arguments); the reward loop's
manager (``naive`` by default) calls it as ``compute_score(data_source=, solution_str=, ground_truth=,
extra_info=)`` through ``loop.run_in_executor`` inside the ``reward.num_workers`` Ray actors, i.e. in threads
other than the main one. The math-verify timeout of ``exgrpo.reward`` works there (worker processes, not
``signal.alarm``). The returned dict's ``score`` is the reward; every other key is logged per response (the
same keys every call, as verl requires).

This module imports neither verl nor ray, so the reward workers stay light.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from exgrpo.reward import DEFAULT_TIMEOUT_S, MULTIPLE_CHOICE_SOURCES, RewardResult, grade
from exgrpo.reward import strip_tool_responses as _strip

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


def _as_bool(name: str, value: Any) -> bool:
    """reward_kwargs arrive from hydra (bool) or from a shell/env override (string)."""
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    if isinstance(value, str) and value.strip().lower() in _TRUE | _FALSE:
        return value.strip().lower() in _TRUE
    raise ValueError(f"reward_kwargs.{name} must be a boolean (true/false), got {value!r}")


def _as_timeout(value: Any) -> float | None:
    if value is None:
        return None
    try:
        timeout = float(value)
    except (TypeError, ValueError) as e:
        raise ValueError(f"reward_kwargs.timeout_s must be a number of seconds or null, got {value!r}") from e
    return timeout if timeout > 0 else None


def _as_sources(value: Iterable[str] | str | None) -> tuple[str, ...]:
    if value is None:
        return MULTIPLE_CHOICE_SOURCES
    if isinstance(value, str):  # "arc_c,gpqa" from a command line
        return tuple(v.strip() for v in value.split(",") if v.strip())
    return tuple(str(v) for v in value)


def to_verl_dict(result: RewardResult) -> dict[str, float | str]:
    """The dict verl's reward managers accept: ``score`` plus extra keys, the same keys for every response.

    verl 0.9.1 logs numeric extra keys per data source in validation (mean@N etc.; ``acc`` is the core
    metric), uses the string ``pred`` for majority voting (maj@N), and stacks the extra keys of a batch by the
    first response's keys, so every outcome must give the same keys.
    """
    return {
        "score": float(result.score),
        "acc": float(result.score),
        "pred": result.pred,
        "think_closed": float(result.think_closed),
        "reward_error": float(result.outcome == "error"),
        "reward_timeout": float(result.outcome == "timeout"),
        "reward_queue_s": float(result.queue_s),
    }


def compute_score(
    data_source: str,
    solution_str: str,
    ground_truth: str | list[str],
    extra_info: dict | None = None,
    *,
    think_gate: bool | str = True,
    timeout_s: float | None = DEFAULT_TIMEOUT_S,
    multiple_choice_sources: Iterable[str] | str | None = None,
    max_workers: int | None = None,
    strip_tool_responses: bool | str = False,
    **kwargs: Any,
) -> dict[str, float | str]:
    """Binary math-verify reward for one response; never raises for any response or ground truth.

    Args (the keyword-only ones come from ``reward.custom_reward_function.reward_kwargs``):
        data_source, solution_str, ground_truth, extra_info: as verl passes them (``extra_info`` is unused).
        think_gate: grade only the text after the last ``</think>``; 0 without one. Off for models without a
            think template (Llama base) and the toy arithmetic CPU task.
        timeout_s: hard deadline in seconds for the whole call (extraction, waiting for a grader process, the
            math-verify check); null/<=0 disables it (in-thread grading).
        multiple_choice_sources: data_source names graded by option label (default: arc_c, gpqa, mmlu_pro, ...).
        max_workers: grading worker processes per reward actor (default ``EXGRPO_REWARD_WORKERS`` or min(4, CPUs)).
        strip_tool_responses: remove the tool's answers (``<tool_response>...</tool_response>``, how a hermes chat
            template such as Qwen2.5's wraps them) before anything else, the think gate included. In a tool-calling
            exchange verl decodes the whole response, tool outputs between the model's turns: without this a tool
            that prints ``\\boxed{42}`` would be graded as the model's answer. Off by default (single-turn runs).
        kwargs: anything else verl passes (reward_router_address, ...) is ignored.

    Returns:
        ``{"score", "acc", "pred", "think_closed", "reward_error", "reward_timeout", "reward_queue_s"}``
        (``reward_queue_s``: seconds this call waited for a free grader process); see :func:`to_verl_dict`.
        A misconfigured reward_kwargs value raises at the first call, naming the key, rather than silently
        scoring 0.
    """
    if _as_bool("strip_tool_responses", strip_tool_responses) and isinstance(solution_str, str):
        solution_str = _strip(solution_str)
    result = grade(
        solution_str,
        ground_truth,
        data_source=data_source,
        think_gate=_as_bool("think_gate", think_gate),
        timeout_s=_as_timeout(timeout_s),
        multiple_choice_sources=_as_sources(multiple_choice_sources),
        max_workers=int(max_workers) if max_workers is not None else None,
    )
    return to_verl_dict(result)
