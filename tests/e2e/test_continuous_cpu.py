"""The continuous reward mode through the real verl trainer on CPU (slow): it replays, resumes exactly and learns.

One 20-step ExGRPO run with ``exgrpo.reward_mode=continuous`` and a graded reward any policy can learn
(tests/e2e/low_digit_reward.py: (9 − d) / 9 for the boxed answer's last digit d), with the replayed members keeping
their stored reward (``exgrpo.replay_reward=stored``; the default re-scoring is the binary mode's path, covered by
tests/e2e/test_exgrpo_cpu.py), a checkpoint every 10 steps; then a run resumed from step 10 for one step.

- learning: the sampled responses' mean reward (``exgrpo/reward/mean``, replayed members left out) averages >= 0.75
  over the last three steps and gains >= 0.25 over step 1; the rollout serves the updated weights; replayed tokens
  reach the loss. The faults this is meant to catch, injected once, and what the check saw are in docs/learning.md
  ("The continuous reward mode");
- the pool: buckets from the reward spread, the mode recorded in the checkpoint's header;
- resume: the resumed trainer restores exactly the saved state and draws, at step 11, the replayed questions, fresh
  prompts and selected trajectories of the uninterrupted run.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from exgrpo.config import ExGRPOConfig
from recipe.exgrpo.harness.demo import ExGRPOCpuRun, read_metrics
from tests.e2e.helpers import assert_learned, assert_resume_repeats_the_next_draw, launch_ok, read_trace

pytestmark = [pytest.mark.slow]

LOW_DIGIT_REWARD = Path(__file__).resolve().parent / "low_digit_reward.py"
STEPS = 20
QUESTIONS = 16
K = 8
LR = 1e-3  # the binary learnability check's learning rate (docs/learning.md §1)
END_AT_LEAST = 0.75
GAIN_AT_LEAST = 0.25
SAVE_FREQ = 10
# ~7 minutes on a quiet 2-core machine; the bound is for an oversubscribed one (the watchdog kills a run past it)
WALL_LIMIT_S = 1200


def _run(out: Path, ray_temp_dir: str, assets, steps: int, **kw) -> list[dict]:
    run = ExGRPOCpuRun(
        output_dir=out,
        steps=steps,
        train_batch_size=QUESTIONS,
        rollout_n=K,
        ppo_mini_batch_size=QUESTIONS,
        lr=LR,
        reward_mode="continuous",
        reward_fn_path=str(LOW_DIGIT_REWARD),
        wall_limit_s=WALL_LIMIT_S,
        ray_temp_dir=ray_temp_dir,
        extra_overrides=["exgrpo.replay_reward=stored"],
        **kw,
    )
    launch_ok(run, assets)
    return [m for m in read_metrics(out) if "exgrpo/reward/mean" in m]


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory, new_ray_temp_dir, cpu_assets):
    out = tmp_path_factory.mktemp("continuous") / "uninterrupted"
    steps = _run(out, new_ray_temp_dir(), cpu_assets, STEPS, save_freq=SAVE_FREQ)
    return out, steps


@pytest.mark.timeout(WALL_LIMIT_S + 120)
def test_continuous_exgrpo_learns_a_graded_reward_and_replays(uninterrupted):
    out, steps = uninterrupted
    assert [int(m["step"]) for m in steps] == list(range(1, STEPS + 1))
    assert_learned(steps, "exgrpo/reward/mean", END_AT_LEAST, GAIN_AT_LEAST)
    # mixed from step 1 (continuous_start=steps, 0 steps): replay from step 2, with K-member groups
    assert steps[0]["exgrpo/mixed"] == 1.0 and all(m["exgrpo/replayed_questions"] > 0 for m in steps[1:])
    assert all(m["actor/exgrpo/replayed_tokens"] > 0 for m in steps[1:])
    assert all(m["exgrpo/replay_group_size_min"] == K == m["exgrpo/replay_group_size_max"] for m in steps[1:])
    # buckets are normalised reward spreads: the collection logged them, and the sampled buckets are 1..K-1. A step
    # whose every group scored alike (once the policy answers 0 to every question) has no spread to bucket: it
    # reports 0 for both, and at most a quarter of the steps may be such steps
    spread = [m for m in steps if m["exgrpo/collect/flat_groups"] < m["exgrpo/collect/groups"]]
    assert len(spread) >= STEPS * 3 // 4
    assert all(
        m["exgrpo/collect/group_std_max"] > 0 and 1 <= m["exgrpo/collect/spread_bucket_mean"] <= K - 1 for m in spread
    )
    flat = [m for m in steps if m not in spread]
    assert all(m["exgrpo/collect/group_std_max"] == 0 == m["exgrpo/collect/spread_bucket_mean"] for m in flat)
    assert sum(m["exgrpo/pool/bucket_1"] + m["exgrpo/pool/bucket_7"] for m in steps) > 0
    header = json.loads(
        (out / "checkpoints" / f"global_step_{SAVE_FREQ}" / "exgrpo" / "pool" / "header.json").read_text()
    )
    assert header["pool"]["settings"]["reward_mode"] == "continuous"
    assert header["pool"]["settings"]["continuous"]["members"] == "above_mean"


@pytest.mark.timeout(WALL_LIMIT_S + 120)
def test_continuous_resume_restores_state_and_repeats_the_next_draw(
    uninterrupted, tmp_path_factory, new_ray_temp_dir, cpu_assets
):
    out_u, _ = uninterrupted
    saved = out_u / "checkpoints" / f"global_step_{SAVE_FREQ}"
    out_r = tmp_path_factory.mktemp("continuous_resume") / "resumed"
    steps_r = _run(
        out_r,
        new_ray_temp_dir(),
        cpu_assets,
        SAVE_FREQ + 1,
        resume_mode="resume_path",
        resume_from_path=str(saved),
    )
    assert [int(m["step"]) for m in steps_r] == [SAVE_FREQ + 1]
    cfg = ExGRPOConfig.from_dict(json.loads((saved / "exgrpo" / "pool" / "header.json").read_text())["extra"]["config"])
    assert cfg.reward_mode == "continuous"
    assert_resume_repeats_the_next_draw(read_trace(out_u), read_trace(out_r), saved_step=SAVE_FREQ, expect_replay=True)
