"""The trainer-side vLLM adapter of the ``skip_weight_sync`` fault (tests/e2e/vllm_faults.py): imported by verl
only when it builds the rollout, in the process that owns it, so importing vLLM here costs the other processes
nothing."""

from __future__ import annotations

import sys

from recipe.exgrpo.cpu.vllm_rollout import CpuVLLMServerAdapter


class SkippingServerAdapter(CpuVLLMServerAdapter):
    """Sends the weights of the sync before step 1 (the engine starts on dummy weights), then none."""

    async def update_weights(self, weights, global_steps=None, **kw):
        if not global_steps:
            return await super().update_weights(weights, global_steps=global_steps, **kw)
        for _ in weights:  # the actor's side of the sync still runs; its tensors go nowhere
            pass
        print(f"[vllm_faults] weight sync after step {global_steps} skipped", file=sys.stderr, flush=True)
