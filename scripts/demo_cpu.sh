#!/usr/bin/env bash
# The README's main command: a tiny ExGRPO training through the real verl trainer, on CPU, offline.
# Sets up .venv on first use, builds (once, cached) the tiny warmed-up model and the toy arithmetic data
# (easy/medium/hard), runs ExGRPO for 60 steps printing one line per step (verl's full log goes to
# outputs/cpu_demo/train.log), and ends with a summary and a PNG learning curve (validation accuracy per
# difficulty, batch pass rate, pool size, replayed share). Extra arguments go to recipe.exgrpo.cpu_demo
# (e.g. --seed 2, --onpolicy, --steps 30, --verbose, exgrpo.replay_ratio=0.25). docs/learning.md has the figures.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${VENV:-$ROOT/.venv}"
bash "$ROOT/scripts/setup_env.sh"
cd "$ROOT"
exec "$VENV/bin/python" -m recipe.exgrpo.cpu_demo "$@"
