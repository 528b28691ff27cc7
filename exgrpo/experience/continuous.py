"""Collection with a continuous reward (docs/algorithm.md §13): buckets from the spread of a group's rewards.

With a reward model (or any real-valued reward) there is no "correct" and no "solved K/K". The paper buckets a
question by how much its K rewards spread: the within-group standard deviation σ_q, min–max normalised over the
step's groups, σ̃_q = max((σ_q − σ_min) / (σ_max − σ_min), ε), and bucket = round(σ̃_q · K); the Gaussian bucket
sampler then works on those buckets as it does on success counts. Everything else here is a choice the paper leaves
open, made explicit and switchable (each marked **ours** in docs/algorithm.md §13):

* σ_q is the population standard deviation (ddof 0) of the *counted* members' rewards (all K, or the K−1 fresh
  ones under ``count_replayed_in_k: false``), as k counts them in the binary mode;
* ``round`` rounds half up, and the bucket is clipped to the sampler's range 1..K−1 (K would be "retired" in the
  binary mode; a maximally spread question is the most informative one, never retired);
* ε (``spread_epsilon``, null = 1/K): the floor of σ̃, at which the formula itself lands on bucket 1;
* when every group of the step has the same σ (a single group included), min–max normalisation has nothing to
  rank: σ̃ = 1, ½ or 0 for all of them (``equal_spread: max | mid | min``);
* a *flat* group, σ_q ≤ ``flat_std`` (0: all rewards equal, every advantage 0, no gradient), is what k = 0 and
  k = K are in the binary mode: it retires when its mean reward reaches ``retire_mean_reward`` (null: never; a
  reward model has no "solved" level) and otherwise follows ``zero_success`` (bucket 0 or keep);
* which fresh members enter the pool: ``continuous_members`` (registry :data:`CONTINUOUS_MEMBER_RULES`):
  ``above_mean`` (reward strictly above the counted members' mean: the ones a positive advantage reinforces),
  ``top_1`` (the best fresh member, when above that mean) or ``above_threshold`` (reward ≥ ``member_threshold``:
  the binary mode's rule is this one with threshold 1).

:func:`plan_groups` takes one collect call's groups and returns, per group, what the collection rules do with it
(:class:`SpreadPlan`); ``CollectionRules.collect`` applies the plans. Pure numpy, no framework.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from exgrpo.experience.records import Group
from exgrpo.registry import Registry

__all__ = [
    "CONTINUOUS_MEMBER_RULES",
    "EQUAL_SPREAD_CHOICES",
    "ContinuousRules",
    "SpreadPlan",
    "group_spread",
    "normalised_spreads",
    "plan_groups",
    "register_member_rule",
    "spread_bucket",
]

#: exgrpo.equal_spread: σ̃ of every group when all the step's groups share one σ (min–max has nothing to rank).
EQUAL_SPREAD_CHOICES = {"max": 1.0, "mid": 0.5, "min": 0.0}

#: A member rule: (rewards of all K members, which of them are fresh, the counted members' mean, the threshold)
#: -> indices of the fresh members to store, in member order.
MemberRule = Callable[[np.ndarray, np.ndarray, float, float | None], list[int]]
CONTINUOUS_MEMBER_RULES: Registry[MemberRule] = Registry("continuous member rule", key="exgrpo.continuous_members")


def register_member_rule(name: str, **tags: Any) -> Callable[[MemberRule], MemberRule]:
    """Decorator: register a rule choosing which fresh members of a group enter the pool."""
    return CONTINUOUS_MEMBER_RULES.register(name, **tags)


@register_member_rule("above_mean")
def above_mean(rewards: np.ndarray, fresh: np.ndarray, mean: float, threshold: float | None) -> list[int]:
    """Fresh members whose reward is strictly above the counted members' mean (a positive advantage)."""
    return [i for i in range(rewards.shape[0]) if fresh[i] and rewards[i] > mean]


@register_member_rule("top_1")
def top_1(rewards: np.ndarray, fresh: np.ndarray, mean: float, threshold: float | None) -> list[int]:
    """The best fresh member (the first one on a tie), when its reward is above the counted members' mean."""
    best = None
    for i in range(rewards.shape[0]):
        if fresh[i] and (best is None or rewards[i] > rewards[best]):
            best = i
    return [best] if best is not None and rewards[best] > mean else []


@register_member_rule("above_threshold", needs_threshold=True)
def above_threshold(rewards: np.ndarray, fresh: np.ndarray, mean: float, threshold: float | None) -> list[int]:
    """Fresh members whose reward reaches ``member_threshold`` (the binary rule is this one at 1.0)."""
    if threshold is None:
        raise ValueError("exgrpo.continuous_members=above_threshold needs exgrpo.member_threshold")
    return [i for i in range(rewards.shape[0]) if fresh[i] and rewards[i] >= threshold]


