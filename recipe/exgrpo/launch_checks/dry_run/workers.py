"""Checkers 5 and 6 of the dry run: what verl only checks once Ray and its workers run (the rollout and algorithm
dataclasses, whole replicas, token budgets, interpolations, the reward function and dataset class), and the batch
split over the data-parallel ranks that verl skips with dynamic batch size."""

from __future__ import annotations

import difflib
import inspect
import os
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from recipe.exgrpo.launch_checks.dry_run.compose import RECIPE_REWARD_FILE
from recipe.exgrpo.launch_checks.dry_run.startup import error_text, stdout_to_stderr


def run_worker_checks(config: DictConfig) -> list[str]:
    """Checks verl runs only after Ray and the workers have started, done here without GPUs."""
    from verl.utils.config import omega_conf_to_dataclass

    problems: list[str] = []
    rollout = config.actor_rollout_ref.rollout
    if OmegaConf.is_missing(rollout, "name"):
        problems.append("actor_rollout_ref.rollout.name is not set (vllm on GPUs; hf on the CPU backend)")
    else:
        with stdout_to_stderr():
            for key in ("actor_rollout_ref.rollout", "algorithm"):
                try:
                    omega_conf_to_dataclass(OmegaConf.select(config, key))
                except Exception as e:
                    problems.append(f"{key}: {error_text(e)}")

    try:
        OmegaConf.to_container(config, resolve=True, throw_on_missing=False)
    except Exception as e:
        problems.append(f"an interpolation does not resolve: {error_text(e)}")
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
                + _reward_model_gpus(config, sp, (batch * k, mini * k))
            )
    return problems


def _reward_model_gpus(config: DictConfig, sp: int, counts: tuple[int, ...]) -> str:
    """With a reward model in its own pool on the launch script's nodes, the actor has the nodes' GPUs less the
    reward model's: say so, naming the launch script's variable, and the reward-model GPU counts that would fit
    (``counts``: the response counts that must split evenly)."""
    from recipe.exgrpo.launch_checks.dry_run.reward_model import NODE_GPUS_ENV

    rm = config.reward.get("reward_model") or {}
    node_gpus = os.environ.get(NODE_GPUS_ENV, "")
    if not (rm.get("enable", False) and rm.get("enable_resource_pool", False) and node_gpus.isdigit()):
        return ""
    nodes, node, rm_gpus = int(config.trainer.nnodes), int(node_gpus), int(rm.get("n_gpus_per_node") or 0)

    def splits(actor_gpus: int) -> bool:
        total = actor_gpus * nodes
        return total % sp == 0 and all(c % (total // sp) == 0 for c in counts)

    fits = [r for r in range(1, node) if splits(node - r)]
    return (
        f". The actor's GPUs per node are the nodes' {node} (N_GPUS_PER_NODE) less the reward model's {rm_gpus} "
        "(RM_GPUS_PER_NODE of the launch script, reward.reward_model.n_gpus_per_node)"
        + (f"; RM_GPUS_PER_NODE={' or '.join(map(str, fits))} would fit" if fits else "")
    )


def _check_code_paths(config: DictConfig) -> list[str]:
    """The reward function and the dataset class load, and ``reward_kwargs`` name parameters of the reward."""
    from verl.trainer.ppo.reward import get_custom_reward_fn
    from verl.utils.import_utils import load_extern_object

    problems: list[str] = []
    fn_cfg = config.reward.custom_reward_function
    try:
        with stdout_to_stderr():
            get_custom_reward_fn(config)
    except Exception as e:
        problems.append(f"reward.custom_reward_function ({fn_cfg.get('path')}:{fn_cfg.get('name')}): {error_text(e)}")
    path = fn_cfg.get("path")
    module = _recipe_reward_module(str(path)) if path else None
    if module and fn_cfg.get("name") == "compute_score":
        problems += check_reward_kwargs(dict(fn_cfg.get("reward_kwargs") or {}), module)

    cls_cfg = config.data.get("custom_cls") or {}
    if cls_cfg.get("path"):
        try:
            with stdout_to_stderr():
                load_extern_object(module_path=cls_cfg.path, object_name=cls_cfg.name)
        except Exception as e:
            problems.append(f"data.custom_cls ({cls_cfg.path}:{cls_cfg.name}): {error_text(e)}")
    return problems


#: The recipe's reward functions, whose ``reward_kwargs`` the dry run checks against their keyword-only parameters
RECIPE_REWARD_MODULES: tuple[str, ...] = ("recipe.exgrpo.reward", "recipe.exgrpo.reward_model_client")


def _recipe_reward_module(path: str) -> str | None:
    """The recipe's reward module ``path`` names (``pkg://`` or its file), None for any other function."""
    if path.startswith("pkg://"):
        name = path[len("pkg://") :]
        return name if name in RECIPE_REWARD_MODULES else None
    try:
        resolved = Path(path).resolve()
    except OSError:
        return None
    for name in RECIPE_REWARD_MODULES:
        if resolved == RECIPE_REWARD_FILE.parent / f"{name.rpartition('.')[2]}.py":
            return name
    return None


#: The recipe reward's switches: the reward would raise at its first call on any other value, inside a Ray worker.
BOOLEAN_REWARD_KWARGS: tuple[str, ...] = ("think_gate", "strip_tool_responses")


def check_reward_kwargs(reward_kwargs: dict[str, Any], module: str = "recipe.exgrpo.reward") -> list[str]:
    """``reward_kwargs`` keys must be keyword parameters of the recipe's reward function ``module:compute_score``:
    its ``**kwargs`` would otherwise swallow a typo (``think_gat=false`` would leave the think gate on)."""
    import importlib

    compute_score = importlib.import_module(module).compute_score
    where = f"{module.replace('.', '/')}.py:compute_score"
    params = inspect.signature(compute_score).parameters
    names = [n for n, p in params.items() if p.kind is inspect.Parameter.KEYWORD_ONLY]
    problems = []
    for key, value in reward_kwargs.items():
        full = f"reward.custom_reward_function.reward_kwargs.{key}"
        if key not in names:
            close = difflib.get_close_matches(str(key), names, n=1, cutoff=0.6)
            hint = f" (did you mean reward_kwargs.{close[0]}?)" if close else ""
            problems.append(f"{full}: not a parameter of {where}{hint}; allowed: {names}")
        elif key in BOOLEAN_REWARD_KWARGS and not (
            isinstance(value, bool) or str(value).strip().lower() in {"1", "0", "true", "false", "yes", "no"}
        ):
            problems.append(f"{full} must be true or false, got {value!r}")
    return problems
