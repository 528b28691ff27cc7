"""Process hygiene of recipe/exgrpo/harness/procs.py without Ray: a session is killed at once when an exception leaves
``run_in_new_session`` (no grace wait), and SIGTERM/SIGHUP to the caller kill every session it started before it
stops. The sessions here are ``sleep`` processes; tests/e2e/test_sigterm_cpu.py does the same to a pytest running a
real verl run."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import psutil
import pytest

from recipe.exgrpo.harness.procs import (
    RAY_STARTUP_TIMEOUT,
    active_sessions,
    ray_init_in_process,
    run_in_new_session,
    run_ray_command_in_new_session,
    session_processes,
)

# a session leader with a child that outlives nothing by itself: both sleep far longer than any test here
TWO_SLEEPS = ["bash", "-c", "sleep 300 & sleep 300; wait"]


def _alive(procs: list[psutil.Process]) -> list[psutil.Process]:
    out = []
    for p in procs:
        try:
            if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                out.append(p)
        except psutil.Error:
            continue
    return out


def _wait_for_session(sid: int, n: int, timeout_s: float = 20) -> list[psutil.Process]:
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        procs = session_processes(sid)
        if len(procs) >= n:
            return procs
        time.sleep(0.05)
    raise AssertionError(f"session {sid} never had {n} processes: {session_processes(sid)}")


class _Interrupted(Exception):
    pass


def test_an_exception_during_the_run_kills_the_session_without_the_grace_wait(tmp_path):
    """An exception inside the wait (here a SIGALRM handler's, as pytest-timeout raises) must not first wait the
    leftover grace (60 s here) for processes that will never exit by themselves."""
    seen: list[psutil.Process] = []

    def interrupt(signum, frame):
        sids = active_sessions()
        if not sids:  # the session is not started yet (a loaded machine: still inside Popen): look again shortly
            signal.setitimer(signal.ITIMER_REAL, 0.2)
            return
        assert len(sids) == 1
        seen.extend(_wait_for_session(sids[0], 3))  # bash, its two sleeps
        raise _Interrupted

    previous = signal.signal(signal.SIGALRM, interrupt)
    signal.setitimer(signal.ITIMER_REAL, 1.0)
    started = time.monotonic()
    try:
        with pytest.raises(_Interrupted):
            run_in_new_session(TWO_SLEEPS, env={}, timeout_s=120, log_path=tmp_path / "log", leftover_grace_s=60)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    took = time.monotonic() - started
    assert len(seen) == 3
    assert took < 20, f"run_in_new_session took {took:.1f} s to return after the exception (the grace wait ran)"
    assert _alive(seen) == [], f"processes of the session survived: {_alive(seen)}"
    assert active_sessions() == []


def test_a_stop_raised_inside_popens_wait_lock_still_ends_the_run_at_once(tmp_path, monkeypatch):
    """A stop signal's handler may raise right after ``Popen.wait`` took its internal lock, before the block that
    releases it (seen once in CI: the demo then waited 10 s on a process long dead and exited 1 with
    ``TimeoutExpired``). The fault injected: the first ``wait`` takes the lock and raises, as that handler does.
    The run must still end at once, its process killed and reaped, and the stop reach the caller."""
    from exgrpo.stop_signals import Stopped

    waits: list[subprocess.Popen] = []
    real_wait = subprocess.Popen.wait

    def wait_stopped_inside_its_lock(self, timeout=None):
        if waits:  # a later wait (the old clean-up's) is Popen's own, which then finds the lock held
            return real_wait(self, timeout)
        waits.append(self)
        self._waitpid_lock.acquire()  # never released: the handler's exception skipped the release
        raise Stopped(signal.SIGTERM)

    monkeypatch.setattr(subprocess.Popen, "wait", wait_stopped_inside_its_lock)
    started = time.monotonic()
    with pytest.raises(Stopped):
        run_in_new_session(TWO_SLEEPS, env={}, timeout_s=120, log_path=tmp_path / "log", leftover_grace_s=60)
    took = time.monotonic() - started
    (proc,) = waits
    assert took < 8, f"the stop took {took:.1f} s to reach the caller"
    with pytest.raises(ChildProcessError):  # reaped: no zombie left behind
        os.waitpid(proc.pid, os.WNOHANG)
    assert active_sessions() == []


CHILD = textwrap.dedent(
    """
    import sys
    from pathlib import Path
    from recipe.exgrpo.harness.procs import install_termination_handlers, run_in_new_session

    install_termination_handlers()
    try:
        run_in_new_session({cmd!r}, env={{}}, timeout_s=120, log_path=Path({log!r}), leftover_grace_s=60)
    except KeyboardInterrupt as e:
        print(f"interrupted: {{e}}", flush=True)
        sys.exit(3)
    """
)


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP], ids=["SIGTERM", "SIGHUP"])
def test_sigterm_and_sighup_kill_every_session_of_the_caller(signum, tmp_path, repo_root):
    code = CHILD.format(cmd=TWO_SLEEPS, log=str(tmp_path / "run.log"))
    caller = subprocess.Popen(
        [sys.executable, "-c", code], cwd=repo_root, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        end = time.monotonic() + 30
        run: list[psutil.Process] = []
        while time.monotonic() < end and caller.poll() is None:
            kids = psutil.Process(caller.pid).children()
            if kids:
                run = _wait_for_session(kids[0].pid, 3)
                break
            time.sleep(0.05)
        assert len(run) == 3, f"the caller never started its session: {caller.communicate(timeout=10)}"
        caller.send_signal(signum)
        out, err = caller.communicate(timeout=30)
        assert caller.returncode == 3 and "interrupted" in out, (caller.returncode, out, err[-2000:])
        assert f"{signal.Signals(signum).name}: killed 1 run session" in err
        # gone before the caller exited: nothing waits for them afterwards
        assert _alive(run) == [], f"processes of the caller's session survived it: {_alive(run)}"
    finally:
        if caller.poll() is None:
            caller.kill()
            caller.wait(10)
        for p in _alive(run if "run" in locals() else []):
            p.kill()


def _flaky_ray_command(state, failures: int, message: str) -> list[str]:
    """A command that fails ``failures`` times with ``message`` (as ray.init does when its node does not start in
    time), then succeeds; ``state`` counts its attempts."""
    script = (
        "import pathlib, sys\n"
        f"state = pathlib.Path({str(state)!r})\n"
        "n = int(state.read_text()) if state.exists() else 0\n"
        "state.write_text(str(n + 1))\n"
        f"if n < {failures}:\n"
        f"    print({message!r}); sys.exit(1)\n"
        "print('run done')\n"
    )
    return [sys.executable, "-c", script]


def test_a_run_whose_ray_node_did_not_start_in_time_is_started_again(tmp_path):
    log = tmp_path / "train.log"
    cmd = _flaky_ray_command(tmp_path / "n", failures=2, message=f"Exception: {RAY_STARTUP_TIMEOUT}. This could ...")
    result = run_ray_command_in_new_session(cmd, env={}, timeout_s=60, log_path=log, retries=2, pause_s=(0, 0))
    assert result.returncode == 0 and "run done" in log.read_text()
    assert (tmp_path / "n").read_text() == "3"
    for attempt in (1, 2):  # each failed attempt's log is kept
        assert RAY_STARTUP_TIMEOUT in (tmp_path / f"train.log.ray-startup-{attempt}").read_text()
    # more failures than retries: the last failure is returned
    result = run_ray_command_in_new_session(
        _flaky_ray_command(tmp_path / "m", failures=5, message=RAY_STARTUP_TIMEOUT),
        env={},
        timeout_s=60,
        log_path=tmp_path / "other.log",
        retries=1,
        pause_s=(0, 0),
    )
    assert result.returncode == 1 and (tmp_path / "m").read_text() == "2"


def test_an_in_process_ray_init_that_timed_out_is_called_again(monkeypatch):
    import ray

    calls, shutdowns = [], []

    def flaky_init(**kwargs):
        calls.append(kwargs)
        if len(calls) <= 2:
            raise Exception(f"{RAY_STARTUP_TIMEOUT}. This could happen because ...")
        return "context"

    monkeypatch.setattr(ray, "init", flaky_init)
    monkeypatch.setattr(ray, "shutdown", lambda: shutdowns.append(1))
    assert ray_init_in_process(retries=2, pause_s=(0, 0), num_cpus=1) == "context"
    assert calls == [{"num_cpus": 1}] * 3 and len(shutdowns) == 2
    calls.clear()  # more failures than retries: the last one is raised
    with pytest.raises(Exception, match=RAY_STARTUP_TIMEOUT):
        ray_init_in_process(retries=1, pause_s=(0, 0))
    assert len(calls) == 2

    def bad_init(**kwargs):  # any other failure is raised at once
        calls.append(kwargs)
        raise ValueError("a bad address")

    calls.clear()
    monkeypatch.setattr(ray, "init", bad_init)
    with pytest.raises(ValueError, match="a bad address"):
        ray_init_in_process(pause_s=(0, 0))
    assert len(calls) == 1


def test_any_other_failure_is_not_run_again(tmp_path):
    cmd = _flaky_ray_command(tmp_path / "n", failures=1, message="ValueError: a bad config")
    result = run_ray_command_in_new_session(cmd, env={}, timeout_s=60, log_path=tmp_path / "train.log")
    assert result.returncode == 1 and (tmp_path / "n").read_text() == "1"
    assert not list(tmp_path.glob("train.log.ray-startup-*"))


# a child that burns 1.5 CPU seconds (whatever the machine's load) and ends, under a parent that only waits
BURN_IN_A_CHILD = [
    "bash",
    "-c",
    f"{sys.executable} -c 'import time\nwhile time.process_time() < 1.5: pass' & wait; sleep 1",
]


def test_the_run_counts_the_cpu_seconds_of_every_process_of_its_session(tmp_path):
    # sampled every 0.1 s: the child's last sample period is lost when it ends, and at the default 0.5 s that period is
    # a third of its 1.5 CPU s (0.99 counted on a quiet machine)
    busy = run_in_new_session(
        BURN_IN_A_CHILD, env={}, timeout_s=120, log_path=tmp_path / "busy.log", sample_rss_every_s=0.1
    )
    idle = run_in_new_session(["sleep", "2"], env={}, timeout_s=120, log_path=tmp_path / "idle.log")
    assert busy.returncode == 0 and idle.returncode == 0
    # the child's burn is counted though it ended before the session did (the last sample period may be missed)
    assert 1.0 <= busy.cpu_seconds < 10, busy.cpu_seconds
    assert idle.cpu_seconds < 0.5, idle.cpu_seconds
