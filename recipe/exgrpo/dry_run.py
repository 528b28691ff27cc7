"""Dry run of an ExGRPO launch: compose the full hydra config of a launch and validate it, launching nothing.

    python -m recipe.exgrpo.dry_run [options] [hydra overrides ...]

It composes ``config/exgrpo_trainer.yaml`` (verl's ``ppo_trainer`` plus the ``exgrpo:`` block) with the given
overrides through hydra's compose API, exactly as ``python -m recipe.exgrpo.main_exgrpo OVERRIDES`` would, then runs
every check that needs neither GPUs, Ray, a model nor the data:

1. hydra itself: override syntax, unknown keys (hydra's struct mode), with a did-you-mean found here;
2. keys added with ``+``/``++`` outside the maps that take free keys (a typo there is silently ignored by verl);
3. value types against the defaults (``trainer.n_gpus_per_node=eight``) and ranges of launch-critical verl keys;
4. the entry point's own start-up: ``main_exgrpo.prepare_config`` (recipe defaults, the ``exgrpo`` block through
   ``ExGRPOConfig``, the verl settings the recipe would ignore) and verl's ``validate_config``, as
   ``main_exgrpo.main`` runs them;
5. what verl only checks after Ray has started: the rollout and algorithm dataclasses, the custom reward function
   and dataset class can be loaded, ``reward_kwargs`` are parameters of the recipe's reward, the GPUs split into
   whole vLLM replicas, the dynamic-batch token budgets hold one full sequence, every interpolation resolves;
6. what verl skips with dynamic batch size on: a step's B x K responses and a mini-batch's responses split evenly
   over the data-parallel ranks;
7. with ``--check-paths``: the model directory and the data files exist, and the data's prompts suit the chat
   template (the Llama-3.1-8B base prompt with the verbatim template, chat rows otherwise);
8. the GPU memory of generation: the FSDP actor's resident state per GPU plus vLLM's ``gpu_memory_utilization``
   share of the card (``recipe/exgrpo/memory_estimate.py``; ``--gpu-memory-gib``, ``--model-params``): a warning
   naming the setting and a value that fits when the sum nears the card's memory.

All problems found are reported together, each naming its key. Exit status: 0 valid, 1 invalid, 2 bad usage.
The launch scripts under ``scripts/train`` call this with ``DRY_RUN=1`` (see docs/launch_scripts.md).
"""

from __future__ import annotations

import argparse
import contextlib
import difflib
import inspect
import os
import re
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, ListConfig, OmegaConf

CONFIG_DIR = Path(__file__).resolve().parent / "config"
DEFAULT_CONFIG_NAME = "exgrpo_trainer"
RECIPE_REWARD_FILE = Path(__file__).resolve().parent / "reward.py"

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


class DryRunError(ValueError):
    """The composed config would not launch; ``problems`` holds one message per problem, each naming its key."""

    def __init__(self, problems: Sequence[str]):
        self.problems = list(problems)
        n = len(self.problems)
        super().__init__(f"{n} problem{'s' if n != 1 else ''}:\n" + "\n".join(f"  - {p}" for p in self.problems))


