"""No stage of a step waits for ever (slow): the real CPU trainers (two faults on each) with one stage made to hang
at step 2
(tests/e2e/stage_faults.py: a generation that never returns, a reward call that sleeps, an update that blocks, a
save that writes and never completes) stops at that stage's deadline with ``StageDeadlineError`` naming the stage and
the step, writes the Python stacks of the driver and every Ray worker into the run directory, leaves no incomplete
checkpoint (step 1's stays, and a re-run of the same command resumes from it), and leaves no process of the run
alive. Each run: about 2 minutes on a quiet 2-core machine (Ray and the workers start, step 1 and its checkpoint, the
30 s deadline at step 2)."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import pytest

from recipe.exgrpo.harness.demo import ExGRPOCpuRun, launch, read_metrics

pytestmark = [pytest.mark.slow]

FAULTS_MODULE = "tests.e2e.stage_faults"
#: the deadline of the faulted stage at step 2, where the fault hangs it, in seconds
DEADLINE_S = 30
#: step 1 (and the weight sync before it) runs under FIRST_STEP_FACTOR x DEADLINE_S = 180 s: above what the stage
#: takes there on a 2-core machine shared by the test command's four sessions (seconds when quiet; a deadline of
#: 60 s was once passed by step 1's generation there, before the fault was armed)
FIRST_STEP_FACTOR = 6
WALL_LIMIT_S = 720
#: fault -> (the stage whose deadline fires, a frame the stacks file must show: where the run was waiting, verl's
#: trainer it runs on: two on the legacy trainer, two on the v1 trainer)
FAULTS = {
    "generate_hang": ("generate", "in _sample", "v1"),
    "reward_sleep": ("reward", "in _score_replayed_members", "legacy"),
    "update_block": ("update", "in block_for_ever", "v1"),
    "save_block": ("save_checkpoint", "in block_for_ever", "legacy"),
}


def _run(out: Path, ray_temp_dir: str, steps: int, extra: list[str], resume: bool = False, trainer: str = "legacy"):
    run = ExGRPOCpuRun(
        output_dir=out,
        steps=steps,
        rollout_n=4,
        train_batch_size=8,
        ppo_mini_batch_size=8,
        delayed_start_threshold=-1.0,  # mixed from step 1: the pool collected at step 1 is replayed at step 2
        save_freq=1,
        wall_limit_s=WALL_LIMIT_S,
        ray_temp_dir=ray_temp_dir,
        resume_mode="auto" if resume else "disable",
        extra_overrides=extra,
        trainer=trainer,
    )
    result = launch(run, echo=False)
    return result, result.log_path.read_text(errors="replace")


@pytest.mark.timeout(2 * WALL_LIMIT_S + 300)
@pytest.mark.parametrize("fault", list(FAULTS))
def test_a_stage_that_hangs_stops_the_run_at_its_deadline(fault, tmp_path, monkeypatch, cpu_assets, ray_temp_dir):
    stage, frame, trainer = FAULTS[fault]
    out = tmp_path / "run"
    checkpoints = out / "checkpoints"
    tracker = checkpoints / "latest_checkpointed_iteration.txt"
    monkeypatch.setenv("VERL_USE_EXTERNAL_MODULES", FAULTS_MODULE)
    monkeypatch.setenv("EXGRPO_TEST_STAGE_FAULT", fault)
    monkeypatch.setenv("EXGRPO_TEST_FAULT_AFTER", str(tracker))
    result, log = _run(
        out,
        ray_temp_dir,
        steps=3,
        extra=[f"stage_deadlines.{stage}_s={DEADLINE_S}", f"stage_deadlines.first_step_factor={FIRST_STEP_FACTOR}"],
        trainer=trainer,
    )

    assert not result.timed_out, f"the run hit its wall limit instead of the stage deadline\n{log[-6000:]}"
    assert result.returncode == 1, log[-6000:]
    passed = [line for line in log.splitlines() if "StageDeadlineError" in line]
    assert "[stage_faults]" in log, f"the fault was not injected; deadline messages: {passed}\n{log[-3000:]}"
    # step 2's own deadline (not the first step's, which step 1 ran under)
    named = f"StageDeadlineError: stage '{stage}' of step 2 ran past its deadline of {DEADLINE_S} s ("
    named += f"stage_deadlines.{stage}_s; stopped"
    assert named in log, f"deadline messages: {passed}\n{log[-6000:]}"
    assert "Traceback" not in log[log.index(named) :]  # a message, not a traceback
    # the stacks: the trainer's thread waiting in the stage, the driver and the Ray workers
    stacks_file = checkpoints / f"stage_deadline_step2_{stage}.txt"
    assert str(stacks_file) in log and stacks_file.is_file()
    text = stacks_file.read_text()
    assert text.startswith(f"stage '{stage}' of step 2 passed its deadline of {DEADLINE_S} s")
    assert "=== task runner" in text and "Thread exgrpo-trainer" in text and "=== driver pid" in text
    assert text.count("=== process pid") >= 3, text[:3000]  # actor worker, rollout server, agent-loop/reward workers
    assert frame in text, text[-6000:]
    # no incomplete checkpoint of step 2; step 1's is complete and the tracker names it
    assert not (checkpoints / "global_step_2").exists()
    assert (checkpoints / "global_step_1" / "exgrpo").is_dir() and (checkpoints / "global_step_1" / "actor").is_dir()
    assert tracker.read_text().strip() == "1"
    # no process of the run survives the driver
    assert result.leftover_pids == [], f"processes of the run still alive: {result.leftover_pids}"

    if fault != "save_block":
        return
    # the same command, without the fault, resumes from the last complete checkpoint and finishes
    for var in ("EXGRPO_TEST_STAGE_FAULT", "EXGRPO_TEST_FAULT_AFTER"):
        monkeypatch.delenv(var)
    monkeypatch.delenv("VERL_USE_EXTERNAL_MODULES")
    with tempfile.TemporaryDirectory(prefix="exgray-", dir="/tmp") as ray_dir:  # Ray's socket paths stay short
        resumed, log = _run(out, ray_dir, steps=2, extra=[], resume=True)
    assert not resumed.timed_out and resumed.returncode == 0, log[-6000:]
    trace = [json.loads(x) for x in (checkpoints / "exgrpo_trace.jsonl").read_text().splitlines() if x.strip()]
    resumes = [r for r in trace if r["event"] == "resume"]
    assert len(resumes) == 1 and resumes[0]["global_steps"] == 1
    # the run's history stays: step 1 of the run that stopped, step 2 of the resume (verl's file logger starts its file
    # empty; the launcher merges the two by step)
    assert [int(m["step"]) for m in read_metrics(out) if "exgrpo/batch_pass_rate" in m] == [1, 2]
    assert "[demo] ===== resumed from the checkpoint of step 1 =====" in log  # one log, the resume marked in it
    assert tracker.read_text().strip() == "2" and (checkpoints / "global_step_2" / "actor").is_dir()
