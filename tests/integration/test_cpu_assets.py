"""CPU backend pieces without a Ray cluster: offline assets, the hf rollout server, the platform, the checks.

The platform plugin changes process-wide verl state (platform singleton, registries), so what needs it loaded
runs in a subprocess; everything else runs in-process.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from data_preprocess.toy_arithmetic import Difficulty, QuestionFamily, ToyArithmeticConfig
from recipe.exgrpo import verl_compat
from recipe.exgrpo.cpu.run_config import (
    PLUGIN_MODULE,
    CpuRunSpec,
    cpu_config_problems,
    cpu_env,
    cpu_overrides,
    required_ray_cpus,
    separate_async_overrides,
)
from recipe.exgrpo.harness import assets as assets_module
from recipe.exgrpo.harness.assets import (
    Assets,
    AssetSpec,
    WarmupSpec,
    build_tokenizer,
    ensure_assets,
    file_manifest,
    last_boxed,
    manifest_problems,
)
from tests.helpers.cpu_runs import compose_ppo_trainer, hf_rollout_server, tiny_asset_spec

REPO_ROOT = Path(__file__).resolve().parents[2]


# ------------------------------------------------------------------------------------------------ tokenizer / model
def test_tokenizer_is_byte_level_with_chat_specials(cpu_assets):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(cpu_assets.model_path)
    text = "What is 23 + 58?\nÅ \\boxed{81}"
    ids = tok.encode(text, add_special_tokens=False)
    assert ids == list(text.encode("utf-8"))  # id == byte value, no merges
    assert tok.decode(ids) == text
    assert tok.encode("\n", add_special_tokens=False) == [10]
    assert tok.eos_token == "<|im_end|>" and tok.pad_token == "<|endoftext|>"
    assert tok.convert_tokens_to_ids("<|im_start|>") >= 256
    assert len(tok) == 259
    prompt = tok.apply_chat_template([{"role": "user", "content": "hi"}], add_generation_prompt=True, tokenize=False)
    assert prompt == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"


def test_tokenizer_passes_verls_qwen_checks(cpu_assets):
    from verl.utils import hf_tokenizer
    from verl.utils.tokenizer.continuous_token import QwenContinuousTokenBuilder

    tok = hf_tokenizer(str(cpu_assets.model_path))
    QwenContinuousTokenBuilder(tok)  # raises "Expected Qwen newline to tokenize to one token" on a bad tokenizer


def test_model_is_tiny_qwen2_with_sdpa(cpu_assets):
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(cpu_assets.model_path)
    assert config.model_type == "qwen2"
    assert config.vocab_size == len(build_tokenizer())
    model = AutoModelForCausalLM.from_pretrained(cpu_assets.model_path, attn_implementation="sdpa")
    assert sum(p.numel() for p in model.parameters()) < 1_000_000
    assert verl_compat.attn_implementation(model.config) == "sdpa"


def test_warmup_leaves_a_spread_of_difficulties(cpu_assets):
    """After the warm-up the levels are ordered for the model and questions are partially solved (what ExGRPO's
    buckets feed on), measured on every validation question, K samples each at temperature 1, with the recipe's
    think-gated reward; the arithmetic alone (any last boxed answer) is better, since about half the answers
    leave the think block open (the headroom RL trains away, docs/learning.md)."""
    report = cpu_assets.report
    levels = report["per_level"]
    assert list(levels) == ["easy", "medium", "hard"], levels
    rates = [levels[lv]["pass_rate"] for lv in levels]
    assert rates[0] > rates[1] > rates[2], rates
    k = report["spec"]["warmup"]["eval_samples_per_question"]
    for name, level in levels.items():
        histogram = level["success_count_histogram"]
        assert len(histogram) == k + 1 and sum(histogram) == level["questions"]
        assert sum(histogram[1:k]) > 0, f"{name}: no partially solved question: {histogram}"
        assert level["answer_pass_rate"] >= level["pass_rate"]
    overall = report["success_count_histogram"]
    assert sum(overall[1:k]) / sum(overall) >= 0.4, overall
    assert 0.1 <= report["pass_rate"] <= 0.8, report["pass_rate"]
    assert report["answer_pass_rate"] > 1.5 * report["pass_rate"]
    assert report["final_loss"] < report["first_loss"]


def test_ensure_assets_builds_once_and_caches(tmp_path):
    tiny = ToyArithmeticConfig(
        train_per_level=4, val_per_level=2, levels=(Difficulty("tiny", (QuestionFamily("+", 0, 9, 0, 9),)),)
    )
    spec = AssetSpec(
        warmup=WarmupSpec(steps=2, batch_size=4, warmup_steps=1, questions_per_level=10, eval_samples_per_question=2),
        data=tiny,
    )
    first = ensure_assets(spec, root=tmp_path)
    assert first.root.name == spec.digest()
    assert first.train_file.exists() and first.val_file.exists()
    assert (first.model_path / "model.safetensors").exists() and (first.init_model_path / "config.json").exists()
    report = first.report
    assert report["warmup_questions"] == 10 and report["per_level"]["tiny"]["questions"] == 2
    assert 0.0 <= report["per_level"]["tiny"]["pass_rate"] <= report["per_level"]["tiny"]["answer_pass_rate"]
    assert len(report["per_level"]["tiny"]["success_count_histogram"]) == 3
    stamp = (first.root / "assets.json").stat().st_mtime_ns
    again = ensure_assets(spec, root=tmp_path)
    assert again.root == first.root and (again.root / "assets.json").stat().st_mtime_ns == stamp
    other = AssetSpec(warmup=spec.warmup, data=ToyArithmeticConfig(**{**tiny.__dict__, "seed": 1}))
    assert other.digest() != spec.digest()


def test_the_manifest_records_every_file_and_the_digest_the_build_environment(tmp_path):
    spec = tiny_asset_spec()
    built = ensure_assets(spec, root=tmp_path)
    report = built.report
    assert report["files"] == file_manifest(built.root) and "assets.json" not in report["files"]
    assert {"data/train.parquet", "data/val.parquet", "model/model.safetensors", "model_init/config.json"} <= set(
        report["files"]
    )
    assert manifest_problems(built.root) == []
    env = report["environment"]
    assert env["threads"] == 1
    assert torch.__version__.split("+")[0] == env["libraries"]["torch"].split("+")[0]
    assert all(env["libraries"][name] for name in ("transformers", "safetensors", "pyarrow")), env
    assert env["cpu_capability"] == torch.backends.cpu.get_cpu_capability()
    # another library version (or instruction set) is another digest, so another cache directory
    real = assets_module.build_environment()
    other = {**real, "libraries": {**real["libraries"], "transformers": "0.0.1"}}
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(assets_module, "build_environment", lambda: other)
        assert spec.digest() != built.root.name
    assert spec.digest() == built.root.name
    # a forced kernel path is another digest too (the matrix libraries choose theirs by processor); unset: as before
    assert "dispatch_env" not in env
    for name in assets_module.DISPATCH_ENV:
        with pytest.MonkeyPatch.context() as mp:
            mp.setenv(name, "AVX2")
            assert assets_module.build_environment()["dispatch_env"] == {name: "AVX2"}
            assert spec.digest() != built.root.name, name


@pytest.mark.parametrize(
    "damage",
    ["delete the data directory", "change a byte of the weights", "delete the manifest", "truncate the report"],
)
def test_a_damaged_asset_directory_is_moved_aside_and_rebuilt(tmp_path, capfd, damage):
    spec = tiny_asset_spec()
    built = ensure_assets(spec, root=tmp_path)
    hashes = built.report["files"]
    if damage == "delete the data directory":
        import shutil

        shutil.rmtree(built.root / "data")
        named = "train.parquet"
    elif damage == "change a byte of the weights":
        weights = built.model_path / "model.safetensors"
        blob = bytearray(weights.read_bytes())
        blob[-1] ^= 0x01
        weights.write_bytes(bytes(blob))
        named = "model.safetensors"
    elif damage == "delete the manifest":
        report = json.loads((built.root / "assets.json").read_text())
        del report["files"]
        (built.root / "assets.json").write_text(json.dumps(report))
        named = "no readable manifest"
    else:
        (built.root / "assets.json").write_text('{"digest": ')
        named = "no readable manifest"
    assert manifest_problems(built.root), "the damage went unseen"
    again = ensure_assets(spec, root=tmp_path)
    err = capfd.readouterr().err
    assert "does not match its manifest" in err and named in err and "moved aside" in err, err
    aside = [p for p in tmp_path.iterdir() if p.name.startswith(f"{spec.digest()}.broken-")]
    assert len(aside) == 1, list(tmp_path.iterdir())
    # the rebuilt directory is whole again, with the same bytes as the first build (the build is deterministic)
    assert again.root == built.root and manifest_problems(again.root) == []
    assert again.report["files"] == hashes


BUILD_IN_A_PROCESS = """
import json, sys
import torch
torch.set_num_threads(int(sys.argv[2]))
from tests.helpers.cpu_runs import tiny_asset_spec
from recipe.exgrpo.harness.assets import build_assets
report = build_assets(sys.argv[1], tiny_asset_spec()).report
print(json.dumps({"files": report["files"], "digest": report["digest"], "threads": torch.get_num_threads()}))
"""


def test_the_same_digest_gives_the_same_bytes_on_1_and_2_threads(tmp_path):
    """The build runs on one intra-op thread whatever the caller's setting (and gives the caller's back)."""
    results = {}
    for threads in (1, 2):
        env = {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}
        proc = subprocess.run(
            [sys.executable, "-c", BUILD_IN_A_PROCESS, str(tmp_path / f"t{threads}"), str(threads)],
            cwd=REPO_ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
        results[threads] = json.loads(proc.stdout.strip().splitlines()[-1])
        assert results[threads]["threads"] == threads  # the caller's thread count is given back
    assert results[1]["digest"] == results[2]["digest"]
    assert results[1]["files"] == results[2]["files"]


def test_last_boxed():
    assert last_boxed("so \\boxed{12} then \\boxed{ 81 }") == "81"
    assert last_boxed("no box") is None


# ------------------------------------------------------------------------------------------------ hf rollout server
def _server(cpu_assets: Assets, response_length: int = 12):
    return hf_rollout_server(cpu_assets, prompt_length=96, response_length=response_length)


def _prompt_ids(cpu_assets: Assets, question: str) -> list[int]:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(cpu_assets.model_path)
    text = tok.apply_chat_template([{"role": "user", "content": question}], add_generation_prompt=True, tokenize=False)
    return tok.encode(text, add_special_tokens=False)


def _teacher_forced_log_probs(model, prompt: list[int], response: list[int], temperature: float) -> torch.Tensor:
    ids = torch.tensor([prompt + response])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0, len(prompt) - 1 : -1].float() / temperature
    return torch.log_softmax(logits, -1).gather(-1, torch.tensor(response)[:, None]).squeeze(-1)


@pytest.mark.parametrize("seeded", [False, True], ids=["global generator", "seeded"])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_rollout_log_probs_match_a_teacher_forced_forward(cpu_assets, temperature, seeded):
    from recipe.exgrpo.cpu.hf_rollout import SamplingKey

    server = _server(cpu_assets)
    prompts = [_prompt_ids(cpu_assets, q) for q in ("What is 3 + 4?", "What is 12 + 30? Be brief.")]  # unequal lengths
    key = SamplingKey(temperature=temperature, top_p=1.0, top_k=0, max_tokens=12, logprobs=True)
    outputs = server.generate_batch(prompts, key, [3, 4] if seeded else None)
    for prompt, out in zip(prompts, outputs, strict=True):
        assert 1 <= len(out.token_ids) <= 12 and len(out.log_probs) == len(out.token_ids)
        if len(out.token_ids) < 12:
            assert out.token_ids[-1] in server.eos_token_ids  # stops at EOS and keeps it
        expected = _teacher_forced_log_probs(server.model, prompt, out.token_ids, temperature)
        torch.testing.assert_close(torch.tensor(out.log_probs), expected, atol=1e-4, rtol=1e-4)


def test_a_seeded_request_samples_the_same_tokens_whatever_it_is_batched_with(cpu_assets):
    from recipe.exgrpo.cpu.hf_rollout import SamplingKey

    server = _server(cpu_assets, response_length=16)
    a, b = _prompt_ids(cpu_assets, "What is 37 + 45?"), _prompt_ids(cpu_assets, "What is 120 + 345? Think first.")
    key = SamplingKey(temperature=1.0, top_p=1.0, top_k=0, max_tokens=16, logprobs=True)
    alone = server.generate_batch([a], key, [11])[0]
    crowded = server.generate_batch([b, a, b, b], key, [5, 11, 6, 7])
    assert crowded[1].token_ids == alone.token_ids  # longer left padding, other rows: same draw
    torch.testing.assert_close(torch.tensor(crowded[1].log_probs), torch.tensor(alone.log_probs), atol=1e-5, rtol=0)
    # the fault the seeds remove: from torch's global generator, a row's draw depends on the rows beside it
    moved = 0
    for seed in range(3):
        torch.manual_seed(seed)
        global_alone = server.generate_batch([a], key)[0]
        torch.manual_seed(seed)
        moved += server.generate_batch([b, a, b, b], key)[1].token_ids != global_alone.token_ids
    assert moved > 0, "unseeded draws did not depend on the batch: this test would not see the fault"
    draws = {tuple(out.token_ids) for out in server.generate_batch([a] * 8, key, list(range(100, 108)))}
    assert len(draws) > 1, "eight seeds gave one response: the seeds do not reach the sampling"
    # the log-probs stay those of the sampled tokens under the model (the Gumbel noise is not in them)
    expected = _teacher_forced_log_probs(server.model, a, alone.token_ids, 1.0)
    torch.testing.assert_close(torch.tensor(alone.log_probs), expected, atol=1e-4, rtol=1e-4)


def test_seeded_sampling_applies_top_k_and_top_p(cpu_assets):
    """top-k 1 (and a tiny top-p) leave one token: the seeded draw is then the greedy one; a wide top-k is not."""
    from recipe.exgrpo.cpu.hf_rollout import SamplingKey

    server = _server(cpu_assets, response_length=10)
    prompt = _prompt_ids(cpu_assets, "What is 48 + 27?")
    greedy = server.generate_batch([prompt], SamplingKey(0.0, 1.0, 0, 10, True))[0].token_ids
    for key in (SamplingKey(0.7, 1.0, 1, 10, True), SamplingKey(1.3, 1e-6, 0, 10, True)):
        outs = server.generate_batch([prompt] * 4, key, [1, 2, 3, 4])
        assert all(out.token_ids == greedy for out in outs), (key, [o.token_ids for o in outs], greedy)
    wide = server.generate_batch([prompt] * 8, SamplingKey(1.5, 0.95, 50, 10, True), list(range(8)))
    assert len({tuple(o.token_ids) for o in wide}) > 1


def test_request_seeds_count_repeats_of_a_prompt_and_restart_each_step(cpu_assets):
    from recipe.exgrpo.cpu.hf_rollout import SamplingKey

    server = _server(cpu_assets)
    key = SamplingKey(temperature=1.0, top_p=1.0, top_k=0, max_tokens=8, logprobs=True)
    other_key = SamplingKey(temperature=0.6, top_p=1.0, top_k=0, max_tokens=8, logprobs=True)
    a, b = [1, 2, 3], [1, 2, 4]
    server.global_steps = 3
    first = [
        server.next_seed(a, key),
        server.next_seed(a, key),
        server.next_seed(b, key),
        server.next_seed(a, other_key),
    ]
    assert len(set(first)) == 4
    server.global_steps = 4
    assert server.next_seed(a, key) not in first
    server.global_steps = 3  # a resumed run at step 3: the same seeds, whatever came before
    assert [server.next_seed(b, key), server.next_seed(a, key), server.next_seed(a, key)] == [first[2], *first[:2]]


def test_the_gumbel_sampler_draws_from_the_softmax():
    from recipe.exgrpo.cpu.hf_rollout import GumbelSampler

    logits = torch.tensor([2.0, 1.0, 0.0, -1.0, float("-inf")])
    n = 20_000
    sampler = GumbelSampler(list(range(n)))
    picks = sampler(None, logits.expand(n, -1)).argmax(-1)
    freq = torch.bincount(picks, minlength=5).double() / n
    expected = torch.softmax(logits.double(), -1)
    assert freq[4] == 0  # a filtered token (top-k/top-p set it to -inf) is never drawn
    torch.testing.assert_close(freq, expected, atol=0.015, rtol=0)  # about 5 standard errors


def test_greedy_generation_is_the_argmax(cpu_assets):
    from recipe.exgrpo.cpu.hf_rollout import SamplingKey

    server = _server(cpu_assets)
    prompt = _prompt_ids(cpu_assets, "What is 20 + 22? Put the final answer in \\boxed{}.")
    out = server.generate_batch([prompt], SamplingKey(0.0, 1.0, 0, 8, True))[0]
    ids = list(prompt)
    with torch.no_grad():
        for token in out.token_ids:
            assert int(server.model(input_ids=torch.tensor([ids])).logits[0, -1].argmax()) == token
            ids.append(token)


def test_sampling_params_follow_verls_vllm_defaults(cpu_assets):
    server = _server(cpu_assets, response_length=12)
    key = server.sampling_key(prompt_len=40, sampling_params={"temperature": 1.0, "top_p": 1, "top_k": -1})
    assert key.max_tokens == 12 and key.top_k == 0 and key.logprobs is False
    assert server.sampling_key(40, {"max_tokens": 5, "logprobs": True}).max_tokens == 5
    with pytest.raises(ValueError, match="max_model_len"):
        server.sampling_key(prompt_len=500, sampling_params={})


def test_concurrent_requests_are_batched_and_answered(cpu_assets, tmp_path, monkeypatch):
    from recipe.exgrpo.cpu.hf_rollout import DUMP_FILE

    monkeypatch.setenv("EXGRPO_CPU_ROLLOUT_DUMP", str(tmp_path))
    server = _server(cpu_assets)
    prompt = _prompt_ids(cpu_assets, "What is 1 + 1?")

    async def many():
        params = {"temperature": 1.0, "top_p": 1.0, "top_k": -1, "logprobs": True}
        return await asyncio.gather(*[server.generate(prompt, dict(params), request_id=str(i)) for i in range(6)])

    outputs = asyncio.run(many())
    assert len(outputs) == 6 and all(o.log_probs and len(o.log_probs) == len(o.token_ids) for o in outputs)
    events = [json.loads(line) for line in (tmp_path / DUMP_FILE).read_text().splitlines()]
    batches = [e["num_requests"] for e in events if e["event"] == "generate"]
    assert sum(batches) == 6 and max(batches) > 1


def test_weight_update_changes_the_served_model_and_rejects_bad_weights(cpu_assets):
    server = _server(cpu_assets)
    prompt = _prompt_ids(cpu_assets, "What is 5 + 5?")
    response = [92, 98, 111, 120]  # "\box"
    before = _teacher_forced_log_probs(server.model, prompt, response, 1.0)
    state = {k: v.clone() for k, v in server.model.state_dict().items()}
    state["lm_head.weight"] += 0.5 * torch.randn_like(state["lm_head.weight"])
    checksum_before = server.get_state()["checksum"]
    info = server.update_weights(state, global_steps=3)
    assert info["weights_version"] == 1 and server.global_steps == 3
    assert info["checksum"] != checksum_before
    after = _teacher_forced_log_probs(server.model, prompt, response, 1.0)
    assert not torch.allclose(before, after)
    with pytest.raises(KeyError, match="not in the served model"):
        server.update_weights({"model.no_such.weight": torch.zeros(1)})
    with pytest.raises(ValueError, match="shape"):
        server.update_weights({"lm_head.weight": torch.zeros(3, 3)})
    with pytest.raises(KeyError, match="sent no weights"):
        server.update_weights({"lm_head.weight": state["lm_head.weight"]})


def test_rollout_config_needing_a_gpu_engine_is_rejected():
    from verl.workers.config import RolloutConfig

    from recipe.exgrpo.cpu.hf_rollout import HFRolloutConfigError, validate_hf_rollout_config

    with pytest.raises(HFRolloutConfigError, match="tensor_model_parallel_size"):
        validate_hf_rollout_config(RolloutConfig(name="hf", tensor_model_parallel_size=2))


# ------------------------------------------------------------------------------------------------ engine checks
def test_engine_check_names_fsdp1_and_flash_attention():
    from recipe.exgrpo.cpu.engines import CpuEngineConfigError, check_cpu_engine_settings

    good_model = SimpleNamespace(override_config={"attn_implementation": "sdpa"}, hf_config=None)
    check_cpu_engine_settings(good_model, SimpleNamespace(strategy="fsdp2"))
    with pytest.raises(CpuEngineConfigError, match="strategy=fsdp2"):
        check_cpu_engine_settings(good_model, SimpleNamespace(strategy="fsdp"))
    flash = SimpleNamespace(override_config={}, hf_config=SimpleNamespace(_attn_implementation="flash_attention_2"))
    with pytest.raises(CpuEngineConfigError, match="attn_implementation=sdpa"):
        check_cpu_engine_settings(flash, SimpleNamespace(strategy="fsdp2"))


# ------------------------------------------------------------------------------------------------ overrides + checks
def _spec(tmp_path: Path, **kwargs) -> CpuRunSpec:
    return CpuRunSpec(
        model_path="/m", train_files="/t.parquet", val_files="/v.parquet", output_dir=str(tmp_path), **kwargs
    )


def test_cpu_overrides_compose_against_verls_config_and_pass_the_check(tmp_path):
    spec = _spec(tmp_path, reward_fn_path="/r.py", ray_temp_dir="/tmp/x", total_training_steps=5, rollout_n=3)
    cfg = compose_ppo_trainer(cpu_overrides(spec))
    assert cfg.actor_rollout_ref.rollout.name == "hf" and cfg.actor_rollout_ref.rollout.n == 3
    assert cfg.trainer.use_v1 is False and cfg.trainer.total_training_steps == 5
    assert cfg.reward.custom_reward_function.path == "/r.py"
    assert cfg.ray_kwargs.ray_init.num_gpus == 1
    assert cfg.actor_rollout_ref.model.override_config.attn_implementation == "sdpa"
    assert cpu_config_problems(cfg, env=cpu_env(base={})) == []


@pytest.mark.parametrize(
    ("extra", "key"),
    [
        (["actor_rollout_ref.rollout.name=sglang"], "actor_rollout_ref.rollout.name=sglang"),
        (["actor_rollout_ref.actor.strategy=fsdp"], "actor_rollout_ref.actor.strategy=fsdp"),
        (["actor_rollout_ref.model.override_config.attn_implementation=flash_attention_2"], "attn_implementation"),
        (["ray_kwargs.ray_init.num_cpus=4"], "ray_kwargs.ray_init.num_cpus=4"),
        (["ray_kwargs.ray_init.num_gpus=0"], "ray_kwargs.ray_init.num_gpus=0"),
        (["actor_rollout_ref.model.use_remove_padding=True"], "use_remove_padding"),
        (["actor_rollout_ref.rollout.tensor_model_parallel_size=2"], "tensor_model_parallel_size=2"),
    ],
)
def test_config_check_names_the_bad_key_and_the_fix(tmp_path, extra, key):
    cfg = compose_ppo_trainer(cpu_overrides(_spec(tmp_path, extra_overrides=extra)))
    problems = cpu_config_problems(cfg, env=cpu_env(base={}))
    assert len(problems) == 1 and key in problems[0], problems
    assert "set" in problems[0].lower()


def test_separate_async_overrides_pass_the_check_and_a_missing_rollout_gpu_is_named(tmp_path):
    """verl's separate_async on CPU (``separate_async_overrides``): the standalone rollout's logical GPU is counted
    beside the trainer's, since Ray would wait for ever for a GPU it does not have."""
    extra = separate_async_overrides(4)
    cfg = compose_ppo_trainer(cpu_overrides(_spec(tmp_path, use_v1=True, extra_overrides=extra)))
    assert cfg.trainer.v1.trainer_mode == "separate_async" and cfg.ray_kwargs.ray_init.num_gpus == 2
    assert cfg.actor_rollout_ref.rollout.checkpoint_engine.backend == "cpu_zmq"
    assert cpu_config_problems(cfg, env=cpu_env(base={})) == []
    one_gpu = [*extra, "ray_kwargs.ray_init.num_gpus=1"]
    cfg = compose_ppo_trainer(cpu_overrides(_spec(tmp_path, use_v1=True, extra_overrides=one_gpu)))
    (problem,) = cpu_config_problems(cfg, env=cpu_env(base={}))
    assert problem.startswith("ray_kwargs.ray_init.num_gpus=1: verl places one logical GPU per device")
    assert "the standalone rollout's actor_rollout_ref.rollout.n_gpus_per_node * nnodes = 1" in problem
    assert "Set ray_kwargs.ray_init.num_gpus=2" in problem