@dataclass
class DryRunReport:
    """A valid launch: the composed config (recipe defaults filled in, interpolations kept) and its ExGRPO block."""

    config: DictConfig
    exgrpo: Any  # exgrpo.config.ExGRPOConfig
    overrides: list[str]
    notes: list[str] = field(default_factory=list)
    #: not errors, but likely to fail on the cluster (the GPU memory estimate)
    warnings: list[str] = field(default_factory=list)

    def resolved_yaml(self) -> str:
        return OmegaConf.to_yaml(self.config, resolve=True)

    def summary(self) -> str:
        c, x = self.config, self.exgrpo
        k = int(c.actor_rollout_ref.rollout.n)
        b = int(c.data.train_batch_size)
        parts = [
            f"experiment={c.trainer.project_name}/{c.trainer.experiment_name}",
            f"model={c.actor_rollout_ref.model.path}",
            f"gpus={c.trainer.nnodes}x{c.trainer.n_gpus_per_node}",
            f"rollout={c.actor_rollout_ref.rollout.name}(tp={c.actor_rollout_ref.rollout.tensor_model_parallel_size})",
            f"B={b} K={k} steps={c.trainer.total_training_steps or f'{c.trainer.total_epochs} epochs'}",
        ]
        reward_kwargs = c.reward.custom_reward_function.get("reward_kwargs") or {}
        if "think_gate" in reward_kwargs:
            parts.append(f"think_gate={reward_kwargs.think_gate}")
        if x.enable:
            sigma = f"{x.resolved_sigma:g}" + (" (1/K)" if x.sigma is None else "")
            parts.append(
                f"exgrpo: rho={x.replay_ratio:g} (replay {int(x.replay_ratio * b)} of {b} questions) "
                + (f"tau={x.delayed_start_threshold:g} " if x.reward_mode == "binary" else "")
                + f"weighting={x.weighting}(mu={x.mu:g}, sigma={sigma}) "
                f"trajectory={x.trajectory_metric}/{x.trajectory_mode} shaping={x.shaping}(beta={x.shaping_beta:g}) "
                f"is_correction={x.is_correction}"
            )
        else:
            parts.append("exgrpo: disabled (on-policy Dr.GRPO baseline)")
        parts += reward_summary(c, x)
        return "  ".join(parts)


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
    import dataclasses

    from exgrpo.config import ExGRPOConfig

    return [f.name for f in dataclasses.fields(ExGRPOConfig) if f.name != "k"]


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
            if _under(key, OPEN_MAPS) or _under(key, allow_new_keys) or _parent_is_empty_map(base, key):
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


# ------------------------------------------------------------------------------------------- start-up checks
@contextlib.contextmanager
def _stdout_to_stderr():
    """verl's checks print progress lines; keep stdout for the resolved config."""
    with contextlib.redirect_stdout(sys.stderr):
        yield


def _error_text(e: BaseException) -> str:
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
    with _stdout_to_stderr():
        auto_set_device(config)
        try:
            prepare_config(config)
            exgrpo = exgrpo_config_from_hydra(config)
        except ConfigError as e:  # every problem of the exgrpo block and every unsupported verl setting
            return None, list(e.problems)
        except Exception as e:  # prepare_config's own checks (use_v1, CPU backend) raise ValueError with the key
            return None, [_error_text(e)]
        try:
            validate_config(
                config=config, use_reference_policy=need_reference_policy(config), use_critic=need_critic(config)
            )
        except Exception as e:
            problems.append(f"verl validate_config: {_error_text(e)}")
    return exgrpo, problems


def run_worker_checks(config: DictConfig) -> list[str]:
    """Checks verl runs only after Ray and the workers have started, done here without GPUs."""
    from verl.utils.config import omega_conf_to_dataclass

    problems: list[str] = []
    rollout = config.actor_rollout_ref.rollout
    if OmegaConf.is_missing(rollout, "name"):
        problems.append("actor_rollout_ref.rollout.name is not set (vllm on GPUs; hf on the CPU backend)")
    else:
        with _stdout_to_stderr():
            for key in ("actor_rollout_ref.rollout", "algorithm"):
                try:
                    omega_conf_to_dataclass(OmegaConf.select(config, key))
                except Exception as e:
                    problems.append(f"{key}: {_error_text(e)}")

    try:
        OmegaConf.to_container(config, resolve=True, throw_on_missing=False)
    except Exception as e:
        problems.append(f"an interpolation does not resolve: {_error_text(e)}")
        return problems  # the checks below read resolved values

    # GPUs must split into whole rollout replicas (verl asserts this in its workers, after Ray start).
    n_gpus = int(config.trainer.nnodes) * int(config.trainer.n_gpus_per_node)
    replica = (
        int(rollout.tensor_model_parallel_size)
        * int(rollout.get("data_parallel_size", 1))
        * int(rollout.get("pipeline_model_parallel_size", 1))
    )
    if n_gpus % replica:
        problems.append(
            f"trainer.nnodes x trainer.n_gpus_per_node = {n_gpus} GPUs do not split into rollout replicas of "
            f"{replica} GPUs (actor_rollout_ref.rollout.tensor_model_parallel_size x data_parallel_size x "
            "pipeline_model_parallel_size)"
        )
    per_node = int(config.trainer.n_gpus_per_node)
    if replica > per_node and replica % per_node:
        problems.append(
            f"a rollout replica of {replica} GPUs spans nodes of {per_node} GPUs unevenly "
            "(actor_rollout_ref.rollout.tensor_model_parallel_size)"
        )

    # One full sequence must fit the dynamic-batch token budget (verl asserts it in the first update).
    seq_len = int(config.data.max_prompt_length) + int(config.data.max_response_length)
    actor = config.actor_rollout_ref.actor
    sp = int(actor.get("ulysses_sequence_parallel_size", 1) or 1)
    problems += check_batch_split(config, n_gpus, sp)
    budgets = []
    if actor.use_dynamic_bsz:
        budgets.append(("actor_rollout_ref.actor.ppo_max_token_len_per_gpu", int(actor.ppo_max_token_len_per_gpu)))
    if rollout.log_prob_use_dynamic_bsz:
        budgets.append(
            ("actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu", int(rollout.log_prob_max_token_len_per_gpu))
        )
    for key, budget in budgets:
        if budget * sp < seq_len:
            problems.append(
                f"{key} = {budget} cannot hold one sequence of data.max_prompt_length + data.max_response_length "
                f"= {seq_len} tokens"
            )
    mini, batch = int(actor.ppo_mini_batch_size), int(config.data.train_batch_size)
    if mini > batch:
        problems.append(
            f"actor_rollout_ref.actor.ppo_mini_batch_size ({mini}) must be <= data.train_batch_size ({batch})"
        )

    problems += _check_code_paths(config)
    return problems


