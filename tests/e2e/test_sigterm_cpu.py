"""SIGTERM to the CPU demo (``python -m recipe.exgrpo.cpu_demo``) once its real verl run is up (slow): the demo asks
the trainer's driver to stop, the driver stops its Ray cluster itself (recipe/exgrpo/runtime/driver_stop.py) and says
so in the run's log, the demo kills what is left of the run's session and exits with one line and status 143; no
process of the run is left. Before, the demo died and left ``main_exgrpo`` and its cluster training on (parent PID
1). tests/unit/test_demo_command.py sends each stop signal to the demo on a stand-in trainer; pytest's own handler
(tests/conftest.py) is the same code (tests/unit/test_procs_sessions.py)."""

from __future__ import annotations

import os
import re
import signal
import sys
import tempfile
import time
from pathlib import Path

import psutil
import pytest

from recipe.exgrpo.harness.procs import new_session
from tests.e2e.helpers import ray_started, run_processes, wait_none_left

RAY_UP_WITHIN_S = 240  # a backstop for a loaded machine; the trainer runs ~25 s after the demo starts on a quiet one
# after the demo exited: time for the kernel to reap what was killed (a survivor of the session lives for minutes)
REAPED_WITHIN_S = 10
#: what the trainer's task runner prints once the driver is past ray.init (and has its own handlers again)
TRAINER_STARTED = "ExGRPOTaskRunner hostname:"


def _cmdline(proc: psutil.Process) -> str:
    try:
        return " ".join(proc.cmdline())
    except psutil.Error:
        return ""


def _alive(proc: psutil.Process) -> bool:
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _ray_up(ray_root: str) -> list[psutil.Process]:
    """The run's processes once both Ray's GCS and its raylet run, else []."""
    procs = run_processes(ray_root)
    names = " ".join(_cmdline(p) for p in procs)
    return procs if "gcs_server" in names and "raylet" in names else []


@pytest.mark.slow
@pytest.mark.timeout(RAY_UP_WITHIN_S + 180)
def test_sigterm_to_the_demo_stops_its_training_run(repo_root, tmp_path, cpu_assets):
    out = tmp_path / "demo"
    with tempfile.TemporaryDirectory(prefix="exgray-", dir="/tmp") as ray_root:  # Ray's socket paths stay short
        try:
            returncode, left = _terminate_once_training(repo_root, tmp_path, out, ray_root)
        finally:  # whatever happened, nothing of the run outlives this test (a failure here leaves survivors)
            for proc in run_processes(ray_root):
                try:
                    proc.kill()
                except psutil.Error:
                    pass
    printed = (tmp_path / "stdout").read_text(errors="replace")
    errors = (tmp_path / "stderr").read_text(errors="replace")
    log = (out / "train.log").read_text(errors="replace")
    assert left == [], f"the demo exited with {returncode}; processes of the run outlived it: {left}"
    assert returncode == 128 + signal.SIGTERM, f"the demo exited with {returncode}:\n{errors[-4000:]}"
    assert re.fullmatch(
        r"\[demo\] SIGTERM: stopped the run and its \d+ processes \(the trainer, its Ray cluster\); exiting\n", errors
    ), errors[-4000:]
    assert "Traceback" not in printed + errors
    # the driver stopped its own cluster (the demo gives it that chance first)
    assert re.search(r"\[exgrpo\] SIGTERM: stopping the run: \d+ of its processes on this node", log), log[-4000:]


def _terminate_once_training(repo_root: Path, tmp_path: Path, out: Path, ray_root: str):
    """Start the demo, wait for its trainer, SIGTERM the demo; its exit status and the run's processes (of those seen
    before the signal, or found by Ray's temp dir) still alive after it exited."""
    env = {**os.environ, "RAY_TMPDIR": ray_root}
    cmd = [sys.executable, "-m", "recipe.exgrpo.cpu_demo", "--steps", "1000", "--test-freq", "0", "--out", str(out)]
    # the demo in its own session too, so that nothing of it outlives this test
    with (
        (tmp_path / "stdout").open("w") as stdout,
        (tmp_path / "stderr").open("w") as stderr,
        new_session(cmd, cwd=repo_root, env=env, stdout=stdout, stderr=stderr) as demo_proc,
    ):
        deadline = time.monotonic() + RAY_UP_WITHIN_S
        log, seen = out / "train.log", []
        while demo_proc.poll() is None and time.monotonic() < deadline:
            # the trainer runs once its task runner printed: Ray's GCS and raylet run and the raylet wrote its log
            if log.exists() and TRAINER_STARTED in log.read_text(errors="replace"):
                if (seen := _ray_up(ray_root)) and ray_started(os.path.join(ray_root, "ray")):
                    break
            time.sleep(0.5)
        assert demo_proc.poll() is None, f"the demo ended before it was stopped:\n{_tail(tmp_path, out)}"
        assert seen and ray_started(os.path.join(ray_root, "ray")), f"no trainer within {RAY_UP_WITHIN_S} s"
        demo_proc.send_signal(signal.SIGTERM)  # the demo's process only, as `kill`, `timeout` or a shell sends it
        returncode = demo_proc.wait(timeout=120)
        # already gone when the demo has exited (REAPED_WITHIN_S only lets the kernel reap the killed processes)
        left = wait_none_left(ray_root, deadline_s=REAPED_WITHIN_S)
        left += [p for p in seen if _alive(p) and p.pid not in {q.pid for q in left}]
    return returncode, [(p.pid, _cmdline(p)[:160]) for p in left]


def _tail(tmp_path: Path, out: Path) -> str:
    parts = [tmp_path / "stdout", tmp_path / "stderr", out / "train.log"]
    return "\n".join(p.read_text(errors="replace")[-2000:] for p in parts if p.exists())
