#!/usr/bin/env bash
# Continual ExGRPO from a LUFFY checkpoint (LUFFY-Qwen-Math-7B-Zero; paper Table 1 "LUFFY -> continual ExGRPO",
# 51.4 ID avg). 500 steps (docs/algorithm.md §11: 700 only for Qwen2.5-Math-7B; pass trainer.total_training_steps=N to
# change), otherwise the released hyperparameters. GPUs: 8 (NNODES x N_GPUS_PER_NODE); vLLM tensor parallel 2.
#
#   MODEL_PATH=/models/LUFFY-Qwen-Math-7B-Zero TRAIN_FILE=data/openr1/train.parquet \
#     bash scripts/train/exgrpo_luffy_continual.sh [hydra overrides]
set -euo pipefail
# shellcheck source=scripts/train/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

exgrpo_prepare \
  --experiment exgrpo_luffy_continual \
  --think-template expected \
  --steps 500 \
  --rollout-tp 2 \
  --model-hint "point it at the LUFFY checkpoint to continue from (LUFFY-Qwen-Math-7B-Zero, a local Hugging Face \
directory)"
exgrpo_launch "$@"
