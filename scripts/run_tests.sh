#!/usr/bin/env bash
# The project's test command (what CI runs): sets up the CPU venv and the vLLM CPU stack's venv, lints and checks
# the formatting (ruff), then runs the whole suite, the slow real-verl runs (the hf and the vllm rollout) included.
# Extra arguments go to pytest (e.g. -m "not slow", -k pool). EXGRPO_VLLM=0 skips the vLLM stack (its tests skip).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${VENV:-$ROOT/.venv}"
bash "$ROOT/scripts/setup_env.sh"
if [ "${EXGRPO_VLLM:-1}" != 0 ]; then
  bash "$ROOT/scripts/setup_env.sh" --vllm
  # the vLLM tests run the trainer with this interpreter, and fail (not skip) if it is missing
  export EXGRPO_VLLM_PYTHON="${VLLM_VENV:-$ROOT/.venv-vllm}/bin/python" EXGRPO_REQUIRE_VLLM=1
fi
cd "$ROOT"
"$VENV/bin/ruff" check .
"$VENV/bin/ruff" format --check .
exec "$VENV/bin/python" -m pytest "$@"
