#!/usr/bin/env bash
# ExGRPO on Llama-3.1-8B base (paper Table 5, 6.1 ID avg): no delayed start (mixed from step 1, tau < 0) and no
# think gate (the base model has no think template; the reward checks the whole response, docs/algorithm.md §9-10).
# 500 steps, otherwise the released hyperparameters (docs/algorithm.md §11). GPUs: 8; vLLM tensor parallel 2.
#
# Prompt: the paper's base-model setting, "User: {question} Answer: Let's think step by step.\n" after the BOS
# token, no system prompt and no chat template. The data carries that text (made with --prompt-style
# llama_base) and the script renders it verbatim (actor_rollout_ref.model.custom_chat_template, exgrpo/prompts.py):
#
#   PROMPT_STYLE=llama_base MODEL_PATH=/models/Llama-3.1-8B bash scripts/prepare_data.sh   # the two files below
#   MODEL_PATH=/models/Llama-3.1-8B bash scripts/train/exgrpo_llama3.1_8b.sh [hydra overrides]
#     (TRAIN_FILE defaults to data/openr1/train_llama_base.parquet, VAL_FILE to
#      data/valid_llama_base/valid_id.parquet; the pre-flight refuses files with a system message)
set -euo pipefail
# shellcheck source=scripts/train/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

exgrpo_prepare \
  --experiment exgrpo_llama3.1_8b \
  --steps 500 \
  --rollout-tp 2 \
  --think-gate false \
  --delayed-start -1 \
  --prompt-style llama_base \
  --model-hint "point it at Llama-3.1-8B (base; a local Hugging Face directory)"
exgrpo_launch "$@"
