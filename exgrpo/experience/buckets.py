"""The bucket index (docs/algorithm.md §2): each stored question's latest success count k, and per bucket an
indexable member list that the sampler draws from by position."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from exgrpo.experience.records import QuestionId

__all__ = ["BucketIndex"]


class BucketIndex:
    """bucket_of (question -> latest success count k) plus, per bucket, an indexable member list.

    Lists (not sets) so that the sampler can draw uniformly by position; removal swaps the last member into
    the hole, which is deterministic, and the exact order is saved so a resumed run draws identically.
    Invariant kept by the pool: a question is a member iff it has >= 1 stored trajectory and a bucket.
    """

    def __init__(self, k: int):
        self.k = k
        self.clear()

    def clear(self) -> None:
        self._members: list[list[QuestionId]] = [[] for _ in range(self.k)]
        self._bucket_of: dict[QuestionId, int] = {}
        self._pos: dict[QuestionId, int] = {}

    def bucket_of(self, qid: QuestionId) -> int | None:
        return self._bucket_of.get(qid)

    def members(self, bucket: int) -> Sequence[QuestionId]:
        """The bucket's members in draw order; do not mutate."""
        return self._members[bucket]

    def position(self, qid: QuestionId) -> int:
        return self._pos[qid]

    def size(self, bucket: int) -> int:
        return len(self._members[bucket])

    def sizes(self) -> list[int]:
        return [len(m) for m in self._members]

    def __contains__(self, qid: object) -> bool:
        return qid in self._bucket_of

    def __len__(self) -> int:
        return len(self._bucket_of)

    def set(self, qid: QuestionId, bucket: int) -> None:
        if not 0 <= bucket < self.k:
            raise ValueError(f"bucket {bucket} out of range [0, {self.k - 1}] for question {qid!r}")
        old = self._bucket_of.get(qid)
        if old == bucket:
            return
        if old is not None:
            self.remove(qid)
        self._bucket_of[qid] = bucket
        self._pos[qid] = len(self._members[bucket])
        self._members[bucket].append(qid)

    def remove(self, qid: QuestionId) -> None:
        bucket = self._bucket_of.pop(qid, None)
        if bucket is None:
            return
        members = self._members[bucket]
        pos = self._pos.pop(qid)
        last = members.pop()
        if pos < len(members):
            members[pos] = last
            self._pos[last] = pos

    def state_dict(self) -> dict[str, Any]:
        """``{"members": one list per bucket 0..K-1, in draw order}`` (JSON-able)."""
        return {"members": [list(m) for m in self._members]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore the member lists (and so the draw order); ValueError for a K mismatch or a doubled member."""
        members = state["members"]
        if len(members) != self.k:
            raise ValueError(f"bucket lists for K={len(members)} cannot be loaded into a pool with K={self.k}")
        self.clear()
        for bucket, qids in enumerate(members):
            for qid in qids:
                if qid in self._bucket_of:
                    raise ValueError(f"question {qid!r} appears in two buckets")
                self._bucket_of[qid] = bucket
                self._pos[qid] = len(self._members[bucket])
                self._members[bucket].append(qid)