def test_config_check_needs_the_plugin_in_the_environment(tmp_path):
    cfg = compose_ppo_trainer(cpu_overrides(_spec(tmp_path)))
    problems = cpu_config_problems(cfg, env={})
    assert any("VERL_USE_EXTERNAL_MODULES" in p for p in problems)


def test_required_cpus_grow_with_workers():
    assert required_ray_cpus(1, 1, 1) == 7
    assert required_ray_cpus(2, 2, 1) > required_ray_cpus(1, 1, 1)


def test_cpu_env_extends_rather_than_replaces():
    env = cpu_env(base={"VERL_USE_EXTERNAL_MODULES": "other.mod", "PYTHONPATH": "/x"}, threads=2, wall_limit_s=60)
    assert env["VERL_USE_EXTERNAL_MODULES"].split(",") == [PLUGIN_MODULE, "other.mod"]
    assert env["PYTHONPATH"].split(os.pathsep) == [str(REPO_ROOT), "/x"]
    assert env["VERL_PLATFORM"] == "cpu" and env["OMP_NUM_THREADS"] == "2"
    assert env["EXGRPO_CPU_WALL_LIMIT_S"] == "60"


# ------------------------------------------------------------------------------------------------ plugin (subprocess)
PLUGIN_PROBE = textwrap.dedent(
    """
    import json, os
    import verl
    from verl.utils.device import get_device_name, get_torch_device, get_nccl_backend, get_resource_name
    from verl.utils.flops_counter import get_device_flops
    from verl.workers.engine import EngineRegistry
    from verl.workers.rollout.replica import get_rollout_replica_class
    from verl.workers.rollout.base import get_rollout_class
    import torch.distributed as dist
    from verl.utils.distributed import initialize_global_process_group_ray

    out = {
        "device": get_device_name(),
        "device_name_string": get_torch_device().get_device_name(),
        "backend": get_nccl_backend(),
        "resource": get_resource_name(),
        "flops": get_device_flops(),
        "engine": EngineRegistry.get_engine_cls("language_model", "fsdp2").__name__,
        "replica": get_rollout_replica_class("hf").__name__,
        "adapter": get_rollout_class("hf", "async").__name__,
    }
    for name, fn in (("vllm_replica", lambda: get_rollout_replica_class("vllm")),
                     ("vllm_adapter", lambda: get_rollout_class("vllm", "async"))):
        try:
            fn()
            out[name] = "no error"
        except Exception as e:
            out[name] = f"{type(e).__name__}: {e}"
    os.environ.update(RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=os.environ["PROBE_PORT"])
    initialize_global_process_group_ray()
    t = __import__("torch").ones(3)
    dist.all_reduce(t)
    out["pg_backend"] = dist.get_backend()
    out["allreduce"] = t.tolist()
    dist.destroy_process_group()
    print("PROBE" + json.dumps(out))
    """
)


