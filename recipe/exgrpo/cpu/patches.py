"""The one monkeypatch the CPU backend needs, kept here so it is easy to find and to delete.

Why it is unavoidable: verl 0.9.1 builds the process-group backend string in
``verl.utils.distributed.initialize_global_process_group_ray`` as ``f"cpu:gloo,{device}:{backend}"``. With the
CPU platform that is ``"cpu:gloo,cpu:gloo"``, which ``torch.distributed`` rejects ("Duplicate device type cpu",
docs/cpu_backend.md, blocker 4). The device name must stay ``"cpu"`` (verl uses it for ``tensor.to``), the backend
name cannot make the string valid, and ``TrainingWorker.__init__`` calls the function without a ``backend``
argument, so no public extension point reaches it. The wrapper below only fills in ``backend="gloo"`` when the
platform is the CPU one and the caller passed none; every other call goes to verl's function unchanged.
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