def check_batch_split(config: DictConfig, n_gpus: int, sp: int) -> list[str]:
    """Each step's B x K responses and each mini-batch's responses must split evenly over the data-parallel ranks.

    verl's ``validate_config`` checks the first only without dynamic batch size (``use_dynamic_bsz=false``) and
    never the second; with dynamic batch size on (the released setting) a GPU count that does not divide them
    (``N_GPUS_PER_NODE=6``: 1024 responses over 6 ranks) passes start-up and fails at the first dispatch.
    """
    actor = config.actor_rollout_ref.actor
    k = int(config.actor_rollout_ref.rollout.n)
    batch, mini = int(config.data.train_batch_size), int(actor.ppo_mini_batch_size)
    if n_gpus % sp:
        return [
            f"trainer.nnodes x trainer.n_gpus_per_node = {n_gpus} GPUs are not a multiple of "
            f"actor_rollout_ref.actor.ulysses_sequence_parallel_size = {sp}"
        ]
    dp = n_gpus // sp
    gpus = f"{n_gpus} GPUs" + (f" / ulysses_sequence_parallel_size {sp}" if sp > 1 else "")
    problems = []
    for what, rows in (
        (f"data.train_batch_size x actor_rollout_ref.rollout.n = {batch} x {k}", batch * k),
        (f"actor_rollout_ref.actor.ppo_mini_batch_size x actor_rollout_ref.rollout.n = {mini} x {k}", mini * k),
    ):
        if rows % dp:
            near = sorted((d for d in range(1, 4 * dp + 1) if rows % d == 0), key=lambda d: (abs(d - dp), d))[:3]
            problems.append(
                f"{what} = {rows} responses do not split evenly over {dp} data-parallel ranks "
                f"(trainer.nnodes x trainer.n_gpus_per_node = {gpus}); verl does not check this with "
                "use_dynamic_bsz=true and would fail at the first step. Use a data-parallel size that divides "
                f"{rows} (the nearest: {', '.join(map(str, sorted(near)))})"
            )
    return problems


def _check_code_paths(config: DictConfig) -> list[str]:
    """The reward function and the dataset class load, and ``reward_kwargs`` name parameters of the reward."""
    from verl.trainer.ppo.reward import get_custom_reward_fn
    from verl.utils.import_utils import load_extern_object

    problems: list[str] = []
    fn_cfg = config.reward.custom_reward_function
    try:
        with _stdout_to_stderr():
            get_custom_reward_fn(config)
    except Exception as e:
        problems.append(f"reward.custom_reward_function ({fn_cfg.get('path')}:{fn_cfg.get('name')}): {_error_text(e)}")
    path = fn_cfg.get("path")
    if path and _is_recipe_reward(str(path)) and fn_cfg.get("name") == "compute_score":
        problems += check_reward_kwargs(dict(fn_cfg.get("reward_kwargs") or {}))

    cls_cfg = config.data.get("custom_cls") or {}
    if cls_cfg.get("path"):
        try:
            with _stdout_to_stderr():
                load_extern_object(module_path=cls_cfg.path, object_name=cls_cfg.name)
        except Exception as e:
            problems.append(f"data.custom_cls ({cls_cfg.path}:{cls_cfg.name}): {_error_text(e)}")
    return problems


