#!/usr/bin/env bash
# Table 6 ablation: w/o policy shaping (plain ratio on replayed tokens).
# Paper: 41.2 ID avg (Qwen2.5-Math-7B; ExGRPO 48.3, on-policy 45.3).
# The 7B ExGRPO run (scripts/train/exgrpo_qwen2.5_math_7b.sh) with one change: exgrpo.shaping=none
#
#   MODEL_PATH=... TRAIN_FILE=... bash scripts/train/ablations/wo_policy_shaping.sh [hydra overrides]
set -euo pipefail
export EXPERIMENT_NAME="${EXPERIMENT_NAME:-ablation_7b_wo_policy_shaping}"
exec bash "$(dirname "${BASH_SOURCE[0]}")/../exgrpo_qwen2.5_math_7b.sh" \
  exgrpo.shaping=none "$@"
