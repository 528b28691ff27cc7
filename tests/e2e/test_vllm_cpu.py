"""The recipe on verl's real ``vllm`` rollout (slow, needs the vLLM CPU stack of ``scripts/setup_env.sh --vllm``).

The same trainer, fused old-log-prob pass, loss and pool as on the ``hf`` stand-in, now fed by vLLM's async HTTP
server replica, the bucketed shared-memory weight transfer after every update and vLLM's sampling log-probs:

- ExGRPO on verl's v1 trainer with a LoRA actor replays (mixed from step 1), replayed rows reach the loss, one actor
  forward call per step, nothing is left in TransferQueue, and the rollout's log-probs match the actor's after every
  update (the adapter sync works: vLLM serves the adapter as a LoRA request), the checkpoint holds the adapter and the
  untouched base weights, verl's ``lora_adapter_path`` loader continues from it, and a resume from a checkpoint
  draws what the uninterrupted run draws;
- on-policy GRPO (``exgrpo.enable=false``) on the legacy trainer, in the run whose skipped weight syncs fail the
  agreement check (the negative control; its figures are in docs/cpu_backend.md);
- a weight sync that fails inside the engine stops the run with ``WeightSyncError`` instead of hanging
  (tests/e2e/vllm_faults.py injects both faults).

Each run is ~1.5 minutes on 2 cores (vLLM's start-up is ~30 s of it).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from recipe.exgrpo.harness.demo import ExGRPOCpuRun, launch, read_metrics
from tests.e2e.helpers import assert_ran, assert_resume_repeats_the_next_draw, read_trace
from tests.e2e.lora_checks import check_adapter_continues, check_lora_checkpoint
from tests.helpers.jsonl import read_jsonl

pytestmark = [pytest.mark.slow]

K = 4
STEPS = 4
# Rollout (vLLM's kernels) and actor (torch sdpa) compute the log-probs of the same weights in float32: they agree
# to ~1e-5 per token. One update at this run's learning rate moves them by ~1e-2 or more (the negative control
# below, docs/cpu_backend.md), so a max gap under 1e-3 on every step means the weights reached the engine.
MAX_ROLLOUT_ACTOR_GAP = 1e-3
# The ExGRPO run and its resume train a LoRA adapter (full fine-tuning on vLLM: the weight-sync tests below and the
# multi-turn run of tests/e2e/test_multi_turn_cpu.py); vLLM serves it as a LoRA request, synced after every update
# (lora.merge=false). At this learning rate one update moves the adapted policy's log-probs by more than the gap
# above (the agreement check caught a run whose adapter syncs were skipped: docs/learning.md, "LoRA")
LORA = dict(lora_rank=8, lora_alpha=16, lora_merge=False, lr=2e-3)
FAULTS_MODULE = "tests.e2e.vllm_faults"
# a backstop against a hang, not a timing check: a run takes ~2 minutes on a quiet 2-core machine, several times
# that on a busy one
WALL_LIMIT_S = 1500


def _run(tmp: Path, name: str, python: str, assets, ray_temp_dir: str, **kw) -> tuple[Path, list[dict], object]:
    out = tmp / name
    run = ExGRPOCpuRun(
        output_dir=out,
        steps=kw.pop("steps", STEPS),
        rollout_n=K,
        train_batch_size=8,
        ppo_mini_batch_size=8,
        lr=kw.pop("lr", 1e-3),
        delayed_start_threshold=-1.0,  # mixed from step 1: the pool collected at step 1 is replayed from step 2
        wall_limit_s=kw.pop("wall_limit_s", WALL_LIMIT_S),
        ray_temp_dir=ray_temp_dir,
        rollout="vllm",
        python=python,
        **kw,
    )
    result = launch(run, assets, echo=False)
    return out, read_metrics(out), result


def _steps(metrics: list[dict]) -> list[dict]:
    return [m for m in metrics if "exgrpo/batch_pass_rate" in m]


def _check_agreement(steps: list[dict]) -> None:
    gaps = [(int(m["step"]), m["exgrpo/rollout_actor_log_prob_diff_max"]) for m in steps]
    bad = [(s, g) for s, g in gaps if not g < MAX_ROLLOUT_ACTOR_GAP]
    assert not bad, f"rollout and actor log-probs disagree (stale weights in the engine?): max |diff| per step {gaps}"


@pytest.fixture(scope="module")
def exgrpo_on_vllm(tmp_path_factory, new_ray_temp_dir, vllm_python, vllm_assets):
    tmp = tmp_path_factory.mktemp("vllm_exgrpo")
    # on verl's v1 trainer (the legacy trainer runs on vLLM in the weight-sync tests below)
    out, metrics, result = _run(
        tmp, "uninterrupted", vllm_python, vllm_assets, new_ray_temp_dir(), save_freq=2, trainer="v1", **LORA
    )
    assert_ran("uninterrupted", result)
    return out, metrics


@pytest.mark.timeout(1800)
def test_exgrpo_on_vllm_replays_in_one_actor_pass_with_synced_weights(exgrpo_on_vllm):
    out, metrics = exgrpo_on_vllm
    steps = _steps(metrics)
    assert [int(m["step"]) for m in steps] == list(range(1, STEPS + 1))
    assert [m["exgrpo/actor_log_prob_calls"] for m in steps] == [1] * STEPS
    replay_steps = [m for m in steps if m.get("exgrpo/replayed_questions", 0) > 0]
    assert replay_steps, f"no step replayed anything: pool entries {[m.get('exgrpo/pool/entries') for m in steps]}"
    for m in replay_steps:
        assert m["actor/exgrpo/replayed_tokens"] > 0, "replayed rows did not reach the actor loss"
        assert m["exgrpo/replay_group_size_min"] == K and m["exgrpo/replay_group_size_max"] == K
        assert m["exgrpo/replayed_rows"] == m["exgrpo/replayed_questions"]
    _check_agreement(steps)
    assert all(m["actor/grad_norm"] > 0 for m in steps)
    assert [m["exgrpo/v1/leaked_rows"] for m in steps] == [0] * STEPS  # the v1 trainer's TransferQueue stays clean
    assert (out / "checkpoints" / "global_step_2" / "exgrpo" / "pool").is_dir()


@pytest.mark.timeout(600)
def test_the_lora_checkpoint_on_vllm_holds_the_adapter_and_the_untouched_base_weights(exgrpo_on_vllm, vllm_assets):
    out, _ = exgrpo_on_vllm
    step_dir = out / "checkpoints" / "global_step_2"
    adapter = check_lora_checkpoint(step_dir, vllm_assets.model_path, LORA["lora_rank"])
    check_adapter_continues(vllm_assets.model_path, step_dir, adapter)


@pytest.mark.timeout(600)
def test_the_vllm_demo_takes_an_extra_override(tmp_path, vllm_python):
    """The vLLM demo's own +actor_rollout_ref.rollout.enable_sleep_mode=False (a field verl's RolloutConfig reads
    though its yaml omits it) passes the demo's override check beside an extra override (here on the v1 trainer)."""
    from recipe.exgrpo.harness import demo

    run = demo.demo_run(
        tmp_path, rollout="vllm", trainer="v1", python=vllm_python, extra_overrides=["exgrpo.delayed_start_threshold=0"]
    )
    assert "+actor_rollout_ref.rollout.enable_sleep_mode=False" in demo.build_overrides(run, "m", "t", "v")
    assert demo.override_problems(run) == []


