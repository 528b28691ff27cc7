#!/usr/bin/env bash
# On-policy baseline (Dr.GRPO, no replay) with tool-integrated reasoning on Qwen2.5-7B-Instruct: the ExGRPO TIR script
# with exgrpo.enable=false, i.e. the same trainer, data, tool, sandbox, reward, hyperparameters and GPUs
# (scripts/train/exgrpo_qwen2.5_7b_instruct_tir.sh, its environment included).
#
#   MODEL_PATH=... bash scripts/train/onpolicy_qwen2.5_7b_instruct_tir.sh [hydra overrides]
set -euo pipefail
export EXPERIMENT_NAME="${EXPERIMENT_NAME:-onpolicy_qwen2.5_7b_instruct_tir}"
exec bash "$(dirname "${BASH_SOURCE[0]}")/exgrpo_qwen2.5_7b_instruct_tir.sh" exgrpo.enable=false "$@"
