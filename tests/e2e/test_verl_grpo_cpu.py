"""verl's own ``main_ppo`` (legacy ``RayPPOTrainer``) runs GRPO on CPU with the hf rollout.

What it shows, from the run's own outputs:
- >= 3 training steps complete (verl's file logger has steps 1..3);
- the legacy trainer ran (``trainer.use_v1=False``; main_ppo logs its legacy-trainer warning);
- after every actor update the rollout server loads exactly the trainer's weights (the checksum the training
  worker sent equals the one the server computes after loading), and they differ from one step to the next;
- the rollout's and the actor's probabilities of the same sampled tokens agree (verl's own
  ``training/rollout_actor_probs_pearson_corr`` > 0.99, max abs difference tiny).
"""

from __future__ import annotations

import json
import math

import pytest

from recipe.exgrpo.cpu.hf_rollout import DUMP_FILE
from recipe.exgrpo.cpu.run_config import cpu_env, cpu_overrides
from tests.e2e.helpers import cpu_run_spec, ray_started, wait_none_left
from tests.helpers.jsonl import read_jsonl

STEPS = 3
RUN_TIMEOUT_S = 720
# How long the run's Ray processes may take to exit after the driver did. Generous on purpose: this checks that
# they exit (clean-up happens), not how fast a loaded machine is; a process that never exits still fails.
CLEANUP_DEADLINE_S = 120
# The wall-clock limit of the watchdog test: long enough for Ray to be up when it strikes (about 10-15 s after the
# launch on a quiet 2-core machine), so that its processes being gone afterwards shows the watchdog killed them.
WATCHDOG_LIMIT_S = 60


