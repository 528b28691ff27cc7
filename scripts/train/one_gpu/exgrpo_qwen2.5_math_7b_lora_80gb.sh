#!/usr/bin/env bash
# ExGRPO on Qwen2.5-Math-7B with LoRA on ONE 80 GB GPU (A100/H100 80GB): the paper's 7B run
# (scripts/train/exgrpo_qwen2.5_math_7b.sh, 8 GPUs, full fine-tuning) with only what one GPU needs changed.
# Full fine-tuning of the 7B does not fit one 80 GB card: fp32 weights, gradients and AdamW's two moments are
# 16 bytes x 7.62B = 113 GiB before any activation (docs/launch_scripts.md, "Training on one GPU").
#
#   Same as the 8-GPU run: B = 128 questions per step, K = 8 rollouts per question, prompts <= 1024 and responses
#   <= 8192 tokens, mini-batch 64 questions (2 updates per step), 32768 tokens per micro-batch (dynamic batch size),
#   gradient checkpointing, 700 steps, every ExGRPO setting.
#   Changed:
#   - N_GPUS_PER_NODE=1, vLLM tensor parallel 1 (was 2);
#   - LoRA instead of full fine-tuning: rank 32, alpha 32, every linear layer (target_modules=all-linear), lr 3e-5
#     (was 1e-6): the rank, alpha and lr of verl's one-GPU LoRA GRPO examples (examples/tuning/*/
#     *_grpo-lora_1_h100_fsdp_vllm.sh); OUR CHOICE, not tuned for ExGRPO;
#   - the frozen base in bf16 (fsdp_config.model_dtype=bf16; verl casts the adapter, and so AdamW's moments, to it);
#   - vLLM serves the adapter (lora.merge=false: 0.16 GB synced per update instead of 15 GB of merged weights),
#     loading the base from MODEL_PATH itself (rollout.load_format=safetensors), verl gathering the actor layer by
#     layer for the sync (layered_summon); lora.merge=true would send the merged weights instead (docs/trainer.md);
#   - the stage watchdog's deadlines of generation, old log-probs, update and validation x8 (one card does the
#     8-GPU run's work);
#   - rollout gpu_memory_utilization 0.7 -> 0.6 (the actor's bf16 base, adapter and its AdamW moments, 14.6 GiB,
#     stay on the card while vLLM generates).
#
#   MODEL_PATH=/models/Qwen2.5-Math-7B-16k TRAIN_FILE=data/openr1/train.parquet \
#     bash scripts/train/one_gpu/exgrpo_qwen2.5_math_7b_lora_80gb.sh [hydra overrides]
#   DRY_RUN=1 bash scripts/train/one_gpu/exgrpo_qwen2.5_math_7b_lora_80gb.sh   # prints the memory estimate
#
# The adapter of every checkpoint is written in PEFT's format (global_step_N/actor/lora_adapter; docs/trainer.md).
set -euo pipefail
N_GPUS_PER_NODE="${N_GPUS_PER_NODE:-1}"
# shellcheck source=scripts/train/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/../common.sh"

exgrpo_prepare \
  --experiment exgrpo_qwen2.5_math_7b_lora_1gpu \
  --think-template expected \
  --steps 700 \
  --rollout-tp 1 \
  --model-hint "point it at Qwen2.5-Math-7B with a context of at least 9216 tokens (the released run used a \
16k-context 'think' variant; the stock 4k model would cut responses)"
exgrpo_lora_args 32 32 3e-5
exgrpo_one_gpu_args
EXGRPO_ARGS+=(actor_rollout_ref.rollout.gpu_memory_utilization=0.6)
exgrpo_launch "$@"