def _is_recipe_reward(path: str) -> bool:
    if path.startswith("pkg://"):
        return path[len("pkg://") :] == "recipe.exgrpo.reward"
    try:
        return Path(path).resolve() == RECIPE_REWARD_FILE
    except OSError:
        return False


def check_reward_kwargs(reward_kwargs: dict[str, Any]) -> list[str]:
    """``reward_kwargs`` keys must be keyword parameters of the recipe's ``compute_score``: its ``**kwargs`` would
    otherwise swallow a typo (``think_gat=false`` would leave the think gate on)."""
    from recipe.exgrpo.reward import compute_score

    params = inspect.signature(compute_score).parameters
    names = [n for n, p in params.items() if p.kind is inspect.Parameter.KEYWORD_ONLY]
    problems = []
    for key, value in reward_kwargs.items():
        full = f"reward.custom_reward_function.reward_kwargs.{key}"
        if key not in names:
            close = difflib.get_close_matches(str(key), names, n=1, cutoff=0.6)
            hint = f" (did you mean reward_kwargs.{close[0]}?)" if close else ""
            problems.append(f"{full}: not a parameter of recipe/exgrpo/reward.py:compute_score{hint}; allowed: {names}")
        elif key == "think_gate" and not (
            isinstance(value, bool) or str(value).strip().lower() in {"1", "0", "true", "false", "yes", "no"}
        ):
            problems.append(f"{full} must be true or false, got {value!r}")
    return problems


def check_paths(config: DictConfig) -> list[str]:
    """The model directory and the data files exist (skips Hub ids and remote URLs), and the data's prompts suit
    the chat template (``check_prompt_style``)."""
    problems = []
    model = str(config.actor_rollout_ref.model.path)
    local_model = model.startswith(("/", ".", "~")) or os.path.exists(model)
    if local_model and not os.path.isdir(os.path.expanduser(model)):
        problems.append(f"actor_rollout_ref.model.path={model} is not a directory")
    for key in ("data.train_files", "data.val_files"):
        value = OmegaConf.select(config, key)
        files = list(value) if isinstance(value, (list, ListConfig)) else [value]
        for f in files:
            f = str(f)
            if "://" in f:
                continue
            if not os.path.isfile(os.path.expanduser(f)):
                problems.append(f"{key}: {f} is not a file")
            else:
                problems += check_prompt_style(key, os.path.expanduser(f), config)
    return problems


def _first_prompt(path: str) -> list[dict[str, Any]] | None:
    import pyarrow.parquet as pq

    try:
        pf = pq.ParquetFile(path)
        if "prompt" not in pf.schema_arrow.names or pf.metadata.num_rows == 0:
            return None
        value = pf.read_row_group(0, columns=["prompt"]).column("prompt")[0].as_py()
    except Exception:  # not parquet, or unreadable: verl reports it with its own message
        return None
    return value if isinstance(value, list) else None


