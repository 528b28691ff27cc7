"""Faults that make one stage of a CPU run wait for ever, for the tests of the stage deadlines.

Named in ``VERL_USE_EXTERNAL_MODULES`` after the CPU plugin, this module is imported in every process of the run that
imports verl (the task runner, the actor worker, the rollout server, the agent-loop and reward-loop workers).
``EXGRPO_TEST_STAGE_FAULT`` picks the fault; it acts once the file ``EXGRPO_TEST_FAULT_AFTER`` exists (the run's
``latest_checkpointed_iteration.txt``: from the step after the first complete checkpoint on), so the run has a
checkpoint to resume from when the fault stops it:

- ``generate_hang``: a generation request never returns (the agent loop's client awaits the rollout server's
  answer for ever: a wedged engine; verl's agent loop waits for every request without a bound);
- ``reward_sleep``: the reward-loop worker's batch scoring (the trainer's own reward call: the replayed members)
  sleeps for an hour;
- ``update_block``: the actor loss blocks inside the update (as a collective that never completes would);
- ``save_block``: verl's FSDP checkpoint manager writes the step's checkpoint, then blocks (a save that never
  completes: the checkpoint is there in part, the tracker file is not written).

Never imported by the recipe itself.
"""

from __future__ import annotations

import functools
import os
import sys
import time

FAULT_ENV = "EXGRPO_TEST_STAGE_FAULT"
AFTER_ENV = "EXGRPO_TEST_FAULT_AFTER"
FAULT = os.environ.get(FAULT_ENV, "")
FAULTS = ("generate_hang", "reward_sleep", "update_block", "save_block")


def armed() -> bool:
    after = os.environ.get(AFTER_ENV)
    return bool(after) and os.path.exists(after)


def _say(what: str) -> None:
    print(f"[stage_faults] {what} (pid {os.getpid()})", file=sys.stderr, flush=True)


def block_for_ever(what: str) -> None:
    _say(what)
    while True:
        time.sleep(3600)


if FAULT == "generate_hang":
    import asyncio

    # The client side of a request: verl's agent loop awaits it without a bound. (Not the rollout server's own
    # ``generate``: Ray takes an actor's methods when it loads its class, and the server's module is still half
    # executed when verl imports this one from inside it.)
    from verl.workers.rollout import llm_server

    def _hang(method):
        @functools.wraps(method)
        async def generate(self, *args, **kwargs):
            if armed():
                _say("a generation request that never returns")
                await asyncio.Event().wait()
            return await method(self, *args, **kwargs)

        return generate

    for _client in (llm_server.LLMServerClient, llm_server.FullyAsyncLLMServerClient):
        if "generate" in vars(_client):
            _client.generate = _hang(vars(_client)["generate"])

elif FAULT == "reward_sleep":
    import asyncio

    from verl.experimental.reward_loop.reward_loop import RewardLoopWorker

    _score_batch = RewardLoopWorker.compute_score_batch

    @functools.wraps(_score_batch)
    async def compute_score_batch(self, data):
        if armed():
            _say("a reward call that sleeps for an hour")
            await asyncio.sleep(3600)
        return await _score_batch(self, data)

    RewardLoopWorker.compute_score_batch = compute_score_batch

elif FAULT == "update_block":
    from recipe.exgrpo import actor_loss

    _loss = actor_loss.exgrpo_actor_loss

    @functools.wraps(_loss)
    def exgrpo_actor_loss(*args, **kwargs):
        if armed():
            block_for_ever("an update that blocks inside the actor loss")
        return _loss(*args, **kwargs)

    # the trainer pickles the loss by reference (module and name): every process resolves it to this wrapper
    actor_loss.exgrpo_actor_loss = exgrpo_actor_loss

elif FAULT == "save_block":
    from verl.utils.checkpoint.fsdp_checkpoint_manager import FSDPCheckpointManager

    _save = FSDPCheckpointManager.save_checkpoint

    @functools.wraps(_save)
    def save_checkpoint(self, *args, **kwargs):
        result = _save(self, *args, **kwargs)
        if armed():
            block_for_ever("a checkpoint save that never completes (written, not finished)")
        return result

    FSDPCheckpointManager.save_checkpoint = save_checkpoint

elif FAULT:
    raise ValueError(f"{FAULT_ENV}={FAULT!r}: expected one of {', '.join(FAULTS)}")
