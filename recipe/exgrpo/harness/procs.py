"""Run a command (a verl trainer with its Ray cluster) in its own session under a hard wall-clock limit.

Ray's local cluster (GCS, raylet, workers) is started by the driver and stays in the driver's session, so
killing the session of the child kills the whole run, and nothing else: processes of other sessions (other
users of this machine, the caller itself) are never touched. While it runs, the summed resident memory of the
session's processes is sampled, for the peak-RSS figure of the benchmark.

Every session started here is registered until it has been killed: :func:`install_termination_handlers` (the
test suite installs it; the CPU demo and the benchmarks through :func:`main_until_stopped`, Ctrl-C included) makes
SIGTERM and SIGHUP to the caller kill each registered session first, then stop the caller with one line and
:class:`~exgrpo.stop_signals.Stopped` (a ``KeyboardInterrupt``), so a terminated caller (a CI job cancelled, a
terminal closed, ``timeout``) leaves no Ray cluster, worker or vLLM engine behind.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from exgrpo import stop_signals
from exgrpo.stop_signals import install_stop_handlers, stop_descendants


@dataclass
class RunResult:
    returncode: int | None
    timed_out: bool
    wall_seconds: float
    peak_rss_bytes: int
    log_path: Path
    # user + system CPU seconds of the session's processes, summed over every process seen by the sampler (one
    # that lived less than a sampling period is missed): core-seconds, what a run costs a shared machine
    cpu_seconds: float = 0.0
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


def kill_session(sid: int, grace_s: float = 3.0, leader_grace_s: float = 0.0) -> int:
    """SIGTERM then SIGKILL every process of session ``sid`` (the child started with ``start_new_session``);
    returns how many there were. ``leader_grace_s`` > 0: SIGTERM the session's leader (the command itself, e.g. the
    trainer's driver, which then stops its Ray cluster: recipe/exgrpo/runtime/driver_stop.py) first and give it that
    long to end, then the rest."""
    if sid == os.getsid(0):
        raise ValueError("refusing to kill the caller's own session")
    count = len(_live(session_processes(sid)))
    if leader_grace_s > 0:
        try:
            leader = psutil.Process(sid)
            leader.send_signal(signal.SIGTERM)
            end = time.monotonic() + leader_grace_s
            while _alive(leader) and time.monotonic() < end:
                time.sleep(0.1)
        except psutil.Error:
            pass
    # (a zombie is dead: waiting for it to end would take the whole grace when no one reaps it)
    procs = _live(session_processes(sid))
    for proc in procs:
        try:
            proc.send_signal(signal.SIGTERM)
        except psutil.Error:
            pass
    _, alive = psutil.wait_procs(procs, timeout=grace_s)
    for proc in _live(alive + session_processes(sid)):
        try:
            proc.send_signal(signal.SIGKILL)
        except psutil.Error:
            pass
    psutil.wait_procs(_live(session_processes(sid)), timeout=grace_s)
    return count


def _live(procs: list[psutil.Process]) -> list[psutil.Process]:
    return [p for p in procs if _alive(p)]


# sessions started by this process and not yet killed (their leaders' pids = their session ids)
_ACTIVE: set[int] = set()
# re-entrant: the signal handler runs in the main thread, possibly while that thread holds the lock
_ACTIVE_LOCK = threading.RLock()


def register_session(sid: int) -> None:
    """Count session ``sid`` among those :func:`kill_active_sessions` ends (done by everything in this module)."""
    with _ACTIVE_LOCK:
        _ACTIVE.add(sid)


def unregister_session(sid: int) -> None:
    with _ACTIVE_LOCK:
        _ACTIVE.discard(sid)


def active_sessions() -> list[int]:
    with _ACTIVE_LOCK:
        return sorted(_ACTIVE)


def kill_active_sessions(grace_s: float = 3.0, leader_grace_s: float = 0.0) -> dict[int, int]:
    """Kill every registered session (``kill_session``); returns their ids with the processes each had."""
    killed = {}
    for sid in active_sessions():
        try:
            killed[sid] = kill_session(sid, grace_s=grace_s, leader_grace_s=leader_grace_s)
        except Exception as exc:  # one session that cannot be killed must not spare the others
            sys.stderr.write(f"[procs] could not kill session {sid}: {exc}\n")
        unregister_session(sid)
    return killed


def _stopped_runs(killed: dict[int, int], others: int = 0) -> str:
    more = f" and {others} other process(es) it had started" if others else ""
    if not killed:
        return f"stopped {others} process(es) it had started; exiting" if others else "nothing was running; exiting"
    runs = "the run" if len(killed) == 1 else f"{len(killed)} runs"
    return f"stopped {runs} and its {sum(killed.values())} processes (the trainer, its Ray cluster){more}; exiting"


def install_termination_handlers(signums: Sequence[int] = (signal.SIGTERM, signal.SIGHUP)) -> None:
    """On each of ``signums``: kill every registered session, write one line (``[procs] SIGTERM: killed ...``), then
    raise :class:`~exgrpo.stop_signals.Stopped` (a ``KeyboardInterrupt``) in the main thread (pytest then stops,
    reports and tears down; a script ends). Main thread only, like ``signal.signal``."""

    def stop(signum: int) -> str:
        killed = kill_active_sessions()
        return f"killed {len(killed)} run session(s) {sorted(killed)} ({sum(killed.values())} processes); stopping"

    install_stop_handlers(stop, "procs", signums)


#: how long a stopped tool gives the command of each of its sessions (a trainer's driver) to stop its own processes
#: (its Ray cluster) before the rest of the session is killed: a backstop, the driver takes a few seconds
COMMAND_STOP_S = 30.0


def main_until_stopped(main: Callable[[], int | None], label: str) -> int:
    """``main()`` of a command that runs sessions (the CPU demo, the benchmarks): SIGTERM, SIGHUP or SIGINT (Ctrl-C)
    stop each session's command (up to :data:`COMMAND_STOP_S`), kill what is left of the session and any other
    process the command started, print one line
    (``[label] SIGTERM: stopped the run and its 23 processes ...``) and return 128 + the signal's number, with no
    traceback."""

    def stop(signum: int) -> str:
        killed = kill_active_sessions(leader_grace_s=COMMAND_STOP_S)
        others = stop_descendants(exclude=list(killed))  # what else it started (a build, a check)
        return _stopped_runs(killed, len(others))

    return stop_signals.main_until_stopped(main, stop, label)


def reap(proc: subprocess.Popen, timeout_s: float = 10.0) -> None:
    """Kill ``proc`` if it still runs and collect its exit status, without ``Popen.poll``/``Popen.wait``.

    Those take a lock and give up when they cannot have it. A stop signal's handler raises in the main thread
    wherever it is; landing just after ``Popen.wait`` took that lock and before the block that releases it, it
    leaves the lock held for good, and every later ``poll``/``wait`` of that ``Popen`` then answers "still
    running" (``wait(timeout=10)`` raised ``TimeoutExpired`` for a process long dead). ``os.waitpid`` needs no lock.
    """
    deadline = time.monotonic() + timeout_s
    killed = False
    while proc.returncode is None:
        try:
            pid, status = os.waitpid(proc.pid, os.WNOHANG)
        except ChildProcessError:  # reaped elsewhere (psutil's wait reaps the children it waits for)
            return
        if pid == proc.pid:
            proc.returncode = os.waitstatus_to_exitcode(status)
            return
        if not killed:  # alive, so the pid is still its own: safe to signal
            os.kill(proc.pid, signal.SIGKILL)
            killed = True
        elif time.monotonic() > deadline:
            raise subprocess.TimeoutExpired(proc.args, timeout_s)
        time.sleep(0.02)


@contextmanager
def new_session(cmd: Sequence[str], **popen_kwargs) -> Iterator[subprocess.Popen]:
    """``subprocess.Popen(cmd, start_new_session=True, **popen_kwargs)``, registered; on leaving the block, however
    it is left, the whole session is killed (the command and everything it started, e.g. a vLLM engine)."""
    proc = subprocess.Popen(list(cmd), start_new_session=True, **popen_kwargs)
    register_session(proc.pid)
    try:
        yield proc
    finally:
        try:
            kill_session(proc.pid)
            reap(proc)
        finally:
            unregister_session(proc.pid)


def run_captured(
    cmd: Sequence[str], timeout_s: float, env: Mapping[str, str] | None = None, cwd: str | Path | None = None
) -> subprocess.CompletedProcess:
    """Like ``subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)``, in a new session that is
    killed when the command ends, times out (``subprocess.TimeoutExpired``) or the caller is interrupted."""
    with new_session(
        cmd, env=None if env is None else dict(env), cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    ) as proc:
        stdout, stderr = proc.communicate(timeout=timeout_s)
    return subprocess.CompletedProcess(list(cmd), proc.returncode, stdout, stderr)


def _session_sample(sid: int, cpu: dict[int, float]) -> int:
    """The session's resident memory now; records each process's CPU seconds so far in ``cpu`` (pid -> s)."""
    total = 0
    for proc in session_processes(sid):
        try:
            with proc.oneshot():
                total += proc.memory_info().rss
                times = proc.cpu_times()
            cpu[proc.pid] = times.user + times.system
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
    append: bool = False,
) -> RunResult:
    """Run ``cmd`` in a new session, output to ``log_path`` (``append``: after what it holds); kill the session at
    the end or at ``timeout_s``.

    ``leftover_grace_s`` is waited only after the command ended by itself: when it timed out, or an exception
    (an interruption, a test's own timeout) leaves this function, the session is killed at once."""
    log_path = Path(log_path)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    peak = [0]
    cpu: dict[int, float] = {}
    stop = threading.Event()
    start = time.perf_counter()
    with open(log_path, "ab" if append else "wb") as log:
        proc = subprocess.Popen(
            list(cmd), env=dict(env), cwd=cwd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        sid = proc.pid
        register_session(sid)

        def sample() -> None:
            while not stop.is_set():
                peak[0] = max(peak[0], _session_sample(sid, cpu))
                stop.wait(sample_rss_every_s)

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        timed_out = ended = False
        try:
            returncode: int | None = proc.wait(timeout=timeout_s)
            ended = True
        except subprocess.TimeoutExpired:
            timed_out = True
            returncode = None
        finally:
            try:
                wall = time.perf_counter() - start
                stop.set()
                leftovers = _wait_session_empty(sid, proc.pid, grace_s=leftover_grace_s) if ended else []
                kill_session(sid)
                reap(proc)
            finally:
                unregister_session(sid)
                sampler.join(timeout=5)
    return RunResult(
        returncode=returncode if not timed_out else None,
        timed_out=timed_out,
        wall_seconds=wall,
        peak_rss_bytes=peak[0],
        log_path=log_path,
        leftover_pids=leftovers,
        cpu_seconds=sum(cpu.values()),
    )


#: what ``ray.init`` raises when the local node it started did not register within the 30 s it allows itself (a
#: constant in ``ray._private.node``, not a setting): on a loaded machine the GCS can be too busy to answer in time
RAY_STARTUP_TIMEOUT = "The current node timed out during startup"
RAY_STARTUP_RETRIES = 5
#: the pause before an attempt after such a failure, drawn at random in this range: two runs that started at once
#: (the test command's sessions) do not meet again at the next start
RAY_STARTUP_PAUSE_S = (5.0, 20.0)


def ray_startup_timed_out(log_path: str | Path, tail_bytes: int = 200_000) -> bool:
    """Whether the log of a run that failed ends with Ray's node start-up timeout (nothing else of the run ran)."""
    try:
        with open(log_path, "rb") as f:
            f.seek(max(0, os.path.getsize(log_path) - tail_bytes))
            return RAY_STARTUP_TIMEOUT.encode() in f.read()
    except OSError:
        return False


def run_ray_command_in_new_session(
    cmd: Sequence[str],
    env: Mapping[str, str],
    timeout_s: float,
    log_path: str | Path,
    retries: int = RAY_STARTUP_RETRIES,
    pause_s: tuple[float, float] = RAY_STARTUP_PAUSE_S,
    **kwargs,
) -> RunResult:
    """:func:`run_in_new_session` for a command that starts a local Ray cluster (a verl run): when it fails because
    Ray's node did not come up within ``ray.init``'s fixed 30 s, it is started again, up to ``retries`` times, and
    the failed attempt's log is kept beside the log as ``<log>.ray-startup-<n>``, after a pause drawn from
    ``pause_s``. Any other outcome is returned as it is."""
    log_path = Path(log_path)
    for attempt in range(1, retries + 2):
        result = run_in_new_session(cmd, env, timeout_s, log_path, **kwargs)
        if result.returncode in (0, None) or attempt > retries or not ray_startup_timed_out(log_path):
            return result
        aside = log_path.with_name(f"{log_path.name}.ray-startup-{attempt}")
        os.replace(log_path, aside)
        pause = random.uniform(*pause_s)
        sys.stderr.write(
            f"[exgrpo] Ray's node did not start within the 30 s ray.init allows (a loaded machine); starting the "
            f"run again in {pause:.0f} s (attempt {attempt + 1} of {retries + 1}; the failed attempt's log: {aside})\n"
        )
        time.sleep(pause)
    return result


def ray_init_in_process(
    retries: int = RAY_STARTUP_RETRIES, pause_s: tuple[float, float] = RAY_STARTUP_PAUSE_S, **kwargs
):
    """``ray.init(**kwargs)`` in this process, started again (up to ``retries`` times, after a pause drawn from
    ``pause_s``) when it fails with Ray's node start-up timeout: the in-process counterpart of
    :func:`run_ray_command_in_new_session`, for a test that needs a local cluster on a loaded machine."""
    import ray

    for attempt in range(1, retries + 2):
        try:
            return ray.init(**kwargs)
        except Exception as e:  # Ray raises a bare Exception for this
            if RAY_STARTUP_TIMEOUT not in str(e) or attempt > retries:
                raise
            ray.shutdown()
            pause = random.uniform(*pause_s)
            sys.stderr.write(f"[exgrpo] Ray's node did not start within 30 s; ray.init again in {pause:.0f} s\n")
            time.sleep(pause)


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
