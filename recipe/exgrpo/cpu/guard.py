"""Fail fast when the device settings of a config cannot work on this machine (instead of hanging in Ray)."""

from __future__ import annotations


def check_device_config(config) -> None:
    """Delegates to the CPU backend's checks when the CPU platform is selected (``VERL_PLATFORM=cpu``)."""
    import os

    if os.environ.get("VERL_PLATFORM", "").lower() != "cpu":
        return
    from recipe.exgrpo.cpu.run_config import validate_cpu_run_config

    validate_cpu_run_config(config)
