#!/usr/bin/env bash
# The project's test command (what CI runs): sets up the CPU venv and the vLLM CPU stack's venv, lints and checks
# the formatting (ruff), builds the docs site (mkdocs build --strict), then runs the whole suite, the slow real-verl
# runs (the hf and the vllm rollout) included.
# Extra arguments go to pytest (e.g. -m "not slow", -k pool): then one pytest session runs them, and nothing is built
# in the background (the tiny models are built by the tests that need them; the vLLM tests run on .venv-vllm when it
# exists and skip otherwise; EXGRPO_VLLM=1 builds it first). EXGRPO_VLLM=0 skips the vLLM stack (its tests skip).
#
# What waits on the network runs beside what needs the cores: once the CPU venv is ready, the vLLM venv is built in
# the background (its tests wait for it; a failed build fails them and this command), the two tiny models are built
# in the background (the tests that need them wait on the asset cache's lock). For the whole suite (no arguments)
# the tests run as four pytest sessions at once, because one real verl run leaves about a third of the two cores
# idle (its stages run one process at a time): the real verl runs on the hf rollout (tests/e2e, in this process's
# output), those on the vLLM stack, the unit and integration tests, and the GPU lock's resolution tests (the
# package index); the other three print their output after this one's. Background logs: .cache/test-logs/.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${VENV:-$ROOT/.venv}"
LOGS="$ROOT/.cache/test-logs"
GPU_LOCK_TESTS=tests/integration/test_gpu_lock_resolve.py
started=$(date +%s)
bash "$ROOT/scripts/setup_env.sh"
cd "$ROOT"
"$VENV/bin/ruff" check .
"$VENV/bin/ruff" format --check .
# the docs as a site (mkdocs.yml): a broken link or anchor in docs/ or the README fails the build (about 2 s)
NO_MKDOCS_2_WARNING=1 "$VENV/bin/python" -m mkdocs build --strict --quiet
mkdir -p "$LOGS"
PY="$VENV/bin/python"
# OpenMP's idle threads sleep instead of spinning, in every session and every run they start: the sessions share
# the two cores all the time, and libgomp's default spin-wait then holds a core at each parallel region's end. Same
# threads, same split of the work, so the same numbers; a tiny model's small ops, three processes at once on 2
# cores, ran 3-10x faster (benchmarks/omp_wait_policy.py). A caller's own setting is kept.
export OMP_WAIT_POLICY="${OMP_WAIT_POLICY:-PASSIVE}"

background=()
# shellcheck disable=SC2317  # called by the trap below
stop_background() {
  local pid
  for pid in "${background[@]}"; do kill "$pid" 2>/dev/null || true; done
}
trap stop_background EXIT