@pytest.mark.slow
@pytest.mark.timeout(RUN_TIMEOUT_S + CLEANUP_DEADLINE_S + 120)
def test_verl_main_ppo_grpo_legacy_trainer_on_cpu(cpu_assets, toy_reward_path, ray_temp_dir, run_cpu_job, tmp_path):
    spec = cpu_run_spec(
        cpu_assets,
        tmp_path,
        reward_fn_path=str(toy_reward_path),
        total_training_steps=STEPS,
        train_batch_size=4,
        rollout_n=4,
        lr=1e-3,
        ray_temp_dir=ray_temp_dir,
        use_v1=False,
    )
    dump_dir = tmp_path / "rollout_dump"
    env = cpu_env(output_dir=tmp_path, wall_limit_s=RUN_TIMEOUT_S - 20, rollout_dump_dir=dump_dir)
    result = run_cpu_job(
        ["-m", "verl.trainer.main_ppo", *cpu_overrides(spec)],
        env,
        RUN_TIMEOUT_S,
        tmp_path / "run.log",
        leftover_grace_s=CLEANUP_DEADLINE_S,
    )
    assert not result.timed_out, f"run exceeded {RUN_TIMEOUT_S} s:\n{result.log_tail()}"
    assert result.returncode == 0, f"main_ppo failed (rc={result.returncode}):\n{result.log_tail()}"
    assert result.leftover_pids == [], f"Ray processes still alive {CLEANUP_DEADLINE_S} s after the run finished"
    assert wait_none_left(ray_temp_dir) == [], "processes of the run escaped its session and survived the kill"
    log = result.log_path.read_text(errors="replace")
    assert "Legacy trainer `main_ppo_v0.py` is deprecated" in log, "the legacy RayPPOTrainer path was not taken"

    # verl's file logger: one record per training step
    records = read_jsonl(tmp_path / "metrics.jsonl")
    metrics = {r["step"]: r["data"] for r in records if "training/global_step" in r["data"]}
    assert sorted(metrics) == list(range(1, STEPS + 1))

    for step, m in metrics.items():
        assert m["training/rollout_probs_diff_valid"] == 1, f"step {step}: rollout log-probs missing"
        corr = m["training/rollout_actor_probs_pearson_corr"]
        assert math.isfinite(corr) and corr > 0.99, f"step {step}: rollout/actor prob correlation {corr}"
        assert m["training/rollout_probs_diff_max"] < 1e-3, f"step {step}: {m['training/rollout_probs_diff_max']}"
        assert m["response_length/mean"] > 0

    # weight sync: what the trainer sent is what the server serves, and it changes after every update
    events = read_jsonl(dump_dir / DUMP_FILE)
    sent = {e["global_steps"]: e["checksum"] for e in events if e["event"] == "send_weights"}
    loaded = {e["global_steps"]: e["checksum"] for e in events if e["event"] == "update_weights"}
    assert sorted(sent) == list(range(0, STEPS + 1)), f"weight syncs seen for steps {sorted(sent)}"
    for step in range(STEPS + 1):
        assert loaded[step] == pytest.approx(sent[step], rel=1e-12, abs=1e-9), f"step {step}: served != sent"
    for step in range(1, STEPS + 1):
        assert loaded[step] != loaded[step - 1], f"rollout weights did not change after update {step}"

    # generation of step k used the weights synced after step k-1
    generations = [e for e in events if e["event"] == "generate"]
    versions_by_step = sorted({(e["global_steps"], e["weights_version"]) for e in generations})
    assert [s for s, _ in versions_by_step] == list(range(0, STEPS)), versions_by_step
    assert len({v for _, v in versions_by_step}) == STEPS


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_legacy_rollout_manager_generates_per_prompt_sample_counts(cpu_assets, ray_temp_dir, run_cpu_job, tmp_path):
    """ExGRPO's mixed step needs K samples for fresh prompts and K-1 for replayed ones: an already-expanded batch
    with uneven repeats goes through verl's own agent-loop manager and comes back one response per row."""
    counts = [4, 3, 4, 3]
    env = {**cpu_env(output_dir=tmp_path, wall_limit_s=480), "EXGRPO_RAY_TEMP_DIR": ray_temp_dir}
    args = ["-m", "tests.e2e.expanded_generation_probe", "--out", str(tmp_path), "--counts", "4,3,4,3"]
    # a bound on a hang: under the suite's load the run's workers once took 4 minutes to start
    result = run_cpu_job(args, env, 420, tmp_path / "probe.log")
    assert result.returncode == 0, (
        f"probe failed (rc={result.returncode}, timeout={result.timed_out}):\n{result.log_tail()}"
    )
    report = json.loads((tmp_path / "expanded_generation.json").read_text())
    assert report["rows"] == sum(counts)
    assert report["group_sizes"] == counts  # uid groups keep their own sizes and order
    assert report["prompts_match"] and report["responses_non_empty"]
    assert report["has_rollout_log_probs"] and report["has_rm_scores"]


@pytest.mark.slow
@pytest.mark.timeout(WATCHDOG_LIMIT_S + 75 + CLEANUP_DEADLINE_S + 90)
def test_wall_clock_limit_stops_the_run_and_its_ray_processes(
    cpu_assets, toy_reward_path, ray_temp_dir, run_cpu_job, tmp_path
):
    spec = cpu_run_spec(
        cpu_assets, tmp_path, reward_fn_path=str(toy_reward_path), total_training_steps=1000, ray_temp_dir=ray_temp_dir
    )
    env = cpu_env(output_dir=tmp_path, wall_limit_s=WATCHDOG_LIMIT_S)
    result = run_cpu_job(
        ["-m", "verl.trainer.main_ppo", *cpu_overrides(spec)],
        env,
        WATCHDOG_LIMIT_S + 75,
        tmp_path / "run.log",
        leftover_grace_s=CLEANUP_DEADLINE_S,
    )
    assert not result.timed_out, "the watchdog did not stop the run; the outer timeout did"
    assert result.returncode == 124, result.log_tail()
    assert f"wall-clock limit of {WATCHDOG_LIMIT_S} s reached" in result.log_path.read_text(errors="replace")
    # Ray had started, so "none of its processes is left" below is about processes that existed
    assert ray_started(ray_temp_dir), f"Ray had not started when the watchdog struck:\n{result.log_tail()}"
    assert result.leftover_pids == [], f"processes of the run still alive {CLEANUP_DEADLINE_S} s after the watchdog"
    assert wait_none_left(ray_temp_dir) == [], "processes of the run escaped its session and survived the kill"
