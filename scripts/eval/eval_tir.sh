#!/usr/bin/env bash
# Evaluation with the tool (tool-integrated reasoning): every answer a run of verl's tool agent loop, with the tool
# file, the tool-call parser, the turn limits, the tool answer's cut, the prompt and response lengths and the sandbox
# limits of the TIR training run (read from the training script's own overrides, DRY_RUN=print), the model's chat
# template with the tools' schemas, on vLLM (GPUs) or hf. avg@k / pass@1 as the other suites, plus per answer the
# tool calls, tool errors and turns (table.md, results.json). Graded as the paper's final evaluation, without the
# tool's answers (a tool that prints \boxed{} is not the model's answer). Resumable: rerun the same command.
#
#   MODEL_PATH=CKPT/global_step_N/merged_hf N_GPUS=8 bash scripts/eval/eval_tir.sh [extra tool_eval flags]
#   CPU=1 bash scripts/eval/eval_tir.sh           # the CPU form: the calculator task's model, with and without
#   CPU=1 BACKEND=vllm bash scripts/eval/eval_tir.sh    # its tool (builds the model if the cache lacks it)
#
# Environment:
#   MODEL_PATH    (required) Hugging Face model directory with weights (merge a training checkpoint first:
#                 python -m verl.model_merger merge --backend fsdp --local_dir CKPT/global_step_N/actor \
#                   --target_dir CKPT/global_step_N/merged_hf)
#   DATA_DIR      the TIR evaluation files (default: data/benchmarks_tir, written by
#                 PROMPT_STYLE=tir PARTS=eval bash scripts/prepare_data.sh: the ID suite with the TIR instruction)
#   TIR_FILE      the parquet inside DATA_DIR (default: test_id.parquet)
#   TRAIN_SCRIPT  the training run whose tool settings are used (default: scripts/train/exgrpo_qwen2.5_7b_instruct_tir.sh)
#   EXGRPO_SANDBOX_*  the sandbox's limits, as the training script reads them (its defaults otherwise)
#   OUT_DIR       output directory (default: outputs/eval/<model name>/tir)
#   N_GPUS, TP    GPUs, and GPUs per vLLM replica (default 1, 1); BACKEND vllm (default) or hf
#   LABEL, SEED, REFERENCE (default none), EVAL_CHECK_ONLY=1 (check the data only), DRY_RUN=print (print the
#   command), PYTHON (scripts/lib/python.sh)
#   CPU=1         the CPU form (recipe/exgrpo/harness/tool_eval_cpu.py): BACKEND hf (default) or vllm (the vLLM CPU
#                 stack, bash scripts/setup_env.sh --vllm), N_SAMPLES (per question, default 1), MAX_QUESTIONS (per
#                 level, default all 128), OUT_DIR (default outputs/eval_tir_cpu)
set -euo pipefail

# shellcheck source=scripts/eval/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
cd "$REPO_ROOT"

if [[ "${CPU:-0}" == 1 ]]; then
  backend="${BACKEND:-hf}"
  [[ "$backend" == hf || "$backend" == vllm ]] || eval_die "CPU=1 takes BACKEND=hf or vllm, got $backend"
  args=(--backend "$backend" --n-samples "${N_SAMPLES:-1}" --seed "${SEED:-0}")
  [[ -z "${MAX_QUESTIONS:-}" ]] || args+=(--max-questions-per-source "$MAX_QUESTIONS")
  [[ -z "${OUT_DIR:-}" ]] || args+=(--out "$OUT_DIR")
  if [[ "${DRY_RUN:-0}" == print ]]; then
    printf '%q ' "${PYTHON:-python}" -m recipe.exgrpo.harness.tool_eval_cpu "${args[@]}" "$@"
    echo
    exit 0
  fi
  if [[ "$backend" == vllm && -z "${PYTHON:-}" && -x "$REPO_ROOT/.venv-vllm/bin/python" ]]; then
    export PYTHON="$REPO_ROOT/.venv-vllm/bin/python"
  fi
  engine=torch
  [[ "$backend" != vllm ]] || engine=vllm
  exgrpo_pick_python "$REPO_ROOT" eval_tir "$PYTHON_HINT; for BACKEND=vllm: bash scripts/setup_env.sh --vllm" \
    pyarrow math_verify transformers verl "$engine"
  exec "$PYTHON" -m recipe.exgrpo.harness.tool_eval_cpu "${args[@]}" "$@"
