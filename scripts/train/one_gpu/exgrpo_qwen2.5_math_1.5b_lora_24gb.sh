#!/usr/bin/env bash
# ExGRPO on Qwen2.5-Math-1.5B with LoRA on ONE 24 GB GPU (RTX 3090/4090, A10, L4): the largest setting of the
# scripts' backbones the memory estimate fits on such a card. The paper's 1.5B run
# (scripts/train/exgrpo_qwen2.5_math_1.5b.sh, 8 GPUs, full fine-tuning) with only what a 24 GB card needs changed.
# What does not fit 24 GB (docs/launch_scripts.md, "Training on one GPU"): the 1.5B fully fine-tuned (fp32 weights,
# gradients and AdamW state alone are 23 GiB) and the 7B with LoRA (its bf16 base, 14.2 GiB, plus one 9216-token
# sequence's activations and vLLM's sleeping share pass 95% of the card).
#
#   Same as the 8-GPU run: B = 128 questions per step, K = 8 rollouts per question, prompts <= 1024 and responses
#   <= 8192 tokens, mini-batch 64 questions (2 updates per step), gradient checkpointing, 500 steps, every ExGRPO
#   setting.
#   Changed:
#   - N_GPUS_PER_NODE=1;
#   - LoRA instead of full fine-tuning: rank 32, alpha 32, every linear layer, lr 3e-5 (was 1e-6), as
#     exgrpo_qwen2.5_math_7b_lora_80gb.sh (OUR CHOICE, not tuned for ExGRPO); the frozen base in bf16; vLLM serves
#     the adapter (lora.merge=false, rollout.load_format=safetensors, layered_summon);
#   - 9216 tokens per micro-batch, update and log-prob passes (was 32768): one longest sequence (1024 + 8192), the
#     smallest verl's dynamic batch size takes; the logits alone take 0.87 MiB per token;
#   - the stage watchdog's deadlines of generation, old log-probs, update and validation x8 (one card does the
#     8-GPU run's work);
#   - rollout gpu_memory_utilization 0.7 -> 0.65 of the 24 GB card;
#   - GPU_MEMORY_GIB defaults to 24, so the dry run and the launch's pre-flight estimate for this card.
#   Expect a long run: one step is the 8-GPU run's work on one smaller card.
#
#   MODEL_PATH=/models/Qwen2.5-Math-1.5B-16k TRAIN_FILE=data/openr1/train.parquet \
#     bash scripts/train/one_gpu/exgrpo_qwen2.5_math_1.5b_lora_24gb.sh [hydra overrides]
#   DRY_RUN=1 bash scripts/train/one_gpu/exgrpo_qwen2.5_math_1.5b_lora_24gb.sh   # prints the memory estimate
set -euo pipefail
N_GPUS_PER_NODE="${N_GPUS_PER_NODE:-1}"
export GPU_MEMORY_GIB="${GPU_MEMORY_GIB:-24}"
# shellcheck source=scripts/train/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/../common.sh"

exgrpo_prepare \
  --experiment exgrpo_qwen2.5_math_1.5b_lora_1gpu_24gb \
  --think-template expected \
  --steps 500 \
  --rollout-tp 1 \
  --model-hint "point it at Qwen2.5-Math-1.5B with a context of at least 9216 tokens (the stock 4k model would \
cut responses; extend max_position_embeddings as the 7B 'think' variant does)"
exgrpo_lora_args 32 32 3e-5
exgrpo_one_gpu_args
EXGRPO_ARGS+=(
  actor_rollout_ref.actor.ppo_max_token_len_per_gpu=9216
  actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu=9216
  actor_rollout_ref.rollout.gpu_memory_utilization=0.65
)
exgrpo_launch "$@"
