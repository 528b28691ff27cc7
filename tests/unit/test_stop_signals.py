"""Stopping a command (``exgrpo/stop_signals.py``): SIGTERM, SIGHUP and SIGINT stop what the command started, then the
command, with one line and the shell's status for the signal; the trainer's driver (``recipe/exgrpo/runtime/
driver_stop.py``) stops what it started (its local Ray cluster) the same way without unwinding. The commands here
start ``sleep`` processes in place of a Ray cluster or a vLLM engine; tests/unit/test_demo_command.py does it to the
CPU demo, tests/e2e/test_sigterm_cpu.py to a real run."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import textwrap
import time

import psutil
import pytest

STOP_SIGNALS = [signal.SIGTERM, signal.SIGHUP, signal.SIGINT]

# a command that starts a child and a grandchild (a "cluster"), says their pids, then waits to be stopped
COMMAND = textwrap.dedent(
    """
    import json, subprocess, sys, time
    {install}
    def main():
        cluster = subprocess.Popen(["bash", "-c", "sleep 300 & echo $!; wait"], stdout=subprocess.PIPE, text=True)
        print(json.dumps([cluster.pid, int(cluster.stdout.readline())]), flush=True)
        time.sleep(300)
    {run}
    """
)
EVAL_LIKE = dict(
    install="from exgrpo.stop_signals import describe_stopped, main_until_stopped, stop_descendants",
    run="sys.exit(main_until_stopped(main, lambda s: describe_stopped(stop_descendants()), 'cmd'))",
)
DRIVER = dict(
    install="from recipe.exgrpo.runtime import driver_stop\ndriver_stop.install(None)",
    run="main()",
)


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _stop(repo_root, parts: dict, signum: int) -> tuple[int, str, list[int]]:
    """Run the command, signal it once its cluster runs: its exit status, stderr, and which of its pids survived."""
    proc = subprocess.Popen(
        [sys.executable, "-c", COMMAND.format(**parts)],
        cwd=repo_root,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    pids: list[int] = []
    try:
        pids = json.loads(proc.stdout.readline())
        proc.send_signal(signum)
        _, err = proc.communicate(timeout=60)
        end = time.monotonic() + 10  # only for the kernel to reap what was killed
        while any(_alive(p) for p in pids) and time.monotonic() < end:
            time.sleep(0.05)
        return proc.returncode, err, [p for p in pids if _alive(p)]
    finally:
        for pid in [proc.pid, *pids]:
            if _alive(pid):
                psutil.Process(pid).kill()


@pytest.mark.parametrize("signum", STOP_SIGNALS, ids=[s.name for s in STOP_SIGNALS])
def test_a_stopped_command_stops_what_it_started_with_one_line(signum, repo_root):
    returncode, err, survivors = _stop(repo_root, EVAL_LIKE, signum)
    assert returncode == 128 + signum, err
    assert err == f"[cmd] {signum.name}: stopped 2 process(es) it had started; exiting\n"  # one line, no traceback
    assert survivors == []


def test_the_trainers_driver_stops_its_cluster_on_sighup(repo_root):
    """SIGHUP (the terminal closed) killed a Ray driver outright and left its cluster's agents running."""
    returncode, err, survivors = _stop(repo_root, DRIVER, signal.SIGHUP)
    assert returncode == 128 + signal.SIGHUP, err
    assert err == (
        "[exgrpo] SIGHUP: stopping the run: 2 of its processes on this node (its Ray cluster included), then exiting\n"
    )
    assert survivors == []


# the driver's Ray core worker ends the process once its node is gone: here a thread that ends the process as soon
# as the "cluster" (the child) has died, as Ray's C++ thread does when the raylet dies. It kills its process group
# (the command's own session: the command and what is left of its cluster), so that a grandchild the handler had no
# time to signal cannot outlive it holding the test's pipe
DRIVER_ENDED_BY_ITS_CLUSTER = dict(
    install=textwrap.dedent(
        """
        import os, signal, threading
        from recipe.exgrpo.runtime import driver_stop
        driver_stop.install(None)
        _popen = subprocess.Popen
        def _watched(*a, **k):
            child = _popen(*a, **k)
            def watch():
                child.wait()
                os.killpg(os.getpgid(0), signal.SIGKILL)
            threading.Thread(target=watch, daemon=True).start()
            return child
        subprocess.Popen = _watched
        """
    ),
    run="main()",
)


def test_the_driver_says_it_stops_the_run_even_when_its_cluster_ends_it_first(repo_root):
    """On a loaded machine the driver's line never came: its handler stopped the Ray cluster first, and Ray's core
    worker ended the process before the handler wrote. The line is written before the stop now (injected: a thread
    that exits the process once the cluster is gone)."""
    returncode, err, survivors = _stop(repo_root, DRIVER_ENDED_BY_ITS_CLUSTER, signal.SIGTERM)
    assert err.startswith("[exgrpo] SIGTERM: stopping the run: 2 of its processes on this node"), err
    assert returncode in (-signal.SIGKILL, 128 + signal.SIGTERM), err
    assert survivors == []


def test_pytest_ends_its_runs_on_sigterm_and_sighup():
    """tests/conftest.py installs the run sessions' handlers (SIGINT stays pytest's own)."""
    for signum in (signal.SIGTERM, signal.SIGHUP):
        assert getattr(signal.getsignal(signum), "__module__", None) == "exgrpo.stop_signals", signum
    # SIGINT is not the session's: pytest's own, or SIG_IGN where the shell that started it ignores it (a
    # background job of a non-interactive shell, as `cmd &` in a script)
    assert getattr(signal.getsignal(signal.SIGINT), "__module__", None) != "exgrpo.stop_signals"
    assert signal.getsignal(signal.SIGINT) in (signal.default_int_handler, signal.SIG_IGN)


def test_every_benchmark_that_starts_processes_stops_them(repo_root):
    """The benchmarks that start runs or other processes end them on a stop signal, as the demo does
    (``benchmarks/common.run_stoppable``: the demo's handler, tested in tests/unit/test_demo_command.py)."""
    starters = [
        p
        for p in sorted((repo_root / "benchmarks").glob("*.py"))
        if any(word in p.read_text() for word in ("launch(", "run_in_new_session", "subprocess"))
        and p.name not in ("common.py", "pool_scale.py")  # pool_scale: only its own python, one process at a time
    ]
    assert len(starters) >= 5
    for path in starters:
        assert f'sys.exit(run_stoppable(main, "{path.stem}"))' in path.read_text(), path.name
