"""The records that cross the experience package's boundary: what the trainer hands in, what it gets back.

``GroupMember`` / ``Group`` go into :meth:`ExperiencePool.collect`; ``Candidate`` comes out of
:meth:`ExperiencePool.candidates`; ``CollectStats`` says what a collect call did. ``as_member_arrays`` is the one
place where a member's token ids and behaviour log-probs are checked and converted to the stored dtypes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, TypeAlias

import numpy as np

__all__ = [
    "SUCCESS_REWARD",
    "Candidate",
    "CollectStats",
    "Group",
    "GroupMember",
    "QuestionId",
    "as_member_arrays",
    "is_success",
]

QuestionId: TypeAlias = str | int

#: A member counts as correct (a "success") when its reward reaches 1: the training reward is binary (§10).
SUCCESS_REWARD = 1.0
_INT32_MAX = np.iinfo(np.int32).max


def is_success(reward: float) -> bool:
    """Whether a member's reward counts as a success (k counts these, §3)."""
    return float(reward) >= SUCCESS_REWARD


@dataclass
class GroupMember:
    """One of the K members of a group, as the trainer hands it to :meth:`ExperiencePool.collect`.

    ``token_ids``: the response tokens only (no prompt, no padding), EOS included; any 1-D integer array-like.
    ``behaviour_log_probs``: one log-prob per response token from the policy that generated it (the old
    log-probs of this step); float array-like of the same length. ``is_replayed``: the member came from the
    pool this step (it is already stored and is never re-inserted).
    """

    token_ids: Any
    behaviour_log_probs: Any
    reward: float
    is_replayed: bool = False


@dataclass
class Group:
    """One question and its K members (fresh and, for a replayed question, the replayed one)."""

    question_id: QuestionId
    members: Sequence[GroupMember]


@dataclass(frozen=True, slots=True)
class Candidate:
    """A stored trajectory handed to selection and the trainer.

    ``token_ids`` (int32) and ``behaviour_log_probs`` (float32) are copies unless the pool was asked for
    views (``copy=False``); views are read-only and valid only until the pool is next mutated.
    ``entry_id`` refers back to the entry (:meth:`ExperiencePool.get`); ids are never reused.
    """

    question_id: QuestionId
    entry_id: int
    token_ids: np.ndarray
    behaviour_log_probs: np.ndarray
    reward: float
    step: int

    @property
    def length(self) -> int:
        return int(self.token_ids.shape[0])


_STAT_NAMES = (
    "groups",
    "skipped",
    "retired",
    "ignored_retired",
    "zero_success",
    "moved_to_bucket0",
    "out_of_range",
    "bucket_updates",
    "added_entries",
    "added_tokens",
    "duplicates",
    "evicted_entries",
    "evicted_tokens",
)


@dataclass
class CollectStats:
    """What one :meth:`ExperiencePool.collect` call did (for logging; see :meth:`as_metrics`)."""

    step: int
    groups: int = 0
    skipped: bool = False  # collect_from='mixed' and mixed mode was off: only retirement, nothing stored
    retired: int = 0  # questions retired this call (k = K)
    ignored_retired: int = 0  # groups of already-retired questions (nothing done)
    zero_success: int = 0  # groups with k = 0
    moved_to_bucket0: int = 0  # of those, stored questions moved to bucket 0 (zero_success='bucket0')
    out_of_range: int = 0  # 0 < k < K but not in (lbound, rbound]: nothing done
    bucket_updates: int = 0  # questions whose bucket was set to k in (lbound, rbound]
    added_entries: int = 0
    added_tokens: int = 0
    duplicates: int = 0  # correct fresh members already stored (dedup by token ids)
    evicted_entries: int = 0
    evicted_tokens: int = 0
    success_counts: list[int] = field(default_factory=list)  # k of every group seen (counted members)
    # continuous reward mode (docs/algorithm.md §13); its metrics are logged only in that mode
    continuous: bool = False
    flat_groups: int = 0  # groups whose reward spread is <= flat_std (the binary mode's 0/K and K/K)
    group_stds: list[float] = field(default_factory=list)  # σ of every group seen (counted members)
    spread_buckets: list[int] = field(default_factory=list)  # bucket of every non-flat group seen

    def as_metrics(self, prefix: str = "collect/") -> dict[str, float]:
        out = {f"{prefix}{name}": float(getattr(self, name)) for name in _STAT_NAMES}
        if self.continuous:
            out[f"{prefix}flat_groups"] = float(self.flat_groups)
            stds = self.group_stds or [0.0]
            out[f"{prefix}group_std_mean"] = float(sum(stds) / len(stds))
            out[f"{prefix}group_std_max"] = float(max(stds))
            buckets = self.spread_buckets or [0]
            out[f"{prefix}spread_bucket_mean"] = float(sum(buckets) / len(buckets))
        return out


def as_member_arrays(qid: QuestionId, token_ids: Any, behaviour_log_probs: Any) -> tuple[np.ndarray, np.ndarray]:
    """A member's (token ids as int32, behaviour log-probs as float32), checked; ValueError naming the question."""
    ids = np.asarray(token_ids)
    lps = np.asarray(behaviour_log_probs)
    if ids.ndim != 1 or ids.shape[0] == 0 or ids.dtype.kind not in "iu":
        raise ValueError(
            f"question {qid!r}: response token ids must be a non-empty 1-D integer array (EOS included), "
            f"got shape {ids.shape} dtype {ids.dtype}"
        )
    if lps.shape != ids.shape or lps.dtype.kind != "f":
        raise ValueError(
            f"question {qid!r}: behaviour log-probs must be a float array with one value per response token; "
            f"got shape {lps.shape} dtype {lps.dtype} for {ids.shape[0]} tokens"
        )
    if ids.dtype != np.int32:
        if int(ids.min()) < 0 or int(ids.max()) > _INT32_MAX:
            raise ValueError(f"question {qid!r}: token ids outside [0, 2^31) cannot be stored as int32")
        ids = ids.astype(np.int32)
    if lps.dtype != np.float32:
        lps = lps.astype(np.float32)
    return ids, lps