@dataclass(frozen=True)
class ContinuousRules:
    """The continuous mode's collection settings (the ``exgrpo.*`` keys of the same names; ``epsilon`` resolved)."""

    epsilon: float
    equal_spread: str = "max"
    flat_std: float = 0.0
    retire_mean_reward: float | None = None
    members: str = "above_mean"
    member_threshold: float | None = None

    def __post_init__(self) -> None:
        if not (math.isfinite(self.epsilon) and 0.0 < self.epsilon <= 1.0):
            raise ValueError(f"spread epsilon must be in (0, 1], got {self.epsilon}")
        if self.equal_spread not in EQUAL_SPREAD_CHOICES:
            raise ValueError(f"equal_spread must be one of {list(EQUAL_SPREAD_CHOICES)}, got {self.equal_spread!r}")
        if not (math.isfinite(self.flat_std) and self.flat_std >= 0.0):
            raise ValueError(f"flat_std must be a finite number >= 0, got {self.flat_std}")
        CONTINUOUS_MEMBER_RULES.get(self.members)
        if CONTINUOUS_MEMBER_RULES.tag(self.members, "needs_threshold") and self.member_threshold is None:
            raise ValueError(f"continuous member rule {self.members!r} needs member_threshold")

    @classmethod
    def from_config(cls, cfg: Any) -> ContinuousRules:
        """From a validated ``ExGRPOConfig`` in continuous mode (ε null resolved to 1/K)."""
        return cls(
            epsilon=float(cfg.resolved_spread_epsilon),
            equal_spread=cfg.equal_spread,
            flat_std=float(cfg.flat_std),
            retire_mean_reward=None if cfg.retire_mean_reward is None else float(cfg.retire_mean_reward),
            members=cfg.continuous_members,
            member_threshold=None if cfg.member_threshold is None else float(cfg.member_threshold),
        )

    def settings(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class SpreadPlan:
    """What collection does with one group in continuous mode.

    ``sigma`` / ``mean``: standard deviation and mean of the counted members' rewards; ``flat``: σ ≤ flat_std;
    ``retire``: flat with mean ≥ retire_mean_reward; ``sigma_tilde`` / ``bucket``: the normalised spread and its
    bucket (None for a flat group); ``members``: indices of the fresh members to store.
    """

    sigma: float
    mean: float
    flat: bool
    retire: bool
    sigma_tilde: float | None
    bucket: int | None
    members: tuple[int, ...]


def group_spread(rewards: Sequence[float] | np.ndarray) -> float:
    """σ_q: the population standard deviation (ddof 0) of a group's rewards, in float64."""
    r = np.asarray(rewards, dtype=np.float64)
    if r.size == 0:
        raise ValueError("a group needs at least one reward")
    return float(r.std())


def normalised_spreads(
    sigmas: Sequence[float] | np.ndarray, *, epsilon: float, equal_spread: str = "max"
) -> np.ndarray:
    """σ̃ = max((σ − σ_min) / (σ_max − σ_min), ε) for every group of the step; when σ_max == σ_min every group gets
    ``EQUAL_SPREAD_CHOICES[equal_spread]`` (then floored at ε too)."""
    s = np.asarray(sigmas, dtype=np.float64)
    if s.size == 0:
        return s
    lo, hi = float(s.min()), float(s.max())
    if hi > lo:
        t = (s - lo) / (hi - lo)
    else:
        t = np.full(s.shape, EQUAL_SPREAD_CHOICES[equal_spread], dtype=np.float64)
    return np.maximum(t, epsilon)


def spread_bucket(sigma_tilde: float, k: int) -> int:
    """round(σ̃·K), rounding half up, clipped to the sampled buckets 1..K−1."""
    return int(min(max(math.floor(sigma_tilde * k + 0.5), 1), k - 1))


def plan_groups(
    groups: Sequence[Group], rules: ContinuousRules, k: int, *, count_replayed: bool = True
) -> list[SpreadPlan]:
    """Per group of one collect call, what the continuous collection rules do with it (module docstring).

    σ_min and σ_max run over every group of the call (flat ones and those of retired questions included: the
    paper normalises over the batch). The groups must have K members each (checked by the caller).
    """
    rule = CONTINUOUS_MEMBER_RULES.get(rules.members)
    stats = []
    for g in groups:
        rewards = np.asarray([float(m.reward) for m in g.members], dtype=np.float64)
        fresh = np.asarray([not m.is_replayed for m in g.members], dtype=bool)
        counted = rewards if count_replayed else rewards[fresh]
        if counted.size == 0:
            raise ValueError(f"group of question {g.question_id!r} has no counted member")
        if not np.isfinite(rewards).all():
            raise ValueError(f"group of question {g.question_id!r} has a non-finite reward: {rewards.tolist()}")
        stats.append((rewards, fresh, float(counted.mean()), group_spread(counted)))
    tilde = normalised_spreads([s[3] for s in stats], epsilon=rules.epsilon, equal_spread=rules.equal_spread)
    plans = []
    for (rewards, fresh, mean, sigma), t in zip(stats, tilde.tolist(), strict=True):
        flat = sigma <= rules.flat_std
        if flat:
            retire = rules.retire_mean_reward is not None and mean >= rules.retire_mean_reward
            plans.append(SpreadPlan(sigma, mean, True, retire, None, None, ()))
            continue
        chosen = tuple(rule(rewards, fresh, mean, rules.member_threshold))
        plans.append(SpreadPlan(sigma, mean, False, False, float(t), spread_bucket(t, k), chosen))
    return plans
