"""Where on-policy GRPO collapses: GRPO vs ExGRPO in unstable regimes of the CPU toy task, seeds per arm, ablations.

    python benchmarks/stability_cpu.py [--out outputs/stability_cpu] [--seeds 1,2,3,4,5] [--plan main,ablations]
                                       [--regimes lr1e-3,...] [--arms grpo,exgrpo,...] [--report-only] [--fresh]

The paper's second claim is that ExGRPO keeps training stable where on-policy training collapses (its Figure 4).
At the CPU demo's settings both arms train stably and end level (docs/learning.md §4-5); here the demo's settings
are pushed into instability (REGIMES below) and both arms run with the same seeds. The protocol is fixed in the
module constants before the runs: the demo's model, data, batch (16 questions x K = 8) and validation (all 384
questions, one sample each at T = 1, before training and every TEST_FREQ steps), STEPS steps, SEEDS; each regime
changes the demo's settings the same way for every arm. ExGRPO runs without the delayed start (τ = 0: replay from
step 2, as the paper runs Llama-3.1 8B). With the paper's τ = 0.35 instead, ExGRPO *is* GRPO until the first step
whose batch pass rate exceeds τ (the same clipped loss, data order and seed; collecting into the pool does not touch
the update, and retired questions cannot come back as fresh prompts within the first epoch), so the GRPO runs'
batch pass rates say when, if ever, that arm would start replaying (the signal table's last column).

ABLATIONS switch one ExGRPO part off (or up) per arm, with the recipe's own switches, in ABLATION_REGIME, with
ABLATION_SEEDS (the comparison's runs of those seeds are the reference). Two switches need no run of their own,
for the same reason as the delayed start: nothing replayed (``exgrpo.replay_ratio=0``) is GRPO, because the only
other thing mixed mode changes, the fresh tokens' PPO clip, never acts with one optimiser step per batch (the fresh
ratio is 1.0 and the clip fraction 0 in every run: the signal table), and fresh-prompt retirement
(``exgrpo.retire_fresh_prompts``) cannot act within the first epoch (``exgrpo/fresh_skipped_retired`` is 0 in
every run: the signal table).

Outputs in ``--out``: ``runs/<regime>/<arm>_seed<s>/`` (verl's log, metrics.jsonl, ``run.csv`` with the run's
per-step figures, ``done.json``); ``stability_cpu.csv`` (every point of every run), ``stability_cpu.md`` (the
tables), ``stability_<regime>.png`` (validation per level and the gradient-signal figures, mean ± std over seeds)
and ``stability_ablations.png``. Finished runs are reused (``--fresh`` re-runs them), a run that fails is recorded
and the benchmark goes on (re-running the command retries it), so an interrupted benchmark resumes where it stopped.
``--report-only`` rebuilds the tables and figures from the finished runs without training.

Runs go one after another (one verl run at a time); on the 2-core machine each takes about two minutes. Wall times
are in the table but are not part of the comparison. The figures and their reading are in docs/learning.md §6.
"""

from __future__ import annotations

import csv
import json
import math
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script: the repository first

from benchmarks.common import add_run_folder, argument_parser, comma_list, git_revision, host, run_stoppable  # noqa: E402
from recipe.exgrpo.harness.demo import DEMO_SETTINGS, ExGRPOCpuRun, demo_run, launch  # noqa: E402
from recipe.exgrpo.harness.learning_curves import (  # noqa: E402
    RunCurve,
    area_under_curve,
    band,
    mean_std,
    plus_minus,
    pyplot,
    read_metrics_file,
    run_curve,
    save_figure,
)
from recipe.exgrpo.harness.procedure_task import TASK_RUN_SETTINGS  # noqa: E402

# ---- the protocol, fixed before running ------------------------------------------------------------------------


@dataclass(frozen=True)
class Regime:
    """How a regime changes the demo's settings (the same for every arm)."""

    why: str
    settings: dict[str, Any] = field(default_factory=dict)  # fields of recipe.exgrpo.harness.demo.ExGRPOCpuRun
    overrides: tuple[str, ...] = ()  # hydra overrides


