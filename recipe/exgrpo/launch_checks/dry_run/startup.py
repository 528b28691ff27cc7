"""Checker 4 of the dry run: the entry point's own start-up, as ``main_exgrpo.main`` runs it before Ray."""

from __future__ import annotations

import contextlib
import sys
from typing import Any

from omegaconf import DictConfig


# ------------------------------------------------------------------------------------------- start-up checks
@contextlib.contextmanager
def stdout_to_stderr():
    """verl's checks print progress lines; keep stdout for the resolved config."""
    with contextlib.redirect_stdout(sys.stderr):
        yield


def error_text(e: BaseException) -> str:
    text = str(e).strip() or type(e).__name__
    return text if isinstance(e, (ValueError, KeyError)) else f"{type(e).__name__}: {text}"


def run_entry_point_checks(config: DictConfig) -> tuple[Any, list[str]]:
    """What ``main_exgrpo.main`` runs before Ray: device detection, ``prepare_config``, verl's ``validate_config``.

    Returns (ExGRPOConfig or None, problems). ``config`` is modified like the entry point modifies it.
    """
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import validate_config
    from verl.utils.device import auto_set_device

    from exgrpo.config import ConfigError
    from recipe.exgrpo.config_bridge import exgrpo_config_from_hydra
    from recipe.exgrpo.main_exgrpo import prepare_config

    problems: list[str] = []
    exgrpo = None
    with stdout_to_stderr():
        auto_set_device(config)
        try:
            prepare_config(config)
            exgrpo = exgrpo_config_from_hydra(config)
        except ConfigError as e:  # every problem of the exgrpo block and every unsupported verl setting
            return None, list(e.problems)
        except Exception as e:  # prepare_config's own checks (use_v1, CPU backend) raise ValueError with the key
            return None, [error_text(e)]
        try:
            validate_config(
                config=config, use_reference_policy=need_reference_policy(config), use_critic=need_critic(config)
            )
        except Exception as e:
            if not _vllm_lora_rank_unchecked_here(config, e):
                problems.append(f"verl validate_config: {error_text(e)}")
    return exgrpo, problems


def _vllm_lora_rank_unchecked_here(config: DictConfig, error: Exception) -> bool:
    """verl's last check, vLLM's LoRA rank (an adapter synced to a vLLM rollout), imports vLLM, which a machine that
    only prepares the launch may not have: there the check cannot run, and ``recipe/exgrpo/lora.py`` checks the
    same bound (every check before it has passed)."""
    import importlib.util

    from recipe.exgrpo.lora import LoraSettings

    lora = LoraSettings.of(config)
    return (
        lora.adapter_sync
        and lora.rollout == "vllm"
        and importlib.util.find_spec("vllm") is None
        and "vllm version" in str(error)
    )
