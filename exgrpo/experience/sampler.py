"""Question sampling across buckets (docs/algorithm.md §4).

A bucket weighting maps the non-empty sampleable buckets k (1 <= k <= K-1; bucket 0 is never sampled) to
weights; the bucket probability is p_k = w_k / sum_j w_j, *per bucket*, not per question. A draw of n
questions takes bucket counts c ~ Multinomial(n, p); a bucket asked for more than it holds gives all it has and
the excess is re-assigned one at a time to buckets with room, in proportion to their p. Inside a bucket,
questions are drawn uniformly without replacement. The ``uniform`` weighting (the "w/o question selection"
ablation) is uniform over all valid questions instead, not over buckets.

Weightings are registered with :func:`register_bucket_weighting` (registry and built-ins in
``exgrpo.experience.weightings``), like verl's ``register_policy_loss``: adding one is one decorated function, and
the config accepts its name.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from exgrpo.experience.records import QuestionId
from exgrpo.experience.rng import rng_state, set_rng_state
from exgrpo.experience.weightings import (
    BUCKET_WEIGHTINGS,
    bucket_probabilities,
    get_bucket_weighting,
    is_per_question,
    register_bucket_weighting,
)

if TYPE_CHECKING:
    from exgrpo.config import ExGRPOConfig
    from exgrpo.experience.experience_pool import ExperiencePool

__all__ = [
    "BUCKET_WEIGHTINGS",  # the registry lives in exgrpo.experience.weightings; re-exported here
    "BucketSampler",
    "ReplayDraw",
    "bucket_probabilities",
    "get_bucket_weighting",
    "register_bucket_weighting",
]


@dataclass
class ReplayDraw:
    """Result of one draw: the replayed questions and what produced them (for logging)."""

    question_ids: list[QuestionId]
    bucket_counts: dict[int, int] = field(default_factory=dict)
    bucket_probabilities: dict[int, float] = field(default_factory=dict)
    num_valid: int = 0  # questions that could have been drawn (sampleable, not excluded)
    requested: int = 0

    def __len__(self) -> int:
        return len(self.question_ids)

    def as_metrics(self, prefix: str = "replay/") -> dict[str, float]:
        out = {
            f"{prefix}questions": float(len(self.question_ids)),
            f"{prefix}requested": float(self.requested),
            f"{prefix}valid_questions": float(self.num_valid),
        }
        for b, c in self.bucket_counts.items():
            out[f"{prefix}bucket_{b}"] = float(c)
        return out


class BucketSampler:
    """Seeded bucket sampler; its RNG state is in :meth:`state_dict` (JSON-serialisable)."""

    def __init__(
        self, k: int, *, weighting: str = "normal", mu: float = 0.5, sigma: float | None = None, seed: int = 0
    ):
        """K (>= 2), ``weighting`` (a registered one), ``mu`` and ``sigma`` (> 0; None = 1/K) as the keys of a
        validated config (``exgrpo.k``, ``weighting``, ``mu``, ``sigma``: checked there, not again here)."""
        self.k = k
        self.weighting = weighting
        self.mu = float(mu)
        self.sigma = 1.0 / k if sigma is None else float(sigma)
        self.rng = np.random.default_rng([int(seed), 0x5A])  # stream distinct from the selection's

    @classmethod
    def from_config(cls, cfg: ExGRPOConfig) -> BucketSampler:
        assert cfg.k is not None, "ExGRPOConfig.k must be set (validate the config first)"
        return cls(cfg.k, weighting=cfg.weighting, mu=cfg.mu, sigma=cfg.sigma, seed=cfg.seed)

    @property
    def sampleable_buckets(self) -> range:
        """Buckets 1..K-1: bucket 0 (a later 0/K result) is never sampled; k = K is retired."""
        return range(1, self.k)

    def draw(self, pool: ExperiencePool, num_questions: int, exclude: Iterable[QuestionId] | None = None) -> ReplayDraw:
        """Draw up to ``num_questions`` distinct questions (n = min(num_questions, |valid|)).

        ``num_questions`` is floor(rho*B) (see :func:`exgrpo.schedule.replay_count`); ``exclude`` holds the
        questions already in the batch as fresh prompts (OUR CHOICE: never both replay and fresh, §4).
        """
        if pool.k != self.k:
            raise ValueError(f"sampler has K={self.k} but the pool has K={pool.k}")
        excl: Collection[QuestionId] = exclude if isinstance(exclude, (set, frozenset)) else set(exclude or ())
        index = pool.buckets
        excluded_pos: dict[int, list[int]] = {}
        for q in excl:
            b = index.bucket_of(q)
            if b is not None and b >= 1:
                excluded_pos.setdefault(b, []).append(index.position(q))
        for pos in excluded_pos.values():
            pos.sort()
        buckets = [b for b in self.sampleable_buckets]
        avail = np.array([index.size(b) - len(excluded_pos.get(b, ())) for b in buckets], dtype=np.int64)
        num_valid = int(avail.sum())
        n = min(int(num_questions), num_valid)
        draw = ReplayDraw(question_ids=[], num_valid=num_valid, requested=int(num_questions))
        if n <= 0:
            return draw
        nonempty = [i for i, a in enumerate(avail) if a > 0]
        ks = [buckets[i] for i in nonempty]
        p = bucket_probabilities(ks, self.k, self.weighting, self.mu, self.sigma)
        draw.bucket_probabilities = {b: float(pk) for b, pk in zip(ks, p, strict=True)}
        av = avail[nonempty]

        if is_per_question(self.weighting):
            # Uniform over all valid questions: one draw over the concatenation of the buckets.
            flat = self.rng.choice(num_valid, size=n, replace=False)
            bounds = np.cumsum(av)
            which = np.searchsorted(bounds, flat, side="right")
            local = flat - np.concatenate([[0], bounds[:-1]])[which]
            counts = np.bincount(which, minlength=len(ks))
            for j, i in zip(which.tolist(), local.tolist(), strict=True):
                draw.question_ids.append(self._member(pool, ks[j], i, excluded_pos.get(ks[j], [])))
            draw.bucket_counts = {b: int(c) for b, c in zip(ks, counts, strict=True) if c}
            return draw

        counts = self.rng.multinomial(n, p)
        # Overflow (§4): a bucket asked for more than it holds gives all; the excess is re-assigned one at a
        # time to buckets with room, in proportion to their p.
        excess = int(np.maximum(counts - av, 0).sum())
        counts = np.minimum(counts, av)
        while excess > 0:
            room = (av - counts) > 0
            q = p * room
            if q.sum() <= 0:  # every bucket with room has p = 0 (underflow): uniform over them
                q = room.astype(np.float64)
            j = int(self.rng.choice(len(q), p=q / q.sum()))
            counts[j] += 1
            excess -= 1
        for j, b in enumerate(ks):
            c = int(counts[j])
            if c == 0:
                continue
            local = self.rng.choice(int(av[j]), size=c, replace=False)
            excl_b = excluded_pos.get(b, [])
            draw.question_ids.extend(self._member(pool, b, int(i), excl_b) for i in local)
            draw.bucket_counts[b] = c
        return draw

    @staticmethod
    def _member(pool: ExperiencePool, bucket: int, i: int, excluded_sorted: list[int]) -> QuestionId:
        """The i-th member of the bucket that is not at an excluded position."""
        pos = i
        for e in excluded_sorted:
            if e <= pos:
                pos += 1
            else:
                break
        return pool.buckets.members(bucket)[pos]

    def expected_probabilities(self, pool: ExperiencePool) -> dict[int, float]:
        """Bucket probabilities over the pool's currently non-empty sampleable buckets (for logging)."""
        ks = [b for b in self.sampleable_buckets if pool.buckets.size(b) > 0]
        return {
            b: float(p)
            for b, p in zip(ks, bucket_probabilities(ks, self.k, self.weighting, self.mu, self.sigma), strict=True)
        }

    def state_dict(self) -> dict[str, Any]:
        return {"rng": rng_state(self.rng)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        set_rng_state(self.rng, state["rng"])
