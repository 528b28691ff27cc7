"""GPU memory during generation, estimated from the launch config (no GPU needed): does vLLM's share fit next to
what the FSDP actor keeps on each card?

With the rollout colocated (verl's hybrid engine), vLLM generates while the actor's state stays where the last
update left it. What the actor keeps on each GPU then, per verl 0.9.1's FSDP engine
(``verl/workers/engine/fsdp/transformer_impl.py``, ``verl/workers/engine/base.py``, ``engine_workers.py``):

- its parameter shards, in ``fsdp_config.model_dtype`` (fp32 by default: the training copy; bf16 is only the
  compute dtype), unless ``fsdp_config.param_offload`` moves them to the CPU (after every update and after the
  weight sync);
- the optimizer state: AdamW's two moments per parameter, in the parameters' dtype, unless
  ``fsdp_config.optimizer_offload`` moves it to the CPU at the end of every update;
- no gradients: the update's train-mode context zeroes them (``zero_grad``, set to None) when it ends;
- everything sharded over the FSDP group: all ``trainer.nnodes x trainer.n_gpus_per_node`` ranks, or
  ``fsdp_config.fsdp_size`` of them when it is smaller (hybrid sharding);
- with ``strategy=fsdp2`` and ``fsdp_config.offload_policy=true`` parameters, gradients and optimizer live on the
  CPU: nothing;
- plus :data:`ACTOR_OVERHEAD_GIB` per process for its CUDA context, NCCL buffers and the allocator's slack (an
  allowance, not a measurement).

vLLM 0.24's ``gpu_memory_utilization`` is the share of the *whole* card that this vLLM instance may use for its
weights, activations and KV cache (not a share of the memory left free), and it refuses to start when less than
that is free. So the card holds about ``actor + gpu_memory_utilization x card memory`` during generation; the
estimate warns when that passes :data:`WARN_SHARE` of the card, naming the setting and the largest value that fits.
The card's memory is a setting (``--gpu-memory-gib`` of the dry run, ``GPU_MEMORY_GIB``; default
:data:`DEFAULT_CARD_GIB`, an 80 GB A100/H100), since the dry run runs without GPUs.
"""

from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

GIB = float(1 << 30)
DEFAULT_CARD_GIB = 80.0
CARD_GIB_ENV = "GPU_MEMORY_GIB"
MODEL_PARAMS_ENV = "MODEL_PARAMS"
#: per actor process: CUDA context, NCCL communicator buffers, allocator slack after verl's empty_cache()
ACTOR_OVERHEAD_GIB = 1.5
#: warn when the estimate passes this share of the card (what the estimate does not count: vLLM's own overshoot of
#: its budget, fragmentation, the weight sync's gathered tensors)
WARN_SHARE = 0.95
UTILIZATION_KEY = "actor_rollout_ref.rollout.gpu_memory_utilization"
#: parameter counts of the backbones the launch scripts train, for a model path that does not exist here (a dry run
#: on a machine without the model): lower-case name fragments, most specific first
KNOWN_MODEL_PARAMS: tuple[tuple[str, float], ...] = (
    ("qwen2.5-math-1.5b", 1.544e9),
    ("qwen2.5-math-7b", 7.616e9),
    ("qwen-math-7b", 7.616e9),  # LUFFY-Qwen-Math-7B-Zero
    ("qwen2.5-7b", 7.616e9),
    ("llama-3.1-8b", 8.030e9),
    ("llama3.1-8b", 8.030e9),
)
_DTYPE_BYTES = {"fp32": 4, "float32": 4, "bf16": 2, "bfloat16": 2, "fp16": 2, "float16": 2}


class MemoryEstimateError(ValueError):
    """A setting of the estimate itself is wrong (a parameter count or card size that is not a number)."""


def parse_count(text: str | float | int) -> float:
    """``7.6e9``, ``7616000000`` or ``7.6B`` / ``1.5b`` / ``350M`` -> a parameter count."""
    if isinstance(text, (int, float)):
        return float(text)
    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:e[+-]?[0-9]+)?)\s*([kmbt]?)\s*", str(text), re.IGNORECASE)
    if not match:
        raise MemoryEstimateError(f"{MODEL_PARAMS_ENV}={text!r}: give a parameter count such as 7.6e9 or 7.6B")
    scale = {"": 1, "k": 1e3, "m": 1e6, "b": 1e9, "t": 1e12}[match.group(2).lower()]
    return float(match.group(1)) * scale


