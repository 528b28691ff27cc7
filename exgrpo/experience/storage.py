"""Token storage: the bytes of the pool, i.e. each stored trajectory's response token ids and behaviour log-probs.

Storage is separate from bookkeeping, like torchrl's storage / writer / sampler split: token ids (int32,
vocabularies over 65k need 32 bits) and behaviour log-probs (float32, the importance ratio needs their precision;
NaN on the tokens a trajectory's loss mask marks as not the model's, ``exgrpo.experience.masks``) live here,
addressed by the *slot* the pool's entry table hands out; everything else about an entry (its id, question, reward,
step) lives in :class:`~exgrpo.experience.entries.EntryTable`. Two layouts share this interface
and one file format, so a pool saved with one loads into the other:

* ``arena`` (default, :class:`~exgrpo.experience.arena.ArenaStorage`): big chunks of ``chunk_tokens`` tokens;
* ``per_entry`` (:class:`PerEntryStorage`): one small numpy array pair per trajectory.

A storage owns its file, ``tokens.arrow``: :meth:`TokenStorage.dump` writes the tokens of the given slots in the
given order as Arrow record batches of at most ``batch_tokens`` tokens (never splitting an entry), and
:meth:`TokenStorage.load` reads them back batch by batch, each batch copied once out of the memory map. The file's
record in the header carries ``loss_mask`` (the encoding and the count of masked tokens) when the file holds masked
tokens, and only then; a load counts them again and refuses a file whose count differs.
"""

from __future__ import annotations

import abc
import pathlib
import sys
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np
import pyarrow as pa

from exgrpo.experience import files, masks

__all__ = [
    "DEFAULT_CHUNK_TOKENS",
    "LOSS_MASK_KEY",
    "STAGE_BLOCK_TOKENS",
    "TOKEN_SCHEMA",
    "PerEntryStorage",
    "TokenStorage",
    "batch_ranges",
    "masked_per_entry",
    "read_token_batches",
]

TOKEN_SCHEMA = pa.schema([("token_ids", pa.int32()), ("behaviour_log_probs", pa.float32())])
#: Tokens per arena chunk, and per record batch of ``tokens.arrow`` (4M tokens: 16 MB ids + 16 MB log-probs).
DEFAULT_CHUNK_TOKENS = 1 << 22
#: Tokens per block of :meth:`TokenStorage.stage` with a check (1 MB of log-probs: a core's L2 cache on the development
#: machine; fewer, larger blocks measured faster than 256 KB ones, benchmarks/pool_scale.py).
STAGE_BLOCK_TOKENS = 1 << 18
#: the token file's record key for its loss mask: {"encoding": masks.ENCODING, "masked_tokens": n}, when n > 0
LOSS_MASK_KEY = "loss_mask"


