#!/usr/bin/env bash
# ExGRPO with a reward model, on instruction following: the paper's Table 2 (Qwen2.5-7B base, ~7k WildChat-IF prompts,
# rewards from Skywork-Reward-Llama-3.1-8B-v0.2, 2 epochs; ArenaHardV2 / IFEval / IFBench 16.4 / 27.9 / 20.7, GRPO
# 15.1 / 26.1 / 18.7). The continuous reward mode (exgrpo.reward_mode=continuous, docs/algorithm.md §13); every other
# setting is the released math run's (docs/algorithm.md §11) except the ones marked below (docs/launch_scripts.md,
# "Instruction following with a reward model"). GPUs: 8 (NNODES x N_GPUS_PER_NODE); vLLM tensor parallel 2.
#
#   python -m data_preprocess.wildchat_if --input wildchat-if_train.parquet --tokenizer /models/Qwen2.5-7B \
#     --output data/wildchat_if/train.parquet --val-output data/wildchat_if/val.parquet
#   MODEL_PATH=/models/Qwen2.5-7B RM_PATH=/models/Skywork-Reward-Llama-3.1-8B-v0.2 \
#     bash scripts/train/exgrpo_qwen2.5_7b_base_wildchat_if.sh [hydra overrides]
#
# The reward model is served by verl 0.9.1's reward loop (vLLM, pooling): the policy's prompt and response are
# re-rendered with the reward model's chat template and its score is the reward (reward.custom_reward_function stays
# null). Its environment:
#   RM_PATH           (required) the reward model: a local Hugging Face directory (or a Hub id)
#   RM_TP             vLLM tensor parallel size of each reward-model replica (default 1: an 8B model fits one GPU)
#   RM_GPUS_PER_NODE  0 (default): colocated, the reward model shares the actor's GPUs and scores each step's
#                     responses once the rollout sleeps; N > 0: its own pool of N GPUs per node, scoring as the
#                     responses are generated, and the actor gets N_GPUS_PER_NODE - N of them. verl 0.9.1 cannot
#                     score a reward model in its own pool by itself (docs/launch_scripts.md): the script then scores
#                     through the recipe's reward function that calls the model's router
#                     (recipe/exgrpo/reward_model_client.py) and keeps the model awake (free_cache_engine=false)
#   RM_GPU_MEMORY     the reward model's vLLM gpu_memory_utilization (default 0.5)
set -euo pipefail
# shellcheck source=scripts/train/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

NODE_GPUS="${N_GPUS_PER_NODE:-8}"
RM_TP="${RM_TP:-1}"
RM_GPUS_PER_NODE="${RM_GPUS_PER_NODE:-0}"
RM_GPU_MEMORY="${RM_GPU_MEMORY:-0.5}"
[[ "$NODE_GPUS" =~ ^[1-9][0-9]*$ ]] || exgrpo_die "N_GPUS_PER_NODE must be a positive integer, got '$NODE_GPUS'"
exgrpo_positive_int RM_TP
[[ "$RM_GPUS_PER_NODE" =~ ^[0-9]+$ ]] || exgrpo_die "RM_GPUS_PER_NODE must be 0 (colocated) or a GPU count"
# the dry run checks that the actor's GPUs and the reward model's add up to the nodes' (recipe/exgrpo/launch_checks/dry_run/)
export EXGRPO_GPUS_PER_NODE="$NODE_GPUS"
if ((RM_GPUS_PER_NODE > 0)); then
  ((RM_GPUS_PER_NODE < NODE_GPUS)) ||
    exgrpo_die "RM_GPUS_PER_NODE=$RM_GPUS_PER_NODE leaves no GPU for the actor on nodes of N_GPUS_PER_NODE=$NODE_GPUS"
  N_GPUS_PER_NODE=$((NODE_GPUS - RM_GPUS_PER_NODE))
fi
exgrpo_require_var RM_PATH "point it at Skywork-Reward-Llama-3.1-8B-v0.2 (a local Hugging Face directory)"
RM_PATH="$(exgrpo_abspath "$RM_PATH")"
if [[ "$EXGRPO_MODE" == launch && "$RM_PATH" == /* && ! -d "$RM_PATH" ]]; then
  exgrpo_die "RM_PATH=$RM_PATH is not a directory"
fi

exgrpo_prepare \
  --experiment exgrpo_qwen2.5_7b_base_wildchat_if \
  --steps epochs:2 \
  --rollout-tp 2 \
  --think-gate none \
  --delayed-start none \
  --data wildchat_if \
  --model-hint "point it at Qwen2.5-7B (base; a local Hugging Face directory)"
EXGRPO_ARGS+=(
  # the continuous reward mode with the recipe's defaults: buckets from the batch-normalised reward spread,
  # above-mean responses stored, no retirement, mixed mode from step 1 (docs/algorithm.md §13)
  exgrpo.reward_mode=continuous
  # ours: advantages divided by the group's reward std, as GRPO does: a reward model's scale is arbitrary (the
  # math runs' 0/1 rewards do not need it); algorithm.norm_adv_by_std_in_grpo=false gives Dr.GRPO's form
  algorithm.norm_adv_by_std_in_grpo=true
  # the reward model through verl's reward loop
  reward.reward_model.enable=true
  "reward.reward_model.model_path=$(exgrpo_hydra_value "$RM_PATH")"
  reward.reward_model.rollout.name=vllm
  "reward.reward_model.rollout.tensor_model_parallel_size=$RM_TP"
  "reward.reward_model.rollout.gpu_memory_utilization=$RM_GPU_MEMORY"
  # a prompt and its response (1024 + 8192 policy tokens) re-rendered for the reward model, with room to spare
  reward.reward_model.rollout.max_model_len=16384
  reward.reward_model.rollout.max_num_batched_tokens=16384
)
if ((RM_GPUS_PER_NODE > 0)); then
  EXGRPO_ARGS+=(
    reward.reward_model.enable_resource_pool=true
    "reward.reward_model.n_gpus_per_node=$RM_GPUS_PER_NODE"
    "reward.reward_model.nnodes=$NNODES"
    # verl scores each response as it is generated; its own scoring of a discriminative model fails there in 0.9.1:
    # the recipe's reward function asks the model through the router address verl passes it
    reward.custom_reward_function.path=pkg://recipe.exgrpo.reward_model_client
    reward.custom_reward_function.name=compute_score
    "+reward.custom_reward_function.reward_kwargs.model=$(exgrpo_hydra_value "$RM_PATH")"
    # verl puts the model to sleep after start-up and only the trainer's own scoring calls wake it: keep it awake
    reward.reward_model.rollout.free_cache_engine=false
  )
fi
exgrpo_launch "$@"
