"""The ``arena`` token storage (default): token ids and log-probs in big chunks, per slot (chunk, offset, length).

An entry lives inside one chunk of ``chunk_tokens`` tokens (4M: 16 MB ids + 16 MB log-probs). New entries are
appended at the open chunk's tail, a whole collect call in one copy per chunk it lands in. Freeing leaves a hole;
a chunk is compacted in place once its holes exceed 1/32 of its capacity, and released once empty, so the memory
held stays within a few % of the live tokens and freed memory goes back to the OS.

Chunk memory: a chunk is an anonymous memory map that the kernel fills in when it is created (``MAP_POPULATE``,
Linux), not an ``np.empty`` array faulted in page by page as collect calls copy into it. Writing fresh memory is
most of what a collect call costs (~6 MB per step at the paper's scale), and on the development VM both
alternatives cost more: page-by-page faults about 1.6x as much, and ``np.empty`` (which asks for transparent huge
pages on arrays of 4 MB or more) is fast while free huge pages last but stalls on memory compaction once they run
out, under the kernel's common ``defrag=madvise`` setting (``benchmarks/pool_scale.py``, docs/experience.md).
The price of populating at creation is that the collect call that opens a chunk pays for all of it.
"""

from __future__ import annotations

import mmap
from bisect import bisect_right
from collections.abc import Callable, Sequence
from itertools import accumulate
from operator import is_

import numpy as np

from exgrpo.experience.storage import DEFAULT_CHUNK_TOKENS, STAGE_BLOCK_TOKENS, TokenStorage

__all__ = ["ArenaStorage", "fresh_array"]

#: A chunk is compacted once its dead tokens exceed capacity / COMPACT_DIVISOR (keeps held memory tight).
COMPACT_DIVISOR = 32
#: Private anonymous map, populated at creation where the platform has MAP_POPULATE (Linux); 0: platform default.
_MAP_FLAGS = (
    mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | getattr(mmap, "MAP_POPULATE", 0) if hasattr(mmap, "MAP_ANONYMOUS") else 0
)


def fresh_array(n: int, dtype: type) -> np.ndarray:
    """``n`` elements (n >= 1) of new, writable, zero-filled memory in its own anonymous map, faulted in at once
    where the platform can (``MAP_POPULATE``) and without a huge-page request; unmapped with its last view."""
    nbytes = n * np.dtype(dtype).itemsize
    buf = mmap.mmap(-1, nbytes, flags=_MAP_FLAGS) if _MAP_FLAGS else mmap.mmap(-1, nbytes)
    return np.frombuffer(buf, dtype=dtype)


