# shellcheck shell=bash
# Which Python the scripts run: sourced by scripts/train/common.sh, scripts/eval/common.sh and
# scripts/prepare_data.sh (docs/launch_scripts.md, "Which Python").
#
#   exgrpo_pick_python ROOT TAG HINT MODULE...
#
# sets and exports PYTHON and says on stderr which interpreter it is and why ("[TAG] python: ..."):
#   - PYTHON already set: that one, as it is (it must be a command that exists);
#   - else the first of these that finds every MODULE (importlib.util.find_spec: nothing is imported):
#       1. `python` of an activated environment (VIRTUAL_ENV or CONDA_PREFIX set),
#       2. ROOT/.venv/bin/python, the checkout's venv (bash scripts/setup_env.sh builds it: the CPU stack),
#       3. `python` on PATH.
# When none finds them: one line on stderr naming each candidate and what it lacks, HINT (what to install or
# set), and status 2. EXGRPO_PICK_SOFT=1 makes that a warning and leaves PYTHON=python (the dry runs that only
# show commands).

# exgrpo_python_lacks PY MODULE...: prints the MODULEs PY cannot find; status 1 when PY does not run at all.
exgrpo_python_lacks() {
  local py="$1"
  shift
  "$py" -c 'import importlib.util, sys
print(" ".join(m for m in sys.argv[1:] if importlib.util.find_spec(m) is None))' "$@" 2>/dev/null
}

exgrpo_pick_python() {
  local root="$1" tag="$2" hint="$3" missing cand why tried=() resolved
  shift 3
  if [[ -n "${PYTHON:-}" ]]; then
    resolved="$(command -v "$PYTHON" 2>/dev/null)" || {
      echo "[$tag] error: PYTHON=$PYTHON is not a command that exists here; point it at a python executable" >&2
      exit 2
    }
    export PYTHON
    echo "[$tag] python: $resolved (PYTHON)" >&2
    return 0
  fi
  local candidates=() reasons=()
  if [[ -n "${VIRTUAL_ENV:-}${CONDA_PREFIX:-}" ]] && command -v python >/dev/null 2>&1; then
    candidates+=("$(command -v python)")
    reasons+=("the activated environment ${VIRTUAL_ENV:-$CONDA_PREFIX}")
  fi
  candidates+=("$root/.venv/bin/python")
  reasons+=("the checkout's .venv")
  if command -v python >/dev/null 2>&1; then
    candidates+=("$(command -v python)")
    reasons+=("python on PATH")
  fi
  local i
  for i in "${!candidates[@]}"; do
    cand="${candidates[$i]}"
    why="${reasons[$i]}"
    if [[ ! -x "$cand" ]]; then
      tried+=("$cand: not there")
      continue
    fi
    if ! missing="$(exgrpo_python_lacks "$cand" "$@")"; then
      tried+=("$cand: does not run")
      continue
    fi
    if [[ -z "$missing" ]]; then
      PYTHON="$cand"
      export PYTHON
      echo "[$tag] python: $cand ($why; PYTHON unset: set it to use another)" >&2
      return 0
    fi
    tried+=("$cand: lacks ${missing// /, }")
  done
  command -v python >/dev/null 2>&1 || tried+=("no python on PATH")
  local msg t list="" wanted="$*"
  for t in "${tried[@]}"; do list+="${list:+; }$t"; done
  msg="no Python here has ${wanted// /, } (tried: $list). Set PYTHON to the python of the environment that has them: $hint"
  if [[ "${EXGRPO_PICK_SOFT:-0}" == 1 ]]; then
    echo "[$tag] warning: $msg" >&2
    PYTHON=python
    return 0
  fi
  echo "[$tag] error: $msg" >&2
  exit 2
}
