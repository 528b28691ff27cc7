#!/usr/bin/env bash
# Table 6 ablation: mu = 0.25 (question sampling biased to hard questions).
# Paper: 46.3 ID avg (Qwen2.5-Math-7B; ExGRPO 48.3, on-policy 45.3).
# The 7B ExGRPO run (scripts/train/exgrpo_qwen2.5_math_7b.sh) with one change: exgrpo.mu=0.25
#
#   MODEL_PATH=... TRAIN_FILE=... bash scripts/train/ablations/mu_0.25.sh [hydra overrides]
set -euo pipefail
export EXPERIMENT_NAME="${EXPERIMENT_NAME:-ablation_7b_mu_0.25}"
exec bash "$(dirname "${BASH_SOURCE[0]}")/../exgrpo_qwen2.5_math_7b.sh" \
  exgrpo.mu=0.25 "$@"
