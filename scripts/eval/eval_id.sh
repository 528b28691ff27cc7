#!/usr/bin/env bash
# In-distribution suite of the paper (ALGORITHM.md §12): AIME24, AIME25, AMC (avg@32), MATH-500, Minerva,
# OlympiadBench (pass@1); T=0.6, top-p 1.0, 8192 new tokens; vLLM on GPUs. Resumable: rerun the same command
# after an interruption and only the missing samples are generated.
#
#   MODEL_PATH=/path/to/hf_checkpoint bash scripts/eval/eval_id.sh [extra exgrpo.eval flags]
#
# Environment:
#   MODEL_PATH   (required) Hugging Face checkpoint directory (e.g. .../global_step_500/actor/huggingface)
#   DATA_DIR     benchmark parquets (default: ../shared/data/benchmarks next to the repo, else data/benchmarks)
#   ID_FILE      the ID parquet inside DATA_DIR (default: test_id.parquet, which already repeats AIME/AMC 32x)
#   OUT_DIR      output directory (default: outputs/eval/<model name>/id)
#   N_GPUS       GPUs for vLLM tensor parallelism (default: 1)
#   BACKEND      vllm (default) or hf
#   THINK_GATE   1 (default: think-template models trained with ExGRPO) or 0 (base / instruct models)
#   LABEL        row name in the table (default: from MODEL_PATH)
#   REFERENCE    table1 (default), table5 or none: the paper's rows printed beside ours
set -euo pipefail

# shellcheck source=scripts/eval/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
eval_require_model eval_id.sh
DATA_DIR="$(eval_data_dir)"
ID_FILE="${ID_FILE:-test_id.parquet}"
if [[ ! -f "$DATA_DIR/$ID_FILE" ]]; then
  echo "error: $DATA_DIR/$ID_FILE not found; set DATA_DIR (and ID_FILE) to the benchmark parquets" >&2
  exit 2
fi
eval_run id "$DATA_DIR/$ID_FILE" -- "$@"
