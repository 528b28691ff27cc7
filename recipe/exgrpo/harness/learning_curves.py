"""Learning curves of CPU runs: parse verl's metrics file, draw the demo's PNG, aggregate seeds per arm.

Used by the CPU demo (``recipe.exgrpo.harness.demo``: one run, one PNG) and by ``benchmarks/learning_cpu.py``
(ExGRPO vs on-policy GRPO over seeds: a CSV of every point, a PNG of mean ± spread per arm, a Markdown table).
Input is what verl's ``file`` logger writes (``metrics.jsonl``, one JSON line per logged step); the validation
accuracy comes from verl's ``val-core/<data_source>/<acc|reward>/mean@N`` keys, one per difficulty level when
the data is the toy arithmetic task (its ``data_source`` is ``toy_arithmetic_<level>``).

Nothing here imports verl or Ray; matplotlib is imported only to draw.
"""

from __future__ import annotations

import csv
import json
import math
import re
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from exgrpo.modes import DEFAULT_REWARD_MODE, get_reward_mode

VAL_KEY = re.compile(r"^val-core/(?P<source>[^/]+)/(?P<var>[^/]+)/mean@(?P<n>\d+)$")
# verl files a variable under val-aux when the reward also returns "acc" (which then is the val-core one)
VAL_ANY_KEY = re.compile(r"^val-(?:core|aux)/(?P<source>[^/]+)/(?P<var>[^/]+)/mean@(?P<n>\d+)$")
# the recipe's reward logs whether each response closed its think block (the toy task's format)
THINK_KEY = re.compile(r"^val-aux/(?P<source>[^/]+)/think_closed/mean@(?P<n>\d+)$")
DEFAULT_SOURCE_PREFIX = "toy_arithmetic_"
#: the data sources' prefixes of the CPU tasks' levels: the toy sums and the procedure-choice task
SOURCE_PREFIXES = (DEFAULT_SOURCE_PREFIX, "procedures_")
#: the replay step's share of groups with zero reward variance (exgrpo/gradient_signal.py), every group counted
ZERO_VAR_KEY = "exgrpo/signal/zero_var_share"
BUCKET_KEY = re.compile(r"^exgrpo/pool/bucket_(?P<k>\d+)$")


# ---------------------------------------------------------------------------------------------- one run
def read_metrics_file(path: str | Path) -> list[dict[str, Any]]:
    """The per-step metric dicts of verl's file logger (``{"step": n, "data": {...}}`` per line).

    Lines that are not JSON (a run killed mid-write) are skipped; each dict gets its ``step``.
    """
    rows = []
    path = Path(path)
    if not path.exists():
        return rows
    for line in path.read_text().splitlines():
        data = parse_metrics_line(line)
        if data is not None:
            rows.append(data)
    return rows


def parse_metrics_line(line: str) -> dict[str, Any] | None:
    """One line of verl's file logger as a flat metric dict with its ``step``; None for a blank or torn line."""
    line = line.strip()
    if not line:
        return None
    try:
        record = json.loads(line)
    except json.JSONDecodeError:
        return None
    data = dict(record.get("data", record))
    data.setdefault("step", record.get("step"))
    return data


def validation_by_source(row: Mapping[str, Any], var: str | None = None) -> dict[str, float]:
    """``data_source -> mean@N`` validation score of one metrics row (``acc`` when logged, else ``reward``; only
    ``var`` when given, e.g. ``reward`` for a continuous reward's mean)."""
    found: dict[str, tuple[int, float]] = {}
    for key, value in row.items():
        m = (VAL_KEY if var is None else VAL_ANY_KEY).match(key)
        if not m or not isinstance(value, (int, float)):
            continue
        if var is not None:
            rank = 0 if m["var"] == var else 2
        else:
            rank = 0 if m["var"] == "acc" else 1 if m["var"] == "reward" else 2
        if rank == 2:
            continue
        source = m["source"]
        if source not in found or rank < found[source][0]:
            found[source] = (rank, float(value))
    return {source: value for source, (_, value) in found.items()}


LEVEL_ORDER = ("easy", "medium", "hard")


