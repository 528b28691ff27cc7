#!/usr/bin/env bash
# ExGRPO on Llama-3.1-8B base (paper Table 5, 6.1 ID avg): no delayed start (mixed from step 1, tau < 0) and no
# think gate (the base model has no think template; the reward checks the whole response, ALGORITHM.md §9-10).
# 500 steps, otherwise the released hyperparameters (ALGORITHM.md §11). GPUs: 8; vLLM tensor parallel 2.
#
#   MODEL_PATH=/models/Llama-3.1-8B TRAIN_FILE=data/openr1/train.parquet \
#     bash scripts/train/exgrpo_llama3.1_8b.sh [hydra overrides]
#
# verl applies the tokenizer's chat template to every prompt; a base checkpoint without one needs
# actor_rollout_ref.model.custom_chat_template (as an extra override) or a tokenizer that has one.
set -euo pipefail
# shellcheck source=scripts/train/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

exgrpo_prepare \
  --experiment exgrpo_llama3.1_8b \
  --steps 500 \
  --rollout-tp 2 \
  --think-gate false \
  --delayed-start -1 \
  --model-hint "point it at Llama-3.1-8B (base; a local Hugging Face directory)"
exgrpo_launch "$@"
