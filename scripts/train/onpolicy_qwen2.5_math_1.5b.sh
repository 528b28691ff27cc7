#!/usr/bin/env bash
# On-policy baseline (Dr.GRPO, no replay) on Qwen2.5-Math-1.5B (paper Table 5: 30.0 ID avg): the ExGRPO script with
# exgrpo.enable=false, i.e. the same trainer, data, reward, hyperparameters and GPUs
# (scripts/train/exgrpo_qwen2.5_math_1.5b.sh).
#
#   MODEL_PATH=... TRAIN_FILE=... bash scripts/train/onpolicy_qwen2.5_math_1.5b.sh [hydra overrides]
set -euo pipefail
export EXPERIMENT_NAME="${EXPERIMENT_NAME:-onpolicy_qwen2.5_math_1.5b}"
exec bash "$(dirname "${BASH_SOURCE[0]}")/exgrpo_qwen2.5_math_1.5b.sh" exgrpo.enable=false "$@"