def ordered_levels(names) -> list[str]:
    """The toy task's levels in difficulty order, any other names after them alphabetically."""
    return sorted(names, key=lambda n: (LEVEL_ORDER.index(n) if n in LEVEL_ORDER else len(LEVEL_ORDER), n))


def level_name(source: str, prefix: str | None = None) -> str:
    """The level of a data source: the source less its task's prefix (``prefix``, else any of
    :data:`SOURCE_PREFIXES`)."""
    for known in (prefix,) if prefix is not None else SOURCE_PREFIXES:
        if source.startswith(known) and len(source) > len(known):
            return source[len(known) :]
    return source


@dataclass
class RunCurve:
    """Per-step figures of one run (training steps) and its validation points (step 0 = before training)."""

    label: str
    steps: list[int] = field(default_factory=list)
    sampled_pass_rate: list[float] = field(default_factory=list)
    batch_pass_rate: list[float] = field(default_factory=list)
    pool_entries: list[float] = field(default_factory=list)
    pool_questions: list[float] = field(default_factory=list)
    retired: list[float] = field(default_factory=list)
    replayed_share: list[float] = field(default_factory=list)
    generated_rollouts: list[float] = field(default_factory=list)  # cumulative, replayed members not counted
    step_seconds: list[float] = field(default_factory=list)
    val_steps: list[int] = field(default_factory=list)
    val_acc: list[float] = field(default_factory=list)
    val_by_level: dict[str, list[float]] = field(default_factory=dict)
    # share of validation responses that close the think block (mean over levels; empty when not logged)
    val_think_closed: list[float] = field(default_factory=list)
    # the run's reward mode (exgrpo.reward_mode) and, per step, its training signal (RewardMode.signal_metric: the
    # binary mode's sampled pass rate, the continuous mode's mean reward of the sampled responses)
    reward_mode: str = DEFAULT_REWARD_MODE
    signal: list[float] = field(default_factory=list)
    # runs that call tools: per step, the share of generated responses that got a tool's answer
    # (exgrpo/multi_turn/tool_turn_share); per validation point and level, the share of responses that called the
    # calculator (the tool task's reward logs tool_call); empty otherwise
    tool_turn_share: list[float] = field(default_factory=list)
    replayed_tool_turn_share: list[float] = field(default_factory=list)  # NaN at steps that replayed nothing
    val_tool_call_by_level: dict[str, list[float]] = field(default_factory=dict)
    # per step, the share of the batch's groups whose rewards differ (a non-zero advantage: GRPO's gradient comes
    # from these only), where the run logged it; and the pool's questions per bucket (success count k) at the end
    nonzero_group_share: list[float] = field(default_factory=list)
    final_buckets: dict[int, float] = field(default_factory=dict)
    wall_seconds: float | None = None

    @property
    def levels(self) -> list[str]:
        return list(self.val_by_level)

    @property
    def val_tool_call(self) -> list[float]:
        """The validation call rate per point, the mean over levels (the levels have equal sizes)."""
        per_level = list(self.val_tool_call_by_level.values())
        return [sum(v) / len(v) for v in zip(*per_level)] if per_level else []

    @property
    def signal_label(self) -> str:
        """What :attr:`signal` is, in words (the reward mode's)."""
        return get_reward_mode(self.reward_mode).signal_label


