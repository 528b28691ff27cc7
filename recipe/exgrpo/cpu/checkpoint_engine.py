"""A checkpoint engine for the CPU platform (``actor_rollout_ref.rollout.checkpoint_engine.backend=cpu_zmq``): the
trainer's weights to a standalone rollout over ZeroMQ, so that verl's ``separate_async`` mode (trainer and rollout in
pools of their own) runs on CPU.

verl's engines between pools (``nccl``, ``nixl``, ``mooncake``, ``hccl``) move the weights between GPUs (NCCL, RDMA,
Ascend); the ``naive`` one hands them over inside one process and serves colocated rollouts only. This one sends
them from the trainer's rank 0 to every rollout worker through a ZeroMQ ROUTER socket over TCP, in buckets of
``update_weights_bucket_megabytes``; each rollout worker yields the tensors to its server adapter as verl's engines
do (``CheckpointEngineWorker.update_weights``). It is registered by the CPU plugin only
(``recipe/exgrpo/cpu/plugin.py``) and is not meant for GPUs, where the weights would make a round trip through host
memory and the network stack.

Every wait is bounded by ``EXGRPO_WEIGHT_SYNC_TIMEOUT_S`` (``weight_sync.weight_sync_timeout_s``): a rollout worker
that never asks for the weights, or a trainer that never sends them, fails the sync with :class:`WeightSyncError`.
"""

from __future__ import annotations

import asyncio
import pickle
import time
from collections.abc import AsyncGenerator
from typing import Any

import torch
from verl.checkpoint_engine.base import CheckpointEngine, CheckpointEngineRegistry
from verl.workers.rollout.utils import ensure_async_iterator

from recipe.exgrpo.cpu.weight_sync import WEIGHT_SYNC_TIMEOUT_ENV, WeightSyncError, weight_sync_timeout_s

__all__ = ["BACKEND", "ZmqCheckpointEngine"]

BACKEND = "cpu_zmq"
_READY = b"ready"
#: seconds of each poll of a socket between two looks at the event loop
_POLL_S = 0.05


@CheckpointEngineRegistry.register(BACKEND)
class ZmqCheckpointEngine(CheckpointEngine):
    """The trainer's rank 0 (``is_master``) sends, every rollout worker receives; the other trainer ranks walk the
    weight generator (producing each weight is collective over the trainer's ranks) and send nothing."""

    def __init__(self, bucket_size: int, is_master: bool = False, **_: Any) -> None:
        import zmq

        self.bucket_size = int(bucket_size)
        self.is_master = bool(is_master)
        self.rank: int | None = None
        self.receivers = 0
        self.context = zmq.Context.instance()
        self.socket = None
        self.address: str | None = None
        if self.is_master:
            import ray

            ip = ray.util.get_node_ip_address().strip("[]")
            self.socket = self.context.socket(zmq.ROUTER)
            self.socket.setsockopt(zmq.LINGER, 0)
            port = self.socket.bind_to_random_port(f"tcp://{ip}")
            self.address = f"tcp://{ip}:{port}"

    # ---------------------------------------------------------------------------------------------- topology
    def prepare(self) -> dict[str, Any]:
        return {"address": self.address}

    @classmethod
    def build_topology(cls, actor_wg_world_size: int, rollout_world_size: int, metadata: list[dict]):
        address = metadata[0]["address"]
        if not address:
            raise WeightSyncError("the trainer's rank 0 has no weight socket (its checkpoint engine is not the master)")
        actor = {
            "rank": [0] + [-1] * (actor_wg_world_size - 1),
            "address": [address] * actor_wg_world_size,
            "receivers": [rollout_world_size] * actor_wg_world_size,
        }
        rollout = {
            "rank": list(range(1, rollout_world_size + 1)),
            "address": [address] * rollout_world_size,
            "receivers": [rollout_world_size] * rollout_world_size,
        }
        return actor, rollout

    def init_process_group(self, rank: int, address: str, receivers: int) -> None:
        import zmq

        self.rank, self.receivers = int(rank), int(receivers)
        if self.rank > 0 and self.socket is None:
            self.socket = self.context.socket(zmq.DEALER)
            self.socket.setsockopt(zmq.LINGER, 0)
            self.socket.connect(address)

    def finalize(self) -> None:
        """Nothing to free: the sockets are kept for the next sync."""

    # ---------------------------------------------------------------------------------------------- transfer
    async def _poll(self, what: str, deadline: float) -> None:
        import zmq

        while not self.socket.poll(int(_POLL_S * 1000), zmq.POLLIN):
            if time.monotonic() > deadline:
                raise WeightSyncError(
                    f"weight sync (checkpoint engine {BACKEND}): {what} did not arrive within "
                    f"{weight_sync_timeout_s():.0f} s ({WEIGHT_SYNC_TIMEOUT_ENV} sets the limit)"
                )
            await asyncio.sleep(0)

    @torch.no_grad()
    async def send_weights(self, weights, global_steps: int | None = None) -> dict:
        """Rank 0: wait until every rollout worker has asked, then send the weights in buckets (a tensor larger than a
        bucket goes alone); the last message says so. Other ranks: walk the generator."""
        if self.rank is None or self.rank < 0 or not self.is_master:
            async for _ in ensure_async_iterator(weights):
                pass
            return {}
        deadline = time.monotonic() + weight_sync_timeout_s()
        peers: list[bytes] = []
        while len(peers) < self.receivers:
            await self._poll(f"the request of rollout worker {len(peers) + 1} of {self.receivers}", deadline)
            identity, message = self.socket.recv_multipart()
            if message == _READY:
                peers.append(identity)
        entries: list[dict] = []
        chunks: list[bytes] = []
        size = 0
        sent = 0

        def flush(last: bool) -> None:
            nonlocal entries, chunks, size, sent
            header = pickle.dumps({"entries": entries, "last": last})
            payload = b"".join(chunks)
            for peer in peers:
                self.socket.send_multipart([peer, header, payload], copy=False)
            sent += len(payload)
            entries, chunks, size = [], [], 0

        async for name, tensor in ensure_async_iterator(weights):
            data = tensor.detach().to("cpu").contiguous()
            raw = data.view(-1).view(torch.uint8).numpy().tobytes()
            if size and size + len(raw) > self.bucket_size:
                flush(last=False)
            entries.append({"name": name, "dtype": data.dtype, "shape": tuple(data.shape), "offset": size})
            chunks.append(raw)
            size += len(raw)
        flush(last=True)
        return {"checkpoint_engine/bytes_sent_per_worker": float(sent)}

    async def receive_weights(self, global_steps: int | None = None) -> AsyncGenerator[tuple[str, torch.Tensor], None]:
        """A rollout worker: ask for the weights, then yield each tensor as its bucket arrives."""
        if self.socket is None:
            raise WeightSyncError(f"checkpoint engine {BACKEND}: receive_weights before init_process_group")
        deadline = time.monotonic() + weight_sync_timeout_s()
        self.socket.send(_READY)
        while True:
            await self._poll("the trainer's weights", deadline)
            header, payload = self.socket.recv_multipart()
            meta = pickle.loads(header)
            buffer = torch.frombuffer(bytearray(payload), dtype=torch.uint8) if payload else None
            for e in meta["entries"]:
                n = int(torch.Size(e["shape"]).numel()) * e["dtype"].itemsize
                yield e["name"], buffer[e["offset"] : e["offset"] + n].view(e["dtype"]).view(e["shape"])
            if meta["last"]:
                return