REGIMES: dict[str, Regime] = {
    "lr1e-3": Regime(
        "5x the demo's learning rate: one update at 1e-3 scrambles the shared weights of the sums (§2)",
        settings={"lr": 1e-3},
    ),
    "lr2e-3": Regime(
        "10x the demo's learning rate: how far the stabilisation reaches",
        settings={"lr": 2e-3},
    ),
}
# name -> (exgrpo.enable, hydra overrides on top of the regime). The comparison is grpo vs exgrpo.
ARMS: dict[str, tuple[bool, tuple[str, ...]]] = {
    "grpo": (False, ()),
    "exgrpo": (True, ()),
    # the ablations: one ExGRPO part per arm, the recipe's own switches
    # the stored member's own gradient ~0 (f(w) = w/(w+β) is ~w/β, its gradient ~1e-6 of a fresh token's); it
    # still joins its group, so its siblings keep their −1/K advantages
    "exgrpo_stored_member_no_grad": (True, ("exgrpo.shaping_beta=1e6",)),
    "exgrpo_no_shaping": (True, ("exgrpo.shaping=none",)),  # plain w: ~12x the stored member's gradient at w = 1
}
COMPARISON = ("grpo", "exgrpo")
ABLATIONS = (
    "exgrpo_stored_member_no_grad",
    "exgrpo_no_shaping",
)
ABLATION_REGIME = "lr1e-3"
SEEDS = (1, 2, 3, 4, 5)
ABLATION_SEEDS = (1, 2, 3)  # the ablation arms (the comparison's grpo and exgrpo runs of these seeds are reused)
STEPS = 20
TEST_FREQ = 5  # validation before training and every 5 steps
DELAYED_START = 0.0  # τ of every ExGRPO arm unless the arm sets it
# the paper's delayed start: replay begins after the first step whose batch pass rate exceeds τ = 0.35
PAPER_TAU = 0.35
# a run "collapses" when its final validation accuracy is below half its start
COLLAPSE_FRACTION = 0.5
WALL_LIMIT_S = 1200

# per-step figures kept in run.csv: column -> metrics key
STEP_KEYS: dict[str, str] = {
    "sampled_pass_rate": "exgrpo/sampled_pass_rate",
    "batch_pass_rate": "exgrpo/batch_pass_rate",
    "replayed_questions": "exgrpo/replayed_questions",
    "zero_var_fresh": "exgrpo/signal/zero_var_fresh_share",
    "zero_var_fresh_failed": "exgrpo/signal/zero_var_fresh_failed_share",
    "zero_var_replay": "exgrpo/signal/zero_var_replay_share",
    "zero_var_all": "exgrpo/signal/zero_var_share",
    "replay_rescued": "exgrpo/signal/replay_rescued_share",
    "nonzero_adv_rows": "exgrpo/signal/nonzero_adv_row_share",
    "replayed_member_adv_share": "exgrpo/signal/replayed_member_adv_share",
    "replay_group_adv_share": "exgrpo/signal/replay_group_adv_share",
    "retired": "exgrpo/pool/retired",
    "fresh_skipped_retired": "exgrpo/fresh_skipped_retired",
    "fresh_ratio_max": "actor/exgrpo/fresh_ratio_max",
    "fresh_clip_frac": "actor/exgrpo/fresh_clip_frac",
    "grad_norm": "actor/grad_norm",
    "response_length": "response_length/mean",
    "step_s": "timing_s/step",
}
LATE_STEPS = 5  # "late" figures: the mean over the last 5 training steps


def plan_runs(plan: Sequence[str], regimes: Sequence[str] | None, arms: Sequence[str] | None) -> list[tuple[str, str]]:
    """The (regime, arm) pairs to run: the comparison in every regime and/or the ablations in ABLATION_REGIME,
    narrowed by ``--regimes`` / ``--arms``."""
    pairs: list[tuple[str, str]] = []
    if "main" in plan:
        pairs += [(r, a) for r in REGIMES for a in COMPARISON]
    if "ablations" in plan:
        pairs += [(ABLATION_REGIME, a) for a in ABLATIONS]
    return [(r, a) for r, a in pairs if (not regimes or r in regimes) and (not arms or a in arms)]


