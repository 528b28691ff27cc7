#!/usr/bin/env bash
# Shared part of scripts/eval/eval_id.sh and eval_ood.sh (sourced, not run). Reads the environment described in
# those scripts; each defines its data files and calls eval_run.
# shellcheck disable=SC2034  # variables are read by the sourcing script

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
# shellcheck source=scripts/lib/python.sh
source "$REPO_ROOT/scripts/lib/python.sh"
PYTHON_HINT="bash scripts/install_gpu.sh installs the GPU stack (vLLM) into the current environment; with BACKEND=hf \
bash scripts/setup_env.sh builds .venv, the CPU stack"
MERGE_HINT="python -m verl.model_merger merge --backend fsdp --local_dir CKPT/global_step_N/actor \
--target_dir CKPT/global_step_N/merged_hf"

eval_die() {
  echo "error: $*" >&2
  exit 2
}

# eval_require_model SCRIPT: MODEL_PATH must name a Hugging Face model directory that holds weights. verl's
# global_step_N/actor/huggingface holds only the config and tokenizer (the weights are FSDP shards in actor/).
eval_require_model() {
  if [[ -n "${EVAL_CHECK_ONLY:-}" && "${EVAL_CHECK_ONLY}" != 0 ]]; then return 0; fi
  if [[ "${DRY_RUN:-0}" == print ]]; then return 0; fi
  if [[ -z "${MODEL_PATH:-}" ]]; then
    eval_die "MODEL_PATH is not set; point it at a Hugging Face model directory with weights, e.g. the merged" \
      "checkpoint of a training run: $MERGE_HINT, then MODEL_PATH=CKPT/global_step_N/merged_hf bash scripts/eval/$1"
  fi
  [[ -d "$MODEL_PATH" ]] || eval_die "MODEL_PATH=$MODEL_PATH is not a directory"
  if ! compgen -G "$MODEL_PATH/*.safetensors" >/dev/null && ! compgen -G "$MODEL_PATH/*.bin" >/dev/null; then
    eval_die "MODEL_PATH=$MODEL_PATH holds no weights (*.safetensors, *.bin). verl's actor/huggingface folder" \
      "has only the config and tokenizer; merge the FSDP shards first: $MERGE_HINT"
  fi
}

# The benchmark parquets: DATA_DIR, default data/benchmarks (bash scripts/prepare_data.sh writes them there).
eval_data_dir() {
  echo "${DATA_DIR:-$REPO_ROOT/data/benchmarks}"
}

# eval_data_file NAME: the path of a benchmark file: NAME itself when it is a path (absolute, or with a folder),
# else NAME inside DATA_DIR
eval_data_file() {
  if [[ "$1" == */* ]]; then echo "$1"; else echo "$(eval_data_dir)/$1"; fi
}

# eval_missing_data SUITE PATH HINT: a data file that is not there stops the script (exit 2), except for DRY_RUN=print,
# which prints the command all the same and says the file is missing
eval_missing_data() {
  if [[ "${DRY_RUN:-0}" == print ]]; then
    echo "[eval_$1] note: $2 not found (a real run would stop here; $3)" >&2
    return 0
  fi
  eval_die "$2 not found; $3"
}

# <experiment>/<global_step_N> for verl checkpoints (.../global_step_N/merged_hf), else the directory name
model_name() {
  local p="${1%/}" b
  while [[ "$(basename "$p")" =~ ^(huggingface|hf|merged_hf|actor)$ ]]; do p="$(dirname "$p")"; done
  b="$(basename "$p")"
  if [[ "$b" =~ ^(global_step_|checkpoint-|step_) ]]; then b="$(basename "$(dirname "$p")")/$b"; fi
  echo "$b"
}

# eval_run SUITE DATA_FILE... -- EXTRA_FLAGS...: python -m exgrpo.eval run at the protocol's settings, one engine
# replica per TP GPUs (N_GPUS / TP replicas). DRY_RUN=print prints the command instead of running it.
eval_run() {
  local suite="$1" files=()
  shift
  while [[ $# -gt 0 && "$1" != "--" ]]; do files+=("$1"); shift; done
  [[ "${1:-}" == "--" ]] && shift
  if [[ -n "${EVAL_CHECK_ONLY:-}" && "${EVAL_CHECK_ONLY}" != 0 ]]; then
    echo "[eval_$suite] data ok: ${files[*]}" >&2
    exit 0
  fi
  [[ "${DRY_RUN:-0}" != print ]] || MODEL_PATH="${MODEL_PATH:-MODEL_PATH}"
  local n_gpus="${N_GPUS:-1}" tp="${TP:-1}" backend="${BACKEND:-vllm}" grading="${GRADING:-paper}" gate
  [[ "$n_gpus" =~ ^[1-9][0-9]*$ && "$tp" =~ ^[1-9][0-9]*$ ]] || eval_die "N_GPUS and TP must be positive integers"
  ((n_gpus % tp == 0)) || eval_die "TP=$tp must divide N_GPUS=$n_gpus (one engine replica per $tp GPUs)"
  local out_dir="${OUT_DIR:-$REPO_ROOT/outputs/eval/$(model_name "$MODEL_PATH")/$suite}"
  if [[ "${THINK_GATE:-1}" == "1" ]]; then gate=--think-gate; else gate=--no-think-gate; fi
  local args=(run --model "$MODEL_PATH" --data "${files[@]}" --out "$out_dir" --backend "$backend"
              --tensor-parallel-size "$tp" --data-parallel-size "$((n_gpus / tp))" --temperature 0.6 --top-p 1.0
              --max-new-tokens 8192 --seed "${SEED:-0}" --template "${TEMPLATE:-chat}" --grading "$grading" "$gate"
              --reference "${REFERENCE:-table1}")
  [[ -n "${LABEL:-}" ]] && args+=(--label "$LABEL")
  cd "$REPO_ROOT" || exit 2
  if [[ "${DRY_RUN:-0}" == print ]]; then
    printf '%q ' "${PYTHON:-python}" -m exgrpo.eval "${args[@]}" "$@"
    echo
    exit 0
  fi
  local engine=torch
  [[ "$backend" != vllm ]] || engine=vllm
  exgrpo_pick_python "$REPO_ROOT" "eval_$suite" "$PYTHON_HINT" pyarrow math_verify transformers "$engine"
  echo "[eval_$suite] model=$MODEL_PATH data=${files[*]} out=$out_dir backend=$backend" \
    "replicas=$((n_gpus / tp)) x TP $tp grading=$grading" >&2
  exec "$PYTHON" -m exgrpo.eval "${args[@]}" "$@"
}
