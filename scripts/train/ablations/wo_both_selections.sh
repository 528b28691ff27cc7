#!/usr/bin/env bash
# Table 6 ablation: w/o both (uniform questions and random trajectory).
# Paper: 46.1 ID avg (Qwen2.5-Math-7B; ExGRPO 48.3, on-policy 45.3).
# The 7B ExGRPO run (scripts/train/exgrpo_qwen2.5_math_7b.sh) with one change (the row switches both off):
# exgrpo.weighting=uniform exgrpo.trajectory_metric=random
#
#   MODEL_PATH=... TRAIN_FILE=... bash scripts/train/ablations/wo_both_selections.sh [hydra overrides]
set -euo pipefail
export EXPERIMENT_NAME="${EXPERIMENT_NAME:-ablation_7b_wo_both_selections}"
exec bash "$(dirname "${BASH_SOURCE[0]}")/../exgrpo_qwen2.5_math_7b.sh" \
  exgrpo.weighting=uniform exgrpo.trajectory_metric=random "$@"
