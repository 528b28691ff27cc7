"""The CPU platform's checkpoint engine (recipe/exgrpo/cpu/checkpoint_engine.py), which carries the trainer's weights
to a standalone rollout in verl's ``separate_async`` mode: the topology verl builds from it, every tensor arriving
bit for bit at every rollout worker across several syncs (dtypes, a tensor larger than a bucket), the trainer's
other ranks sending nothing, and a sync whose other side never shows up failing with a named error in bounded time
instead of hanging (both sides)."""

from __future__ import annotations

import asyncio
import time

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("verl")
pytest.importorskip("zmq")

from recipe.exgrpo.cpu.checkpoint_engine import ZmqCheckpointEngine  # noqa: E402
from recipe.exgrpo.cpu.weight_sync import WEIGHT_SYNC_TIMEOUT_ENV, WeightSyncError  # noqa: E402

BUCKET = 1024


def _weights() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return {
        "layer.weight": torch.randn(3, 4, generator=g),
        "embed.bf16": torch.randn(100, generator=g).to(torch.bfloat16),
        "big": torch.randn(600, generator=g),  # 2,400 bytes: more than a bucket, sent alone
        "positions": torch.arange(5),
    }


def _engines(actor_ranks: int, rollout_workers: int):
    """Engines as verl builds them: the trainer's rank 0 is the master; the topology from their metadata."""
    actors = [ZmqCheckpointEngine(BUCKET, is_master=(i == 0)) for i in range(actor_ranks)]
    rollouts = [ZmqCheckpointEngine(BUCKET) for _ in range(rollout_workers)]
    metadata = [e.prepare() for e in actors + rollouts]
    actor_kwargs, rollout_kwargs = ZmqCheckpointEngine.build_topology(actor_ranks, rollout_workers, metadata)
    for engines, kwargs in ((actors, actor_kwargs), (rollouts, rollout_kwargs)):
        assert all(len(v) == len(engines) for v in kwargs.values())
        for i, e in enumerate(engines):
            e.init_process_group(**{k: v[i] for k, v in kwargs.items()})
    return actors, rollouts


async def _received(engine: ZmqCheckpointEngine) -> list[tuple[str, torch.Tensor]]:
    return [(name, t.clone()) async for name, t in engine.receive_weights()]


def test_every_rollout_worker_gets_every_tensor_bit_for_bit_at_every_sync():
    actors, rollouts = _engines(actor_ranks=2, rollout_workers=2)
    weights = _weights()
    walked: list[str] = []

    def second_rank_weights():  # the other trainer rank must walk its generator (producing weights is collective)
        for name, t in weights.items():
            walked.append(name)
            yield name, t

    async def one_sync():
        return await asyncio.gather(
            actors[0].send_weights(iter(weights.items())),
            actors[1].send_weights(second_rank_weights()),
            *[_received(e) for e in rollouts],
        )

    for sync in range(2):
        sent, other, *received = asyncio.run(one_sync())
        assert other == {} and walked == list(weights) * (sync + 1)
        payload = sum(t.numel() * t.element_size() for t in weights.values())
        assert sent == {"checkpoint_engine/bytes_sent_per_worker": float(payload)}
        for got in received:
            assert [name for name, _ in got] == list(weights)
            for name, tensor in got:
                assert tensor.dtype == weights[name].dtype and torch.equal(tensor, weights[name]), name


def test_a_sync_whose_other_side_never_comes_fails_with_a_named_error(monkeypatch):
    monkeypatch.setenv(WEIGHT_SYNC_TIMEOUT_ENV, "1")
    actors, rollouts = _engines(actor_ranks=1, rollout_workers=2)
    started = time.monotonic()
    with pytest.raises(WeightSyncError, match="the trainer's weights did not arrive within 1 s"):
        asyncio.run(_received(rollouts[0]))
    assert time.monotonic() - started < 10
    # the trainer waits for both workers; only one asks
    with pytest.raises(WeightSyncError, match="the request of rollout worker 2 of 2 did not arrive within 1 s"):
        asyncio.run(actors[0].send_weights(iter(_weights().items())))
    assert time.monotonic() - started < 20
