#!/usr/bin/env bash
# Table 6 ablation: sigma = 0.5 successes (count units), i.e. 0.5/K = 0.0625 accuracy units with K = 8.
# Paper: 46.2 ID avg (Qwen2.5-Math-7B; ExGRPO 48.3, on-policy 45.3).
# The 7B ExGRPO run (scripts/train/exgrpo_qwen2.5_math_7b.sh) with one change: exgrpo.sigma=0.0625
#
#   MODEL_PATH=... TRAIN_FILE=... bash scripts/train/ablations/sigma_0.5.sh [hydra overrides]
set -euo pipefail
export EXPERIMENT_NAME="${EXPERIMENT_NAME:-ablation_7b_sigma_0.5}"
exec bash "$(dirname "${BASH_SOURCE[0]}")/../exgrpo_qwen2.5_math_7b.sh" \
  exgrpo.sigma=0.0625 "$@"
