"""Bounded waits for the weight sync into verl's vLLM engine on CPU (used by ``vllm_rollout.CpuVLLMServerAdapter``).

verl's bucketed sender talks to the engine's receiver over a ZMQ REQ/REP pair and blocks in ``recv()`` for every
acknowledgement. When the receiver fails (it raises while loading a bucket and closes its socket) or never connects,
no acknowledgement comes and the trainer hangs for ever. :class:`GuardedSocket` wraps the sender's socket: each
``send_pyobj``/``recv`` polls in short slices, and gives up with :class:`WeightSyncError` as soon as the receiver's
call has ended with an error (the error is in the message) or when the sync's deadline has passed.

Imports neither vLLM nor verl (the tests drive it with real ZMQ sockets in the plain CPU venv).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any

WEIGHT_SYNC_TIMEOUT_ENV = "EXGRPO_WEIGHT_SYNC_TIMEOUT_S"
# a sync of the tiny CPU model takes well under a second; the limit only has to stop a hang, not time a sync
DEFAULT_WEIGHT_SYNC_TIMEOUT_S = 300.0
# how often a waiting sender looks at the receiver's state
POLL_S = 0.2


class WeightSyncError(RuntimeError):
    """A weight sync from the trainer into the vLLM engine failed or did not finish in time."""


def weight_sync_timeout_s(env: dict[str, str] | None = None) -> float:
    """The sync's time limit in seconds: ``EXGRPO_WEIGHT_SYNC_TIMEOUT_S`` (default 300)."""
    raw = (os.environ if env is None else env).get(WEIGHT_SYNC_TIMEOUT_ENV)
    if not raw:
        return DEFAULT_WEIGHT_SYNC_TIMEOUT_S
    try:
        value = float(raw)
    except ValueError as e:
        raise WeightSyncError(f"{WEIGHT_SYNC_TIMEOUT_ENV}={raw!r} is not a number of seconds") from e
    if not value > 0:
        raise WeightSyncError(f"{WEIGHT_SYNC_TIMEOUT_ENV}={raw!r} must be a positive number of seconds")
    return value


def ray_call_failure(ref: Any) -> Callable[[], BaseException | None]:
    """A failure probe for :class:`GuardedSocket` over the Ray object ref of the engine's receiving call (None on
    trainer ranks that talk to no server): the call's error once it has ended, None while it runs."""

    def probe() -> BaseException | None:
        if ref is None:
            return None
        import ray

        ready, _ = ray.wait([ref], timeout=0)
        if not ready:
            return None
        try:
            ray.get(ref)
        except Exception as e:  # the engine worker's error, as Ray re-raises it
            return e
        return WeightSyncError("the vLLM engine ended its weight-receiving call before the trainer finished sending")

    return probe


class GuardedSocket:
    """A ZMQ socket whose blocking ``send_pyobj``/``recv`` give up when ``failure()`` reports the receiver's error
    or ``timeout_s`` (counted from construction) has passed. Every other attribute is the socket's own."""

    def __init__(self, socket: Any, failure: Callable[[], BaseException | None], timeout_s: float) -> None:
        self._socket = socket
        self._failure = failure
        self._timeout_s = timeout_s
        self._deadline = time.monotonic() + timeout_s

    def _wait(self, flag: int, what: str) -> None:
        while not self._socket.poll(timeout=int(POLL_S * 1000), flags=flag):
            failure = self._failure()
            if failure is not None:
                raise WeightSyncError(f"the vLLM engine failed while receiving the weights: {failure}") from failure
            if time.monotonic() > self._deadline:
                raise WeightSyncError(
                    f"the weight sync to the vLLM engine did not finish within {self._timeout_s:g} s (waiting to "
                    f"{what}; {WEIGHT_SYNC_TIMEOUT_ENV} sets the limit)"
                )

    def send_pyobj(self, obj: Any, *args: Any, **kwargs: Any) -> Any:
        import zmq

        self._wait(zmq.POLLOUT, "send to the engine")
        return self._socket.send_pyobj(obj, *args, **kwargs)

    def recv(self, *args: Any, **kwargs: Any) -> Any:
        import zmq

        self._wait(zmq.POLLIN, "receive the engine's acknowledgement")
        return self._socket.recv(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._socket, name)
