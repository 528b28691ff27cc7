"""LoRA on verl 0.9.1's FSDP actor: the settings verl reads, the settings it cannot honour, and the adapter a
checkpoint holds (docs/trainer.md, "LoRA").

verl's FSDP engine (``verl/workers/engine/fsdp/transformer_impl.py``) wraps the actor in a PEFT LoRA model when
``actor_rollout_ref.model.lora_rank > 0`` (with ``lora_alpha``, ``target_modules``, ``exclude_modules``), or loads a
saved adapter from ``lora_adapter_path`` (PEFT's ``PeftModel.from_pretrained``, trainable); only the adapter's
parameters train, and the optimizer holds state for them only. ``actor_rollout_ref.model.lora.merge`` says what the
rollout gets after every update: the merged weights (true; verl backs the base weights up and restores them after
the merge, byte for byte) or the adapter alone (false; vLLM serves it as a LoRA request). The
``actor_rollout_ref.model.lora`` block's ``rank``/``alpha``/``target_modules``/``adapter_path`` are Megatron's: the
FSDP engine never reads them.

What the recipe adds:

- :func:`lora_problems`: the settings that cannot work together, each naming its key (checked at start-up with
  the rest of ``config_bridge.check_startup_config``, and by the dry run);
- :func:`target_module_problems`: target modules that match no layer of the model (read from its config.json on
  PyTorch's meta device, no weights), where the model is on this machine;
- :func:`export_adapter`: the adapter of a checkpoint in PEFT's format (``global_step_N/actor/lora_adapter/``:
  ``adapter_config.json``, ``adapter_model.safetensors``), written after every save, which ``lora_adapter_path``
  (and PEFT, and vLLM's ``--lora-modules``) load as they are.

The old-log-prob pass, the selection entropies, the stored behaviour log-probs and the loss all run with the adapter
on: verl turns it off only for reference log-probs (``no_lora_adapter``), which the recipe never computes.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

MODEL = "actor_rollout_ref.model"
RANK_KEY = f"{MODEL}.lora_rank"
ALPHA_KEY = f"{MODEL}.lora_alpha"
TARGETS_KEY = f"{MODEL}.target_modules"
EXCLUDE_KEY = f"{MODEL}.exclude_modules"
ADAPTER_PATH_KEY = f"{MODEL}.lora_adapter_path"
MERGE_KEY = f"{MODEL}.lora.merge"
MEGATRON_RANK_KEY = f"{MODEL}.lora.rank"
MEGATRON_ADAPTER_KEY = f"{MODEL}.lora.adapter_path"
#: the largest rank vLLM's LoRA takes (``vllm.config.lora.MaxLoRARanks``; verl rounds a rank up to the next of
#: 1, 8, 16, 32, 64, 128, 256, 320, 512)
VLLM_MAX_LORA_RANK = 512
#: the strategies whose actor is verl's FSDP engine (PEFT LoRA, ``lora_rank``)
FSDP_STRATEGIES = ("fsdp", "fsdp2")
#: where a checkpoint's adapter is written, under ``global_step_N/``
ADAPTER_DIR = os.path.join("actor", "lora_adapter")
ALL_LINEAR = "all-linear"


@dataclass(frozen=True)
class LoraSettings:
    """The LoRA settings of a launch config, as verl's FSDP actor and rollouts read them."""

    rank: int
    alpha: float
    target_modules: Any
    exclude_modules: Any
    merge: bool
    adapter_path: str | None
    rollout: str
    strategy: str

    @classmethod
    def of(cls, config) -> LoraSettings:
        def select(key: str, default: Any = None) -> Any:
            value = OmegaConf.select(config, key, default=default)
            return OmegaConf.to_container(value, resolve=True) if OmegaConf.is_config(value) else value

        return cls(
            rank=int(select(RANK_KEY, 0) or 0),
            alpha=float(select(ALPHA_KEY, 16) or 0),
            target_modules=select(TARGETS_KEY, ALL_LINEAR),
            exclude_modules=select(EXCLUDE_KEY),
            merge=bool(select(MERGE_KEY, False)),
            adapter_path=select(ADAPTER_PATH_KEY),
            rollout=str(select("actor_rollout_ref.rollout.name", "vllm")),
            strategy=str(select("actor_rollout_ref.actor.strategy", "fsdp")),
        )

    @property
    def enabled(self) -> bool:
        """The FSDP actor trains a LoRA adapter (verl builds one only for a rank > 0)."""
        return self.rank > 0

    @property
    def adapter_sync(self) -> bool:
        """The rollout gets the adapter after every update, not the merged weights."""
        return self.enabled and not self.merge