def check_prompt_style(key: str, path: str, config: DictConfig) -> list[str]:
    """The Llama-3.1-8B base run renders the data's messages verbatim (``custom_chat_template`` =
    ``exgrpo.prompts.RAW_CHAT_TEMPLATE``): its files must hold the complete base-model prompt and no system
    message (made with ``--prompt-style llama_base``); and such files under a real chat template would have
    their "User: ... Answer:" text wrapped in chat markup. Either mismatch trains on other prompts than the
    paper's, silently, so it stops the launch. Only the first row of each file is read."""
    from exgrpo.prompts import RAW_CHAT_TEMPLATE

    messages = _first_prompt(path)
    if not messages:
        return []
    raw = OmegaConf.select(config, "actor_rollout_ref.model.custom_chat_template") == RAW_CHAT_TEMPLATE
    roles = [m.get("role") for m in messages if isinstance(m, dict)]
    content = str(messages[-1].get("content", "")) if isinstance(messages[-1], dict) else ""
    llama_style = roles == ["user"] and content.startswith("User: ") and content.endswith("step by step.\n")
    if raw and not llama_style:
        return [
            f"{key}: {path} holds chat prompts (roles {roles}), but actor_rollout_ref.model.custom_chat_template "
            "renders the Llama-3.1-8B base prompt verbatim: make the file with --prompt-style llama_base "
            "(PROMPT_STYLE=llama_base bash scripts/prepare_data.sh)"
        ]
    if llama_style and not raw:
        return [
            f"{key}: {path} holds Llama-3.1-8B base prompts (--prompt-style llama_base), but the model's chat "
            "template would wrap them; use the default --prompt-style chat for this backbone"
        ]
    return []


# ------------------------------------------------------------------------------- reward model (continuous mode)
#: The machine's GPUs per node, when the launch script knows them (scripts/train/exgrpo_qwen2.5_7b_base_wildchat_if.sh
#: exports it): a reward model in its own resource pool and the actor must then add up to it.
NODE_GPUS_ENV = "EXGRPO_GPUS_PER_NODE"
#: Rollout backends verl 0.9.1's reward loop can score a discriminative reward model with (reward_loop.py).
REWARD_MODEL_BACKENDS = ("vllm", "sglang")


def reward_model_problems(config: DictConfig, check_files: bool = False) -> list[str]:
    """A reward model (``reward.reward_model.enable``, the continuous mode, docs/algorithm.md §13) that verl would
    only reject after Ray started, or that would fail at the first scoring: its path and backend, whole replicas in
    its GPUs, those GPUs and the actor's adding up to the nodes, and a context that holds prompt + response."""
    rm = config.reward.reward_model
    if not rm.get("enable", False):
        return []
    problems: list[str] = []
    key = "reward.reward_model"
    path = rm.get("model_path")
    if not path:
        problems.append(f"{key}.model_path is not set: the reward model's Hugging Face directory (or Hub id)")
    elif check_files and str(path).startswith(("/", ".", "~")) and not os.path.isdir(os.path.expanduser(str(path))):
        problems.append(f"{key}.model_path={path} is not a directory")
    rollout = rm.rollout
    name = None if OmegaConf.is_missing(rollout, "name") else rollout.get("name")
    if name not in REWARD_MODEL_BACKENDS:
        problems.append(
            f"{key}.rollout.name={name!r}: the reward model is served by one of {list(REWARD_MODEL_BACKENDS)} "
            "(verl 0.9.1's reward loop scores discriminative models through them); set it, e.g. vllm"
        )
    replica = 1
    for part in ("tensor_model_parallel_size", "data_parallel_size", "pipeline_model_parallel_size"):
        replica *= int(rollout.get(part) or 1)
    actor_nodes, actor_per_node = int(config.trainer.nnodes), int(config.trainer.n_gpus_per_node)
    if rm.get("enable_resource_pool", False):
        nodes, per_node = int(rm.get("nnodes") or 0), int(rm.get("n_gpus_per_node") or 0)
        if nodes < 1 or per_node < 1:
            problems.append(
                f"{key}.enable_resource_pool=true needs {key}.nnodes >= 1 and {key}.n_gpus_per_node >= 1 (its own "
                f"GPUs), got {nodes} x {per_node}"
            )
            return problems
        where = f"its own pool of {key}.nnodes x {key}.n_gpus_per_node = {nodes} x {per_node}"
        node_gpus = os.environ.get(NODE_GPUS_ENV)
        if node_gpus and nodes == actor_nodes and actor_per_node + per_node != int(node_gpus):
            problems.append(
                f"the actor's trainer.n_gpus_per_node = {actor_per_node} and the reward model's {key}.n_gpus_per_node "
                f"= {per_node} add up to {actor_per_node + per_node} GPUs per node, but the nodes have {node_gpus} "
                f"({NODE_GPUS_ENV}, N_GPUS_PER_NODE of the launch script)"
            )
    else:
        nodes, per_node, where = actor_nodes, actor_per_node, f"the actor's {actor_nodes} x {actor_per_node} GPUs"
    gpus = nodes * per_node
    if gpus % replica or (replica > per_node and replica % per_node):
        problems.append(
            f"{key}: the reward model's replicas of {replica} GPUs ({key}.rollout.tensor_model_parallel_size x "
            f"data_parallel_size x pipeline_model_parallel_size) do not split {where} into whole replicas"
        )
    context = rollout.get("max_model_len")
    needed = int(config.data.max_prompt_length) + int(config.data.max_response_length)
    if context is not None and int(context) < needed:
        problems.append(
            f"{key}.rollout.max_model_len = {context} cannot hold a prompt and its response (data.max_prompt_length "
            f"+ data.max_response_length = {needed} tokens): the reward model would reject the longest responses"
        )
    return problems