def run_curve(
    rows: Sequence[Mapping[str, Any]],
    label: str = "run",
    level_weights: Mapping[str, float] | None = None,
    wall_seconds: float | None = None,
    group_size: int | None = None,
    val_var: str | None = None,
    reward_mode: str = DEFAULT_REWARD_MODE,
) -> RunCurve:
    """Parse one run's metrics rows into a :class:`RunCurve`.

    The overall validation accuracy is the mean over levels weighted by ``level_weights`` (validation questions
    per level; equal weights when None: the toy task's levels have equal sizes). ``group_size`` (K) counts the
    generated responses: K per fresh question, K-1 per replayed one (NaN when not given). ``val_var``: the validation
    variable to read (see :func:`validation_by_source`). ``reward_mode``: the run's ``exgrpo.reward_mode``, whose
    signal metric fills :attr:`RunCurve.signal`.
    """
    curve = RunCurve(label=label, wall_seconds=wall_seconds, reward_mode=reward_mode)
    signal_key = get_reward_mode(reward_mode).signal_metric
    total_generated = 0.0
    for row in sorted(rows, key=lambda r: int(r.get("step") or 0)):
        step = int(row.get("step") or 0)
        if "exgrpo/batch_pass_rate" in row:
            questions = float(row.get("exgrpo/fresh_questions", 0)) + float(row.get("exgrpo/replayed_questions", 0))
            replayed = float(row.get("exgrpo/replayed_questions", 0))
            total_generated += questions * group_size - replayed if group_size else math.nan
            curve.steps.append(step)
            curve.batch_pass_rate.append(float(row["exgrpo/batch_pass_rate"]))
            curve.sampled_pass_rate.append(float(row.get("exgrpo/sampled_pass_rate", row["exgrpo/batch_pass_rate"])))
            curve.pool_entries.append(float(row.get("exgrpo/pool/entries", 0)))
            curve.pool_questions.append(float(row.get("exgrpo/pool/questions", 0)))
            curve.retired.append(float(row.get("exgrpo/pool/retired", 0)))
            curve.replayed_share.append(replayed / questions if questions else 0.0)
            curve.generated_rollouts.append(total_generated)
            curve.step_seconds.append(float(row.get("timing_s/step", math.nan)))
            if signal_key in row:
                curve.signal.append(float(row[signal_key]))
            if ZERO_VAR_KEY in row:
                curve.nonzero_group_share.append(1.0 - float(row[ZERO_VAR_KEY]))
            buckets = {int(m["k"]): float(v) for key, v in row.items() if (m := BUCKET_KEY.match(key))}
            if buckets:
                curve.final_buckets = buckets
            if "exgrpo/multi_turn/tool_turn_share" in row:
                curve.tool_turn_share.append(float(row["exgrpo/multi_turn/tool_turn_share"]))
                curve.replayed_tool_turn_share.append(
                    float(row.get("exgrpo/multi_turn/replayed_tool_turn_share", math.nan))
                )
        by_source = validation_by_source(row, val_var)
        if by_source:
            named = {level_name(s): v for s, v in by_source.items()}
            by_level = {lv: named[lv] for lv in ordered_levels(named)}
            weights = {lv: float((level_weights or {}).get(lv, 1.0)) for lv in by_level}
            overall = sum(by_level[lv] * weights[lv] for lv in by_level) / sum(weights.values())
            curve.val_steps.append(step)
            curve.val_acc.append(overall)
            for lv, v in by_level.items():
                curve.val_by_level.setdefault(lv, []).append(v)
            closed = [float(v) for k, v in row.items() if THINK_KEY.match(k) and isinstance(v, (int, float))]
            if closed:
                curve.val_think_closed.append(sum(closed) / len(closed))
            calls = {level_name(s): v for s, v in validation_by_source(row, "tool_call").items()}
            for lv in ordered_levels(calls):
                curve.val_tool_call_by_level.setdefault(lv, []).append(calls[lv])
    return curve


