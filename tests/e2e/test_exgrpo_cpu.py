"""ExGRPO through the real verl trainers on CPU (slow): replay reaches the loss, the pool grows, replay groups
have K members, a step with replay makes as many actor forward calls as one without (the candidates ride in the
old-log-prob pass), the pool inspector reads the run's checkpoints; the same run on verl's v1 trainer trains on the
same rows with the same rewards, advantages, selections and loss as on the legacy trainer, leaves nothing behind
in TransferQueue, and a resumed v1 run restores exactly what was saved and draws what the uninterrupted run draws, and
logs the same metrics for the two steps after the resume."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from recipe.exgrpo.harness.demo import ExGRPOCpuRun, read_metrics
from tests.e2e.helpers import (
    assert_resume_repeats_the_next_draw,
    assert_same_metrics,
    launch_ok,
    read_trace,
    step_record,
)

pytestmark = [pytest.mark.slow]

K = 4
STEPS = 4  # saved at 2 and 4; the resumed run repeats steps 3 and 4


def _run(tmp: Path, name: str, ray_temp_dir: str, **kw) -> tuple[Path, list[dict]]:
    out = tmp / name
    run = ExGRPOCpuRun(
        output_dir=out,
        steps=STEPS,
        rollout_n=K,
        train_batch_size=8,
        ppo_mini_batch_size=8,
        delayed_start_threshold=-1.0,  # mixed from step 1: the pool collected at step 1 is replayed from step 2
        wall_limit_s=720,
        ray_temp_dir=ray_temp_dir,
        extra_overrides=["exgrpo.trace_rows=true"],  # every row of every step in the trace: the parity check reads it
        **kw,
    )
    launch_ok(run, name=name)
    return out, read_metrics(out)


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory, new_ray_temp_dir, cpu_assets):
    tmp = tmp_path_factory.mktemp("exgrpo_e2e")
    return _run(tmp, "uninterrupted", new_ray_temp_dir(), save_freq=2)


@pytest.mark.timeout(900)
def test_replay_reaches_the_loss_and_groups_have_k_members(uninterrupted):
    out, metrics = uninterrupted
    steps = [m for m in metrics if "exgrpo/batch_pass_rate" in m]
    assert len(steps) == STEPS
    assert max(m["exgrpo/pool/entries"] for m in steps) > 0, "the pool never grew"
    replay_steps = [m for m in steps if m.get("exgrpo/replayed_questions", 0) > 0]
    assert replay_steps, f"no step replayed anything: {[m.get('exgrpo/pool/entries') for m in steps]}"
    # a GRPO step makes one actor compute_log_prob call (the old-log-prob pass); so must every ExGRPO step
    assert [m["exgrpo/actor_log_prob_calls"] for m in steps] == [1] * STEPS
    # the reward's health is logged every step (the recipe's reward: nothing errored or timed out on toy sums; with
    # no grading deadline, reward_kwargs.timeout_s=null, it grades in process, so no call waits for a grader)
    assert all(m["exgrpo/reward/error_rate"] == 0.0 and m["exgrpo/reward/queue_s_max"] == 0.0 for m in steps)
    for m in replay_steps:
        assert m["actor/exgrpo/replayed_tokens"] > 0, "replayed rows did not reach the actor loss"
        assert m["exgrpo/old_log_prob_candidate_rows"] >= m["exgrpo/replayed_questions"]
        assert m["exgrpo/replay_group_size_min"] == K and m["exgrpo/replay_group_size_max"] == K
        assert m["exgrpo/replayed_rows"] == m["exgrpo/replayed_questions"]
    for m in steps:
        if m.get("exgrpo/replayed_questions", 0) == 0:
            assert m.get("actor/exgrpo/replayed_tokens", 0) == 0
    assert (out / "checkpoints" / "global_step_2" / "exgrpo" / "pool").is_dir()


@pytest.mark.timeout(1800)
def test_the_pool_inspector_reads_the_runs_checkpoints(uninterrupted, tmp_path, repo_root):
    """``python -m exgrpo.pool`` on the checkpoints this run wrote (steps 2 and 4): ``--across`` gives a figure and
    the pool figures the trainer logged at those steps; ``inspect --plot`` and ``export`` read the last one."""
    out, metrics = uninterrupted

    def pool_cli(*args: str) -> str:
        # a bound on a hang, not a speed check: the export with --tokenizer imports transformers (~20 s of CPU), and
        # with the suite's other sessions and another verl run on the two cores one took over 180 s of wall time
        proc = subprocess.run(
            [sys.executable, "-m", "exgrpo.pool", *args], cwd=repo_root, capture_output=True, text=True, timeout=540
        )
        assert proc.returncode == 0, f"exgrpo.pool {args}: {proc.stderr}"
        return proc.stdout

    across_png = tmp_path / "across.png"
    rows = json.loads(pool_cli("inspect", str(out), "--across", "--json", "--plot", str(across_png)))["checkpoints"]
    assert [r["step"] for r in rows] == [2, STEPS]
    assert across_png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    logged = {m["step"]: m for m in metrics if "exgrpo/batch_pass_rate" in m}
    for r in rows:
        m = logged[r["step"]]
        assert r["trajectories"] == m["exgrpo/pool/entries"] and r["tokens"] == m["exgrpo/pool/tokens"]
        assert r["questions"] == m["exgrpo/pool/questions"] and r["retired"] == m["exgrpo/pool/retired"]
        assert r["buckets"] == [m[f"exgrpo/pool/bucket_{b}"] for b in range(K)]
    last = out / "checkpoints" / f"global_step_{STEPS}"
    summary = json.loads(pool_cli("inspect", str(last), "--json", "--plot", str(tmp_path / "pool.png")))
    assert summary["trajectories"] == rows[-1]["trajectories"] > 0 and summary["log_prob_mean"] < 0
    pool_cli("export", str(last), str(tmp_path / "pool.parquet"), "--tokenizer", str(last / "actor" / "huggingface"))
    table = pq.read_table(tmp_path / "pool.parquet").to_pylist()
    stored = [r for r in table if not r["retired"]]
    assert len(stored) == summary["trajectories"] and all(r["text"] and r["token_ids"] for r in stored)


@pytest.fixture(scope="module")
def on_v1(tmp_path_factory, new_ray_temp_dir, cpu_assets):
    """The same run on verl's v1 trainer (trainer.use_v1=true, sync mode)."""
    tmp = tmp_path_factory.mktemp("exgrpo_v1")
    return _run(tmp, "v1", new_ray_temp_dir(), save_freq=2, trainer="v1")


