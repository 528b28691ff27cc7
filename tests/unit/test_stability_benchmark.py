"""benchmarks/stability_cpu.py's bookkeeping on hand-made verl metrics files: the runs it plans, the finished runs
it reuses without training, the per-run figures (collapse, the gradient signal over the replayed steps only) and
the per-seed pairing of the arms."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from tests.helpers.benchmarks import benchmark_module


@pytest.fixture(scope="module")
def bench():
    with benchmark_module("stability_cpu") as module:
        yield module


def _val(acc: dict[str, float]) -> dict[str, float]:
    return {f"val-core/toy_arithmetic_{lv}/acc/mean@1": v for lv, v in acc.items()}


def _train(pass_rate: float, replayed: int, zero_var_fresh: float, member_share: float | None = None) -> dict:
    row = {
        "exgrpo/batch_pass_rate": pass_rate,
        "exgrpo/sampled_pass_rate": pass_rate,
        "exgrpo/fresh_questions": 16 - replayed,
        "exgrpo/replayed_questions": replayed,
        "exgrpo/signal/zero_var_fresh_share": zero_var_fresh,
        "exgrpo/signal/zero_var_share": zero_var_fresh,
        "exgrpo/signal/nonzero_adv_row_share": 1 - zero_var_fresh,
        "actor/grad_norm": 0.5,
    }
    if member_share is not None:
        row["exgrpo/signal/replayed_member_adv_share"] = member_share
    return row


def write_run(bench, out: Path, regime: str, arm: str, seed: int, rows: list[tuple[int, dict]]) -> Path:
    run_dir = out / "runs" / regime / f"{arm}_seed{seed}"
    run_dir.mkdir(parents=True)
    with open(run_dir / "metrics.jsonl", "w") as f:
        for step, data in rows:
            f.write(json.dumps({"step": step, "data": data}) + "\n")
        f.write('{"step": 99, "data": {"torn')  # a run killed mid-write: the torn line is skipped
    (run_dir / "done.json").write_text(json.dumps({"wall_seconds": 100.0}))
    return run_dir


def collapsing_run(bench, out, arm="grpo", seed=1):
    # validation 0.3 -> 0.1 (below half the start: collapsed); every fresh group without variance at the end
    return write_run(
        bench,
        out,
        "lr1e-3",
        arm,
        seed,
        [
            (0, _val({"easy": 0.5, "medium": 0.3, "hard": 0.1})),
            (1, _train(0.2, 0, 0.5)),
            (2, {**_train(0.1, 0, 0.9), **_val({"easy": 0.2, "medium": 0.1, "hard": 0.0})}),
        ],
    )


def replaying_run(bench, out, seed=1):
    # replay from step 2: the replayed members' share counts only on the steps that replayed
    return write_run(
        bench,
        out,
        "lr1e-3",
        "exgrpo",
        seed,
        [
            (0, _val({"easy": 0.5, "medium": 0.3, "hard": 0.1})),
            (1, _train(0.2, 0, 0.5, member_share=0.0)),
            (2, {**_train(0.3, 8, 0.25, member_share=0.4), **_val({"easy": 0.5, "medium": 0.2, "hard": 0.05})}),
        ],
    )


def test_the_plan_runs_the_comparison_everywhere_and_the_ablations_in_their_regime(bench):
    pairs = bench.plan_runs(["main", "ablations"], None, None)
    assert [(r, a) for r, a in pairs if a in bench.COMPARISON] == [
        (r, a) for r in bench.REGIMES for a in bench.COMPARISON
    ]
    assert {r for r, a in pairs if a in bench.ABLATIONS} == {bench.ABLATION_REGIME}
    assert bench.plan_runs(["main"], [bench.ABLATION_REGIME], ["exgrpo"]) == [(bench.ABLATION_REGIME, "exgrpo")]
    # every ablation is an ExGRPO arm with exactly one switch on top of the regime
    for arm in bench.ABLATIONS:
        enable, overrides = bench.ARMS[arm]
        assert enable and len(overrides) == 1


def test_grpo_and_exgrpo_differ_only_in_exgrpo_enable(bench):
    for regime in bench.REGIMES:
        grpo, grpo_over = bench.run_settings(regime, "grpo")
        exgrpo, exgrpo_over = bench.run_settings(regime, "exgrpo")
        assert grpo_over == exgrpo_over
        assert {k: v for k, v in grpo.items() if k != "exgrpo_enable"} == {
            k: v for k, v in exgrpo.items() if k != "exgrpo_enable"
        }
        assert grpo["exgrpo_enable"] is False and exgrpo["exgrpo_enable"] is True


def test_a_finished_run_is_reused_without_training_and_an_unfinished_one_is_not_reported(bench, tmp_path):
    run_dir = collapsing_run(bench, tmp_path)
    # assets=None: the --report-only path, which never launches a run
    record = bench.run_one("lr1e-3", "grpo", 1, tmp_path, assets=None, fresh=False)
    assert record is not None and record.curve.val_acc == pytest.approx([0.3, 0.1])
    assert record.series["zero_var_fresh"] == {1: 0.5, 2: 0.9}
    csv_text = (run_dir / "run.csv").read_text().splitlines()
    assert csv_text[0].startswith("regime,arm,seed,kind,step,val_acc,val_easy,val_medium,val_hard")
    assert len(csv_text) == 1 + 2 + 2  # two validations, two training steps
    assert bench.run_one("lr1e-3", "exgrpo", 1, tmp_path, assets=None, fresh=False) is None


def test_run_figures_collapse_and_replayed_share_over_replayed_steps(bench, tmp_path):
    collapsing_run(bench, tmp_path)
    replaying_run(bench, tmp_path)
    grpo = bench.run_figures(bench.run_one("lr1e-3", "grpo", 1, tmp_path, None, False))
    exgrpo = bench.run_figures(bench.run_one("lr1e-3", "exgrpo", 1, tmp_path, None, False))
    assert grpo["collapsed"] == 1.0 and grpo["lowest"] == pytest.approx(0.1)
    assert grpo["zero_var_fresh_mean"] == pytest.approx(0.7)
    assert math.isnan(grpo["first_replay_step"]) and math.isnan(grpo["replayed_member_adv_share"])
    assert exgrpo["collapsed"] == 0.0  # 0.25 is not below half of 0.3
    assert exgrpo["final_hard"] == pytest.approx(0.05)
    assert exgrpo["first_replay_step"] == 2.0 and exgrpo["replayed_questions"] == 8
    assert exgrpo["replayed_member_adv_share"] == pytest.approx(0.4)  # step 1 (nothing replayed) left out


def test_paired_table_pairs_the_arms_by_seed(bench, tmp_path):
    collapsing_run(bench, tmp_path, seed=1)
    replaying_run(bench, tmp_path, seed=1)
    replaying_run(bench, tmp_path, seed=2)  # no grpo run of seed 2: not paired
    records = [bench.run_one("lr1e-3", a, s, tmp_path, None, False) for a, s in (("grpo", 1), ("exgrpo", 1))]
    records.append(bench.run_one("lr1e-3", "exgrpo", 2, tmp_path, None, False))
    table = bench.paired_table(records)
    row = next(line for line in table.splitlines() if "| exgrpo |" in line)
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[2] == "1"  # one seed paired
    assert cells[3] == "15.0 ± 0.0"  # final 0.25 vs 0.1
    assert cells[5] == "1/1"
