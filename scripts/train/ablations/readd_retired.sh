#!/usr/bin/env bash
# Table 6 ablation: retired questions re-added (10% of the retired questions un-retired every 25 steps).
# Paper: 45.3 ID avg (Qwen2.5-Math-7B; ExGRPO 48.3, on-policy 45.3).
# The 7B ExGRPO run (scripts/train/exgrpo_qwen2.5_math_7b.sh) with one change: exgrpo.readd_retired_fraction=0.1
# (exgrpo.readd_retired_every keeps its default of 25 steps)
#
#   MODEL_PATH=... TRAIN_FILE=... bash scripts/train/ablations/readd_retired.sh [hydra overrides]
set -euo pipefail
export EXPERIMENT_NAME="${EXPERIMENT_NAME:-ablation_7b_readd_retired}"
exec bash "$(dirname "${BASH_SOURCE[0]}")/../exgrpo_qwen2.5_math_7b.sh" \
  exgrpo.readd_retired_fraction=0.1 "$@"
