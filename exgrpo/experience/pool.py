"""The experience pool: correct trajectories of partially solved questions, their buckets and the retired set.

docs/algorithm.md §2 (state) and §3 (collection). The pool keeps, per question, its distinct correct trajectories
(response token ids with EOS, one behaviour log-prob per token, reward, step collected), the question's latest
success count k (its *bucket*), and the set of retired questions (solved K/K, never replayed again).

Storage is separate from bookkeeping, like torchrl's storage/sampler split: token ids (int32, vocabularies
over 65k need 32 bits) and behaviour log-probs (float32, the importance ratio needs their precision) live in a
token store; the pool keeps small per-entry metadata columns (numpy) and per-question lists of entry slots.
Two stores share one interface and one checkpoint format:

* ``arena`` (default): big chunks of ``chunk_tokens`` tokens (4M: 16 MB ids + 16 MB log-probs each). An entry
  lives inside one chunk; freeing leaves a hole and a chunk is compacted in place once its holes exceed
  1/32 of its capacity (or released once empty), so the memory held stays within a few % of the live tokens.
* ``per_entry``: one small numpy array pair per trajectory (simple; ~250 bytes of object overhead each).

``benchmarks/pool_scale.py`` measures both at the paper's scale (202,011 trajectories).
"""

from __future__ import annotations

import sys
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeAlias

import numpy as np

if TYPE_CHECKING:
    from exgrpo.config import ExGRPOConfig

__all__ = [
    "BucketIndex",
    "Candidate",
    "CollectStats",
    "ExperiencePool",
    "Group",
    "GroupMember",
    "QuestionId",
    "is_success",
]

QuestionId: TypeAlias = str | int

#: A member counts as correct (a "success") when its reward reaches 1: the training reward is binary (§10).
SUCCESS_REWARD = 1.0
_INT32_MAX = np.iinfo(np.int32).max
_DEFAULT_CHUNK_TOKENS = 1 << 22
#: A chunk is compacted once its dead tokens exceed capacity / _COMPACT_DIVISOR (keeps held memory tight).
_COMPACT_DIVISOR = 32


def is_success(reward: float) -> bool:
    """Whether a member's reward counts as a success (k counts these, §3)."""
    return float(reward) >= SUCCESS_REWARD


