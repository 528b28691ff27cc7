"""The curve/table writer of the CPU demo and benchmarks/learning_cpu.py, on hand-made verl metrics files."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import pytest

from recipe.exgrpo.harness.learning_curves import (
    RunCurve,
    area_under_curve,
    describe_run,
    level_name,
    level_table,
    markdown_table,
    paired_table,
    plot_arms,
    plot_levels,
    plot_run,
    read_metrics_file,
    replay_table,
    run_curve,
    steps_to_target,
    summarize_arms,
    validation_by_source,
    write_csv,
)

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _val(step: int, easy: float, hard: float) -> dict:
    return {
        "val-core/toy_arithmetic_easy/acc/mean@1": easy,
        "val-core/toy_arithmetic_hard/acc/mean@1": hard,
        # verl also logs aux figures and other variables: ignored
        "val-aux/toy_arithmetic_easy/acc/std@1": 0.5,
        "val-aux/toy_arithmetic_easy/score/mean@1": 0.0,
        "val-core/toy_arithmetic_hard/reward/mean@1": 0.0,
        "step": step,
    }


def _train(step: int, sampled: float, replayed: int, pool: int) -> dict:
    return {
        "exgrpo/batch_pass_rate": sampled + 0.01 * replayed,
        "exgrpo/sampled_pass_rate": sampled,
        "exgrpo/fresh_questions": 4 - replayed,
        "exgrpo/replayed_questions": replayed,
        "exgrpo/pool/entries": pool,
        "exgrpo/pool/questions": pool // 2,
        "exgrpo/pool/retired": step,
        "timing_s/step": 2.0,
    }


def write_metrics(path: Path, final_easy: float, final_hard: float, replay: bool) -> Path:
    """A metrics.jsonl as verl's file logger writes it: validation at step 0 on its own line, steps 1..4, the
    validation of steps 2 and 4 merged into those steps' lines, and one truncated last line."""
    lines = [{"step": 0, "data": _val(0, 0.5, 0.1)}]
    for step in range(1, 5):
        data = _train(step, sampled=0.4 + 0.1 * step, replayed=(2 if replay and step > 1 else 0), pool=10 * step)
        if step == 2:
            data.update(_val(2, 0.6, 0.2))
        if step == 4:
            data.update(_val(4, final_easy, final_hard))
        lines.append({"step": step, "data": data})
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(json.dumps(x) for x in lines) + '\n{"step": 5, "data": {"exgr')
    return path


def test_run_curve_reads_training_and_validation_points(tmp_path):
    rows = read_metrics_file(write_metrics(tmp_path / "metrics.jsonl", 0.9, 0.3, replay=True))
    assert [r["step"] for r in rows] == [0, 1, 2, 3, 4]  # the truncated line is skipped
    curve = run_curve(rows, "x", group_size=8)
    assert curve.steps == [1, 2, 3, 4]
    assert curve.sampled_pass_rate == pytest.approx([0.5, 0.6, 0.7, 0.8])
    assert curve.val_steps == [0, 2, 4]
    assert curve.val_by_level == {"easy": [0.5, 0.6, 0.9], "hard": [0.1, 0.2, 0.3]}
    assert curve.val_acc == pytest.approx([0.3, 0.4, 0.6])  # equal weights per level
    assert curve.replayed_share == [0.0, 0.5, 0.5, 0.5]
    # K per fresh question, K-1 per replayed one: 32, then 2*8 + 2*7 = 30 per step
    assert curve.generated_rollouts == [32, 62, 92, 122]
    assert curve.pool_entries == [10, 20, 30, 40]


def test_think_closed_share_is_read_per_validation():
    rows = [
        {
            **_val(0, 0.5, 0.1),
            "val-aux/toy_arithmetic_easy/think_closed/mean@1": 0.4,
            "val-aux/toy_arithmetic_hard/think_closed/mean@1": 0.6,
        },
        {
            **_val(5, 0.7, 0.2),
            "val-aux/toy_arithmetic_easy/think_closed/mean@1": 1.0,
            "val-aux/toy_arithmetic_hard/think_closed/mean@1": 0.9,
        },
    ]
    curve = run_curve(rows)
    assert curve.val_think_closed == pytest.approx([0.5, 0.95])
    assert "answers that close the think block: 0.500 -> 0.950" in describe_run(curve)


