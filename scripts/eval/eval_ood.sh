#!/usr/bin/env bash
# Out-of-distribution suite of the paper (ALGORITHM.md §12): ARC-c, GPQA-Diamond, MMLU-Pro (pass@1);
# T=0.6, top-p 1.0, 8192 new tokens; vLLM on GPUs. Resumable (rerun the same command).
#
#   MODEL_PATH=/path/to/hf_checkpoint bash scripts/eval/eval_ood.sh [extra exgrpo.eval flags]
#
# Environment:
#   MODEL_PATH   (required) Hugging Face checkpoint directory
#   DATA_DIR     benchmark parquets (default: ../shared/data/benchmarks next to the repo, else data/benchmarks)
#   OOD_FILES    parquet names inside DATA_DIR (default: "arc_c.parquet gpqa_diamond.parquet mmlu_pro.parquet";
#                missing ones are skipped with a warning — MMLU-Pro comes from data_preprocess, not the repo)
#   OUT_DIR      output directory (default: outputs/eval/<model name>/ood)
#   N_GPUS       GPUs for vLLM tensor parallelism (default: 1)
#   BACKEND      vllm (default) or hf
#   THINK_GATE   1 (default: think-template models) or 0 (base / instruct models)
#   LABEL        row name in the table (default: from MODEL_PATH; use the same LABEL as eval_id.sh and then
#                `python -m exgrpo.eval report <id>/results.json <ood>/results.json` for one full row)
#   REFERENCE    table1 (default), table5 or none
set -euo pipefail

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
if [[ -z "${MODEL_PATH:-}" ]]; then
  echo "error: MODEL_PATH is not set; point it at a Hugging Face checkpoint directory, e.g." >&2
  echo "  MODEL_PATH=/ckpts/exgrpo/global_step_500/actor/huggingface bash scripts/eval/eval_ood.sh" >&2
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
read -r -a wanted <<< "${OOD_FILES:-arc_c.parquet gpqa_diamond.parquet mmlu_pro.parquet}"
files=()
for f in "${wanted[@]}"; do
  if [[ -f "$DATA_DIR/$f" ]]; then files+=("$DATA_DIR/$f")
  else echo "[eval_ood] warning: $DATA_DIR/$f not found, skipped (the OOD Avg will be partial)" >&2; fi
done
if [[ ${#files[@]} -eq 0 ]]; then
  echo "error: none of ${wanted[*]} found in DATA_DIR=$DATA_DIR" >&2
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
OUT_DIR="${OUT_DIR:-$REPO_ROOT/outputs/eval/$(model_name "$MODEL_PATH")/ood}"
if [[ "${THINK_GATE:-1}" == "1" ]]; then GATE=--think-gate; else GATE=--no-think-gate; fi
PYTHON="${PYTHON:-python}"

args=(run --model "$MODEL_PATH" --data "${files[@]}" --out "$OUT_DIR" --backend "$BACKEND"
      --tensor-parallel-size "$N_GPUS" --temperature 0.6 --top-p 1.0 --max-new-tokens 8192
      --seed "${SEED:-0}" "$GATE" --reference "${REFERENCE:-table1}")
[[ -n "${LABEL:-}" ]] && args+=(--label "$LABEL")

cd "$REPO_ROOT"
echo "[eval_ood] model=$MODEL_PATH data=${files[*]} out=$OUT_DIR backend=$BACKEND gpus=$N_GPUS" >&2
exec "$PYTHON" -m exgrpo.eval "${args[@]}" "$@"
