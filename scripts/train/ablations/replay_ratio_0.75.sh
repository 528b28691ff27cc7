#!/usr/bin/env bash
# Table 6 ablation: rho = 75%.
# Paper: 44.8 ID avg (Qwen2.5-Math-7B; ExGRPO 48.3, on-policy 45.3).
# The 7B ExGRPO run (scripts/train/exgrpo_qwen2.5_math_7b.sh) with one change: exgrpo.replay_ratio=0.75
#
#   MODEL_PATH=... TRAIN_FILE=... bash scripts/train/ablations/replay_ratio_0.75.sh [hydra overrides]
set -euo pipefail
export EXPERIMENT_NAME="${EXPERIMENT_NAME:-ablation_7b_replay_ratio_0.75}"
exec bash "$(dirname "${BASH_SOURCE[0]}")/../exgrpo_qwen2.5_math_7b.sh" \
  exgrpo.replay_ratio=0.75 "$@"
