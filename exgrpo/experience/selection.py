"""Trajectory selection: one stored trajectory per replayed question (docs/algorithm.md §5).

Default: score every stored trajectory of a drawn question under the *current* policy and take the argmin of
its mean token entropy H(o) = (1/|o|) sum_t H_t. The per-trajectory score comes from
:func:`trajectory_scores`, a masked mean per row over the response tokens only (the released code averaged
over another row's pad positions, which favours short trajectories; that bug is not reproduced).

Metrics are registered with :func:`register_trajectory_metric` (registry and built-ins in
``exgrpo.experience.trajectory_metrics``). A metric gets the candidate lists of the drawn
questions and a :class:`MetricContext` (the score provider, the seeded RNG, the n-gram size) and returns one
score array per question; :class:`TrajectorySelector` then takes the argmin (``mode='min'``) or argmax.

The model's figures reach selection in one form: :class:`CandidateTokenStats`, the per-token entropies and
log-probs of every candidate under the current policy (padded ``[N, T]`` tensors with their response mask, in
the flat order of the candidate lists). The trainer gets them from the old-log-prob pass it runs anyway (the
candidates ride along with the step's fresh rows); :meth:`CandidateTokenStats.scores` reduces them per
candidate with :func:`trajectory_scores`. Inside the selector a metric sees a *score provider*
``provider(candidates, quantity) -> scores`` (one float per candidate), which is what a custom metric calls.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from exgrpo.experience.records import Candidate, QuestionId
from exgrpo.experience.rng import rng_state, set_rng_state
from exgrpo.experience.trajectory_metrics import (
    TRAJECTORY_METRICS,
    MetricContext,
    ScoreProvider,
    get_trajectory_metric,
    needs_scores,
    ngram_overlap_scores,
    register_trajectory_metric,
)

if TYPE_CHECKING:
    import torch

    from exgrpo.config import ExGRPOConfig

__all__ = [
    "TRAJECTORY_METRICS",  # the registry lives in exgrpo.experience.trajectory_metrics; re-exported here
    "CandidateTokenStats",
    "MetricContext",
    "ScoreProvider",
    "SelectedTrajectory",
    "TrajectorySelector",
    "get_trajectory_metric",
    "masked_mean_per_row",
    "ngram_overlap_scores",
    "register_trajectory_metric",
    "selection_metrics",
    "trajectory_scores",
]


# ---------------------------------------------------------------------------------------------- score helpers
def masked_mean_per_row(values: torch.Tensor, mask: torch.Tensor, eps: float = 1e-8) -> torch.Tensor:
    """Mean of ``values`` over the positions where ``mask`` is set, per row ([B, T] -> [B]).

    Each row is divided by its *own* mask count (never another row's), and an all-zero mask gives 0, not NaN.
    Computed in float64 (bf16/fp32 entropies summed over 8k tokens lose precision; near-ties must not flip).
    """
    import torch  # here, not at import: the pool's tools (python -m exgrpo.pool) never score trajectories

    if values.shape != mask.shape:
        raise ValueError(f"values {tuple(values.shape)} and mask {tuple(mask.shape)} must have the same shape")
    dtype = torch.float64
    m = mask.to(dtype)
    total = (values.to(dtype) * m).sum(dim=-1)
    return total / m.sum(dim=-1).clamp_min(eps)


def trajectory_scores(
    quantity: str,
    response_mask: torch.Tensor,
    *,
    entropies: torch.Tensor | None = None,
    log_probs: torch.Tensor | None = None,
) -> torch.Tensor:
    """Per-trajectory score from per-token statistics of the current policy ([B, T] each -> [B]).

    ``entropy``: masked mean of the full-vocabulary token entropies (temperature 1); ``nll``: masked mean of
    -log p of the sampled tokens.
    """
    if quantity == "entropy":
        if entropies is None:
            raise ValueError("trajectory_scores('entropy') needs per-token entropies")
        return masked_mean_per_row(entropies, response_mask)
    if quantity == "nll":
        if log_probs is None:
            raise ValueError("trajectory_scores('nll') needs per-token log-probs")
        return masked_mean_per_row(-log_probs, response_mask)
    raise ValueError(f"unknown score quantity {quantity!r}; expected 'entropy' or 'nll'")


@dataclass(frozen=True)
class CandidateTokenStats:
    """Per-token figures of the candidates under the current policy: the one input selection takes from a model.

    ``response_mask``, ``entropy`` and ``log_prob`` are ``[N, T]`` (padded; row i = the i-th candidate of the
    flattened candidate lists). ``entropy`` is the full-vocabulary entropy of the distribution that predicted each
    response token, ``log_prob`` the log-probability of the sampled token. Either may be None when the selection
    metric does not need it.
    """

    response_mask: torch.Tensor
    entropy: torch.Tensor | None = None
    log_prob: torch.Tensor | None = None

    def __post_init__(self) -> None:
        for name in ("entropy", "log_prob"):
            t = getattr(self, name)
            if t is not None and tuple(t.shape) != tuple(self.response_mask.shape):
                raise ValueError(
                    f"CandidateTokenStats.{name} has shape {tuple(t.shape)}; the response mask has "
                    f"{tuple(self.response_mask.shape)}"
                )

    def __len__(self) -> int:
        return int(self.response_mask.shape[0])

    def scores(self, quantity: str) -> np.ndarray:
        """One float64 score per candidate: :func:`trajectory_scores` over the response tokens."""
        out = trajectory_scores(quantity, self.response_mask, entropies=self.entropy, log_probs=self.log_prob)
        return out.detach().cpu().numpy()

    def provider(self) -> ScoreProvider:
        """The score provider a metric calls: checks the candidate count, then reduces per candidate."""

        def provide(flat: Sequence[Candidate], quantity: str) -> np.ndarray:
            if len(flat) != len(self):
                raise ValueError(f"token statistics of {len(self)} candidates for {len(flat)} candidates")
            return self.scores(quantity)

        return provide


# ---------------------------------------------------------------------------------------------- selector
@dataclass(frozen=True)
class SelectedTrajectory:
    """The trajectory chosen for a replayed question, with its score and how many were scored."""

    candidate: Candidate
    score: float
    num_candidates: int

    @property
    def question_id(self) -> QuestionId:
        return self.candidate.question_id

    @property
    def entry_id(self) -> int:
        return self.candidate.entry_id

    @property
    def token_ids(self) -> np.ndarray:
        return self.candidate.token_ids

    @property
    def response_ids(self) -> np.ndarray:
        """Alias of :attr:`token_ids` (the stored response token ids, EOS included)."""
        return self.candidate.token_ids

    @property
    def behaviour_log_probs(self) -> np.ndarray:
        return self.candidate.behaviour_log_probs


class TrajectorySelector:
    """Choose one trajectory per question by a registered metric; seeded RNG in :meth:`state_dict`."""

    def __init__(self, metric: str = "entropy", mode: str = "min", *, seed: int = 0, ngram: int = 4):
        """``metric``, ``mode`` (min | max) and ``ngram`` (>= 1) as ``exgrpo.trajectory_metric``,
        ``trajectory_mode`` and ``diversity_ngram`` of a validated config (checked there, not again here)."""
        self.metric = metric
        self.mode = mode
        self.ngram = ngram
        self.rng = np.random.default_rng([int(seed), 0x5E])  # stream distinct from the sampler's

    @classmethod
    def from_config(cls, cfg: ExGRPOConfig) -> TrajectorySelector:
        return cls(cfg.trajectory_metric, cfg.trajectory_mode, seed=cfg.seed, ngram=cfg.diversity_ngram)

    @property
    def needs_scores(self) -> bool:
        """Whether :meth:`select` will call the score provider (i.e. the trainer must run the model pass)."""
        return needs_scores(self.metric)

    def select(
        self, groups: Sequence[Sequence[Candidate]], score_provider: ScoreProvider | None = None
    ) -> list[SelectedTrajectory]:
        """One :class:`SelectedTrajectory` per candidate list, in order.

        Ties go to the earliest candidate (the oldest stored). Non-finite scores are skipped; a question whose
        scores are all non-finite is an error naming it.
        """
        for g in groups:
            if not g:
                raise ValueError("every drawn question needs at least one candidate trajectory")
        if not groups:
            return []
        ctx = MetricContext(score_provider=score_provider, rng=self.rng, ngram=self.ngram)
        scores = get_trajectory_metric(self.metric)(groups, ctx)
        if len(scores) != len(groups):
            raise ValueError(f"metric {self.metric!r} returned {len(scores)} score arrays for {len(groups)} questions")
        out = []
        for g, s in zip(groups, scores, strict=True):
            s = np.asarray(s, dtype=np.float64)
            if s.shape != (len(g),):
                raise ValueError(f"metric {self.metric!r} returned shape {s.shape} for {len(g)} candidates")
            finite = np.isfinite(s)
            if not finite.any():
                raise ValueError(f"all {self.metric} scores of question {g[0].question_id!r} are non-finite: {s}")
            if self.mode == "min":
                i = int(np.argmin(np.where(finite, s, np.inf)))
            else:
                i = int(np.argmax(np.where(finite, s, -np.inf)))
            out.append(SelectedTrajectory(candidate=g[i], score=float(s[i]), num_candidates=len(g)))
        return out

    def state_dict(self) -> dict[str, Any]:
        return {"rng": rng_state(self.rng)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        set_rng_state(self.rng, state["rng"])


def selection_metrics(selected: Sequence[SelectedTrajectory], prefix: str = "selection/") -> dict[str, float]:
    """Mean selected score / candidates / length, for logging."""
    if not selected:
        return {}
    return {
        f"{prefix}score_mean": float(np.mean([s.score for s in selected])),
        f"{prefix}candidates_mean": float(np.mean([s.num_candidates for s in selected])),
        f"{prefix}length_mean": float(np.mean([s.candidate.length for s in selected])),
    }