def test_plugin_registers_platform_engines_rollout_and_gloo_in_a_fresh_process():
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, **cpu_env(threads=1), "PROBE_PORT": str(port)}
    start = time.time()
    proc = subprocess.run(
        [sys.executable, "-c", PLUGIN_PROBE], env=env, cwd=REPO_ROOT, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = next(x for x in proc.stdout.splitlines() if x.startswith("PROBE"))
    out = json.loads(line[len("PROBE") :])
    assert out["device"] == "cpu" and out["device_name_string"] == "CPU"
    assert out["backend"] == "gloo" and out["resource"] == "GPU"
    assert out["flops"] > 0
    assert out["engine"] == "CpuFSDPEngineWithLMHead"
    assert out["replica"] == "HFReplica" and out["adapter"] == "HFServerAdapter"
    for key in ("vllm_replica", "vllm_adapter"):
        assert out[key].startswith("GpuRolloutOnCpuError") and "rollout.name=hf" in out[key]
    assert out["pg_backend"] == "gloo" and out["allreduce"] == [1.0, 1.0, 1.0]
    assert time.time() - start < 120


# ------------------------------------------------------------------------------------------------ process runner
def test_runner_kills_the_whole_session_on_timeout(tmp_path):
    import psutil

    from recipe.exgrpo.harness.procs import run_in_new_session

    pid_file = tmp_path / "grandchild.pid"
    script = (
        "import subprocess, sys, time\n"
        f"p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
        f"open({str(pid_file)!r}, 'w').write(str(p.pid))\n"
        "time.sleep(60)\n"
    )
    result = run_in_new_session([sys.executable, "-c", script], env=os.environ, timeout_s=3, log_path=tmp_path / "l")
    assert result.timed_out and result.returncode is None
    grandchild = int(pid_file.read_text())
    assert not psutil.pid_exists(grandchild) or psutil.Process(grandchild).status() == psutil.STATUS_ZOMBIE
    assert result.peak_rss_bytes > 0