def reward_summary(config: DictConfig, exgrpo: Any) -> list[str]:
    """The dry run's summary of the reward: the continuous mode's keys and where the reward model runs."""
    out = []
    if exgrpo is not None and exgrpo.reward_mode == "continuous":
        start = (
            f"after {exgrpo.continuous_start_steps} steps"
            if exgrpo.continuous_start == "steps"
            else f"mean reward > {exgrpo.continuous_start_reward:g}"
        )
        out.append(
            f"reward_mode=continuous(members={exgrpo.continuous_members}, epsilon={exgrpo.resolved_spread_epsilon:g}, "
            f"flat_std={exgrpo.flat_std:g}, start {start}, replay_reward={exgrpo.replay_reward})"
        )
    rm = config.reward.reward_model
    if rm.get("enable", False):
        rollout = rm.rollout
        tp = int(rollout.get("tensor_model_parallel_size") or 1)
        if rm.get("enable_resource_pool", False):
            pool = f"own pool {rm.nnodes}x{rm.n_gpus_per_node}"
            total = int(config.trainer.nnodes) * int(config.trainer.n_gpus_per_node) + int(rm.nnodes) * int(
                rm.n_gpus_per_node
            )
            pool += f", actor + reward model = {total} GPUs"
        else:
            pool = "colocated with the actor"
        name = None if OmegaConf.is_missing(rollout, "name") else rollout.name
        out.append(f"reward_model={rm.model_path} ({name}, tp={tp}, {pool})")
    else:
        fn = config.reward.custom_reward_function
        out.append(f"reward={fn.get('path')}:{fn.get('name')}")
    return out


# ---------------------------------------------------------------------------------------------------- driver
def dry_run(
    overrides: Sequence[str],
    config_name: str = DEFAULT_CONFIG_NAME,
    config_dir: Path = CONFIG_DIR,
    allow_new_keys: Sequence[str] = (),
    check_files: bool = False,
    card_gib: float | None = None,
    model_params: float | None = None,
) -> DryRunReport:
    """Compose and validate one launch; raises ``DryRunError`` listing every problem found.

    ``card_gib`` / ``model_params``: the GPU's memory and the model's parameter count for the memory estimate
    (default: ``GPU_MEMORY_GIB`` or 80; ``MODEL_PARAMS``, else the model's config.json, else the known backbones).
    """
    for o in overrides:
        if "\n" in o:
            raise DryRunError([f"override {o.splitlines()[0]!r}... contains a newline"])
    config = compose_config(overrides, config_name, config_dir)
    problems = check_overrides(overrides, config, config_name, config_dir, allow_new_keys)
    exgrpo, startup = run_entry_point_checks(config)
    problems += startup
    # The worker checks read the values as numbers and need the recipe defaults prepare_config fills in: they run
    # once everything before is clean (a wrong type would only repeat itself as a follow-on error there).
    if exgrpo is not None and not problems:
        problems += run_worker_checks(config)
    if check_files:
        problems += check_paths(config)
    problems += reward_model_problems(config, check_files) if exgrpo is not None else []
    if problems:
        raise DryRunError(problems)
    notes, warnings = [], []
    if exgrpo.enable and int(exgrpo.replay_ratio * int(config.data.train_batch_size)) == 0:
        notes.append("exgrpo.replay_ratio x data.train_batch_size < 1: no question will ever be replayed")
    estimate, why_not = generation_memory(config, card_gib, model_params)
    if estimate is not None:
        warning = estimate.warning()
        (warnings if warning else notes).append(warning or estimate.summary())
    elif why_not and str(config.actor_rollout_ref.rollout.name) == "vllm":
        notes.append(f"no GPU memory estimate: {why_not}")
    return DryRunReport(config=config, exgrpo=exgrpo, overrides=list(overrides), notes=notes, warnings=warnings)


