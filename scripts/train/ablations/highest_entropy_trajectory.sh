#!/usr/bin/env bash
# Table 6 ablation: highest-entropy trajectory (argmax instead of argmin entropy).
# Paper: 46.0 ID avg (Qwen2.5-Math-7B; ExGRPO 48.3, on-policy 45.3).
# The 7B ExGRPO run (scripts/train/exgrpo_qwen2.5_math_7b.sh) with one change: exgrpo.trajectory_mode=max
#
#   MODEL_PATH=... TRAIN_FILE=... bash scripts/train/ablations/highest_entropy_trajectory.sh [hydra overrides]
set -euo pipefail
export EXPERIMENT_NAME="${EXPERIMENT_NAME:-ablation_7b_highest_entropy_trajectory}"
exec bash "$(dirname "${BASH_SOURCE[0]}")/../exgrpo_qwen2.5_math_7b.sh" \
  exgrpo.trajectory_mode=max "$@"