def describe_run(curve: RunCurve) -> str:
    """One paragraph: validation accuracy start → end (per level), sampled pass rate early → late, the pool."""
    lines = []
    if curve.val_acc:
        points = ", ".join(f"step {s}: {v:.3f}" for s, v in zip(curve.val_steps, curve.val_acc))
        lines.append(f"validation accuracy: {points}")
        start, end = curve.val_acc[0], curve.val_acc[-1]
        lines.append(f"  {start:.3f} -> {end:.3f} ({100 * (end - start):+.1f} points)")
        for lv, values in curve.val_by_level.items():
            lines.append(
                f"  {lv:<8} {values[0]:.3f} -> {values[-1]:.3f} ({100 * (values[-1] - values[0]):+.1f} points)"
            )
        if len(curve.val_think_closed) == len(curve.val_acc):
            first, last = curve.val_think_closed[0], curve.val_think_closed[-1]
            lines.append(f"  answers that close the think block: {first:.3f} -> {last:.3f}")
        if len(curve.val_tool_call) == len(curve.val_acc):
            calls = curve.val_tool_call
            lines.append(f"validation answers that call the calculator: {calls[0]:.3f} -> {calls[-1]:.3f}")
            for lv, values in curve.val_tool_call_by_level.items():
                lines.append(f"  {lv:<8} {values[0]:.3f} -> {values[-1]:.3f}")
    if curve.sampled_pass_rate:
        n = max(1, len(curve.steps) // 4)
        early = statistics.fmean(curve.sampled_pass_rate[:n])
        late = statistics.fmean(curve.sampled_pass_rate[-n:])
        lines.append(f"sampled pass rate: {early:.3f} (first {n} steps) -> {late:.3f} (last {n} steps)")
        lines.append(
            f"pool: {int(curve.pool_entries[-1])} trajectories of {int(curve.pool_questions[-1])} questions, "
            f"{int(curve.retired[-1])} retired; replayed share of the last step {curve.replayed_share[-1]:.2f}"
        )
    return "\n".join(lines)


def pyplot():
    """matplotlib's pyplot on the Agg backend (files only, no display)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


#: the colour of each toy level in every panel (its accuracy and its tool-call rate)
LEVEL_COLORS = {"easy": "tab:blue", "medium": "tab:orange", "hard": "tab:green"}


def _level_color(level: str, i: int) -> str:
    return LEVEL_COLORS.get(level, f"C{3 + i}")


def _integer_axis(axis) -> None:
    """Ticks at whole numbers only (steps, counts): a short run's axis gets no 6.5 or 1.25."""
    from matplotlib.ticker import MaxNLocator

    axis.set_major_locator(MaxNLocator(integer=True, steps=[1, 2, 5, 10]))


def plot_run(curve: RunCurve, path: str | Path, title: str | None = None) -> Path:
    """The demo's PNG: validation accuracy (overall and per level) and the training signal per step (the sampled
    pass rate; the sampled mean reward in the continuous reward mode); with tool calls, their rates in a panel of
    their own; the pool size and replayed share per step (not for on-policy GRPO, which keeps no pool)."""
    plt = pyplot()
    calls = curve.val_tool_call
    tool_panel = bool(calls and len(calls) == len(curve.val_steps)) or bool(
        curve.tool_turn_share and len(curve.tool_turn_share) == len(curve.steps)
    )
    pool_panel = bool(curve.steps) and (any(curve.pool_entries) or any(curve.replayed_share))
    ratios = [3] + ([2] if tool_panel else []) + ([2] if pool_panel else [])
    fig, axes = plt.subplots(
        len(ratios), 1, figsize=(8, 3 + 2 * len(ratios)), sharex=True, gridspec_kw={"height_ratios": ratios}
    )
    axes = list(axes) if len(ratios) > 1 else [axes]
    top = axes[0]
    if curve.val_steps:
        top.plot(curve.val_steps, curve.val_acc, "o-", color="black", lw=2, label="validation accuracy")
        for i, (lv, values) in enumerate(curve.val_by_level.items()):
            top.plot(curve.val_steps, values, ".--", color=_level_color(lv, i), lw=1, label=f"validation: {lv}")
    if curve.val_think_closed and len(curve.val_think_closed) == len(curve.val_steps):
        top.plot(
            curve.val_steps, curve.val_think_closed, "s:", color="tab:brown", lw=1, label="validation: think closed"
        )
    if curve.steps:
        # the mode's signal is the sampled pass rate already (the binary mode), or was not logged every step
        pass_rate_signal = get_reward_mode(curve.reward_mode).signal_metric == "exgrpo/sampled_pass_rate"
        binary = pass_rate_signal or len(curve.signal) != len(curve.steps)
        top.plot(
            curve.steps,
            curve.sampled_pass_rate if binary else curve.signal,
            "-",
            color="tab:gray",
            alpha=0.7,
            label="batch pass rate (sampled responses)" if binary else f"batch: {curve.signal_label}",
        )
    top.set_ylabel("accuracy" if binary else "accuracy, reward")
    top.set_ylim(0, 1)
    top.grid(alpha=0.3)
    top.legend(fontsize=8, loc="best")
    top.set_title(title or curve.label)
    if tool_panel:
        ax = axes[1]
        if calls and len(calls) == len(curve.val_steps):
            ax.plot(curve.val_steps, calls, "^-", color="tab:red", lw=2, label="validation: calls the calculator")
            for i, (lv, values) in enumerate(curve.val_tool_call_by_level.items()):
                ax.plot(curve.val_steps, values, "^:", color=_level_color(lv, i), lw=1, label=f"calls: {lv}")
        if curve.tool_turn_share and len(curve.tool_turn_share) == len(curve.steps):
            ax.plot(curve.steps, curve.tool_turn_share, "-", color="tab:pink", alpha=0.8, label="batch: tool answered")
        ax.set_ylabel("share of answers")
        ax.set_ylim(0, 1)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8, loc="best")
        ax.set_title("tool calls", fontsize=9)
    if pool_panel:
        bottom = axes[-1]
        bottom.plot(curve.steps, curve.pool_entries, "-", color="tab:green", label="pool trajectories")
        bottom.set_ylabel("pool trajectories")
        _integer_axis(bottom.yaxis)
        share = bottom.twinx()
        share.plot(curve.steps, curve.replayed_share, "-", color="tab:purple", label="replayed share")
        share.set_ylabel("replayed share of questions")
        share.set_ylim(0, 1)
        handles = bottom.get_legend_handles_labels()[0] + share.get_legend_handles_labels()[0]
        bottom.legend(handles, [h.get_label() for h in handles], fontsize=8, loc="upper left")
        bottom.grid(alpha=0.3)
    axes[-1].set_xlabel("training step")
    _integer_axis(axes[-1].xaxis)
    return save_figure(fig, path)


