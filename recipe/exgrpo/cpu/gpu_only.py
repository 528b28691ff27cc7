"""Stand-ins for the GPU rollout adapters on the CPU platform: looking any of them up raises a clear error.

verl's worker resolves ``rollout.name`` through a table of ``module.Class`` strings; on the CPU platform the plugin
points ``vllm``/``sglang``/``trtllm`` here, so a GPU config fails with the fix in the message instead of an
import error from a missing inference engine.
"""

from __future__ import annotations


def __getattr__(name: str):
    if name.startswith("__"):
        raise AttributeError(name)
    from .plugin import GPU_ROLLOUT_MESSAGE, GpuRolloutOnCpuError

    raise GpuRolloutOnCpuError(GPU_ROLLOUT_MESSAGE.format(name=name))
