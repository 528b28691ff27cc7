#!/usr/bin/env bash
# Out-of-distribution suite of the paper: ARC-c, GPQA-Diamond, MMLU-Pro (pass@1); T=0.6, top-p 1.0, 8192 new
# tokens; vLLM on GPUs, one engine replica per TP GPUs; graded as the paper's final evaluation. Resumable.
#
#   MODEL_PATH=CKPT/global_step_N/merged_hf N_GPUS=8 bash scripts/eval/eval_ood.sh [extra exgrpo.eval flags]
#
# Environment: as scripts/eval/eval_id.sh, and
#   OOD_FILES    parquet names inside DATA_DIR, or paths (default: "arc_c.parquet gpqa_diamond.parquet
#                mmlu_pro.parquet"); missing ones are skipped with a warning and the OOD Avg is then marked
#                partial (†); with DRY_RUN=print they are printed all the same
#   OOD_REQUIRE_ALL  1: a missing OOD file is an error (the reproduction scripts set it)
#   LABEL        row name (default: from MODEL_PATH; the same LABEL as eval_id.sh, then
#                `python -m exgrpo.eval report <id>/results.json <ood>/results.json` for one full row)
set -euo pipefail

# shellcheck source=scripts/eval/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
eval_require_model eval_ood.sh
DATA_DIR="$(eval_data_dir)"
read -r -a wanted <<< "${OOD_FILES:-arc_c.parquet gpqa_diamond.parquet mmlu_pro.parquet}"
files=()
for f in "${wanted[@]}"; do
  path="$(eval_data_file "$f")"
  if [[ -f "$path" ]]; then files+=("$path")
  elif [[ "${DRY_RUN:-0}" == print ]]; then
    files+=("$path")
    eval_missing_data ood "$path" "write it with: bash scripts/prepare_data.sh (or set DATA_DIR / OOD_FILES)"
  elif [[ "${OOD_REQUIRE_ALL:-0}" == 1 ]]; then
    eval_die "$path not found; write it with: bash scripts/prepare_data.sh (or set DATA_DIR / OOD_FILES)"
  else echo "[eval_ood] warning: $path not found, skipped (the OOD Avg will be partial)" >&2; fi
done
if [[ ${#files[@]} -eq 0 ]]; then
  eval_die "none of ${wanted[*]} found in DATA_DIR=$DATA_DIR; write them with: bash scripts/prepare_data.sh"
fi
eval_run ood "${files[@]}" -- "$@"