# ---------------------------------------------------------------------------------------------- arms × seeds
@dataclass
class ArmSummary:
    arm: str
    runs: int
    final: tuple[float, float]  # mean, sample std over seeds
    best: tuple[float, float]
    auc: tuple[float, float]
    steps_to_target: list[int | None]
    final_by_level: dict[str, tuple[float, float]]
    start: tuple[float, float]
    wall_seconds: tuple[float, float]
    generated_rollouts: tuple[float, float]


def mean_std(values: Iterable[float]) -> tuple[float, float]:
    """Mean and sample std of the finite values (NaN, NaN when there are none; std 0 for one value)."""
    vals = [v for v in values if v is not None and not math.isnan(v)]
    if not vals:
        return math.nan, math.nan
    return statistics.fmean(vals), (statistics.stdev(vals) if len(vals) > 1 else 0.0)


def area_under_curve(steps: Sequence[int], values: Sequence[float]) -> float:
    """Trapezoidal area under the validation curve divided by its step span: the curve's mean height (0..1)."""
    if len(steps) < 2:
        return values[0] if values else math.nan
    area = sum((steps[i + 1] - steps[i]) * (values[i] + values[i + 1]) / 2 for i in range(len(steps) - 1))
    return area / (steps[-1] - steps[0])


def steps_to_target(steps: Sequence[int], values: Sequence[float], target: float) -> int | None:
    """First validation step whose accuracy is at least ``target`` (None: never reached)."""
    return next((s for s, v in zip(steps, values) if v >= target), None)


def summarize_arms(curves_by_arm: Mapping[str, Sequence[RunCurve]], target: float) -> list[ArmSummary]:
    out = []
    for arm, curves in curves_by_arm.items():
        levels = ordered_levels({lv for c in curves for lv in c.val_by_level})
        out.append(
            ArmSummary(
                arm=arm,
                runs=len(curves),
                final=mean_std(c.val_acc[-1] for c in curves if c.val_acc),
                best=mean_std(max(c.val_acc) for c in curves if c.val_acc),
                auc=mean_std(area_under_curve(c.val_steps, c.val_acc) for c in curves if c.val_acc),
                steps_to_target=[steps_to_target(c.val_steps, c.val_acc, target) for c in curves],
                final_by_level={
                    lv: mean_std(c.val_by_level[lv][-1] for c in curves if c.val_by_level.get(lv)) for lv in levels
                },
                start=mean_std(c.val_acc[0] for c in curves if c.val_acc),
                wall_seconds=mean_std(c.wall_seconds for c in curves if c.wall_seconds is not None),
                generated_rollouts=mean_std(c.generated_rollouts[-1] for c in curves if c.generated_rollouts),
            )
        )
    return out