fi

eval_require_model eval_tir.sh
DATA_DIR="${DATA_DIR:-$REPO_ROOT/data/benchmarks_tir}"
TIR_FILE="${TIR_FILE:-test_id.parquet}"
if [[ ! -f "$DATA_DIR/$TIR_FILE" ]]; then
  eval_die "$DATA_DIR/$TIR_FILE not found; write it with: PROMPT_STYLE=tir PARTS=eval bash scripts/prepare_data.sh" \
    "(or set DATA_DIR / TIR_FILE)"
fi
if [[ -n "${EVAL_CHECK_ONLY:-}" && "${EVAL_CHECK_ONLY}" != 0 ]]; then
  echo "[eval_tir] data ok: $DATA_DIR/$TIR_FILE" >&2
  exit 0
fi
[[ "${DRY_RUN:-0}" != print ]] || MODEL_PATH="${MODEL_PATH:-MODEL_PATH}"
TRAIN_SCRIPT="${TRAIN_SCRIPT:-$REPO_ROOT/scripts/train/exgrpo_qwen2.5_7b_instruct_tir.sh}"
# the training run's overrides, as it would launch with them (placeholders for its data files: not read here)
printed="$(DRY_RUN=print MODEL_PATH="$MODEL_PATH" bash "$TRAIN_SCRIPT")" ||
  eval_die "TRAIN_SCRIPT=$TRAIN_SCRIPT did not print its overrides (DRY_RUN=print)"
mapfile -t overrides < <(printf '%s\n' "$printed" | sed -n '/^# >>>/,/^# <<</p' | grep -v '^# ')
((${#overrides[@]})) || eval_die "TRAIN_SCRIPT=$TRAIN_SCRIPT printed no launch"
n_gpus="${N_GPUS:-1}" tp="${TP:-1}" backend="${BACKEND:-vllm}"
[[ "$n_gpus" =~ ^[1-9][0-9]*$ && "$tp" =~ ^[1-9][0-9]*$ ]] || eval_die "N_GPUS and TP must be positive integers"
((n_gpus % tp == 0)) || eval_die "TP=$tp must divide N_GPUS=$n_gpus (one engine replica per $tp GPUs)"
out_dir="${OUT_DIR:-$REPO_ROOT/outputs/eval/$(model_name "$MODEL_PATH")/tir}"
args=(run --model "$MODEL_PATH" --data "$DATA_DIR/$TIR_FILE" --out "$out_dir" --backend "$backend"
      --tensor-parallel-size "$tp" --data-parallel-size "$((n_gpus / tp))" --temperature 0.6 --top-p 1.0
      --seed "${SEED:-0}" --reference "${REFERENCE:-none}")
[[ -n "${LABEL:-}" ]] && args+=(--label "$LABEL")
args+=(--training-overrides "${overrides[@]}")
if [[ "${DRY_RUN:-0}" == print ]]; then
  printf '%q ' "${PYTHON:-python}" -m recipe.exgrpo.tool_eval "${args[@]}" "$@"
  echo
  exit 0
fi
engine=torch
[[ "$backend" != vllm ]] || engine=vllm
exgrpo_pick_python "$REPO_ROOT" eval_tir "$PYTHON_HINT" pyarrow math_verify transformers verl "$engine"
echo "[eval_tir] model=$MODEL_PATH data=$DATA_DIR/$TIR_FILE out=$out_dir backend=$backend" \
  "replicas=$((n_gpus / tp)) x TP $tp tool settings: $(basename "$TRAIN_SCRIPT")" >&2
exec "$PYTHON" -m recipe.exgrpo.tool_eval "${args[@]}" "$@"
