#!/usr/bin/env bash
# ExGRPO on Qwen2.5-Math-1.5B (paper Table 5, 35.3 ID avg). 500 steps, released hyperparameters (docs/algorithm.md §11).
# GPUs: 8 (NNODES x N_GPUS_PER_NODE); vLLM tensor parallel 1 (a 1.5B model fits one GPU: 8 replicas; OUR CHOICE,
# set ROLLOUT_TP=2 for the 7B layout).
#
#   MODEL_PATH=/models/Qwen2.5-Math-1.5B-16k TRAIN_FILE=data/openr1/train.parquet \
#     bash scripts/train/exgrpo_qwen2.5_math_1.5b.sh [hydra overrides]
set -euo pipefail
# shellcheck source=scripts/train/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

exgrpo_prepare \
  --experiment exgrpo_qwen2.5_math_1.5b \
  --think-template expected \
  --steps 500 \
  --rollout-tp 1 \
  --model-hint "point it at Qwen2.5-Math-1.5B with a context of at least 9216 tokens (the stock 4k model would \
cut responses; extend max_position_embeddings as the 7B 'think' variant does)"
exgrpo_launch "$@"