def level_table(curves_by_arm: Mapping[str, Sequence[RunCurve]]) -> str:
    """Per arm and level, mean ± std over seeds: the validation accuracy before training, at the end, the gain, and
    the area under the curve (its mean height)."""
    head = ["arm", "level", "start", "final", "gain", "AUC"]
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    for arm, curves in curves_by_arm.items():
        for lv in ordered_levels({lv for c in curves for lv in c.val_by_level}):
            runs = [(c.val_steps, c.val_by_level[lv]) for c in curves if c.val_by_level.get(lv)]
            cells = [
                mean_std(v[0] for _, v in runs),
                mean_std(v[-1] for _, v in runs),
                mean_std(v[-1] - v[0] for _, v in runs),
                mean_std(area_under_curve(s, v) for s, v in runs),
            ]
            lines.append("| " + " | ".join([arm, lv] + [plus_minus(c) for c in cells]) + " |")
    return "\n".join(lines) + "\n"


def replay_table(curves_by_arm: Mapping[str, Sequence[RunCurve]], early_steps: int = 10) -> str:
    """Per arm, mean ± std over seeds: the share of groups with a non-zero advantage (all steps, the first
    ``early_steps``, the last ``early_steps``), the replayed share of the questions, and, at the last step, the
    retired questions, the pool's questions and its bucket mix (questions per success count k, seeds' mean)."""
    head = [
        "arm",
        "non-zero-advantage groups",
        f"first {early_steps} steps",
        f"last {early_steps} steps",
        "replayed share",
        "retired (end)",
        "pool questions (end)",
        "pool by k (end)",
    ]
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    for arm, curves in curves_by_arm.items():
        shares = [c.nonzero_group_share for c in curves if c.nonzero_group_share]
        ks = sorted({k for c in curves for k in c.final_buckets})
        mix = " / ".join(f"{k}: {statistics.fmean(c.final_buckets.get(k, 0.0) for c in curves):.1f}" for k in ks)
        cells = [
            plus_minus(mean_std(statistics.fmean(v) for v in shares)),
            plus_minus(mean_std(statistics.fmean(v[:early_steps]) for v in shares)),
            plus_minus(mean_std(statistics.fmean(v[-early_steps:]) for v in shares)),
            plus_minus(mean_std(statistics.fmean(c.replayed_share) for c in curves if c.replayed_share)),
            plus_minus(mean_std(c.retired[-1] for c in curves if c.retired), 1),
            plus_minus(mean_std(c.pool_questions[-1] for c in curves if c.pool_questions), 1),
            mix or "—",
        ]
        lines.append("| " + " | ".join([arm] + cells) + " |")
    return "\n".join(lines) + "\n"


def paired_table(seeded_curves: Mapping[str, Sequence[tuple[int, RunCurve]]], baseline: str) -> str:
    """Per arm other than ``baseline``: the difference to the baseline's run of the same seed (same initial model and
    data order), in points of validation accuracy at the end and of the area under the curve, mean ± std over the
    seeds both arms ran, and the seeds where the arm ended above the baseline. Empty when the baseline has no run."""
    base = {seed: c for seed, c in seeded_curves.get(baseline, ()) if c.val_acc}
    if not base:
        return ""
    head = [f"arm − {baseline}", "seeds paired", "final (points)", "AUC (points)", "seeds ahead at the end"]
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    for arm, runs in seeded_curves.items():
        pairs = [(c, base[seed]) for seed, c in runs if arm != baseline and seed in base and c.val_acc]
        if not pairs:
            continue
        d_final = [100 * (c.val_acc[-1] - b.val_acc[-1]) for c, b in pairs]
        d_auc = [
            100 * (area_under_curve(c.val_steps, c.val_acc) - area_under_curve(b.val_steps, b.val_acc))
            for c, b in pairs
        ]
        ahead = sum(d > 0 for d in d_final)
        cells = [arm, str(len(pairs)), plus_minus(mean_std(d_final), 1), plus_minus(mean_std(d_auc), 1)]
        lines.append("| " + " | ".join([*cells, f"{ahead}/{len(pairs)}"]) + " |")
    return "\n".join(lines) + "\n"


