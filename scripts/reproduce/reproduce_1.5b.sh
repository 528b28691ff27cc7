#!/usr/bin/env bash
# Reproduce the Qwen2.5-Math-1.5B rows of paper Table 5: train ExGRPO and the on-policy baseline (500 steps each,
# 8 GPUs), merge each final checkpoint to Hugging Face format, evaluate both on the ID and OOD suites
# (scripts/eval/eval_id.sh, eval_ood.sh; ALGORITHM.md §12) and print the table beside the paper's rows.
#
#   MODEL_PATH=/models/Qwen2.5-Math-1.5B-16k TRAIN_FILE=data/openr1/train.parquet \
#     bash scripts/reproduce/reproduce_1.5b.sh
#   DRY_RUN=1 bash scripts/reproduce/reproduce_1.5b.sh    # validate both training configs, show the other steps
#
# Environment (besides the launch scripts', scripts/train/common.sh):
#   STAGES           comma list of train, eval, table (default: all three; e.g. STAGES=eval,table after training)
#   OUT_DIR          evaluation outputs and the table (default: <repo>/outputs/reproduce/1.5b)
#   EVAL_N_GPUS      GPUs of the vLLM evaluation (tensor parallel; default 1)
#   EVAL_THINK_GATE  1 (default: the trained models answer after </think>) or 0
# Extra arguments are hydra overrides for every training run (e.g. trainer.logger=[console,wandb]).
set -euo pipefail
# shellcheck source=scripts/train/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/../train/common.sh"

exgrpo_reproduce table5 "${OUT_DIR:-$EXGRPO_REPO_ROOT/outputs/reproduce/1.5b}" "${EVAL_N_GPUS:-1}" \
  "On-policy (ours)|onpolicy_qwen2.5_math_1.5b.sh|onpolicy_qwen2.5_math_1.5b|MODEL_PATH" \
  "ExGRPO (ours)|exgrpo_qwen2.5_math_1.5b.sh|exgrpo_qwen2.5_math_1.5b|MODEL_PATH" -- "$@"
