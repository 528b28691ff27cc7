#!/usr/bin/env bash
# On-policy baseline (GRPO, no replay) of the paper's Table 2 (ArenaHardV2 / IFEval / IFBench 15.1 / 26.1 / 18.7): the
# ExGRPO script with exgrpo.enable=false, i.e. the same trainer, data, reward model, hyperparameters and GPUs
# (scripts/train/exgrpo_qwen2.5_7b_base_wildchat_if.sh, whose RM_* variables apply here too).
#
#   MODEL_PATH=... RM_PATH=... bash scripts/train/onpolicy_qwen2.5_7b_base_wildchat_if.sh [hydra overrides]
set -euo pipefail
export EXPERIMENT_NAME="${EXPERIMENT_NAME:-onpolicy_qwen2.5_7b_base_wildchat_if}"
exec bash "$(dirname "${BASH_SOURCE[0]}")/exgrpo_qwen2.5_7b_base_wildchat_if.sh" exgrpo.enable=false "$@"
