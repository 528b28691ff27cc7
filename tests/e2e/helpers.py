"""Shapes the e2e tests share: launching a run and checking it ended by itself, reading its outputs (verl's
metrics, the recipe's trace), the resume-equivalence check, a run spec built from the tiny assets, and finding the
processes of a run after it was killed."""

from __future__ import annotations

import math
import time
from pathlib import Path

import psutil

from recipe.exgrpo.cpu.run_config import CpuRunSpec
from recipe.exgrpo.harness.demo import ExGRPOCpuRun, launch
from recipe.exgrpo.harness.procs import RunResult
from tests.helpers.jsonl import read_jsonl


def read_trace(run_dir: Path) -> list[dict]:
    """The recipe's ``exgrpo_trace.jsonl`` of a run launched with ``output_dir=run_dir``."""
    return read_jsonl(Path(run_dir) / "checkpoints" / "exgrpo_trace.jsonl")


def assert_ran(name: str, result: RunResult) -> None:
    """The run ended by itself, before its wall-clock limit, with exit code 0."""
    assert not result.timed_out, f"run {name} hit its wall-clock limit\n{result.log_tail()}"
    assert result.returncode == 0, f"run {name} failed (rc={result.returncode})\n{result.log_tail()}"


def launch_ok(run: ExGRPOCpuRun, assets=None, name: str | None = None) -> RunResult:
    """``launch`` the run (quietly) and assert it ended by itself with exit code 0."""
    result = launch(run, assets, echo=False)
    assert_ran(name or Path(run.output_dir).name, result)
    return result


def step_record(trace: list[dict], step: int) -> dict:
    return next(r for r in trace if r["event"] == "step" and r["step"] == step)


def assert_resume_repeats_the_next_draw(
    trace_u: list[dict], trace_r: list[dict], saved_step: int, expect_replay: bool = False
) -> None:
    """The resumed run restored what the uninterrupted run held when it saved at ``saved_step`` (the state digest,
    leftover prompts and loader epoch it recorded at save time), and its next step drew what the uninterrupted
    run drew: the same replayed questions, fresh prompts and selected trajectories."""
    resumes = [r for r in trace_r if r["event"] == "resume"]
    assert [r["global_steps"] for r in resumes] == [saved_step], resumes
    (resume,) = resumes
    (saved,) = [r for r in trace_u if r["event"] == "save" and r["global_steps"] == saved_step]
    assert resume["state_digest"] == saved["state_digest"], "the restored state differs from the saved one"
    assert resume["leftover_rows"] == saved["leftover_rows"]
    assert resume["loader_epoch"] == saved["loader_epoch"]
    next_u, next_r = step_record(trace_u, saved_step + 1), step_record(trace_r, saved_step + 1)
    assert next_r["replay_question_ids"] == next_u["replay_question_ids"]
    if expect_replay:
        assert next_u["replay_question_ids"], f"step {saved_step + 1} replayed nothing: the check would be empty"
    assert next_r["fresh_rows"] == next_u["fresh_rows"]
    assert next_r["selected_entry_ids"] == next_u["selected_entry_ids"]


# metrics that measure the machine (time, memory) or float32 rounding itself, not the run's maths
NOT_REPRODUCIBLE = ("timing_s/", "timing_per_token_ms/", "perf/", "exgrpo/rollout_actor_log_prob_diff")