def run_settings(regime: str, arm: str) -> tuple[dict[str, Any], list[str]]:
    """The ExGRPOCpuRun fields and hydra overrides of one (regime, arm) on top of the demo's settings."""
    enable, arm_overrides = ARMS[arm]
    settings = {**REGIMES[regime].settings, "exgrpo_enable": enable, "delayed_start_threshold": DELAYED_START}
    return settings, [*REGIMES[regime].overrides, *arm_overrides]


# ---- one run ---------------------------------------------------------------------------------------------------
@dataclass
class RunRecord:
    regime: str
    arm: str
    seed: int
    curve: RunCurve
    series: dict[str, dict[int, float]]  # STEP_KEYS column -> {step: value}
    wall_seconds: float


def step_series(rows: Sequence[Mapping[str, Any]]) -> dict[str, dict[int, float]]:
    """Each STEP_KEYS figure per training step (steps that did not log a key are absent from its dict)."""
    out: dict[str, dict[int, float]] = {col: {} for col in STEP_KEYS}
    for row in rows:
        if "exgrpo/batch_pass_rate" not in row:
            continue
        step = int(row.get("step") or 0)
        for col, key in STEP_KEYS.items():
            value = row.get(key)
            if isinstance(value, (int, float)) and not math.isnan(float(value)):
                out[col][step] = float(value)
    return out


def write_run_csv(record: RunRecord, path: Path) -> None:
    """One run's figures: a ``val`` row per validation (overall and per level), a ``train`` row per step."""
    levels = list(record.curve.val_by_level)
    fields = ["regime", "arm", "seed", "kind", "step", "val_acc", *[f"val_{lv}" for lv in levels], *STEP_KEYS]
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=fields)
        writer.writeheader()
        base = {"regime": record.regime, "arm": record.arm, "seed": record.seed}
        for i, step in enumerate(record.curve.val_steps):
            writer.writerow(
                {
                    **base,
                    "kind": "val",
                    "step": step,
                    "val_acc": record.curve.val_acc[i],
                    **{f"val_{lv}": record.curve.val_by_level[lv][i] for lv in levels},
                }
            )
        for step in record.curve.steps:
            writer.writerow(
                {**base, "kind": "train", "step": step, **{c: record.series[c].get(step, "") for c in STEP_KEYS}}
            )


def run_one(regime: str, arm: str, seed: int, out: Path, assets, fresh: bool, task: str = "sums") -> RunRecord | None:
    """Run one (regime, arm, seed), or reuse it when finished; None when it failed (recorded in failed.json)."""
    run_dir = out / "runs" / regime / f"{arm}_seed{seed}"
    done = run_dir / "done.json"
    label = f"{regime} {arm} seed {seed}"
    if not (done.exists() and not fresh):
        if assets is None:
            return None  # --report-only: only finished runs
        settings, overrides = run_settings(regime, arm)
        ray_tmp = tempfile.mkdtemp(prefix="exgst-", dir="/tmp")
        run = demo_run(
            run_dir,
            steps=STEPS,
            seed=seed,
            test_freq=TEST_FREQ,
            val_before_train=True,
            wall_limit_s=WALL_LIMIT_S,
            ray_temp_dir=ray_tmp,
            extra_overrides=overrides,
            **{**TASK_RUN_SETTINGS[task], **settings},
        )
        print(f"[stability] {label}: running ({run_dir / 'train.log'}) ...", flush=True)
        done.unlink(missing_ok=True)
        try:
            result = launch(run, assets, echo=False)
        finally:
            shutil.rmtree(ray_tmp, ignore_errors=True)
        if result.timed_out or result.returncode != 0:
            print(result.log_tail(3000), file=sys.stderr)
            (run_dir / "failed.json").write_text(
                json.dumps({"returncode": result.returncode, "timed_out": result.timed_out}) + "\n"
            )
            print(f"[stability] {label} FAILED (exit {result.returncode}); log: {result.log_path}", flush=True)
            return None
        (run_dir / "failed.json").unlink(missing_ok=True)
        done.write_text(
            json.dumps({"wall_seconds": result.wall_seconds, "settings": settings, "overrides": overrides}) + "\n"
        )
        print(f"[stability] {label}: {result.wall_seconds:.0f} s", flush=True)
    info = json.loads(done.read_text())
    rows = read_metrics_file(run_dir / "metrics.jsonl")
    record = RunRecord(
        regime,
        arm,
        seed,
        run_curve(rows, label, wall_seconds=info["wall_seconds"], group_size=DEMO_SETTINGS["rollout_n"]),
        step_series(rows),
        float(info["wall_seconds"]),
    )
    write_run_csv(record, run_dir / "run.csv")
    return record