def test_weighted_overall_accuracy():
    rows = [_val(0, 1.0, 0.0)]
    assert run_curve(rows, level_weights={"easy": 3, "hard": 1}).val_acc == [0.75]


def test_validation_prefers_acc_then_reward():
    row = {"val-core/a/reward/mean@4": 0.2, "val-core/b/acc/mean@4": 0.7, "val-core/b/reward/mean@4": 0.1}
    assert validation_by_source(row) == {"a": 0.2, "b": 0.7}


def test_auc_and_steps_to_target():
    assert area_under_curve([0, 10, 20], [0.0, 1.0, 1.0]) == pytest.approx(0.75)
    assert area_under_curve([0], [0.4]) == 0.4
    assert steps_to_target([0, 5, 10], [0.3, 0.61, 0.7], 0.6) == 5
    assert steps_to_target([0, 5], [0.3, 0.5], 0.6) is None


def _arms(tmp_path: Path) -> dict:
    runs = {}
    for arm, finals in (("grpo", (0.8, 0.7)), ("exgrpo", (0.9, 1.0))):
        runs[arm] = []
        for seed, final in zip((1, 2), finals):
            path = write_metrics(tmp_path / f"{arm}{seed}.jsonl", final, 0.3, replay=arm == "exgrpo")
            runs[arm].append(
                (seed, run_curve(read_metrics_file(path), f"{arm} {seed}", wall_seconds=100.0 + seed, group_size=8))
            )
    return runs


def test_summary_table_and_csv(tmp_path):
    runs = _arms(tmp_path)
    summaries = summarize_arms({a: [c for _, c in r] for a, r in runs.items()}, target=0.55)
    grpo, exgrpo = summaries
    # final overall = (easy + 0.3) / 2 per seed
    assert grpo.final[0] == pytest.approx(((0.8 + 0.3) / 2 + (0.7 + 0.3) / 2) / 2)
    assert grpo.final[1] == pytest.approx(0.05 / math.sqrt(2))  # sample std of 0.55 and 0.5
    assert exgrpo.best[0] == pytest.approx(((0.9 + 0.3) / 2 + (1.0 + 0.3) / 2) / 2)
    assert grpo.steps_to_target == [4, None] and exgrpo.steps_to_target == [4, 4]
    assert exgrpo.final_by_level["hard"] == (pytest.approx(0.3), pytest.approx(0.0))
    assert grpo.generated_rollouts[0] == 128 and exgrpo.generated_rollouts[0] == 122
    assert grpo.wall_seconds[0] == pytest.approx(101.5)

    table = markdown_table(summaries, target=0.55)
    lines = table.strip().splitlines()
    assert lines[0].startswith("| arm | seeds | start | final | best | AUC | steps to 0.55 |")
    assert "final easy" in lines[0] and "final hard" in lines[0]
    assert lines[2].startswith("| grpo | 2 | 0.300 ± 0.000 | 0.525 ± 0.035 |")
    assert "| 4, — |" in lines[2] and "| 4, 4 |" in lines[3]

    path = write_csv(runs, tmp_path / "out" / "points.csv")
    rows = list(csv.DictReader(path.open()))
    val = [r for r in rows if r["kind"] == "val" and r["arm"] == "exgrpo" and r["seed"] == "2"]
    assert [(int(r["step"]), float(r["val_acc"])) for r in val] == [(0, 0.3), (2, 0.4), (4, pytest.approx(0.65))]
    train = [r for r in rows if r["kind"] == "train" and r["arm"] == "grpo" and r["seed"] == "1"]
    assert [float(r["generated_rollouts"]) for r in train] == [32, 64, 96, 128]
    levels = {r["level"] for r in rows if r["kind"] == "val_level"}
    assert levels == {"easy", "hard"}


def test_pngs_are_written(tmp_path):
    runs = _arms(tmp_path)
    png = plot_arms({a: [c for _, c in r] for a, r in runs.items()}, tmp_path / "arms.png", title="t")
    assert png.read_bytes()[:8] == PNG_MAGIC
    one = plot_run(runs["exgrpo"][0][1], tmp_path / "sub" / "run.png")
    assert one.read_bytes()[:8] == PNG_MAGIC and one.stat().st_size > 10_000


