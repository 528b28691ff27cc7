#!/usr/bin/env bash
# Shared part of scripts/eval/eval_id.sh and eval_ood.sh (sourced, not run). Reads the environment described in
# those scripts; each defines its data files and calls eval_run.
# shellcheck disable=SC2034  # variables are read by the sourcing script

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"

# eval_require_model SCRIPT: MODEL_PATH must name a Hugging Face checkpoint directory
eval_require_model() {
  if [[ -z "${MODEL_PATH:-}" ]]; then
    echo "error: MODEL_PATH is not set; point it at a Hugging Face checkpoint directory, e.g." >&2
    echo "  MODEL_PATH=/ckpts/exgrpo/global_step_500/actor/huggingface bash scripts/eval/$1" >&2
    exit 2
  fi
  if [[ ! -d "$MODEL_PATH" ]]; then
    echo "error: MODEL_PATH=$MODEL_PATH is not a directory" >&2
    exit 2
  fi
}

# DATA_DIR default: ../shared/data/benchmarks next to the repo, else data/benchmarks
eval_data_dir() {
  if [[ -n "${DATA_DIR:-}" ]]; then echo "$DATA_DIR"
  elif [[ -d "$REPO_ROOT/../shared/data/benchmarks" ]]; then echo "$REPO_ROOT/../shared/data/benchmarks"
  else echo "$REPO_ROOT/data/benchmarks"; fi
}

# <experiment>/<global_step_N> for verl checkpoints (.../global_step_N/actor/huggingface), else the directory name
model_name() {
  local p="${1%/}" b
  while [[ "$(basename "$p")" =~ ^(huggingface|hf|actor)$ ]]; do p="$(dirname "$p")"; done
  b="$(basename "$p")"
  if [[ "$b" =~ ^(global_step_|checkpoint-|step_) ]]; then b="$(basename "$(dirname "$p")")/$b"; fi
  echo "$b"
}

# eval_run SUITE DATA_FILE... -- EXTRA_FLAGS...: python -m exgrpo.eval run at the protocol's settings
eval_run() {
  local suite="$1" gate
  shift
  local files=()
  while [[ $# -gt 0 && "$1" != "--" ]]; do files+=("$1"); shift; done
  [[ "${1:-}" == "--" ]] && shift
  local n_gpus="${N_GPUS:-1}" backend="${BACKEND:-vllm}"
  local out_dir="${OUT_DIR:-$REPO_ROOT/outputs/eval/$(model_name "$MODEL_PATH")/$suite}"
  if [[ "${THINK_GATE:-1}" == "1" ]]; then gate=--think-gate; else gate=--no-think-gate; fi
  local args=(run --model "$MODEL_PATH" --data "${files[@]}" --out "$out_dir" --backend "$backend"
              --tensor-parallel-size "$n_gpus" --temperature 0.6 --top-p 1.0 --max-new-tokens 8192
              --seed "${SEED:-0}" "$gate" --reference "${REFERENCE:-table1}")
  [[ -n "${LABEL:-}" ]] && args+=(--label "$LABEL")
  cd "$REPO_ROOT" || exit 2
  echo "[eval_$suite] model=$MODEL_PATH data=${files[*]} out=$out_dir backend=$backend gpus=$n_gpus" >&2
  exec "${PYTHON:-python}" -m exgrpo.eval "${args[@]}" "$@"
}
