"""The binary reward mode, the paper's main method (docs/algorithm.md §3, §9): 0/1 rewards, buckets are success
counts.

A member succeeds when its reward reaches :data:`SUCCESS_REWARD` (1). Per group, k =
successes among the counted members (all K, or the fresh ones only without ``count_replayed_in_k``): k = K retires
the question, k = 0 carries no signal (the ``zero_success`` rule), any other k is the question's bucket and its
correct fresh members are stored. Mixed mode starts after the first step whose batch pass rate (responses with
reward 1 / all B·K responses) is strictly greater than τ (``delayed_start_threshold``; negative: from step 1).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from itertools import compress
from operator import and_
from typing import Any

import numpy as np

from exgrpo.modes.base import GroupPlan, RewardMode, register_reward_mode
from exgrpo.settings import ModeOptions, setting

__all__ = ["SUCCESS_REWARD", "BinaryMode", "BinaryOptions", "batch_pass_rate", "is_success"]

#: A member counts as correct (a "success") when its reward reaches 1: the training reward is binary (§10).
SUCCESS_REWARD = 1.0


def is_success(reward: float) -> bool:
    """Whether a member's reward counts as a success in the binary mode (k counts these, §3)."""
    return float(reward) >= SUCCESS_REWARD


def batch_pass_rate(rewards: Iterable[float] | np.ndarray | Any, threshold: float = SUCCESS_REWARD) -> float:
    """Share of responses with a reward of at least ``threshold`` (1: correct) among all B*K of the step (§9)."""
    r = np.asarray(rewards, dtype=np.float64).reshape(-1)
    if r.size == 0:
        raise ValueError("batch_pass_rate needs at least one reward")
    return float(np.count_nonzero(r >= threshold) / r.size)


#: the plans without members (GroupPlan is frozen: one of each serves every group)
_RETIRE = GroupPlan(retire=True)
_NO_SIGNAL = GroupPlan()


@dataclass
class BinaryOptions(ModeOptions):
    """The binary mode's keys (``exgrpo.<key>``)."""

    delayed_start_threshold: float = setting(
        0.35,
        hi=1.0,
        hi_open=True,
        hint="a pass rate never exceeds 1, so tau >= 1 would never start mixed mode; "
        "negative means mixed from step 1; use exgrpo.enable=false for plain GRPO",
        help="tau: mixed mode starts after the first step whose batch pass rate is > tau; negative = from step 1",
    )


@register_reward_mode("binary")
class BinaryMode(RewardMode):
    """Success counts out of K (the paper's ExGRPO); a subclass may move what counts as a success
    (:attr:`success_reward`)."""

    options_class = BinaryOptions
    bucket_wording = (
        "{b}/{k}",
        "bucket = successes out of K = {k} in the question's latest group (0: a later 0/{k}, never replayed)",
        "successes out of K",
    )
    #: the reward a member needs to count as a success
    success_reward: float = SUCCESS_REWARD

    @classmethod
    def schedule_settings(cls, cfg: Any) -> dict[str, Any]:
        return {"signal": "pass_rate", "threshold": BinaryOptions.of(cfg).delayed_start_threshold}

    @classmethod
    def describe(cls, cfg: Any) -> str:
        return f"tau={BinaryOptions.of(cfg).delayed_start_threshold:g}"

    def settings(self) -> dict[str, Any]:
        # Pools of this mode predate the header's mode tag: their settings (and their saved header) stay as they
        # always were, and a header without the tag reads as this mode (saved_mode_name).
        return {}

    # ------------------------------------------------------------------ collection
    def is_success(self, reward: float) -> bool:
        return float(reward) >= self.success_reward

    def planner(
        self,
        groups: Sequence[Any],
        k: int,
        *,
        count_replayed: bool,
        stats: Any,
        check_size: Callable[[Any], None],
    ) -> Callable[[int, Any], GroupPlan]:
        counts = stats.mode_stats["success_counts"]
        threshold = self.success_reward
        # is_success's rule inline (a call per member costs as much as the rest of the plan), unless a subclass
        # moved it elsewhere than success_reward
        inline = type(self).is_success is BinaryMode.is_success
        made: dict[tuple[int, tuple[int, ...]], GroupPlan] = {}  # GroupPlan is frozen: one per (bucket, members)

        def plan(index: int, group: Any) -> GroupPlan:
            members = group.members
            if inline:
                ok = [float(m.reward) >= threshold for m in members]
            else:
                ok = [self.is_success(m.reward) for m in members]
            fresh_ones = None if count_replayed else [not m.is_replayed for m in members]
            counted = ok if fresh_ones is None or all(fresh_ones) else list(compress(ok, fresh_ones))
            successes = sum(counted)
            counts.append(successes)
            if successes == len(counted):
                return _RETIRE
            if successes == 0:
                return _NO_SIGNAL
            # a replayed member is already stored (with its original behaviour log-probs): never re-inserted
            if fresh_ones is None:
                fresh_ones = [not m.is_replayed for m in members]
            fresh = tuple(compress(range(len(ok)), ok if all(fresh_ones) else map(and_, ok, fresh_ones)))
            key = (successes, fresh)
            found = made.get(key)
            if found is None:
                found = made[key] = GroupPlan(bucket=successes, members=fresh)
            return found

        return plan

    def new_stats(self) -> dict[str, Any]:
        return {"success_counts": []}  # k of every group planned (counted members)

    # ------------------------------------------------------------------ delayed start
    def start_signal(self, rewards: Any) -> float:
        return batch_pass_rate(rewards, self.success_reward)

    def switch_message(self, step: int, value: float, schedule: Any) -> str:
        return f"[exgrpo] step {step}: batch pass rate {value:.3f} > {schedule.threshold}: mixed mode on"
