#!/usr/bin/env bash
# ExGRPO on Qwen2.5-Math-1.5B, full fine-tuning, on ONE 80 GB GPU (A100/H100 80GB): the paper's 1.5B run
# (scripts/train/exgrpo_qwen2.5_math_1.5b.sh, 8 GPUs) with only what one GPU needs changed.
#
#   Same as the 8-GPU run: B = 128 questions per step, K = 8 rollouts per question, prompts <= 1024 and responses
#   <= 8192 tokens, mini-batch 64 questions (2 updates per step), lr 1e-6, fp32 weights and AdamW state, 32768
#   tokens per micro-batch (dynamic batch size), gradient checkpointing, 500 steps, every ExGRPO setting.
#   Changed: N_GPUS_PER_NODE=1 (one FSDP shard, one vLLM replica) and rollout gpu_memory_utilization 0.7 -> 0.6
#   (the actor's unsharded fp32 weights and AdamW state, 17.3 GiB, stay on the card while vLLM generates).
#   The stage watchdog's deadlines of generation, old log-probs, update and validation x8 (one card does the
#   8-GPU run's work).
#   Expect about 8x the wall-clock time per step of the 8-GPU run (the same work on one card).
#
#   MODEL_PATH=/models/Qwen2.5-Math-1.5B-16k TRAIN_FILE=data/openr1/train.parquet \
#     bash scripts/train/one_gpu/exgrpo_qwen2.5_math_1.5b_80gb.sh [hydra overrides]
#   DRY_RUN=1 bash scripts/train/one_gpu/exgrpo_qwen2.5_math_1.5b_80gb.sh   # prints the memory estimate
#
# Memory estimate (recipe/exgrpo/launch_checks/memory_estimate.py; docs/launch_scripts.md, "Training on one GPU").
set -euo pipefail
N_GPUS_PER_NODE="${N_GPUS_PER_NODE:-1}"
# shellcheck source=scripts/train/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/../common.sh"

exgrpo_prepare \
  --experiment exgrpo_qwen2.5_math_1.5b_1gpu \
  --think-template expected \
  --steps 500 \
  --rollout-tp 1 \
  --model-hint "point it at Qwen2.5-Math-1.5B with a context of at least 9216 tokens (the stock 4k model would \
cut responses; extend max_position_embeddings as the 7B 'think' variant does)"
EXGRPO_ARGS+=(
  # one card: vLLM's share next to the actor's resident 17.3 GiB (fp32 weights + AdamW moments, one shard)
  actor_rollout_ref.rollout.gpu_memory_utilization=0.6
)
exgrpo_one_gpu_args
exgrpo_launch "$@"
