"""SIGTERM to a pytest that runs a real verl run (slow): the run's whole session (driver, Ray's GCS and raylet,
its workers) is gone when pytest has exited, not left to the run's own wall-clock watchdog (tests/conftest.py
installs the handler of recipe/exgrpo/harness/procs.py). The pytest runs tests/e2e/sigterm_target.py and is terminated
once Ray is up."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
import pytest

from recipe.exgrpo.harness.procs import new_session
from tests.e2e.helpers import ray_started, run_processes, wait_none_left

TARGET = Path(__file__).resolve().with_name("sigterm_target.py")
RAY_UP_WITHIN_S = 240  # a backstop for a loaded machine; Ray is up ~15 s after pytest starts on a quiet one
# after pytest exited: time for the kernel to reap what was killed (a survivor of the session lives for minutes)
REAPED_WITHIN_S = 10


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


def _ray_up(ray_dir: str) -> list[psutil.Process]:
    """The run's processes once both Ray's GCS and its raylet run, else []."""
    procs = run_processes(ray_dir)
    names = " ".join(_cmdline(p) for p in procs)
    return procs if "gcs_server" in names and "raylet" in names else []


@pytest.mark.slow
@pytest.mark.timeout(RAY_UP_WITHIN_S + 120)
def test_sigterm_to_pytest_ends_the_session_of_its_verl_run(repo_root, tmp_path):
    log = tmp_path / "pytest.log"
    with tempfile.TemporaryDirectory(prefix="exgray-", dir="/tmp") as ray_dir:
        try:
            returncode, left = _terminate_once_ray_is_up(repo_root, tmp_path, ray_dir, log)
        finally:  # whatever happened, nothing of the run outlives this test (a failure here leaves survivors)
            for proc in run_processes(ray_dir):
                try:
                    proc.kill()
                except psutil.Error:
                    pass
        text = log.read_text(errors="replace")
        assert left == [], f"pytest exited with {returncode}; processes of the run outlived it: {left}"
        assert returncode == 2, f"pytest exited with {returncode}, not as interrupted (2):\n{text[-4000:]}"
        assert "SIGTERM: killed 1 run session" in text, text[-4000:]


def _terminate_once_ray_is_up(repo_root: Path, tmp_path: Path, ray_dir: str, log: Path):
    """Start the pytest, wait for Ray, SIGTERM the pytest; its exit code and the run's processes (of those seen before
    the signal, or found by Ray's temp dir) still alive after it exited."""
    env = {**os.environ, "EXGRPO_SIGTERM_RAY_DIR": ray_dir}
    cmd = [
        sys.executable,
        "-m",
        "pytest",
        str(TARGET),
        "-q",
        "-s",  # no capture: the handler's message reaches the log
        "-p",
        "no:cacheprovider",
        "--basetemp",
        str(tmp_path / "t"),
    ]
    # the pytest in its own session too, so that nothing of it outlives this test
    with log.open("w") as out, new_session(cmd, cwd=repo_root, env=env, stdout=out, stderr=subprocess.STDOUT) as inner:
        deadline = time.monotonic() + RAY_UP_WITHIN_S
        # Ray is up when its GCS and raylet run and the raylet has written its log (the processes exist a moment
        # before the log: CI once found them, with the raylet still loading, and no log yet)
        while (
            not ((seen := _ray_up(ray_dir)) and ray_started(ray_dir))
            and inner.poll() is None
            and time.monotonic() < deadline
        ):
            time.sleep(0.5)
        assert inner.poll() is None, f"the pytest ended before it was terminated:\n{log.read_text()[-4000:]}"
        assert seen and ray_started(ray_dir), (
            f"Ray did not start within {RAY_UP_WITHIN_S} s:\n{log.read_text()[-4000:]}"
        )
        inner.send_signal(signal.SIGTERM)  # the pytest process only, as a CI runner or a shell would send it
        returncode = inner.wait(timeout=90)
        # already gone when pytest has exited (REAPED_WITHIN_S only lets the kernel reap the killed processes)
        left = wait_none_left(ray_dir, deadline_s=REAPED_WITHIN_S)
        left += [p for p in seen if _alive(p) and p.pid not in {q.pid for q in left}]
    return returncode, [(p.pid, _cmdline(p)[:160]) for p in left]
