#!/usr/bin/env bash
# On-policy baseline (Dr.GRPO, no replay) on Llama-3.1-8B-Instruct (paper Table 5: 19.9 ID avg): the ExGRPO script with
# exgrpo.enable=false, i.e. the same trainer, data, reward, hyperparameters and GPUs
# (scripts/train/exgrpo_llama3.1_8b_instruct.sh).
#
#   MODEL_PATH=... TRAIN_FILE=... bash scripts/train/onpolicy_llama3.1_8b_instruct.sh [hydra overrides]
set -euo pipefail
export EXPERIMENT_NAME="${EXPERIMENT_NAME:-onpolicy_llama3.1_8b_instruct}"
exec bash "$(dirname "${BASH_SOURCE[0]}")/exgrpo_llama3.1_8b_instruct.sh" exgrpo.enable=false "$@"
