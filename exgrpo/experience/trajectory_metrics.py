"""Trajectory metrics (docs/algorithm.md §5): the registry ``exgrpo.trajectory_metric`` selects from.

A metric gets the candidate lists of the drawn questions and a :class:`MetricContext` (the score provider, the
selector's seeded RNG, the n-gram size) and returns one score array per question; :class:`TrajectorySelector`
then takes the argmin (``mode='min'``) or the argmax. Built in: ``entropy`` / ``nll`` (mean token entropy / −log p
under the current policy, from the score provider), ``random`` and ``diversity`` (n-gram overlap). Adding one::

    @register_trajectory_metric("length")
    def length_metric(groups, ctx):
        return [np.array([c.length for c in g], dtype=float) for g in groups]

Like the bucket weightings, the registry sits apart from the selector so that the config can validate a metric
name without importing the selector (which imports the config for ``from_config``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from exgrpo.experience.records import Candidate
from exgrpo.registry import Registry

__all__ = [
    "TRAJECTORY_METRICS",
    "MetricContext",
    "ScoreProvider",
    "TrajectoryMetric",
    "get_trajectory_metric",
    "needs_scores",
    "ngram_overlap_scores",
    "register_trajectory_metric",
]

#: ``provider(flat candidates, quantity) -> one score per candidate`` (quantity "entropy" or "nll").
ScoreProvider = Callable[[Sequence[Candidate], str], Any]


@dataclass
class MetricContext:
    score_provider: ScoreProvider | None
    rng: np.random.Generator
    ngram: int = 4


#: (candidate lists, one per drawn question; context) -> one score array per question.
TrajectoryMetric = Callable[[Sequence[Sequence[Candidate]], MetricContext], list[np.ndarray]]

TRAJECTORY_METRICS: Registry[TrajectoryMetric] = Registry("trajectory metric", key="exgrpo.trajectory_metric")


def register_trajectory_metric(
    name: str, *, needs_scores: bool = False
) -> Callable[[TrajectoryMetric], TrajectoryMetric]:
    """Register a trajectory metric under ``name`` (``exgrpo.trajectory_metric``). ``needs_scores``: it calls the
    score provider, so the trainer must compute the candidates' token statistics under the current policy."""
    return TRAJECTORY_METRICS.register(name, needs_scores=needs_scores)


def get_trajectory_metric(name: str) -> TrajectoryMetric:
    """The metric registered as ``name``; an unknown name raises ``UnknownNameError`` (a ValueError and a KeyError)
    with the registered names and a did-you-mean."""
    return TRAJECTORY_METRICS[name]


def needs_scores(name: str) -> bool:
    """Whether the metric calls the score provider (registered with ``needs_scores=True``)."""
    return bool(TRAJECTORY_METRICS.tag(name, "needs_scores", False))


def _split(scores: Any, groups: Sequence[Sequence[Candidate]], what: str) -> list[np.ndarray]:
    if hasattr(scores, "detach"):  # a torch tensor (any dtype, any device): float64 on the CPU first
        scores = scores.detach().double().cpu().numpy()
    flat = np.asarray(scores, dtype=np.float64).reshape(-1)
    total = sum(len(g) for g in groups)
    if flat.shape[0] != total:
        raise ValueError(f"the score provider returned {flat.shape[0]} {what} scores for {total} candidates")
    out, off = [], 0
    for g in groups:
        out.append(flat[off : off + len(g)])
        off += len(g)
    return out


def _provided(quantity: str) -> TrajectoryMetric:
    def metric(groups: Sequence[Sequence[Candidate]], ctx: MetricContext) -> list[np.ndarray]:
        if ctx.score_provider is None:
            raise ValueError(f"trajectory metric {quantity!r} needs a score provider (the current policy's pass)")
        flat = [c for g in groups for c in g]
        return _split(ctx.score_provider(flat, quantity), groups, quantity)

    metric.__name__ = f"{quantity}_metric"
    metric.__doc__ = f"Mean token {quantity} of each candidate under the current policy (from the provider)."
    return metric


register_trajectory_metric("entropy", needs_scores=True)(_provided("entropy"))
register_trajectory_metric("nll", needs_scores=True)(_provided("nll"))


@register_trajectory_metric("random")
def random_metric(groups: Sequence[Sequence[Candidate]], ctx: MetricContext) -> list[np.ndarray]:
    """Uniform random scores from the selector's seeded RNG (the "w/o trajectory selection" ablation)."""
    return [ctx.rng.random(len(g)) for g in groups]


@register_trajectory_metric("diversity")
def diversity_metric(groups: Sequence[Sequence[Candidate]], ctx: MetricContext) -> list[np.ndarray]:
    """Mean token n-gram Jaccard overlap with the question's other candidates (mode 'min' = most distinct)."""
    return [ngram_overlap_scores([c.token_ids for c in g], ctx.ngram) for g in groups]


def _ngram_codes(ids: np.ndarray, n: int) -> np.ndarray:
    """Unique 64-bit codes of the token n-grams (polynomial hash; collisions are negligible here)."""
    x = np.asarray(ids, dtype=np.uint64)
    if x.shape[0] < n:  # shorter than one n-gram: the whole sequence is its only "n-gram"
        n = max(1, x.shape[0])
    windows = np.lib.stride_tricks.sliding_window_view(x, n)
    powers = np.full(n, 1_000_003, dtype=np.uint64) ** np.arange(n, dtype=np.uint64)
    with np.errstate(over="ignore"):
        codes = (windows * powers).sum(axis=1, dtype=np.uint64) + np.uint64(n)
    return np.unique(codes)


def ngram_overlap_scores(sequences: Sequence[np.ndarray], n: int = 4) -> np.ndarray:
    """For each sequence, its mean Jaccard overlap of n-gram sets with the other sequences (0 if alone)."""
    sets = [_ngram_codes(s, n) for s in sequences]
    m = len(sets)
    scores = np.zeros(m, dtype=np.float64)
    if m < 2:
        return scores
    for i in range(m):
        for j in range(i + 1, m):
            inter = np.intersect1d(sets[i], sets[j], assume_unique=True).shape[0]
            union = sets[i].shape[0] + sets[j].shape[0] - inter
            jac = inter / union if union else 0.0
            scores[i] += jac
            scores[j] += jac
    return scores / (m - 1)
