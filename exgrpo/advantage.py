"""Group-relative advantages on mixed groups (docs/algorithm.md §7).

A group is every row with the same question uid: the K fresh rollouts of an on-policy question, or the K−1
fresh rollouts plus the replayed trajectory of a replayed question. A_i = r_i − mean(r of its group), the
replayed member included in the mean; optional division by the group's std (Dr.GRPO/ExGRPO default: off).
Example (§7): a replay group whose 7 fresh members fail gives A* = 7/8 and A_fresh = −1/8.

Vectorised with ``np.unique(..., return_inverse=True)`` and ``np.bincount``: no Python loop over rows or groups.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

__all__ = ["experience_group_rows", "group_ids", "group_relative_advantages", "token_level_advantages"]

ArrayLike = np.ndarray | torch.Tensor | Sequence[Any]


def to_numpy_1d(name: str, values: ArrayLike) -> np.ndarray:
    """``values`` (a tensor or an array-like) as a 1-D numpy array; ``name`` names it in the error otherwise."""
    arr = values.detach().cpu().numpy() if isinstance(values, torch.Tensor) else np.asarray(values)
    if arr.ndim != 1:
        raise ValueError(f"{name} must be 1-D (one value per row), got shape {arr.shape}")
    return arr


def group_ids(uids: ArrayLike) -> tuple[np.ndarray, int]:
    """Map question uids (str or int, list or array) to dense group ids 0..G−1; returns (ids per row, G)."""
    if not isinstance(uids, np.ndarray | torch.Tensor):
        # An object array keeps each uid as it is: np.asarray([1, "1"]) would turn 1 into "1" and merge groups.
        uids = np.fromiter(uids, dtype=object) if not isinstance(uids, str) else uids
    arr = to_numpy_1d("uids", uids)
    if arr.dtype == object:
        try:
            _, inverse = np.unique(arr, return_inverse=True)
        except TypeError:  # mixed, non-comparable types (e.g. str and int): factorise by equality instead
            index: dict[Any, int] = {}
            inverse = np.fromiter((index.setdefault(u, len(index)) for u in arr), dtype=np.int64, count=arr.size)
    else:
        _, inverse = np.unique(arr, return_inverse=True)
    inverse = inverse.reshape(-1).astype(np.int64, copy=False)
    n_groups = int(inverse.max()) + 1 if inverse.size else 0
    return inverse, n_groups


def group_relative_advantages(
    scores: ArrayLike,
    uids: ArrayLike,
    *,
    norm_by_std: bool = False,
    epsilon: float = 1e-6,
) -> np.ndarray:
    """Per-row group-relative advantage (float64 array of the same length as ``scores``).

    Args:
        scores: one scalar reward per row (list, numpy array or torch tensor).
        uids: the question uid of each row; rows with equal uid form a group, in any order.
        norm_by_std: divide the centred reward by (group std + epsilon); the std is the unbiased one
            (ddof = 1), as verl's GRPO advantage (torch.std).
        epsilon: keeps the std division finite.

    One-member groups and groups whose rewards are all equal get exactly 0 (no learning signal).
    """
    r = to_numpy_1d("scores", scores).astype(np.float64)
    if not np.all(np.isfinite(r)):
        raise ValueError(f"scores must be finite; got non-finite values at rows {np.flatnonzero(~np.isfinite(r))[:10]}")
    if epsilon < 0:
        raise ValueError(f"epsilon must be >= 0, got {epsilon}")
    inverse, n_groups = group_ids(uids)
    if inverse.size != r.size:
        raise ValueError(f"scores has {r.size} rows but uids has {inverse.size}")
    if r.size == 0:
        return np.zeros(0, dtype=np.float64)

    counts = np.bincount(inverse, minlength=n_groups)
    means = np.bincount(inverse, weights=r, minlength=n_groups) / counts
    centred = r - means[inverse]

    # Exact zeros for one-member and equal-reward groups: the centred value could otherwise be a rounding
    # residue (e.g. 0.1 − mean(0.1, 0.1, 0.1)) that the std division would blow up.
    group_min = np.full(n_groups, np.inf)
    group_max = np.full(n_groups, -np.inf)
    np.minimum.at(group_min, inverse, r)
    np.maximum.at(group_max, inverse, r)
    degenerate = (counts < 2) | (group_max == group_min)
    centred[degenerate[inverse]] = 0.0

    if norm_by_std:
        sq = np.bincount(inverse, weights=centred * centred, minlength=n_groups)
        std = np.sqrt(sq / np.maximum(counts - 1, 1))
        centred = centred / (std[inverse] + epsilon)
    return centred


def token_level_advantages(row_advantages: ArrayLike, response_mask: torch.Tensor) -> torch.Tensor:
    """Broadcast per-row advantages to tokens: A[i, t] = A_i · mask[i, t] (verl's token-level layout).

    Returns a tensor with the mask's shape and device, dtype float32 (the mask's dtype when it is floating).
    """
    if response_mask.dim() != 2:
        raise ValueError(f"response_mask must be [batch, response_len], got shape {tuple(response_mask.shape)}")
    dtype = response_mask.dtype if response_mask.is_floating_point() else torch.float32
    if isinstance(row_advantages, torch.Tensor):
        adv = row_advantages.detach().to(device=response_mask.device, dtype=dtype)
    else:
        adv = torch.as_tensor(np.asarray(row_advantages, dtype=np.float64), dtype=dtype, device=response_mask.device)
    if adv.shape != (response_mask.shape[0],):
        raise ValueError(
            f"row_advantages must have shape ({response_mask.shape[0]},) to match response_mask, got {tuple(adv.shape)}"
        )
    return adv.unsqueeze(-1) * response_mask.to(dtype)


def experience_group_rows(uids: ArrayLike, replay_mask: ArrayLike) -> np.ndarray:
    """Rows belonging to a group that contains a replayed row (the replayed member and its K−1 fresh siblings).

    This is the row set of the experience term of the paper's Eq. 4, for ``mixed_policy_loss(...,
    weight_terms=True, experience_group_mask=...)``.
    """
    inverse, n_groups = group_ids(uids)
    replay = to_numpy_1d("replay_mask", replay_mask).astype(bool)
    if replay.size != inverse.size:
        raise ValueError(f"replay_mask has {replay.size} rows but uids has {inverse.size}")
    if inverse.size == 0:
        return np.zeros(0, dtype=bool)
    has_replay = np.bincount(inverse, weights=replay.astype(np.float64), minlength=n_groups) > 0
    return has_replay[inverse]
