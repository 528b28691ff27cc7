#!/usr/bin/env bash
# ExGRPO on Qwen2.5-7B-Instruct (paper Table 5, 39.3 ID avg). 500 steps, released hyperparameters (docs/algorithm.md §11).
# GPUs: 8 (NNODES x N_GPUS_PER_NODE); vLLM tensor parallel 2.
#
#   MODEL_PATH=/models/Qwen2.5-7B-Instruct TRAIN_FILE=data/openr1/train.parquet \
#     bash scripts/train/exgrpo_qwen2.5_7b_instruct.sh [hydra overrides]
#
# Prompt: the released LUFFY system instruction (it asks for "<think> ... </think>" and then the boxed answer) and
# the model's own chat template; the think gate stays on, as in the release: only the text after </think> is
# graded and a response that never closes it scores 0, so the model learns the format from the reward.
set -euo pipefail
# shellcheck source=scripts/train/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

exgrpo_prepare \
  --experiment exgrpo_qwen2.5_7b_instruct \
  --steps 500 \
  --rollout-tp 2 \
  --think-gate true \
  --model-hint "point it at Qwen2.5-7B-Instruct (a local Hugging Face directory)"
exgrpo_launch "$@"
