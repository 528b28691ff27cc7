"""LoRA settings that cannot work stop the launch at start-up, each naming its key (``recipe/exgrpo/lora.py``, called
by ``config_bridge.check_startup_config``: the entry point before Ray, and the dry run); the target modules are
checked against the model's own layers; the adapter's size is PEFT's."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from recipe.exgrpo.launch_checks.dry_run import DryRunError, dry_run
from recipe.exgrpo.lora import (
    adapter_parameter_count,
    linear_layers,
    lora_problems,
    target_module_problems,
    targeted_layers,
)
from tests.helpers.launch_scripts import TRAIN_DIR, printed_launches

pytestmark = pytest.mark.usefixtures("gpu_dry_run_env")

QWEN = TRAIN_DIR / "exgrpo_qwen2.5_math_7b.sh"


def _problems(*extra: str) -> list[str]:
    (overrides,) = printed_launches(QWEN)
    with pytest.raises(DryRunError) as err:
        dry_run([*overrides, *extra])
    return err.value.problems


def test_megatrons_lora_rank_on_the_fsdp_actor_is_refused_naming_the_key():
    problems = _problems("actor_rollout_ref.model.lora.rank=64")
    assert len(problems) == 1 and problems[0].startswith("actor_rollout_ref.model.lora.rank=64: ")
    assert "set actor_rollout_ref.model.lora_rank=64" in problems[0].replace("Set", "set")
    problems = _problems("actor_rollout_ref.model.lora.adapter_path=/a")
    assert problems[0].startswith("actor_rollout_ref.model.lora.adapter_path=/a: ")


def test_settings_lora_cannot_combine_with_are_refused_naming_the_key():
    # an adapter with no rank: verl would fine-tune every weight and never read it
    (p,) = _problems("actor_rollout_ref.model.lora_adapter_path=/no/such/adapter")
    assert p.startswith("actor_rollout_ref.model.lora_adapter_path=/no/such/adapter with actor_rollout_ref.model.")
    # a rank vLLM's LoRA cannot serve (the adapter synced), and the same rank merged: accepted
    (p,) = _problems("actor_rollout_ref.model.lora_rank=1024")
    assert p.startswith("actor_rollout_ref.model.lora_rank=1024: vLLM serves LoRA adapters up to rank 512")
    (overrides,) = printed_launches(QWEN)
    dry_run([*overrides, "actor_rollout_ref.model.lora_rank=1024", "actor_rollout_ref.model.lora.merge=true"])
    # the adapter synced through a checkpoint engine that sends the base weights only
    (p,) = _problems("actor_rollout_ref.model.lora_rank=32", "actor_rollout_ref.rollout.checkpoint_engine.backend=nccl")
    assert p.startswith("actor_rollout_ref.model.lora.merge=false with actor_rollout_ref.rollout.checkpoint_engine")
    # layered gathering of the adapter into an engine started without the base weights
    (p,) = _problems("actor_rollout_ref.model.lora_rank=32", "actor_rollout_ref.rollout.layered_summon=true")
    assert p.startswith("actor_rollout_ref.rollout.layered_summon=true with actor_rollout_ref.rollout.load_format=")
    (p,) = _problems("actor_rollout_ref.model.lora_rank=-4")
    assert p.startswith("actor_rollout_ref.model.lora_rank=-4: ")


def test_an_adapter_whose_rank_or_alpha_is_not_the_configs_is_refused(tmp_path):
    adapter = tmp_path / "adapter"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text(json.dumps({"r": 16, "lora_alpha": 32}))
    base = [f"actor_rollout_ref.model.lora_adapter_path={adapter}"]
    problems = _problems(*base, "actor_rollout_ref.model.lora_rank=8", "actor_rollout_ref.model.lora_alpha=16")
    assert [p.split(" but ")[0] for p in problems] == [
        "actor_rollout_ref.model.lora_rank=8",
        "actor_rollout_ref.model.lora_alpha=16",
    ]
    (overrides,) = printed_launches(QWEN)
    dry_run([*overrides, *base, "actor_rollout_ref.model.lora_rank=16", "actor_rollout_ref.model.lora_alpha=32"])
    (adapter / "adapter_config.json").unlink()
    (p,) = _problems(*base, "actor_rollout_ref.model.lora_rank=16")
    assert p.startswith(f"actor_rollout_ref.model.lora_adapter_path={adapter}: no adapter_config.json")


def test_a_launch_without_lora_has_no_lora_problem():
    (overrides,) = printed_launches(QWEN)
    config = dry_run(overrides).config
    assert lora_problems(config) == [] and target_module_problems(config) == []


def _config(model: Path, **model_keys) -> object:
    return OmegaConf.create(
        {"actor_rollout_ref": {"model": {"path": str(model), **model_keys}, "rollout": {"name": "vllm"}}}
    )


def test_target_modules_that_match_no_layer_of_the_model_are_named(cpu_assets):
    model = cpu_assets.model_path
    assert target_module_problems(_config(model, lora_rank=8, target_modules="all-linear")) == []
    assert target_module_problems(_config(model, lora_rank=8, target_modules=["q_proj", "v_proj"])) == []
    (p,) = target_module_problems(_config(model, lora_rank=8, target_modules=["q_proj", "linear_qkv", "qproj"]))
    assert p.startswith("actor_rollout_ref.model.target_modules: 'linear_qkv', 'qproj' match(es) no layer of Qwen2")
    assert "q_proj, k_proj" in p or "down_proj" in p  # the model's own layer names, to pick from
    (p,) = target_module_problems(_config(model, lora_rank=8, target_modules=".*attention.*"))
    assert p.startswith("actor_rollout_ref.model.target_modules='.*attention.*' matches no layer of Qwen2")
    assert target_module_problems(_config(model, lora_rank=8, target_modules=r".*\.self_attn\..*_proj")) == []
    (p,) = target_module_problems(_config(model, lora_rank=8, target_modules=["q_proj"], exclude_modules=["q_proj"]))
    assert p.startswith("actor_rollout_ref.model.exclude_modules=['q_proj'] excludes every layer")
    # full fine-tuning, or an adapter that brings its own targets: nothing to check
    assert target_module_problems(_config(model, lora_rank=0, target_modules=["nope"])) == []


def test_the_adapter_size_is_peft_s(cpu_assets):
    """The count the memory estimate uses is the number of trainable parameters PEFT gives the tiny model."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    _, layers = linear_layers(cpu_assets.model_path)
    for targets in ("all-linear", ["q_proj", "down_proj"]):
        counted = adapter_parameter_count(layers, targeted_layers(layers, targets), rank=8)
        model = get_peft_model(
            AutoModelForCausalLM.from_pretrained(cpu_assets.model_path),
            LoraConfig(r=8, lora_alpha=16, target_modules=targets, task_type="CAUSAL_LM"),
        )
        assert counted == model.get_nb_trainable_parameters()[0]
