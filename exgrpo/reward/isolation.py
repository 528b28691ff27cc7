"""A per-call timeout for math-verify that works off the main thread: grading in worker processes.

Why processes (docs/rewards_and_data.md: a reward exception or hang must never stop the step):
- math-verify's own timeout is ``signal.alarm``, which only works in the main thread; verl 0.9.1 calls the
  reward function through ``loop.run_in_executor`` inside Ray actors, i.e. in worker threads.
- A thread with a deadline cannot be stopped, and sympy can hang inside C code that holds the GIL (a huge
  integer power, say), which also starves the waiting thread. Only killing a process reclaims the CPU.

``GraderPool`` keeps up to ``max_workers`` long-lived worker processes. A call gets one deadline, and every
stage counts against it: waiting for an idle worker (callers queue first-come first-served, so no caller
starves while later ones are served; a worker still starting counts as queueing too), sending the request, and
the check itself. The one exception is start-up: calls that arrive before the pool's first worker is ready wait
for it (at most ``STARTUP_TIMEOUT_S``, once per pool; ``start()`` warms a pool ahead) without losing their
time. A worker that overruns (or dies) is killed and a replacement is started at once in the background.
Thread-safe. ``queue_s`` of every call and the pool's queue figures (``queue_stats()``) say how long callers
waited for a worker: when they wait, the pool is smaller than the callers' concurrency.

Workers die with the process that started them, even when it is SIGKILLed: on Linux they ask the kernel for
SIGKILL when their parent dies (``prctl(PR_SET_PDEATHSIG)``), and everywhere a watchdog thread exits when the
parent pid changes. The death signal follows the *thread* that forked a worker, so all workers are started by one
long-lived spawner thread per pool, never by a caller's (possibly short-lived) thread.

Workers are plain ``subprocess`` children (``python -c ...`` talking over two inherited pipes with
``multiprocessing.connection`` framing), not ``multiprocessing.Process``: that would re-import the caller's
``__main__`` in every worker (breaking unguarded scripts), forking a threaded Ray actor is unsafe, and a
daemonic process may not have multiprocessing children.
"""

from __future__ import annotations

import atexit
import collections
import ctypes
import logging
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

STARTUP_TIMEOUT_S = 120.0  # a fresh interpreter importing sympy + math-verify; generous for loaded machines
PARENT_POLL_S = 1.0  # how often a worker's watchdog checks that its parent is alive
_PACKAGE_ROOT = str(Path(__file__).resolve().parents[2])  # the directory holding the ``exgrpo`` package
_WORKER_CODE = "from exgrpo.reward.isolation import worker_entry; worker_entry()"
_PR_SET_PDEATHSIG = 1


class GradingTimeout(Exception):
    """The grading call did not finish within its deadline (queueing for a worker included)."""

    def __init__(self, message: str, queue_s: float = 0.0, queued: bool = False) -> None:
        super().__init__(message)
        self.queue_s = queue_s  # seconds the call waited for a worker
        self.queued = queued  # True: it never got a worker before the deadline


class GraderCrashed(Exception):
    """The worker process died while grading (killed from outside, out of memory, a crash in C code)."""


def _die_with_parent(parent_pid: int) -> None:
    """Make this worker exit when ``parent_pid`` does: the kernel's parent-death signal where there is one
    (Linux), and a watchdog thread everywhere (it also covers a parent that died before the signal was set)."""
    if sys.platform.startswith("linux"):
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        except (OSError, AttributeError):  # no prctl: the watchdog below still works
            pass
    if os.getppid() != parent_pid:
        os._exit(0)

    def watch() -> None:
        while True:
            time.sleep(PARENT_POLL_S)
            if os.getppid() != parent_pid:
                os._exit(0)

    threading.Thread(target=watch, name="exgrpo-grader-watchdog", daemon=True).start()


def worker_entry() -> None:
    """Worker main (``python -c``; argv: read fd, write fd, parent pid): answer ``(pred_text, ground_truths,
    from_boxed)`` requests with ``("ok", equal, pred)`` or ``("error", exception type)`` until the parent closes
    the pipe or dies."""
    # Ctrl-C goes to the whole process group; the parent decides what to do, the worker keeps serving.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    rfd, wfd, parent_pid = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
    _die_with_parent(parent_pid)
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


@dataclass(eq=False)
class _Waiter:
    """A caller queued for a worker; the pool hands it a worker (or an error) and sets ``event``."""

    event: threading.Event = field(default_factory=threading.Event)
    worker: _Worker | None = None
    error: BaseException | None = None


@dataclass
class GraderReply:
    equal: bool
    shown: str
    queue_s: float  # seconds this call waited for a worker