class ArenaStorage(TokenStorage):
    """Chunked columnar arena: per chunk one int32 and one float32 array; per slot (chunk, offset, length)."""

    layout = "arena"

    def __init__(self, chunk_tokens: int = DEFAULT_CHUNK_TOKENS):
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
        self._open = -1  # chunk tried first for the next entry
        self.unstage()

    def resize(self, capacity: int) -> None:
        old = self._chunk.shape[0]
        if capacity <= old:
            return
        self._chunk = np.concatenate([self._chunk, np.full(capacity - old, -1, dtype=np.int32)])
        self._offset = np.concatenate([self._offset, np.zeros(capacity - old, dtype=np.int64)])
        self._length = np.concatenate([self._length, np.zeros(capacity - old, dtype=np.int32)])

    # ------------------------------------------------------------------ chunks
    def chunk_usage(self) -> list[tuple[int, int, int]]:
        """Per chunk index: (capacity, used = tail pointer, live tokens), a released chunk as (0, 0, 0); for tests
        and diagnostics."""
        return [
            (0 if a is None else a.shape[0], u, v) for a, u, v in zip(self._ids, self._used, self._live, strict=True)
        ]

    def _room(self, c: int) -> int:
        arr = self._ids[c]
        return -1 if arr is None else arr.shape[0] - self._used[c]

    def _new_chunk(self, min_tokens: int) -> int:
        cap = max(self.chunk_tokens, min_tokens)
        ids, lps = fresh_array(cap, np.int32), fresh_array(cap, np.float32)
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
        """The open chunk if ``n`` tokens fit at its tail, else the first chunk where they do (tails freed by
        compaction), else a new chunk; it becomes the open chunk."""
        if self._open >= 0 and self._room(self._open) >= n:
            return self._open
        c = next((c for c in range(len(self._ids)) if self._room(c) >= n), None)
        self._open = self._new_chunk(n) if c is None else c
        return self._open

    # ------------------------------------------------------------------ primitives
    def put_many(
        self, slots: Sequence[int], ids: Sequence[np.ndarray], lps: Sequence[np.ndarray], lengths: np.ndarray
    ) -> None:
        # Entry by entry the placement is: the open chunk if it fits, else first fit. Consecutive entries that
        # land in the same chunk are contiguous there, so each such run is one concatenation into the chunk.
        slots = np.asarray(slots, dtype=np.int64)
        lengths = np.asarray(lengths, dtype=np.int64)
        ends = np.cumsum(lengths)
        i, m = 0, len(slots)
        while i < m:
            c = self._chunk_with_room(int(lengths[i]))
            base = int(ends[i - 1]) if i else 0
            j = int(np.searchsorted(ends, base + self._room(c), side="right"))  # entries i..j-1 fit
            off, total = self._used[c], int(ends[j - 1]) - base
            dst_ids, dst_lps = self._ids[c][off : off + total], self._lps[c][off : off + total]  # type: ignore[index]
            staged = self._staged_in_place(c, off, lps, i, j)
            if j - i == 1:
                dst_ids[:] = ids[i]
                if not staged:
                    dst_lps[:] = lps[i]
            else:
                np.concatenate(ids[i:j], out=dst_ids)
                if not staged:
                    np.concatenate(lps[i:j], out=dst_lps)
            run = slots[i:j]
            self._chunk[run] = c
            self._offset[run] = off + (ends[i:j] - lengths[i:j] - base)
            self._length[run] = lengths[i:j]
            self._used[c] += total
            self._live[c] += total
            i = j

    # ------------------------------------------------------------------ staging
    def stage(
        self,
        log_probs: Sequence[np.ndarray],
        lengths: np.ndarray | None = None,
        check: Callable[[int, int, np.ndarray], Sequence[np.ndarray] | None] | None = None,
    ) -> np.ndarray | None:
        # Where put_many puts entries that fit at the open chunk's tail: there, one after the other; the first ones
        # that fit, when not all do (put_many opens or finds another chunk for the others).
        self.unstage()
        c = self._open
        sizes = list(map(len, log_probs)) if lengths is None else lengths.tolist()
        if c < 0 or not sizes:
            return None
        room = self._room(c)
        ends = list(accumulate(sizes))
        n = bisect_right(ends, room)  # the entries that fit
        if not n or not ends[n - 1]:
            return None
        log_probs, sizes, total = log_probs[:n], sizes[:n], ends[n - 1]
        off = self._used[c]
        lps = self._lps[c]
        view = lps[off : off + total]  # type: ignore[index]
        staged = list(log_probs)
        if check is None:
            np.concatenate(log_probs, out=view)
        else:  # block by block, each checked right after it is written (while the cache holds it)
            first = 0
            while first < n:
                base = ends[first - 1] if first else 0
                stop = max(first + 1, bisect_right(ends, base + STAGE_BLOCK_TOKENS, first, n))
                written = view[base : ends[stop - 1]]
                np.concatenate(log_probs[first:stop], out=written)
                rewritten = check(first, stop, written)
                if rewritten is not None:  # what put_many will be handed for them: views of what is written
                    staged[first:stop] = rewritten
                first = stop
        self._staged = (lps, staged, list(accumulate(sizes[:-1], initial=off)))
        self._staged_next = 0
        return view

    def unstage(self) -> None:
        self._staged: tuple[np.ndarray, list[np.ndarray], list[int]] | None = None
        self._staged_next = 0

    def _staged_in_place(self, c: int, off: int, lps: Sequence[np.ndarray], i: int, j: int) -> bool:
        """Whether entries i..j-1 of a put_many, placed at chunk ``c`` from ``off`` on, are the next staged ones:
        then their log-probs are there already. Any other placement forgets the staging (it may write over it)."""
        if self._staged is None:
            return False
        chunk, arrays, offsets = self._staged
        k = self._staged_next
        if (
            self._lps[c] is chunk
            and k + (j - i) <= len(arrays)
            and offsets[k] == off
            and all(map(is_, lps[i:j], arrays[k : k + (j - i)]))
        ):
            self._staged_next = k + (j - i)
            return True
        self.unstage()
        return False

    def view(self, slot: int) -> tuple[np.ndarray, np.ndarray]:
        c = int(self._chunk[slot])
        off = int(self._offset[slot])
        end = off + int(self._length[slot])
        return self._ids[c][off:end], self._lps[c][off:end]  # type: ignore[index]

    def lengths(self, slots: np.ndarray) -> np.ndarray:
        return self._length[slots].astype(np.int64)

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
        elif self._used[c] - self._live[c] > self._ids[c].shape[0] // COMPACT_DIVISOR:  # type: ignore[union-attr]
            self._compact(c)

    def _compact(self, c: int) -> None:
        """Slide the chunk's live entries down over the holes (in place; offsets rewritten). Entries that were
        contiguous move together, so the copies are one per run between holes, not one per entry."""
        slots = np.flatnonzero(self._chunk == c)
        slots = slots[np.argsort(self._offset[slots], kind="stable")]
        off = self._offset[slots]
        n = self._length[slots].astype(np.int64)
        new_off = np.zeros_like(off)
        np.cumsum(n[:-1], out=new_off[1:])
        run_starts = np.flatnonzero(np.r_[True, off[1:] != off[:-1] + n[:-1]])
        run_ends = np.r_[run_starts[1:], len(slots)]
        ids, lps = self._ids[c], self._lps[c]
        for a, b in zip(run_starts.tolist(), run_ends.tolist(), strict=True):
            src, dst = int(off[a]), int(new_off[a])
            if src != dst:  # dst < src: numpy copies overlapping ranges correctly
                size = int(new_off[b - 1] + n[b - 1]) - dst
                ids[dst : dst + size] = ids[src : src + size]  # type: ignore[index]
                lps[dst : dst + size] = lps[src : src + size]  # type: ignore[index]
        self._offset[slots] = new_off
        self._used[c] = int(new_off[-1] + n[-1]) if len(slots) else 0

    def live_slots(self) -> np.ndarray:
        return np.flatnonzero(self._chunk >= 0)

    def nbytes(self) -> int:
        data = sum(a.nbytes for a in self._ids if a is not None) + sum(a.nbytes for a in self._lps if a is not None)
        return data + self._chunk.nbytes + self._offset.nbytes + self._length.nbytes

    def load_batch(self, slots: np.ndarray, lengths: np.ndarray, ids: np.ndarray, lps: np.ndarray) -> None:
        # One saved batch becomes one chunk (batches are cut at <= chunk_tokens on save when possible).
        self.unstage()
        total = int(lengths.sum())
        c = self._new_chunk(total)
        self._ids[c][:total] = ids  # type: ignore[index]
        self._lps[c][:total] = lps  # type: ignore[index]
        self._used[c] = self._live[c] = total
        offsets = np.zeros(len(slots), dtype=np.int64)
        np.cumsum(lengths[:-1], out=offsets[1:])
        self._chunk[slots], self._offset[slots], self._length[slots] = c, offsets, lengths
        self._open = c
