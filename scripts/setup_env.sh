#!/usr/bin/env bash
# Create (or reuse) the CPU virtual environment for tests and the CPU demo.
# Idempotent: re-installs only when requirements-cpu.txt, constraints-cpu.txt or setup.py change.
#   VENV=path   where the venv lives (default: <repo>/.venv)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${VENV:-$ROOT/.venv}"
PY="${PYTHON:-python3}"
STAMP="$VENV/.exgrpo-setup-stamp"
want="$(cat "$ROOT/requirements-cpu.txt" "$ROOT/constraints-cpu.txt" "$ROOT/setup.py" | sha256sum | cut -d' ' -f1)"

if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$want" ] && [ -x "$VENV/bin/python" ]; then
  exit 0
fi
echo "[setup_env] preparing $VENV (torch 2.13.0 CPU build first, then verl 0.9.1 and the recipe's packages)" >&2
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
export PIP_DISABLE_PIP_VERSION_CHECK=1
# torch first: a plain/unpinned torch would pull a multi-GB CUDA build.
"$VENV/bin/python" -m pip install -q torch==2.13.0
"$VENV/bin/python" -m pip install -q -r "$ROOT/requirements-cpu.txt" -c "$ROOT/constraints-cpu.txt"
"$VENV/bin/python" -m pip install -q --no-deps --no-build-isolation -e "$ROOT"
"$VENV/bin/python" - <<'PY'
import torch
assert torch.__version__.startswith("2.13.0"), f"expected torch 2.13.0 (CPU build), got {torch.__version__}"
import verl  # noqa: F401
PY
echo "$want" > "$STAMP"
echo "[setup_env] ready: $VENV" >&2