def test_describe_run_names_start_and_end():
    curve = run_curve([_val(0, 0.5, 0.1), {**_train(1, 0.5, 0, 3), "step": 1}, _val(1, 0.7, 0.3)], group_size=4)
    text = describe_run(curve)
    assert "0.300 -> 0.500 (+20.0 points)" in text
    assert "easy     0.500 -> 0.700" in text
    assert "pool: 3 trajectories" in text


def test_the_demo_follows_the_metrics_file_line_by_line(tmp_path):
    import threading

    from recipe.exgrpo.harness.demo import _follow_metrics

    path = tmp_path / "metrics.jsonl"
    seen: list[dict] = []
    stop = threading.Event()
    follower = threading.Thread(target=_follow_metrics, args=(path, stop, seen.append))
    follower.start()
    with open(path, "w") as f:
        f.write('{"step": 1, "data": {"exgrpo/batch_pass_rate": 0.25}}\n')
        f.flush()
        f.write('{"step": 2, "data": {"exgrpo/batch_')  # a line still being written
        f.flush()
        f.write('pass_rate": 0.5}}\nnot json\n\n{"step": 3, "data": {}}\n')
    import time

    deadline = time.monotonic() + 10
    while len(seen) < 3 and time.monotonic() < deadline:
        time.sleep(0.05)
    stop.set()
    follower.join(timeout=10)
    assert not follower.is_alive()
    assert seen == [
        {"exgrpo/batch_pass_rate": 0.25, "step": 1},
        {"exgrpo/batch_pass_rate": 0.5, "step": 2},
        {"step": 3},
    ]


def test_a_named_validation_variable_is_read_from_core_or_aux():
    from recipe.exgrpo.harness.learning_curves import run_curve, validation_by_source

    row = {
        "step": 10,
        "val-core/toy_arithmetic_easy/acc/mean@1": 0.5,
        "val-aux/toy_arithmetic_easy/reward/mean@1": 0.8,
        "val-aux/toy_arithmetic_hard/reward/mean@1": 0.6,
    }
    assert validation_by_source(row) == {"toy_arithmetic_easy": 0.5}  # acc, from val-core, as before
    assert validation_by_source(row, "reward") == {"toy_arithmetic_easy": 0.8, "toy_arithmetic_hard": 0.6}
    train = {"step": 1, "exgrpo/batch_pass_rate": 0.1, "exgrpo/reward/mean": 0.7}
    curve = run_curve([train, row], val_var="reward", reward_mode="continuous")
    assert curve.val_acc == [0.7] and curve.signal == [0.7] and curve.levels == ["easy", "hard"]
    assert curve.signal_label == "mean reward of the sampled responses"
    # the binary mode's signal is the sampled pass rate, absent from this row
    assert run_curve([train, row], val_var="reward").signal == []


def _tool_val(step: int, calls: dict[str, float]) -> dict:
    """A validation row of a tool run: accuracy 0.5 and the given call rate per level."""
    row = {"step": step}
    for lv, rate in calls.items():
        row[f"val-core/toy_arithmetic_{lv}/acc/mean@1"] = 0.5
        row[f"val-aux/toy_arithmetic_{lv}/tool_call/mean@1"] = rate
    return row


def test_tool_calls_are_read_per_level_and_per_step(tmp_path):
    rows = [
        _tool_val(0, {"hard": 0.2, "easy": 0.3}),
        {"step": 1, "exgrpo/batch_pass_rate": 0.5, "exgrpo/multi_turn/tool_turn_share": 0.25},
        {
            "step": 2,
            "exgrpo/batch_pass_rate": 0.6,
            "exgrpo/multi_turn/tool_turn_share": 0.5,
            "exgrpo/multi_turn/replayed_tool_turn_share": 0.75,
        },
        _tool_val(2, {"hard": 0.9, "easy": 0.4}),
    ]
    curve = run_curve(rows)
    assert curve.val_tool_call_by_level == {"easy": [0.3, 0.4], "hard": [0.2, 0.9]}  # in difficulty order
    assert curve.val_tool_call == pytest.approx([0.25, 0.65])
    assert curve.tool_turn_share == [0.25, 0.5]
    assert math.isnan(curve.replayed_tool_turn_share[0]) and curve.replayed_tool_turn_share[1] == 0.75
    text = describe_run(curve)
    assert "validation answers that call the calculator: 0.250 -> 0.650" in text and "hard     0.200 -> 0.900" in text
    assert plot_run(curve, tmp_path / "tools.png").read_bytes().startswith(PNG_MAGIC)
    # a one-turn run has none of it
    plain = run_curve([{"step": 0, "val-core/toy_arithmetic_easy/acc/mean@1": 0.5}])
    assert plain.val_tool_call == [] and "calculator" not in describe_run(plain)


