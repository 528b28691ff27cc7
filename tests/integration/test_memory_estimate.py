"""The dry run's GPU memory estimate of generation (``recipe/exgrpo/launch_checks/memory_estimate.py``): the FSDP
actor's resident state per GPU (counted from a hand-made config.json) plus vLLM's share of the card, and the warning
that names the setting and a value that fits."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from recipe.exgrpo.launch_checks.dry_run import dry_run
from recipe.exgrpo.launch_checks.dry_run import main as dry_run_main
from recipe.exgrpo.launch_checks.memory_estimate import (
    ACTIVATION_BYTES,
    ACTOR_OVERHEAD_GIB,
    BUILTIN_CONFIGS,
    GIB,
    LOGIT_BYTES,
    TOKENS_KEY,
    UTILIZATION_KEY,
    VLLM_ASLEEP_GIB,
    WARN_SHARE,
    count_parameters,
    estimate_generation_memory,
    estimate_update_memory,
    known_model_params,
    model_shape,
    parse_count,
)
from tests.helpers.launch_scripts import TRAIN_DIR, printed_launches, run_script, script_env

pytestmark = pytest.mark.usefixtures("gpu_dry_run_env")

REPO = Path(__file__).resolve().parents[2]
#: Qwen2.5-Math-7B's config.json (the architecture keys): 7,615,616,512 parameters as published
QWEN_7B = {
    "architectures": ["Qwen2ForCausalLM"],
    "model_type": "qwen2",
    "hidden_size": 3584,
    "intermediate_size": 18944,
    "num_hidden_layers": 28,
    "num_attention_heads": 28,
    "num_key_value_heads": 4,
    "vocab_size": 152064,
    "max_position_embeddings": 16384,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
}


def _write_model(tmp_path: Path, **config) -> Path:
    model = tmp_path / "model"
    model.mkdir(parents=True, exist_ok=True)
    (model / "config.json").write_text(json.dumps(config))
    return model


def _qwen2_count(h, inter, layers, heads, kv, vocab, tied) -> int:
    """Qwen2 by hand: q/k/v with biases, o without, a gated MLP, two RMSNorms per layer, a final norm."""
    kv_dim = kv * (h // heads)
    attention = (h * h + h) + 2 * (h * kv_dim + kv_dim) + h * h
    return vocab * h * (1 if tied else 2) + layers * (attention + 3 * h * inter + 2 * h) + h


def _config(model_path, gpus=8, nodes=1, utilization=0.7, tokens=32768, lora_rank=0, checkpointing=True, **fsdp):
    return OmegaConf.create(
        {
            "trainer": {"nnodes": nodes, "n_gpus_per_node": gpus},
            "data": {"max_prompt_length": 1024, "max_response_length": 8192},
            "actor_rollout_ref": {
                "hybrid_engine": True,
                "model": {
                    "path": str(model_path),
                    "trust_remote_code": False,
                    "enable_gradient_checkpointing": checkpointing,
                    "lora_rank": lora_rank,
                    "lora_alpha": 32,
                    "target_modules": "all-linear",
                },
                "actor": {
                    "strategy": "fsdp",
                    "use_dynamic_bsz": True,
                    "ppo_max_token_len_per_gpu": tokens,
                    "fsdp_config": {"fsdp_size": -1, "model_dtype": "fp32", **fsdp},
                },
                "rollout": {"name": "vllm", "gpu_memory_utilization": utilization, "free_cache_engine": True},
            },
        }
    )


def test_the_parameter_count_is_read_from_config_json(tmp_path):
    small = dict(QWEN_7B, hidden_size=64, intermediate_size=160, num_hidden_layers=3, num_attention_heads=4)
    small.update(num_key_value_heads=2, vocab_size=300)
    model = _write_model(tmp_path, **small)
    assert count_parameters(model) == _qwen2_count(64, 160, 3, 4, 2, 300, tied=False)
    tied = _write_model(tmp_path / "t", **dict(small, tie_word_embeddings=True))
    assert count_parameters(tied) == _qwen2_count(64, 160, 3, 4, 2, 300, tied=True)  # shared tensor counted once


def test_the_estimate_of_the_7b_run_on_8_gpus(tmp_path):
    model = _write_model(tmp_path, **QWEN_7B)
    estimate, why = estimate_generation_memory(_config(model), card_gib=80)
    assert why is None and estimate.params == 7_615_616_512 == _qwen2_count(3584, 18944, 28, 28, 4, 152064, False)
    assert estimate.shards == 8 and estimate.params_source == f"{model}/config.json"
    # fp32 shards (4 B) + AdamW's two fp32 moments (8 B) per parameter, over 8 ranks: ~10.6 GiB; no gradients
    assert estimate.actor_params_gib == pytest.approx(4 * 7_615_616_512 / 8 / GIB)
    assert estimate.actor_optimizer_gib == pytest.approx(8 * 7_615_616_512 / 8 / GIB)
    assert estimate.actor_params_gib + estimate.actor_optimizer_gib == pytest.approx(10.64, abs=0.01)
    assert estimate.vllm_gib == pytest.approx(56.0) and estimate.total_gib == pytest.approx(68.14, abs=0.01)
    assert estimate.fits and estimate.warning() is None


def test_the_warning_names_the_setting_and_a_value_that_fits(tmp_path):
    model = _write_model(tmp_path, **QWEN_7B)
    estimate, _ = estimate_generation_memory(_config(model, utilization=0.8), card_gib=80)
    assert estimate.total_gib == pytest.approx(76.14, abs=0.01) and not estimate.fits  # the release's 0.8
    warning = estimate.warning()
    assert f"set {UTILIZATION_KEY}=0.75" in warning and "param_offload=true" in warning, warning
    fitted, _ = estimate_generation_memory(_config(model, utilization=0.75), card_gib=80)
    assert fitted.fits  # the value it names does fit
    # fewer GPUs hold bigger shards: 4 GPUs need a lower share
    four, _ = estimate_generation_memory(_config(model, gpus=4, utilization=0.7), card_gib=80)
    assert not four.fits and f"{UTILIZATION_KEY}=0.65" in four.warning()
    # a bigger card (an H200's 141 GiB) fits the release's 0.8
    big, _ = estimate_generation_memory(_config(model, utilization=0.8), card_gib=141)
    assert big.fits


def test_offload_and_sharding_settings_change_what_stays_on_the_gpu(tmp_path):
    model = _write_model(tmp_path, **QWEN_7B)
    n = 7_615_616_512

    def actor(**settings):
        e, _ = estimate_generation_memory(_config(model, **settings))
        return e.actor_params_gib + e.actor_optimizer_gib

    assert actor(param_offload=True, optimizer_offload=True) == 0.0  # verl moves both to the CPU while vLLM runs
    assert actor(optimizer_offload=True) == pytest.approx(4 * n / 8 / GIB)
    assert actor(param_offload=True) == pytest.approx(8 * n / 8 / GIB)
    assert actor(model_dtype="bf16") == pytest.approx(6 * n / 8 / GIB)
    assert actor(nodes=2) == pytest.approx(12 * n / 16 / GIB)  # sharded over every rank of every node
    assert actor(nodes=2, fsdp_size=8) == pytest.approx(12 * n / 8 / GIB)  # hybrid sharding: over 8 only
    e, _ = estimate_generation_memory(_config(model, param_offload=True, optimizer_offload=True))
    assert e.actor_gib == ACTOR_OVERHEAD_GIB


def test_without_config_json_the_known_backbones_or_an_explicit_count(tmp_path):
    assert known_model_params("/models/Qwen2.5-Math-7B-16k") == pytest.approx(7.616e9)
    assert known_model_params("Qwen/Qwen2.5-Math-1.5B") == pytest.approx(1.544e9)
    assert known_model_params("/ckpt/LUFFY-Qwen-Math-7B-Zero/") == pytest.approx(7.616e9)
    assert known_model_params("meta-llama/Llama-3.1-8B-Instruct") == pytest.approx(8.03e9)
    assert known_model_params("/models/my-model") is None
    estimate, why = estimate_generation_memory(_config("/absent/Qwen2.5-Math-7B"))
    assert why is None and "table of known backbones" in estimate.params_source
    none, why = estimate_generation_memory(_config("/absent/my-model"))
    assert none is None and "--model-params" in why
    explicit, _ = estimate_generation_memory(_config("/absent/my-model"), model_params=parse_count("7.6B"))
    assert explicit.params == pytest.approx(7.6e9)
    assert parse_count("350M") == 3.5e8 and parse_count("7.616e9") == 7.616e9
    with pytest.raises(ValueError, match="MODEL_PARAMS"):
        parse_count("seven")
    cpu = _config(tmp_path)
    cpu.actor_rollout_ref.rollout.name = "hf"
    assert estimate_generation_memory(cpu) == (None, "the rollout is not vLLM")


# ------------------------------------------------------------------------------ the launch scripts, the dry run
BACKBONE_PARAMS = {
    "qwen2.5_math_7b": "Qwen2.5-Math-7B",
    "qwen2.5_math_1.5b": "Qwen2.5-Math-1.5B",
    "qwen2.5_7b_instruct": "Qwen2.5-7B-Instruct",
    "llama3.1_8b": "Llama-3.1-8B",
    "llama3.1_8b_instruct": "Llama-3.1-8B-Instruct",
    "luffy_continual": "LUFFY-Qwen-Math-7B-Zero",
}


@pytest.mark.parametrize("backbone", sorted(BACKBONE_PARAMS))
def test_every_launch_scripts_default_fits_an_80_gb_card(backbone):
    name = BACKBONE_PARAMS[backbone]
    (overrides,) = printed_launches(TRAIN_DIR / f"exgrpo_{backbone}.sh", MODEL_PATH=f"/models/{name}")
    report = dry_run(overrides)
    assert report.warnings == [], report.warnings
    (note,) = [n for n in report.notes if n.startswith("GPU memory during generation")]
    assert "of 80 GiB" in note and name in note
    if "7b" in backbone or "8b" in backbone:  # the release's 0.8 does not fit next to a 7-8B actor on 8 GPUs
        assert dry_run([*overrides, f"{UTILIZATION_KEY}=0.8"]).warnings


def test_the_dry_run_prints_the_warning_and_still_passes(capsys, tmp_path):
    model = _write_model(tmp_path, **QWEN_7B)
    (overrides,) = printed_launches(TRAIN_DIR / "exgrpo_qwen2.5_math_7b.sh", MODEL_PATH=str(model))
    assert dry_run_main(["--quiet", "--", *overrides, f"{UTILIZATION_KEY}=0.8"]) == 0  # a warning, not an error
    err = capsys.readouterr().err
    assert "[dry-run] warning: GPU memory during generation" in err and f"{UTILIZATION_KEY}=0.75" in err, err
    assert dry_run_main(["--quiet", "--gpu-memory-gib", "141", "--", *overrides, f"{UTILIZATION_KEY}=0.8"]) == 0
    err = capsys.readouterr().err
    assert "[dry-run] warning" not in err and "of 141 GiB" in err, err
    assert dry_run_main(["--quiet", "--model-params", "seven", "--", *overrides]) == 1
    assert "MODEL_PARAMS='seven'" in capsys.readouterr().err


# ------------------------------------------------------------------------------------ LoRA, the update, one GPU
def _qwen2_adapter(h, inter, layers, heads, kv, rank) -> int:
    """A rank-r LoRA on every linear layer of a Qwen2 decoder (PEFT's all-linear: not the output layer): A is
    r x in, B is out x r, for q, k, v, o, gate, up and down."""
    kv_dim = kv * (h // heads)
    shapes = [(h, h), (h, kv_dim), (h, kv_dim), (h, h), (h, inter), (h, inter), (inter, h)]
    return layers * sum(rank * (i + o) for i, o in shapes)


N_7B = 7_615_616_512
ADAPTER_7B_R32 = _qwen2_adapter(3584, 18944, 28, 28, 4, rank=32)


def test_lora_keeps_optimizer_state_and_gradients_for_the_adapter_only(tmp_path):
    model = _write_model(tmp_path, **QWEN_7B)
    full_g, _ = estimate_generation_memory(_config(model, gpus=1, model_dtype="bf16"))
    lora_g, _ = estimate_generation_memory(_config(model, gpus=1, lora_rank=32, model_dtype="bf16"))
    assert lora_g.adapter_params == ADAPTER_7B_R32  # counted from the model's layers by lora.py's helpers
    # the frozen base and the adapter, both bf16 (verl casts the adapter to the base's dtype)
    assert lora_g.actor_params_gib == pytest.approx(2 * (N_7B + ADAPTER_7B_R32) / GIB)
    # AdamW's two moments, for the adapter's parameters only
    assert lora_g.actor_optimizer_gib == pytest.approx(2 * 2 * ADAPTER_7B_R32 / GIB)
    assert full_g.actor_optimizer_gib == pytest.approx(2 * 2 * N_7B / GIB)
    assert lora_g.actor_optimizer_gib / full_g.actor_optimizer_gib == pytest.approx(ADAPTER_7B_R32 / N_7B)
    assert "LoRA adapter, rank 32 on 196 layers" in lora_g.summary()  # 7 linear layers x 28 decoder layers
    full_u, _ = estimate_update_memory(_config(model, gpus=1, model_dtype="bf16"))
    lora_u, _ = estimate_update_memory(_config(model, gpus=1, lora_rank=32, model_dtype="bf16"))
    assert lora_u.gradients_gib == pytest.approx(2 * ADAPTER_7B_R32 / GIB)
    assert full_u.gradients_gib == pytest.approx(2 * N_7B / GIB)
    assert lora_u.optimizer_gib == pytest.approx(lora_g.actor_optimizer_gib)
    assert lora_u.activations_gib == pytest.approx(full_u.activations_gib)  # the same tokens through the same model
    # the rank scales the adapter; offloading moves base and adapter off the GPU during generation
    r64, _ = estimate_generation_memory(_config(model, gpus=1, lora_rank=64, model_dtype="bf16"))
    assert r64.adapter_params == 2 * ADAPTER_7B_R32
    off, _ = estimate_generation_memory(
        _config(model, gpus=1, lora_rank=32, param_offload=True, optimizer_offload=True)
    )
    assert off.actor_params_gib == off.actor_optimizer_gib == 0


def test_the_update_counts_weights_gradients_optimizer_and_one_micro_batchs_activations(tmp_path):
    model = _write_model(tmp_path, **QWEN_7B)
    h, inter, layers, vocab, kv_dim, tokens = 3584, 18944, 28, 152064, 512, 16384
    u, _ = estimate_update_memory(_config(model, gpus=8, tokens=tokens))
    assert u.weights_gib == u.gradients_gib == pytest.approx(4 * N_7B / 8 / GIB)  # fp32, sharded
    assert u.optimizer_gib == pytest.approx(8 * N_7B / 8 / GIB)
    # deferring the gradients' reduce-scatter keeps them whole (bf16) until the last micro-batch
    deferred, _ = estimate_update_memory(_config(model, gpus=8, use_no_sync_for_gradient_accumulation=True))
    assert deferred.gradients_gib == pytest.approx(u.gradients_gib + 2 * N_7B / GIB)
    # gradient checkpointing: each decoder layer's input, one layer's activations recomputed, and the logits
    assert u.checkpoints_gib == pytest.approx(tokens * layers * ACTIVATION_BYTES * h / GIB)
    layer = ACTIVATION_BYTES * (5 * h + 2 * h + 2 * kv_dim + 4 * inter)
    assert u.layer_gib == pytest.approx(tokens * layer / GIB)
    assert u.logits_gib == pytest.approx(tokens * LOGIT_BYTES * vocab / GIB)
    assert u.vllm_gib == VLLM_ASLEEP_GIB and u.overhead_gib == ACTOR_OVERHEAD_GIB
    parts = u.state_gib + u.gathered_gib + u.activations_gib + u.overhead_gib + u.vllm_gib
    assert u.total_gib == pytest.approx(parts)
    plain, _ = estimate_update_memory(_config(model, gpus=8, tokens=tokens, checkpointing=False))
    assert plain.checkpoints_gib == 0 and plain.layer_gib == pytest.approx(layers * u.layer_gib)
    # the largest micro-batch that fits does fit, 1024 tokens more does not
    big, _ = estimate_update_memory(_config(model, gpus=1, tokens=65536, lora_rank=32, model_dtype="bf16"))
    fit = big.tokens_that_fit()
    assert not big.fits and f"{TOKENS_KEY} <= {fit}" in big.warning()
    assert estimate_update_memory(_config(model, gpus=1, tokens=fit, lora_rank=32, model_dtype="bf16"))[0].fits
    over, _ = estimate_update_memory(_config(model, gpus=1, tokens=fit + 1024, lora_rank=32, model_dtype="bf16"))
    assert not over.fits


def test_the_7b_fits_one_80_gb_gpu_with_lora_but_not_fully_fine_tuned(tmp_path):
    model = _write_model(tmp_path, **QWEN_7B)
    lora = _config(model, gpus=1, utilization=0.6, lora_rank=32, model_dtype="bf16")
    for estimate in (estimate_generation_memory, estimate_update_memory):
        e, _ = estimate(lora, card_gib=80)
        assert e.fits and e.warning() is None, e.summary()
    # verl's default fp32 training copy: weights, gradients and AdamW's two moments, 16 bytes per parameter
    full, _ = estimate_update_memory(_config(model, gpus=1, utilization=0.6), card_gib=80)
    assert full.state_gib == pytest.approx(16 * N_7B / GIB) and full.state_gib > WARN_SHARE * 80
    assert not full.fits and "even one sequence (9216 tokens) does not fit" in full.warning()
    generation, _ = estimate_generation_memory(_config(model, gpus=1, utilization=0.6), card_gib=80)
    assert not generation.fits
    # on the 8 GPUs of the paper's run it fits
    assert estimate_update_memory(_config(model, gpus=8), card_gib=80)[0].fits


def test_the_builtin_shapes_are_the_backbones(tmp_path):
    """The built-in config.json keys give the known parameter counts (Qwen2.5-Math-7B exactly, by hand)."""
    import tempfile

    distinct = {id(config): (fragment, config) for fragment, config in BUILTIN_CONFIGS.items()}
    for fragment, config in distinct.values():
        with tempfile.TemporaryDirectory() as d:
            shape = model_shape(_write_model(Path(d), **config))
        assert shape.params == pytest.approx(known_model_params(fragment), rel=1e-3), fragment
    qwen7, _ = estimate_update_memory(_config("/absent/Qwen2.5-Math-7B-16k", lora_rank=32))
    assert qwen7 is not None and qwen7.adapter_params == ADAPTER_7B_R32
    none, why = estimate_update_memory(_config("/absent/my-model"), model_params=7e9)
    assert none is None and "shapes" in why
    lora, why = estimate_generation_memory(_config("/absent/my-model", lora_rank=8), model_params=7e9)
    assert lora is None and "LoRA" in why


def test_verls_published_one_gpu_lora_setting_fits(tmp_path):
    """verl's docs ("Hardware Resource Needed for RL") list Qwen2.5-7B GRPO-LoRA on 1 x H100 at batch 16
    (examples/tuning/7b/qwen2-7b_grpo-lora_1_h100_fsdp_vllm.sh: rank 32, all-linear, prompt 512 + response 1024,
    n = 5, micro batch 16 sequences, param and optimizer offload, gpu_memory_utilization 0.2, fp32 model): the
    estimate, with every sequence at its longest, fits it (docs/launch_scripts.md, "Training on one GPU")."""
    model = _write_model(tmp_path, **dict(QWEN_7B, max_position_embeddings=32768))
    config = _config(model, gpus=1, utilization=0.2, lora_rank=32, param_offload=True, optimizer_offload=True)
    config.data.max_prompt_length, config.data.max_response_length = 512, 1024
    config.actor_rollout_ref.actor.use_dynamic_bsz = False
    config.actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu = 16
    update, _ = estimate_update_memory(config, card_gib=80)
    assert update.tokens == 16 * 1536 and update.fits, update.summary()
    assert update.weights_gib == pytest.approx(4 * (N_7B + ADAPTER_7B_R32) / GIB)  # fp32 base, loaded for the update
    assert estimate_generation_memory(config, card_gib=80)[0].fits


ONE_GPU_SCRIPTS = {  # script -> (backbone, card GiB)
    "exgrpo_qwen2.5_math_1.5b_80gb": ("Qwen2.5-Math-1.5B", 80),
    "exgrpo_qwen2.5_math_7b_lora_80gb": ("Qwen2.5-Math-7B", 80),
    "exgrpo_qwen2.5_math_1.5b_lora_24gb": ("Qwen2.5-Math-1.5B", 24),
}


@pytest.mark.parametrize("name", sorted(ONE_GPU_SCRIPTS))
def test_every_one_gpu_script_prints_estimates_that_fit_its_card(name, capsys):
    model, card = ONE_GPU_SCRIPTS[name]
    (overrides,) = printed_launches(TRAIN_DIR / "one_gpu" / f"{name}.sh", MODEL_PATH=f"/models/{model}")
    assert dry_run_main(["--quiet", "--gpu-memory-gib", str(card), "--", *overrides]) == 0
    err = capsys.readouterr().err
    assert "[dry-run] warning" not in err, err
    for phase in ("generation", "the update"):
        (line,) = [x for x in err.splitlines() if x.startswith(f"[dry-run] note: GPU memory during {phase}")]
        assert f"of {card} GiB" in line and ("LoRA" in line) == ("lora" in name), line


def test_the_24_gb_script_estimates_for_a_24_gb_card_end_to_end(tmp_path):
    """DRY_RUN=1 through bash: the script's GPU_MEMORY_GIB default reaches the dry run, which prints both estimates."""
    script = TRAIN_DIR / "one_gpu" / "exgrpo_qwen2.5_math_1.5b_lora_24gb.sh"
    env = script_env(tmp_path, DRY_RUN="1", DRY_RUN_QUIET="1", MODEL_PATH="/models/Qwen2.5-Math-1.5B-16k")
    env.pop("GPU_MEMORY_GIB", None)
    proc = run_script(script, env=env)
    assert proc.returncode == 0, proc.stderr
    assert "[dry-run] note: GPU memory during generation" in proc.stderr and "of 24 GiB" in proc.stderr
    assert "[dry-run] note: GPU memory during the update" in proc.stderr
    assert "[dry-run] warning" not in proc.stderr