class GraderPool:
    """Worker processes that run ``math_verifier.math_equal`` under a hard per-call deadline."""

    def __init__(self, max_workers: int = 2) -> None:
        if max_workers < 1:
            raise ValueError(f"max_workers must be >= 1, got {max_workers}")
        self.max_workers = max_workers
        self._lock = threading.Lock()
        self._idle: list[_Worker] = []  # LIFO, so a sequential caller keeps reusing the same warm worker
        self._waiters: collections.deque[_Waiter] = collections.deque()  # FIFO: served in arrival order
        self._live: set[_Worker] = set()  # started and ready (idle or busy)
        self._starting = 0
        self._spawn_requests: queue.SimpleQueue[bool] = queue.SimpleQueue()
        self._spawner: threading.Thread | None = None
        self._closed = False
        # Set once the first worker is ready (or failed to start): until then callers wait for start-up, which
        # does not count against their deadlines (once per pool; see ``check``).
        self._ready_once = threading.Event()
        self.started = 0  # processes started over the pool's life (restarts after a timeout included)
        self.killed = 0
        # queueing figures: calls that needed a worker, how many waited, total / max wait, timeouts while queued
        self._queue = {"calls": 0, "waited": 0, "wait_s_total": 0.0, "wait_s_max": 0.0, "timeouts": 0}

    # ------------------------------------------------------------------------------------------ workers
    def _ensure_spawner(self) -> None:
        if self._spawner is None:
            self._spawner = threading.Thread(target=self._spawn_loop, name="exgrpo-grader-spawner", daemon=True)
            self._spawner.start()

    def _request_spawn_locked(self) -> None:
        """Start one more worker (in the background) if the pool has room."""
        if self._closed or len(self._live) + self._starting >= self.max_workers:
            return
        self._starting += 1
        self._ensure_spawner()
        self._spawn_requests.put(True)

    def _spawn_loop(self) -> None:
        # This thread forks every worker, so their parent-death signal is tied to it: it lives as long as the
        # pool (a daemon thread; it ends with the process or when the pool is closed).
        while self._spawn_requests.get():
            try:
                worker = self._launch()
            except BaseException as e:
                self._spawn_failed(GraderCrashed(f"could not start a grading worker: {type(e).__name__}: {e}"))
                continue
            threading.Thread(target=self._await_ready, args=(worker,), daemon=True).start()

    def _launch(self) -> _Worker:
        to_worker_r, to_worker_w = os.pipe()
        from_worker_r, from_worker_w = os.pipe()
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (_PACKAGE_ROOT, env.get("PYTHONPATH", "")) if p)
        try:
            process = subprocess.Popen(
                [sys.executable, "-c", _WORKER_CODE, str(to_worker_r), str(from_worker_w), str(os.getpid())],
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
        return _Worker(process, Connection(to_worker_w, readable=False), Connection(from_worker_r, writable=False))

    def _await_ready(self, worker: _Worker) -> None:
        try:
            if not worker.replies.poll(STARTUP_TIMEOUT_S):
                raise GraderCrashed(f"grading worker did not start within {STARTUP_TIMEOUT_S:.0f} s")
            worker.replies.recv()  # ("ready", pid)
        except BaseException as e:
            worker.kill()
            if not isinstance(e, GraderCrashed):
                e = GraderCrashed(f"grading worker exited during start-up (exit code {worker.process.poll()})")
            self._spawn_failed(e)
            return
        with self._lock:
            self._starting -= 1
            if self._closed:
                worker.kill()
                return
            self._live.add(worker)
            self.started += 1
            self._ready_once.set()
            self._hand_over_locked(worker)

    def _spawn_failed(self, error: BaseException) -> None:
        with self._lock:
            closed = self._closed
        if not closed:  # a closed pool's workers die starting (close() ends the thread that forked them): no news
            logger.warning("grading worker start failed: %s", error)
        with self._lock:
            self._starting -= 1
            self._ready_once.set()
            if self._waiters:  # the first waiter learns why; the others wait for another try (or time out)
                waiter = self._waiters.popleft()
                waiter.error = error
                waiter.event.set()
            if self._waiters:
                self._request_spawn_locked()

    def _hand_over_locked(self, worker: _Worker) -> None:
        if self._waiters:
            waiter = self._waiters.popleft()
            waiter.worker = worker
            waiter.event.set()
        else:
            self._idle.append(worker)

    def _retire(self, worker: _Worker) -> None:
        worker.kill()
        with self._lock:
            self._live.discard(worker)
            self.killed += 1
            self._request_spawn_locked()  # replace it now, not when the next caller already waits

    def start(self, wait: bool = True, timeout_s: float = STARTUP_TIMEOUT_S) -> int:
        """Start all ``max_workers`` workers; with ``wait``, return once they are ready (or ``timeout_s`` passed).
        Returns the number of ready workers. A pool also starts workers by itself, as callers need them."""
        with self._lock:
            for _ in range(self.max_workers):
                self._request_spawn_locked()
        deadline = time.monotonic() + timeout_s
        while wait and time.monotonic() < deadline:
            with self._lock:
                if self._starting == 0:
                    break
            time.sleep(0.05)
        return self.live_workers

    # -------------------------------------------------------------------------------------------- calls
    def _acquire(self, deadline: float) -> tuple[_Worker, float, float]:
        """(a worker, seconds queued, the call's deadline): extended by the time spent waiting for the pool's very
        first worker to start, which is start-up, not queueing."""
        start = time.monotonic()
        with self._lock:
            if self._closed:
                raise RuntimeError("GraderPool is closed")
            self._queue["calls"] += 1
            if self._idle and not self._waiters:
                return self._idle.pop(), 0.0, deadline
            waiter = _Waiter()
            self._waiters.append(waiter)
            if len(self._waiters) > self._starting:
                self._request_spawn_locked()
        cold_s = 0.0
        if not self._ready_once.is_set():
            self._ready_once.wait(STARTUP_TIMEOUT_S + 5.0)
            cold_s = time.monotonic() - start
            deadline += cold_s
        waiter.event.wait(max(0.0, deadline - time.monotonic()))
        with self._lock:
            queue_s = time.monotonic() - start - cold_s
            self._queue["waited"] += 1
            self._queue["wait_s_total"] += queue_s
            self._queue["wait_s_max"] = max(self._queue["wait_s_max"], queue_s)
            if waiter.worker is None and waiter.error is None:  # timed out in the queue
                self._waiters.remove(waiter)
                self._queue["timeouts"] += 1
                raise GradingTimeout(
                    f"no grader process became free within the deadline (queued {queue_s:.2f} s)", queue_s, True
                )
        if waiter.error is not None:
            raise waiter.error
        assert waiter.worker is not None
        return waiter.worker, queue_s, deadline

    def _release(self, worker: _Worker) -> None:
        with self._lock:
            if self._closed:
                worker.kill()
                return
            self._hand_over_locked(worker)

    def check(self, pred_text: str, ground_truths: tuple[str, ...], from_boxed: bool, deadline: float) -> GraderReply:
        """``math_verifier.math_equal`` in a worker, finished by ``deadline`` (``time.monotonic()``), queueing for
        a worker included; raises GradingTimeout / GraderCrashed / RuntimeError.

        One exception: calls that arrive before the pool's first worker is ready wait for its start-up (at most
        ``STARTUP_TIMEOUT_S``) and get their deadline moved back by that wait; it happens once per pool, and a
        warm pool (``start()``) never does it.
        """
        worker, queue_s, deadline = self._acquire(deadline)
        if time.monotonic() >= deadline:  # handed a worker just as the deadline passed: it stays healthy
            self._release(worker)
            with self._lock:
                self._queue["timeouts"] += 1
            raise GradingTimeout(f"no time left for grading after {queue_s:.2f} s queued", queue_s, True)
        reply = None
        try:
            worker.requests.send((pred_text, tuple(ground_truths), from_boxed))
            remaining = deadline - time.monotonic()
            if remaining > 0 and worker.replies.poll(remaining):
                reply = worker.replies.recv()
        except (EOFError, OSError) as e:
            raise GraderCrashed("grading worker died while grading") from e
        finally:
            if reply is None:
                # Timed out, died, or interrupted with a request in flight: its late reply must never be read as
                # the answer to another request, so the worker goes (a replacement starts in the background).
                self._retire(worker)
            else:
                self._release(worker)
        if reply is None:
            raise GradingTimeout(
                f"math-verify did not finish within the deadline (after {queue_s:.2f} s queued)", queue_s
            )
        if reply[0] == "error":
            raise RuntimeError(f"math-verify raised {reply[1]}")
        return GraderReply(bool(reply[1]), str(reply[2]), queue_s)

    def math_equal(
        self, pred_text: str, ground_truths: tuple[str, ...], from_boxed: bool, timeout_s: float
    ) -> tuple[bool, str]:
        """``check`` with a deadline ``timeout_s`` from now; returns (equal, the prediction as text)."""
        reply = self.check(pred_text, ground_truths, from_boxed, time.monotonic() + timeout_s)
        return reply.equal, reply.shown

    def queue_stats(self) -> dict[str, float]:
        """Calls that needed a worker, how many of them waited, total and max seconds waited, queue timeouts."""
        with self._lock:
            return dict(self._queue)

    def close(self) -> None:
        """Stop every worker process (also run at interpreter exit for the default pool)."""
        with self._lock:
            self._closed = True
            live, self._live = list(self._live), set()
            idle, self._idle = self._idle, []
            waiters, self._waiters = list(self._waiters), collections.deque()
        for waiter in waiters:
            waiter.error = RuntimeError("GraderPool is closed")
            waiter.event.set()
        if self._spawner is not None:
            self._spawn_requests.put(False)
        for worker in {*live, *idle}:
            worker.kill()

    @property
    def live_workers(self) -> int:
        """Workers started and ready (idle or busy); not those still starting."""
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
