"""Checker 1 of the dry run: compose the launch config as ``@hydra.main`` would (override syntax, unknown keys
with a did-you-mean), and the base config the other checkers compare against."""

from __future__ import annotations

import difflib
import re
from collections.abc import Sequence
from functools import lru_cache
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from recipe.exgrpo.launch_checks.dry_run.report import DryRunError

RECIPE_DIR = Path(__file__).resolve().parents[2]
CONFIG_DIR = RECIPE_DIR / "config"
DEFAULT_CONFIG_NAME = "exgrpo_trainer"
RECIPE_REWARD_FILE = RECIPE_DIR / "reward.py"


# ----------------------------------------------------------------------------------------------- composition
def _compose_raw(overrides: Sequence[str], config_name: str, config_dir: Path) -> DictConfig:
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    if GlobalHydra.instance().is_initialized():
        GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(config_dir), version_base=None):
        return compose(config_name=config_name, overrides=list(overrides))


@lru_cache(maxsize=4)
def base_config(config_name: str = DEFAULT_CONFIG_NAME, config_dir: str = str(CONFIG_DIR)) -> DictConfig:
    """The config without overrides: the reference for key suggestions and value types (cached; do not mutate)."""
    cfg = _compose_raw([], config_name, Path(config_dir))
    OmegaConf.set_readonly(cfg, True)
    return cfg


@lru_cache(maxsize=4)
def _key_paths(config_name: str, config_dir: str) -> tuple[str, ...]:
    out: list[str] = []

    def walk(node: Any, prefix: str) -> None:
        if isinstance(node, dict):
            for key, value in node.items():
                path = f"{prefix}.{key}" if prefix else str(key)
                out.append(path)
                walk(value, path)

    walk(OmegaConf.to_container(base_config(config_name, config_dir), resolve=False), "")
    return tuple(out)


def _exgrpo_fields() -> list[str]:
    from exgrpo.config import ExGRPOConfig

    return [name for name in ExGRPOConfig.key_names() if name != "k"]


def suggest_key(key: str, config_name: str = DEFAULT_CONFIG_NAME, config_dir: str = str(CONFIG_DIR)) -> str | None:
    """The existing key a mistyped ``key`` most likely meant: a close sibling, the same name under another parent,
    or a close full path. None when nothing is close."""
    paths = _key_paths(config_name, config_dir)
    parent, _, leaf = key.rpartition(".")
    siblings = [p.rpartition(".")[2] for p in paths if p.rpartition(".")[0] == parent]
    if parent == "exgrpo":
        siblings = sorted(set(siblings) | set(_exgrpo_fields()))
    close = difflib.get_close_matches(leaf, siblings, n=1, cutoff=0.6)
    if close:
        return f"{parent}.{close[0]}" if parent else close[0]
    same_leaf = [p for p in paths if p.rpartition(".")[2] == leaf and p != key]
    if same_leaf:
        return difflib.get_close_matches(key, same_leaf, n=1, cutoff=0.0)[0]
    close = difflib.get_close_matches(key, paths, n=1, cutoff=0.8)
    return close[0] if close else None


def _unknown_key_problem(key: str, config_name: str, config_dir: str) -> str:
    parent, _, leaf = key.rpartition(".")
    if parent == "exgrpo" and leaf in _exgrpo_fields():
        return (
            f"unknown key {key}: it is an ExGRPOConfig field that config/{config_name}.yaml does not list; "
            f"pass it as +{key}=VALUE"
        )
    hint = suggest_key(key, config_name, config_dir)
    did_you_mean = f" (did you mean {hint}?)" if hint else ""
    return f"unknown key {key}{did_you_mean}; to add a new key on purpose write +{key}=VALUE"


def compose_config(
    overrides: Sequence[str], config_name: str = DEFAULT_CONFIG_NAME, config_dir: Path = CONFIG_DIR
) -> DictConfig:
    """Compose the config as the entry point's ``@hydra.main`` would; hydra's errors become ``DryRunError``."""
    from hydra.errors import ConfigCompositionException, MissingConfigException, OverrideParseException

    try:
        return _compose_raw(overrides, config_name, config_dir)
    except OverrideParseException as e:
        raise DryRunError([f"bad override syntax: {e}"]) from e
    except MissingConfigException as e:
        raise DryRunError([f"config not found: {e}"]) from e
    except ConfigCompositionException as e:
        cause = e.__cause__
        full_key = getattr(cause, "full_key", None)
        match = re.search(r"Could not override '([^']+)'", str(e))
        if match and "not in struct" in str(cause):
            raise DryRunError([_unknown_key_problem(match.group(1), config_name, str(config_dir))]) from e
        detail = f" ({full_key})" if full_key else ""
        raise DryRunError([f"hydra could not compose the config{detail}: {e}" + (f": {cause}" if cause else "")]) from e