def _drawn(monkeypatch, curve, tmp_path) -> list:
    """The axes ``plot_run`` draws (the figure caught before it is saved)."""
    from recipe.exgrpo.harness import learning_curves

    figures = []
    original = learning_curves.save_figure
    monkeypatch.setattr(learning_curves, "save_figure", lambda fig, path: figures.append(fig) or original(fig, path))
    plot_run(curve, tmp_path / "run.png")
    (fig,) = figures
    return [ax for ax in fig.axes]


def _lines(ax) -> dict[str, object]:
    return {line.get_label(): line for line in ax.get_lines()}


def test_the_run_figure_draws_what_the_run_has(tmp_path, monkeypatch):
    # a short run: whole steps on the step axis, whole numbers on the pool's (no 6.5 or 1.25)
    rows = [_val(0, 0.5, 0.1), *({**_train(s, 0.4, 0, 3 * s), "step": s} for s in (1, 2, 3)), _val(3, 0.6, 0.2)]
    top, bottom, share = _drawn(monkeypatch, run_curve(rows, group_size=4), tmp_path)
    for axis in (bottom.xaxis, bottom.yaxis):
        ticks = [t for t in axis.get_majorticklocs() if axis.get_view_interval()[0] <= t <= axis.get_view_interval()[1]]
        assert ticks and all(float(t).is_integer() for t in ticks), ticks
    # on-policy GRPO keeps no pool: no empty pool panel
    onpolicy = [_val(0, 0.5, 0.1), *({**_train(s, 0.4, 0, 0), "step": s} for s in (1, 2, 3))]
    (only,) = _drawn(monkeypatch, run_curve(onpolicy, group_size=4), tmp_path)
    assert "batch pass rate (sampled responses)" in _lines(only)
    # the continuous reward mode: the batch's mean reward is drawn, not (only) printed
    continuous = [{**r, "exgrpo/reward/mean": 0.7} for r in rows]
    top = _drawn(monkeypatch, run_curve(continuous, group_size=4, reward_mode="continuous"), tmp_path)[0]
    drawn = _lines(top)["batch: mean reward of the sampled responses"]
    assert list(drawn.get_ydata()) == [0.7, 0.7, 0.7]
    assert "batch pass rate (sampled responses)" not in _lines(top)


def test_the_tool_runs_call_rates_get_their_own_panel_one_colour_per_level(tmp_path, monkeypatch):
    levels = {"easy": 0.3, "medium": 0.2, "hard": 0.1}
    rows = [_tool_val(0, levels), *({**_train(s, 0.5, 2, 3 * s), "step": s} for s in (1, 2))]
    rows[1]["exgrpo/multi_turn/tool_turn_share"] = rows[2]["exgrpo/multi_turn/tool_turn_share"] = 0.4
    rows.append(_tool_val(2, {lv: 2 * r for lv, r in levels.items()}))
    top, calls, _pool, _share = _drawn(monkeypatch, run_curve(rows, group_size=4), tmp_path)
    assert not any("call" in label for label in _lines(top))  # the accuracy panel keeps its six entries at most
    lines = _lines(calls)
    assert set(lines) == {
        "validation: calls the calculator",
        "calls: easy",
        "calls: medium",
        "calls: hard",
        "batch: tool answered",
    }
    per_level = [lines[f"calls: {lv}"] for lv in levels]
    assert len({line.get_color() for line in per_level}) == 3  # told apart (they shared one colour)
    for lv in levels:  # each level's colour is its accuracy line's
        assert lines[f"calls: {lv}"].get_color() == _lines(top)[f"validation: {lv}"].get_color()


