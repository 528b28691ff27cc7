"""verl's FSDP training engines, registered for the ``cpu`` device, with CPU-specific checks up front.

verl registers ``FSDPEngineWithLMHead``/``FSDPEngineWithValueHead`` for ``cuda`` and ``npu`` only, so on the CPU
platform ``EngineRegistry`` answers "No engine registered for device='cpu'" (docs/cpu_backend.md, blocker 5). The
subclasses below add nothing to the training maths; they fail fast, naming the key and the fix, on settings
that would otherwise break deep inside FSDP or transformers on a CPU (FSDP1, flash attention). One thing differs
from verl's engine, the precision of merged LoRA weights sent to the rollout
(:meth:`CpuFSDPEngineWithLMHead._merged_lora_per_tensor_param`).
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
    """verl's FSDP actor/ref engine behind the CPU settings check, with merged LoRA weights sent in full precision."""

    def __init__(self, model_config, engine_config, optimizer_config, checkpoint_config, *args, **kwargs):
        check_cpu_engine_settings(model_config, engine_config)
        super().__init__(model_config, engine_config, optimizer_config, checkpoint_config, *args, **kwargs)

    def _merged_lora_per_tensor_param(self):
        """The merged (base + LoRA) weights for the rollout (``actor_rollout_ref.model.lora.merge=true``), each in
        its parameter's dtype.

        verl's own stream casts every merged tensor to bf16, which is what a GPU rollout holds anyway. The CPU
        rollouts hold float32 weights, as the actor does: bf16-rounded weights put the rollout's log-probs up to
        ~3e-2 away from the actor's before any update (measured on the tiny model), 10^4 times the float32 floor the
        rollout/actor agreement check reads, and the check could no longer tell a stale rollout from rounding. As in
        verl, the merge happens inside ``merged_lora_context`` (the base weights are backed up and restored after,
        byte for byte) and every tensor is a copy made while the merge holds.
        """
        from torch.distributed.tensor import DTensor
        from verl.utils.fsdp_utils import merged_lora_context, normalize_peft_param_name
        from verl.utils.model import convert_weight_keys

        with merged_lora_context(self.module, backup_adapters=True):
            params = normalize_peft_param_name(self.module.state_dict())
            params = convert_weight_keys(params, getattr(self.module, "_fsdp_wrapped_module", self.module))
            for name, param in params.items():
                full = param.full_tensor() if isinstance(param, DTensor) else param.detach()
                yield name, full.clone()  # (a one-rank full_tensor() may alias the live parameter)


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
