"""ExGRPO through the real verl trainer on CPU (slow): replay reaches the loss, the pool grows, replay groups
have K members, a step with replay makes as many actor forward calls as one without (the candidates ride in the
old-log-prob pass), and a resumed run restores exactly what was saved and draws what an uninterrupted run draws."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from exgrpo.config import ExGRPOConfig
from exgrpo.experience.manager import ExperienceManager
from recipe.exgrpo.cpu_demo import ExGRPOCpuRun, launch, read_metrics

pytestmark = [pytest.mark.slow]

K = 4
STEPS = 3


def _trace(run_dir: Path) -> list[dict]:
    path = run_dir / "checkpoints" / "exgrpo_trace.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _run(tmp: Path, name: str, ray_temp_dir: str, **kw) -> tuple[Path, list[dict]]:
    out = tmp / name
    run = ExGRPOCpuRun(
        output_dir=out,
        steps=STEPS,
        rollout_n=K,
        train_batch_size=8,
        ppo_mini_batch_size=8,
        delayed_start_threshold=-1.0,  # mixed from step 1: the pool collected at step 1 is replayed from step 2
        wall_limit_s=420,
        ray_temp_dir=ray_temp_dir,
        **kw,
    )
    result = launch(run, echo=False)
    assert not result.timed_out, f"run {name} hit its wall-clock limit\n{result.log_tail()}"
    assert result.returncode == 0, f"run {name} failed\n{result.log_tail()}"
    return out, read_metrics(out)


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory, cpu_assets):
    tmp = tmp_path_factory.mktemp("exgrpo_e2e")
    return _run(tmp, "uninterrupted", str(tmp_path_factory.mktemp("ray")), save_freq=2)


@pytest.mark.timeout(600)
def test_replay_reaches_the_loss_and_groups_have_k_members(uninterrupted):
    out, metrics = uninterrupted
    steps = [m for m in metrics if "exgrpo/batch_pass_rate" in m]
    assert len(steps) == STEPS
    assert max(m["exgrpo/pool/entries"] for m in steps) > 0, "the pool never grew"
    replay_steps = [m for m in steps if m.get("exgrpo/replayed_questions", 0) > 0]
    assert replay_steps, f"no step replayed anything: {[m.get('exgrpo/pool/entries') for m in steps]}"
    # a GRPO step makes one actor compute_log_prob call (the old-log-prob pass); so must every ExGRPO step
    assert [m["exgrpo/actor_log_prob_calls"] for m in steps] == [1] * STEPS
    # the reward's health is logged every step (the recipe's reward: nothing errored or timed out on toy sums)
    assert all(m["exgrpo/reward/error_rate"] == 0.0 and m["exgrpo/reward/queue_s_max"] >= 0.0 for m in steps)
    for m in replay_steps:
        assert m["actor/exgrpo/replayed_tokens"] > 0, "replayed rows did not reach the actor loss"
        assert m["exgrpo/old_log_prob_candidate_rows"] >= m["exgrpo/replayed_questions"]
        assert m["exgrpo/replay_group_size_min"] == K and m["exgrpo/replay_group_size_max"] == K
        assert m["exgrpo/replayed_rows"] == m["exgrpo/replayed_questions"]
    for m in steps:
        if m.get("exgrpo/replayed_questions", 0) == 0:
            assert m.get("actor/exgrpo/replayed_tokens", 0) == 0
    assert (out / "checkpoints" / "global_step_2" / "exgrpo" / "pool").is_dir()


@pytest.mark.timeout(600)
def test_resume_restores_state_and_repeats_the_next_draw(uninterrupted, tmp_path_factory):
    out_u, _ = uninterrupted
    saved = out_u / "checkpoints" / "global_step_2"
    tmp = tmp_path_factory.mktemp("exgrpo_resume")
    out_r, metrics_r = _run(
        tmp, "resumed", str(tmp_path_factory.mktemp("ray")), resume_mode="resume_path", resume_from_path=str(saved)
    )
    trace_u, trace_r = _trace(out_u), _trace(out_r)
    resume = [r for r in trace_r if r["event"] == "resume"]
    assert len(resume) == 1 and resume[0]["global_steps"] == 2

    # what the resumed trainer restored equals what the uninterrupted run saved
    cfg = ExGRPOConfig.from_dict(json.loads((saved / "exgrpo" / "pool" / "header.json").read_text())["extra"]["config"])
    reference = ExperienceManager(cfg)
    trainer_state = reference.load(saved / "exgrpo")
    assert resume[0]["state_digest"] == reference.state_digest()
    assert resume[0]["leftover_rows"] == trainer_state["leftover_rows"]
    assert resume[0]["loader_epoch"] == trainer_state["loader_epoch"]

    # the next step draws the same replayed questions and fresh prompts, and selects the same trajectories
    step3_u = next(r for r in trace_u if r["event"] == "step" and r["step"] == 3)
    step3_r = next(r for r in trace_r if r["event"] == "step" and r["step"] == 3)
    assert step3_r["replay_question_ids"] == step3_u["replay_question_ids"]
    assert step3_r["fresh_rows"] == step3_u["fresh_rows"]
    assert step3_r["selected_entry_ids"] == step3_u["selected_entry_ids"]
    assert [m["step"] for m in metrics_r if "exgrpo/batch_pass_rate" in m] == [3]
