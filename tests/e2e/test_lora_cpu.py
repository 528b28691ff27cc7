"""ExGRPO with a LoRA actor through verl's legacy trainer on the hf stand-in (slow): the rollout gets the merged
weights after every update (``lora.merge=true``, the only way the stand-in takes) and samples what the actor
computes; replayed rows reach the loss in the one actor pass; the checkpoints hold the adapter (also exported in
PEFT's format) and the pool, the base weights byte-identical to the initial model's; verl's ``lora_adapter_path``
loader continues from the exported adapter. LoRA with adapter sync on verl's vLLM rollout, on the v1 trainer's
colocate_async mode, with a resume: tests/e2e/test_vllm_cpu.py."""

from __future__ import annotations

import pytest

from recipe.exgrpo.harness.demo import ExGRPOCpuRun, read_metrics
from tests.e2e.helpers import launch_ok
from tests.e2e.lora_checks import check_adapter_continues, check_lora_checkpoint

pytestmark = [pytest.mark.slow]

K = 4
STEPS = 4
RANK = 8
# Actor (float32) and rollout (the merged weights, float32 on CPU) agree to ~1e-5 per token; one update at this run's
# learning rate moves the adapted policy by more than 1e-3 (docs/learning.md, "LoRA")
MAX_ROLLOUT_ACTOR_GAP = 1e-3


@pytest.fixture(scope="module")
def lora_run(tmp_path_factory, new_ray_temp_dir, cpu_assets):
    out = tmp_path_factory.mktemp("lora_e2e") / "lora"
    run = ExGRPOCpuRun(
        output_dir=out,
        steps=STEPS,
        rollout_n=K,
        train_batch_size=8,
        ppo_mini_batch_size=8,
        lr=2e-3,
        delayed_start_threshold=-1.0,  # mixed from step 1: the pool collected at step 1 is replayed from step 2
        save_freq=2,
        wall_limit_s=720,
        ray_temp_dir=new_ray_temp_dir(),
        lora_rank=RANK,
        lora_alpha=16,
    )
    launch_ok(run, name="lora")
    return out, read_metrics(out), cpu_assets


@pytest.mark.timeout(900)
def test_lora_replays_in_one_pass_and_the_rollout_samples_the_adapted_weights(lora_run):
    out, metrics, _ = lora_run
    steps = [m for m in metrics if "exgrpo/batch_pass_rate" in m]
    assert [m["step"] for m in steps] == list(range(1, STEPS + 1))
    assert [m["exgrpo/actor_log_prob_calls"] for m in steps] == [1] * STEPS
    assert [m["exgrpo/replayed_questions"] > 0 for m in steps] == [False] + [True] * (STEPS - 1)
    for m in steps[1:]:
        assert m["actor/exgrpo/replayed_tokens"] > 0, "replayed rows did not reach the actor loss"
        assert m["exgrpo/replay_group_size_min"] == K and m["exgrpo/replay_group_size_max"] == K
    gaps = [m["exgrpo/rollout_actor_log_prob_diff_max"] for m in steps]
    assert all(g < MAX_ROLLOUT_ACTOR_GAP for g in gaps), f"the rollout samples stale weights: {gaps}"
    assert all(m["actor/grad_norm"] > 0 for m in steps)


@pytest.mark.timeout(900)
def test_lora_checkpoints_hold_the_adapter_and_the_untouched_base_weights(lora_run):
    out, _, assets = lora_run
    ckpt = out / "checkpoints"
    early = check_lora_checkpoint(ckpt / "global_step_2", assets.model_path, RANK)
    late = check_lora_checkpoint(ckpt / "global_step_4", assets.model_path, RANK)
    assert any(not (early[n] == late[n]).all() for n in late), "the adapter did not change between the saves"
    assert (ckpt / "global_step_4" / "exgrpo" / "pool").is_dir()
    check_adapter_continues(assets.model_path, ckpt / "global_step_4", late)
