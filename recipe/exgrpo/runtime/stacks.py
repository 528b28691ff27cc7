"""The Python stacks of every process of a run on demand, and the run's processes found by its token.

A run has a token (``EXGRPO_RUN_TOKEN``, set by the driver in the Ray job's ``runtime_env``, so every Ray worker of the
job and every process those start inherit it). Named in ``VERL_USE_EXTERNAL_MODULES``, this module is imported by
every process that imports verl (the task runner, the actor/rollout workers, the rollout servers and their engine
processes, the agent-loop and reward-loop workers), and the driver calls :func:`register` itself. Registering opens
``<tmp>/exgrpo-stacks/<token>/<pid>.stacks`` on the process's node and installs :mod:`faulthandler` on
:data:`DUMP_SIGNAL` with that file: on the signal, the interpreter writes the stack of every thread of the process
into it from its C signal handler, even when the thread that holds the GIL is stuck in C (a Ray ``get``, an NCCL
collective) and no Python code of the process can run.

:func:`collect_local` sends the signal to every registered process of the run on this node that still holds its
file open, waits for the dumps and returns them; :func:`run_pids` finds every process of the run on this node by the
token in its environment (a child that imported nothing included) and :func:`terminate_local` stops them. The stage
watchdog (``recipe/exgrpo/runtime/stage_deadlines.py``) runs these on every node of the job when a stage passes its
deadline.
Linux only (``/proc``); imports neither verl nor ray.
"""

from __future__ import annotations

import faulthandler
import os
import signal
import socket
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Iterable
from pathlib import Path

TOKEN_ENV = "EXGRPO_RUN_TOKEN"
MODULE = "recipe.exgrpo.runtime.stacks"
DUMP_SIGNAL = signal.SIGUSR2
SUFFIX = ".stacks"

#: (pid, path, file) of this process's registration; the file stays open for faulthandler
_registration: tuple[int, Path, object] | None = None


def token_dir(token: str) -> Path:
    """The node-local directory of a run's registrations."""
    return Path(tempfile.gettempdir()) / "exgrpo-stacks" / token


def _cmdline(pid: int) -> str:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return "?"
    return raw.replace(b"\0", b" ").decode(errors="replace").strip()[:300]


def register(token: str | None = None) -> Path | None:
    """Make this process dump its threads' stacks into its registration file on :data:`DUMP_SIGNAL`. ``token``
    (default ``EXGRPO_RUN_TOKEN``) names the run; without one nothing happens. Idempotent per process."""
    global _registration
    token = token or os.environ.get(TOKEN_ENV)
    if not token:
        return None
    pid = os.getpid()
    if _registration is not None and _registration[0] == pid:
        return _registration[1]
    directory = token_dir(token)
    try:
        directory.mkdir(parents=True, exist_ok=True)
        path = directory / f"{pid}{SUFFIX}"
        handle = open(path, "w", buffering=1, encoding="utf-8")  # noqa: SIM115 (kept open for faulthandler)
        handle.write(f"# pid {pid} on {socket.gethostname()}: {_cmdline(pid)}\n")
        faulthandler.register(DUMP_SIGNAL, file=handle, all_threads=True, chain=False)
    except (OSError, RuntimeError, ValueError) as e:  # never stop a process of the run for its diagnostics
        print(f"[exgrpo] no stack dumps for pid {pid}: {e}", file=sys.stderr)
        return None
    _registration = (pid, path, handle)
    return path


def own_stacks() -> str:
    """Every thread of this process, with its name and its stack (most recent call last)."""
    names = {t.ident: t.name for t in threading.enumerate()}
    parts = []
    for ident, frame in sys._current_frames().items():
        parts.append(f"Thread {names.get(ident, '?')} ({ident:#x}), most recent call last:")
        parts.append("".join(traceback.format_stack(frame)).rstrip())
    return "\n".join(parts)


def _holds(pid: int, path: Path) -> bool:
    """Whether process ``pid`` has ``path`` open (it is the process that registered it, not a reused pid)."""
    target = str(path)
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return False
    for fd in fds:
        try:
            if os.readlink(f"/proc/{pid}/fd/{fd}") == target:
                return True
        except OSError:
            continue
    return False


def collect_local(token: str, exclude: Iterable[int] = (), wait_s: float = 5.0) -> list[dict]:
    """Signal every registered process of run ``token`` on this node (but those in ``exclude``) and return each
    one's dump: ``{"pid", "host", "cmdline", "text"}``. Waits until the files stop growing, at most ``wait_s``."""
    directory = token_dir(token)
    excluded = {int(p) for p in exclude} | {os.getpid()}
    signalled: dict[int, tuple[Path, int]] = {}
    for path in sorted(directory.glob(f"*{SUFFIX}")) if directory.is_dir() else []:
        try:
            pid = int(path.stem)
        except ValueError:
            continue
        if pid in excluded or not _holds(pid, path):
            continue
        try:
            start = path.stat().st_size
            os.kill(pid, DUMP_SIGNAL)
        except OSError:
            continue
        signalled[pid] = (path, start)
    deadline = time.monotonic() + wait_s
    sizes: dict[int, int] = {}
    while signalled and time.monotonic() < deadline:
        time.sleep(0.5)
        now = {pid: _size(path) for pid, (path, _) in signalled.items()}
        grown = all(now[pid] > start for pid, (_, start) in signalled.items())
        if grown and now == sizes:
            break
        sizes = now
    out = []
    host = socket.gethostname()
    for pid, (path, start) in signalled.items():
        try:
            with open(path, encoding="utf-8", errors="replace") as f:
                f.seek(start)
                text = f.read()
        except OSError as e:
            text = f"(could not read {path}: {e})"
        out.append({"pid": pid, "host": host, "cmdline": _cmdline(pid), "text": text.strip() or "(no dump came)"})
    return out


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return -1


def run_pids(token: str, exclude: Iterable[int] = ()) -> list[int]:
    """Every live process on this node whose environment carries run ``token`` (but those in ``exclude``)."""
    needle = f"{TOKEN_ENV}={token}".encode()
    excluded = {int(p) for p in exclude} | {os.getpid()}
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) in excluded:
            continue
        try:
            environ = Path(f"/proc/{entry}/environ").read_bytes()
        except OSError:
            continue
        if needle in environ.split(b"\0"):
            found.append(int(entry))
    return sorted(found)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
            return f.read().rsplit(")", 1)[-1].split()[0] != "Z"
    except OSError:
        return False


def terminate_local(token: str, exclude: Iterable[int] = (), grace_s: float = 5.0) -> list[int]:
    """SIGTERM every process of run ``token`` on this node (but those in ``exclude`` and this one), SIGKILL those
    still alive after ``grace_s``; returns the pids it stopped."""
    pids = run_pids(token, exclude)
    for pid in pids:
        try:
            os.kill(pid, signal.SIGTERM)
        except OSError:
            pass
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and any(_alive(p) for p in pids):
        time.sleep(0.2)
    for pid in [p for p in pids if _alive(p)] + run_pids(token, exclude):
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    end = time.monotonic() + grace_s
    while time.monotonic() < end and any(_alive(p) for p in pids):
        time.sleep(0.2)
    return pids


def forget(token: str) -> None:
    """Remove this node's registrations of run ``token`` (at the end of the run)."""
    import shutil

    shutil.rmtree(token_dir(token), ignore_errors=True)


register()