def plot_levels(curves_by_arm: Mapping[str, Sequence[RunCurve]], path: str | Path, title: str = "") -> Path:
    """One panel per level (validation accuracy, mean ± std over seeds per arm) and one for the share of groups with
    a non-zero advantage per step."""
    plt = pyplot()
    levels = ordered_levels({lv for curves in curves_by_arm.values() for c in curves for lv in c.val_by_level})
    fig, axes = plt.subplots(1, len(levels) + 1, figsize=(4.2 * (len(levels) + 1), 4), squeeze=False)
    panels = list(axes[0])
    for i, (arm, curves) in enumerate(curves_by_arm.items()):
        color = f"C{i}"
        for ax, lv in zip(panels, levels):
            with_level = [c for c in curves if c.val_by_level.get(lv)]
            common = sorted(set.intersection(*(set(c.val_steps) for c in with_level))) if with_level else []
            values = [[c.val_by_level[lv][c.val_steps.index(s)] for c in with_level] for s in common]
            _band(ax, common, values, color, f"{arm} (n={len(with_level)})", "o-")
        with_share = [c for c in curves if len(c.nonzero_group_share) == len(c.steps) and c.steps]
        common = sorted(set.intersection(*(set(c.steps) for c in with_share))) if with_share else []
        values = [[c.nonzero_group_share[c.steps.index(s)] for c in with_share] for s in common]
        _band(panels[-1], common, values, color, arm, "-")
    for ax, lv in zip(panels, levels):
        ax.set_title(f"validation accuracy: {lv}")
    panels[-1].set_title("groups with a non-zero advantage")
    for ax in panels:
        ax.set_xlabel("training step")
        ax.set_ylim(-0.02, 1.02)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    if title:
        fig.suptitle(title)
    return save_figure(fig, path)


def _band(ax, steps: Sequence[int], values: Sequence[Sequence[float]], color: str, label: str, style: str) -> None:
    if not steps:
        return
    mean = [statistics.fmean(v) for v in values]
    std = [statistics.stdev(v) if len(v) > 1 else 0.0 for v in values]
    ax.plot(steps, mean, style, color=color, label=label, ms=3)
    ax.fill_between(
        steps, [m - s for m, s in zip(mean, std)], [m + s for m, s in zip(mean, std)], color=color, alpha=0.2
    )


def plus_minus(value: tuple[float, float], digits: int = 3) -> str:
    """``mean ± std`` of a ``(mean, std)`` pair (``n/a`` for a NaN mean)."""
    mean, std = value
    if math.isnan(mean):
        return "n/a"
    return f"{mean:.{digits}f} ± {std:.{digits}f}"


def markdown_table(summaries: Sequence[ArmSummary], target: float) -> str:
    """One row per arm: mean ± std over seeds of the validation figures, steps to target per seed, wall time."""
    levels = ordered_levels({lv for s in summaries for lv in s.final_by_level})
    head = (
        ["arm", "seeds", "start", "final", "best", "AUC", f"steps to {target:.2f}"]
        + [f"final {lv}" for lv in levels]
        + ["rollouts generated", "wall s"]
    )
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    for s in summaries:
        reached = [str(x) if x is not None else "—" for x in s.steps_to_target]
        cells = (
            [
                s.arm,
                str(s.runs),
                plus_minus(s.start),
                plus_minus(s.final),
                plus_minus(s.best),
                plus_minus(s.auc),
                ", ".join(reached),
            ]
            + [plus_minus(s.final_by_level.get(lv, (math.nan, math.nan))) for lv in levels]
            + [plus_minus(s.generated_rollouts, 0), plus_minus(s.wall_seconds, 0)]
        )
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


