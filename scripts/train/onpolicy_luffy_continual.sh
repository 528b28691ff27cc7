#!/usr/bin/env bash
# On-policy baseline (Dr.GRPO, no replay) continuing from a LUFFY checkpoint (paper Table 1 "LUFFY -> continual
# on-policy", 48.7 ID avg): the ExGRPO script with exgrpo.enable=false, i.e. the same trainer, data,
# hyperparameters and GPUs (scripts/train/exgrpo_luffy_continual.sh).
#
#   MODEL_PATH=... TRAIN_FILE=... bash scripts/train/onpolicy_luffy_continual.sh [hydra overrides]
set -euo pipefail
export EXPERIMENT_NAME="${EXPERIMENT_NAME:-onpolicy_luffy_continual}"
exec bash "$(dirname "${BASH_SOURCE[0]}")/exgrpo_luffy_continual.sh" exgrpo.enable=false "$@"
