#!/usr/bin/env bash
# Reproduce the Qwen2.5-Math-1.5B rows of paper Table 5: train ExGRPO and the on-policy baseline (500 steps each,
# 8 GPUs), merge each final checkpoint to Hugging Face format, evaluate both on the ID and OOD suites
# (scripts/eval/eval_id.sh, eval_ood.sh; docs/evaluation.md) and print the table beside the paper's rows.
#
#   MODEL_PATH=/models/Qwen2.5-Math-1.5B-16k TRAIN_FILE=data/openr1/train.parquet \
#     bash scripts/reproduce/reproduce_1.5b.sh
#   DRY_RUN=1 bash scripts/reproduce/reproduce_1.5b.sh    # validate both training configs, show the other steps
#
# Environment (besides the launch scripts', scripts/train/common.sh):
#   STAGES           comma list of train, eval, table (default: all three; e.g. STAGES=eval,table after training)
#   OUT_DIR          evaluation outputs and the table (default: <repo>/outputs/reproduce/1.5b)
#   EVAL_N_GPUS      GPUs of the evaluation (default N_GPUS_PER_NODE, 8); EVAL_TP: GPUs per vLLM replica (default 1)
#   EVAL_GRADING     paper (default: the paper's final evaluation) or reward (EVAL_THINK_GATE=1/0 sets its gate)
#   ALLOW_PARTIAL_EVAL  1: evaluate without missing OOD files (default: all evaluation data must exist; it is
#                    checked before training starts; bash scripts/prepare_data.sh writes it)
# Extra arguments are hydra overrides for every training run (e.g. trainer.logger=[console,wandb]).
set -euo pipefail
# shellcheck source=scripts/train/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/../train/common.sh"

exgrpo_reproduce table5 "${OUT_DIR:-$EXGRPO_REPO_ROOT/outputs/reproduce/1.5b}" \
  "On-policy|onpolicy_qwen2.5_math_1.5b.sh|onpolicy_qwen2.5_math_1.5b|MODEL_PATH" \
  "ExGRPO|exgrpo_qwen2.5_math_1.5b.sh|exgrpo_qwen2.5_math_1.5b|MODEL_PATH" -- "$@"
