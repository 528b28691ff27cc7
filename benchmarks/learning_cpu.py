"""ExGRPO vs on-policy GRPO: validation accuracy over training on the CPU toy task, several seeds per arm.

    python benchmarks/learning_cpu.py [--out outputs/learning_cpu] [--seeds 1,2,3] [--arms grpo,exgrpo,...]
        [--rollout hf|vllm] [--trainer legacy|v1]

The protocol is fixed here, before running (module constants below): both arms use the CPU demo's settings
(``recipe.exgrpo.harness.demo.DEMO_SETTINGS``: model, data, batch, K, learning rate, validation) with the same seeds;
the only difference is ``exgrpo.enable`` (on-policy GRPO = false, through the same trainer). For the same number
of steps ExGRPO *generates* fewer responses (K−1 for a replayed question instead of K), so the comparison never
favours it on generation budget; the table lists the responses each arm generated.

Outputs in ``--out``: ``runs/<arm>_seed<s>/`` (verl's log and metrics of each run), ``learning_cpu.csv`` (every
point of every run), ``learning_cpu.png`` (mean ± std over seeds per arm), ``learning_cpu.md`` (the table: start,
final and best validation accuracy, area under the curve, steps to the target accuracy, final accuracy per
difficulty level, generated responses, wall time). Runs already finished in ``--out`` are reused (``--fresh``
re-runs them), so an interrupted benchmark resumes where it stopped.

``--rollout vllm`` runs every arm on verl's vLLM rollout (the vLLM CPU stack, ``bash scripts/setup_env.sh --vllm``;
its model, and no delayed start, as the vLLM demo), ``--trainer v1`` on verl's v1 trainer. The arm
``exgrpo_colocate_async`` is ExGRPO on the v1 trainer's ``colocate_async`` mode (docs/algorithm.md §15): with
``--trainer v1 --rollout vllm --arms exgrpo,exgrpo_colocate_async`` the two modes side by side.

The figures and the machine they came from are in docs/learning.md. Run it on a quiet machine (the wall times are
part of the table); each run takes about as long as the demo (~3 minutes on 2 cores). With the demo's settings the
ExGRPO arm is the demo itself, so its rows also give the demo's seed-to-seed spread.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script: the repository first

from benchmarks.common import (  # noqa: E402
    add_run_folder,
    argument_parser,
    comma_list,
    git_revision,
    host,
    run_stoppable,
    vllm_python,
)
from exgrpo.modes import DEFAULT_REWARD_MODE  # noqa: E402
from recipe.exgrpo.harness.demo import (  # noqa: E402
    DEMO_SETTINGS,
    VLLM_DEMO_DELAYED_START,
    demo_run,
    finished_run,
    launch_or_reuse,
)
from recipe.exgrpo.harness.learning_curves import (  # noqa: E402
    level_table,
    markdown_table,
    paired_table,
    plot_arms,
    plot_levels,
    replay_table,
    run_curve,
    summarize_arms,
    write_csv,
)
from recipe.exgrpo.harness.procedure_task import TASK_RUN_SETTINGS  # noqa: E402

# ---- the protocol, fixed before running ------------------------------------------------------------------------
# name -> (exgrpo.enable, extra hydra overrides). The comparison is grpo vs exgrpo; the others are the recipe's
# ablation switches, for the analysis in docs/learning.md (selected with --arms).
ARMS: dict[str, tuple[bool, list[str]]] = {
    "grpo": (False, []),
    "exgrpo": (True, []),
    "exgrpo_no_shaping": (True, ["exgrpo.shaping=none"]),  # replayed tokens weighted by the plain ratio w
    "exgrpo_rho_0.25": (True, ["exgrpo.replay_ratio=0.25"]),  # a quarter of each batch replayed instead of half
    # the rest of the paper's Table 6 rows, one switch each (as scripts/train/ablations/*.sh)
    "exgrpo_wo_question_selection": (True, ["exgrpo.weighting=uniform"]),
    "exgrpo_wo_trajectory_selection": (True, ["exgrpo.trajectory_metric=random"]),
    "exgrpo_wo_both_selections": (True, ["exgrpo.weighting=uniform", "exgrpo.trajectory_metric=random"]),
    "exgrpo_wo_is_correction": (True, ["exgrpo.is_correction=false"]),
    "exgrpo_highest_entropy": (True, ["exgrpo.trajectory_mode=max"]),
    "exgrpo_rho_0.75": (True, ["exgrpo.replay_ratio=0.75"]),
    "exgrpo_sigma_1.5": (True, ["exgrpo.sigma=0.1875"]),  # 1.5 successes of K = 8, in accuracy units
    "exgrpo_sigma_0.5": (True, ["exgrpo.sigma=0.0625"]),
    "exgrpo_mu_0.25": (True, ["exgrpo.mu=0.25"]),
    "exgrpo_readd_retired": (True, ["exgrpo.readd_retired_fraction=0.1"]),
    "exgrpo_tau_0.5": (True, ["exgrpo.delayed_start_threshold=0.5"]),  # replay starts later
    # asynchronous rollouts: the v1 trainer's colocate_async mode (partial rollout on vLLM)
    "exgrpo_colocate_async": (True, ["trainer.v1.trainer_mode=colocate_async"]),
    # the continuous reward mode (docs/algorithm.md §13) on the toy partial credit
    # (recipe/exgrpo/harness/partial_credit.py)
    "grpo_continuous": (False, []),
    "exgrpo_continuous": (True, []),
}
#: Settings of the CPU run (recipe/exgrpo/harness/demo.py:ExGRPOCpuRun fields) that an arm changes besides its
#: overrides.
ARM_RUN_SETTINGS: dict[str, dict] = {
    "grpo_continuous": {"reward_mode": "continuous"},
    "exgrpo_continuous": {"reward_mode": "continuous"},
    "exgrpo_colocate_async": {"trainer": "v1"},
}
DEFAULT_ARMS = ("grpo", "exgrpo")
#: ``--arms table6``: the paper's Table 6 rows (its on-policy and ExGRPO rows are the comparison's arms)
TABLE6_ARMS = (
    "exgrpo_wo_question_selection",
    "exgrpo_wo_trajectory_selection",
    "exgrpo_wo_both_selections",
    "exgrpo_no_shaping",
    "exgrpo_wo_is_correction",
    "exgrpo_highest_entropy",
    "exgrpo_rho_0.25",
    "exgrpo_rho_0.75",
    "exgrpo_sigma_1.5",
    "exgrpo_sigma_0.5",
    "exgrpo_mu_0.25",
    "exgrpo_readd_retired",
)
SEEDS = (1, 2, 3)
STEPS = DEMO_SETTINGS["steps"]
# validation before training and every 10 steps (as the demo): all 384 questions, one sample each at T = 1
TEST_FREQ = DEMO_SETTINGS["test_freq"]
# "steps to target": the first validation at or above this accuracy (the warmed-up model starts at ~0.20)
TARGET_ACCURACY = 0.35
WALL_LIMIT_S = 1200


def run_one(
    arm: str,
    seed: int,
    out: Path,
    assets,
    fresh: bool,
    wall_limit_s: float = WALL_LIMIT_S,
    rollout: str = "hf",
    trainer: str = "legacy",
    python: str = sys.executable,
    task: str = "sums",
    report_only: bool = False,
) -> dict | None:
    """Run one arm with one seed (or reuse a finished run); return its metrics rows and wall time. ``report_only``:
    None for a run that is not finished (nothing is launched)."""
    settings = {
        "rollout": rollout,
        "trainer": trainer,
        "python": python,
        **TASK_RUN_SETTINGS[task],
        **ARM_RUN_SETTINGS.get(arm, {}),
    }
    if rollout == "vllm":  # the vLLM demo's model leaves its warm-up below the demo's τ: replay from step 2, as there
        settings.setdefault("delayed_start_threshold", VLLM_DEMO_DELAYED_START)
    run = demo_run(
        out / "runs" / f"{arm}_seed{seed}",
        steps=STEPS,
        seed=seed,
        exgrpo_enable=ARMS[arm][0],
        extra_overrides=list(ARMS[arm][1]),
        **settings,
        test_freq=TEST_FREQ,
        val_before_train=True,
        wall_limit_s=wall_limit_s,
    )
    # a run of another rollout or trainer is never reused for this one (the hf/legacy runs recorded neither)
    recorded = {} if (rollout, run.trainer) == ("hf", "legacy") else {"rollout": rollout, "trainer": run.trainer}
    if task != "sums":
        recorded["task"] = task
    if report_only and not finished_run(run, **recorded):
        print(f"[learning_cpu {arm} seed {seed}] not finished: left out (--report-only)", flush=True)
        return None
    return launch_or_reuse(run, assets, f"learning_cpu {arm} seed {seed}", fresh, **recorded)


def main(argv: list[str] | None = None) -> int:
    parser = argument_parser(__doc__)
    add_run_folder(parser, "learning_cpu")
    parser.add_argument("--seeds", default=",".join(map(str, SEEDS)), help="comma-separated seeds (default: 1,2,3)")
    parser.add_argument(
        "--arms",
        default=",".join(DEFAULT_ARMS),
        help=f"comma-separated subset of {', '.join(ARMS)}; 'table6' stands for the paper's Table 6 rows",
    )
    parser.add_argument(
        "--val-var",
        default=None,
        help="validation variable of the table and plot (default: acc, else reward; 'reward' = the mean reward, e.g. "
        "the continuous arms' partial credit)",
    )
    parser.add_argument("--target", type=float, default=TARGET_ACCURACY, help="'steps to target' threshold")
    parser.add_argument(
        "--rollout",
        choices=("hf", "vllm"),
        default="hf",
        help="hf: the Hugging Face CPU stand-in; vllm: verl's vLLM rollout on the vLLM CPU stack (its own model)",
    )
    parser.add_argument(
        "--vllm-python",
        default=str(Path(__file__).resolve().parents[1] / ".venv-vllm" / "bin" / "python"),
        help="with --rollout vllm: the vLLM CPU stack's interpreter (default: the checkout's .venv-vllm)",
    )
    parser.add_argument(
        "--trainer", choices=("legacy", "v1"), default="legacy", help="verl's trainer of every arm (default legacy)"
    )
    parser.add_argument(
        "--task",
        choices=tuple(TASK_RUN_SETTINGS),
        default="sums",
        help="sums: the demo's toy sums; procedures: the procedure-choice task built for replay (docs/learning.md)",
    )
    parser.add_argument(
        "--report-only",
        action="store_true",
        help="the tables and figures of the finished runs only (an unfinished arm/seed is left out, nothing runs)",
    )
    parser.add_argument(
        "--wall-limit", type=float, default=WALL_LIMIT_S, help="per-run wall-clock bound, s (a busy machine needs more)"
    )
    args = parser.parse_args(argv)
    seeds = comma_list(args.seeds, int)
    arms = [a for name in comma_list(args.arms) for a in (TABLE6_ARMS if name == "table6" else (name,))]
    unknown = [a for a in arms if a not in ARMS]
    if unknown:
        parser.error(f"--arms: unknown arm(s) {unknown}; choose from {sorted(ARMS)}")
    out = Path(args.out)
    if args.out == parser.get_default("out"):  # each rollout and trainer its own folder by default
        out = out.with_name(out.name + ("" if args.rollout == "hf" else f"_{args.rollout}"))
        out = out.with_name(out.name + ("" if args.trainer == "legacy" else f"_{args.trainer}"))
        out = out.with_name(out.name + ("" if args.task == "sums" else f"_{args.task}"))
    out.mkdir(parents=True, exist_ok=True)
    from recipe.exgrpo.harness.assets import asset_spec, ensure_assets

    python = vllm_python(args.vllm_python) if args.rollout == "vllm" else sys.executable
    assets = ensure_assets(asset_spec(args.rollout, procedures=args.task == "procedures"))
    unmet = assets.report.get("criteria_problems", [])
    if unmet:  # the task was built for a comparison only where it meets its criteria (docs/learning.md)
        parser.error(f"--task {args.task}: the assets in {assets.root} miss the task's criteria: {'; '.join(unmet)}")
    k = DEMO_SETTINGS["rollout_n"]
    curves: dict[str, list] = {arm: [] for arm in arms}
    for seed in seeds:  # seed-major: an interrupted benchmark still has both arms for the seeds it finished
        for arm in arms:
            res = run_one(
                arm,
                seed,
                out,
                assets,
                args.fresh,
                args.wall_limit,
                args.rollout,
                args.trainer,
                python,
                args.task,
                report_only=args.report_only,
            )
            if res is None:
                continue
            curves[arm].append(
                (
                    seed,
                    run_curve(
                        res["rows"],
                        f"{arm} seed {seed}",
                        wall_seconds=res["wall_seconds"],
                        group_size=k,
                        val_var=args.val_var,
                        reward_mode=ARM_RUN_SETTINGS.get(arm, {}).get("reward_mode", DEFAULT_REWARD_MODE),
                    ),
                )
            )
    curves = {arm: runs for arm, runs in curves.items() if runs}
    if not curves:
        parser.error("--report-only: no finished run of these arms and seeds in " + str(out))
    write_csv(curves, out / "learning_cpu.csv")
    by_arm = {arm: [c for _, c in runs] for arm, runs in curves.items()}
    summaries = summarize_arms(by_arm, args.target)
    compared = "ExGRPO vs on-policy GRPO" if set(DEFAULT_ARMS) <= set(arms) else " vs ".join(arms)
    shown = dict(DEMO_SETTINGS)
    if args.rollout == "vllm":
        shown["delayed_start_threshold"] = VLLM_DEMO_DELAYED_START
    settings = ", ".join(f"{key}={value}" for key, value in shown.items() if key not in ("test_freq",))
    header = (
        f"{compared} on the CPU task '{args.task}': {STEPS} steps, seeds {seeds}, validation every {TEST_FREQ} "
        f"steps; rollout {args.rollout}, trainer {args.trainer}; settings: {settings}; assets {assets.root.name}; "
        f"commit {git_revision()}; {host()}\n\n"
    )
    header += (
        "arms: "
        + "; ".join(
            f"{arm} = exgrpo.enable={ARMS[arm][0]}"
            + "".join(f" {o}" for o in ARMS[arm][1])
            + "".join(f" {k}={v}" for k, v in ARM_RUN_SETTINGS.get(arm, {}).items())
            for arm in arms
        )
        + "\n\n"
    )
    measured = "the mean validation reward" if args.val_var == "reward" else "the validation accuracy"
    header += f"start / final / best / AUC: {measured} (val-core/<level>/{args.val_var or 'acc'}/mean@1)\n\n"
    table = markdown_table(summaries, args.target)
    table += "\nper level (validation accuracy):\n\n" + level_table(by_arm)
    table += "\nthe gradient signal and the replay (means over steps, then mean ± std over seeds):\n\n"
    table += replay_table(by_arm)
    # paired by seed: every arm against GRPO, and the other ExGRPO arms (the ablations) against ExGRPO
    if "grpo" in curves and len(curves) > 1:
        table += "\npaired by seed with grpo:\n\n" + paired_table(curves, "grpo")
    ablations = {arm: runs for arm, runs in curves.items() if arm != "grpo"}
    if "exgrpo" in ablations and len(ablations) > 1:
        table += "\npaired by seed with exgrpo:\n\n" + paired_table(ablations, "exgrpo")
    (out / "learning_cpu.md").write_text(header + table)
    png = plot_arms(
        by_arm,
        out / "learning_cpu.png",
        title=f"{compared}, CPU task {args.task} ({len(seeds)} seeds; rollout {args.rollout}, trainer {args.trainer})",
        val_label="mean reward" if args.val_var == "reward" else "accuracy",
    )
    levels_png = plot_levels(
        by_arm, out / "learning_cpu_levels.png", title=f"{compared} per level, {args.task} ({len(seeds)} seeds)"
    )
    print("\n" + header + table)
    print(f"csv: {out / 'learning_cpu.csv'}\ntable: {out / 'learning_cpu.md'}\nplots: {png}, {levels_png}")
    return 0


if __name__ == "__main__":
    sys.exit(run_stoppable(main, "learning_cpu"))
