#!/usr/bin/env bash
# ExGRPO on Qwen2.5-Math-7B: the released 7B run (docs/algorithm.md §11; paper Table 1, 48.3 ID avg). 700 steps.
# GPUs: 8 (NNODES x N_GPUS_PER_NODE); vLLM tensor parallel 2.
#
#   MODEL_PATH=/models/Qwen2.5-Math-7B-16k TRAIN_FILE=data/openr1/train.parquet \
#     bash scripts/train/exgrpo_qwen2.5_math_7b.sh [hydra overrides, e.g. exgrpo.replay_ratio=0.25]
#   DRY_RUN=1 bash scripts/train/exgrpo_qwen2.5_math_7b.sh     # compose + validate the full config, no launch
#
# Backbone and prompt: the released run used a 16k-context "think" variant of Qwen2.5-Math-7B
# (max_position_embeddings 16384) whose chat template is Qwen's ChatML with a generation prompt ending in
# "<|im_start|>assistant\n<think>\n": every response starts inside a think block, which the think gate then
# requires to be closed. Each training row is the LUFFY system instruction plus the question
# (python -m data_preprocess.openr1_math). A launch warns when MODEL_PATH's template opens no <think> block.
#
# Environment and multi-node use: scripts/train/common.sh and docs/launch_scripts.md.
set -euo pipefail
# shellcheck source=scripts/train/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

exgrpo_prepare \
  --experiment exgrpo_qwen2.5_math_7b \
  --think-template expected \
  --steps 700 \
  --rollout-tp 2 \
  --model-hint "point it at Qwen2.5-Math-7B with a context of at least 9216 tokens (the released run used a \
16k-context 'think' variant; the stock 4k model would cut responses)"
exgrpo_launch "$@"