def generation_memory(config: DictConfig, card_gib: float | None = None, model_params: float | None = None):
    """The memory estimate of a valid config, with the settings' environment defaults (``memory_estimate``)."""
    from recipe.exgrpo.memory_estimate import (
        CARD_GIB_ENV,
        DEFAULT_CARD_GIB,
        MODEL_PARAMS_ENV,
        MemoryEstimateError,
        estimate_generation_memory,
        parse_count,
    )

    try:
        if card_gib is None:
            text = os.environ.get(CARD_GIB_ENV) or str(DEFAULT_CARD_GIB)
            try:
                card_gib = float(text)
            except ValueError:
                raise MemoryEstimateError(f"{CARD_GIB_ENV}={text!r}: give the GPU's memory in GiB, e.g. 80") from None
        if model_params is None and os.environ.get(MODEL_PARAMS_ENV):
            model_params = parse_count(os.environ[MODEL_PARAMS_ENV])
        return estimate_generation_memory(config, card_gib=card_gib, model_params=model_params)
    except MemoryEstimateError as e:
        raise DryRunError([str(e)]) from None


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m recipe.exgrpo.dry_run",
        description="Compose the full hydra config of an ExGRPO launch and validate it without launching anything.",
    )
    p.add_argument("overrides", nargs="*", help="hydra overrides, as given to recipe.exgrpo.main_exgrpo")
    p.add_argument("--config-name", default=DEFAULT_CONFIG_NAME, help="config in recipe/exgrpo/config")
    p.add_argument("--config-dir", default=str(CONFIG_DIR), help=argparse.SUPPRESS)
    p.add_argument("--quiet", "-q", action="store_true", help="do not print the resolved config (summary only)")
    p.add_argument("--output", "-o", help="also write the resolved config (YAML) to this file")
    p.add_argument(
        "--allow-new-key",
        action="append",
        default=[],
        metavar="PREFIX",
        help="accept +KEY additions under PREFIX (repeatable; also DRY_RUN_ALLOW_NEW_KEYS=a,b)",
    )
    p.add_argument("--check-paths", action="store_true", help="also require the model dir and data files to exist")
    p.add_argument(
        "--gpu-memory-gib",
        type=float,
        default=None,
        help="memory of one GPU for the generation-memory estimate (default: $GPU_MEMORY_GIB, else 80)",
    )
    p.add_argument(
        "--model-params",
        default=None,
        help="parameter count for the estimate, e.g. 7.6e9 or 7.6B (default: $MODEL_PARAMS, else the model's "
        "config.json, else the known backbones)",
    )
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    allow = list(args.allow_new_key) + [p for p in os.environ.get("DRY_RUN_ALLOW_NEW_KEYS", "").split(",") if p.strip()]
    try:
        from recipe.exgrpo.memory_estimate import parse_count

        report = dry_run(
            args.overrides,
            config_name=args.config_name,
            config_dir=Path(args.config_dir),
            allow_new_keys=allow,
            check_files=args.check_paths,
            card_gib=args.gpu_memory_gib,
            model_params=parse_count(args.model_params) if args.model_params is not None else None,
        )
    except (DryRunError, ValueError) as e:
        print(f"[dry-run] FAILED: {e}", file=sys.stderr)
        return 1
    text = report.resolved_yaml()
    if not args.quiet:
        sys.stdout.write(text)
        sys.stdout.flush()
    if args.output:
        Path(args.output).write_text(text, encoding="utf-8")
    for note in report.notes:
        print(f"[dry-run] note: {note}", file=sys.stderr)
    for warning in report.warnings:
        print(f"[dry-run] warning: {warning}", file=sys.stderr)
    print(f"[dry-run] OK  {report.summary()}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
