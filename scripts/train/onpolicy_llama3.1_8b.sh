#!/usr/bin/env bash
# On-policy baseline (Dr.GRPO, no replay) on Llama-3.1-8B base (paper Table 5, 3.4 ID avg: it collapses): the
# ExGRPO script with exgrpo.enable=false, i.e. the same trainer, data, reward (no think gate), hyperparameters and
# GPUs (scripts/train/exgrpo_llama3.1_8b.sh).
#
#   MODEL_PATH=... TRAIN_FILE=... bash scripts/train/onpolicy_llama3.1_8b.sh [hydra overrides]
set -euo pipefail
export EXPERIMENT_NAME="${EXPERIMENT_NAME:-onpolicy_llama3.1_8b}"
exec bash "$(dirname "${BASH_SOURCE[0]}")/exgrpo_llama3.1_8b.sh" exgrpo.enable=false "$@"