# ---- summaries -------------------------------------------------------------------------------------------------
def _mean(values: Sequence[float]) -> float:
    return statistics.fmean(values) if values else math.nan


def run_figures(record: RunRecord) -> dict[str, float]:
    """One run's scalar figures: validation (start, final, lowest, AUC, final per level), collapse, the gradient
    signal (mean over all steps / over the last LATE_STEPS steps), the first replayed step."""
    c, s = record.curve, record.series
    fig: dict[str, float] = {
        "start": c.val_acc[0],
        "final": c.val_acc[-1],
        "lowest": min(c.val_acc[1:] or c.val_acc),
        "auc": area_under_curve(c.val_steps, c.val_acc),
        "collapsed": float(c.val_acc[-1] < COLLAPSE_FRACTION * c.val_acc[0]),
        "wall_s": record.wall_seconds,
    }
    for lv, values in c.val_by_level.items():
        fig[f"final_{lv}"] = values[-1]
    late = sorted(c.steps)[-LATE_STEPS:]
    for col in ("zero_var_fresh", "zero_var_fresh_failed", "zero_var_replay", "replay_rescued", "nonzero_adv_rows"):
        fig[f"{col}_mean"] = _mean(list(s[col].values()))
        fig[f"{col}_late"] = _mean([s[col][t] for t in late if t in s[col]])
    fig["sampled_pass_late"] = _mean([s["sampled_pass_rate"][t] for t in late if t in s["sampled_pass_rate"]])
    # replayed members' share of |A| over the steps that replayed (the share is 0 by construction before)
    replayed = [t for t, n in s["replayed_questions"].items() if n > 0]
    share = s["replayed_member_adv_share"]
    group_share = s["replay_group_adv_share"]
    fig["replayed_member_adv_share"] = _mean([share[t] for t in replayed if t in share])
    fig["replay_group_adv_share"] = _mean([group_share[t] for t in replayed if t in group_share])
    fig["first_replay_step"] = float(min(replayed)) if replayed else math.nan
    fig["replayed_questions"] = sum(s["replayed_questions"].values())
    above = [t for t, v in s["batch_pass_rate"].items() if v > PAPER_TAU]
    fig["first_step_above_paper_tau"] = float(min(above)) if above else math.nan
    fig["grad_norm_max"] = max(s["grad_norm"].values(), default=math.nan)
    fig["fresh_clip_frac_max"] = max(s["fresh_clip_frac"].values(), default=math.nan)
    fig["fresh_skipped_retired"] = sum(s["fresh_skipped_retired"].values())
    return fig


def _cell(values: Sequence[float], digits: int = 3) -> str:
    vals = [v for v in values if not math.isnan(v)]
    return plus_minus(mean_std(vals), digits) if vals else "–"


def _groups(records: Sequence[RunRecord]) -> dict[tuple[str, str], list[RunRecord]]:
    out: dict[tuple[str, str], list[RunRecord]] = {}
    for r in records:
        out.setdefault((r.regime, r.arm), []).append(r)
    return out