def test_the_procedure_tasks_levels_and_the_signal_and_replay_tables(tmp_path):
    """The procedure-choice task's data sources name their levels; the per-level table gives start, final, gain and
    AUC per arm; the replay table gives the non-zero-advantage share (1 - zero_var_share), replay and pool figures."""
    curves = {}
    for arm, gain in (("grpo", 0.2), ("exgrpo", 0.4)):
        curves[arm] = []
        for seed in (1, 2):
            rows = [
                {"step": 0, "val-core/procedures_medium/acc/mean@1": 0.1, "val-core/procedures_easy/acc/mean@1": 0.9}
            ]
            for step in (1, 2):
                row = _train(step, sampled=0.3, replayed=2 if arm == "exgrpo" else 0, pool=10 * step)
                row.update({"step": step, "exgrpo/signal/zero_var_share": 0.5 - 0.1 * step * seed})
                row.update({"exgrpo/pool/bucket_1": float(step), "exgrpo/pool/bucket_7": 2.0 * seed})
                rows.append(row)
            rows[-1]["val-core/procedures_medium/acc/mean@1"] = 0.1 + gain * seed
            rows[-1]["val-core/procedures_easy/acc/mean@1"] = 0.9
            curves[arm].append(run_curve(rows, f"{arm} {seed}", group_size=8))
    c = curves["grpo"][0]
    assert c.levels == ["easy", "medium"] and c.nonzero_group_share == [pytest.approx(0.6), pytest.approx(0.7)]
    assert c.final_buckets == {1: 2.0, 7: 2.0}

    table = level_table(curves).strip().splitlines()
    assert table[0] == "| arm | level | start | final | gain | AUC |"
    # exgrpo medium: gains 0.4 and 0.8 -> 0.600 ± 0.283; AUC = the mean of the two points, (0.1 + final) / 2
    assert "| exgrpo | medium | 0.100 ± 0.000 | 0.700 ± 0.283 | 0.600 ± 0.283 | 0.400 ± 0.141 |" in table
    assert "| grpo | easy | 0.900 ± 0.000 | 0.900 ± 0.000 | 0.000 ± 0.000 |" in table[2]

    replay = replay_table(curves, early_steps=1).strip().splitlines()
    assert "non-zero-advantage groups" in replay[0] and "pool by k (end)" in replay[0]
    # seed 1: 0.6, 0.7 (mean 0.65); seed 2: 0.7, 0.9 (mean 0.8); first step 0.6 / 0.7; last 0.7 / 0.9
    grpo = replay[2].split(" | ")
    assert grpo[1:4] == ["0.725 ± 0.106", "0.650 ± 0.071", "0.800 ± 0.141"]
    assert grpo[4] == "0.000 ± 0.000" and replay[3].split(" | ")[4] == "0.500 ± 0.000"  # 2 of 4 questions replayed
    assert replay[3].rstrip(" |").endswith("1: 2.0 / 7: 3.0")

    png = plot_levels(curves, tmp_path / "levels.png", title="t")
    assert png.read_bytes()[:8] == PNG_MAGIC


def test_a_level_keeps_a_source_name_it_does_not_know():
    assert level_name("toy_arithmetic_hard") == "hard" and level_name("procedures_easy") == "easy"
    assert level_name("gsm8k") == "gsm8k" and level_name("procedures_") == "procedures_"


def test_the_paired_table_differences_per_seed_against_the_baseline():
    """Each arm minus the baseline's run of the same seed, in points (final and AUC), over the seeds both ran; a seed
    the baseline lacks is left out; no baseline run, no table."""

    def curve(final):
        return RunCurve("c", val_steps=[0, 10], val_acc=[0.2, final])

    seeded = {
        "exgrpo": [(1, curve(0.50)), (2, curve(0.60)), (3, curve(0.70))],
        "ablation": [(1, curve(0.55)), (2, curve(0.58)), (4, curve(0.99))],  # seed 4: exgrpo did not run it
    }
    table = paired_table(seeded, "exgrpo").strip().splitlines()
    assert table[0] == "| arm − exgrpo | seeds paired | final (points) | AUC (points) | seeds ahead at the end |"
    assert len(table) == 3  # the baseline has no row of its own
    # differences +5 and -2 points: mean 1.5, sample std 4.95; the AUC (the mean of two points) moves by half as much
    assert table[2] == "| ablation | 2 | 1.5 ± 4.9 | 0.8 ± 2.5 | 1/2 |"
    assert paired_table(seeded, "grpo") == ""