@pytest.mark.timeout(1800)
def test_resume_on_vllm_draws_what_the_uninterrupted_run_draws(
    exgrpo_on_vllm, tmp_path_factory, new_ray_temp_dir, vllm_python, vllm_assets
):
    out_u, _ = exgrpo_on_vllm
    saved = out_u / "checkpoints" / "global_step_2"
    tmp = tmp_path_factory.mktemp("vllm_resume")
    out_r, metrics_r, result = _run(
        tmp,
        "resumed",
        vllm_python,
        vllm_assets,
        new_ray_temp_dir(),
        resume_mode="resume_path",
        resume_from_path=str(saved),
        steps=3,
        trainer="v1",
        **LORA,
    )
    assert_ran("resumed", result)

    assert_resume_repeats_the_next_draw(read_trace(out_u), read_trace(out_r), saved_step=2)
    steps = _steps(metrics_r)
    assert [int(m["step"]) for m in steps] == [3]
    _check_agreement(steps)  # the resumed actor's weights reached the fresh engine before step 3


@pytest.mark.timeout(1800)
def test_a_weight_sync_that_fails_in_the_engine_stops_the_run_with_a_named_error(
    tmp_path, ray_temp_dir, vllm_python, vllm_assets, monkeypatch
):
    """Without the CPU backend's weight-sync fix the engine cannot load the trainer's weights (it dropped them
    after repacking): the first sync fails inside the engine, and the run must stop with WeightSyncError naming the
    engine's error, well before its wall-clock limit (verl's own sender would wait for ever)."""
    monkeypatch.setenv("VERL_USE_EXTERNAL_MODULES", FAULTS_MODULE)
    monkeypatch.setenv("EXGRPO_TEST_FAULT", "no_weight_sync_fix")
    _, metrics, result = _run(tmp_path, "no_fix", vllm_python, vllm_assets, ray_temp_dir, steps=2)
    log = result.log_path.read_text(errors="replace")
    assert "[vllm_faults] the vLLM engine runs without the weight-sync fix" in log, result.log_tail()
    assert not result.timed_out, f"the failed weight sync hung the run until its wall-clock limit\n{result.log_tail()}"
    assert result.returncode != 0 and "WeightSyncError" in log, result.log_tail()
    assert "the vLLM engine failed" in log, result.log_tail()
    assert not _steps(metrics), "no step may run on an engine that never got the weights"


