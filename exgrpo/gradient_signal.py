"""Where a step's policy gradient can come from: groups with and without reward variance, fresh and replayed.

A group (one question's K members, docs/algorithm.md §7) whose rewards are all equal has advantage 0 on every
member: it contributes nothing to the policy-gradient term, however large its batch share. On-policy GRPO loses its
signal when most fresh groups go 0/K (the policy collapsed) or K/K (saturated). A replay group holds a stored
correct trajectory, so even when its K−1 fresh members all fail it keeps a non-zero advantage: A* = (K−1)/K on the
stored member, −1/K on each failing sibling. These figures say, per step, how much of the batch carries signal and
how much of that signal the replay groups supply.

Framework-free (numpy only), computed from the same rewards, uids and advantages the update uses.
"""

from __future__ import annotations

import numpy as np

from exgrpo.advantage import ArrayLike, group_ids, to_numpy_1d

__all__ = ["group_signal_metrics"]

PREFIX = "exgrpo/signal"


def _group_max_min(values: np.ndarray, inverse: np.ndarray, n_groups: int) -> tuple[np.ndarray, np.ndarray]:
    """Per group the largest and smallest value (−inf / +inf for a group without rows)."""
    high = np.full(n_groups, -np.inf)
    low = np.full(n_groups, np.inf)
    np.maximum.at(high, inverse, values)
    np.minimum.at(low, inverse, values)
    return high, low


def group_signal_metrics(
    scores: ArrayLike,
    uids: ArrayLike,
    replay_mask: ArrayLike,
    advantages: ArrayLike,
    *,
    success: float = 1.0,
) -> dict[str, float]:
    """Per-step figures of the gradient signal (keys under ``exgrpo/signal/``).

    Args:
        scores: one reward per row (the sequence reward the advantages were computed from).
        uids: each row's group id (rows with equal uid form a group).
        replay_mask: True on the replayed (stored) members; a group holding one is a *replay group*, every other
            group a *fresh group*.
        advantages: each row's group-relative advantage (``group_relative_advantages``).
        success: a reward at or above this counts as a solved response (the binary reward's 1).

    Returns (a key is left out when what it divides by is empty: no fresh groups, no replay groups, no
    non-zero advantage):

    - ``zero_var_fresh_share``: fresh groups with zero reward variance (one member, or all rewards equal);
    - ``zero_var_fresh_failed_share``: fresh groups in which every member failed (the part of the above that a
      collapsed policy produces; the rest are solved K/K);
    - ``zero_var_replay_share``: replay groups with zero reward variance;
    - ``zero_var_share``: all groups with zero reward variance;
    - ``replay_rescued_share``: replay groups whose fresh members have zero variance while the group has not: the
      stored member alone gives them their gradient;
    - ``nonzero_adv_row_share``: rows with a non-zero advantage;
    - ``replayed_member_adv_share``: the replayed members' share of Σ|A| over the batch;
    - ``replay_group_adv_share``: the replay groups' share of Σ|A| (stored members plus their fresh siblings).
    """
    r = to_numpy_1d("scores", scores).astype(np.float64)
    adv = np.abs(to_numpy_1d("advantages", advantages).astype(np.float64))
    replay = to_numpy_1d("replay_mask", replay_mask).astype(bool)
    inverse, n_groups = group_ids(uids)
    for name, arr in (("advantages", adv), ("replay_mask", replay), ("uids", inverse)):
        if arr.size != r.size:
            raise ValueError(f"{name} has {arr.size} rows but scores has {r.size}")
    if r.size == 0:
        return {}

    counts = np.bincount(inverse, minlength=n_groups)
    high, low = _group_max_min(r, inverse, n_groups)
    zero_var = (counts < 2) | (high == low)
    failed = high < success
    is_replay_group = np.bincount(inverse, weights=replay.astype(np.float64), minlength=n_groups) > 0
    fresh_groups = ~is_replay_group
    # the same spread over each group's generated members only (the replayed member left out)
    gen = ~replay
    gen_high, gen_low = _group_max_min(r[gen], inverse[gen], n_groups)
    gen_zero_var = (np.bincount(inverse[gen], minlength=n_groups) < 2) | (gen_high == gen_low)

    out: dict[str, float] = {f"{PREFIX}/zero_var_share": float(zero_var.mean())}
    if fresh_groups.any():
        out[f"{PREFIX}/zero_var_fresh_share"] = float(zero_var[fresh_groups].mean())
        out[f"{PREFIX}/zero_var_fresh_failed_share"] = float((zero_var & failed)[fresh_groups].mean())
    if is_replay_group.any():
        out[f"{PREFIX}/zero_var_replay_share"] = float(zero_var[is_replay_group].mean())
        out[f"{PREFIX}/replay_rescued_share"] = float((gen_zero_var & ~zero_var)[is_replay_group].mean())
    out[f"{PREFIX}/nonzero_adv_row_share"] = float((adv > 0).mean())
    total = float(adv.sum())
    if total > 0:
        out[f"{PREFIX}/replayed_member_adv_share"] = float(adv[replay].sum()) / total
        out[f"{PREFIX}/replay_group_adv_share"] = float(adv[is_replay_group[inverse]].sum()) / total
    return out