# ---------------------------------------------------------------------------------------------- public records
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

    def as_metrics(self, prefix: str = "collect/") -> dict[str, float]:
        out = {
            f"{prefix}{name}": float(getattr(self, name))
            for name in (
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
        }
        return out


# ---------------------------------------------------------------------------------------------- buckets
class BucketIndex:
    """bucket_of (question -> latest success count k) plus, per bucket, an indexable member list.

    Lists (not sets) so that the sampler can draw uniformly by position; removal swaps the last member into
    the hole, which is deterministic, and the exact order is saved so a resumed run draws identically.
    Invariant kept by the pool: a question is a member iff it has >= 1 stored trajectory and a bucket.
    """

    def __init__(self, k: int):
        self.k = k
        self._members: list[list[QuestionId]] = [[] for _ in range(k)]
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

    def state(self) -> list[list[QuestionId]]:
        return [list(m) for m in self._members]

    def load(self, members: Sequence[Sequence[QuestionId]]) -> None:
        if len(members) != self.k:
            raise ValueError(f"bucket lists for K={len(members)} cannot be loaded into a pool with K={self.k}")
        self.__init__(self.k)  # type: ignore[misc]
        for bucket, qids in enumerate(members):
            for qid in qids:
                if qid in self._bucket_of:
                    raise ValueError(f"question {qid!r} appears in two buckets")
                self._bucket_of[qid] = bucket
                self._pos[qid] = len(self._members[bucket])
                self._members[bucket].append(qid)


# ---------------------------------------------------------------------------------------------- token stores
class _TokenStore:
    """Interface of a token store: token ids + behaviour log-probs addressed by the pool's entry slot."""

    name = "abstract"

    def resize(self, capacity: int) -> None: ...
    def put(self, slot: int, ids: np.ndarray, lps: np.ndarray) -> None: ...
    def view(self, slot: int) -> tuple[np.ndarray, np.ndarray]: ...
    def free(self, slot: int) -> None: ...
    def nbytes(self) -> int: ...
    def bulk_load(self, slots: np.ndarray, lengths: np.ndarray, ids: np.ndarray, lps: np.ndarray) -> None: ...
    def clear(self) -> None: ...


class _ArenaStore(_TokenStore):
    """Chunked columnar arena: per chunk one int32 and one float32 array; per slot (chunk, offset, length)."""

    name = "arena"

    def __init__(self, chunk_tokens: int = _DEFAULT_CHUNK_TOKENS):
        if chunk_tokens < 1:
            raise ValueError(f"chunk_tokens must be >= 1, got {chunk_tokens}")
        self.chunk_tokens = int(chunk_tokens)
        self.clear()

    def clear(self) -> None:
        self._ids: list[np.ndarray | None] = []
        self._lps: list[np.ndarray | None] = []
        self._used: list[int] = []  # tail pointer per chunk
        self._live: list[int] = []  # live tokens per chunk
        self._chunk = np.full(0, -1, dtype=np.int32)
        self._offset = np.zeros(0, dtype=np.int64)
        self._length = np.zeros(0, dtype=np.int32)
        self._open = -1  # chunk tried first for the next put

    def resize(self, capacity: int) -> None:
        old = self._chunk.shape[0]
        if capacity <= old:
            return
        self._chunk = np.concatenate([self._chunk, np.full(capacity - old, -1, dtype=np.int32)])
        self._offset = np.concatenate([self._offset, np.zeros(capacity - old, dtype=np.int64)])
        self._length = np.concatenate([self._length, np.zeros(capacity - old, dtype=np.int32)])

    def _capacity(self, c: int) -> int:
        arr = self._ids[c]
        return 0 if arr is None else int(arr.shape[0])

    def _new_chunk(self, min_tokens: int) -> int:
        cap = max(self.chunk_tokens, min_tokens)
        ids, lps = np.empty(cap, dtype=np.int32), np.empty(cap, dtype=np.float32)
        for c, arr in enumerate(self._ids):  # reuse a released chunk index
            if arr is None:
                self._ids[c], self._lps[c], self._used[c], self._live[c] = ids, lps, 0, 0
                return c
        self._ids.append(ids)
        self._lps.append(lps)
        self._used.append(0)
        self._live.append(0)
        return len(self._ids) - 1

    def _chunk_with_room(self, n: int) -> int:
        c = self._open
        if c >= 0 and self._ids[c] is not None and self._capacity(c) - self._used[c] >= n:
            return c
        for c in range(len(self._ids)):  # first fit: reuses tails freed by compaction
            if self._ids[c] is not None and self._capacity(c) - self._used[c] >= n:
                self._open = c
                return c
        c = self._new_chunk(n)
        self._open = c
        return c

    def put(self, slot: int, ids: np.ndarray, lps: np.ndarray) -> None:
        n = ids.shape[0]
        c = self._chunk_with_room(n)
        off = self._used[c]
        self._ids[c][off : off + n] = ids  # type: ignore[index]
        self._lps[c][off : off + n] = lps  # type: ignore[index]
        self._used[c] = off + n
        self._live[c] += n
        self._chunk[slot], self._offset[slot], self._length[slot] = c, off, n

    def view(self, slot: int) -> tuple[np.ndarray, np.ndarray]:
        c = int(self._chunk[slot])
        off = int(self._offset[slot])
        end = off + int(self._length[slot])
        return self._ids[c][off:end], self._lps[c][off:end]  # type: ignore[index]

    def free(self, slot: int) -> None:
        c = int(self._chunk[slot])
        self._live[c] -= int(self._length[slot])
        self._chunk[slot] = -1
        if self._live[c] == 0:
            # Release the whole chunk: nothing live in it any more.
            self._ids[c] = self._lps[c] = None
            self._used[c] = 0
            if self._open == c:
                self._open = -1
        elif self._used[c] - self._live[c] > self._capacity(c) // _COMPACT_DIVISOR:
            self._compact(c)

    def _compact(self, c: int) -> None:
        """Slide the chunk's live entries down over the holes (in place; offsets rewritten)."""
        slots = np.flatnonzero(self._chunk == c)
        slots = slots[np.argsort(self._offset[slots], kind="stable")]
        ids, lps = self._ids[c], self._lps[c]
        dst = 0
        for s in slots.tolist():
            off, n = int(self._offset[s]), int(self._length[s])
            if off != dst:
                ids[dst : dst + n] = ids[off : off + n]  # type: ignore[index]
                lps[dst : dst + n] = lps[off : off + n]  # type: ignore[index]
                self._offset[s] = dst
            dst += n
        self._used[c] = dst

    def nbytes(self) -> int:
        data = sum(a.nbytes for a in self._ids if a is not None) + sum(a.nbytes for a in self._lps if a is not None)
        return data + self._chunk.nbytes + self._offset.nbytes + self._length.nbytes

    def bulk_load(self, slots: np.ndarray, lengths: np.ndarray, ids: np.ndarray, lps: np.ndarray) -> None:
        # One saved batch becomes one chunk (batches are cut at <= chunk_tokens on save when possible).
        total = int(lengths.sum())
        c = self._new_chunk(total)
        self._ids[c][:total] = ids  # type: ignore[index]
        self._lps[c][:total] = lps  # type: ignore[index]
        self._used[c] = self._live[c] = total
        offsets = np.zeros(len(slots), dtype=np.int64)
        np.cumsum(lengths[:-1], out=offsets[1:])
        self._chunk[slots], self._offset[slots], self._length[slots] = c, offsets, lengths
        self._open = c


class _PerEntryStore(_TokenStore):
    """One owned numpy array pair per entry slot."""

    name = "per_entry"
    _ARRAY_OVERHEAD = sys.getsizeof(np.empty(0, dtype=np.int32))

    def __init__(self) -> None:
        self.clear()

    def clear(self) -> None:
        self._ids: list[np.ndarray | None] = []
        self._lps: list[np.ndarray | None] = []
        self._data_bytes = 0
        self._arrays = 0

    def resize(self, capacity: int) -> None:
        grow = capacity - len(self._ids)
        if grow > 0:
            self._ids.extend([None] * grow)
            self._lps.extend([None] * grow)

    def put(self, slot: int, ids: np.ndarray, lps: np.ndarray) -> None:
        a, b = ids.copy(), lps.copy()
        self._ids[slot], self._lps[slot] = a, b
        self._data_bytes += a.nbytes + b.nbytes
        self._arrays += 2

    def view(self, slot: int) -> tuple[np.ndarray, np.ndarray]:
        return self._ids[slot], self._lps[slot]  # type: ignore[return-value]

    def free(self, slot: int) -> None:
        a, b = self._ids[slot], self._lps[slot]
        self._data_bytes -= a.nbytes + b.nbytes  # type: ignore[union-attr]
        self._arrays -= 2
        self._ids[slot] = self._lps[slot] = None

    def nbytes(self) -> int:
        # Object headers counted; allocator overhead is not (the benchmark reports RSS as well).
        return self._data_bytes + self._arrays * self._ARRAY_OVERHEAD + 16 * len(self._ids)

    def bulk_load(self, slots: np.ndarray, lengths: np.ndarray, ids: np.ndarray, lps: np.ndarray) -> None:
        off = 0
        for s, n in zip(slots.tolist(), lengths.tolist(), strict=True):
            self.put(s, ids[off : off + n], lps[off : off + n])
            off += n


def _make_store(storage: str, chunk_tokens: int) -> _TokenStore:
    if storage == "arena":
        return _ArenaStore(chunk_tokens)
    if storage == "per_entry":
        return _PerEntryStore()
    raise ValueError(f"unknown pool storage {storage!r}; expected 'arena' or 'per_entry'")


# ---------------------------------------------------------------------------------------------- the pool
_COLUMNS = {  # per-entry metadata columns: name -> dtype
    "entry_id": np.int64,
    "question": np.int32,  # index into the pool's question table
    "length": np.int32,
    "reward": np.float32,
    "step": np.int64,
}


class ExperiencePool:
    """Experience pool with the collection rules of docs/algorithm.md §3.

    Typical use per training step (the trainer's order)::

        qids = sampler.draw(pool, n, exclude=fresh_qids).question_ids          # §4
        groups = pool.candidates(qids, max_per_question=cap)                    # for selection, §5
        ...rollout, reward, update...
        stats = pool.collect(step, groups_of_this_step, mixed=schedule.mixed)   # §3
        schedule.update(step, batch_pass_rate)                                  # §9
    """

    def __init__(
        self,
        k: int,
        *,
        lbound: int = 0,
        rbound: int | None = None,
        count_replayed_in_k: bool = True,
        zero_success: str = "bucket0",
        collect_from: str = "start",
        max_entries_per_question: int | None = None,
        max_total_tokens: int | None = None,
        storage: str = "arena",
        chunk_tokens: int = _DEFAULT_CHUNK_TOKENS,
    ):
        if k < 2:
            raise ValueError(f"K (group size) must be >= 2, got {k}")
        rbound = k - 1 if rbound is None else rbound
        if not 0 <= lbound < rbound <= k - 1:
            raise ValueError(f"collection bounds must satisfy 0 <= lbound < rbound <= K-1, got {lbound}, {rbound}")
        if zero_success not in ("bucket0", "keep"):
            raise ValueError(f"zero_success must be 'bucket0' or 'keep', got {zero_success!r}")
        if collect_from not in ("start", "mixed"):
            raise ValueError(f"collect_from must be 'start' or 'mixed', got {collect_from!r}")
        self.k = k
        self.lbound = lbound
        self.rbound = rbound
        self.count_replayed_in_k = count_replayed_in_k
        self.zero_success = zero_success
        self.collect_from = collect_from
        self.max_entries_per_question = max_entries_per_question
        self.max_total_tokens = max_total_tokens
        self.storage = storage
        self._store = _make_store(storage, chunk_tokens)
        self._reset()

    @classmethod
    def from_config(cls, cfg: ExGRPOConfig, **kwargs: Any) -> ExperiencePool:
        assert cfg.k is not None, "ExGRPOConfig.k must be set (validate the config first)"
        return cls(
            cfg.k,
            lbound=cfg.bucket_lbound,
            rbound=cfg.bucket_rbound,
            count_replayed_in_k=cfg.count_replayed_in_k,
            zero_success=cfg.zero_success,
            collect_from=cfg.collect_from,
            max_entries_per_question=cfg.max_entries_per_question,
            max_total_tokens=cfg.max_total_tokens,
            storage=cfg.pool_storage,
            **kwargs,
        )

    def _reset(self) -> None:
        self._store.clear()
        self._cols = {name: np.zeros(0, dtype=dt) for name, dt in _COLUMNS.items()}
        self._free: list[int] = []  # free slots (stack)
        self._n_slots = 0  # slots ever handed out (high-water mark)
        self._qindex: dict[QuestionId, int] = {}
        self._qids: list[QuestionId] = []
        self._slots_of: list[list[int]] = []  # per question index: slots, oldest first
        self.buckets = BucketIndex(self.k)
        self._retired: dict[QuestionId, int] = {}  # question -> step retired (insertion-ordered set)
        self._next_entry_id = 0
        self._num_entries = 0
        self._total_tokens = 0
        self._last_step = -1
        self.counters = {
            "collected": 0, "duplicates": 0, "evicted": 0, "retired": 0, "unretired": 0, "collect_calls": 0
        }

    # ------------------------------------------------------------------------------------------ queries
    def __len__(self) -> int:
        return self._num_entries

    @property
    def total_tokens(self) -> int:
        return self._total_tokens

    @property
    def num_questions(self) -> int:
        """Questions with at least one stored trajectory."""
        return len(self.buckets)

    @property
    def retired(self) -> Any:
        """Retired question ids (a read-only set-like view: ``q in pool.retired``, iteration, len)."""
        return self._retired.keys()

    def is_retired(self, qid: QuestionId) -> bool:
        return qid in self._retired

    def bucket_of(self, qid: QuestionId) -> int | None:
        return self.buckets.bucket_of(qid)

    def num_entries(self, qid: QuestionId) -> int:
        qi = self._qindex.get(qid)
        return 0 if qi is None else len(self._slots_of[qi])

    def entry_ids(self, qid: QuestionId) -> list[int]:
        qi = self._qindex.get(qid)
        if qi is None:
            return []
        return [int(self._cols["entry_id"][s]) for s in self._slots_of[qi]]

    def question_ids(self) -> list[QuestionId]:
        """Questions with at least one stored trajectory (bucket order)."""
        return [q for b in range(self.k) for q in self.buckets.members(b)]

    def _candidate(self, qid: QuestionId, slot: int, copy: bool) -> Candidate:
        ids, lps = self._store.view(slot)
        if copy:
            ids, lps = ids.copy(), lps.copy()
        else:
            ids, lps = ids.view(), lps.view()
            ids.flags.writeable = False
            lps.flags.writeable = False
        c = self._cols
        return Candidate(qid, int(c["entry_id"][slot]), ids, lps, float(c["reward"][slot]), int(c["step"][slot]))

    def entries(self, qid: QuestionId, *, copy: bool = True) -> list[Candidate]:
        """All stored trajectories of a question, oldest first (empty list when none)."""
        qi = self._qindex.get(qid)
        if qi is None:
            return []
        return [self._candidate(qid, s, copy) for s in self._slots_of[qi]]

    def lengths(self, qid: QuestionId) -> np.ndarray:
        """Response lengths (tokens) of a question's stored trajectories, oldest first (empty when none)."""
        qi = self._qindex.get(qid)
        if qi is None:
            return np.zeros(0, dtype=np.int32)
        return self._cols["length"][np.asarray(self._slots_of[qi], dtype=np.int64)]

    def candidates(
        self,
        question_ids: Iterable[QuestionId],
        *,
        max_per_question: int | None = None,
        max_length: int | None = None,
        copy: bool = True,
    ) -> list[list[Candidate]]:
        """Per drawn question, its stored trajectories, oldest first.

        ``max_length``: leave out trajectories longer than this many tokens (e.g. a run resumed with a lower
        response limit); a question may then get an empty list. ``max_per_question``: keep the newest ones
        (after the length filter). Raises KeyError for a question without stored trajectories (the sampler
        never draws one).
        """
        out = []
        for qid in question_ids:
            qi = self._qindex.get(qid)
            slots = self._slots_of[qi] if qi is not None else []
            if not slots:
                raise KeyError(f"question {qid!r} has no stored trajectories in the experience pool")
            if max_length is not None:
                lengths = self._cols["length"]
                slots = [s for s in slots if lengths[s] <= max_length]
            if max_per_question is not None:
                slots = slots[-max_per_question:]
            out.append([self._candidate(qid, s, copy) for s in slots])
        return out

    def get(self, qid: QuestionId, entry_id: int, *, copy: bool = True) -> Candidate:
        qi = self._qindex.get(qid)
        for s in self._slots_of[qi] if qi is not None else []:
            if self._cols["entry_id"][s] == entry_id:
                return self._candidate(qid, s, copy)
        raise KeyError(f"entry {entry_id} of question {qid!r} is not in the experience pool")

    # ------------------------------------------------------------------------------------------ memory/stats
    def memory_bytes(self) -> int:
        """Bytes held: token store (capacity, not only live tokens) + metadata columns + index estimate."""
        cols = sum(a.nbytes for a in self._cols.values())
        # Python-side index: question table, per-question slot lists, bucket lists, retired set (estimate).
        index = 120 * len(self._qids) + 8 * self._num_entries + 100 * (len(self.buckets) + len(self._retired))
        return self._store.nbytes() + cols + index

    def stats(self, prefix: str = "pool/") -> dict[str, float]:
        """Flat float metrics for logging (the trainer adds its ``exgrpo/`` prefix)."""
        mem = self.memory_bytes()
        sizes = self.buckets.sizes()
        out = {
            f"{prefix}entries": float(self._num_entries),
            f"{prefix}questions": float(len(self.buckets)),
            f"{prefix}tokens": float(self._total_tokens),
            f"{prefix}bytes": float(mem),
            f"{prefix}bytes_per_token": float(mem / self._total_tokens) if self._total_tokens else 0.0,
            f"{prefix}retired": float(len(self._retired)),
            f"{prefix}sampleable_questions": float(sum(sizes[1:])),
            f"{prefix}mean_entries_per_question": (
                float(self._num_entries / len(self.buckets)) if len(self.buckets) else 0.0
            ),
        }
        for b, n in enumerate(sizes):
            out[f"{prefix}bucket_{b}"] = float(n)
        for name, v in self.counters.items():
            out[f"{prefix}{name}_total"] = float(v)
        return out

    # ------------------------------------------------------------------------------------------ mutation
    def _question_index(self, qid: QuestionId) -> int:
        qi = self._qindex.get(qid)
        if qi is None:
            if not isinstance(qid, (str, int)) or isinstance(qid, bool):
                raise TypeError(f"question ids must be str or int, got {type(qid).__name__} {qid!r}")
            qi = len(self._qids)
            self._qindex[qid] = qi
            self._qids.append(qid)
            self._slots_of.append([])
        return qi

    def _alloc_slot(self) -> int:
        if self._free:
            return self._free.pop()
        slot = self._n_slots
        cap = self._cols["entry_id"].shape[0]
        if slot >= cap:
            new_cap = max(1024, 2 * cap)
            for name, arr in self._cols.items():
                grown = np.zeros(new_cap, dtype=arr.dtype)
                grown[:cap] = arr
                self._cols[name] = grown
            self._store.resize(new_cap)
        self._n_slots += 1
        return slot

    def add(
        self, qid: QuestionId, token_ids: Any, behaviour_log_probs: Any, *, reward: float = 1.0, step: int = 0
    ) -> int | None:
        """Store one trajectory (dedup by token ids within the question). Returns its entry id, None if a dup.

        Low-level: it neither updates buckets nor applies the caps; :meth:`collect` does both.
        """
        if qid in self._retired:
            raise ValueError(f"question {qid!r} is retired; it can no longer be stored")
        ids, lps = _as_member_arrays(qid, token_ids, behaviour_log_probs)
        qi = self._question_index(qid)
        n = ids.shape[0]
        length = self._cols["length"]
        for s in self._slots_of[qi]:  # dedup: same length first, then exact token equality
            if length[s] == n and np.array_equal(self._store.view(s)[0], ids):
                self.counters["duplicates"] += 1
                return None
        slot = self._alloc_slot()
        self._store.put(slot, ids, lps)
        entry_id = self._next_entry_id
        self._next_entry_id += 1
        c = self._cols
        c["entry_id"][slot], c["question"][slot], c["length"][slot] = entry_id, qi, n
        c["reward"][slot], c["step"][slot] = reward, step
        self._slots_of[qi].append(slot)
        self._num_entries += 1
        self._total_tokens += n
        self.counters["collected"] += 1
        return entry_id

    def _free_slot(self, slot: int) -> int:
        n = int(self._cols["length"][slot])
        self._store.free(slot)
        self._cols["entry_id"][slot] = -1
        self._free.append(slot)
        self._num_entries -= 1
        self._total_tokens -= n
        return n

    def _drop_question_if_empty(self, qid: QuestionId) -> None:
        if not self._slots_of[self._qindex[qid]]:
            self.buckets.remove(qid)

    def remove_entry(self, qid: QuestionId, entry_id: int) -> None:
        """Evict one stored trajectory (the question leaves its bucket if it has none left)."""
        qi = self._qindex.get(qid)
        slots = self._slots_of[qi] if qi is not None else []
        for i, s in enumerate(slots):
            if self._cols["entry_id"][s] == entry_id:
                self._free_slot(s)
                del slots[i]
                self._drop_question_if_empty(qid)
                return
        raise KeyError(f"entry {entry_id} of question {qid!r} is not in the experience pool")

    def retire(self, qid: QuestionId, step: int | None = None) -> None:
        """Retire for good (§3, k = K): drop its trajectories and bucket; never stored or replayed again."""
        qi = self._qindex.get(qid)
        if qi is not None:
            for s in self._slots_of[qi]:
                self._free_slot(s)
            self._slots_of[qi] = []
        self.buckets.remove(qid)
        if qid not in self._retired:
            self._retired[qid] = self._last_step if step is None else step
            self.counters["retired"] += 1

    def unretire(self, question_ids: Iterable[QuestionId]) -> int:
        """Un-retire questions (the "retired questions re-added" ablation): they may be drawn as fresh prompts
        and collected again. Their trajectories were dropped at retirement. Returns how many were retired."""
        n = 0
        for qid in question_ids:
            if self._retired.pop(qid, None) is not None:
                n += 1
        self.counters["unretired"] += n
        return n

    def collect(self, step: int, groups: Iterable[Group], *, mixed: bool = True) -> CollectStats:
        """Apply the collection rules of docs/algorithm.md §3 to this step's groups (after rewards are known).

        Per group, k = successes among the counted members (all K, or the fresh ones only when
        ``count_replayed_in_k`` is off):

        * every counted member correct (k = K by default) -> retire the question;
        * k = 0 -> ``zero_success='bucket0'``: a stored question moves to bucket 0 (kept, never sampled);
          ``'keep'``: nothing changes (released behaviour);
        * lbound < k <= rbound -> bucket_of = k and every correct fresh member not already stored is added;
        * otherwise nothing changes. Retired questions are ignored.

        ``mixed`` is the delayed-start flag *of this step*. With ``collect_from='mixed'`` (the released code)
        only retirement happens before mixed mode: K/K questions are retired from step 1, while storing
        trajectories, bucket updates and the 0/K rule wait for the switch (``stats.skipped`` is then True).
        The caps evict the oldest entries after the groups are processed.
        """
        groups = list(groups)
        stats = CollectStats(step=step, groups=len(groups))
        self.counters["collect_calls"] += 1
        self._last_step = step
        retire_only = self.collect_from == "mixed" and not mixed
        stats.skipped = retire_only
        for g in groups:
            qid = g.question_id
            members = g.members
            if len(members) != self.k:
                raise ValueError(
                    f"group of question {qid!r} has {len(members)} members; expected K={self.k} "
                    "(a replayed question: its replayed member plus K-1 fresh ones)"
                )
            if qid in self._retired:
                stats.ignored_retired += 1
                continue
            counted = [m for m in members if self.count_replayed_in_k or not m.is_replayed]
            k_succ = sum(1 for m in counted if is_success(m.reward))
            stats.success_counts.append(k_succ)
            if k_succ == len(counted):
                self.retire(qid, step)
                stats.retired += 1
                continue
            if retire_only:
                continue
            if k_succ == 0:
                stats.zero_success += 1
                if self.zero_success == "bucket0" and self.num_entries(qid) > 0:
                    self.buckets.set(qid, 0)
                    stats.moved_to_bucket0 += 1
                continue
            if not self.lbound < k_succ <= self.rbound:
                stats.out_of_range += 1
                continue
            for m in members:
                if m.is_replayed or not is_success(m.reward):
                    continue  # a replayed member is already stored (with its original behaviour log-probs)
                entry = self.add(qid, m.token_ids, m.behaviour_log_probs, reward=float(m.reward), step=step)
                if entry is None:
                    stats.duplicates += 1
                else:
                    stats.added_entries += 1
                    stats.added_tokens += int(np.shape(m.token_ids)[0])
            cap = self.max_entries_per_question
            qi = self._qindex.get(qid)
            if qi is not None and cap is not None:
                slots = self._slots_of[qi]
                while len(slots) > cap:
                    stats.evicted_tokens += self._free_slot(slots.pop(0))
                    stats.evicted_entries += 1
            if self.num_entries(qid) > 0:
                self.buckets.set(qid, k_succ)
                stats.bucket_updates += 1
            else:
                self.buckets.remove(qid)
        if self.max_total_tokens is not None and self._total_tokens > self.max_total_tokens:
            n, t = self._evict_oldest_until(self.max_total_tokens)
            stats.evicted_entries += n
            stats.evicted_tokens += t
        self.counters["evicted"] += stats.evicted_entries
        return stats

    def _evict_oldest_until(self, max_tokens: int) -> tuple[int, int]:
        """Global oldest-first eviction (entry ids increase with insertion) until <= max_tokens are held."""
        eid = self._cols["entry_id"][: self._n_slots]
        live = np.flatnonzero(eid >= 0)
        order = live[np.argsort(eid[live], kind="stable")]
        excess = self._total_tokens - max_tokens
        cum = np.cumsum(self._cols["length"][order].astype(np.int64))
        n_evict = int(np.searchsorted(cum, excess, side="left")) + 1
        victims = order[:n_evict].tolist()
        touched = set()
        tokens = 0
        qcol = self._cols["question"]
        for s in victims:
            qi = int(qcol[s])
            self._slots_of[qi].remove(s)
            tokens += self._free_slot(s)
            touched.add(qi)
        for qi in touched:
            self._drop_question_if_empty(self._qids[qi])
        return len(victims), tokens

    # ------------------------------------------------------------------------------------------ state
    def _export(
        self, max_batch_tokens: int
    ) -> tuple[dict[str, Any], dict[str, np.ndarray], list[tuple[int, int]], np.ndarray]:
        """(JSON-able meta, entry columns in entry-id order, batch row ranges, slots in that order).

        Used by persistence; :meth:`_batch_tokens` gathers the tokens of a row range.
        """
        eid = self._cols["entry_id"][: self._n_slots]
        live = np.flatnonzero(eid >= 0)
        order = live[np.argsort(eid[live], kind="stable")]
        qcol = self._cols["question"][order]
        # Compact question table: only questions referenced by entries, buckets (none without entries).
        used_q, new_q = np.unique(qcol, return_inverse=True)
        questions = [self._qids[int(q)] for q in used_q]
        entries = {name: self._cols[name][order].copy() for name in _COLUMNS}
        entries["question"] = new_q.astype(np.int32)
        lengths = entries["length"].astype(np.int64)
        ranges: list[tuple[int, int]] = []
        start, acc = 0, 0
        for i, n in enumerate(lengths.tolist()):
            if acc and acc + n > max_batch_tokens:
                ranges.append((start, i))
                start, acc = i, 0
            acc += n
        if acc:
            ranges.append((start, len(lengths)))
        meta = {
            "k": self.k,
            "settings": self.settings(),
            "questions": questions,
            "bucket_members": self.buckets.state(),
            "retired": [[q, s] for q, s in self._retired.items()],
            "next_entry_id": self._next_entry_id,
            "last_step": self._last_step,
            "counters": dict(self.counters),
            "num_entries": self._num_entries,
            "total_tokens": self._total_tokens,
        }
        return meta, entries, ranges, order

    def _batch_tokens(
        self, order: np.ndarray, start: int, stop: int, out: tuple[np.ndarray, np.ndarray] | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        """Tokens of export rows [start, stop) concatenated; into ``out`` buffers (reused) when given."""
        views = [self._store.view(s) for s in order[start:stop].tolist()]
        n = sum(v[0].shape[0] for v in views)
        if out is None or out[0].shape[0] < n:
            out = (np.empty(n, dtype=np.int32), np.empty(n, dtype=np.float32))
        ids, lps = out[0][:n], out[1][:n]
        np.concatenate([v[0] for v in views], out=ids)
        np.concatenate([v[1] for v in views], out=lps)
        return ids, lps

    def _import(
        self,
        meta: dict[str, Any],
        entries: dict[str, np.ndarray],
        batches: Iterator[tuple[int, int, np.ndarray, np.ndarray]],
    ) -> None:
        """Rebuild from exported state; ``batches`` yields (row start, row stop, token ids, log-probs)."""
        if int(meta["k"]) != self.k:
            raise ValueError(f"the saved pool has K={meta['k']} but this pool has K={self.k}")
        self._reset()
        n = int(entries["entry_id"].shape[0])
        lengths = entries["length"].astype(np.int32)
        if np.any(lengths <= 0):
            raise ValueError("saved entries hold a non-positive length")
        questions = list(meta["questions"])
        for q in questions:
            self._question_index(q)
        cap = max(1024, n)
        self._cols = {name: np.zeros(cap, dtype=dt) for name, dt in _COLUMNS.items()}
        self._cols["entry_id"][:] = -1
        for name in _COLUMNS:
            self._cols[name][:n] = entries[name]
        self._store.resize(cap)
        self._n_slots = n
        qcol = entries["question"]
        if n and (qcol.min() < 0 or qcol.max() >= len(questions)):
            raise ValueError("saved entries refer to a question index outside the question table")
        if n and np.any(np.diff(entries["entry_id"]) <= 0):
            raise ValueError("saved entry ids are not strictly increasing")
        for slot, qi in enumerate(qcol.tolist()):
            self._slots_of[qi].append(slot)
        expected = 0
        for start, stop, ids, lps in batches:
            if start != expected:
                raise ValueError(f"token batches are not contiguous (rows {start} after {expected})")
            seg = lengths[start:stop]
            if int(seg.sum()) != ids.shape[0] or ids.shape != lps.shape:
                raise ValueError(
                    f"token batch of rows [{start}, {stop}) holds {ids.shape[0]} tokens, "
                    f"the entry lengths say {int(seg.sum())}"
                )
            self._store.bulk_load(np.arange(start, stop), seg, ids, lps)
            expected = stop
        if expected != n:
            raise ValueError(f"token batches cover {expected} of {n} entries")
        self._num_entries = n
        self._total_tokens = int(lengths.astype(np.int64).sum())
        self._next_entry_id = int(meta["next_entry_id"])
        self._last_step = int(meta["last_step"])
        self.counters.update({k: int(v) for k, v in meta["counters"].items()})
        self.buckets.load(meta["bucket_members"])
        for bucket_list in meta["bucket_members"]:
            for q in bucket_list:
                if self.num_entries(q) == 0:
                    raise ValueError(f"question {q!r} is in a bucket but has no stored trajectory")
        self._retired = {q: int(s) for q, s in meta["retired"]}
        if n != int(meta["num_entries"]) or self._total_tokens != int(meta["total_tokens"]):
            raise ValueError(
                f"saved pool claims {meta['num_entries']} entries / {meta['total_tokens']} tokens, "
                f"the files hold {n} / {self._total_tokens}"
            )

    def settings(self) -> dict[str, Any]:
        return {
            "k": self.k,
            "lbound": self.lbound,
            "rbound": self.rbound,
            "count_replayed_in_k": self.count_replayed_in_k,
            "zero_success": self.zero_success,
            "collect_from": self.collect_from,
            "max_entries_per_question": self.max_entries_per_question,
            "max_total_tokens": self.max_total_tokens,
            "storage": self.storage,
        }

    def state_dict(self) -> dict[str, Any]:
        """Everything, in memory: ``meta`` (JSON-able), ``entries`` (columns), concatenated tokens.

        For large pools use :func:`exgrpo.experience.persistence.save_experience`, which streams batches.
        """
        meta, entries, ranges, order = self._export(max_batch_tokens=1 << 62)
        if ranges:
            ids, lps = self._batch_tokens(order, 0, len(entries["entry_id"]))
        else:
            ids, lps = np.zeros(0, dtype=np.int32), np.zeros(0, dtype=np.float32)
        return {"meta": meta, "entries": entries, "token_ids": ids, "behaviour_log_probs": lps}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        n = int(state["entries"]["entry_id"].shape[0])
        batches = iter([(0, n, state["token_ids"], state["behaviour_log_probs"])] if n else [])
        self._import(state["meta"], state["entries"], batches)


def _as_member_arrays(qid: QuestionId, token_ids: Any, behaviour_log_probs: Any) -> tuple[np.ndarray, np.ndarray]:
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
