#!/usr/bin/env bash
# IFEval of a merged checkpoint with lm-evaluation-harness's ifeval task (the benchmark's reference instruction
# checkers), on vLLM: the model's own chat template, greedy decoding, lm-eval's 1280 new tokens; then the table beside
# the paper's Table 2 (python -m exgrpo.eval.instruction_following). docs/evaluation.md, "Instruction following".
#
#   pip install "lm-eval[ifeval,vllm]==0.4.13"        # into the GPU environment (not part of requirements.txt)
#   MODEL_PATH=CKPT/global_step_N/merged_hf N_GPUS=8 bash scripts/eval/eval_ifeval.sh [extra lm_eval flags]
#
# Environment:
#   MODEL_PATH   (required) a Hugging Face directory with weights (verl checkpoints: merge first, see eval_id.sh)
#   N_GPUS       GPUs (default 1); TP GPUs per vLLM replica (default 1; N_GPUS / TP data-parallel replicas)
#   OUT_DIR      lm-eval's --output_path (default outputs/eval/<experiment>/<global_step_N>/ifeval)
#   LABEL        name of this run's row in the table (default: from MODEL_PATH)
#   PYTHON       python of the environment with lm-eval (default: the first of an activated environment's python,
#                the checkout's .venv and python on PATH that has lm_eval and vllm); DRY_RUN=print shows the command only
# Offline (no Hub on the GPU machine): run once where the Hub is reachable
#   python -c 'import datasets; datasets.load_dataset("google/IFEval")'   # the prompts, into HF_DATASETS_CACHE
#   python -m nltk.downloader punkt_tab                                    # the sentence tokenizer, into NLTK_DATA
# then copy both caches and set HF_DATASETS_OFFLINE=1 HF_HUB_OFFLINE=1 (lm-eval downloads punkt_tab at import
# time when it is missing, which fails offline).
set -euo pipefail

# shellcheck source=scripts/eval/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
if [[ "${DRY_RUN:-0}" != print ]]; then eval_require_model eval_ifeval.sh; fi
if [[ "${DRY_RUN:-0}" == print ]]; then
  PYTHON="${PYTHON:-python}"
else
  exgrpo_pick_python "$REPO_ROOT" eval_ifeval 'pip install "lm-eval[ifeval,vllm]==0.4.13" into the GPU environment' \
    lm_eval vllm
fi
n_gpus="${N_GPUS:-1}" tp="${TP:-1}"
[[ "$n_gpus" =~ ^[1-9][0-9]*$ && "$tp" =~ ^[1-9][0-9]*$ ]] || eval_die "N_GPUS and TP must be positive integers"
((n_gpus % tp == 0)) || eval_die "TP=$tp must divide N_GPUS=$n_gpus (one vLLM replica per $tp GPUs)"
out_dir="${OUT_DIR:-$REPO_ROOT/outputs/eval/$(model_name "${MODEL_PATH:-model}")/ifeval}"
model_args="pretrained=${MODEL_PATH:-MODEL_PATH},tensor_parallel_size=$tp,data_parallel_size=$((n_gpus / tp))"
model_args+=",dtype=bfloat16,gpu_memory_utilization=0.8,seed=${SEED:-0}"
cmd=("$PYTHON" -m lm_eval --model vllm --model_args "$model_args" --tasks ifeval --apply_chat_template
  --batch_size auto --seed "${SEED:-0}" --output_path "$out_dir" --log_samples "$@")
table=("$PYTHON" -m exgrpo.eval.instruction_following "$out_dir" --label "${LABEL:-$(model_name "${MODEL_PATH:-model}")}")
if [[ "${DRY_RUN:-0}" == print ]]; then
  printf '%q ' "${cmd[@]}"
  echo
  printf '%q ' "${table[@]}"
  echo
  exit 0
fi
"$PYTHON" - <<'PY' || eval_die "lm-eval's ifeval task is not ready (above); see the header of scripts/eval/eval_ifeval.sh"
import importlib.metadata as md, sys
try:
    print(f"[eval_ifeval] lm-eval {md.version('lm_eval')}", file=sys.stderr)
    import langdetect, immutabledict, nltk  # noqa: F401  (lm-eval[ifeval])
except Exception as e:
    sys.exit(f'[eval_ifeval] {e}: pip install "lm-eval[ifeval,vllm]==0.4.13"')
try:
    nltk.data.find("tokenizers/punkt_tab")
except LookupError:
    sys.exit("[eval_ifeval] nltk's punkt_tab is missing: python -m nltk.downloader punkt_tab (or set NLTK_DATA)")
PY
cd "$REPO_ROOT"
echo "[eval_ifeval] model=$MODEL_PATH out=$out_dir replicas=$((n_gpus / tp)) x TP $tp" >&2
"${cmd[@]}"
"${table[@]}" | tee "$out_dir/table.md"
