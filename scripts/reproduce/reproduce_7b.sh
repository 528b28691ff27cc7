#!/usr/bin/env bash
# Reproduce the Qwen2.5-Math-7B rows of paper Table 1: train ExGRPO and the on-policy baseline (700 steps each,
# 8 GPUs), merge each final checkpoint to Hugging Face format, evaluate both on the ID and OOD suites
# (scripts/eval/eval_id.sh, eval_ood.sh; docs/evaluation.md) and print the table beside the paper's rows.
# With LUFFY_MODEL_PATH set, the two "LUFFY -> continual" rows are trained and evaluated as well.
#
#   MODEL_PATH=/models/Qwen2.5-Math-7B-16k TRAIN_FILE=data/openr1/train.parquet bash scripts/reproduce/reproduce_7b.sh
#   DRY_RUN=1 bash scripts/reproduce/reproduce_7b.sh      # validate both training configs, show the other steps
#
# Environment (besides the launch scripts', scripts/train/common.sh):
#   STAGES           comma list of train, eval, table (default: all three; e.g. STAGES=eval,table after training)
#   OUT_DIR          evaluation outputs and the table (default: <repo>/outputs/reproduce/7b)
#   EVAL_N_GPUS      GPUs of the evaluation (default N_GPUS_PER_NODE, 8); EVAL_TP: GPUs per vLLM replica (default
#                    1: a 7B model fits one GPU, so 8 replicas; 28 attention heads also split by 2 and 4)
#   EVAL_GRADING     paper (default: the paper's final evaluation) or reward (EVAL_THINK_GATE=1/0 sets its gate)
#   ALLOW_PARTIAL_EVAL  1: evaluate without missing OOD files (default: all evaluation data must exist; it is
#                    checked before training starts; bash scripts/prepare_data.sh writes it)
#   LUFFY_MODEL_PATH a LUFFY-Qwen-Math-7B-Zero checkpoint: also the continual on-policy and ExGRPO rows
# Extra arguments are hydra overrides for every training run (e.g. trainer.logger=[console,wandb]).
set -euo pipefail
# shellcheck source=scripts/train/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/../train/common.sh"

runs=(
  "On-policy|onpolicy_qwen2.5_math_7b.sh|onpolicy_qwen2.5_math_7b|MODEL_PATH"
  "ExGRPO|exgrpo_qwen2.5_math_7b.sh|exgrpo_qwen2.5_math_7b|MODEL_PATH"
)
if [[ -n "${LUFFY_MODEL_PATH:-}" ]]; then
  runs+=(
    "LUFFY -> continual on-policy|onpolicy_luffy_continual.sh|onpolicy_luffy_continual|LUFFY_MODEL_PATH"
    "LUFFY -> continual ExGRPO|exgrpo_luffy_continual.sh|exgrpo_luffy_continual|LUFFY_MODEL_PATH"
  )
fi
exgrpo_reproduce table1 "${OUT_DIR:-$EXGRPO_REPO_ROOT/outputs/reproduce/7b}" "${runs[@]}" -- "$@"