def assert_same_metrics(rows_a: list[dict], rows_b: list[dict], steps: list[int], rel_tol: float = 1e-4) -> None:
    """Two runs logged the same metrics at ``steps``: equal keys, every count, rate and accuracy equal, every
    float within ``rel_tol`` (the actor's float32 sums are not bit-identical from one process to the next: about
    1e-7 relative), except the figures of ``NOT_REPRODUCIBLE``."""
    by_step_a, by_step_b = ({int(r["step"]): r for r in rows} for rows in (rows_a, rows_b))
    for step in steps:
        a, b = by_step_a.get(step), by_step_b.get(step)
        assert a is not None and b is not None, f"step {step} is missing from one run's metrics"
        keys = {k for k in set(a) | set(b) if not any(part in k for part in NOT_REPRODUCIBLE) and "time" not in k}
        assert {k for k in keys if k not in a or k not in b} == set(), f"step {step}: keys logged by one run only"
        differ = []
        for key in sorted(keys):
            x, y = a[key], b[key]
            if isinstance(x, float) or isinstance(y, float):
                if not math.isclose(x, y, rel_tol=rel_tol, abs_tol=1e-6):
                    differ.append((key, x, y))
            elif x != y:
                differ.append((key, x, y))
        assert not differ, f"step {step}: {len(differ)} metrics differ between the runs: {differ[:10]}"
        exact = [k for k in keys if k.startswith(("val-core/", "exgrpo/pool/", "exgrpo/batch_pass_rate"))]
        for key in exact:  # what the samples decide is the same, not only close
            assert a[key] == b[key], (step, key, a[key], b[key])


#: rollout and actor compute the same log-probs when the rollout serves the updated weights (~1e-6 in float32);
#: one step at the learnability checks' learning rate moves them by ~1e-2
MAX_ROLLOUT_ACTOR_GAP = 1e-3


def assert_learned(steps: list[dict], metric: str, end_at_least: float, gain_at_least: float) -> None:
    """A run learned: ``metric`` (one value per step) rose from step 1 to the mean of the last three steps by at
    least ``gain_at_least``, to at least ``end_at_least``; every step's rollout served the updated weights (its
    log-probs agree with the actor's within :data:`MAX_ROLLOUT_ACTOR_GAP`) and had a gradient."""
    values = [m[metric] for m in steps]
    start, end = values[0], sum(values[-3:]) / 3
    curve = " ".join(f"{v:.2f}" for v in values)
    assert end >= end_at_least and end - start >= gain_at_least, (
        f"{metric} did not rise: step 1 {start:.3f}, last three steps {end:.3f} "
        f"(need >= {end_at_least} and >= +{gain_at_least}); per step: {curve}"
    )
    gaps = [m["exgrpo/rollout_actor_log_prob_diff_mean"] for m in steps]
    assert max(gaps) < MAX_ROLLOUT_ACTOR_GAP, f"rollout and actor log-probs disagree (stale weights?): {gaps}"
    assert all(m["actor/grad_norm"] > 0 for m in steps), [m["actor/grad_norm"] for m in steps]


def cpu_run_spec(assets, output_dir: Path, **kw) -> CpuRunSpec:
    """A :class:`CpuRunSpec` on the tiny model and toy data of ``assets``."""
    return CpuRunSpec(
        model_path=str(assets.model_path),
        train_files=str(assets.train_file),
        val_files=str(assets.val_file),
        output_dir=str(output_dir),
        **kw,
    )


# ------------------------------------------------------------------------------------------------ processes
def run_processes(ray_temp_dir: str) -> list[psutil.Process]:
    """Live processes of the run, wherever they are: Ray puts its private temp dir on their command lines."""
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        try:
            if ray_temp_dir in " ".join(proc.info["cmdline"] or []) and proc.status() != psutil.STATUS_ZOMBIE:
                found.append(proc)
        except psutil.Error:
            continue
    return found


def wait_none_left(ray_temp_dir: str, deadline_s: float = 60) -> list[psutil.Process]:
    """After the session was killed: wait (generously) until no process of the run is left; return survivors."""
    end = time.monotonic() + deadline_s
    while (left := run_processes(ray_temp_dir)) and time.monotonic() < end:
        time.sleep(0.5)
    return left


def ray_started(ray_temp_dir: str) -> bool:
    """Whether Ray started a node under ``ray_temp_dir`` (its session folder with the raylet's log exists)."""
    return any(Path(ray_temp_dir).glob("session_*/logs/raylet.out"))