# ------------------------------------------------------------------------------------------------ the checks
def lora_problems(config) -> list[str]:
    """The LoRA settings of ``config`` that cannot work, one line each naming the key and what to set."""
    s = LoraSettings.of(config)
    fsdp = s.strategy in FSDP_STRATEGIES
    problems = []
    megatron_rank = OmegaConf.select(config, MEGATRON_RANK_KEY, default=0) or 0
    if fsdp and int(megatron_rank) > 0:
        problems.append(
            f"{MEGATRON_RANK_KEY}={megatron_rank}: the {MODEL}.lora block is Megatron's LoRA; verl's FSDP actor "
            f"(actor_rollout_ref.actor.strategy={s.strategy}) never reads it and would train every weight, while "
            f"vLLM is started for an adapter. Set {RANK_KEY}={megatron_rank} (with {ALPHA_KEY}, {TARGETS_KEY}) and "
            f"leave {MEGATRON_RANK_KEY}=0"
        )
    megatron_adapter = OmegaConf.select(config, MEGATRON_ADAPTER_KEY, default=None)
    if fsdp and megatron_adapter:
        problems.append(
            f"{MEGATRON_ADAPTER_KEY}={megatron_adapter}: Megatron's adapter path, which verl's FSDP actor never "
            f"reads; set {ADAPTER_PATH_KEY}={megatron_adapter} (with {RANK_KEY} > 0) and leave "
            f"{MEGATRON_ADAPTER_KEY}=null"
        )
    if s.rank < 0:
        problems.append(f"{RANK_KEY}={s.rank}: a LoRA rank is > 0 (0: full fine-tuning)")
    if s.adapter_path and not s.enabled:
        problems.append(
            f"{ADAPTER_PATH_KEY}={s.adapter_path} with {RANK_KEY}=0: verl's FSDP actor loads an adapter only when it "
            f"trains one ({RANK_KEY} > 0), so this run would fine-tune every weight of the base model and never read "
            f"the adapter; set {RANK_KEY} to the adapter's rank"
        )
    if not s.enabled:
        return problems
    if s.adapter_path:
        problems += _adapter_problems(s)
    if s.adapter_sync and s.rollout == "vllm" and s.rank > VLLM_MAX_LORA_RANK:
        problems.append(
            f"{RANK_KEY}={s.rank}: vLLM serves LoRA adapters up to rank {VLLM_MAX_LORA_RANK} (its max_lora_rank); "
            f"use a rank <= {VLLM_MAX_LORA_RANK}, or {MERGE_KEY}=true (the rollout gets the merged weights, any rank)"
        )
    backend = OmegaConf.select(config, "actor_rollout_ref.rollout.checkpoint_engine.backend", default="naive")
    if s.adapter_sync and backend not in (None, "naive"):
        problems.append(
            f"{MERGE_KEY}=false with actor_rollout_ref.rollout.checkpoint_engine.backend={backend}: verl 0.9.1 sends "
            "a non-naive checkpoint engine the base weights only (get_per_tensor_param drops the adapter), so the "
            f"rollout would sample the base model after every update; set {MERGE_KEY}=true (merged weights) or the "
            "naive backend"
        )
    load_format = str(OmegaConf.select(config, "actor_rollout_ref.rollout.load_format", default="dummy") or "")
    layered = bool(OmegaConf.select(config, "actor_rollout_ref.rollout.layered_summon", default=False))
    if s.adapter_sync and layered and "dummy" in load_format:
        problems.append(
            f"actor_rollout_ref.rollout.layered_summon=true with actor_rollout_ref.rollout.load_format={load_format}: "
            "with the adapter synced (lora.merge=false) the rollout starts without the base weights and verl's "
            "layered gather refuses the first sync; set actor_rollout_ref.rollout.load_format=safetensors (vLLM "
            "loads the base model itself) or layered_summon=false"
        )
    return problems


