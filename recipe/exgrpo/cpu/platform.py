"""A verl platform for machines without an accelerator (``VERL_PLATFORM=cpu``).

verl 0.9.1 resolves every device question (device name, torch device module, collective backend, Ray resource)
through ``verl.plugin.platform.get_platform()``. Registering this class under the name ``cpu`` is the public way
to run the real trainer on CPU; see docs/cpu_backend.md (blockers 1, 3, 9).

Design choices:
- ``device_name`` is ``"cpu"`` so every ``tensor.to(device_name)`` and ``init_device_mesh(device_name, ...)`` in
  verl lands on the CPU; ``current_device()`` returns ``"cpu"`` (not an int) because verl also writes
  ``tensor.to(get_device_id())``, and an int there would mean ``cuda:<int>``.
- ``device_module`` is a small namespace over ``torch.cpu`` that adds the memory/RNG/IPC calls verl makes on
  ``get_torch_device()`` (``empty_cache``, ``mem_get_info``, ``get_rng_state``, ``get_device_name`` ...). Its
  ``get_device_name()`` returns the string ``"CPU"``: verl's flops counter does ``key in device_name`` and
  crashes on a non-string (docs/cpu_backend.md, blocker 9).
- The collective backend is plain ``gloo``.
- The Ray resource is ``GPU``: verl's resource-pool check counts only ``GPU``/``NPU`` resources and its
  placement groups ask for one accelerator per worker, so the driver must announce *logical* GPUs
  (``ray_init.num_gpus``, one per CPU "device"); nothing ever touches CUDA.
"""

from __future__ import annotations

import os
import types
from contextlib import contextmanager
from typing import Any, Optional

import psutil
import torch
from verl.plugin.platform import PlatformBase, PlatformRegistry

PLATFORM_NAME = "cpu"
DEVICE_NAME_STRING = "CPU"


def _cpu_mem_get_info(device: Any = None) -> tuple[int, int]:
    """(free, total) bytes of host memory, the CPU analogue of ``torch.cuda.mem_get_info``."""
    vm = psutil.virtual_memory()
    return int(vm.available), int(vm.total)


def _zero(*args: Any, **kwargs: Any) -> int:
    return 0


def _noop(*args: Any, **kwargs: Any) -> None:
    return None


def _make_device_module() -> types.ModuleType:
    """A ``torch.cpu``-like module with the extra calls verl makes on ``get_torch_device()``."""
    module = types.ModuleType("exgrpo_cpu_device")
    for name in dir(torch.cpu):
        if not name.startswith("_"):
            setattr(module, name, getattr(torch.cpu, name))
    module.empty_cache = _noop
    module.ipc_collect = _noop
    module.reset_peak_memory_stats = _noop
    module.set_per_process_memory_fraction = _noop
    module.mem_get_info = _cpu_mem_get_info
    module.memory_allocated = _zero
    module.memory_reserved = _zero
    module.max_memory_allocated = _zero
    module.max_memory_reserved = _zero
    module.get_rng_state = lambda device=None: torch.get_rng_state()
    module.set_rng_state = lambda state, device=None: torch.set_rng_state(state)
    module.manual_seed = torch.manual_seed
    module.manual_seed_all = torch.manual_seed
    module.get_device_name = lambda device=None: DEVICE_NAME_STRING
    module.current_device = lambda: "cpu"
    module.set_device = _noop
    module.device_count = lambda: 1
    module.is_available = lambda: True
    return module


@PlatformRegistry.register(platform=PLATFORM_NAME)
class PlatformCPU(PlatformBase):
    """verl platform backend that runs every worker on the host CPU with gloo collectives."""

    _device_module: types.ModuleType | None = None

    @property
    def device_name(self) -> str:
        return "cpu"

    @property
    def vendor_name(self) -> str:
        return "cpu"

    @property
    def device_module(self) -> types.ModuleType:
        if PlatformCPU._device_module is None:
            PlatformCPU._device_module = _make_device_module()
        return PlatformCPU._device_module

    def is_available(self) -> bool:
        return True

    def is_platform_available(self, use_smi_check: bool = False) -> bool:
        # Auto-detection probes registered platforms in registration order (nvidia, npu, rocm, then this one),
        # so returning True here only wins when no accelerator platform claimed the host.
        return True

    def current_device(self) -> str:  # type: ignore[override]
        return "cpu"

    def device_count(self) -> int:
        return 1

    def set_device(self, device_index: int) -> None:
        return None

    def synchronize(self, device_index: Optional[int] = None) -> None:
        return None

    def manual_seed(self, seed: int) -> None:
        torch.manual_seed(seed)

    def manual_seed_all(self, seed: int) -> None:
        torch.manual_seed(seed)

    def set_allocator_settings(self, settings: str) -> None:
        return None

    def empty_cache(self) -> None:
        return None

    def get_device_capability(self, device_index: int = 0) -> tuple[Optional[int], Optional[int]]:
        return None, None

    def communication_backend_name(self) -> str:
        return "gloo"

    def visible_devices_envvar(self) -> str:
        # Ray sets CUDA_VISIBLE_DEVICES for actors holding (logical) GPUs; reading it is harmless on CPU.
        return "CUDA_VISIBLE_DEVICES"

    @contextmanager
    def nvtx_range(self, msg: str):
        yield

    def profiler_start(self) -> None:
        return None

    def profiler_stop(self) -> None:
        return None

    def ray_resource_name(self) -> str:
        return "GPU"

    def ray_resource_options(self, num_gpus: float) -> dict[str, Any]:
        return {"num_gpus": num_gpus}

    def ray_noset_envvars(self) -> list[str]:
        return []

    def is_ipc_supported(self) -> bool:
        return False

    def rollout_env_vars(self) -> dict[str, str]:
        return {"VERL_PLATFORM": PLATFORM_NAME}

    def cudart(self) -> Any:
        return None


def platform_is_cpu() -> bool:
    """True when this process resolves verl's platform to the CPU one (explicitly or by auto-detection)."""
    from verl.plugin.platform import get_platform

    return get_platform().device_name == "cpu"


def requested_platform() -> str:
    """The platform name asked for through ``VERL_PLATFORM`` ('' when unset)."""
    return os.environ.get("VERL_PLATFORM", "").strip().lower()
