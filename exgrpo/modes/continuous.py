"""The continuous reward mode (docs/algorithm.md §13): real-valued rewards, buckets from the spread of a group's
rewards.

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
(:class:`SpreadPlan`); :class:`ContinuousMode` (the registered mode) hands them to the pool's writer as plans. Its
delayed start is a step count (``continuous_start: steps``, OUR CHOICE) or the first step whose batch mean reward
exceeds ``continuous_start_reward`` (``mean_reward``). Pure numpy, no framework.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from exgrpo.checks import fail
from exgrpo.modes.base import GroupPlan, RewardMode, register_reward_mode
from exgrpo.registry import Registry
from exgrpo.settings import ModeOptions, setting

if TYPE_CHECKING:
    from exgrpo.experience.records import Group

__all__ = [
    "CONTINUOUS_MEMBER_RULES",
    "CONTINUOUS_START_CHOICES",
    "ContinuousMode",
    "ContinuousOptions",
    "EQUAL_SPREAD_CHOICES",
    "ContinuousRules",
    "SpreadPlan",
    "batch_mean_reward",
    "group_spread",
    "normalised_spreads",
    "plan_groups",
    "register_member_rule",
    "reward_metrics",
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
    """Fresh members whose reward reaches ``member_threshold`` (the binary rule is this one at 1.0; the config
    requires the threshold with this rule, tagged ``needs_threshold``)."""
    return [i for i in range(rewards.shape[0]) if fresh[i] and rewards[i] >= threshold]


@dataclass(frozen=True)
class ContinuousRules:
    """The continuous mode's collection settings (the ``exgrpo.*`` keys of the same names; ``epsilon`` resolved).

    The values are a validated config's (:meth:`from_config`): ``ContinuousOptions`` declares their ranges and
    choices and ``ContinuousMode.validate`` requires the threshold a rule needs; they are not checked again here."""

    epsilon: float
    equal_spread: str = "max"
    flat_std: float = 0.0
    retire_mean_reward: float | None = None
    members: str = "above_mean"
    member_threshold: float | None = None

    @classmethod
    def from_config(cls, cfg: Any) -> ContinuousRules:
        """From a validated ``ExGRPOConfig`` in continuous mode (ε null resolved to 1/K)."""
        o = ContinuousOptions.of(cfg)
        return cls(
            epsilon=resolved_spread_epsilon(cfg),
            equal_spread=o.equal_spread,
            flat_std=float(o.flat_std),
            retire_mean_reward=None if o.retire_mean_reward is None else float(o.retire_mean_reward),
            members=o.continuous_members,
            member_threshold=None if o.member_threshold is None else float(o.member_threshold),
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
    rule = CONTINUOUS_MEMBER_RULES[rules.members]
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


def resolved_spread_epsilon(cfg: Any) -> float:
    """ε of the normalised spread with null resolved to 1/K."""
    assert cfg.k is not None, "exgrpo.k is not set"
    epsilon = ContinuousOptions.of(cfg).spread_epsilon
    return 1.0 / cfg.k if epsilon is None else float(epsilon)


def batch_mean_reward(rewards: Sequence[float] | np.ndarray | Any) -> float:
    """Mean reward of all B*K responses of the step: the continuous mode's start signal under
    ``continuous_start: mean_reward``."""
    r = np.asarray(rewards, dtype=np.float64).reshape(-1)
    if r.size == 0:
        raise ValueError("batch_mean_reward needs at least one reward")
    return float(r.mean())


def _numeric(values: Any) -> np.ndarray | None:
    """A 1-D column of numbers (None counts as NaN) as float64; None for anything else (text, lists, bools)."""
    arr = np.asarray(values)
    if arr.ndim != 1:
        return None
    if arr.dtype.kind in "iuf":
        return arr.astype(np.float64)
    if arr.dtype == object and all(
        v is None or (isinstance(v, (int, float, np.integer, np.floating)) and not isinstance(v, bool)) for v in arr
    ):
        return np.asarray([np.nan if v is None else float(v) for v in arr], dtype=np.float64)
    return None


def reward_metrics(scores: Any, replayed: Any, uids: Any, extra: Mapping[str, Any] | None = None) -> dict[str, float]:
    """The reward's figures per step (``exgrpo/reward/...``): the batch mean reward (all rows: the delayed start's
    signal), the generated responses' mean / std / min / max, the replayed members' mean, the mean and largest
    within-group standard deviation and the share of flat groups (std 0: no gradient), and the mean over generated
    rows of every numeric extra key the reward returned (``exgrpo/reward/extra/<key>``).

    ``scores``: one reward per row; ``replayed``: which rows are replayed members; ``uids``: each row's group.
    """
    scores = np.asarray(scores, dtype=np.float64)
    replayed = np.asarray(replayed, dtype=bool)
    generated = scores[~replayed]
    out = {"exgrpo/batch_mean_reward": float(scores.mean()) if scores.size else float("nan")}
    if generated.size:
        out.update(
            {
                "exgrpo/reward/mean": float(generated.mean()),
                "exgrpo/reward/std": float(generated.std()),
                "exgrpo/reward/min": float(generated.min()),
                "exgrpo/reward/max": float(generated.max()),
            }
        )
    if replayed.any():
        out["exgrpo/reward/replayed_mean"] = float(scores[replayed].mean())
    uids = np.asarray(uids, dtype=object)
    stds = np.asarray([scores[uids == u].std() for u in dict.fromkeys(uids.tolist())], dtype=np.float64)
    if stds.size:
        out["exgrpo/reward/group_std_mean"] = float(stds.mean())
        out["exgrpo/reward/group_std_max"] = float(stds.max())
        out["exgrpo/reward/flat_group_share"] = float((stds == 0).mean())
    for key, values in (extra or {}).items():
        arr = _numeric(values)
        if arr is None or arr.shape[0] != scores.shape[0]:
            continue
        arr = arr[~replayed]
        if arr.size and np.isfinite(arr).any():
            out[f"exgrpo/reward/extra/{key}"] = float(np.nanmean(arr))
    return out


#: exgrpo.continuous_start: mixed mode after a number of steps, or after the first step whose mean reward exceeds
#: a threshold.
CONTINUOUS_START_CHOICES = ("steps", "mean_reward")


@dataclass
class ContinuousOptions(ModeOptions):
    """The continuous mode's keys (``exgrpo.<key>``; the module docstring says what each rule does)."""

    spread_epsilon: float | None = setting(
        None,
        lo=0.0,
        hi=1.0,
        lo_open=True,
        hint="null means 1/K",
        help="ε of σ̃ = max((σ − σ_min)/(σ_max − σ_min), ε), in (0, 1]; null means 1/K (bucket 1)",
    )
    equal_spread: str = setting(
        "max",
        choices=EQUAL_SPREAD_CHOICES,
        help="σ̃ of every group when all the step's groups have the same σ: max (1) | mid (½) | min (0)",
    )
    flat_std: float = setting(
        0.0,
        lo=0.0,
        hint="reward units; 0 = only exactly equal rewards are flat",
        help="a group whose reward std is <= this (reward units) is flat: no spread, all advantages 0",
    )
    retire_mean_reward: float | None = setting(
        None,
        hint="reward units; null = never retire",
        help="a flat group whose mean reward is >= this retires (the binary K/K); null = never (OUR CHOICE)",
    )
    continuous_members: str = setting(
        "above_mean",
        choices=CONTINUOUS_MEMBER_RULES,
        help="fresh members stored from a non-flat group: above_mean | top_1 | above_threshold (any registered rule)",
    )
    member_threshold: float | None = setting(
        None,
        hint="reward units",
        help="the reward a stored member must reach under a rule that needs it (continuous_members=above_threshold)",
    )
    continuous_start: str = setting(
        "steps",
        choices=CONTINUOUS_START_CHOICES,
        help="delayed start: steps (after continuous_start_steps steps; OUR CHOICE) | mean_reward",
    )
    continuous_start_steps: int = setting(
        0,
        lo=0,
        hint="0 = mixed from step 1",
        help="steps before mixed mode under continuous_start=steps (0: from step 1)",
    )
    continuous_start_reward: float | None = setting(
        None,
        hint="reward units",
        help="tau in reward units under continuous_start=mean_reward: mixed after the first step whose mean exceeds it",
    )


