"""Figures of a saved pool (matplotlib, imported only here and only when a figure is asked for).

* :func:`plot_summary`: one checkpoint at a glance: questions and trajectories per bucket, the response lengths
  of the stored trajectories, their ages (steps since collected), and how many trajectories each question holds.
* :func:`plot_across`: a run's checkpoints in step order: questions per bucket and retired questions as stacked
  areas, the pool's size (trajectories) and its trajectories' mean length (tokens per trajectory) below.
"""

from __future__ import annotations

import os
import pathlib
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from exgrpo.pool.summary import PoolSummary, bucket_axis, bucket_label

__all__ = ["plot_across", "plot_summary"]


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(fig: Any, out: str | os.PathLike[str]) -> pathlib.Path:
    out = pathlib.Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=120)
    return out


def _bucket_colors(plt: Any, k: int) -> list[Any]:
    cmap = plt.get_cmap("viridis")
    return [cmap(0.1 + 0.8 * b / max(1, k - 1)) for b in range(k)]


def plot_summary(summary: PoolSummary, out: str | os.PathLike[str]) -> pathlib.Path:
    """The one-checkpoint figure (module docstring), written to ``out`` (PNG)."""
    plt = _pyplot()
    f, a = summary.figures, summary.arrays
    k, mode = f["k"], f["reward_mode"]
    buckets = [r for r in f["buckets"] if r["bucket"] is not None and r["bucket"] >= 0]
    labels = [r["label"] for r in buckets]
    colors = _bucket_colors(plt, k)
    fig, axes = plt.subplots(2, 2, figsize=(12, 8))
    title = f"{f['pool']}\n{f['trajectories']:,} trajectories of {f['questions']:,} questions, {f['retired']:,} retired"
    if f["step"] is not None:
        title = f"step {f['step']}: " + title
    fig.suptitle(title, fontsize=10)

    ax = axes[0, 0]
    x = np.arange(len(buckets))
    ax.bar(x - 0.2, [r["questions"] for r in buckets], 0.4, label="questions", color=colors)
    ax.bar(x + 0.2, [r["trajectories"] for r in buckets], 0.4, label="trajectories", color=colors, alpha=0.45)
    ax.set_xticks(x, labels)
    ax.set_xlabel(f"bucket ({bucket_axis(mode)})")
    ax.set_title("questions (solid) and trajectories (light) per bucket")

    ax = axes[0, 1]
    lengths = a["length"]
    if lengths.shape[0]:
        lo, hi = int(lengths.min()), int(lengths.max())
        bins = np.arange(lo - 0.5, hi + 1.5) if hi - lo <= 60 else np.linspace(lo, hi, 41)
        stack = [lengths[a["bucket"] == r["bucket"]] for r in buckets]
        ax.hist(stack, bins=bins, stacked=True, color=colors[: len(stack)], label=labels)
        ax.legend(title="bucket", fontsize=8)
    ax.set_xlabel("response length (tokens)")
    ax.set_ylabel("trajectories")
    ax.set_title("response length of the stored trajectories")

    ax = axes[1, 0]
    ages = a["age"]
    if ages.shape[0]:
        bins = np.arange(-0.5, ages.max() + 1.5) if ages.max() <= 60 else 40
        stack = [ages[a["bucket"] == r["bucket"]] for r in buckets]
        ax.hist(stack, bins=bins, stacked=True, color=colors[: len(stack)], label=labels)
    ax.set_xlabel(f"age: steps since collected (last collect at step {f['last_step']})")
    ax.set_ylabel("trajectories")
    ax.set_title("age of the stored trajectories")

    ax = axes[1, 1]
    per_q = np.bincount(a["question"])
    per_q = per_q[per_q > 0]
    if per_q.shape[0]:
        ax.hist(per_q, bins=np.arange(0.5, per_q.max() + 1.5), color="tab:gray")
    lp = f["log_prob_mean"]
    ax.set_xlabel("stored trajectories per question")
    ax.set_ylabel("questions")
    ax.set_title(
        "trajectories per question" + (f"  (behaviour log-prob / token {lp:.3f})" if lp is not None else ""),
    )
    for axis in (*(a.yaxis for a in axes.flat), axes[0, 1].xaxis, axes[1, 0].xaxis, axes[1, 1].xaxis):
        _whole_numbers(axis)  # counts, lengths, ages: no 0.75 trajectories per question
    fig.tight_layout()
    path = _save(fig, out)
    plt.close(fig)
    return path


def _whole_numbers(axis: Any) -> None:
    from matplotlib.ticker import MaxNLocator

    axis.set_major_locator(MaxNLocator(integer=True, steps=[1, 2, 5, 10]))


def plot_across(rows: Sequence[Mapping[str, Any]], out: str | os.PathLike[str], *, title: str = "") -> pathlib.Path:
    """The run figure (module docstring) from :func:`~exgrpo.pool.summary.across_row` rows in step order."""
    plt = _pyplot()
    k = max(r["k"] for r in rows)
    mode = rows[0]["reward_mode"]
    steps = [r["step"] for r in rows]
    per_bucket = np.array([[*r["buckets"], *[0] * (k - len(r["buckets"]))] for r in rows], dtype=float).T
    retired = np.array([r["retired"] for r in rows], dtype=float)
    colors = _bucket_colors(plt, k)
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(10, 8), sharex=True, height_ratios=[2, 1])
    top.stackplot(
        steps,
        *per_bucket,
        retired,
        labels=[f"bucket {bucket_label(mode, b, k)}" for b in range(k)] + ["retired"],
        colors=[*colors, "lightgray"],
    )
    top.set_ylabel("questions")
    top.set_title(title or f"the pool over the run's {len(rows)} checkpoints: questions per bucket and retired")
    top.legend(loc="upper left", fontsize=8, ncol=2)
    bottom.plot(steps, [r["trajectories"] for r in rows], "o-", color="tab:blue", label="trajectories")
    bottom.set_ylabel("trajectories", color="tab:blue")
    # the tokens per trajectory, not the tokens: those grow with the trajectories, and on a twin axis the two
    # lines lie on top of each other
    twin = bottom.twinx()
    per = [r["tokens"] / r["trajectories"] if r["trajectories"] else float("nan") for r in rows]
    twin.plot(steps, per, "s--", color="tab:orange", label="tokens per trajectory")
    twin.set_ylabel("tokens per trajectory", color="tab:orange")
    finite = [v for v in per if v == v]
    if finite:  # from 0: a length that barely moves must not fill the panel
        twin.set_ylim(0, 1.15 * max(finite))
    bottom.set_xlabel("training step (checkpoint)")
    bottom.set_title("pool size and the stored trajectories' mean length")
    for axis in (bottom.xaxis, bottom.yaxis, top.yaxis):  # steps and counts: whole numbers only
        _whole_numbers(axis)
    fig.tight_layout()
    path = _save(fig, out)
    plt.close(fig)
    return path
