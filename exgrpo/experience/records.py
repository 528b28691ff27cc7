"""The records that cross the experience package's boundary: what the trainer hands in, what it gets back.

``GroupMember`` / ``Group`` go into :meth:`ExperiencePool.collect`; ``Candidate`` comes out of
:meth:`ExperiencePool.candidates`; ``CollectStats`` says what a collect call did. ``as_member_arrays`` is the one
place where a member's token ids, behaviour log-probs and loss mask are checked and converted to what the pool
stores (the mask encoded in the log-probs, ``exgrpo.experience.masks``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeAlias

import numpy as np

from exgrpo.experience import masks

# what counts as a success is the binary reward mode's rule; importable from here as well
from exgrpo.modes.binary import SUCCESS_REWARD, is_success

__all__ = [
    "DEFECTS",
    "SUCCESS_REWARD",
    "Candidate",
    "CollectStats",
    "Group",
    "GroupMember",
    "MemberArrays",
    "MemberColumns",
    "QuestionId",
    "as_member_arrays",
    "is_success",
    "member_arrays",
    "member_arrays_many",
]

#: why a member is not stored (``GroupMember.defect``, ``exgrpo.experience.masks``): ``inconsistent`` (its loss mask
#: and log-probs disagree), ``truncated`` (its exchange was cut in a tool turn)
DEFECTS = masks.DEFECTS

QuestionId: TypeAlias = str | int

_INT32_MAX = np.iinfo(np.int32).max
_INT32, _FLOAT32, _BOOL = np.dtype(np.int32), np.dtype(np.float32), np.dtype(np.bool_)


@dataclass
class GroupMember:
    """One of the K members of a group, as the trainer hands it to :meth:`ExperiencePool.collect`.

    ``token_ids``: the whole response after the prompt (no padding), EOS included: for a multi-turn trajectory the
    model's turns *and* the tool outputs between them; any 1-D integer array-like.
    ``behaviour_log_probs``: one log-prob per response token from the policy that generated it (the old
    log-probs of this step); float array-like of the same length; read on the model's tokens only.
    ``is_replayed``: the member came from the pool this step (it is already stored and is never re-inserted).
    ``loss_mask``: 1 per token the policy generated, 0 per token it did not (a tool's output, the template's turn
    boundaries); None = every token is the model's (a single-turn response).
    ``defect``: why the trainer found this trajectory unfit to store (one of :data:`DEFECTS`; e.g. its exchange
    ended on a tool call that got no answer), None when it found none, or a function of no argument that says it
    (called only for a member the pool would store: the trainer's check may cost a decode). The pool checks the
    arrays itself as well.
    """

    token_ids: Any
    behaviour_log_probs: Any
    reward: float
    is_replayed: bool = False
    loss_mask: Any = None
    defect: str | Callable[[], str | None] | None = None


@dataclass
class Group:
    """One question and its K members (fresh and, for a replayed question, the replayed one)."""

    question_id: QuestionId
    members: Sequence[GroupMember]


@dataclass(frozen=True, slots=True)
class Candidate:
    """A stored trajectory handed to selection and the trainer.

    ``token_ids`` (int32, the whole stored response: model turns and tool outputs) and ``behaviour_log_probs``
    (float32; 0.0 on the tokens the model did not generate) are copies unless the pool was asked for views
    (``copy=False``); views are read-only and valid only until the pool is next mutated (the log-probs of a
    trajectory with masked tokens are always a cleaned copy). ``loss_mask``: True per token the policy generated,
    None when every token is the model's (:attr:`mask` gives the array in both cases). ``entry_id`` refers back to
    the entry (:meth:`ExperiencePool.get`); ids are never reused.
    """

    question_id: QuestionId
    entry_id: int
    token_ids: np.ndarray
    behaviour_log_probs: np.ndarray
    reward: float
    step: int
    loss_mask: np.ndarray | None = None

    @property
    def length(self) -> int:
        """Tokens stored (the whole response, tool outputs included)."""
        return int(self.token_ids.shape[0])

    @property
    def mask(self) -> np.ndarray:
        """The loss mask as a bool array of :attr:`length` (True = a token the policy generated)."""
        return np.ones(self.length, dtype=np.bool_) if self.loss_mask is None else self.loss_mask

    @property
    def num_model_tokens(self) -> int:
        return self.length if self.loss_mask is None else int(np.count_nonzero(self.loss_mask))


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
    "rejected_inconsistent",
    "rejected_truncated",
)


@dataclass
class CollectStats:
    """What one :meth:`ExperiencePool.collect` call did (for logging; see :meth:`as_metrics`).

    The counts every reward mode reports are fields; ``mode_stats`` holds the figures of the call's reward mode
    (``exgrpo.modes``: the binary mode's success counts, the continuous mode's flat groups and spreads), which the
    mode turns into its own metrics.
    """

    step: int
    groups: int = 0
    skipped: bool = False  # collect_from='mixed' and mixed mode was off: only retirement, nothing stored
    retired: int = 0  # questions retired this call (k = K)
    ignored_retired: int = 0  # groups of already-retired questions (nothing done)
    zero_success: int = 0  # groups with k = 0
    moved_to_bucket0: int = 0  # of the groups without signal, stored questions moved to bucket 0 (zero_success)
    out_of_range: int = 0  # 0 < k < K but not in (lbound, rbound]: nothing done
    bucket_updates: int = 0  # questions whose bucket was set to k in (lbound, rbound]
    added_entries: int = 0
    added_tokens: int = 0
    duplicates: int = 0  # correct fresh members already stored (dedup by token ids)
    evicted_entries: int = 0
    evicted_tokens: int = 0
    rejected_inconsistent: int = 0  # members to store whose loss mask and log-probs disagree: not stored
    rejected_truncated: int = 0  # members to store whose exchange was cut in a tool turn: not stored
    #: the reward mode that collected (``RewardMode``; None: no mode figures) and its own figures of the call
    mode: Any = field(default=None, repr=False, compare=False)
    mode_stats: dict[str, Any] = field(default_factory=dict)

    def as_metrics(self, prefix: str = "collect/") -> dict[str, float]:
        out = {f"{prefix}{name}": float(getattr(self, name)) for name in _STAT_NAMES}
        if self.mode is not None:
            out.update(self.mode.collect_metrics(self, prefix))
        return out


def as_member_arrays(
    qid: QuestionId, token_ids: Any, behaviour_log_probs: Any, loss_mask: Any = None
) -> tuple[np.ndarray, np.ndarray]:
    """A member's (token ids as int32, behaviour log-probs as float32 with NaN on the tokens ``loss_mask`` marks as
    not the model's), checked; ValueError naming the question for shapes or dtypes that do not fit."""
    arrays = member_arrays(qid, token_ids, behaviour_log_probs, loss_mask)
    return arrays.token_ids, arrays.stored_log_probs


@dataclass(slots=True)
class MemberArrays:
    """A member as the pool stores it: ``token_ids`` (int32), ``stored_log_probs`` (float32, NaN on masked tokens),
    ``masked`` (their count) and ``defect`` (a pair (kind, reason) when the arrays must not be stored). Not frozen:
    one is built per member of every collect call, and a frozen dataclass's constructor costs three times as much;
    nothing changes one after it is built."""

    token_ids: np.ndarray
    stored_log_probs: np.ndarray
    masked: int
    defect: tuple[str, str] | None


def member_arrays(qid: QuestionId, token_ids: Any, behaviour_log_probs: Any, loss_mask: Any = None) -> MemberArrays:
    """Check and convert a member's arrays (ValueError naming the question for a shape or dtype that does not fit;
    a mask that disagrees with the log-probs is a ``defect``, counted and not stored, never an error)."""
    ids, lps = _converted(qid, token_ids, behaviour_log_probs)
    stored, masked, defect = masks.prepare(qid, loss_mask, lps)
    return MemberArrays(ids, stored, masked, defect)


@dataclass(slots=True)
class MemberColumns:
    """:func:`member_arrays` of many members, column by column (one item per member): ``token_ids`` (None for a
    member whose arrays raise an error, which :func:`member_arrays` raises), ``stored_log_probs``, ``masked``,
    ``defect``, ``lengths``. A collect call keeps its members' arrays this way: no object per member."""

    token_ids: list[np.ndarray | None]
    stored_log_probs: list[np.ndarray | None]
    masked: list[int]
    defect: list[tuple[str, str] | None]
    lengths: list[int]  # tokens (0 where there are no token ids)

    def __len__(self) -> int:
        return len(self.token_ids)

    def arrays(self, k: int) -> MemberArrays | None:
        """Member ``k`` as :func:`member_arrays` gives it; None where that raises."""
        ids = self.token_ids[k]
        if ids is None:
            return None
        return MemberArrays(ids, self.stored_log_probs[k], self.masked[k], self.defect[k])  # type: ignore[arg-type]


def member_arrays_many(
    qids: Sequence[QuestionId],
    members: Sequence[Any],
    *,
    stage: Callable[..., np.ndarray | None] | None = None,
) -> MemberColumns:
    """:func:`member_arrays` of many members (``GroupMember``; ``qids``: each one's question), with the log-probs and
    masks of all of them checked and encoded together (:func:`~exgrpo.experience.masks.prepare_many`: a constant
    number of numpy calls instead of a few per member; ``stage`` as there). Nothing is raised here: a member whose
    arrays raise an error has no token ids in the result, and the caller calls :func:`member_arrays` for it where
    its error belongs."""
    ids_of = [m.token_ids for m in members]
    lps_of = [m.behaviour_log_probs for m in members]
    masks_of = [m.loss_mask for m in members]
    ready = [  # what _converted and masks.bool_mask would give back unchanged: nothing to do one by one
        type(ids) is np.ndarray
        and type(lps) is np.ndarray
        and ids.dtype is _INT32
        and lps.dtype is _FLOAT32
        and ids.ndim == 1
        and ids.shape == lps.shape
        and ids.shape[0] > 0
        and (mask is None or (type(mask) is np.ndarray and mask.dtype is _BOOL and mask.shape == ids.shape))
        for ids, lps, mask in zip(ids_of, lps_of, masks_of, strict=True)
    ]
    if all(ready):
        lengths = np.fromiter(map(len, ids_of), dtype=np.int64, count=len(ids_of))
        stored, counts, defects = masks.prepare_many(lps_of, masks_of, stage=stage, lengths=lengths)
        return MemberColumns(ids_of, stored, counts, defects, lengths.tolist())
    kept: list[int] = []  # the members converted
    for k, (qid, ids, lps, mask) in enumerate(zip(qids, ids_of, lps_of, masks_of, strict=True)):
        if not ready[k]:
            try:
                ids, lps = _converted(qid, ids, lps)
                if mask is not None:
                    mask = masks.bool_mask(qid, mask, ids.shape[0])
            except Exception:  # raised again by member_arrays, in its place
                continue
            ids_of[k], lps_of[k], masks_of[k] = ids, lps, mask
        kept.append(k)
    stored, counts, defects = masks.prepare_many([lps_of[k] for k in kept], [masks_of[k] for k in kept], stage=stage)
    n = len(members)
    out = MemberColumns([None] * n, [None] * n, [0] * n, [None] * n, [0] * n)
    for j, k in enumerate(kept):
        out.token_ids[k], out.stored_log_probs[k] = ids_of[k], stored[j]
        out.masked[k], out.defect[k], out.lengths[k] = counts[j], defects[j], len(ids_of[k])
    return out


def _converted(qid: QuestionId, token_ids: Any, behaviour_log_probs: Any) -> tuple[np.ndarray, np.ndarray]:
    """A member's (token ids as int32, behaviour log-probs as float32), checked (ValueError naming the question)."""
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
