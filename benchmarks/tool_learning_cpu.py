"""ExGRPO vs on-policy GRPO on the calculator task (the CPU tool demo), several seeds per arm, paired by seed.

    python benchmarks/tool_learning_cpu.py [--out outputs/tool_learning_cpu] [--seeds 1,2,3] [--steps 40]
    python benchmarks/tool_learning_cpu.py --call-share 0.05 --out outputs/tool_learning_cpu_rare

The protocol is fixed here, before running (module constants below): both arms run the CPU tool demo
(``python -m recipe.exgrpo.cpu_demo --tools``: the demo's settings, verl's tool agent loop with the calculator, the
tiny model taught the call in its warm-up, recipe/exgrpo/harness/tool_task.py) with the same seeds; the only difference
is ``exgrpo.enable`` (on-policy GRPO = false, through the same trainer). Seed s of one arm and seed s of the other
start from the same model, data order and validation sampling, so the comparison is paired: the table gives each
seed's difference and their mean ± std.

What the paper's mechanism predicts here: early on, successful calls on hard questions are rare (the warmed-up model
calls on about a quarter of its answers), and on-policy GRPO sees each once, while ExGRPO keeps the correct
exchanges of partly solved questions and replays them (its lowest-entropy selection favours exchanges with a call:
the call's JSON is near-deterministic text). So ExGRPO should raise the call rate, and the hard level with it, in
fewer steps. The run measures whether it does.

Outputs in ``--out``: ``runs/<arm>_seed<s>/`` (verl's log and metrics of each run), ``tool_learning_cpu.csv`` (every
point: validation accuracy and call rate per level, per step the share of sampled exchanges with a tool answer and
of replayed members with one), ``tool_learning_cpu.png`` (mean ± std over seeds per arm: validation accuracy, call
rate on the hard level, accuracy on the hard level, share of sampled exchanges with a tool answer),
``tool_learning_cpu.md`` (the tables). Finished runs are reused (``--fresh`` re-runs them), so an interrupted
benchmark resumes where it stopped. The figures and the machine they came from are in docs/tools.md.
"""

from __future__ import annotations

import csv
import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script: the repository first

from benchmarks.common import add_run_folder, argument_parser, comma_list, git_revision, host, run_stoppable  # noqa: E402
from recipe.exgrpo.harness.demo import DEMO_SETTINGS, demo_run, launch_or_reuse, tool_run  # noqa: E402
from recipe.exgrpo.harness.learning_curves import (  # noqa: E402
    RunCurve,
    area_under_curve,
    band,
    markdown_table,
    mean_std,
    plus_minus,
    pyplot,
    run_curve,
    save_figure,
    summarize_arms,
)

# ---- the protocol, fixed before running ------------------------------------------------------------------------
ARMS: dict[str, bool] = {"grpo": False, "exgrpo": True}  # name -> exgrpo.enable
SEEDS = (1, 2, 3)
STEPS = 40
TEST_FREQ = DEMO_SETTINGS["test_freq"]
# "steps to target": the first validation at or above this accuracy (the warmed-up model starts at ~0.6)
TARGET_ACCURACY = 0.7
WALL_LIMIT_S = 1800
HARD = "hard"


def run_one(arm: str, seed: int, steps: int, out: Path, assets, fresh: bool, wall_limit_s: float) -> dict:
    """Run one arm with one seed (or reuse a finished run of as many steps); return its metrics rows and wall time."""
    run = demo_run(
        out / "runs" / f"{arm}_seed{seed}",
        steps=steps,
        seed=seed,
        exgrpo_enable=ARMS[arm],
        test_freq=TEST_FREQ,
        val_before_train=True,
        wall_limit_s=wall_limit_s,
    )
    return launch_or_reuse(tool_run(run), assets, f"tool_learning_cpu {arm} seed {seed}", fresh, steps=steps)


