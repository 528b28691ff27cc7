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

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
if [[ -z "${MODEL_PATH:-}" ]]; then
  echo "error: MODEL_PATH is not set; point it at a Hugging Face checkpoint directory, e.g." >&2
  echo "  MODEL_PATH=/ckpts/exgrpo/global_step_500/actor/huggingface bash scripts/eval/eval_id.sh" >&2
  exit 2
fi
if [[ ! -d "$MODEL_PATH" ]]; then
  echo "error: MODEL_PATH=$MODEL_PATH is not a directory" >&2
  exit 2
fi
if [[ -z "${DATA_DIR:-}" ]]; then
  if [[ -d "$REPO_ROOT/../shared/data/benchmarks" ]]; then DATA_DIR="$REPO_ROOT/../shared/data/benchmarks"
  else DATA_DIR="$REPO_ROOT/data/benchmarks"; fi
fi
ID_FILE="${ID_FILE:-test_id.parquet}"
if [[ ! -f "$DATA_DIR/$ID_FILE" ]]; then
  echo "error: $DATA_DIR/$ID_FILE not found; set DATA_DIR (and ID_FILE) to the benchmark parquets" >&2
  exit 2
fi
N_GPUS="${N_GPUS:-1}"
BACKEND="${BACKEND:-vllm}"
# <experiment>/<global_step_N> for verl checkpoints (.../global_step_N/actor/huggingface), else the directory name
model_name() {
  local p="${1%/}" b
  while [[ "$(basename "$p")" =~ ^(huggingface|hf|actor)$ ]]; do p="$(dirname "$p")"; done
  b="$(basename "$p")"
  if [[ "$b" =~ ^(global_step_|checkpoint-|step_) ]]; then b="$(basename "$(dirname "$p")")/$b"; fi
  echo "$b"
}
OUT_DIR="${OUT_DIR:-$REPO_ROOT/outputs/eval/$(model_name "$MODEL_PATH")/id}"
if [[ "${THINK_GATE:-1}" == "1" ]]; then GATE=--think-gate; else GATE=--no-think-gate; fi
PYTHON="${PYTHON:-python}"

args=(run --model "$MODEL_PATH" --data "$DATA_DIR/$ID_FILE" --out "$OUT_DIR" --backend "$BACKEND"
      --tensor-parallel-size "$N_GPUS" --temperature 0.6 --top-p 1.0 --max-new-tokens 8192
      --seed "${SEED:-0}" "$GATE" --reference "${REFERENCE:-table1}")
[[ -n "${LABEL:-}" ]] && args+=(--label "$LABEL")

cd "$REPO_ROOT"
echo "[eval_id] model=$MODEL_PATH data=$DATA_DIR/$ID_FILE out=$OUT_DIR backend=$BACKEND gpus=$N_GPUS" >&2
exec "$PYTHON" -m exgrpo.eval "${args[@]}" "$@"