@pytest.mark.timeout(1800)
def test_onpolicy_grpo_on_vllm_and_the_negative_control_of_the_weight_sync(
    tmp_path, ray_temp_dir, vllm_python, vllm_assets, monkeypatch
):
    """On-policy GRPO (``exgrpo.enable=false``) through the same path: three steps, one actor pass each, nothing
    replayed. The run is also the agreement check's negative control (one run for both: a vLLM run is minutes of
    the test command): with every weight sync after the first skipped, the engine samples the initial policy while
    the actor trains, and the check must reject the run from step 2 on. (The sync itself does not depend on
    ``exgrpo.enable``: the ExGRPO run above checks it after every update.)"""
    monkeypatch.setenv("VERL_USE_EXTERNAL_MODULES", FAULTS_MODULE)
    monkeypatch.setenv("EXGRPO_TEST_FAULT", "skip_weight_sync")
    _, metrics, result = _run(tmp_path, "stale", vllm_python, vllm_assets, ray_temp_dir, exgrpo_enable=False, steps=3)
    assert_ran("stale", result)
    assert "[vllm_faults] weight sync after step 1 skipped" in result.log_path.read_text(errors="replace")
    steps = _steps(metrics)
    assert [int(m["step"]) for m in steps] == [1, 2, 3]
    assert [m["exgrpo/actor_log_prob_calls"] for m in steps] == [1, 1, 1]
    assert all(
        m.get("exgrpo/replayed_questions", 0) == 0 and m.get("actor/exgrpo/replayed_tokens", 0) == 0 for m in steps
    )
    assert all(m["actor/grad_norm"] > 0 for m in steps)
    _check_agreement(steps[:1])  # step 1 samples the weights of the one sync that ran
    with pytest.raises(AssertionError, match="stale weights"):
        _check_agreement(steps[1:])
    gaps = [m["exgrpo/rollout_actor_log_prob_diff_max"] for m in steps]
    print(f"negative control, max |rollout - actor| log-prob per step: {gaps}")


# ------------------------------------------------------------------------------------------------ evaluation
EVAL_ROWS_PER_LEVEL = 8
EVAL_SAMPLES = 2