CSV_FIELDS = (
    "arm",
    "seed",
    "kind",
    "step",
    "val_acc",
    "level",
    "value",
    "sampled_pass_rate",
    "pool_entries",
    "replayed_share",
    "generated_rollouts",
)


def write_csv(curves_by_arm: Mapping[str, Sequence[tuple[int, RunCurve]]], path: str | Path) -> Path:
    """Every point of every run: ``kind=val`` rows (overall accuracy plus one row per level) and ``kind=train``
    rows (sampled pass rate, pool, replayed share, generated rollouts per step)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=CSV_FIELDS)
        writer.writeheader()
        for arm, runs in curves_by_arm.items():
            for seed, c in runs:
                for i, step in enumerate(c.val_steps):
                    writer.writerow({"arm": arm, "seed": seed, "kind": "val", "step": step, "val_acc": c.val_acc[i]})
                    for lv, values in c.val_by_level.items():
                        writer.writerow(
                            {
                                "arm": arm,
                                "seed": seed,
                                "kind": "val_level",
                                "step": step,
                                "level": lv,
                                "value": values[i],
                            }
                        )
                for i, step in enumerate(c.steps):
                    writer.writerow(
                        {
                            "arm": arm,
                            "seed": seed,
                            "kind": "train",
                            "step": step,
                            "sampled_pass_rate": c.sampled_pass_rate[i],
                            "pool_entries": c.pool_entries[i],
                            "replayed_share": c.replayed_share[i],
                            "generated_rollouts": c.generated_rollouts[i],
                        }
                    )
    return path


def band(curves: Sequence[RunCurve], attr_steps: str, attr_values: str) -> tuple[list[int], list[float], list[float]]:
    """Mean and sample std at the steps every run has."""
    common = sorted(set.intersection(*(set(getattr(c, attr_steps)) for c in curves))) if curves else []
    means, stds = [], []
    for s in common:
        vals = [getattr(c, attr_values)[getattr(c, attr_steps).index(s)] for c in curves]
        means.append(statistics.fmean(vals))
        stds.append(statistics.stdev(vals) if len(vals) > 1 else 0.0)
    return common, means, stds


def plot_arms(
    curves_by_arm: Mapping[str, Sequence[RunCurve]], path: str | Path, title: str = "", val_label: str = "accuracy"
) -> Path:
    """Mean ± std (over seeds) of the validation score (``val_label``: what it is) and of the training signal per arm
    (each run's reward mode's: the sampled pass rate in the binary mode, the sampled mean reward in the continuous
    one)."""
    plt = pyplot()
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5))
    labels = {c.signal_label for curves in curves_by_arm.values() for c in curves}
    signal_label = labels.pop() if len(labels) == 1 else "training signal of each arm's reward mode"
    for i, (arm, curves) in enumerate(curves_by_arm.items()):
        color = f"C{i}"
        steps, mean, std = band(curves, "val_steps", "val_acc")
        left.plot(steps, mean, "o-", color=color, label=f"{arm} (n={len(curves)})")
        left.fill_between(
            steps, [m - s for m, s in zip(mean, std)], [m + s for m, s in zip(mean, std)], color=color, alpha=0.2
        )
        steps, mean, std = band(curves, "steps", "signal")
        right.plot(steps, mean, "-", color=color, label=arm)
        right.fill_between(
            steps, [m - s for m, s in zip(mean, std)], [m + s for m, s in zip(mean, std)], color=color, alpha=0.2
        )
    left.set_title(f"validation {val_label} (mean ± std over seeds)")
    right.set_title(signal_label)
    for ax in (left, right):
        ax.set_xlabel("training step")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    if title:
        fig.suptitle(title)
    return save_figure(fig, path)


def save_figure(fig, path: str | Path) -> Path:
    """Lay out, write (creating the folder) and close ``fig``; returns ``path``."""
    import matplotlib.pyplot as plt

    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
