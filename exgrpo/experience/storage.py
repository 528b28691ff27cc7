"""Token storage: the bytes of the pool, i.e. each stored trajectory's response token ids and behaviour log-probs.

Storage is separate from bookkeeping, like torchrl's storage / writer / sampler split: token ids (int32,
vocabularies over 65k need 32 bits) and behaviour log-probs (float32, the importance ratio needs their precision)
live here, addressed by the *slot* the pool's entry table hands out; everything else about an entry (its id,
question, reward, step) lives in :class:`~exgrpo.experience.entries.EntryTable`. Two layouts share this interface
and one file format, so a pool saved with one loads into the other:

* ``arena`` (default, :class:`~exgrpo.experience.arena.ArenaStorage`): big chunks of ``chunk_tokens`` tokens;
* ``per_entry`` (:class:`PerEntryStorage`): one small numpy array pair per trajectory.

A storage owns its file, ``tokens.arrow``: :meth:`TokenStorage.dump` writes the tokens of the given slots in the
given order as Arrow record batches of at most ``batch_tokens`` tokens (never splitting an entry), and
:meth:`TokenStorage.load` reads them back batch by batch, each batch copied once out of the memory map.
"""

from __future__ import annotations

import abc
import pathlib
import sys
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import pyarrow as pa

from exgrpo.experience import files

__all__ = ["DEFAULT_CHUNK_TOKENS", "TOKEN_SCHEMA", "PerEntryStorage", "TokenStorage", "batch_ranges"]

TOKEN_SCHEMA = pa.schema([("token_ids", pa.int32()), ("behaviour_log_probs", pa.float32())])
#: Tokens per arena chunk, and per record batch of ``tokens.arrow`` (4M tokens: 16 MB ids + 16 MB log-probs).
DEFAULT_CHUNK_TOKENS = 1 << 22


def batch_ranges(lengths: np.ndarray, max_tokens: int) -> list[tuple[int, int]]:
    """Row ranges [start, stop) of consecutive entries holding <= ``max_tokens`` tokens each (an entry longer
    than that gets a range of its own)."""
    ranges: list[tuple[int, int]] = []
    start, acc = 0, 0
    for i, n in enumerate(lengths.tolist()):
        if acc and acc + n > max_tokens:
            ranges.append((start, i))
            start, acc = i, 0
        acc += n
    if acc:
        ranges.append((start, len(lengths)))
    return ranges