# ---- figures of one run ------------------------------------------------------------------------------------------
def final_figures(curve: RunCurve) -> dict[str, float]:
    """The end of one run: validation accuracy (overall, hard), call rate (overall, hard), its AUC, the mean share of
    sampled exchanges with a tool answer over the last quarter of the steps."""
    quarter = max(1, len(curve.tool_turn_share) // 4)
    return {
        "final accuracy": curve.val_acc[-1],
        "final accuracy, hard": curve.val_by_level[HARD][-1],
        "AUC accuracy": area_under_curve(curve.val_steps, curve.val_acc),
        "final call rate": curve.val_tool_call[-1],
        "final call rate, hard": curve.val_tool_call_by_level[HARD][-1],
        "sampled with a tool answer, last quarter": sum(curve.tool_turn_share[-quarter:]) / quarter,
    }


def paired_table(curves: dict[str, list[tuple[int, RunCurve]]]) -> str:
    """Per figure: each seed's ExGRPO − GRPO difference, their mean ± std, and in how many seeds ExGRPO is ahead."""
    by_seed = {arm: {seed: final_figures(c) for seed, c in runs} for arm, runs in curves.items()}
    seeds = sorted(set(by_seed["grpo"]) & set(by_seed["exgrpo"]))
    names = list(next(iter(by_seed["exgrpo"].values())))
    head = ["figure", "GRPO", "ExGRPO"] + [f"diff seed {s}" for s in seeds] + ["diff mean ± std", "ExGRPO ahead"]
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    for name in names:
        diffs = [by_seed["exgrpo"][s][name] - by_seed["grpo"][s][name] for s in seeds]
        cells = [
            name,
            plus_minus(mean_std(by_seed["grpo"][s][name] for s in seeds)),
            plus_minus(mean_std(by_seed["exgrpo"][s][name] for s in seeds)),
            *[f"{d:+.3f}" for d in diffs],
            plus_minus(mean_std(diffs)),
            f"{sum(d > 0 for d in diffs)}/{len(diffs)}",
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def call_rate_table(curves: dict[str, list[tuple[int, RunCurve]]]) -> str:
    """Validation call rate per level at each validation step (mean ± std over seeds), per arm."""
    lines = []
    for arm, runs in curves.items():
        c0 = runs[0][1]
        head = ["arm", "level"] + [f"step {s}" for s in c0.val_steps]
        if not lines:
            lines = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
        for lv in c0.val_tool_call_by_level:
            cells = [arm, lv]
            for i in range(len(c0.val_steps)):
                cells.append(plus_minus(mean_std(c.val_tool_call_by_level[lv][i] for _, c in runs), 2))
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def write_tool_csv(curves: dict[str, list[tuple[int, RunCurve]]], path: Path) -> Path:
    fields = ("arm", "seed", "kind", "step", "level", "value")
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=fields)
        writer.writeheader()
        for arm, runs in curves.items():
            for seed, c in runs:
                for i, step in enumerate(c.val_steps):
                    writer.writerow(
                        dict(arm=arm, seed=seed, kind="val_acc", step=step, level="all", value=c.val_acc[i])
                    )
                    for lv, values in c.val_by_level.items():
                        writer.writerow(dict(arm=arm, seed=seed, kind="val_acc", step=step, level=lv, value=values[i]))
                    for lv, values in c.val_tool_call_by_level.items():
                        writer.writerow(dict(arm=arm, seed=seed, kind="val_call", step=step, level=lv, value=values[i]))
                for i, step in enumerate(c.steps):
                    row = dict(arm=arm, seed=seed, step=step, level="all")
                    writer.writerow({**row, "kind": "sampled_pass_rate", "value": c.sampled_pass_rate[i]})
                    if i < len(c.tool_turn_share):
                        writer.writerow({**row, "kind": "sampled_tool_answer", "value": c.tool_turn_share[i]})
                        writer.writerow({**row, "kind": "replayed_tool_answer", "value": c.replayed_tool_turn_share[i]})
    return path


class _HardAccuracy:
    """band() reads attributes: a view of a curve with the hard level's validation figures as attributes."""

    def __init__(self, curve: RunCurve):
        self.val_steps = curve.val_steps
        self.acc = curve.val_by_level[HARD]
        self.call = curve.val_tool_call_by_level[HARD]
        self.steps = curve.steps
        self.share = curve.tool_turn_share


def plot(curves: dict[str, list[tuple[int, RunCurve]]], path: Path, title: str) -> Path:
    plt = pyplot()
    fig, axes = plt.subplots(1, 4, figsize=(18, 4.2))
    panels = (
        ("val_steps", "val_acc", "validation accuracy", False),
        ("val_steps", "call", "validation: hard questions that call", True),
        ("val_steps", "acc", "validation accuracy, hard", True),
        ("steps", "share", "sampled exchanges with a tool answer", True),
    )
    for i, (arm, runs) in enumerate(curves.items()):
        color = f"C{i}"
        for ax, (steps_attr, values_attr, name, hard_view) in zip(axes, panels):
            views = [_HardAccuracy(c) if hard_view else c for _, c in runs]
            steps, mean, std = band(views, steps_attr, values_attr)
            ax.plot(
                steps, mean, "o-" if steps_attr == "val_steps" else "-", color=color, label=f"{arm} (n={len(runs)})"
            )
            lo, hi = [m - s for m, s in zip(mean, std)], [m + s for m, s in zip(mean, std)]
            ax.fill_between(steps, lo, hi, color=color, alpha=0.2)
            ax.set_title(name + " (mean ± std)")
    for ax in axes:
        ax.set_xlabel("training step")
        ax.set_ylim(0, 1)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(title)
    return save_figure(fig, path)


def main(argv: list[str] | None = None) -> int:
    parser = argument_parser(__doc__)
    add_run_folder(parser, "tool_learning_cpu")
    parser.add_argument("--seeds", default=",".join(map(str, SEEDS)), help="comma-separated seeds (default: 1,2,3)")
    parser.add_argument("--steps", type=int, default=STEPS, help=f"training steps per run (default {STEPS})")
    parser.add_argument("--wall-limit", type=float, default=WALL_LIMIT_S, help="per-run wall-clock bound, s")
    parser.add_argument(
        "--call-share",
        type=float,
        help="the share of the warm-up's examples that call the calculator (default: the demo model's, 0.25); a "
        "lower one makes successful calls rare at the start (its own model, built once)",
    )
    args = parser.parse_args(argv)
    seeds = comma_list(args.seeds, int)
    if len(seeds) < 2:
        parser.error("--seeds: the comparison needs at least two seeds")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    from recipe.exgrpo.harness.assets import asset_spec, ensure_assets

    if args.call_share is not None and not 0.0 <= args.call_share <= 1.0:
        parser.error(f"--call-share must be in [0, 1], got {args.call_share}")
    assets = ensure_assets(asset_spec("hf", tools=True, call_share=args.call_share))
    curves: dict[str, list[tuple[int, RunCurve]]] = {arm: [] for arm in ARMS}
    for seed in seeds:  # seed-major: an interrupted benchmark still has both arms for the seeds it finished
        for arm in ARMS:
            res = run_one(arm, seed, args.steps, out, assets, args.fresh, args.wall_limit)
            curve = run_curve(res["rows"], f"{arm} seed {seed}", wall_seconds=res["wall_seconds"], group_size=8)
            curves[arm].append((seed, curve))
    missing = [f"{arm} seed {s}" for arm, runs in curves.items() for s, c in runs if not c.val_tool_call_by_level]
    if missing:
        raise SystemExit(f"no validation call rates in {missing}: not the calculator task's runs?")
    write_tool_csv(curves, out / "tool_learning_cpu.csv")
    settings = ", ".join(f"{k}={v}" for k, v in DEMO_SETTINGS.items() if k not in ("steps", "test_freq"))
    call_share = assets.report["spec"]["tools"]["call_share"]
    header = (
        f"ExGRPO vs on-policy GRPO on the CPU calculator task: {args.steps} steps, seeds {seeds}, validation every "
        f"{TEST_FREQ} steps (384 questions, one sample each at T = 1); the demo's settings ({settings}) with --tools; "
        f"assets {assets.root.name} (warm-up call share {call_share:g}); commit {git_revision()}; {host()}\n\n"
    )
    summaries = summarize_arms({arm: [c for _, c in runs] for arm, runs in curves.items()}, TARGET_ACCURACY)
    text = (
        header
        + "## Validation accuracy\n\n"
        + markdown_table(summaries, TARGET_ACCURACY)
        + "\n## Paired by seed (ExGRPO − GRPO)\n\n"
        + paired_table(curves)
        + "\n## Validation call rate per level\n\n"
        + call_rate_table(curves)
    )
    replayed = [
        v for _, c in curves["exgrpo"] for v in c.replayed_tool_turn_share if not math.isnan(v)
    ]  # steps that replayed
    if replayed:
        text += (
            f"\nExGRPO's replayed members holding a tool answer: {sum(replayed) / len(replayed):.2f} of them on "
            f"average over the {len(replayed)} steps that replayed (all seeds).\n"
        )
    (out / "tool_learning_cpu.md").write_text(text)
    png = plot(curves, out / "tool_learning_cpu.png", f"ExGRPO vs GRPO, CPU calculator task ({len(seeds)} seeds)")
    print("\n" + text)
    print(f"csv: {out / 'tool_learning_cpu.csv'}\ntable: {out / 'tool_learning_cpu.md'}\nplot: {png}")
    return 0


if __name__ == "__main__":
    sys.exit(run_stoppable(main, "tool_learning_cpu"))
