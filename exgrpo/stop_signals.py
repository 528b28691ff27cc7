"""A command that is stopped ends its processes first, then itself, with one line and no traceback.

A long-running command (the evaluation, the CPU demo, the benchmarks, the trainer's driver) installs
:func:`install_stop_handlers` with what it must stop. On SIGTERM (``kill``, ``timeout``, a cancelled CI job),
SIGHUP (the terminal closed) or SIGINT (Ctrl-C) the handler stops that, writes one line
``[label] SIGTERM: <what it stopped>`` to stderr and raises :class:`Stopped` (a ``KeyboardInterrupt``) in the main
thread; :func:`main_until_stopped` turns it into the shell's exit status for a signal, 128 + its number.

Without it, SIGTERM and SIGHUP end the Python process at once and leave its children running (a Ray cluster's
daemons live on with parent PID 1), and Ctrl-C prints a traceback. Nothing here imports a framework; ``psutil``
is imported when processes are stopped.
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Callable, Sequence

__all__ = [
    "STOP_SIGNALS",
    "Stopped",
    "describe_stopped",
    "install_stop_handlers",
    "main_until_stopped",
    "stop_descendants",
]

#: the signals that stop a command: ``kill``/``timeout``, the terminal closed, Ctrl-C
STOP_SIGNALS: tuple[int, ...] = (signal.SIGTERM, signal.SIGHUP, signal.SIGINT)


class Stopped(KeyboardInterrupt):
    """Raised in the main thread by the handler of :func:`install_stop_handlers` once it stopped what it must."""

    def __init__(self, signum: int) -> None:
        super().__init__(f"{signal.Signals(signum).name} received")
        self.signum = signum

    @property
    def exit_status(self) -> int:
        """The shell's status of a process ended by this signal (143 for SIGTERM, 129 SIGHUP, 130 SIGINT)."""
        return 128 + self.signum


_stopping = False


def install_stop_handlers(
    stop: Callable[[int], str | None],
    label: str,
    signums: Sequence[int] = STOP_SIGNALS,
    exit_now: bool = False,
    announce: Callable[[int], str] | None = None,
) -> None:
    """On each of ``signums``: call ``stop(signum)`` (what it returns is the line's text: what was stopped), write
    ``[label] SIGNAME: text`` to stderr, then raise :class:`Stopped` in the main thread (``exit_now``: leave with
    ``os._exit(128 + signum)`` instead, without unwinding: for a process whose own exit handlers would wait on what
    was just stopped). ``announce``: the line's text comes from ``announce(signum)`` and is written *before*
    ``stop`` runs (a second line only if ``stop`` fails): for a process that may be ended by what it stops (a Ray
    driver, whose core worker exits the process once its node is gone). A signal that arrives while ``stop`` runs is
    ignored. Main thread only, like ``signal.signal``."""

    def line(signum: int, text: str) -> None:
        sys.stderr.write(f"[{label}] {signal.Signals(signum).name}: {text}\n")
        sys.stderr.flush()

    def failed(e: Exception) -> str:  # the line must still come, and the command still end
        return f"stopping failed ({type(e).__name__}: {e})"

    def handler(signum: int, frame: object) -> None:
        global _stopping
        if _stopping:
            return
        _stopping = True
        try:
            if announce is not None:
                try:
                    line(signum, announce(signum))
                except Exception as e:
                    line(signum, failed(e))
            try:
                text = stop(signum)
            except Exception as e:
                text = failed(e)
                if announce is not None:
                    line(signum, text)
            if announce is None:
                line(signum, str(text))
        finally:
            _stopping = False
        if exit_now:
            sys.stdout.flush()
            os._exit(128 + signum)
        raise Stopped(signum)

    for signum in signums:
        signal.signal(signum, handler)


def main_until_stopped(main: Callable[[], int | None], stop: Callable[[int], str], label: str) -> int:
    """``main()`` with :func:`install_stop_handlers` (``stop``, ``label``) installed while it runs; a stop's exit
    status is 128 + the signal's number, as the shell reports a process the signal ended."""
    previous = {signum: signal.getsignal(signum) for signum in STOP_SIGNALS}
    install_stop_handlers(stop, label)
    try:
        return int(main() or 0)
    except Stopped as e:
        return e.exit_status
    finally:  # a caller in the same process (a test) gets its own handlers back
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def stop_descendants(grace_s: float = 5.0, exclude: Sequence[int] = ()) -> list[int]:
    """SIGTERM every descendant of this process (children, their children, ...: a local Ray cluster, a vLLM engine,
    grading workers), SIGKILL those still alive after ``grace_s``; returns their pids."""
    import psutil

    def live(p: psutil.Process) -> bool:
        try:
            return p.pid not in exclude and p.status() != psutil.STATUS_ZOMBIE
        except psutil.Error:
            return False

    try:
        procs = [p for p in psutil.Process().children(recursive=True) if live(p)]
    except psutil.Error:
        return []
    for proc in procs:
        try:
            proc.terminate()
        except psutil.Error:
            pass
    _, alive = psutil.wait_procs(procs, timeout=grace_s)
    for proc in alive:
        try:
            proc.kill()
        except psutil.Error:
            pass
    psutil.wait_procs(alive, timeout=grace_s)
    return [p.pid for p in procs]


def describe_stopped(pids: Sequence[int]) -> str:
    """The handler line's text once ``pids`` (its descendants) were stopped."""
    return f"stopped {len(set(pids))} process(es) it had started; exiting"
