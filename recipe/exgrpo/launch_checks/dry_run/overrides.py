"""Checkers 2 and 3 of the dry run: keys added with ``+``/``++`` outside the maps that take free keys, value types
against the defaults and the ranges of launch-critical verl keys."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from recipe.exgrpo.launch_checks.dry_run.compose import CONFIG_DIR, DEFAULT_CONFIG_NAME, base_config, suggest_key

#: Maps whose keys are free (they are passed on as **kwargs): adding a key under them with ``+``/``++`` is normal.
OPEN_MAPS: tuple[str, ...] = (
    "hydra",
    "ray_kwargs.ray_init",
    "reward.custom_reward_function.reward_kwargs",
    "actor_rollout_ref.model.override_config",
    "critic.model.override_config",
    "actor_rollout_ref.rollout.engine_kwargs",
    "actor_rollout_ref.actor.fsdp_config.mixed_precision",
    "actor_rollout_ref.ref.fsdp_config.mixed_precision",
    "data.apply_chat_template_kwargs",
    "data.mm_processor_kwargs",
)

#: Sections of verl's config whose dataclass reads fields the yaml does not list (a ``+`` key there that names a field
#: is read, not ignored): section -> ``module:Class``.
DATACLASS_SECTIONS: dict[str, str] = {
    "actor_rollout_ref.rollout": "verl.workers.config.rollout:RolloutConfig",
}


def _dataclass_field(key: str) -> bool:
    """``key`` is a field that verl's dataclass of its section reads, though its yaml omits it (e.g.
    ``actor_rollout_ref.rollout.enable_sleep_mode``)."""
    import dataclasses
    import importlib

    section, _, name = key.rpartition(".")
    target = DATACLASS_SECTIONS.get(section)
    if target is None:
        return False
    module, _, cls = target.partition(":")
    try:
        fields = {f.name for f in dataclasses.fields(getattr(importlib.import_module(module), cls))}
    except (ImportError, AttributeError, TypeError):
        return False
    return name in fields


#: Launch-critical verl keys and their allowed ranges: (low, high, low_open, high_open); None = unbounded.
#: verl itself checks few of these before its workers start, so a wrong one costs a cluster allocation.
VERL_RANGES: dict[str, tuple[float | None, float | None, bool, bool]] = {
    "data.train_batch_size": (1, None, False, False),
    "data.max_prompt_length": (1, None, False, False),
    "data.max_response_length": (1, None, False, False),
    "actor_rollout_ref.rollout.n": (1, None, False, False),
    "actor_rollout_ref.rollout.temperature": (0.0, None, True, False),
    "actor_rollout_ref.rollout.top_p": (0.0, 1.0, True, False),
    "actor_rollout_ref.rollout.gpu_memory_utilization": (0.0, 1.0, True, False),
    "actor_rollout_ref.rollout.tensor_model_parallel_size": (1, None, False, False),
    "actor_rollout_ref.rollout.data_parallel_size": (1, None, False, False),
    "actor_rollout_ref.rollout.pipeline_model_parallel_size": (1, None, False, False),
    "actor_rollout_ref.rollout.val_kwargs.top_p": (0.0, 1.0, True, False),
    "actor_rollout_ref.rollout.val_kwargs.temperature": (0.0, None, False, False),
    "actor_rollout_ref.rollout.val_kwargs.n": (1, None, False, False),
    "actor_rollout_ref.actor.ppo_mini_batch_size": (1, None, False, False),
    "actor_rollout_ref.actor.ppo_max_token_len_per_gpu": (1, None, False, False),
    "actor_rollout_ref.actor.ppo_epochs": (1, None, False, False),
    "actor_rollout_ref.actor.optim.lr": (0.0, None, True, False),
    "actor_rollout_ref.actor.optim.weight_decay": (0.0, None, False, False),
    "actor_rollout_ref.actor.entropy_coeff": (0.0, None, False, False),
    "actor_rollout_ref.actor.clip_ratio": (0.0, None, False, False),
    "actor_rollout_ref.actor.grad_clip": (0.0, None, True, False),
    "actor_rollout_ref.actor.loss_scale_factor": (0.0, None, True, False),
    "actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu": (1, None, False, False),
    "trainer.nnodes": (1, None, False, False),
    "trainer.n_gpus_per_node": (1, None, False, False),
    "trainer.total_training_steps": (1, None, False, False),
    "trainer.test_freq": (-1, None, False, False),
    "trainer.save_freq": (-1, None, False, False),
}


# --------------------------------------------------------------------------------------------- override checks
_ABSENT = object()


def _select(cfg: DictConfig, key: str) -> tuple[bool, Any]:
    """(found, value) with interpolations resolved; (False, None) when the key is absent or does not resolve."""
    try:
        value = OmegaConf.select(cfg, key, default=_ABSENT, throw_on_missing=False)
    except Exception:  # an interpolation that does not resolve is reported by the resolution check
        return False, None
    return (False, None) if value is _ABSENT else (True, value)


def _under(key: str, prefixes: Iterable[str]) -> bool:
    return any(key == p or key.startswith(p + ".") for p in prefixes)


def _type_problem(key: str, default: Any, value: Any) -> str | None:
    """A value of the wrong kind for a key whose default is a bool or a number (None is always allowed).

    An integer default only asks for a number: verl writes some float settings with integer defaults
    (``rollout.top_p: 1``), so ``top_p=0.95`` must pass; an integer-only key with a fraction is left to verl.
    """
    if value is None or default is None:
        return None
    if isinstance(default, bool):
        if not isinstance(value, bool):
            return f"{key} must be true or false (default {default}), got {value!r}"
    elif isinstance(default, (int, float)):
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            kind = "an integer" if isinstance(default, int) else "a number"
            return f"{key} must be {kind} (default {default}), got {value!r}"
    return None


def _range_problem(key: str, value: Any) -> str | None:
    lo, hi, lo_open, hi_open = VERL_RANGES[key]
    if value is None or isinstance(value, bool) or not isinstance(value, (int, float)):
        return None  # the type check reports it
    bad = (lo is not None and (value < lo or (lo_open and value == lo))) or (
        hi is not None and (value > hi or (hi_open and value == hi))
    )
    if not bad:
        return None
    left = "-inf" if lo is None else f"{lo:g}"
    right = "inf" if hi is None else f"{hi:g}"
    rng = f"{'(' if lo_open or lo is None else '['}{left}, {right}{')' if hi_open or hi is None else ']'}"
    return f"{key} must be in {rng}, got {value!r}"


def check_overrides(
    overrides: Sequence[str],
    composed: DictConfig,
    config_name: str = DEFAULT_CONFIG_NAME,
    config_dir: Path = CONFIG_DIR,
    allow_new_keys: Sequence[str] = (),
) -> list[str]:
    """Problems hydra lets through: new keys outside the open maps, values of the wrong type, out-of-range values."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    base = base_config(config_name, str(config_dir))
    problems: list[str] = []
    for ov in OverridesParser.create().parse_overrides(list(overrides)):
        key = ov.key_or_group
        if "/" in key or "@" in key or ov.package or _under(key, ("hydra", "exgrpo")):
            continue  # config-group choices; hydra settings; the exgrpo block is checked by ExGRPOConfig
        in_base, default = _select(base, key)
        if ov.is_delete():
            continue
        if (ov.is_add() or ov.is_force_add()) and not in_base:
            if (
                _under(key, OPEN_MAPS)
                or _under(key, allow_new_keys)
                or _parent_is_empty_map(base, key)
                or _dataclass_field(key)
            ):
                continue
            hint = suggest_key(key, config_name, str(config_dir))
            problems.append(
                f"new key +{key} is not a key of the config{f' (did you mean {hint}?)' if hint else ''}; verl "
                "would silently ignore it (pass --allow-new-key PREFIX / DRY_RUN_ALLOW_NEW_KEYS if it is meant)"
            )
            continue
        found, value = _select(composed, key)
        if not found:
            continue
        if in_base:
            problem = _type_problem(key, default, value)
            if problem:
                problems.append(problem)
                continue
    for key in VERL_RANGES:
        found, value = _select(composed, key)
        if found:
            problem = _range_problem(key, value)
            if problem:
                problems.append(problem)
    return problems


def _parent_is_empty_map(base: DictConfig, key: str) -> bool:
    parent = key.rpartition(".")[0]
    found, node = _select(base, parent) if parent else (False, None)
    return found and isinstance(node, DictConfig) and len(node) == 0