def masked_per_entry(lps: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """Per entry of concatenated stored log-probs (``lengths`` tokens each): its masked tokens (NaN log-probs)."""
    nan = np.isnan(lps)
    if not len(lengths) or not nan.any():
        return np.zeros(len(lengths), dtype=np.int64)
    starts = np.zeros(len(lengths), dtype=np.int64)
    np.cumsum(lengths[:-1], out=starts[1:])
    return np.add.reduceat(nan.astype(np.int64), starts)  # every entry holds >= 1 token


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

    # ------------------------------------------------------------------ staging (optional)
    def stage(
        self,
        log_probs: Sequence[np.ndarray],
        lengths: np.ndarray | None = None,
        check: Callable[[int, int, np.ndarray], Sequence[np.ndarray] | None] | None = None,
    ) -> np.ndarray | None:
        """Write the log-probs of the entries that the next ``put_many`` calls are expected to store (non-empty
        arrays, in the order they will come; ``lengths``: theirs, when the caller has them) where those calls would
        put them, and return them there, concatenated (a view for the caller to read before the storage changes);
        the layout may stage a first part of them only (the view says how many tokens), and None where it stages
        none (the default). ``check(first, stop, written)``, when given, is called after each block of entries
        first..stop-1 is written (``written``: their log-probs there), blocks of about :data:`STAGE_BLOCK_TOKENS`
        tokens, so that the caller reads them while the cache holds them. The check may rewrite ``written`` in
        place; it then returns the arrays the next ``put_many`` calls will be handed for those entries instead of
        the ones given (views of ``written``: what it holds is what they store), else None.

        Nothing observable changes: the place is free space. ``put_many`` skips the copy of log-probs it finds
        staged in place (the same arrays, in the same order, where it puts them) and copies everything else as
        always; :meth:`unstage` ends the staging. A collect call stages its members to store so that it checks
        their log-probs, and encodes the loss masks of the masked ones, where it has just written them
        (``exgrpo.experience.masks.prepare_many``) instead of reading and writing them again."""
        return None

    def unstage(self) -> None:
        """Forget what :meth:`stage` wrote."""
        return None

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

    def load_state_dict(self, state: dict[str, Any]) -> np.ndarray:
        """Restore :meth:`state_dict` (of either layout); ValueError when the lengths do not cover the tokens.
        Returns each slot's masked-token count (in ``state["slots"]`` order)."""
        slots = np.asarray(state["slots"], dtype=np.int64)
        lengths = np.asarray(state["lengths"], dtype=np.int64)
        ids, lps = np.asarray(state["token_ids"]), np.asarray(state["behaviour_log_probs"])
        if lengths.shape != slots.shape or int(lengths.sum()) != ids.shape[0] or ids.shape != lps.shape:
            raise ValueError(
                f"token storage state: {len(slots)} slots of {int(lengths.sum())} tokens, {ids.shape[0]} token ids "
                f"and {lps.shape[0]} log-probs"
            )
        self.clear()
        lps = lps.astype(np.float32, copy=False)
        if len(slots):
            self.resize(int(slots.max()) + 1)
            self.load_batch(slots, lengths, ids.astype(np.int32, copy=False), lps)
        return masked_per_entry(lps, lengths)

    # ------------------------------------------------------------------ file
    def dump(
        self, path: pathlib.Path, slots: np.ndarray, *, batch_tokens: int = DEFAULT_CHUNK_TOKENS
    ) -> dict[str, Any]:
        """Write the tokens of ``slots`` (in that order) to ``path`` as Arrow IPC, streamed batch by batch.

        Returns the file's record for the header: ``{"bytes", "crc32", "batches": [{"rows": [start, stop],
        "tokens": n}, ...]}`` (rows index ``slots``), plus ``loss_mask`` (:data:`LOSS_MASK_KEY`) when some stored
        token is masked.
        """
        slots = np.asarray(slots, dtype=np.int64)
        ranges = batch_ranges(self.lengths(slots), batch_tokens)
        batch_info: list[dict[str, Any]] = []
        # One pair of batch buffers is reused for every batch: the writer has copied a batch out before the next
        # one is gathered, and fresh memory is what makes a multi-GB save slow.
        buf = (np.empty(batch_tokens, dtype=np.int32), np.empty(batch_tokens, dtype=np.float32))
        masked = 0

        def batches() -> Iterator[pa.RecordBatch]:
            nonlocal masked
            for start, stop in ranges:
                ids, lps = self.gather(slots[start:stop], out=buf)
                batch_info.append({"rows": [start, stop], "tokens": int(ids.shape[0])})
                masked += masks.count_masked(lps)
                yield pa.record_batch([pa.array(ids), pa.array(lps)], schema=TOKEN_SCHEMA)

        record: dict[str, Any] = files.write_arrow(path, TOKEN_SCHEMA, batches())
        record["batches"] = batch_info
        if masked:  # absent without masked tokens: the record (and the header) of such a pool is what it always was
            record[LOSS_MASK_KEY] = {"encoding": masks.ENCODING, "masked_tokens": masked}
        return record

    def load(self, path: pathlib.Path, record: Any, slots: np.ndarray, lengths: np.ndarray) -> np.ndarray:
        """Read a file :meth:`dump` wrote into ``slots`` (entry ``i`` of the file goes to ``slots[i]``, with
        ``lengths[i]`` tokens); returns each entry's masked-token count. Raises
        :class:`~exgrpo.experience.files.PoolCheckpointError` naming ``path`` for a damaged file or a loss mask
        encoding this code does not read, ValueError when the file does not fit ``record`` / ``lengths`` (a header
        problem, e.g. masked tokens the record does not announce)."""
        batches = _batch_table(record)
        expected_masked = _loss_mask_record(path, record)
        counts = np.zeros(len(slots), dtype=np.int64)
        source, buf = files.map_verified(path, record)
        with source:  # every batch is copied, so no view into the map outlives it
            reader = files.open_ipc(path, buf, TOKEN_SCHEMA)
            for start, stop, ids, lps in _read_batches(path, reader, batches, lengths):
                self.load_batch(slots[start:stop], lengths[start:stop], ids, lps)
                counts[start:stop] = masked_per_entry(lps, lengths[start:stop])
        found = int(counts.sum())
        if found != expected_masked:
            raise ValueError(
                f"{path.name} holds {found} tokens marked as not the model's (NaN behaviour log-probs), the header "
                f"records {expected_masked}"
                + ("" if expected_masked else " (no loss mask): a pool saved before loss masks existed holds none")
            )
        return counts


def _loss_mask_record(path: pathlib.Path, record: Any) -> int:
    """The masked-token count the file's record announces (0 without ``loss_mask``); PoolCheckpointError for an
    encoding this code does not read, ValueError for a malformed entry."""
    entry = record.get(LOSS_MASK_KEY) if isinstance(record, dict) else None
    if entry is None:
        return 0
    if not isinstance(entry, dict):
        raise ValueError(f"malformed {LOSS_MASK_KEY} record {entry!r}")
    if entry.get("encoding") != masks.ENCODING:
        raise files.PoolCheckpointError(
            f"{path}: loss mask encoding {entry.get('encoding')!r} is not one this code reads ({masks.ENCODING!r}): "
            "it was written by another version of the recipe; resume with that version"
        )
    n = entry.get("masked_tokens")
    if not isinstance(n, int) or isinstance(n, bool) or n < 0:
        raise ValueError(f"malformed {LOSS_MASK_KEY} record: masked_tokens={n!r}")
    return n


def read_token_batches(
    path: pathlib.Path, record: Any, lengths: np.ndarray, *, rows: np.ndarray | None = None
) -> Iterator[tuple[int, int, np.ndarray, np.ndarray]]:
    """Stream a file :meth:`TokenStorage.dump` wrote, one record batch at a time, without loading it whole: yields
    ``(start, stop, token_ids, behaviour_log_probs)``, the concatenated tokens of entries [start, stop) of the file
    (``lengths[i]`` tokens for entry ``i``). The whole file's CRC-32 is checked first by reading it through a small
    buffer (:func:`~exgrpo.experience.files.open_verified`), and every batch gets the checks of the load; memory
    holds one batch at a time (the arrays yielded are valid until the next one). ``rows``: only the batches holding
    one of these entries (ascending) are read. Errors as :meth:`TokenStorage.load`."""
    batches = _batch_table(record)
    wanted = None
    if rows is not None:
        rows = np.asarray(rows, dtype=np.int64)
        wanted = {i for i, (start, stop, _) in enumerate(batches) if np.any((rows >= start) & (rows < stop))}
    source = files.open_verified(path, record)
    with source:
        reader = files.open_ipc(path, source, TOKEN_SCHEMA)
        yield from _read_batches(path, reader, batches, lengths, wanted)


def _read_batches(
    path: pathlib.Path,
    reader: pa.ipc.RecordBatchFileReader,
    batches: list[tuple[int, int, int]],
    lengths: np.ndarray,
    wanted: set[int] | None = None,
) -> Iterator[tuple[int, int, np.ndarray, np.ndarray]]:
    """The batches of a token file with the checks every reader makes (the header's batch table against the file
    and against the entry lengths); ``wanted``: only these batch indices are read (the table is checked whole)."""
    if reader.num_record_batches != len(batches):
        raise files.PoolCheckpointError(
            f"{path}: holds {reader.num_record_batches} record batches, the header records {len(batches)}"
        )
    expected = 0
    for i, (start, stop, n_tokens) in enumerate(batches):
        if wanted is not None and i not in wanted:
            if start != expected:
                raise ValueError(f"token batches are not contiguous (rows {start} after {expected})")
            expected = stop
            continue
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
        yield start, stop, ids, lps
        expected = stop
    if expected != len(lengths):
        raise ValueError(f"token batches cover {expected} of {len(lengths)} entries")


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
