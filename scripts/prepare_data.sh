#!/usr/bin/env bash
# Writes every data file of the training, evaluation and reproduction scripts at the path they read by default:
#
#   data/openr1/train.parquet             OpenR1-Math 46k training set                   TRAIN_FILE of scripts/train
#   data/valid/valid_id.parquet           in-training validation: AIME24/AIME25 x8, AMC x4, MATH-500, Minerva,
#                                         OlympiadBench (the released valid set)          VAL_FILE of scripts/train
#   data/benchmarks/test_id.parquet       ID evaluation: AIME24, AIME25, AMC x32 (avg@32), MATH-500, Minerva,
#                                         OlympiadBench                                   scripts/eval/eval_id.sh
#   data/benchmarks/{arc_c,gpqa_diamond,mmlu_pro}.parquet   OOD evaluation                scripts/eval/eval_ood.sh
#
# PROMPT_STYLE=llama_base (the Llama-3.1-8B base run) writes data/openr1/train_llama_base.parquet and
# data/valid_llama_base/valid_id.parquet instead of the first two; the evaluation files serve every backbone
# (exgrpo.eval renders their user message with the model's template, or --template llama_base).
# PROMPT_STYLE=tir (tool-integrated reasoning, scripts/train/*_tir.sh) writes data/openr1_tir/train.parquet and
# data/valid_tir/valid_id.parquet instead: the tir system instruction and agent_name=tool_agent on every row, and with
# PARTS=eval data/benchmarks_tir/test_id.parquet (the ID suite so, for scripts/eval/eval_tir.sh). Only when asked:
# the default run writes none of them.
#
#   MODEL_PATH=/models/Qwen2.5-Math-7B-16k bash scripts/prepare_data.sh
#   PROMPT_STYLE=llama_base MODEL_PATH=/models/Llama-3.1-8B bash scripts/prepare_data.sh
#   PROMPT_STYLE=tir PARTS=train,valid MODEL_PATH=/models/Qwen2.5-7B-Instruct bash scripts/prepare_data.sh
#
# Environment:
#   MODEL_PATH    tokenizer for the 1024-token prompt filter of the training set (unset: no filter)
#   PROMPT_STYLE  chat (default), llama_base or tir
#   PARTS         comma list of train, valid, eval (default: all three)
#   DATA_ROOT     where the files go (default data, relative to the repository); the training and evaluation
#                 scripts then need TRAIN_FILE, VAL_FILE (and DATA_DIR for scripts/eval) pointed there
#   PYTHON        default: an activated environment's python, else the checkout's .venv, else python on PATH (the
#                 first that has the packages; scripts/lib/python.sh); the script says which
#   DRY_RUN       1: print the commands only
# The sets come from the Hugging Face Hub (datasets.load_dataset; GPQA is gated: accept its terms and log in with
# `hf auth login`). The script asks once whether the Hub answers; when it does not (or with HF_HUB_OFFLINE=1) every
# command reads only the local Hugging Face cache. Without the Hub, run the commands below by hand with
# --input NAME=FILE (docs/rewards_and_data.md).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
# shellcheck source=scripts/lib/python.sh
source scripts/lib/python.sh
needs=(pyarrow tqdm math_verify datasets)
[[ -z "${MODEL_PATH:-}" ]] || needs+=(transformers)
EXGRPO_PICK_SOFT="$([[ "${DRY_RUN:-0}" == 1 ]] && echo 1 || echo 0)" exgrpo_pick_python "$PWD" prepare_data \
  "bash scripts/setup_env.sh builds .venv with them" "${needs[@]}"
ROOT="${DATA_ROOT:-data}"
STYLE="${PROMPT_STYLE:-chat}"
PARTS=",${PARTS:-train,valid,eval},"
ID_BENCHMARKS=aime24,aime25,amc,math500,minerva,olympiad_bench
case "$STYLE" in
  chat) train="$ROOT/openr1/train.parquet" valid_dir="$ROOT/valid" ;;
  llama_base) train="$ROOT/openr1/train_llama_base.parquet" valid_dir="$ROOT/valid_llama_base" ;;
  tir) train="$ROOT/openr1_tir/train.parquet" valid_dir="$ROOT/valid_tir" ;;
  *) echo "error: PROMPT_STYLE=$STYLE: use chat, llama_base or tir" >&2; exit 2 ;;
esac

run() {
  echo "+ $*" >&2
  [[ "${DRY_RUN:-0}" == 1 ]] || "$@"
}

# One question to the Hub for all the commands (each would otherwise retry for ~24 s before failing offline).
if [[ "${DRY_RUN:-0}" != 1 && -z "${HF_HUB_OFFLINE:-}" ]] && ! "$PYTHON" -m data_preprocess.hub; then
  export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1
  echo "[prepare_data] every command reads only the local Hugging Face cache (HF_HUB_OFFLINE=1); a set it does not" \
    "hold stops with what to pass instead (--input NAME=FILE, docs/rewards_and_data.md)" >&2
fi

if [[ "$PARTS" == *,train,* ]]; then
  tokenizer=()
  if [[ -n "${MODEL_PATH:-}" ]]; then tokenizer=(--tokenizer "$MODEL_PATH")
  else echo "[prepare_data] MODEL_PATH is not set: the training set is written without the prompt-length filter" >&2; fi
  run "$PYTHON" -m data_preprocess.openr1_math --output "$train" --prompt-style "$STYLE" "${tokenizer[@]}"
fi
if [[ "$PARTS" == *,valid,* ]]; then
  run "$PYTHON" -m data_preprocess.benchmarks --output-dir "$valid_dir" --benchmarks "$ID_BENCHMARKS" \
    --repeat aime24=8,aime25=8,amc=4 --combined valid_id.parquet --prompt-style "$STYLE"
fi
if [[ "$PARTS" == *,eval,* && "$STYLE" == tir ]]; then
  # the ID suite for scripts/eval/eval_tir.sh: the TIR instruction (it offers the tool) on every row
  run "$PYTHON" -m data_preprocess.benchmarks --output-dir "$ROOT/benchmarks_tir" --benchmarks "$ID_BENCHMARKS" \
    --repeat 32 --combined test_id.parquet --prompt-style tir
elif [[ "$PARTS" == *,eval,* ]]; then
  run "$PYTHON" -m data_preprocess.benchmarks --output-dir "$ROOT/benchmarks" --benchmarks "$ID_BENCHMARKS" \
    --repeat 32 --combined test_id.parquet
  run "$PYTHON" -m data_preprocess.benchmarks --output-dir "$ROOT/benchmarks" --benchmarks arc_c,gpqa_diamond,mmlu_pro
fi
