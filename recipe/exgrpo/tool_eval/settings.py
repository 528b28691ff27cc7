"""What a tool-calling evaluation takes from training: the tool file, the tool-call parser, the turn limits, the tool
answer's cut, the prompt and response lengths and the chat template's extras, read from the training run's own
hydra overrides composed with the recipe's config, as verl's agent-loop workers read them."""

from __future__ import annotations

import copy
import functools
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

CONFIG_DIR = Path(__file__).resolve().parents[1] / "config"
CONFIG_NAME = "exgrpo_trainer"
MT = "actor_rollout_ref.rollout.multi_turn"
WORKER_ENV = "ray_kwargs.ray_init.runtime_env.env_vars"
TOOL_ENV_PREFIX = "EXGRPO_SANDBOX_"
#: the evaluation's flags and the training keys they set (``--tools FILE`` is ``multi_turn.function_tool_path``)
FLAG_KEYS = {
    "tools": f"{MT}.function_tool_path",
    "tool_format": f"{MT}.format",
    "max_user_turns": f"{MT}.max_user_turns",
    "max_assistant_turns": f"{MT}.max_assistant_turns",
    "max_parallel_calls": f"{MT}.max_parallel_calls",
    "max_tool_response_length": f"{MT}.max_tool_response_length",
    "tool_response_truncate_side": f"{MT}.tool_response_truncate_side",
    "max_prompt_length": "data.max_prompt_length",
    "max_response_length": "data.max_response_length",
}


@dataclass
class ToolLoopSettings:
    """The settings of verl's tool agent loop the evaluation runs (names as in ``actor_rollout_ref.rollout``)."""

    function_tool_path: str
    format: str = "hermes"
    max_user_turns: int | None = None
    max_assistant_turns: int | None = None
    max_parallel_calls: int = 1
    max_tool_response_length: int = 256
    tool_response_truncate_side: str = "middle"
    prompt_length: int = 512  # rollout.prompt_length = data.max_prompt_length
    response_length: int = 512  # rollout.response_length = data.max_response_length: the whole exchange
    apply_chat_template_kwargs: dict[str, Any] = field(default_factory=dict)  # data.apply_chat_template_kwargs
    custom_chat_template: str | None = None  # actor_rollout_ref.model.custom_chat_template
    #: the tool's environment in training's workers: the ``EXGRPO_SANDBOX_*`` limits of the Ray job's runtime_env
    #: (``ray_kwargs.ray_init.runtime_env.env_vars``), which the Python tool reads on every call
    tool_env: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.function_tool_path:
            raise ValueError(f"{MT}.function_tool_path: no tool file (the evaluation with tools needs --tools FILE)")
        if not Path(self.function_tool_path).is_file():
            raise ValueError(f"{MT}.function_tool_path={self.function_tool_path}: no such file")
        for name in ("max_parallel_calls", "max_tool_response_length", "prompt_length", "response_length"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {getattr(self, name)!r}")
        if self.tool_response_truncate_side not in ("left", "right", "middle"):
            side = self.tool_response_truncate_side
            raise ValueError(f"{MT}.tool_response_truncate_side must be left, right or middle, got {side!r}")

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ToolLoopSettings:
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in known})

    def rollout_config(self) -> Any:
        """The config verl's ``ToolAgentLoop`` reads (``trainer_config``): the rollout's multi-turn block and lengths
        and the data block's template extras, nothing else."""
        return OmegaConf.create(
            {
                "actor_rollout_ref": {
                    "rollout": {
                        "prompt_length": self.prompt_length,
                        "response_length": self.response_length,
                        "full_determinism": False,
                        "multi_turn": {
                            "enable": True,
                            "format": self.format,
                            "function_tool_path": self.function_tool_path,
                            "max_user_turns": self.max_user_turns,
                            "max_assistant_turns": self.max_assistant_turns,
                            "max_parallel_calls": self.max_parallel_calls,
                            "max_tool_response_length": self.max_tool_response_length,
                            "tool_response_truncate_side": self.tool_response_truncate_side,
                        },
                    }
                },
                "data": {"apply_chat_template_kwargs": dict(self.apply_chat_template_kwargs)},
            }
        )


def compose_training_config(overrides: Sequence[str]) -> Any:
    """The recipe's config with a training run's hydra overrides, as ``@hydra.main`` composes it (no file read; a
    copy of the last few compositions, which take seconds)."""
    return copy.deepcopy(_composed(tuple(overrides)))


@functools.lru_cache(maxsize=8)
def _composed(overrides: tuple[str, ...]) -> Any:
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    if GlobalHydra.instance().is_initialized():
        GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base=None):
        return compose(config_name=CONFIG_NAME, overrides=list(overrides))


def settings_from_training(overrides: Sequence[str], flags: dict[str, Any] | None = None) -> ToolLoopSettings:
    """The tool loop's settings of a training run given by its hydra ``overrides`` (the launch script's, or the
    calculator task's), with the evaluation's explicit ``flags`` (``FLAG_KEYS``) on top. Any other key of the
    overrides (model, data, trainer) is composed and ignored."""
    extra = [f"{FLAG_KEYS[name]}={_hydra(value)}" for name, value in (flags or {}).items() if value is not None]
    cfg = compose_training_config([*overrides, *extra])
    mt = cfg.actor_rollout_ref.rollout.multi_turn
    path = mt.function_tool_path
    return ToolLoopSettings(
        function_tool_path=str(Path(path).resolve()) if path else "",
        format=str(mt.format),
        max_user_turns=mt.max_user_turns,
        max_assistant_turns=mt.max_assistant_turns,
        max_parallel_calls=int(mt.max_parallel_calls),
        max_tool_response_length=int(mt.max_tool_response_length),
        tool_response_truncate_side=str(mt.tool_response_truncate_side),
        prompt_length=int(cfg.actor_rollout_ref.rollout.prompt_length),
        response_length=int(cfg.actor_rollout_ref.rollout.response_length),
        apply_chat_template_kwargs=_plain(cfg.data.get("apply_chat_template_kwargs")),
        custom_chat_template=OmegaConf.select(cfg, "actor_rollout_ref.model.custom_chat_template", default=None),
        tool_env={
            str(k): str(v)
            for k, v in _plain(OmegaConf.select(cfg, WORKER_ENV, default=None)).items()
            if str(k).startswith(TOOL_ENV_PREFIX)
        },
    )


def _plain(node: Any) -> dict[str, Any]:
    return OmegaConf.to_container(node, resolve=True) if OmegaConf.is_config(node) else dict(node or {})


def _hydra(value: Any) -> str:
    """A flag's value as a hydra override value (a path quoted, so that '=' or ',' in it stay characters)."""
    if isinstance(value, str) and value not in ("null",):
        return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"
    return str(value)