class TokenStorage(abc.ABC):
    """Token ids + behaviour log-probs addressed by entry slot. Subclasses implement the layout primitives
    (``clear`` ... ``load_batch``); gathering, ``state_dict`` and the file dump/load are shared."""

    layout = "abstract"

    # ------------------------------------------------------------------ layout primitives
    @abc.abstractmethod
    def clear(self) -> None:
        """Drop every slot's tokens and release the memory."""

    @abc.abstractmethod
    def resize(self, capacity: int) -> None:
        """Make slots [0, capacity) addressable (the entry table's capacity)."""

    @abc.abstractmethod
    def put_many(
        self, slots: Sequence[int], ids: Sequence[np.ndarray], lps: Sequence[np.ndarray], lengths: np.ndarray
    ) -> None:
        """Store entry ``slots[i]``'s tokens (``ids[i]`` int32, ``lps[i]`` float32, ``lengths[i]`` of each)."""

    @abc.abstractmethod
    def view(self, slot: int) -> tuple[np.ndarray, np.ndarray]:
        """The slot's (token ids, log-probs) without a copy; valid until the storage is next mutated."""

    @abc.abstractmethod
    def free(self, slot: int) -> None:
        """Release the slot's tokens (the slot may be reused by a later ``put_many``)."""

    @abc.abstractmethod
    def live_slots(self) -> np.ndarray:
        """The slots that hold tokens, ascending."""

    @abc.abstractmethod
    def nbytes(self) -> int:
        """Bytes held (capacity, not only live tokens)."""

    @abc.abstractmethod
    def load_batch(self, slots: np.ndarray, lengths: np.ndarray, ids: np.ndarray, lps: np.ndarray) -> None:
        """Store the concatenated tokens of entries ``slots`` (``lengths`` each), copied out of ``ids`` / ``lps``."""

    # ------------------------------------------------------------------ shared
    def put(self, slot: int, ids: np.ndarray, lps: np.ndarray) -> None:
        self.put_many([slot], [ids], [lps], np.array([ids.shape[0]], dtype=np.int64))

    def lengths(self, slots: np.ndarray) -> np.ndarray:
        return np.fromiter((self.view(s)[0].shape[0] for s in slots.tolist()), dtype=np.int64, count=len(slots))

    def gather(
        self, slots: np.ndarray, out: tuple[np.ndarray, np.ndarray] | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        """The tokens of ``slots`` concatenated in that order; into the ``out`` buffers (reused) when they are
        large enough."""
        views = [self.view(s) for s in np.asarray(slots).tolist()]
        n = sum(v[0].shape[0] for v in views)
        if out is None or out[0].shape[0] < n:
            out = (np.empty(n, dtype=np.int32), np.empty(n, dtype=np.float32))
        ids, lps = out[0][:n], out[1][:n]
        if views:
            np.concatenate([v[0] for v in views], out=ids)
            np.concatenate([v[1] for v in views], out=lps)
        return ids, lps

    def state_dict(self) -> dict[str, Any]:
        """Everything held, in memory: the live slots (ascending), their lengths and their tokens concatenated."""
        slots = self.live_slots()
        ids, lps = self.gather(slots)
        return {
            "layout": self.layout,
            "slots": slots,
            "lengths": self.lengths(slots),
            "token_ids": ids,
            "behaviour_log_probs": lps,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` (of either layout); ValueError when the lengths do not cover the tokens."""
        slots = np.asarray(state["slots"], dtype=np.int64)
        lengths = np.asarray(state["lengths"], dtype=np.int64)
        ids, lps = np.asarray(state["token_ids"]), np.asarray(state["behaviour_log_probs"])
        if lengths.shape != slots.shape or int(lengths.sum()) != ids.shape[0] or ids.shape != lps.shape:
            raise ValueError(
                f"token storage state: {len(slots)} slots of {int(lengths.sum())} tokens, {ids.shape[0]} token ids "
                f"and {lps.shape[0]} log-probs"
            )
        self.clear()
        if len(slots):
            self.resize(int(slots.max()) + 1)
            self.load_batch(slots, lengths, ids.astype(np.int32, copy=False), lps.astype(np.float32, copy=False))

    # ------------------------------------------------------------------ file
    def dump(
        self, path: pathlib.Path, slots: np.ndarray, *, batch_tokens: int = DEFAULT_CHUNK_TOKENS
    ) -> dict[str, Any]:
        """Write the tokens of ``slots`` (in that order) to ``path`` as Arrow IPC, streamed batch by batch.

        Returns the file's record for the header: ``{"bytes", "crc32", "batches": [{"rows": [start, stop],
        "tokens": n}, ...]}`` (rows index ``slots``).
        """
        slots = np.asarray(slots, dtype=np.int64)
        ranges = batch_ranges(self.lengths(slots), batch_tokens)
        batch_info: list[dict[str, Any]] = []
        # One pair of batch buffers is reused for every batch: the writer has copied a batch out before the next
        # one is gathered, and fresh memory is what makes a multi-GB save slow.
        buf = (np.empty(batch_tokens, dtype=np.int32), np.empty(batch_tokens, dtype=np.float32))

        def batches() -> Iterator[pa.RecordBatch]:
            for start, stop in ranges:
                ids, lps = self.gather(slots[start:stop], out=buf)
                batch_info.append({"rows": [start, stop], "tokens": int(ids.shape[0])})
                yield pa.record_batch([pa.array(ids), pa.array(lps)], schema=TOKEN_SCHEMA)

        record: dict[str, Any] = files.write_arrow(path, TOKEN_SCHEMA, batches())
        record["batches"] = batch_info
        return record

    def load(self, path: pathlib.Path, record: Any, slots: np.ndarray, lengths: np.ndarray) -> None:
        """Read a file :meth:`dump` wrote into ``slots`` (entry ``i`` of the file goes to ``slots[i]``, with
        ``lengths[i]`` tokens). Raises :class:`~exgrpo.experience.files.PoolCheckpointError` naming ``path`` for a
        damaged file, ValueError when the file does not fit ``record`` / ``lengths`` (a header problem)."""
        batches = _batch_table(record)
        source, buf = files.map_verified(path, record)
        with source:  # every batch is copied, so no view into the map outlives it
            reader = files.open_ipc(path, buf, TOKEN_SCHEMA)
            if reader.num_record_batches != len(batches):
                raise files.PoolCheckpointError(
                    f"{path}: holds {reader.num_record_batches} record batches, the header records {len(batches)}"
                )
            expected = 0
            for i, (start, stop, n_tokens) in enumerate(batches):
                try:
                    rb = reader.get_batch(i)
                    ids = rb.column(0).to_numpy(zero_copy_only=True)
                    lps = rb.column(1).to_numpy(zero_copy_only=True)
                except (pa.ArrowException, OSError, ValueError) as e:
                    raise files.PoolCheckpointError(f"{path}: record batch {i} unreadable: {e}") from e
                if ids.shape[0] != n_tokens:
                    raise files.PoolCheckpointError(
                        f"{path}: record batch {i} holds {ids.shape[0]} tokens, the header records {n_tokens}"
                    )
                if start != expected:
                    raise ValueError(f"token batches are not contiguous (rows {start} after {expected})")
                seg = lengths[start:stop]
                if int(seg.sum()) != ids.shape[0] or ids.shape != lps.shape:
                    raise ValueError(
                        f"token batch of rows [{start}, {stop}) holds {ids.shape[0]} tokens, "
                        f"the entry lengths say {int(seg.sum())}"
                    )
                self.load_batch(slots[start:stop], seg, ids, lps)
                expected = stop
            if expected != len(slots):
                raise ValueError(f"token batches cover {expected} of {len(slots)} entries")


def _batch_table(record: Any) -> list[tuple[int, int, int]]:
    try:
        return [(int(b["rows"][0]), int(b["rows"][1]), int(b["tokens"])) for b in record["batches"]]
    except (KeyError, TypeError, ValueError, IndexError) as e:
        raise ValueError(f"malformed table of token batches: {type(e).__name__}: {e}") from e


class PerEntryStorage(TokenStorage):
    """One owned numpy array pair per entry slot (simple; ~250 bytes of object overhead per trajectory)."""

    layout = "per_entry"
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

    def put_many(
        self, slots: Sequence[int], ids: Sequence[np.ndarray], lps: Sequence[np.ndarray], lengths: np.ndarray
    ) -> None:
        for slot, a, b in zip(np.asarray(slots).tolist(), ids, lps, strict=True):
            a, b = a.copy(), b.copy()
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

    def live_slots(self) -> np.ndarray:
        return np.array([s for s, a in enumerate(self._ids) if a is not None], dtype=np.int64)

    def nbytes(self) -> int:
        # Object headers counted; allocator overhead is not (the benchmark reports RSS as well).
        return self._data_bytes + self._arrays * self._ARRAY_OVERHEAD + 16 * len(self._ids)

    def load_batch(self, slots: np.ndarray, lengths: np.ndarray, ids: np.ndarray, lps: np.ndarray) -> None:
        ends = np.cumsum(lengths).tolist()
        bounds = list(zip([0, *ends[:-1]], ends, strict=True))
        self.put_many(slots, [ids[a:b] for a, b in bounds], [lps[a:b] for a, b in bounds], lengths)
