"""CPU backend for verl 0.9.1: platform plugin, Hugging Face rollout, run config, offline assets (docs/cpu_backend.md).

Kept import-free: ``recipe.exgrpo.cpu.plugin`` is loaded by verl itself (``VERL_USE_EXTERNAL_MODULES``), and the
assets/run-config helpers must be importable without initialising verl.
"""
