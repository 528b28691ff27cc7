"""A per-call timeout for math-verify that works off the main thread: grading in worker processes.

Why processes (ALGORITHM.md §10: a reward exception or hang must never stop the step):
- math-verify's own timeout is ``signal.alarm``, which only works in the main thread; verl 0.9.1 calls the
  reward function through ``loop.run_in_executor`` inside Ray actors, i.e. in worker threads.
- A thread with a deadline cannot be stopped, and sympy can hang inside C code that holds the GIL (a huge
  integer power, say), which also starves the waiting thread. Only killing a process reclaims the CPU.

``GraderPool`` keeps up to ``max_workers`` long-lived worker processes, started on demand. Each call borrows
an idle worker, sends the request over a pipe, and waits at most ``timeout_s`` for the answer; a worker that
overruns (or dies) is killed and its slot is refilled by the next caller that needs it. Thread-safe.

Workers are plain ``subprocess`` children (``python -c ...`` talking over two inherited pipes with
``multiprocessing.connection`` framing), not ``multiprocessing.Process``: that would re-import the caller's
``__main__`` in every worker (breaking unguarded scripts), forking a threaded Ray actor is unsafe, and a
daemonic process may not have multiprocessing children.
"""

from __future__ import annotations

import atexit
import logging
import os
import queue
import signal
import subprocess
import sys
import threading
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

STARTUP_TIMEOUT_S = 120.0  # a fresh interpreter importing sympy + math-verify; generous for loaded machines
_PACKAGE_ROOT = str(Path(__file__).resolve().parents[2])  # the directory holding the ``exgrpo`` package
_WORKER_CODE = "from exgrpo.reward.isolation import worker_entry; worker_entry()"


class GradingTimeout(Exception):
    """The grading call did not finish within its deadline; its worker process was killed."""


class GraderCrashed(Exception):
    """The worker process died while grading (killed from outside, out of memory, a crash in C code)."""


def worker_entry() -> None:
    """Worker main (``python -c``; argv: read fd, write fd): answer ``(pred_text, ground_truths, from_boxed)``
    requests with ``("ok", equal, pred)`` or ``("error", exception type)`` until the parent closes the pipe."""
    # Ctrl-C goes to the whole process group; the parent decides what to do, the worker keeps serving.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    rfd, wfd = int(sys.argv[1]), int(sys.argv[2])
    requests, replies = Connection(rfd, writable=False), Connection(wfd, readable=False)
    from exgrpo.reward import math_verifier

    math_verifier.warm_up()
    replies.send(("ready", os.getpid()))
    while True:
        try:
            request = requests.recv()
        except (EOFError, OSError):
            return  # the parent went away
        try:
            ok, shown = math_verifier.math_equal(*request)
            reply: tuple[Any, ...] = ("ok", ok, shown)
        except BaseException as e:  # any failure is a graded 0 in the parent, never a dead worker
            reply = ("error", type(e).__name__)
        try:
            replies.send(reply)
        except (EOFError, OSError):
            return


@dataclass(eq=False)
class _Worker:
    process: subprocess.Popen
    requests: Connection  # parent -> worker
    replies: Connection  # worker -> parent

    def kill(self) -> None:
        try:
            self.process.kill()  # SIGKILL: a computation stuck in C code ignores anything gentler
            self.process.wait(timeout=5)
        except Exception:  # best effort; the process may already be gone
            pass
        for conn in (self.requests, self.replies):
            try:
                conn.close()
            except Exception:
                pass


