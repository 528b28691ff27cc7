"""The hf rollout's sleep state, without Ray: the server refuses work while asleep, as vLLM on a GPU could not do it.

The sequence is verl 0.9.1's colocated one (legacy ``RayPPOTrainer`` and ``CheckpointEngineManager`` with the
``naive`` backend): ``init_workers`` ends with ``sleep_replicas()``; ``update_weights()`` resumes the weights, loads
them and resumes the KV cache (``ActorRolloutRefWorker.update_weights``); the step generates, then
``sleep_replicas()`` before the actor runs.
"""

from __future__ import annotations

import asyncio

import pytest

pytest.importorskip("verl")

from recipe.exgrpo.cpu.hf_rollout import HFRolloutServer, RolloutAsleepError  # noqa: E402
from recipe.exgrpo.harness.assets import Assets  # noqa: E402
from tests.helpers.cpu_runs import hf_rollout_server  # noqa: E402

PARAMS = {"temperature": 1.0, "top_p": 1.0, "top_k": -1, "logprobs": True}


def _server(cpu_assets: Assets, free_cache_engine: bool = True) -> HFRolloutServer:
    return hf_rollout_server(cpu_assets, prompt_length=64, response_length=4, free_cache_engine=free_cache_engine)


def _sample(server: HFRolloutServer, n: int = 2):
    """``n`` samples of one prompt, sent as verl's agent loop sends them (one request each, at once)."""
    prompt = [10, 40, 41, 10]

    async def many():
        return await asyncio.gather(*[server.generate(prompt, dict(PARAMS), request_id=str(i)) for i in range(n)])

    return asyncio.run(many())


def _weights(server: HFRolloutServer) -> dict:
    return {k: v.clone() for k, v in server.model.state_dict().items()}


def test_a_step_that_asks_for_samples_after_the_rollout_sleeps_fails(cpu_assets):
    server = _server(cpu_assets)
    assert len(_sample(server)) == 2  # a launched engine is awake
    asyncio.run(server.sleep())  # sleep_replicas() after the step's generation: the actor owns the device now
    assert not server.awake
    with pytest.raises(RolloutAsleepError, match=r"asked to generate while asleep \(weights and kv_cache released\)"):
        _sample(server)  # e.g. a second generation (or a validation) before update_weights()
    with pytest.raises(RolloutAsleepError, match="sleep_replicas"):
        server.generate_batch([[10, 40]], server.sampling_key(2, dict(PARAMS)))  # the batcher's own path too


def test_verls_wake_sequence_is_the_only_way_back(cpu_assets):
    server = _server(cpu_assets)
    asyncio.run(server.sleep())  # init_workers ends with sleep_replicas()
    with pytest.raises(RolloutAsleepError, match=r"sent weights while asleep \(weights released\)"):
        server.update_weights(_weights(server), global_steps=0)  # weights must be resumed before they are loaded
    asyncio.run(server.wake_up(tags=["weights"]))  # update_weights(): 1. resume weights
    server.update_weights(_weights(server), global_steps=0)  # 2. load them
    with pytest.raises(RolloutAsleepError, match=r"\(kv_cache released\)"):
        _sample(server)  # the KV cache is not back yet
    asyncio.run(server.wake_up(tags=["kv_cache"]))  # 3. resume the KV cache
    assert server.awake and len(_sample(server)) == 2  # validation and the next step's generation
    asyncio.run(server.sleep())
    with pytest.raises(RolloutAsleepError):
        _sample(server)
    asyncio.run(server.wake_up())  # no tags: both, as vLLM's default
    assert len(_sample(server)) == 2
    with pytest.raises(ValueError, match="wake_up tags"):
        asyncio.run(server.wake_up(tags=["weight"]))


def test_the_weight_sync_path_releases_and_resumes_the_kv_cache(cpu_assets):
    server = _server(cpu_assets)
    asyncio.run(server.release_kv_cache())
    with pytest.raises(RolloutAsleepError, match=r"\(kv_cache released\)"):
        _sample(server)
    server.update_weights(_weights(server))  # the weights stay resident meanwhile
    asyncio.run(server.resume_kv_cache())
    assert len(_sample(server)) == 2


def test_without_free_cache_engine_sleep_keeps_the_engine_awake(cpu_assets):
    """verl's vLLM server ignores sleep when actor_rollout_ref.rollout.free_cache_engine=false, and so does the
    checkpoint manager's wake-up: the replica stays awake for the whole run."""
    server = _server(cpu_assets, free_cache_engine=False)
    asyncio.run(server.sleep())
    assert server.awake and len(_sample(server)) == 2