def _eval_command(python: str, assets, out: Path) -> list[str]:
    return [
        python, "-m", "exgrpo.eval", "run", "--backend", "vllm",
        "--model", str(assets.model_path), "--data", str(assets.val_file), "--out", str(out),
        "--max-questions-per-source", str(EVAL_ROWS_PER_LEVEL), "--n-samples", str(EVAL_SAMPLES),
        "--max-new-tokens", "24", "--temperature", "1.0", "--seed", "3",
        "--batch-size", str(EVAL_SAMPLES),  # one row per generation call: many small, flushed batches
        "--reference", "none", "--no-plot", "--no-progress",
    ]  # fmt: skip


@pytest.mark.timeout(1800)
def test_evaluation_on_vllm_survives_a_sigkill_and_resumes(tmp_path, vllm_python, vllm_assets, repo_root):
    """``python -m exgrpo.eval run --backend vllm`` on CPU (the GPU evaluation scripts' code path): killed with
    SIGKILL in the middle of its generation, the same command resumes, keeps every sample written before the kill,
    generates the rest, grades and reports."""
    import signal
    import subprocess
    import time

    from exgrpo.eval.generate import read_generations
    from recipe.exgrpo.harness.procs import new_session, run_captured

    out = tmp_path / "eval"
    generations = out / "generations" / f"{vllm_assets.val_file.stem}.jsonl"
    total = 3 * EVAL_ROWS_PER_LEVEL * EVAL_SAMPLES
    first_log = tmp_path / "first.log"
    # each command in its own session, killed however the block is left (vLLM's engine processes included)
    with first_log.open("w") as log, new_session(
        _eval_command(vllm_python, vllm_assets, out), cwd=repo_root, stdout=log, stderr=subprocess.STDOUT
    ) as first:  # fmt: skip
        deadline = time.monotonic() + WALL_LIMIT_S
        written = 0
        while time.monotonic() < deadline and first.poll() is None:
            written = len(read_generations(generations)) if generations.exists() else 0
            if written >= 2 * EVAL_SAMPLES:
                break
            time.sleep(0.1)
        assert first.poll() is None, f"the first run ended before it could be killed:\n{first_log.read_text()[-3000:]}"
        assert written >= 2 * EVAL_SAMPLES, f"no generation was written in time:\n{first_log.read_text()[-3000:]}"
        os.killpg(first.pid, signal.SIGKILL)
        first.wait(30)
    before = read_generations(generations)
    assert EVAL_SAMPLES <= len(before) < total, f"{len(before)} of {total} samples before the kill"

    second = run_captured(_eval_command(vllm_python, vllm_assets, out), timeout_s=WALL_LIMIT_S, cwd=repo_root)
    assert second.returncode == 0, second.stderr[-4000:]
    after = read_generations(generations)
    assert len(after) == total
    for key, record in before.items():
        assert after[key]["response"] == record["response"], f"sample {key} was regenerated"
    results = json.loads((out / "results.json").read_text())
    levels = {f"toy_arithmetic_{level}" for level in ("easy", "medium", "hard")}
    assert set(results["benchmarks"]) == levels
    graded = read_jsonl(out / "scores" / f"{vllm_assets.val_file.stem}.jsonl")
    for name in levels:
        bench = results["benchmarks"][name]
        assert bench["num_questions"] == EVAL_ROWS_PER_LEVEL and bench["samples_per_question"] == EVAL_SAMPLES
        # the reported score is the mean of the graded samples of that level, in percent
        scores = [g["score"] for g in graded if g["benchmark"] == name]
        assert len(scores) == EVAL_ROWS_PER_LEVEL * EVAL_SAMPLES, name
        assert bench["score"] == pytest.approx(100 * sum(scores) / len(scores)), name
    assert results["metadata"]["backend"] == "vllm"
    assert results["metadata"]["versions"]["vllm"].endswith("+cpu")
    # data that is not the paper's benchmarks gets one column per benchmark (and a row each in the details)
    header = (out / "table.md").read_text().splitlines()[0]
    assert [cell.strip() for cell in header.strip("|").split("|")] == ["Model", *sorted(levels)]
