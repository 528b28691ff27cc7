#!/usr/bin/env bash
# The README's main command: a tiny ExGRPO training through the real verl trainer, on CPU, offline.
# Sets up .venv on first use, builds (once, cached) the tiny warmed-up model and the toy arithmetic data, runs
# ExGRPO for a few dozen steps printing the per-step metrics, and ends with a summary (reward curve, pool
# growth, replay activity). Extra arguments go to recipe.exgrpo.cpu_demo (e.g. --steps 40, --onpolicy,
# exgrpo.replay_ratio=0.25).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${VENV:-$ROOT/.venv}"
bash "$ROOT/scripts/setup_env.sh"
cd "$ROOT"
exec "$VENV/bin/python" -m recipe.exgrpo.cpu_demo "$@"
