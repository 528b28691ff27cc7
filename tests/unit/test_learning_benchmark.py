"""benchmarks/learning_cpu.py's bookkeeping on hand-made run folders: ``--report-only`` reads a finished run and
leaves out one that is not finished, or was finished for another task, without launching anything."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.helpers.benchmarks import benchmark_module


@pytest.fixture(scope="module")
def bench():
    with benchmark_module("learning_cpu") as module:
        yield module


def _finished(out: Path, arm: str, seed: int, **recorded) -> Path:
    run = out / "runs" / f"{arm}_seed{seed}"
    run.mkdir(parents=True)
    rows = [{"step": 0, "val-core/procedures_easy/acc/mean@1": 0.5}, {"step": 1, "exgrpo/batch_pass_rate": 0.4}]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (run / "done.json").write_text(json.dumps({"wall_seconds": 12.0, **recorded}))
    return run


def test_report_only_reads_finished_runs_and_launches_nothing(bench, tmp_path, monkeypatch):
    from recipe.exgrpo.harness import demo

    def no_launch(*args, **kwargs):
        raise AssertionError("a run was launched")

    monkeypatch.setattr(demo, "launch", no_launch)
    _finished(tmp_path, "grpo", 1, task="procedures")
    _finished(tmp_path, "exgrpo", 1, task="sums")  # finished, but for the other task
    args = dict(out=tmp_path, assets=None, fresh=False, task="procedures", report_only=True)
    assert bench.run_one("exgrpo", 1, **args) is None
    assert bench.run_one("grpo", 2, **args) is None  # never ran
    res = bench.run_one("grpo", 1, **args)
    assert res["wall_seconds"] == 12.0 and res["rows"][0]["val-core/procedures_easy/acc/mean@1"] == 0.5
    with pytest.raises(AssertionError, match="launched"):  # without --report-only the unfinished one would run
        bench.run_one("grpo", 2, **{**args, "report_only": False})