# the whole suite builds the vLLM stack and the tiny models beside the tests; a selection (arguments) builds nothing
# it may not need: its tests build the models they use, and the vLLM stack only with EXGRPO_VLLM=1
if [ $# -eq 0 ]; then vllm="${EXGRPO_VLLM:-1}"; else vllm="${EXGRPO_VLLM:-existing}"; fi
if [ "$vllm" = existing ]; then
  echo "[run_tests] a selection: nothing is built in the background (the tests build the tiny models they need;" \
    "the vLLM tests run on ${VLLM_VENV:-$ROOT/.venv-vllm} if it exists, else skip: EXGRPO_VLLM=1 builds it)" >&2
  export EXGRPO_VLLM_PYTHON="${VLLM_VENV:-$ROOT/.venv-vllm}/bin/python"
elif [ "$vllm" != 0 ]; then
  # the vLLM tests run the trainer with this interpreter, and fail (not skip) if it is missing
  export EXGRPO_VLLM_PYTHON="${VLLM_VENV:-$ROOT/.venv-vllm}/bin/python" EXGRPO_REQUIRE_VLLM=1
  export EXGRPO_VLLM_SETUP_STATUS="$LOGS/vllm-setup.status" EXGRPO_VLLM_SETUP_LOG="$LOGS/vllm-setup.log"
  rm -f "$EXGRPO_VLLM_SETUP_STATUS"
  (
    rc=0
    bash "$ROOT/scripts/setup_env.sh" --vllm >"$EXGRPO_VLLM_SETUP_LOG" 2>&1 || rc=$?
    echo "$rc" >"$EXGRPO_VLLM_SETUP_STATUS"
    exit "$rc"
  ) &
  vllm_setup=$!
  background+=("$vllm_setup")
  echo "[run_tests] building the vLLM CPU stack in the background (log: $EXGRPO_VLLM_SETUP_LOG)" >&2
fi

# both tiny models (hf and vllm), built at once into the asset cache before the tests that need them (logs
# assets-hf.log, assets-vllm.log), with the sleeping OpenMP threads above: with every core shared and spinning
# threads, the vLLM model's warm-up once ran at 4.4 s per step (0.46 for the hf one before the e2e runs began; same
# bytes checked: a seeded training loop hashes alike with and without the setting)
# Then the calculator task's model (assets-tools.log), which only the tool demo's test needs: it runs last in its
# session (marker built_late) and waits on the cache's lock while the build is still going, so that build overlaps
# the sessions' other tests instead of running inside that test (540 s of the vLLM session's 1,173 s once).
ASSETS_STATUS="$LOGS/assets.status"  # the build's exit code, once both ended
rm -f "$ASSETS_STATUS"
if [ $# -eq 0 ]; then
  (
    rc=0
    "$PY" -m recipe.exgrpo.harness.assets --rollout hf >"$LOGS/assets-hf.log" 2>&1 &
    hf_build=$!
    "$PY" -m recipe.exgrpo.harness.assets --rollout vllm >"$LOGS/assets-vllm.log" 2>&1 &
    vllm_build=$!
    wait "$hf_build" || rc=$?
    wait "$vllm_build" || rc=$?
    echo "$rc" >"$ASSETS_STATUS"
    "$PY" -m recipe.exgrpo.harness.assets --rollout hf --tools >"$LOGS/assets-tools.log" 2>&1 || rc=$?
    exit "$rc"
  ) &
  assets_build=$!
  background+=("$assets_build")
fi

# the second e2e session: the runs on the vLLM stack, the multi-turn runs (hf and vllm rollouts) and the tool demo
# (it first builds its own tiny model, the calculator warm-up), which the foreground session, the longest of the
# four, has no room for
SIDE_E2E_TESTS=(tests/e2e/test_vllm_cpu.py tests/e2e/test_verl_compat_vllm.py tests/e2e/test_multi_turn_cpu.py
  tests/e2e/test_tool_demo_cpu.py)
# the four stage-deadline runs on the hf rollout (each a start-up, step 1, then a stage that hangs until its 30 s
# deadline at step 2) are split over the two e2e sessions: two in the foreground, two in the vLLM session (all four
# in the foreground without the vLLM stack). The unit and integration session, which the calculator model's build
# in the background slows most, has none (docs/testing.md has each session's minutes).
STAGE_DEADLINES=tests/e2e/test_stage_deadlines_cpu.py::test_a_stage_that_hangs_stops_the_run_at_its_deadline
SIDE_TAIL_E2E_TESTS=("${STAGE_DEADLINES}[reward_sleep]" "${STAGE_DEADLINES}[generate_hang]")
side=()  # name:pid of each background pytest session, printed after the main one in this order
main_args=()
if [ $# -eq 0 ]; then
  side_session() {  # name, after (now, or assets: once the tiny models are built), then the pytest arguments
    local name=$1 after=$2
    shift 2
    (
      if [ "$after" = assets ]; then
        while [ ! -e "$ASSETS_STATUS" ] && kill -0 "$assets_build" 2>/dev/null; do sleep 5; done
      fi
      exec "$PY" -m pytest "$@" -p no:cacheprovider --basetemp "$LOGS/$name-tmp" --durations=25 \
        --junitxml "$LOGS/$name.xml"
    ) >"$LOGS/$name.log" 2>&1 &
    background+=("$!")
    side+=("$name:$!")
  }
  side_session gpu-lock now "$GPU_LOCK_TESTS"
  side_session unit-integration now tests/unit tests/integration --ignore "$GPU_LOCK_TESTS"
  main_args=(tests/e2e --junitxml "$LOGS/main.xml")
  if [ "$vllm" != 0 ]; then  # (without the stack they stay in the main session, where they skip)
    # once both tiny models are built: a verl run started while the two warm-ups and the other sessions share the
    # cores saw Ray's node miss ray.init's fixed 30 s start-up deadline (the runs retry that, recipe/exgrpo/harness/procs.py)
    side_session vllm-multi-turn assets "${SIDE_E2E_TESTS[@]}" "${SIDE_TAIL_E2E_TESTS[@]}"
    for f in "${SIDE_E2E_TESTS[@]}"; do main_args+=(--ignore "$f"); done
    for t in "${SIDE_TAIL_E2E_TESTS[@]}"; do main_args+=(--deselect "$t"); done
  fi
  echo "[run_tests] beside this pytest (the real verl runs on the hf rollout): ${side[*]%%:*} (logs: $LOGS/<name>.log)" >&2
fi

status=0
"$PY" -m pytest --durations=25 "${main_args[@]}" "$@" || status=$?

if [ -n "${assets_build:-}" ] && ! wait "$assets_build"; then
  echo "[run_tests] building the tiny assets failed:" >&2
  tail -n 20 "$LOGS/assets-hf.log" "$LOGS/assets-vllm.log" "$LOGS/assets-tools.log" >&2
  [ "$status" != 0 ] || status=1
fi
if [ -n "${vllm_setup:-}" ]; then
  if wait "$vllm_setup"; then
    tail -n 1 "$EXGRPO_VLLM_SETUP_LOG" >&2
  else
    echo "[run_tests] building the vLLM CPU stack failed (log: $EXGRPO_VLLM_SETUP_LOG):" >&2
    tail -n 40 "$EXGRPO_VLLM_SETUP_LOG" >&2
    [ "$status" != 0 ] || status=1
  fi
fi
if [ "${#side[@]}" -gt 0 ]; then
  xmls=("$LOGS/main.xml")
  for entry in "${side[@]}"; do
    name=${entry%%:*}
    side_status=0
    wait "${entry##*:}" || side_status=$?
    echo "======================== pytest session '$name' (ran beside the main one; log $LOGS/$name.log) ========================"
    cat "$LOGS/$name.log"
    [ "$side_status" = 0 ] || [ "$status" != 0 ] || status=$side_status
    xmls+=("$LOGS/$name.xml")
  done
  "$PY" - "${xmls[@]}" <<'PY' || true
import os
import sys
import xml.etree.ElementTree as ET

total = {"tests": 0, "failures": 0, "errors": 0, "skipped": 0}
for path in sys.argv[1:]:
    if not os.path.exists(path):
        print(f"suite: {path} was not written (its pytest did not finish)")
        continue
    for suite in ET.parse(path).getroot().iter("testsuite"):
        for key in total:
            total[key] += int(suite.get(key, 0))
passed = total["tests"] - total["failures"] - total["errors"] - total["skipped"]
print(f"suite: {passed} passed, {total['failures'] + total['errors']} failed, {total['skipped']} skipped")
PY
fi
background=()
echo "[run_tests] done in $(($(date +%s) - started)) s (exit $status)" >&2
exit "$status"