def validation_table(records: Sequence[RunRecord]) -> str:
    levels = ["easy", "medium", "hard"]
    head = ["regime", "arm", "seeds", "start", "final", "lowest", "AUC", *[f"final {lv}" for lv in levels]]
    head += ["collapsed", "wall s"]
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    for (regime, arm), runs in _groups(records).items():
        figs = [run_figures(r) for r in runs]
        col = {k: [f[k] for f in figs if k in f] for k in figs[0]}
        cells = [regime, arm, str(len(runs))]
        cells += [_cell(col[k]) for k in ("start", "final", "lowest", "auc")]
        cells += [_cell(col.get(f"final_{lv}", [])) for lv in levels]
        cells += [f"{int(sum(col['collapsed']))}/{len(runs)}", _cell(col["wall_s"], 0)]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def signal_table(records: Sequence[RunRecord]) -> str:
    head = [
        "regime",
        "arm",
        "zero-var fresh groups (all steps)",
        "… last 5 steps",
        "of which all failed (last 5)",
        "zero-var replay groups",
        "replay groups rescued by the stored member",
        "rows with A ≠ 0 (last 5)",
        "replayed members' share of Σ\\|A\\|",
        "replay groups' share of Σ\\|A\\|",
        "sampled pass rate (last 5)",
        "first replayed step",
        "replayed questions",
        f"first step with batch pass rate > {PAPER_TAU}",
        "largest gradient norm",
        "largest fresh clip fraction",
        "retired questions skipped as fresh prompts",
    ]
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    for (regime, arm), runs in _groups(records).items():
        figs = [run_figures(r) for r in runs]
        col = {k: [f[k] for f in figs] for k in figs[0] if all(k in f for f in figs)}
        first = ", ".join("–" if math.isnan(v) else str(int(v)) for v in col["first_replay_step"])
        cells = [regime, arm]
        cells += [
            _cell(col[k])
            for k in (
                "zero_var_fresh_mean",
                "zero_var_fresh_late",
                "zero_var_fresh_failed_late",
                "zero_var_replay_mean",
                "replay_rescued_mean",
                "nonzero_adv_rows_late",
                "replayed_member_adv_share",
                "replay_group_adv_share",
                "sampled_pass_late",
            )
        ]
        above = ", ".join("–" if math.isnan(v) else str(int(v)) for v in col["first_step_above_paper_tau"])
        cells += [first, _cell(col["replayed_questions"], 0), above, f"{max(col['grad_norm_max']):.2f}"]
        cells += [f"{max(col['fresh_clip_frac_max']):.3f}", f"{int(sum(col['fresh_skipped_retired']))}"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def paired_table(records: Sequence[RunRecord], baseline: str = "grpo") -> str:
    """Per regime and arm: the per-seed difference to the baseline arm of the same seed (same initial model, data
    order of the first step), final and AUC, and the seeds where the arm ended above the baseline."""
    head = ["regime", f"arm − {baseline}", "seeds paired", "final (points)", "AUC (points)", "seeds ahead at the end"]
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    by = {(r.regime, r.arm, r.seed): run_figures(r) for r in records}
    for regime, arm in _groups(records):
        if arm == baseline or (baseline != "grpo" and arm == "grpo"):
            continue
        seeds = sorted(s for (g, a, s) in by if g == regime and a == arm and (g, baseline, s) in by)
        if not seeds:
            continue
        d_final = [100 * (by[(regime, arm, s)]["final"] - by[(regime, baseline, s)]["final"]) for s in seeds]
        d_auc = [100 * (by[(regime, arm, s)]["auc"] - by[(regime, baseline, s)]["auc"]) for s in seeds]
        ahead = sum(d > 0 for d in d_final)
        lines.append(
            f"| {regime} | {arm} | {len(seeds)} | {_cell(d_final, 1)} | {_cell(d_auc, 1)} | {ahead}/{len(seeds)} |"
        )
    return "\n".join(lines) + "\n"


def per_seed_curves(records: Sequence[RunRecord]) -> str:
    lines = ["| regime | arm | seed | validation accuracy at steps " + ", ".join(map(str, records[0].curve.val_steps))]
    lines[0] += " |"
    lines.append("|---|---|---|---|")
    for r in records:
        lines.append(f"| {r.regime} | {r.arm} | {r.seed} | " + " ".join(f"{v:.3f}" for v in r.curve.val_acc) + " |")
    return "\n".join(lines) + "\n"


def write_all_csv(records: Sequence[RunRecord], path: Path) -> None:
    """Every run's run.csv, concatenated (one header)."""
    with open(path, "w", newline="") as out:
        header_written = False
        for r in records:
            run_csv = path.parent / "runs" / r.regime / f"{r.arm}_seed{r.seed}" / "run.csv"
            lines = run_csv.read_text().splitlines(keepends=True)
            if not header_written:
                out.write(lines[0])
                header_written = True
            out.writelines(lines[1:])


# ---- figures ---------------------------------------------------------------------------------------------------
@dataclass
class _Series:
    """A per-step figure as a RunCurve-like object, for learning_curves.band (mean ± std at common steps)."""

    steps: list[int]
    values: list[float]


def _series_band(runs: Sequence[RunRecord], col: str) -> tuple[list[int], list[float], list[float]]:
    items = [_Series(sorted(r.series[col]), [r.series[col][t] for t in sorted(r.series[col])]) for r in runs]
    items = [i for i in items if i.steps]
    return band(items, "steps", "values") if items else ([], [], [])


def _draw(ax, steps, mean, std, color, label, marker="-"):
    if not steps:
        return
    ax.plot(steps, mean, marker, color=color, label=label)
    ax.fill_between(
        steps, [m - s for m, s in zip(mean, std)], [m + s for m, s in zip(mean, std)], color=color, alpha=0.2
    )


def plot_regime(
    runs_by_arm: Mapping[str, Sequence[RunRecord]],
    path: Path,
    title: str,
    response_cap: int = ExGRPOCpuRun.max_response_length,
) -> Path:
    """Validation accuracy (overall and per level) and the gradient-signal figures per step, mean ± std per arm;
    ``response_cap``: the runs' response bound, named in the length panel's title."""
    plt = pyplot()
    fig, axes = plt.subplots(2, 4, figsize=(18, 8))
    for i, (arm, runs) in enumerate(runs_by_arm.items()):
        color, label = f"C{i}", f"{arm} (n={len(runs)})"
        _draw(axes[0, 0], *band([r.curve for r in runs], "val_steps", "val_acc"), color, label, "o-")
        for j, lv in enumerate(("easy", "medium", "hard")):
            curves = [r.curve for r in runs if lv in r.curve.val_by_level]
            items = [_Series(c.val_steps, c.val_by_level[lv]) for c in curves]
            if items:
                _draw(axes[0, 1 + j], *band(items, "steps", "values"), color, label, "o-")
        _draw(axes[1, 0], *_series_band(runs, "zero_var_fresh"), color, label)
        _draw(axes[1, 2], *_series_band(runs, "sampled_pass_rate"), color, label)
        _draw(axes[1, 3], *_series_band(runs, "response_length"), color, label)
        if any(r.series["replayed_questions"].get(t, 0) > 0 for r in runs for t in r.series["replayed_questions"]):
            _draw(axes[1, 0], *_series_band(runs, "zero_var_replay"), color, None, "--")
            _draw(axes[1, 1], *_series_band(runs, "replayed_member_adv_share"), color, label)
            _draw(axes[1, 1], *_series_band(runs, "replay_group_adv_share"), color, None, "--")
    titles = [
        "validation accuracy (all levels)",
        "validation: easy",
        "validation: medium",
        "validation: hard",
        "groups with zero reward variance: fresh (—), replay (- -)",
        "share of Σ|A|: replayed members (—), replay groups (- -)",
        "sampled pass rate (batches differ between arms)",
        f"response length (tokens; the cap is {response_cap})",
    ]
    for ax, t in zip(axes.flat, titles):
        ax.set_title(t, fontsize=10)
        ax.set_xlabel("training step")
        ax.grid(alpha=0.3)
    axes[0, 0].legend(fontsize=8)
    fig.suptitle(title)
    return save_figure(fig, path)


# ---- main ------------------------------------------------------------------------------------------------------
def assets_digest(out: Path) -> str:
    """The digest of the assets the runs used (from verl's logged model path), or "unknown"."""
    for log in sorted((out / "runs").glob("*/*/train.log"))[:1]:
        for line in log.read_text(errors="replace").splitlines():
            if "exgrpo-assets/" in line:
                return line.split("exgrpo-assets/")[1].split("/")[0]
    return "unknown"


def main(argv: list[str] | None = None) -> int:
    parser = argument_parser(__doc__)
    add_run_folder(parser, "stability_cpu")
    parser.add_argument("--seeds", default=",".join(map(str, SEEDS)), help="seeds of the comparison (default: 1..5)")
    parser.add_argument(
        "--ablation-seeds", default=",".join(map(str, ABLATION_SEEDS)), help="seeds of the ablations (default: 1,2,3)"
    )
    parser.add_argument("--plan", default="main,ablations", help="main (GRPO vs ExGRPO per regime), ablations")
    parser.add_argument("--regimes", default=None, help=f"only these regimes, of {', '.join(REGIMES)}")
    parser.add_argument("--arms", default=None, help=f"only these arms, of {', '.join(ARMS)}")
    parser.add_argument("--report-only", action="store_true", help="tables and figures from finished runs only")
    parser.add_argument(
        "--task",
        choices=tuple(TASK_RUN_SETTINGS),
        default="sums",
        help="sums: the demo's toy sums; procedures: the procedure-choice task (docs/learning.md); the default --out "
        "gets its name",
    )
    args = parser.parse_args(argv)
    seeds, ablation_seeds = comma_list(args.seeds, int), comma_list(args.ablation_seeds, int)
    plan, regimes, arms = comma_list(args.plan), comma_list(args.regimes), comma_list(args.arms)
    for name, given, known in (("--plan", plan, ("main", "ablations")), ("--regimes", regimes, REGIMES)):
        if bad := [g for g in given if g not in known]:
            parser.error(f"{name}: unknown {bad}; choose from {sorted(known)}")
    if bad := [a for a in arms if a not in ARMS]:
        parser.error(f"--arms: unknown {bad}; choose from {sorted(ARMS)}")
    pairs = plan_runs(plan, regimes, arms)
    if not pairs:
        parser.error("nothing to run: --plan/--regimes/--arms select no (regime, arm) pair")
    out = Path(args.out)
    if args.out == parser.get_default("out") and args.task != "sums":
        out = out.with_name(f"{out.name}_{args.task}")
    out.mkdir(parents=True, exist_ok=True)
    assets = None
    if not args.report_only:
        from recipe.exgrpo.harness.assets import asset_spec, ensure_assets

        assets = ensure_assets(asset_spec(procedures=args.task == "procedures"))
    records: list[RunRecord] = []
    failed: list[str] = []
    t0 = time.time()
    # seed-major inside each block: an interrupted benchmark has every arm for the seeds it finished
    blocks: dict[tuple[str, bool], list[str]] = {}
    for regime, arm in pairs:
        blocks.setdefault((regime, arm in ABLATIONS), []).append(arm)
    for (regime, is_ablation), block_arms in blocks.items():
        for seed in ablation_seeds if is_ablation else seeds:
            for arm in block_arms:
                record = run_one(regime, arm, seed, out, assets, args.fresh, args.task)
                if record is None:
                    if assets is not None:
                        failed.append(f"{regime} {arm} seed {seed}")
                    continue
                records.append(record)
                if assets is not None:
                    print(f"[stability] {len(records)} runs ready, {time.time() - t0:.0f} s so far", flush=True)
    if not records:
        print("[stability] no finished run to report", file=sys.stderr)
        return 1
    order = {pair: i for i, pair in enumerate(pairs)}
    records.sort(key=lambda r: (order[(r.regime, r.arm)], r.seed))
    write_all_csv(records, out / "stability_cpu.csv")
    main_records = [r for r in records if r.arm in COMPARISON]
    # the ablations beside the comparison's runs of the same regime and seeds
    ablation_records = [
        r for r in records if r.regime == ABLATION_REGIME and r.seed in ablation_seeds and r.arm in ("grpo", *ARMS)
    ]
    if not any(r.arm in ABLATIONS for r in ablation_records):
        ablation_records = []
    header = (
        f"GRPO vs ExGRPO in unstable regimes of the CPU task '{args.task}': {STEPS} steps, seeds {seeds} (ablations: "
        f"{ablation_seeds} in {ABLATION_REGIME}), validation before training and every {TEST_FREQ} steps (384 "
        f"questions, one sample at T = 1), ExGRPO τ = {DELAYED_START}; the demo's settings otherwise; commit "
        f"{git_revision()}; assets {assets_digest(out)}; {host()}\n\n"
        + "".join(f"- regime {name}: {r.why} ({r.settings} {list(r.overrides)})\n" for name, r in REGIMES.items())
        + "".join(f"- arm {name}: exgrpo.enable={e} {list(o)}\n" for name, (e, o) in ARMS.items())
        + f"\ncollapsed = final validation accuracy < {COLLAPSE_FRACTION} x start; mean ± sample std over seeds\n\n"
    )
    report = header
    if main_records:
        report += (
            "## GRPO vs ExGRPO: validation accuracy\n\n"
            + validation_table(main_records)
            + "\n## Paired by seed\n\n"
            + paired_table(main_records)
            + "\n## Gradient signal (means over steps, then mean ± std over seeds)\n\n"
            + signal_table(main_records)
        )
    if ablation_records:
        report += (
            f"\n## Ablations in {ABLATION_REGIME}, seeds {ablation_seeds}: validation accuracy\n\n"
            + validation_table(ablation_records)
            + "\n## Ablations paired by seed with ExGRPO and with GRPO\n\n"
            + paired_table(ablation_records, baseline="exgrpo")
            + "\n"
            + paired_table(ablation_records, baseline="grpo")
            + "\n## Ablations: gradient signal\n\n"
            + signal_table(ablation_records)
        )
    report += "\n## Per seed\n\n" + per_seed_curves(records)
    (out / "stability_cpu.md").write_text(report)
    cap = TASK_RUN_SETTINGS[args.task].get("max_response_length", ExGRPOCpuRun.max_response_length)
    pngs = []
    for regime in dict.fromkeys(r.regime for r in records):
        by_arm = {a: [r for r in records if r.regime == regime and r.arm == a] for a in COMPARISON}
        by_arm = {a: runs for a, runs in by_arm.items() if runs}
        if by_arm:
            pngs.append(plot_regime(by_arm, out / f"stability_{regime}.png", f"GRPO vs ExGRPO, regime {regime}", cap))
    if ablation_records:
        by_arm = {a: [r for r in ablation_records if r.arm == a] for a in ("grpo", "exgrpo", *ABLATIONS)}
        by_arm = {a: runs for a, runs in by_arm.items() if runs}
        title = f"ExGRPO ablations, regime {ABLATION_REGIME}, seeds {ablation_seeds}"
        pngs.append(plot_regime(by_arm, out / "stability_ablations.png", title, cap))
    print("\n" + report)
    print(f"csv: {out / 'stability_cpu.csv'}\ntables: {out / 'stability_cpu.md'}\nfigures: {', '.join(map(str, pngs))}")
    if failed:
        print(f"[stability] {len(failed)} run(s) failed, re-run the command to retry: {failed}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(run_stoppable(main, "stability_cpu"))
