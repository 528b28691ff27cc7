"""The two monkeypatches the CPU backend needs, kept here so they are easy to find and to delete.

1. The process-group backend. Why it is unavoidable: verl 0.9.1 builds the process-group backend string in
``verl.utils.distributed.initialize_global_process_group_ray`` as ``f"cpu:gloo,{device}:{backend}"``. With the
CPU platform that is ``"cpu:gloo,cpu:gloo"``, which ``torch.distributed`` rejects ("Duplicate device type cpu",
docs/cpu_backend.md, blocker 4). The device name must stay ``"cpu"`` (verl uses it for ``tensor.to``), the backend
name cannot make the string valid, and ``TrainingWorker.__init__`` calls the function without a ``backend``
argument, so no public extension point reaches it. The wrapper below only fills in ``backend="gloo"`` when the
platform is the CPU one and the caller passed none; every other call goes to verl's function unchanged.

2. The decoupled π_old copy of ``separate_async``. verl keeps the step's starting weights in host memory for the
old-log-prob passes of the later local updates (``DetachActorWorker.save_model_to_cpu`` through
``verl.utils.fsdp_utils.fsdp2_sharded_save_to_cpu``, which takes each parameter's shard with ``.cpu()``). On a GPU that
is a copy; on the CPU platform ``.cpu()`` returns the parameter's own tensor, so the "saved" weights move with every
optimizer step and the restore puts back the current ones: every local update after the first would compute its
old log-probs (and the selection's entropies) under the weights it is training. The wrapper clones what the function
returns; it is installed on the CPU platform only (docs/algorithm.md §15; the vLLM end-to-end run of the mode checks
the rollout's and the actor's log-probs agree on every row of the step's starting weights).
"""

from __future__ import annotations

import functools
from typing import Any

_PATCHED_ATTR = "_exgrpo_cpu_gloo_patch"


def _gloo_when_cpu(original):
    @functools.wraps(original)
    def wrapper(timeout_second: Any = None, backend: str | None = None):
        from verl.utils.device import get_device_name

        if backend is None and get_device_name() == "cpu":
            backend = "gloo"
        return original(timeout_second=timeout_second, backend=backend)

    setattr(wrapper, _PATCHED_ATTR, True)
    return wrapper


def patch_process_group_backend() -> None:
    """Make verl's Ray process-group init use plain ``gloo`` on the CPU platform. Idempotent (modules that imported
    the name before this patch hold their own reference: ``verl_compat.replace_process_group_init`` updates those
    too)."""
    from recipe.exgrpo import verl_compat

    verl_compat.replace_process_group_init(_gloo_when_cpu, _PATCHED_ATTR)


_COPY_ATTR = "_exgrpo_cpu_copy_patch"


def _cloned(original):
    @functools.wraps(original)
    def save(model):
        state, spec = original(model)
        return {name: (tensor.detach().clone(), placement) for name, (tensor, placement) in state.items()}, spec

    setattr(save, _COPY_ATTR, True)
    return save


def patch_cpu_model_copy() -> None:
    """Make verl's host-memory copy of the FSDP2 weights a copy on the CPU platform (module docstring, 2). Idempotent;
    ``DetachActorWorker`` imports the function when it first saves, so the module's attribute is what it gets."""
    import verl.utils.fsdp_utils as fsdp_utils

    if not getattr(fsdp_utils.fsdp2_sharded_save_to_cpu, _COPY_ATTR, False):
        fsdp_utils.fsdp2_sharded_save_to_cpu = _cloned(fsdp_utils.fsdp2_sharded_save_to_cpu)