@register_reward_mode("continuous")
class ContinuousMode(RewardMode):
    """Buckets from the normalised within-group reward spread (the module docstring)."""

    options_class = ContinuousOptions
    accepts_reward_model = True
    signal_metric = "exgrpo/reward/mean"
    signal_label = "mean reward of the sampled responses"
    bucket_wording = (
        "spread {b}",
        "bucket = reward-spread bucket round(σ̃·K), K = {k}, of the question's latest group (0: a later flat group, "
        "never replayed)",
        "reward-spread bucket round(σ̃·K)",
    )

    def __init__(self, rules: ContinuousRules):
        self.rules = rules

    # ------------------------------------------------------------------ config
    @classmethod
    def validate(cls, cfg: Any) -> None:
        o = ContinuousOptions.of(cfg)
        members = o.continuous_members
        if (
            o.member_threshold is None
            and members in CONTINUOUS_MEMBER_RULES
            and CONTINUOUS_MEMBER_RULES.tag(members, "needs_threshold", False)
        ):
            fail(
                f"exgrpo.continuous_members={members} needs exgrpo.member_threshold (the reward a stored member must "
                "reach, in reward units)"
            )
        if o.continuous_start == "mean_reward" and o.continuous_start_reward is None:
            fail(
                "exgrpo.continuous_start=mean_reward needs exgrpo.continuous_start_reward: mixed mode starts "
                "after the first step whose mean reward exceeds it (reward units)"
            )

    @classmethod
    def foreign_option_problem(cls, key: str, value: Any) -> str | None:
        if key == "delayed_start_threshold":
            return (
                f"exgrpo.delayed_start_threshold={value!r} is the binary pass rate's tau and does nothing with "
                "exgrpo.reward_mode=continuous: use exgrpo.continuous_start=mean_reward with "
                "exgrpo.continuous_start_reward (reward units), or exgrpo.continuous_start=steps with "
                "exgrpo.continuous_start_steps"
            )
        return None

    @classmethod
    def schedule_settings(cls, cfg: Any) -> dict[str, Any]:
        o = ContinuousOptions.of(cfg)
        reward = o.continuous_start_reward
        return {
            "signal": o.continuous_start,
            "threshold": 0.0 if reward is None else float(reward),
            "start_steps": o.continuous_start_steps,
        }

    @classmethod
    def describe(cls, cfg: Any) -> str:
        o = ContinuousOptions.of(cfg)
        start = (
            f"after {o.continuous_start_steps} steps"
            if o.continuous_start == "steps"
            else f"mean reward > {o.continuous_start_reward:g}"
        )
        return (
            f"reward_mode=continuous(members={o.continuous_members}, epsilon={resolved_spread_epsilon(cfg):g}, "
            f"flat_std={o.flat_std:g}, start {start}, replay_reward={cfg.replay_reward})"
        )

    @classmethod
    def from_config(cls, cfg: Any) -> ContinuousMode:
        return cls(ContinuousRules.from_config(cfg))

    def settings(self) -> dict[str, Any]:
        return {"reward_mode": self.name, "continuous": self.rules.settings()}

    # ------------------------------------------------------------------ collection
    def planner(
        self,
        groups: Sequence[Any],
        k: int,
        *,
        count_replayed: bool,
        stats: Any,
        check_size: Callable[[Any], None],
    ) -> Callable[[int, Any], GroupPlan]:
        # σ̃ needs every group of the call: each is checked first, so a malformed one stops the call before
        # anything changes
        for g in groups:
            check_size(g)
        plans = plan_groups(groups, self.rules, k, count_replayed=count_replayed)
        stats.mode_stats["group_stds"] = [p.sigma for p in plans]

        def plan(index: int, group: Any) -> GroupPlan:
            p = plans[index]
            return GroupPlan(retire=p.retire, bucket=p.bucket, members=p.members)

        return plan

    def new_stats(self) -> dict[str, Any]:
        # flat groups (the binary 0/K and K/K), σ of every group seen, the bucket of every non-flat group seen
        return {"flat_groups": 0, "group_stds": [], "spread_buckets": []}

    def count_no_signal(self, stats: Any) -> None:
        stats.mode_stats["flat_groups"] += 1

    def count_bucket(self, stats: Any, bucket: int) -> None:
        stats.mode_stats["spread_buckets"].append(bucket)

    def collect_metrics(self, stats: Any, prefix: str) -> dict[str, float]:
        own = stats.mode_stats
        stds = own["group_stds"] or [0.0]
        buckets = own["spread_buckets"] or [0]
        return {
            f"{prefix}flat_groups": float(own["flat_groups"]),
            f"{prefix}group_std_mean": float(sum(stds) / len(stds)),
            f"{prefix}group_std_max": float(max(stds)),
            f"{prefix}spread_bucket_mean": float(sum(buckets) / len(buckets)),
        }

    # ------------------------------------------------------------------ delayed start
    def start_signal(self, rewards: Any) -> float:
        # the schedule ignores the value under continuous_start=steps (it counts the steps)
        return batch_mean_reward(rewards)

    def switch_message(self, step: int, value: float, schedule: Any) -> str:
        why = (
            f"{schedule.start_steps} step(s) done"
            if schedule.signal == "steps"
            else f"batch mean reward {value:.4g} > {schedule.threshold:g}"
        )
        return f"[exgrpo] step {step}: {why}: mixed mode on"

    def reward_metrics(
        self, scores: Any, replayed: Any, uids: Any, extra: Mapping[str, Any] | None = None
    ) -> dict[str, float]:
        return reward_metrics(scores, replayed, uids, extra)
