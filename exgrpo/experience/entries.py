"""The entry table: what the pool knows about each stored trajectory besides its tokens.

Per entry *slot* (a row of numpy columns, reused after the entry is freed): entry id (never reused; ids increase
with insertion), question (an index into the question table), length, reward, step collected. Per question: its
slots, oldest first. The table hands out the slots the token storage is addressed by, and keeps an insertion-order
log so that the oldest entries are found without sorting the pool (the ``max_total_tokens`` cap).

It owns ``entries.arrow`` (one row per live entry, in entry-id order, question indices into a compact question
table that goes into the header). Beside the saved columns it keeps, in memory only, each entry's count of masked
tokens (the tokens its loss mask marks as not the model's: derived from the token file on load, never saved), so
that the pool knows which trajectories carry a mask without reading their tokens; that column exists from the
first masked entry on (a pool of single-turn trajectories holds nothing more than before).
"""

from __future__ import annotations

import pathlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa

from exgrpo.experience import files
from exgrpo.experience.records import QuestionId

__all__ = ["COLUMNS", "ENTRY_SCHEMA", "EntryBatch", "EntryTable"]

#: Per-entry metadata columns: name -> dtype (also the columns of entries.arrow, in this order).
COLUMNS: dict[str, type] = {
    "entry_id": np.int64,
    "question": np.int32,  # index into the question table
    "length": np.int32,
    "reward": np.float32,
    "step": np.int64,
}
ENTRY_SCHEMA = pa.schema([(name, pa.from_numpy_dtype(np.dtype(dt))) for name, dt in COLUMNS.items()])


@dataclass
class EntryBatch:
    """New entries waiting to be stored together (one collect call): per entry its question index, entry id,
    token ids (int32), stored log-probs (float32, NaN on masked tokens), reward, step and masked-token count."""

    questions: list[int] = field(default_factory=list)
    entry_ids: list[int] = field(default_factory=list)
    token_ids: list[np.ndarray] = field(default_factory=list)
    log_probs: list[np.ndarray] = field(default_factory=list)
    rewards: list[float] = field(default_factory=list)
    steps: list[int] = field(default_factory=list)
    masked: list[int] = field(default_factory=list)

    def append(
        self, qi: int, entry_id: int, ids: np.ndarray, lps: np.ndarray, reward: float, step: int, masked: int = 0
    ) -> None:
        self.questions.append(qi)
        self.entry_ids.append(entry_id)
        self.token_ids.append(ids)
        self.log_probs.append(lps)
        self.rewards.append(reward)
        self.steps.append(step)
        self.masked.append(masked)

    def extend(
        self,
        qi: int,
        entry_ids: Sequence[int],
        ids: Sequence[np.ndarray],
        lps: Sequence[np.ndarray],
        rewards: Sequence[float],
        step: int,
        masked: Sequence[int],
    ) -> None:
        """``append`` of several entries of one question and step, given column by column."""
        n = len(ids)
        self.questions.extend([qi] * n)
        self.entry_ids.extend(entry_ids)
        self.token_ids.extend(ids)
        self.log_probs.extend(lps)
        self.rewards.extend(rewards)
        self.steps.extend([step] * n)
        self.masked.extend(masked)

    def _columns(self) -> tuple[list[Any], ...]:
        return (self.questions, self.entry_ids, self.token_ids, self.log_probs, self.rewards, self.steps, self.masked)

    def clear(self) -> None:
        for rows in self._columns():
            rows.clear()

    def lengths(self) -> np.ndarray:
        return np.fromiter(map(len, self.token_ids), dtype=np.int64, count=len(self.token_ids))  # 1-D arrays

    def __len__(self) -> int:
        return len(self.entry_ids)


