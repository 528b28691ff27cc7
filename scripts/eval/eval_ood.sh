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

# shellcheck source=scripts/eval/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
eval_require_model eval_ood.sh
DATA_DIR="$(eval_data_dir)"
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
eval_run ood "${files[@]}" -- "$@"
