"""What a LoRA run's checkpoint must hold, checked the same way on both CPU rollouts (tests/e2e/test_lora_cpu.py on
the hf stand-in, tests/e2e/test_vllm_cpu.py on verl's vLLM rollout): the base weights byte-identical to the initial
model's, an adapter that trained, exported in PEFT's format, which verl's own ``lora_adapter_path`` loader takes
back as it was saved."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import torch

from recipe.exgrpo.lora import ADAPTER_DIR, full_tensor

PEFT_PREFIX = "base_model.model."


def actor_state(step_dir: Path) -> dict[str, torch.Tensor]:
    """The actor's whole parameters in verl's checkpoint ``step_dir`` (one rank's shard files, joined)."""
    files = sorted((step_dir / "actor").glob("model_world_size_*_rank_*.pt"))
    assert files, f"no actor model files in {step_dir / 'actor'}"
    states = [torch.load(f, map_location="cpu", weights_only=False) for f in files]
    return {name: full_tensor([s[name] for s in states]) for name in states[0]}


def base_name(name: str) -> str:
    """A base weight's name in the PEFT-wrapped actor -> its name in the model's own files."""
    return name.removeprefix(PEFT_PREFIX).replace(".base_layer.", ".")


def check_lora_checkpoint(step_dir: Path, model_dir: Path, rank: int) -> dict[str, torch.Tensor]:
    """Assert what a LoRA run's checkpoint ``step_dir`` must hold; returns its adapter tensors (PEFT names)."""
    from safetensors.torch import load_file

    state = actor_state(step_dir)
    lora = {n: t for n, t in state.items() if ".lora_A." in n or ".lora_B." in n}
    base = {base_name(n): t for n, t in state.items() if n not in lora}
    assert lora, f"no LoRA weights in the actor checkpoint {step_dir}"
    assert {t.shape[0] for n, t in lora.items() if ".lora_A." in n} == {rank}, "an adapter of another rank"
    initial = {}
    for f in sorted(model_dir.glob("*.safetensors")):
        initial.update(load_file(str(f)))
    compared = sorted(set(base) & set(initial))
    missing = sorted(set(initial) - set(base))
    assert len(compared) == len(initial), f"base weights missing from the checkpoint: {missing}"
    changed = [n for n in compared if not torch.equal(base[n].to(initial[n].dtype), initial[n])]
    assert not changed, f"base weights differ from the initial model's: {changed[:5]}"
    assert any(t.abs().sum() > 0 for n, t in lora.items() if ".lora_B." in n), "the adapter never trained (B is 0)"

    exported = step_dir / ADAPTER_DIR
    assert (exported / "adapter_config.json").is_file() and (exported / "adapter_model.safetensors").is_file()
    adapter = load_file(str(exported / "adapter_model.safetensors"))
    assert len(adapter) == len(lora)
    for name, tensor in lora.items():
        saved = adapter[name.replace(".lora_A.default.", ".lora_A.").replace(".lora_B.default.", ".lora_B.")]
        assert torch.equal(saved, tensor), f"{name}: the exported adapter is not the checkpoint's"
    return adapter


def load_through_verl(model_dir: Path, adapter_dir: Path) -> torch.nn.Module:
    """The initial model with the adapter at ``adapter_dir`` loaded as verl's FSDP engine loads
    ``actor_rollout_ref.model.lora_adapter_path`` (its own method)."""
    from transformers import AutoModelForCausalLM
    from verl.workers.engine.fsdp.transformer_impl import FSDPEngine

    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
    config = SimpleNamespace(lora_rank=8, lora_adapter_path=str(adapter_dir), use_shm=False)
    return FSDPEngine._build_lora_module(SimpleNamespace(model_config=config), model)


def check_adapter_continues(model_dir: Path, step_dir: Path, adapter: dict[str, torch.Tensor]) -> None:
    """``lora_adapter_path`` set to the exported adapter: verl's loader starts from exactly the saved weights, and
    only they train."""
    module = load_through_verl(model_dir, step_dir / ADAPTER_DIR)
    trainable = {n: p for n, p in module.named_parameters() if p.requires_grad}
    assert trainable and all(".lora_" in n for n in trainable), sorted(trainable)[:5]
    loaded = {n.replace(".default.", "."): p.detach() for n, p in trainable.items()}
    assert set(loaded) == set(adapter), sorted(set(loaded) ^ set(adapter))[:5]
    for name, tensor in adapter.items():
        assert torch.equal(loaded[name], tensor), f"{name}: verl's loader did not restore the saved adapter"
