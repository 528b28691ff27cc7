#!/usr/bin/env bash
# Installs the GPU stack into the current Python environment (a fresh venv or conda env is best), then checks it:
#
#   1. requirements.txt with requirements-gpu.lock as constraints: verl[vllm] 0.9.1, torch 2.11.0, vLLM 0.24.0,
#      transformers 5.9.0 and every dependency at the version of the lock (scripts/lock_gpu.sh makes it), so the
#      resolver has one candidate per package: no backtracking, the same versions on every machine.
#        uv pip install --python PYTHON -r requirements.txt -c requirements-gpu.lock    when uv is on PATH
#        PYTHON -m pip install -r requirements.txt -c requirements-gpu.lock            otherwise
#   2. flash-attn 2.8.3                       a prebuilt wheel for torch 2.11 + CUDA 13.0 + this Python (the one verl's
#                                             own installer uses); FLASH_ATTN=source builds it from PyPI's source
#                                             instead, which needs torch (step 1) and nvcc (CUDA 13.0 toolkit)
#   3. pip install -e . --no-deps           this recipe
#   4. python -m recipe.exgrpo.env_check    prints what is installed and exits 1 on any problem
#
# Needs: Linux x86_64, Python 3.10-3.12, NVIDIA GPUs of compute capability >= 7.5 and a driver of the 580 branch
# or newer: the torch 2.11.0 and vLLM 0.24.0 wheels on PyPI are CUDA 13.0 builds (cuda-toolkit 13.0.2).
#
#   bash scripts/install_gpu.sh
#   PYTHON=/opt/envs/exgrpo/bin/python FLASH_ATTN=source MAX_JOBS=16 bash scripts/install_gpu.sh
#
# Environment:
#   PYTHON       the environment's python (default: python)
#   INSTALLER    step 1's installer: auto (default: uv when found, else pip), uv, pip. uv reads its own settings
#                (uv.toml, UV_INDEX_URL), not pip's: INSTALLER=pip where a pip configuration names the index
#   UV           the uv executable (default: uv)
#   FLASH_ATTN   wheel (default: the prebuilt wheel, else stop and say what to do), source (build from PyPI's
#                source: 20-30 min on 32 cores, MAX_JOBS limits the parallel compile jobs), skip
#   FLASH_ATTN_WHEEL  a wheel URL or file to use instead of the default one
#   DRY_RUN      1: print the commands, install nothing
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
PYTHON="${PYTHON:-python}"
FLASH_ATTN="${FLASH_ATTN:-wheel}"
INSTALLER="${INSTALLER:-auto}"
UV="${UV:-uv}"
LOCK=requirements-gpu.lock
FLASH_ATTN_VERSION=2.8.3
# Prebuilt flash-attn wheels matched to (CUDA 13.0, torch 2.11, CPython ABI): the release verl 0.9.1 installs from.
FLASH_ATTN_RELEASE=https://github.com/mjun0812/flash-attention-prebuild-wheels/releases/download/v0.9.4

say() { echo "[install_gpu] $*" >&2; }
die() {
  echo "[install_gpu] error: $*" >&2
  exit 2
}
run() {
  echo "+ $*" >&2
  [[ "${DRY_RUN:-0}" == 1 ]] || "$@"
}

case "$FLASH_ATTN" in wheel | source | skip) ;; *) die "FLASH_ATTN=$FLASH_ATTN: use wheel, source or skip" ;; esac
case "$INSTALLER" in
  auto) if command -v "$UV" >/dev/null; then INSTALLER=uv; else INSTALLER=pip; fi ;;
  uv) command -v "$UV" >/dev/null || die "INSTALLER=uv but UV=$UV is not found (pip install uv, or INSTALLER=pip)" ;;
  pip) ;;
  *) die "INSTALLER=$INSTALLER: use auto, uv or pip" ;;
esac
[[ -f "$LOCK" ]] || die "$LOCK not found in $(pwd): regenerate it with bash scripts/lock_gpu.sh"
pyver="$("$PYTHON" -c 'import sys; print(f"{sys.version_info[0]}{sys.version_info[1]}")')" ||
  die "cannot run PYTHON=$PYTHON"
[[ "$pyver" =~ ^3(10|11|12)$ ]] || die "Python $pyver: the GPU stack needs Python 3.10, 3.11 or 3.12"
# steps 2 and 3 use the environment's pip (an environment made by uv venv has none)
"$PYTHON" -m pip --version >/dev/null 2>&1 ||
  die "PYTHON=$PYTHON has no pip (python -m pip fails). Add it first: $UV pip install --python $PYTHON pip"
[[ "$(uname -s)-$(uname -m)" == Linux-x86_64 ]] || say "warning: the pinned wheels are for Linux x86_64; this is $(uname -sm)"
if command -v nvidia-smi >/dev/null; then
  driver="$(nvidia-smi --query-gpu=driver_version --format=csv,noheader 2>/dev/null | head -n 1 || true)"
  say "NVIDIA driver ${driver:-unknown}"
  if [[ "${driver%%.*}" =~ ^[0-9]+$ ]] && ((${driver%%.*} < 580)); then
    say "warning: driver $driver is older than the 580 branch that CUDA 13.0 needs: torch 2.11.0 and vLLM 0.24.0" \
      "will not see the GPUs. Update the driver (or use an older verl/vLLM/torch stack built for CUDA 12)."
  fi
else
  say "warning: nvidia-smi not found: is this a GPU machine with the NVIDIA driver (580 or newer)?"
fi

if [[ "$INSTALLER" == uv ]]; then
  run "$UV" pip install --python "$("$PYTHON" -c 'import sys; print(sys.executable)')" -r requirements.txt -c "$LOCK"
else
  run "$PYTHON" -m pip install -r requirements.txt -c "$LOCK"
fi

case "$FLASH_ATTN" in
  wheel)
    wheel="${FLASH_ATTN_WHEEL:-$FLASH_ATTN_RELEASE/flash_attn-${FLASH_ATTN_VERSION}%2Bcu130torch2.11-cp${pyver}-cp${pyver}-linux_x86_64.whl}"
    if ! run "$PYTHON" -m pip install --no-deps "$wheel"; then
      die "the prebuilt flash-attn wheel did not install ($wheel). Build it from source instead (needs nvcc of" \
        "CUDA 13.0; 20-30 min on 32 cores): FLASH_ATTN=source bash scripts/install_gpu.sh, or pass another wheel" \
        "with FLASH_ATTN_WHEEL=URL. Nothing after step 1 was installed."
    fi
    ;;
  source)
    command -v nvcc >/dev/null || say "warning: nvcc not found; the flash-attn build needs the CUDA 13.0 toolkit (CUDA_HOME)"
    # --no-build-isolation: the build imports the torch installed in step 1
    run "$PYTHON" -m pip install --no-build-isolation -r requirements-flash-attn.txt
    ;;
  skip) say "flash-attn skipped (FLASH_ATTN=skip): verl's remove-padding and flash attention need it for training" ;;
esac

run "$PYTHON" -m pip install -e . --no-deps
if [[ "${DRY_RUN:-0}" == 1 ]]; then
  echo "+ $PYTHON -m recipe.exgrpo.env_check" >&2
else
  "$PYTHON" -m recipe.exgrpo.env_check
fi
