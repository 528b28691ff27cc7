"""The CPU demo as a command (``python -m recipe.exgrpo.cpu_demo``), with the trainer replaced by a stand-in that runs
in a second (``tests/helpers/fake_demo.py``, ``fake_trainer.py``): each stop signal ends the training with one line,
one folder holds one run, a resume keeps the history and says what it restores, bad counts stop before anything
starts, the header shows the overrides, and the delayed start is said at start-up, when it passes and in the
summary. tests/e2e/test_sigterm_cpu.py stops a real run."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from recipe.exgrpo.harness import demo
from recipe.exgrpo.harness.procs import RunResult
from tests.helpers.fake_demo import stand_in
from tests.helpers.jsonl import read_jsonl

STOP_SIGNALS = [signal.SIGTERM, signal.SIGHUP, signal.SIGINT]


def _fake_demo(repo_root: Path, *args: str, env: dict | None = None, **popen) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "tests.helpers.fake_demo", *args],
        cwd=repo_root,
        env={**os.environ, **(env or {})},
        start_new_session=True,  # so that nothing of it outlives the test
        **popen,
    )


@pytest.fixture
def run_demo(tmp_path, monkeypatch, capsys):
    """The demo in this process, on the stand-in trainer: ``run_demo(*args)`` -> (exit status, stdout, stderr)."""
    folder = tmp_path / "stand-in"
    folder.mkdir()
    stand_in(folder, monkeypatch.setattr, monkeypatch.setitem)

    def run(*args: str) -> subprocess.CompletedProcess:
        capsys.readouterr()
        rc = demo.main(list(args))
        out, err = capsys.readouterr()
        return subprocess.CompletedProcess(args, rc, out, err)

    return run


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


@pytest.mark.parametrize("signum", STOP_SIGNALS, ids=[s.name for s in STOP_SIGNALS])
def test_each_stop_signal_ends_the_training_with_one_line(signum, repo_root, tmp_path):
    pids_file = tmp_path / "pids"
    out, err = tmp_path / "stdout", tmp_path / "stderr"
    with out.open("w") as o, err.open("w") as e:
        demo_proc = _fake_demo(
            repo_root,
            "--steps",
            "2",
            "--out",
            str(tmp_path / "run"),
            env={"FAKE_TRAINER_HANG": str(pids_file)},
            stdout=o,
            stderr=e,
        )
    pids: list[int] = []
    try:
        deadline = time.monotonic() + 120  # a backstop: the stand-in is up within seconds
        while not pids_file.exists() and demo_proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        assert pids_file.exists(), f"the stand-in trainer never started: {err.read_text()[-2000:]}"
        pids = json.loads(pids_file.read_text())  # the trainer, its "Ray cluster" and that one's child
        demo_proc.send_signal(signum)
        returncode = demo_proc.wait(timeout=120)
        printed = out.read_text() + err.read_text()
        assert returncode == 128 + signum, (returncode, printed[-3000:])
        assert err.read_text().splitlines() == [
            f"[demo] {signum.name}: stopped the run and its 3 processes (the trainer, its Ray cluster); exiting"
        ], printed[-3000:]
        assert "Traceback" not in printed
        # the trainer was asked first (the real one stops its Ray cluster itself), then the rest of its session
        assert (tmp_path / "pids.stopped").read_text() == "SIGTERM"
        assert [p for p in pids if _alive(p)] == []
    finally:
        if demo_proc.poll() is None:
            os.killpg(demo_proc.pid, signal.SIGKILL)
        for pid in pids:
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)


def test_one_run_per_folder_and_a_resume_keeps_its_history(run_demo, tmp_path):
    out = tmp_path / "run"
    first = run_demo("--steps", "3", "--out", str(out))
    assert first.returncode == 0, first.stderr[-3000:]
    # a fresh run into the used folder moves the earlier run aside, whole: its metrics, log and checkpoints
    second = run_demo("--steps", "5", "--save-freq", "2", "--seed", "3", "--out", str(out))
    assert second.returncode == 0, second.stderr[-3000:]
    assert f"[demo] {out} held an earlier run: moved to {out}.old-1 (--resume continues a run instead)" in second.stdout
    assert [r["step"] for r in read_jsonl(tmp_path / "run.old-1" / "metrics.jsonl")] == [0, 1, 2, 3]
    assert [r["step"] for r in read_jsonl(out / "metrics.jsonl")] == [0, 1, 2, 3, 4, 5]
    assert not (tmp_path / "run.old-1" / "checkpoints").exists() and (out / "checkpoints" / "global_step_4").is_dir()

    # a resume must be the same run: what differs is named, before anything starts
    other = run_demo("--steps", "7", "--save-freq", "2", "--out", str(out), "--resume")
    assert other.returncode == 2 and other.stderr.strip() == (
        f"[demo] --resume: the run in {out} was started with --seed 3, this command gives --seed 0"
    )
    empty = run_demo("--resume", "--out", str(tmp_path / "nothing"))
    assert empty.returncode == 2 and "holds no run to continue" in empty.stderr

    resumed = run_demo("--steps", "7", "--save-freq", "2", "--seed", "3", "--out", str(out), "--resume")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"[demo] resuming from the checkpoint of step 4 ({out / 'checkpoints' / 'global_step_4'})" in resumed.stdout
    assert "[demo] its metrics of steps 0-4 are kept; the resumed steps are added to them" in resumed.stdout
    assert (
        "[demo] steps 5-5 ran after that checkpoint: they run again (their earlier metrics dropped)" in resumed.stdout
    )
    rows = read_jsonl(out / "metrics.jsonl")
    assert [r["step"] for r in rows] == list(range(8))  # the whole run, one record per step
    by_step = {r["step"]: r["data"] for r in rows}
    assert [by_step[s].get("resumed_from") for s in range(1, 8)] == [0, 0, 0, 0, 4, 4, 4]  # step 5 is the resume's
    # step 4: its training figures from before, the validation verl runs when it resumes there
    assert by_step[4]["resumed_from"] == 0 and "val-core/toy_arithmetic_easy/acc/mean@1" in by_step[4]
    assert "validation accuracy: step 0: 0.500, step 4: 0.500" in resumed.stdout  # the summary covers the whole run
    assert not (out / demo.METRICS_BEFORE_RESUME).exists()


def test_bad_counts_stop_before_anything_starts(monkeypatch, capsys, tmp_path):
    for argv, message in (
        (["--steps", "0"], "argument --steps: must be >= 1, got 0"),
        (["--steps", "-2"], "argument --steps: must be >= 1, got -2"),
        (["--test-freq", "-3"], "argument --test-freq: must be >= 0 (0: no validation), got -3"),
        (["--save-freq", "0"], "argument --save-freq: must be -1 (no checkpoints) or >= 1 (every N steps), got 0"),
        (["--wall-limit", "0"], "argument --wall-limit: must be > 0 seconds, got 0"),
    ):
        with pytest.raises(SystemExit) as exc:
            demo.main(argv)
        assert exc.value.code == 2 and message in capsys.readouterr().err, argv

    from recipe.exgrpo.harness import assets

    monkeypatch.setattr(assets, "ensure_assets", lambda *a, **k: pytest.fail("the assets were built"))
    monkeypatch.setattr(demo, "override_problems", lambda run: pytest.fail("the override check ran"))
    rc = demo.main(["--out", str(tmp_path / "o"), "trainer.total_training_steps=0"])
    assert rc == 2
    assert capsys.readouterr().err.strip() == (
        "[demo] 0 training steps (--steps or trainer.total_training_steps): at least 1"
    )


def test_the_header_shows_the_overrides(monkeypatch, capsys, tmp_path):
    from types import SimpleNamespace

    from recipe.exgrpo.harness import assets

    placeholders = SimpleNamespace(
        report={"pass_rate": 0.4}, root=tmp_path, model_path="m", train_file="t", val_file="v"
    )
    monkeypatch.setattr(assets, "ensure_assets", lambda *a, **k: placeholders)
    monkeypatch.setattr(demo, "override_problems", lambda run: [])
    launched = []

    def launch(run, *a, **k):
        launched.append(run)
        return RunResult(0, False, 1.0, 0, tmp_path / "o" / "train.log")

    monkeypatch.setattr(demo, "launch", launch)
    overrides = [
        "actor_rollout_ref.rollout.n=3",
        "trainer.total_training_steps=12",
        "exgrpo.delayed_start_threshold=0.5",
    ]
    assert demo.main(["--out", str(tmp_path / "o"), "--test-freq", "4", *overrides]) == 0
    printed = capsys.readouterr().out
    assert "[demo] ExGRPO: 12 steps of 16 questions x K = 3, lr 0.0002, validation every 4 steps" in printed
    assert "no replay until a step's batch pass rate is above 0.5 (exgrpo.delayed_start_threshold)" in printed
    assert "The warmed-up model passes 0.40, below it: replay waits until training lifts it" in printed
    (run,) = launched
    assert (run.rollout_n, run.steps, run.delayed_start_threshold) == (3, 12, 0.5) and run.extra_overrides == []
    # what the trainer gets is the same: one value of each key
    given = demo.build_overrides(run, "m", "t", "v")
    assert given.count("actor_rollout_ref.rollout.n=3") == 1 and not any(o.endswith(".n=8") for o in given)


def _row(step: int, pass_rate: float, mixed: bool, replayed: int = 0) -> dict:
    return {
        "step": step,
        "exgrpo/batch_pass_rate": pass_rate,
        "exgrpo/mixed": float(mixed),
        "exgrpo/replayed_questions": replayed,
        "exgrpo/fresh_questions": 16 - replayed,
    }


def test_the_delayed_start_is_said_when_it_passes_and_in_the_summary():
    run = demo.demo_run(".")
    schedule = demo.replay_schedule(run)
    lines: list[str] = []
    printer = demo.StepPrinter(60, schedule, write=lines.append)
    rows = [_row(1, 0.2, False), _row(2, 0.37, False), _row(3, 0.3, True, 8), _row(4, 0.4, True, 8)]
    for r in rows:
        printer(r)
    switch = [line for line in lines if "replay starts" in line]
    assert switch == [
        "[demo] step 3: replay starts (step 2's batch pass rate 0.370 > 0.35)\n"
        "[demo] step   3/60  pass rate 0.300  pool    0 traj /   0 q  retired   0  replayed  8/16  nan s"
    ]
    assert demo.replay_summary(rows, schedule) == (
        "replay: on from step 3 to 4, questions replayed at 2 of 4 steps (the delayed start waited for a batch pass "
        "rate above 0.35, exgrpo.delayed_start_threshold)"
    )
    never = [_row(1, 0.2, False), _row(2, 0.31, False), _row(3, 0.25, False)]
    assert demo.replay_summary(never, schedule) == (
        "replay: none: no step's batch pass rate passed tau = 0.35 (the highest 0.310, step 2); a lower "
        "exgrpo.delayed_start_threshold starts it sooner (a negative one from step 2)"
    )
    assert demo.replay_schedule(demo.demo_run(".", exgrpo_enable=False)) is None  # on-policy: nothing to say
    assert demo.delayed_start_line(demo.replay_schedule(demo.demo_run(".", delayed_start_threshold=-1.0))) == (
        "no delayed start: replay from step 2 (step 1 fills the pool); replay then fills 0.5 of each batch "
        "(exgrpo.replay_ratio)"
    )


def test_a_resume_interrupted_before_its_merge_keeps_the_history_for_the_next(tmp_path):
    def write(name: str, steps: list[int], tag: str) -> None:
        (tmp_path / name).write_text("".join(json.dumps({"step": s, "data": {"by": tag}}) + "\n" for s in steps))

    write("metrics.jsonl", [0, 1, 2, 3, 4, 5], "first")
    assert demo.keep_history(tmp_path, 4) == {"kept": [0, 1, 2, 3, 4], "dropped": [5]}
    write("metrics.jsonl", [4, 5, 6], "second")  # the resumed run, stopped before the demo merged (SIGKILL)
    assert demo.keep_history(tmp_path, 6) == {"kept": [0, 1, 2, 3, 4, 5, 6], "dropped": []}
    write("metrics.jsonl", [6, 7], "third")
    demo.merge_metrics(tmp_path)
    merged = read_jsonl(tmp_path / "metrics.jsonl")
    assert [(r["step"], r["data"]["by"]) for r in merged] == [
        (0, "first"), (1, "first"), (2, "first"), (3, "first"), (4, "second"), (5, "second"), (6, "third"),
        (7, "third"),
    ]  # fmt: skip
