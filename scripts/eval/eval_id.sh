#!/usr/bin/env bash
# In-distribution suite of the paper: AIME24, AIME25, AMC (avg@32), MATH-500, Minerva, OlympiadBench (pass@1);
# T=0.6, top-p 1.0, 8192 new tokens; vLLM on GPUs, one engine replica per TP GPUs. Graded as the paper's final
# evaluation (last \boxed{} after the first </think>; docs/evaluation.md). Resumable: rerun the same command after
# an interruption and only the missing samples are generated.
#
#   MODEL_PATH=CKPT/global_step_N/merged_hf N_GPUS=8 bash scripts/eval/eval_id.sh [extra exgrpo.eval flags]
#
# Environment:
#   MODEL_PATH   (required) Hugging Face model directory with weights; for a training checkpoint merge it first:
#                python -m verl.model_merger merge --backend fsdp --local_dir CKPT/global_step_N/actor \
#                  --target_dir CKPT/global_step_N/merged_hf
#   DATA_DIR     benchmark parquets (default: data/benchmarks, written by bash scripts/prepare_data.sh)
#   ID_FILE      the ID parquet: a name inside DATA_DIR, or a path (default: test_id.parquet, which repeats
#                AIME/AMC 32x)
#   OUT_DIR      output directory (default: outputs/eval/<model name>/id)
#   N_GPUS       GPUs to use (default: 1); TP: tensor parallel size of each engine replica (default: 1);
#                N_GPUS / TP replicas run side by side on their own GPUs
#   BACKEND      vllm (default) or hf
#   TEMPLATE     chat (default: the model's own chat template, the dataset's system message dropped), plain, or
#                llama_base (the paper's Llama-3.1-8B base prompt)
#   GRADING      paper (default) or reward (the training reward's rule; THINK_GATE=1/0 then sets its gate)
#   LABEL        row name in the table (default: from MODEL_PATH)
#   REFERENCE    table1 (default), table5 or none: the paper's rows printed beside ours
#   EVAL_CHECK_ONLY  1: only check that the data files exist (no model needed), then exit
#   DRY_RUN      print: print the python -m exgrpo.eval command instead of running it (no model or data needed)
#   PYTHON       default: an activated environment's python, else the checkout's .venv, else python on PATH (the
#                first that has the packages; scripts/lib/python.sh)
set -euo pipefail

# shellcheck source=scripts/eval/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
eval_require_model eval_id.sh
ID_FILE="$(eval_data_file "${ID_FILE:-test_id.parquet}")"
if [[ ! -f "$ID_FILE" ]]; then
  eval_missing_data id "$ID_FILE" "write it with: bash scripts/prepare_data.sh (or set DATA_DIR / ID_FILE)"
fi
eval_run id "$ID_FILE" -- "$@"
