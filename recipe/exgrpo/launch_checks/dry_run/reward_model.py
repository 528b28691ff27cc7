"""The dry run's reward-model checks (the continuous mode's reward model, docs/algorithm.md §13) and the reward
summary line."""

from __future__ import annotations

import os
from typing import Any

from omegaconf import DictConfig, OmegaConf

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
    """The dry run's summary of the reward: the reward function, or the reward model and where it runs."""
    out = []
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
