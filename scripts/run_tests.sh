#!/usr/bin/env bash
# The project's test command (what CI runs): sets up the CPU venv, lints and checks the formatting (ruff), then
# runs the whole suite, the slow real-verl runs included. Extra arguments go to pytest (e.g. -m "not slow", -k pool).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${VENV:-$ROOT/.venv}"
bash "$ROOT/scripts/setup_env.sh"
cd "$ROOT"
"$VENV/bin/ruff" check .
"$VENV/bin/ruff" format --check .
exec "$VENV/bin/python" -m pytest "$@"