def _adapter_problems(s: LoraSettings) -> list[str]:
    """An adapter at ``lora_adapter_path`` (when it is on this machine) whose rank or alpha is not the config's:
    verl builds the actor from the adapter's own settings, and vLLM's max LoRA rank from the config's."""
    path = Path(os.path.expanduser(str(s.adapter_path)))
    if not path.is_dir():
        return []  # a remote path (verl copies it) or one made on the training machine: the dry run lists it
    config_file = path / "adapter_config.json"
    if not config_file.is_file():
        return [
            f"{ADAPTER_PATH_KEY}={s.adapter_path}: no adapter_config.json there (a PEFT adapter folder holds "
            "adapter_config.json and adapter_model.safetensors; a checkpoint of this recipe has one in "
            f"global_step_N/{ADAPTER_DIR})"
        ]
    saved = json.loads(config_file.read_text())
    problems = []
    if int(saved.get("r", 0)) != s.rank:
        problems.append(
            f"{RANK_KEY}={s.rank} but the adapter at {ADAPTER_PATH_KEY} has rank {saved.get('r')}: verl trains the "
            f"adapter's own rank, and sizes vLLM's LoRA from {RANK_KEY}; set {RANK_KEY}={saved.get('r')}"
        )
    if "lora_alpha" in saved and float(saved["lora_alpha"]) != s.alpha:
        problems.append(
            f"{ALPHA_KEY}={s.alpha:g} but the adapter at {ADAPTER_PATH_KEY} has alpha {saved['lora_alpha']}: verl "
            f"scales the adapter with its own alpha; set {ALPHA_KEY}={saved['lora_alpha']}"
        )
    return problems


def _matches(target: str, name: str) -> bool:
    """PEFT's rule for one entry of a list of target modules: the module's name, or its last dotted parts."""
    return name == target or name.endswith("." + target)


