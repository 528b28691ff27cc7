"""verl's FSDP training engines, registered for the ``cpu`` device, with CPU-specific checks up front.

verl registers ``FSDPEngineWithLMHead``/``FSDPEngineWithValueHead`` for ``cuda`` and ``npu`` only, so on the CPU
platform ``EngineRegistry`` answers "No engine registered for device='cpu'" (docs/cpu_backend.md, blocker 5). The
subclasses below add nothing to the training maths; they fail fast, naming the key and the fix, on settings
that would otherwise break deep inside FSDP or transformers on a CPU (FSDP1, flash attention).
"""

from __future__ import annotations

from verl.workers.engine import EngineRegistry
from verl.workers.engine.fsdp.transformer_impl import FSDPEngineWithLMHead, FSDPEngineWithValueHead

from recipe.exgrpo import verl_compat

GPU_ONLY_ATTENTION = ("flash_attention_2", "flash_attention_3", "flash_attn", "kernels-community/flash-attn")


class CpuEngineConfigError(ValueError):
    """An engine setting that cannot run on the CPU platform."""


def check_cpu_engine_settings(model_config, engine_config) -> None:
    """Raise ``CpuEngineConfigError`` for FSDP1 or a flash-attention implementation on CPU."""
    problems = []
    strategy = getattr(engine_config, "strategy", None)
    if strategy == "fsdp":
        problems.append(
            "strategy=fsdp (FSDP1) fails on CPU ('module has CPU parameters ... sync_module_states'): set "
            "actor_rollout_ref.actor.strategy=fsdp2 and actor_rollout_ref.ref.strategy=fsdp2 (critic.strategy=fsdp2)"
        )
    override = dict(getattr(model_config, "override_config", {}) or {})
    attn = override.get("attn_implementation")
    hf_config = getattr(model_config, "hf_config", None)
    if attn is None and hf_config is not None:
        attn = verl_compat.attn_implementation(hf_config)
    if attn is None or attn in GPU_ONLY_ATTENTION:
        problems.append(
            f"attn_implementation={attn or 'flash_attention_2 (verl default)'} needs a GPU: set "
            "+actor_rollout_ref.model.override_config.attn_implementation=sdpa"
        )
    if problems:
        raise CpuEngineConfigError("CPU platform: " + "; ".join(problems))


class CpuFSDPEngineWithLMHead(FSDPEngineWithLMHead):
    """verl's FSDP actor/ref engine, unchanged, behind the CPU settings check."""

    def __init__(self, model_config, engine_config, optimizer_config, checkpoint_config, *args, **kwargs):
        check_cpu_engine_settings(model_config, engine_config)
        super().__init__(model_config, engine_config, optimizer_config, checkpoint_config, *args, **kwargs)


class CpuFSDPEngineWithValueHead(FSDPEngineWithValueHead):
    """verl's FSDP critic engine, unchanged, behind the CPU settings check."""

    def __init__(self, model_config, engine_config, optimizer_config, checkpoint_config, *args, **kwargs):
        check_cpu_engine_settings(model_config, engine_config)
        super().__init__(model_config, engine_config, optimizer_config, checkpoint_config, *args, **kwargs)


def register_cpu_engines() -> None:
    """Register the engines for device ``cpu`` (both ``fsdp`` and ``fsdp2`` so FSDP1 gets the clear error)."""
    for model_type, engine_cls in (
        ("language_model", CpuFSDPEngineWithLMHead),
        ("value_model", CpuFSDPEngineWithValueHead),
    ):
        backends = [b for b in ("fsdp", "fsdp2") if not verl_compat.engine_registered(model_type, b, "cpu")]
        if backends:
            EngineRegistry.register(model_type=model_type, backend=backends, device="cpu")(engine_cls)
