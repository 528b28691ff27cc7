"""Run a command (a verl trainer with its Ray cluster) in its own session under a hard wall-clock limit.

Ray's local cluster (GCS, raylet, workers) is started by the driver and stays in the driver's session, so
killing the session of the child kills the whole run, and nothing else: processes of other sessions (other
users of this machine, the caller itself) are never touched. While it runs, the summed resident memory of the
session's processes is sampled, for the peak-RSS figure of the benchmark.
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import psutil


@dataclass
class RunResult:
    returncode: int | None
    timed_out: bool
    wall_seconds: float
    peak_rss_bytes: int
    log_path: Path
    # processes of the session still alive a few seconds after the main process ended (before the final kill):
    # non-empty means the run did not clean up its own Ray processes
    leftover_pids: list[int] = field(default_factory=list)

    def log_tail(self, chars: int = 6000) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        return text[-chars:]


def session_processes(sid: int) -> list[psutil.Process]:
    """All live processes whose session id is ``sid``."""
    found = []
    for proc in psutil.process_iter(["pid"]):
        try:
            if os.getsid(proc.pid) == sid:
                found.append(proc)
        except (ProcessLookupError, PermissionError, psutil.Error, OSError):
            continue
    return found


def kill_session(sid: int, grace_s: float = 3.0) -> None:
    """SIGTERM then SIGKILL every process of session ``sid`` (the child started with ``start_new_session``)."""
    if sid == os.getsid(0):
        raise ValueError("refusing to kill the caller's own session")
    procs = session_processes(sid)
    for proc in procs:
        try:
            proc.send_signal(signal.SIGTERM)
        except psutil.Error:
            pass
    _, alive = psutil.wait_procs(procs, timeout=grace_s)
    for proc in alive + session_processes(sid):
        try:
            proc.send_signal(signal.SIGKILL)
        except psutil.Error:
            pass
    psutil.wait_procs(session_processes(sid), timeout=grace_s)


def _session_rss(sid: int) -> int:
    total = 0
    for proc in session_processes(sid):
        try:
            total += proc.memory_info().rss
        except psutil.Error:
            continue
    return total


def run_in_new_session(
    cmd: Sequence[str],
    env: Mapping[str, str],
    timeout_s: float,
    log_path: str | Path,
    cwd: str | Path | None = None,
    sample_rss_every_s: float = 0.5,
    leftover_grace_s: float = 5.0,
) -> RunResult:
    """Run ``cmd`` in a new session, output to ``log_path``; kill the session at the end or at ``timeout_s``."""
    log_path = Path(log_path)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    peak = [0]
    stop = threading.Event()
    start = time.perf_counter()
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            list(cmd), env=dict(env), cwd=cwd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        sid = proc.pid

        def sample() -> None:
            while not stop.is_set():
                peak[0] = max(peak[0], _session_rss(sid))
                stop.wait(sample_rss_every_s)

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        timed_out = False
        try:
            returncode: int | None = proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            timed_out = True
            returncode = None
        finally:
            wall = time.perf_counter() - start
            stop.set()
            sampler.join(timeout=5)
            leftovers = [] if timed_out else _wait_session_empty(sid, proc.pid, grace_s=leftover_grace_s)
            kill_session(sid)
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=10)
    return RunResult(
        returncode=returncode if not timed_out else None,
        timed_out=timed_out,
        wall_seconds=wall,
        peak_rss_bytes=peak[0],
        log_path=log_path,
        leftover_pids=leftovers,
    )


def _alive(proc: psutil.Process) -> bool:
    try:
        return proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _wait_session_empty(sid: int, main_pid: int, grace_s: float) -> list[int]:
    """Wait up to ``grace_s`` for the session's other processes to exit; return those still alive."""
    deadline = time.monotonic() + grace_s
    while True:
        alive = [p.pid for p in session_processes(sid) if p.pid != main_pid and _alive(p)]
        if not alive or time.monotonic() >= deadline:
            return alive
        time.sleep(0.2)