def linear_layers(model_dir: str | os.PathLike[str], trust_remote_code: bool = False) -> tuple[str, dict]:
    """The model's architecture name and its LoRA-able layers, ``{name: (in_features, out_features, kind)}``
    (kind: ``linear``, ``embedding`` or ``output``, the output embedding ``all-linear`` leaves out), built from
    ``model_dir/config.json`` on PyTorch's meta device (no memory, no weights read)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(str(model_dir), trust_remote_code=trust_remote_code)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, trust_remote_code=trust_remote_code)
    output = model.get_output_embeddings()
    layers = {}
    for name, module in model.named_modules():
        if isinstance(module, torch.nn.Linear):
            kind = "output" if module is output else "linear"
            layers[name] = (module.in_features, module.out_features, kind)
        elif isinstance(module, torch.nn.Embedding):
            layers[name] = (module.num_embeddings, module.embedding_dim, "embedding")
    return type(model).__name__, layers


def targeted_layers(layers: dict, target_modules: Any, exclude_modules: Any = None) -> list[str]:
    """The layers PEFT would adapt: ``all-linear`` (every linear layer but the output embedding), a regex (a string,
    matched against the whole name) or a list of names (a layer's name or its last dotted parts); minus the
    excluded ones (the same two forms)."""

    def matching(spec: Any, kinds: tuple[str, ...]) -> set[str]:
        if spec is None:
            return set()
        if isinstance(spec, str):
            if spec.lower() == ALL_LINEAR:
                return {n for n, (_, _, kind) in layers.items() if kind == "linear"}
            return {n for n, (_, _, kind) in layers.items() if kind in kinds and re.fullmatch(spec, n)}
        return {n for n, (_, _, kind) in layers.items() if kind in kinds and any(_matches(t, n) for t in spec)}

    kinds = ("linear", "output", "embedding")
    return sorted(matching(target_modules, kinds) - matching(exclude_modules, kinds))


def adapter_parameter_count(layers: dict, targeted: list[str], rank: int) -> int:
    """Parameters of a rank-``rank`` LoRA adapter on ``targeted`` (A: rank x in, B: out x rank per layer)."""
    return sum(rank * (layers[n][0] + layers[n][1]) for n in targeted)


def target_module_problems(config) -> list[str]:
    """Target modules that match no layer of the model (each entry of a list on its own: PEFT silently skips an
    entry that matches nothing and fails only when none matches), read from the model's config.json on this
    machine; [] when LoRA is off, an adapter is loaded (it brings its own targets) or the model is not here."""
    s = LoraSettings.of(config)
    path = os.path.expanduser(str(OmegaConf.select(config, f"{MODEL}.path", default="") or ""))
    if not s.enabled or s.adapter_path or not os.path.isfile(os.path.join(path, "config.json")):
        return []
    trust = bool(OmegaConf.select(config, f"{MODEL}.trust_remote_code", default=False))
    try:
        arch, layers = linear_layers(path, trust)
    except Exception:  # an architecture transformers cannot build here: verl's own error will name it
        return []
    names = sorted({n.rsplit(".", 1)[-1] for n, (_, _, kind) in layers.items() if kind != "embedding"})
    known = f"its linear layers: {', '.join(names)}"
    targets = s.target_modules
    if isinstance(targets, str):
        if targets.lower() != ALL_LINEAR and not targeted_layers(layers, targets):
            return [
                f"{TARGETS_KEY}={targets!r} matches no layer of {arch} ({known}; a string is a regex on the whole name)"
            ]
        if not targeted_layers(layers, targets, s.exclude_modules):
            return [
                f"{EXCLUDE_KEY}={s.exclude_modules!r} excludes every layer {TARGETS_KEY}={targets!r} adapts in {arch}"
            ]
        return []
    missing = [t for t in targets or [] if not targeted_layers(layers, [t])]
    if not targets:
        return [f"{TARGETS_KEY} is empty: LoRA on no layer; give the layers to adapt ({known}) or 'all-linear'"]
    if missing:
        return [f"{TARGETS_KEY}: {', '.join(repr(t) for t in missing)} match(es) no layer of {arch} ({known})"]
    if not targeted_layers(layers, targets, s.exclude_modules):
        return [f"{EXCLUDE_KEY}={s.exclude_modules!r} excludes every layer {TARGETS_KEY} adapts in {arch}"]
    return []


# ------------------------------------------------------------------------------------------------ the adapter
def _peft_key(name: str) -> str:
    """A LoRA weight's name in the FSDP module's state dict -> its name in a saved PEFT adapter."""
    return name.replace(".lora_A.default.", ".lora_A.").replace(".lora_B.default.", ".lora_B.")


def full_tensor(shards: list[Any]):
    """The whole tensor of one parameter from each rank's saved DTensor shard (FSDP2: ``Shard(0)`` over the
    sharding mesh dimension, ``Replicate`` over the replica one with hybrid sharding)."""
    import torch

    first = shards[0]
    if not hasattr(first, "to_local"):
        return first
    from torch.distributed.tensor import Shard

    mesh = first.device_mesh.mesh
    sharded = [(i, p.dim) for i, p in enumerate(first.placements) if isinstance(p, Shard)]
    if not sharded:
        return first.to_local()
    if len(sharded) > 1:
        raise ValueError(f"a parameter sharded over {len(sharded)} mesh dimensions: merge with verl.model_merger")
    mesh_dim, dim = sharded[0]
    pieces = {}
    for rank, shard in enumerate(shards):
        coords = (mesh == rank).nonzero()
        if len(coords) == 0:
            continue
        index = int(coords[0][mesh_dim])
        pieces.setdefault(index, shard.to_local())
    return torch.cat([pieces[i] for i in sorted(pieces)], dim=dim)


def _adapter_targets(keys: list[str], lora_names: list[str]) -> list[str]:
    """The ``target_modules`` of a saved adapter: the adapted layers' last names (``q_proj``, ...), or their full
    names where a layer of the same last name was not adapted (a regex or layer-wise choice)."""
    prefix = "base_model.model."
    adapted = {n.split(".lora_")[0] for n in lora_names}
    plain = {
        k[: -len(".weight")] for k in keys if k.endswith(".weight") and ".base_layer." not in k and ".lora_" not in k
    }
    short = {n.rsplit(".", 1)[-1] for n in adapted}
    if any(p.rsplit(".", 1)[-1] in short for p in plain):
        return sorted(n[len(prefix) :] if n.startswith(prefix) else n for n in adapted)
    return sorted(short)


def export_adapter(step_dir: str | os.PathLike[str], model_path: str | None = None) -> Path | None:
    """Write the LoRA adapter of the checkpoint ``step_dir`` (``global_step_N``) to ``step_dir/actor/lora_adapter``
    in PEFT's format; None when its actor holds no LoRA weights (full fine-tuning, or no model saved).

    The weights come from verl's sharded model files (``actor/model_world_size_W_rank_R.pt``, memory-mapped: only
    the adapter's tensors are read), its rank and alpha from verl's ``actor/lora_train_meta.json``, the target
    modules from the adapted layers' names. ``model_path``: the base model, recorded as PEFT's
    ``base_model_name_or_path``."""
    import torch
    from peft import LoraConfig
    from safetensors.torch import save_file

    actor = Path(step_dir) / "actor"
    files = sorted(actor.glob("model_world_size_*_rank_*.pt"), key=lambda p: int(p.stem.rsplit("_", 1)[1]))
    meta_file = actor / "lora_train_meta.json"
    if not files or not meta_file.is_file():
        return None
    states = [torch.load(f, map_location="cpu", weights_only=False, mmap=True) for f in files]
    names = [n for n in states[0] if ".lora_A." in n or ".lora_B." in n]
    if not names:
        return None
    tensors = {_peft_key(n): full_tensor([s[n] for s in states]).detach().clone().contiguous() for n in names}
    meta = json.loads(meta_file.read_text())
    targets = _adapter_targets(list(states[0]), names)
    config = LoraConfig(
        r=int(meta["r"]),
        lora_alpha=meta.get("lora_alpha", meta["r"]),
        target_modules=targets,
        task_type=meta.get("task_type") or "CAUSAL_LM",
        base_model_name_or_path=model_path,
    )
    out = actor / "lora_adapter"
    out.mkdir(parents=True, exist_ok=True)
    config.save_pretrained(str(out))
    save_file(tensors, str(out / "adapter_model.safetensors"))
    return out


def save_lora_adapter(config, step_dir: str | os.PathLike[str]) -> Path | None:
    """After verl saved the checkpoint ``step_dir`` of a LoRA run: its adapter in PEFT's format
    (:func:`export_adapter`), with one line saying where; nothing for full fine-tuning."""
    if not LoraSettings.of(config).enabled:
        return None
    out = export_adapter(step_dir, OmegaConf.select(config, f"{MODEL}.path", default=None))
    if out is not None:
        print(f"[exgrpo] LoRA adapter of this checkpoint: {out} (loads as {ADAPTER_PATH_KEY})", flush=True)
    return out
