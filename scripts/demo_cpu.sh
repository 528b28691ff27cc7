#!/usr/bin/env bash
# The README's main command: a tiny ExGRPO training through the real verl trainer, on CPU, offline.
# Sets up .venv on first use, builds (once, cached) the tiny warmed-up model and the toy arithmetic data
# (easy/medium/hard), runs ExGRPO for 60 steps printing one line per step (verl's full log goes to
# outputs/cpu_demo/train.log), and ends with a summary and a PNG learning curve (validation accuracy per
# difficulty, batch pass rate, pool size, replayed share). Extra arguments go to recipe.exgrpo.harness.demo
# (e.g. --seed 2, --onpolicy, --steps 30, --verbose, exgrpo.replay_ratio=0.25). docs/learning.md has the figures.
# --rollout vllm runs it on verl's vLLM rollout instead of the Hugging Face stand-in: it sets up the vLLM CPU stack
# in .venv-vllm on first use (about 7 minutes, 4.1 GB) and writes to outputs/cpu_demo_vllm (docs/cpu_backend.md).
# --tools runs the calculator task instead: verl's tool agent loop with an exact calculator function tool, on a tiny
# model whose warm-up taught it the call (its own build, once), printing and drawing the call rate per level
# (outputs/cpu_demo_tools; docs/tools.md). --trainer v1 runs it on verl's v1 trainer instead of the legacy one.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
rollout=hf
prev=""
for arg in "$@"; do
  case "$arg" in
    --rollout=*) rollout="${arg#--rollout=}" ;;
    *) [ "$prev" = "--rollout" ] && rollout="$arg" ;;
  esac
  prev="$arg"
done
if [ "$rollout" = vllm ]; then
  VENV="${VLLM_VENV:-$ROOT/.venv-vllm}"
  bash "$ROOT/scripts/setup_env.sh" --vllm
else
  VENV="${VENV:-$ROOT/.venv}"
  bash "$ROOT/scripts/setup_env.sh"
fi
cd "$ROOT"
exec "$VENV/bin/python" -m recipe.exgrpo.cpu_demo "$@"
