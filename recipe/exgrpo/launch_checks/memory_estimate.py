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

With LoRA (``actor_rollout_ref.model.lora_rank > 0``, ``recipe/exgrpo/lora.py``) the actor holds the frozen base
weights and the adapter, both in ``model_dtype`` (verl casts the adapter to the base's dtype), and AdamW's moments for
the adapter only; the adapter's size is counted from the model's layers (``lora.linear_layers``,
``lora.targeted_layers``, ``lora.adapter_parameter_count``).

The other peak is the update (:func:`estimate_update_memory`), while vLLM sleeps (``rollout.free_cache_engine``: its
weights and KV cache released, :data:`VLLM_ASLEEP_GIB` left): the actor's weights, gradients and optimizer state, all
on the GPU whatever the offload settings (verl loads them back for the update), plus the activations of one
micro-batch of tokens (``ppo_max_token_len_per_gpu`` with ``use_dynamic_bsz``, else ``ppo_micro_batch_size_per_gpu``
x (prompt + response) tokens): the checkpointed inputs of every decoder layer, one layer's activations recomputed in
the backward (gradient checkpointing; every layer's without it) and the logits (:data:`LOGIT_BYTES` per token and
vocabulary entry). The shapes come from ``MODEL_PATH/config.json``, else from :data:`BUILTIN_CONFIGS` (the config.json
keys of the scripts' backbones), read the same way.
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
#: vLLM while it sleeps through the update (free_cache_engine: weights and KV cache released): its CUDA context and
#: CUDA-graph pool (an allowance, not a measurement)
VLLM_ASLEEP_GIB = 2.0
#: bytes per logit (token x vocabulary entry) in the update: the bf16 logits, kept for the backward, and two bf16
#: buffers of their size in the backward (the entropy bonus's gradient and the sum with the log-prob's); verl takes the
#: log-prob with flash-attn's in-place cross entropy and compiles the entropy (``use_torch_compile``), so no fp32 copy
LOGIT_BYTES = 6
#: the same in the forward-only passes (old log-probs and entropies, no gradients): the bf16 logits and one bf16
#: temporary of their size (the entropy's softmax)
FORWARD_LOGIT_BYTES = 4
#: bytes of an activation (bf16 compute, FSDP's ``mixed_precision.param_dtype``)
ACTIVATION_BYTES = 2
#: warn when the estimate passes this share of the card (what the estimate does not count: vLLM's own overshoot of
#: its budget, fragmentation, the weight sync's gathered tensors)
WARN_SHARE = 0.95
UTILIZATION_KEY = "actor_rollout_ref.rollout.gpu_memory_utilization"
TOKENS_KEY = "actor_rollout_ref.actor.ppo_max_token_len_per_gpu"
LOGPROB_TOKENS_KEY = "actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu"
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
_QWEN2 = {"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_act": "silu", "rms_norm_eps": 1e-6}
_QWEN_7B = dict(
    _QWEN2,
    hidden_size=3584,
    intermediate_size=18944,
    num_hidden_layers=28,
    num_attention_heads=28,
    num_key_value_heads=4,
    vocab_size=152064,
    tie_word_embeddings=False,
)
_LLAMA_8B = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "vocab_size": 128256,
    "tie_word_embeddings": False,
}
#: the architecture keys of the backbones' config.json (their published Hugging Face configs), for a model path that
#: does not exist here: the same name fragments as KNOWN_MODEL_PARAMS; the parameter counts they give are the table's
BUILTIN_CONFIGS: dict[str, dict] = {
    "qwen2.5-math-1.5b": dict(
        _QWEN2,
        hidden_size=1536,
        intermediate_size=8960,
        num_hidden_layers=28,
        num_attention_heads=12,
        num_key_value_heads=2,
        vocab_size=151936,
        tie_word_embeddings=True,
    ),
    "qwen2.5-math-7b": _QWEN_7B,
    "qwen-math-7b": _QWEN_7B,
    "qwen2.5-7b": _QWEN_7B,
    "llama-3.1-8b": _LLAMA_8B,
    "llama3.1-8b": _LLAMA_8B,
}
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


def _known(model_path: str, table) -> tuple[str, Any] | None:
    name = Path(str(model_path).rstrip("/")).name.lower()
    for fragment, value in table:
        if fragment in name:
            return fragment, value
    return None


def known_model_params(model_path: str) -> float | None:
    known = _known(model_path, KNOWN_MODEL_PARAMS)
    return None if known is None else known[1]


@dataclass(frozen=True)
class ModelShape:
    """What the estimate reads from a model's config.json: its parameter count, the sizes the activations scale with,
    and its LoRA-able layers (``lora.linear_layers``: ``{name: (in, out, kind)}``)."""

    params: int
    hidden: int
    intermediate: int
    layers: int
    q_dim: int
    kv_dim: int
    vocab: int
    tied: bool
    linear: dict

    @property
    def root_params(self) -> int:
        """The embeddings and the output layer (FSDP's root unit, outside the decoder layers)."""
        return self.vocab * self.hidden * (1 if self.tied else 2)

    @property
    def layer_params(self) -> float:
        return (self.params - self.root_params) / self.layers

    @property
    def layer_activation_bytes(self) -> int:
        """Bytes per token of one decoder layer's saved activations: the two norms' inputs and outputs, the residual
        sum, q, k, v, the attention's output, and the gated MLP's four tensors (gate, up, act(gate), their product)."""
        return ACTIVATION_BYTES * (5 * self.hidden + 2 * self.q_dim + 2 * self.kv_dim + 4 * self.intermediate)


_BUILTIN_DIRS: dict[str, Any] = {}


def _builtin_dir(fragment: str) -> str:
    """A directory holding the built-in config.json of ``fragment`` (made once per process)."""
    import json
    import tempfile

    if fragment not in _BUILTIN_DIRS:
        tmp = tempfile.TemporaryDirectory(prefix="exgrpo-shape-")  # removed when the process ends
        Path(tmp.name, "config.json").write_text(json.dumps(BUILTIN_CONFIGS[fragment]))
        _BUILTIN_DIRS[fragment] = tmp
    return _BUILTIN_DIRS[fragment].name


_SHAPES: dict[tuple[str, bool], ModelShape] = {}


def model_shape(model_dir: str | os.PathLike[str], trust_remote_code: bool = False) -> ModelShape:
    """The :class:`ModelShape` of ``model_dir/config.json`` (built on the meta device, no weights read; cached)."""
    key = (str(model_dir), trust_remote_code)
    if key not in _SHAPES:
        from transformers import AutoConfig

        from recipe.exgrpo.lora import linear_layers

        c = AutoConfig.from_pretrained(str(model_dir), trust_remote_code=trust_remote_code)
        c = getattr(c, "text_config", None) or c
        heads = int(c.num_attention_heads)
        head_dim = int(getattr(c, "head_dim", None) or c.hidden_size // heads)
        _, linear = linear_layers(model_dir, trust_remote_code)
        _SHAPES[key] = ModelShape(
            params=count_parameters(model_dir, trust_remote_code),
            hidden=int(c.hidden_size),
            intermediate=int(c.intermediate_size),
            layers=int(c.num_hidden_layers),
            q_dim=heads * head_dim,
            kv_dim=int(getattr(c, "num_key_value_heads", None) or heads) * head_dim,
            vocab=int(c.vocab_size),
            tied=bool(getattr(c, "tie_word_embeddings", False)),
            linear=linear,
        )
    return _SHAPES[key]


def _select(config, key: str, default: Any = None) -> Any:
    return OmegaConf.select(config, key, default=default)


@dataclass(frozen=True)
class _Actor:
    """The FSDP actor of a launch config, as the estimates read it."""

    params: float
    params_source: str
    shape: ModelShape | None
    adapter: float  # LoRA adapter parameters (0: full fine-tuning)
    lora: str  # how the adapter was set ("" without LoRA)
    width: int  # bytes per parameter (fsdp_config.model_dtype)
    dtype: str
    shards: int
    param_offload: bool
    optimizer_offload: bool
    all_on_cpu: bool  # fsdp2 with offload_policy: parameters, gradients and optimizer state live on the CPU

    @property
    def trainable(self) -> float:
        return self.adapter if self.lora else self.params


def _actor(config, model_params: float | None) -> tuple[_Actor | None, str | None]:
    from recipe.exgrpo.lora import LoraSettings, adapter_parameter_count, targeted_layers

    if str(_select(config, "actor_rollout_ref.rollout.name")) != "vllm":
        return None, "the rollout is not vLLM"
    if not _select(config, "actor_rollout_ref.hybrid_engine", True):
        return None, "the rollout is not colocated with the actor"
    actor = config.actor_rollout_ref.actor
    strategy = str(actor.get("strategy", "fsdp"))
    if strategy not in ("fsdp", "fsdp2"):
        return None, f"actor_rollout_ref.actor.strategy={strategy} is not FSDP"
    path = str(config.actor_rollout_ref.model.path)
    trust = bool(_select(config, "actor_rollout_ref.model.trust_remote_code", False))
    local = os.path.expanduser(path)
    shape, shape_why = None, None
    if os.path.isfile(os.path.join(local, "config.json")):
        try:
            shape = model_shape(local, trust)
        except Exception as e:  # an architecture transformers cannot build here
            shape_why = f"cannot read the shapes of {path} ({type(e).__name__}: {e})"
            if model_params is None:
                return None, f"cannot count the parameters of {path} ({type(e).__name__}: {e}); pass --model-params"
        shape_source = f"{path}/config.json"
    else:
        builtin = _known(path, BUILTIN_CONFIGS.items())
        if builtin is not None:
            shape = model_shape(_builtin_dir(builtin[0]))
        else:
            shape_why = f"the shapes of {path} are unknown here (no config.json)"
        shape_source = f"the table of known backbones ({Path(path).name})"
    if model_params is not None:
        params, source = float(model_params), f"{MODEL_PARAMS_ENV} / --model-params"
    elif shape is not None:
        params, source = float(shape.params), shape_source
    else:
        return None, f"the parameter count of {path} is unknown here: pass --model-params (or {MODEL_PARAMS_ENV})"

    lora = LoraSettings.of(config)
    adapter, lora_text = 0.0, ""
    if lora.enabled:
        if lora.adapter_path:
            return None, f"the adapter at {lora.adapter_path} brings its own size; the estimate counts new adapters"
        if shape is None:
            return None, f"LoRA's adapter size needs the model's layers: {shape_why}"
        targeted = targeted_layers(shape.linear, lora.target_modules, lora.exclude_modules)
        adapter = float(adapter_parameter_count(shape.linear, targeted, lora.rank))
        lora_text = f"rank {lora.rank} on {len(targeted)} layers"

    fsdp = actor.get("fsdp_config") or {}
    world = int(config.trainer.nnodes) * int(config.trainer.n_gpus_per_node)
    fsdp_size = int(fsdp.get("fsdp_size", -1) or -1)
    dtype = str(fsdp.get("model_dtype") or "fp32").lower()
    if dtype not in _DTYPE_BYTES:
        return None, f"actor_rollout_ref.actor.fsdp_config.model_dtype={dtype} is not a dtype the estimate knows"
    return (
        _Actor(
            params=params,
            params_source=source,
            shape=shape,
            adapter=adapter,
            lora=lora_text,
            width=_DTYPE_BYTES[dtype],
            dtype=dtype,
            shards=world if fsdp_size <= 0 or fsdp_size >= world else fsdp_size,
            param_offload=bool(fsdp.get("param_offload", False)),
            optimizer_offload=bool(fsdp.get("optimizer_offload", False)),
            all_on_cpu=strategy == "fsdp2" and bool(fsdp.get("offload_policy", False)),
        ),
        None,
    )


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
    #: LoRA: the adapter's parameters (in actor_params_gib with the frozen base; the optimizer holds state for them
    #: only) and how it was set; 0 and "" for full fine-tuning
    adapter_params: float = 0.0
    lora: str = ""
    dtype: str = "fp32"

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
        if self.lora:
            what = (
                f"parameters {self.actor_params_gib:.1f} ({self.dtype}: the frozen base and a "
                f"{self.adapter_params / 1e6:.1f}M-parameter LoRA adapter, {self.lora}) + optimizer "
                f"{self.actor_optimizer_gib:.1f} (the adapter's)"
            )
        else:
            what = f"parameters {self.actor_params_gib:.1f} + optimizer {self.actor_optimizer_gib:.1f}"
        return (
            f"GPU memory during generation (estimate, per GPU): FSDP actor {self.actor_gib:.1f} GiB ({what} over "
            f"{self.shards} shards + {self.actor_overhead_gib:g} overhead; {self.params / 1e9:.2f}B parameters from "
            f"{self.params_source}) + vLLM {self.utilization:g} x {self.card_gib:g} GiB = {self.vllm_gib:.1f} GiB: "
            f"{self.total_gib:.1f} of {self.card_gib:g} GiB"
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


def _check_card(card_gib: float) -> None:
    if not card_gib > 0:
        raise MemoryEstimateError(f"{CARD_GIB_ENV} / --gpu-memory-gib must be > 0, got {card_gib!r}")


def estimate_generation_memory(
    config, card_gib: float = DEFAULT_CARD_GIB, model_params: float | None = None
) -> tuple[GenerationMemory | None, str | None]:
    """(estimate, None), or (None, why there is none) for a config the estimate does not cover (no vLLM rollout,
    no colocation, a non-FSDP actor, an unknown parameter count)."""
    _check_card(card_gib)
    a, why = _actor(config, model_params)
    if a is None:
        return None, why
    weights = 0 if a.all_on_cpu or a.param_offload else a.width * (a.params + a.adapter) / a.shards
    optim = 0 if a.all_on_cpu or a.optimizer_offload else 2 * a.width * a.trainable / a.shards
    utilization = float(config.actor_rollout_ref.rollout.gpu_memory_utilization)
    return (
        GenerationMemory(
            params=a.params,
            params_source=a.params_source,
            shards=a.shards,
            actor_params_gib=weights / GIB,
            actor_optimizer_gib=optim / GIB,
            actor_overhead_gib=ACTOR_OVERHEAD_GIB,
            vllm_gib=utilization * card_gib,
            card_gib=card_gib,
            utilization=utilization,
            adapter_params=a.adapter,
            lora=a.lora,
            dtype=a.dtype,
        ),
        None,
    )


@dataclass(frozen=True)
class UpdateMemory:
    """Memory per GPU during the actor's update (vLLM asleep), in GiB; ``tokens``: one micro-batch's tokens."""

    weights_gib: float
    gradients_gib: float
    optimizer_gib: float
    gathered_gib: float
    checkpoints_gib: float
    layer_gib: float
    logits_gib: float
    overhead_gib: float
    vllm_gib: float
    card_gib: float
    tokens: int
    min_tokens: int  # one longest sequence: the smallest micro-batch the update can run
    per_token_bytes: float
    lora: str = ""
    adapter_params: float = 0.0
    dtype: str = "fp32"
    vllm_asleep: bool = True
    tokens_key: str = TOKENS_KEY
    #: the forward-only log-prob pass (no gradients): its micro-batch's tokens and activations, when it has its own
    #: token budget (use_dynamic_bsz); it runs with the same weights, gradients (none) and optimizer on the GPU
    logprob_tokens: int = 0
    logprob_gib: float = 0.0

    @property
    def activations_gib(self) -> float:
        return max(self.checkpoints_gib + self.layer_gib + self.logits_gib, self.logprob_gib)

    @property
    def state_gib(self) -> float:
        return self.weights_gib + self.gradients_gib + self.optimizer_gib

    @property
    def total_gib(self) -> float:
        return self.state_gib + self.gathered_gib + self.activations_gib + self.overhead_gib + self.vllm_gib

    @property
    def fits(self) -> bool:
        return self.total_gib <= WARN_SHARE * self.card_gib

    def tokens_that_fit(self) -> int:
        """The largest micro-batch (a multiple of 1024 tokens) that keeps the estimate within WARN_SHARE; 0 if none."""
        room = WARN_SHARE * self.card_gib - (self.total_gib - self.activations_gib)
        return max(0, int(room * GIB / self.per_token_bytes) // 1024 * 1024)

    def summary(self) -> str:
        if self.lora:
            trained = f"LoRA {self.lora}: {self.adapter_params / 1e6:.1f}M trained, the base frozen"
        else:
            trained = "all trained"
        vllm = "asleep" if self.vllm_asleep else "awake (free_cache_engine=false)"
        return (
            f"GPU memory during the update (estimate, per GPU): weights {self.weights_gib:.1f} ({self.dtype}; "
            f"{trained}) + gradients {self.gradients_gib:.1f} + optimizer {self.optimizer_gib:.1f} + FSDP's gathered "
            f"bf16 units {self.gathered_gib:.1f} + activations {self.activations_gib:.1f} for {self.tokens} tokens "
            f"per micro-batch (logits {self.logits_gib:.1f}, checkpointed layer inputs {self.checkpoints_gib:.1f}, "
            f"recomputed layer {self.layer_gib:.1f}{self._logprob_text()}) + {self.overhead_gib:g} overhead + vLLM "
            f"{vllm} {self.vllm_gib:.1f}: {self.total_gib:.1f} of {self.card_gib:g} GiB"
        )

    def _logprob_text(self) -> str:
        if self.logprob_gib <= self.checkpoints_gib + self.layer_gib + self.logits_gib:
            return ""
        return f"; counted: the log-prob pass's {self.logprob_gib:.1f} for its {self.logprob_tokens} tokens"

    def warning(self) -> str | None:
        if self.fits:
            return None
        fit = self.tokens_that_fit()
        if fit >= self.min_tokens:
            keys = self.tokens_key if not self.logprob_tokens else f"{self.tokens_key} and {LOGPROB_TOKENS_KEY}"
            fix = f"set {keys} <= {fit} (the largest that fits; at least one sequence, {self.min_tokens})"
        else:
            fix = (
                f"even one sequence ({self.min_tokens} tokens) does not fit next to the actor's "
                f"{self.state_gib:.1f} GiB of weights, gradients and optimizer state: use more GPUs (FSDP shards), "
                "LoRA (actor_rollout_ref.model.lora_rank > 0) or shorter sequences"
            )
        return f"{self.summary()}, more than {WARN_SHARE:.0%} of the card: the update may run out of memory; {fix}"


def _micro_batch_tokens(config) -> tuple[int, int, str]:
    """(tokens of one update micro-batch per GPU, tokens of one longest sequence, the key that sets them)."""
    actor = config.actor_rollout_ref.actor
    longest = int(_select(config, "data.max_prompt_length", 0) or 0) + int(
        _select(config, "data.max_response_length", 0) or 0
    )
    sp = max(1, int(actor.get("ulysses_sequence_parallel_size", 1) or 1))
    if actor.get("use_dynamic_bsz", False):
        return int(actor.ppo_max_token_len_per_gpu) // sp, longest // sp, TOKENS_KEY
    micro = actor.get("ppo_micro_batch_size_per_gpu") or 1
    key = "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu"
    return int(micro) * longest // sp, longest // sp, key


def estimate_update_memory(
    config, card_gib: float = DEFAULT_CARD_GIB, model_params: float | None = None
) -> tuple[UpdateMemory | None, str | None]:
    """(estimate, None) of the memory per GPU during the actor's update, or (None, why there is none)."""
    _check_card(card_gib)
    a, why = _actor(config, model_params)
    if a is None:
        return None, why
    if a.shape is None:
        return None, "the activations need the model's shapes: no config.json here and not a known backbone"
    s = a.shape
    fsdp = config.actor_rollout_ref.actor.get("fsdp_config") or {}
    if a.all_on_cpu:
        weights = gradients = optimizer = 0.0
    else:
        weights = a.width * (a.params + a.adapter) / a.shards
        gradients = a.width * a.trainable / a.shards
        if a.shards > 1 and fsdp.get("use_no_sync_for_gradient_accumulation", False):  # verl's fsdp.yaml: false
            # verl defers the reduce-scatter to the last micro-batch: until then FSDP keeps whole (unsharded)
            # gradients in the compute dtype
            gradients += ACTIVATION_BYTES * a.trainable
        optimizer = 2 * a.width * a.trainable / a.shards
    # FSDP's root unit (embeddings, output layer) stays gathered through forward and backward, plus the decoder
    # layer in use and the one prefetched, all in bf16 (mixed precision's param_dtype)
    gathered = ACTIVATION_BYTES * (s.root_params + 2 * s.layer_params)
    tokens, longest, key = _micro_batch_tokens(config)
    checkpointing = bool(_select(config, "actor_rollout_ref.model.enable_gradient_checkpointing", False))
    per_layer = s.layer_activation_bytes
    if checkpointing:
        per_token = {"checkpoints": s.layers * ACTIVATION_BYTES * s.hidden, "layer": per_layer}
    else:
        per_token = {"checkpoints": 0, "layer": s.layers * per_layer}
    per_token["logits"] = LOGIT_BYTES * s.vocab
    logprob_tokens, logprob_bytes = 0, 0.0
    if _select(config, "actor_rollout_ref.rollout.log_prob_use_dynamic_bsz", False):
        sp = max(1, int(_select(config, "actor_rollout_ref.actor.ulysses_sequence_parallel_size", 1) or 1))
        logprob_tokens = int(_select(config, LOGPROB_TOKENS_KEY)) // sp
        logprob_bytes = logprob_tokens * (per_layer + FORWARD_LOGIT_BYTES * s.vocab)
    asleep = bool(_select(config, "actor_rollout_ref.rollout.free_cache_engine", True))
    utilization = float(_select(config, UTILIZATION_KEY, 0.0) or 0.0)
    return (
        UpdateMemory(
            weights_gib=weights / GIB,
            gradients_gib=gradients / GIB,
            optimizer_gib=optimizer / GIB,
            gathered_gib=gathered / GIB,
            checkpoints_gib=tokens * per_token["checkpoints"] / GIB,
            layer_gib=tokens * per_token["layer"] / GIB,
            logits_gib=tokens * per_token["logits"] / GIB,
            overhead_gib=ACTOR_OVERHEAD_GIB,
            vllm_gib=VLLM_ASLEEP_GIB if asleep else utilization * card_gib,
            card_gib=card_gib,
            tokens=tokens,
            min_tokens=longest,
            per_token_bytes=float(sum(per_token.values())),
            lora=a.lora,
            adapter_params=a.adapter,
            dtype=a.dtype,
            vllm_asleep=asleep,
            tokens_key=key,
            logprob_tokens=logprob_tokens,
            logprob_gib=logprob_bytes / GIB,
        ),
        None,
    )