@pytest.mark.timeout(900)
def test_the_v1_trainer_replays_in_one_pass_and_leaves_nothing_in_transfer_queue(on_v1):
    out, metrics = on_v1
    steps = [m for m in metrics if "exgrpo/batch_pass_rate" in m]
    assert len(steps) == STEPS and [m["step"] for m in steps] == list(range(1, STEPS + 1))
    assert [m["exgrpo/actor_log_prob_calls"] for m in steps] == [1] * STEPS
    # replay from the step the schedule says (mixed from step 1: the pool of step 1 is replayed from step 2)
    assert [m["exgrpo/replayed_questions"] > 0 for m in steps] == [False] + [True] * (STEPS - 1)
    for m in steps[1:]:
        assert m["actor/exgrpo/replayed_tokens"] > 0, "replayed rows did not reach the actor loss"
        assert m["exgrpo/replay_group_size_min"] == K and m["exgrpo/replay_group_size_max"] == K
    # after every step only the step's own rows are in the train partition (verl's fit clears them next): no
    # candidate row the selection dropped, no padding row of the pass
    assert [m["exgrpo/v1/leaked_rows"] for m in steps] == [0] * STEPS
    # the weights the rollout samples from are the actor's (noise-level log-prob gap on the generated rows)
    assert all(m["exgrpo/rollout_actor_log_prob_diff_max"] < 1e-3 for m in steps)
    assert (out / "checkpoints" / "global_step_2" / "exgrpo" / "pool").is_dir()


@pytest.mark.timeout(900)
def test_the_v1_trainer_trains_on_what_the_legacy_trainer_trains_on(uninterrupted, on_v1):
    """Parity: the same config on both adapters draws the same questions, generates the same responses (the hf
    rollout's seeds follow the prompt, not the request order), selects the same stored trajectories, and trains
    on the same rows with the same rewards, advantages, old log-probs and loss, step after step. Rows are compared
    sorted (question, replayed, response digest): the trainers keep them in different orders."""
    trace_l, trace_v = read_trace(uninterrupted[0]), read_trace(on_v1[0])
    loss_l = {m["step"]: m["actor/pg_loss"] for m in uninterrupted[1] if "actor/pg_loss" in m}
    loss_v = {m["step"]: m["actor/pg_loss"] for m in on_v1[1] if "actor/pg_loss" in m}
    for step in range(1, STEPS + 1):
        a, b = step_record(trace_l, step), step_record(trace_v, step)
        for key in ("fresh_rows", "replay_question_ids", "selected_entry_ids", "replayed_members"):
            assert a[key] == b[key], f"step {step}: {key} differs"
        assert b["selected_scores"] == pytest.approx(a["selected_scores"], abs=1e-6)
        assert len(a["rows"]) == len(b["rows"]) == 8 * K
        for ra, rb in zip(a["rows"], b["rows"]):
            same = ("question", "replayed", "tokens_sha", "mask_sha", "reward", "advantage")
            assert {k: ra[k] for k in same} == {k: rb[k] for k in same}, f"step {step}"
            assert rb["old_log_prob_sum"] == pytest.approx(ra["old_log_prob_sum"], abs=1e-6 * 24)  # <= 1e-6 a token
        assert loss_v[step] == pytest.approx(loss_l[step], abs=1e-6), f"step {step}: pg_loss"
    assert any(step_record(trace_l, s)["replay_question_ids"] for s in range(2, STEPS + 1))


@pytest.mark.timeout(900)
def test_resume_restores_state_and_repeats_the_next_draw(on_v1, tmp_path_factory, new_ray_temp_dir):
    """On the v1 trainer (the legacy trainer's resume is held to the same checks in test_multi_turn_cpu.py and
    test_vllm_cpu.py, and its save/resume under a stage deadline in test_stage_deadlines_cpu.py)."""
    out_u, _ = uninterrupted = on_v1
    saved = out_u / "checkpoints" / "global_step_2"
    tmp = tmp_path_factory.mktemp("exgrpo_resume")
    out_r, metrics_r = _run(
        tmp, "resumed", new_ray_temp_dir(), resume_mode="resume_path", resume_from_path=str(saved), trainer="v1"
    )
    # what the resumed trainer restored equals what the uninterrupted run recorded when it saved, and the next step
    # draws the same replayed questions and fresh prompts, and selects the same trajectories
    assert_resume_repeats_the_next_draw(read_trace(out_u), read_trace(out_r), saved_step=2, expect_replay=True)
    assert [m["step"] for m in metrics_r if "exgrpo/batch_pass_rate" in m] == [3, 4]
    # and it samples what the uninterrupted run sampled (the rollout's seeds follow the step, the replay draw and the
    # data order are seeded and restored): the same seed gives the same metrics, step after step
    assert_same_metrics(uninterrupted[1], metrics_r, steps=[3, 4])