def count_parameters(model_dir: str | os.PathLike[str], trust_remote_code: bool = False) -> int:
    """Exact parameter count of the model described by ``model_dir/config.json``: the model is built on PyTorch's
    meta device (no memory, no weights read), so any architecture transformers knows is counted as it is built."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(str(model_dir), trust_remote_code=trust_remote_code)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, trust_remote_code=trust_remote_code)
    return sum(p.numel() for p in model.parameters())  # shared (tied) tensors are counted once


def known_model_params(model_path: str) -> float | None:
    name = Path(str(model_path).rstrip("/")).name.lower()
    for fragment, count in KNOWN_MODEL_PARAMS:
        if fragment in name:
            return count
    return None


@dataclass(frozen=True)
class GenerationMemory:
    """Memory per GPU while vLLM generates, in GiB, and where the parameter count came from."""

    params: float
    params_source: str
    shards: int
    actor_params_gib: float
    actor_optimizer_gib: float
    actor_overhead_gib: float
    vllm_gib: float
    card_gib: float
    utilization: float

    @property
    def actor_gib(self) -> float:
        return self.actor_params_gib + self.actor_optimizer_gib + self.actor_overhead_gib

    @property
    def total_gib(self) -> float:
        return self.actor_gib + self.vllm_gib

    @property
    def fits(self) -> bool:
        return self.total_gib <= WARN_SHARE * self.card_gib

    def utilization_that_fits(self) -> float:
        """The largest ``gpu_memory_utilization`` (a multiple of 0.05) that keeps the estimate within WARN_SHARE."""
        room = (WARN_SHARE * self.card_gib - self.actor_gib) / self.card_gib
        return max(0.0, math.floor(room * 20 + 1e-9) / 20)

    def summary(self) -> str:
        return (
            f"GPU memory during generation (estimate, per GPU): FSDP actor {self.actor_gib:.1f} GiB (parameters "
            f"{self.actor_params_gib:.1f} + optimizer {self.actor_optimizer_gib:.1f} over {self.shards} shards + "
            f"{self.actor_overhead_gib:g} overhead; {self.params / 1e9:.2f}B parameters from {self.params_source}) "
            f"+ vLLM {self.utilization:g} x {self.card_gib:g} GiB = {self.vllm_gib:.1f} GiB: {self.total_gib:.1f} of "
            f"{self.card_gib:g} GiB"
        )

    def warning(self) -> str | None:
        if self.fits:
            return None
        fit = self.utilization_that_fits()
        offload = (
            "actor_rollout_ref.actor.fsdp_config.param_offload=true and "
            "actor_rollout_ref.actor.fsdp_config.optimizer_offload=true (the actor's "
            f"{self.actor_params_gib + self.actor_optimizer_gib:.1f} GiB leave the GPU while vLLM runs)"
        )
        fix = f"set {UTILIZATION_KEY}={fit:.2f} (the largest that fits), or {offload}" if fit >= 0.3 else offload
        return (
            f"{self.summary()}, more than {WARN_SHARE:.0%} of the card: vLLM may run out of memory or refuse to start "
            f"({UTILIZATION_KEY}={self.utilization:g} is a share of the whole card in vLLM 0.24); {fix}. The card "
            f"size is {CARD_GIB_ENV} / --gpu-memory-gib (default {DEFAULT_CARD_GIB:g}); "
            "docs/troubleshooting.md#gpu-memory-estimate-warning"
        )


def _select(config, key: str, default: Any = None) -> Any:
    return OmegaConf.select(config, key, default=default)


def estimate_generation_memory(
    config, card_gib: float = DEFAULT_CARD_GIB, model_params: float | None = None
) -> tuple[GenerationMemory | None, str | None]:
    """(estimate, None), or (None, why there is none) for a config the estimate does not cover (no vLLM rollout,
    no colocation, a non-FSDP actor, an unknown parameter count)."""
    if not card_gib > 0:
        raise MemoryEstimateError(f"{CARD_GIB_ENV} / --gpu-memory-gib must be > 0, got {card_gib!r}")
    if str(_select(config, "actor_rollout_ref.rollout.name")) != "vllm":
        return None, "the rollout is not vLLM"
    if not _select(config, "actor_rollout_ref.hybrid_engine", True):
        return None, "the rollout is not colocated with the actor"
    actor = config.actor_rollout_ref.actor
    strategy = str(actor.get("strategy", "fsdp"))
    if strategy not in ("fsdp", "fsdp2"):
        return None, f"actor_rollout_ref.actor.strategy={strategy} is not FSDP"
    path = str(config.actor_rollout_ref.model.path)
    if model_params is not None:
        params, source = float(model_params), f"{MODEL_PARAMS_ENV} / --model-params"
    elif os.path.isfile(os.path.join(os.path.expanduser(path), "config.json")):
        trust = bool(_select(config, "actor_rollout_ref.model.trust_remote_code", False))
        try:
            params, source = float(count_parameters(os.path.expanduser(path), trust)), f"{path}/config.json"
        except Exception as e:  # an architecture transformers cannot build here
            return None, f"cannot count the parameters of {path} ({type(e).__name__}: {e}); pass --model-params"
    else:
        known = known_model_params(path)
        if known is None:
            return None, f"the parameter count of {path} is unknown here: pass --model-params (or {MODEL_PARAMS_ENV})"
        params, source = known, f"the table of known backbones ({Path(path).name})"

    fsdp = actor.get("fsdp_config") or {}
    world = int(config.trainer.nnodes) * int(config.trainer.n_gpus_per_node)
    fsdp_size = int(fsdp.get("fsdp_size", -1) or -1)
    shards = world if fsdp_size <= 0 or fsdp_size >= world else fsdp_size
    dtype = str(fsdp.get("model_dtype") or "fp32").lower()
    if dtype not in _DTYPE_BYTES:
        return None, f"actor_rollout_ref.actor.fsdp_config.model_dtype={dtype} is not a dtype the estimate knows"
    width = _DTYPE_BYTES[dtype]
    all_on_cpu = strategy == "fsdp2" and bool(fsdp.get("offload_policy", False))
    param_bytes = 0 if all_on_cpu or fsdp.get("param_offload", False) else width * params / shards
    optim_bytes = 0 if all_on_cpu or fsdp.get("optimizer_offload", False) else 2 * width * params / shards
    utilization = float(config.actor_rollout_ref.rollout.gpu_memory_utilization)
    return (
        GenerationMemory(
            params=params,
            params_source=source,
            shards=shards,
            actor_params_gib=param_bytes / GIB,
            actor_optimizer_gib=optim_bytes / GIB,
            actor_overhead_gib=ACTOR_OVERHEAD_GIB,
            vllm_gib=utilization * card_gib,
            card_gib=card_gib,
            utilization=utilization,
        ),
        None,
    )