class EntryTable:
    """Entry metadata columns, slot allocation, the question table and per-question slot lists."""

    def __init__(self) -> None:
        self.clear()

    def clear(self) -> None:
        self.columns: dict[str, np.ndarray] = {name: np.zeros(0, dtype=dt) for name, dt in COLUMNS.items()}
        self._masked: np.ndarray | None = None  # per slot: masked tokens, from the first masked entry on
        self.total_masked = 0
        self._free: list[int] = []  # free slots (stack)
        self._n_slots = 0  # slots ever handed out (high-water mark)
        self._qindex: dict[QuestionId, int] = {}
        self._qids: list[QuestionId] = []
        self._slots_of: list[list[int]] = []  # per question index: slots, oldest first
        self.next_entry_id = 0
        self.num_entries = 0
        self.total_tokens = 0
        # Insertion-order log of (slot, entry id): the oldest live entries without a sort. Entries freed since are
        # recognised by their slot holding another id (or none); the log is compacted once it is half dead. It is
        # built on the first call of ``oldest`` (only the max_total_tokens cap needs it) and kept up from then on.
        self._log_on = False
        self._log_slot = np.zeros(0, dtype=np.int64)
        self._log_eid = np.zeros(0, dtype=np.int64)
        self._log_len = 0
        self._log_head = 0  # every log item before it is dead
        self._log_dead = 0  # dead items in the log

    # ------------------------------------------------------------------ questions
    @property
    def capacity(self) -> int:
        return int(self.columns["entry_id"].shape[0])

    @property
    def num_question_ids(self) -> int:
        """Questions the table has seen (with or without live entries)."""
        return len(self._qids)

    def question_index(self, qid: QuestionId) -> int:
        """The question's index, created on first use; TypeError for an id that is neither str nor int."""
        qi = self._qindex.get(qid)
        if qi is None:
            if not isinstance(qid, (str, int)) or isinstance(qid, bool):
                raise TypeError(f"question ids must be str or int, got {type(qid).__name__} {qid!r}")
            qi = len(self._qids)
            self._qindex[qid] = qi
            self._qids.append(qid)
            self._slots_of.append([])
        return qi

    def find(self, qid: QuestionId) -> int | None:
        return self._qindex.get(qid)

    def question_id(self, qi: int) -> QuestionId:
        return self._qids[qi]

    def slots(self, qi: int) -> list[int]:
        """The question's slots, oldest first (the table's own list: do not mutate)."""
        return self._slots_of[qi]

    def slots_of(self, qid: QuestionId) -> list[int]:
        qi = self._qindex.get(qid)
        return [] if qi is None else self._slots_of[qi]

    # ------------------------------------------------------------------ allocation
    def reserve_entry_ids(self, n: int) -> int:
        """Consume ``n`` entry ids; returns the first."""
        first = self.next_entry_id
        self.next_entry_id += n
        return first

    def allocate(self, batch: EntryBatch, lengths: np.ndarray | None = None) -> np.ndarray:
        """Give each entry of ``batch`` a slot and write its metadata; returns the slots (in batch order).
        ``lengths``: ``batch.lengths()``, when the caller has it."""
        n = len(batch)
        reuse = self._free[-n:][::-1] if n else []  # the free stack, popped in order
        del self._free[len(self._free) - len(reuse) :]
        fresh = n - len(reuse)
        if self._n_slots + fresh > self.capacity:
            self._grow(self._n_slots + fresh)
        slots = np.array(reuse + list(range(self._n_slots, self._n_slots + fresh)), dtype=np.int64)
        self._n_slots += fresh
        if lengths is None:
            lengths = batch.lengths()
        c = self.columns
        c["entry_id"][slots] = batch.entry_ids
        c["question"][slots] = batch.questions
        c["length"][slots] = lengths
        c["reward"][slots] = batch.rewards
        c["step"][slots] = batch.steps
        if self._masked is not None or any(batch.masked):
            self._masked_column()[slots] = batch.masked
        for qi, s in zip(batch.questions, slots.tolist(), strict=True):
            self._slots_of[qi].append(s)
        self.num_entries += n
        self.total_tokens += int(lengths.sum())
        self.total_masked += int(sum(batch.masked))
        self._log_append(slots, np.asarray(batch.entry_ids, dtype=np.int64))
        return slots

    def _grow(self, needed: int) -> None:
        cap = self.capacity
        new_cap = max(1024, 2 * cap, needed)
        for name, arr in self.columns.items():
            grown = np.zeros(new_cap, dtype=arr.dtype)
            grown[:cap] = arr
            self.columns[name] = grown
        self.columns["entry_id"][cap:] = -1
        if self._masked is not None:
            self._masked = np.concatenate([self._masked, np.zeros(new_cap - self._masked.shape[0], dtype=np.int32)])

    def release(self, slot: int) -> int:
        """Free a slot (the caller has taken it off its question's list); returns its token count."""
        n = int(self.columns["length"][slot])
        self.columns["entry_id"][slot] = -1
        self._free.append(slot)
        self.num_entries -= 1
        self.total_tokens -= n
        if self._masked is not None:
            self.total_masked -= int(self._masked[slot])
            self._masked[slot] = 0
        if self._log_on:
            self._log_dead += 1
            if self._log_dead > self.num_entries and self._log_dead > 1024:
                self._log_compact()
        return n

    # ------------------------------------------------------------------ insertion-order log
    def _log_append(self, slots: np.ndarray, eids: np.ndarray) -> None:
        if not self._log_on:
            return
        end = self._log_len + len(slots)
        if end > self._log_slot.shape[0]:
            cap = max(2 * self._log_slot.shape[0], end)
            self._log_slot = np.resize(self._log_slot, cap)
            self._log_eid = np.resize(self._log_eid, cap)
        self._log_slot[self._log_len : end] = slots
        self._log_eid[self._log_len : end] = eids
        self._log_len = end

    def _log_alive(self, start: int, stop: int) -> tuple[np.ndarray, np.ndarray]:
        """(slots, alive mask) of the log items in [start, stop)."""
        s = self._log_slot[start:stop]
        return s, self.columns["entry_id"][s] == self._log_eid[start:stop]

    def _log_compact(self) -> None:
        s, alive = self._log_alive(0, self._log_len)
        live = s[alive]
        self._log_slot[: len(live)] = live
        self._log_eid[: len(live)] = self.columns["entry_id"][live]
        self._log_len, self._log_head, self._log_dead = len(live), 0, 0

    def oldest(self, tokens: int) -> list[int]:
        """The fewest oldest live entries (by entry id) holding at least ``tokens`` tokens, oldest first.

        Reads the log from its head in growing windows, so the cost follows the entries returned, not the pool.
        """
        if not self._log_on:
            self._log_on = True
            order = self.slots_in_entry_order()
            self._log_append(order, self.columns["entry_id"][order])
        out: list[int] = []
        start, window = self._log_head, 4096
        while tokens > 0 and start < self._log_len:
            stop = min(self._log_len, start + window)
            s, alive = self._log_alive(start, stop)
            if start == self._log_head:  # skip the dead items at the head for good
                first = np.flatnonzero(alive)
                self._log_head = start + (int(first[0]) if len(first) else len(s))
            live = s[alive]
            cum = np.cumsum(self.columns["length"][live].astype(np.int64))
            if len(live) and cum[-1] >= tokens:
                return out + live[: int(np.searchsorted(cum, tokens, side="left")) + 1].tolist()
            out += live.tolist()
            tokens -= int(cum[-1]) if len(live) else 0
            start, window = stop, 2 * window
        return out

    # ------------------------------------------------------------------ per-question lists
    def drop_front(self, qi: int, n: int) -> list[int]:
        """Take the question's ``n`` oldest slots off its list (the caller frees them)."""
        slots = self._slots_of[qi]
        out = slots[:n]
        del slots[:n]
        return out

    def drop(self, qi: int, slot: int) -> None:
        self._slots_of[qi].remove(slot)

    def drop_all(self, qi: int) -> list[int]:
        out, self._slots_of[qi] = self._slots_of[qi], []
        return out

    # ------------------------------------------------------------------ masked tokens (in memory only)
    def _masked_column(self) -> np.ndarray:
        if self._masked is None:
            self._masked = np.zeros(self.capacity, dtype=np.int32)
        return self._masked

    def masked(self, slot: int) -> int:
        """Masked tokens of the entry in ``slot`` (0: every token is the model's)."""
        return 0 if self._masked is None else int(self._masked[slot])

    def set_masked(self, slots: np.ndarray, counts: np.ndarray) -> None:
        """The masked-token counts of ``slots`` (after a load: the token storage counts them in its file)."""
        counts = np.asarray(counts, dtype=np.int64)
        if self._masked is None and not counts.any():
            return
        column = self._masked_column()
        self.total_masked += int(counts.sum()) - int(column[slots].sum())
        column[slots] = counts

    def nbytes(self) -> int:
        columns = sum(a.nbytes for a in self.columns.values())
        if self._masked is not None:
            columns += self._masked.nbytes
        return columns + self._log_slot.nbytes + self._log_eid.nbytes

    # ------------------------------------------------------------------ state
    def slots_in_entry_order(self) -> np.ndarray:
        """Live slots sorted by entry id (the order of the saved files)."""
        eid = self.columns["entry_id"][: self._n_slots]
        live = np.flatnonzero(eid >= 0)
        return live[np.argsort(eid[live], kind="stable")]

    def state_dict(self) -> dict[str, Any]:
        """``questions`` (a compact table: those with live entries), ``next_entry_id``, ``num_entries``,
        ``total_tokens`` (JSON-able) and ``columns`` (arrays, entry-id order, question = index into the table)."""
        order = self.slots_in_entry_order()
        qcol = self.columns["question"][order]
        used_q, new_q = np.unique(qcol, return_inverse=True)
        cols = {name: self.columns[name][order].copy() for name in COLUMNS}
        cols["question"] = new_q.astype(np.int32).reshape(-1)
        return {
            "questions": [self._qids[int(q)] for q in used_q],
            "next_entry_id": self.next_entry_id,
            "num_entries": self.num_entries,
            "total_tokens": self.total_tokens,
            "columns": cols,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`: entries take slots 0..n-1 in entry-id order. ValueError (naming the
        problem) for a table that does not hold together."""
        cols = state["columns"]
        n = int(cols["entry_id"].shape[0])
        if any(cols[name].shape != (n,) for name in COLUMNS):
            raise ValueError("the entry columns differ in length")
        lengths = cols["length"].astype(np.int64)
        if np.any(lengths <= 0):
            raise ValueError("saved entries hold a non-positive length")
        if n and np.any(np.diff(cols["entry_id"]) <= 0):
            raise ValueError("saved entry ids are not strictly increasing")
        questions = list(state["questions"])
        qcol = cols["question"]
        if n and (qcol.min() < 0 or qcol.max() >= len(questions)):
            raise ValueError("saved entries refer to a question index outside the question table")
        self.clear()
        for q in questions:
            if q in self._qindex:
                raise ValueError(f"question {q!r} appears twice in the question table")
            self.question_index(q)
        self._grow(max(1024, n))
        for name in COLUMNS:
            self.columns[name][:n] = cols[name]
        self._n_slots = n
        for slot, qi in enumerate(qcol.tolist()):
            self._slots_of[qi].append(slot)
        self.num_entries = n
        self.total_tokens = int(lengths.sum())
        self.next_entry_id = int(state["next_entry_id"])
        if n and self.next_entry_id <= int(cols["entry_id"][-1]):
            raise ValueError(f"next entry id {self.next_entry_id} is not above the saved ids")
        for key in ("num_entries", "total_tokens"):
            if key in state and int(state[key]) != getattr(self, key):
                raise ValueError(
                    f"saved pool claims {state['num_entries']} entries / {state['total_tokens']} tokens, "
                    f"the files hold {self.num_entries} / {self.total_tokens}"
                )

    # ------------------------------------------------------------------ file
    def dump(self, path: pathlib.Path) -> tuple[dict[str, Any], dict[str, Any]]:
        """Write the columns to ``path`` (Arrow IPC, one batch); returns (the JSON part of :meth:`state_dict`,
        the file's record ``{"bytes", "crc32", "rows"}``)."""
        state = self.state_dict()
        cols = state.pop("columns")
        batch = pa.record_batch([pa.array(cols[name]) for name in COLUMNS], schema=ENTRY_SCHEMA)
        record: dict[str, Any] = files.write_arrow(path, ENTRY_SCHEMA, iter([batch]))
        record["rows"] = int(cols["entry_id"].shape[0])
        return state, record

    def load(self, path: pathlib.Path, state: dict[str, Any], record: Any) -> None:
        """Restore from a file :meth:`dump` wrote and its JSON part ``state``; PoolCheckpointError naming ``path``
        for a damaged file, ValueError for a table that does not fit the header."""
        source, buf = files.map_verified(path, record)
        with source:
            reader = files.open_ipc(path, buf, ENTRY_SCHEMA)
            try:
                table = reader.read_all()
                cols = {name: table.column(name).to_numpy().copy() for name in COLUMNS}
            except (pa.ArrowException, OSError, ValueError) as e:
                raise files.PoolCheckpointError(f"{path}: unreadable: {e}") from e
            del table, reader, buf
        rows = record.get("rows")
        if cols["entry_id"].shape[0] != rows:
            raise files.PoolCheckpointError(
                f"{path}: holds {cols['entry_id'].shape[0]} rows, the header records {rows}"
            )
        self.load_state_dict({**state, "columns": cols})