class GraderPool:
    """Worker processes that run ``math_verifier.math_equal`` under a hard per-call deadline."""

    def __init__(self, max_workers: int = 2) -> None:
        if max_workers < 1:
            raise ValueError(f"max_workers must be >= 1, got {max_workers}")
        self.max_workers = max_workers
        # LIFO, so a sequential caller keeps reusing the same warm worker; a None entry is a free slot whose
        # process is started when a caller needs it (lazy growth up to max_workers).
        self._slots: queue.LifoQueue[_Worker | None] = queue.LifoQueue()
        for _ in range(max_workers):
            self._slots.put(None)
        self._live: set[_Worker] = set()
        self._lock = threading.Lock()
        self._closed = False
        self.started = 0  # processes started over the pool's life (restarts after a timeout included)
        self.killed = 0

    def _start_worker(self) -> _Worker:
        to_worker_r, to_worker_w = os.pipe()
        from_worker_r, from_worker_w = os.pipe()
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (_PACKAGE_ROOT, env.get("PYTHONPATH", "")) if p)
        try:
            process = subprocess.Popen(
                [sys.executable, "-c", _WORKER_CODE, str(to_worker_r), str(from_worker_w)],
                pass_fds=(to_worker_r, from_worker_w),
                stdin=subprocess.DEVNULL,
                env=env,
            )
        except BaseException:
            for fd in (to_worker_r, to_worker_w, from_worker_r, from_worker_w):
                os.close(fd)
            raise
        os.close(to_worker_r)  # the child's ends; keeping them open here would hide the child's exit (no EOF)
        os.close(from_worker_w)
        worker = _Worker(process, Connection(to_worker_w, readable=False), Connection(from_worker_r, writable=False))
        try:
            if not worker.replies.poll(STARTUP_TIMEOUT_S):
                raise GraderCrashed(f"grading worker did not start within {STARTUP_TIMEOUT_S:.0f} s")
            worker.replies.recv()  # ("ready", pid)
        except (EOFError, OSError) as e:
            worker.kill()
            raise GraderCrashed(f"grading worker exited during start-up (exit code {process.poll()})") from e
        except BaseException:
            worker.kill()
            raise
        with self._lock:
            self._live.add(worker)
            self.started += 1
        return worker

    def _retire(self, worker: _Worker) -> None:
        worker.kill()
        with self._lock:
            self._live.discard(worker)
            self.killed += 1

    def math_equal(
        self, pred_text: str, ground_truths: tuple[str, ...], from_boxed: bool, timeout_s: float
    ) -> tuple[bool, str]:
        """``math_verifier.math_equal`` in a worker; raises GradingTimeout / GraderCrashed / RuntimeError."""
        if self._closed:
            raise RuntimeError("GraderPool is closed")
        worker = self._slots.get()
        reply = None
        try:
            if worker is None:
                worker = self._start_worker()
            worker.requests.send((pred_text, tuple(ground_truths), from_boxed))
            if worker.replies.poll(timeout_s):
                reply = worker.replies.recv()
        except (EOFError, OSError) as e:
            raise GraderCrashed("grading worker died while grading") from e
        finally:
            if worker is not None and reply is None:
                # Timed out, died, or interrupted with a request in flight: its late reply must never be read as
                # the answer to another request, so the worker goes. The slot comes back empty (refilled lazily).
                self._retire(worker)
                worker = None
            self._slots.put(worker)
        if reply is None:
            raise GradingTimeout(f"math-verify did not finish within {timeout_s:g} s")
        if reply[0] == "error":
            raise RuntimeError(f"math-verify raised {reply[1]}")
        return bool(reply[1]), str(reply[2])

    def close(self) -> None:
        """Stop every worker process (also run at interpreter exit for the default pool)."""
        self._closed = True
        with self._lock:
            live, self._live = list(self._live), set()
        for worker in live:
            worker.kill()

    @property
    def live_workers(self) -> int:
        with self._lock:
            return len(self._live)


_default_pool: GraderPool | None = None
_default_lock = threading.Lock()


def default_workers() -> int:
    """Worker processes per calling process: ``EXGRPO_REWARD_WORKERS`` or min(4, CPUs). verl starts
    ``reward.num_workers`` (8) reward actors, each with its own pool; workers only start under concurrency."""
    env = os.environ.get("EXGRPO_REWARD_WORKERS")
    if env:
        try:
            value = int(env)
        except ValueError as e:
            raise ValueError(f"EXGRPO_REWARD_WORKERS must be a positive integer, got {env!r}") from e
        if value < 1:
            raise ValueError(f"EXGRPO_REWARD_WORKERS must be a positive integer, got {env!r}")
        return value
    return max(1, min(4, os.cpu_count() or 1))


def get_default_pool(max_workers: int | None = None) -> GraderPool:
    """The process-wide pool, created on first use (its size is fixed by the first caller)."""
    global _default_pool
    if _default_pool is None:
        with _default_lock:
            if _default_pool is None:
                _default_pool = GraderPool(max_workers or default_workers())
                atexit.register(_default_pool.close)
    elif max_workers is not None and max_workers != _default_pool.max_workers:
        logger.debug(
            "grading pool already has %d workers; ignoring request for %d", _default_pool.max_workers, max_workers
        )
    return _default_pool


def shutdown_default_pool() -> None:
    """Stop the process-wide pool's workers (the next graded call starts a new pool)."""
    global _default_pool
    with _default_lock:
        pool, _default_pool = _default_pool, None
    if pool is not None:
        pool.close()
