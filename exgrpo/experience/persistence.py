"""Save and load the whole experience state to a directory, without pickle (ALGORITHM.md §2).

Layout of a saved directory (e.g. ``global_step_N/exgrpo/`` next to verl's own checkpoint)::

    header.json     format tag, schema_version, pool meta (question table, bucket member lists in draw order,
                    retired set, counters), sampler / selector / schedule state (RNG states included), the
                    caller's ``extra`` dict, and per file its size and CRC-32 checksums
    entries.arrow   Arrow IPC file, one row per stored trajectory in entry-id order:
                    entry_id, question (index into the header's table), length, reward, step
    tokens.arrow    Arrow IPC file, record batches of (token_ids int32, behaviour_log_probs float32);
                    each batch holds the tokens of a contiguous run of entries (<= 4M tokens)

Writes go to a temporary sibling directory which is then renamed over the target, so a crash mid-save leaves
the previous checkpoint intact. Loading checks sizes, Arrow structure and CRC-32 of every batch; a truncated or
corrupt file raises :class:`PoolCheckpointError` naming the file, never a silently empty pool.
The same format serves both token-store layouts (arena and per-entry).
"""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import tempfile
import uuid
import zlib
from collections.abc import Iterator
from typing import Any

import numpy as np
import pyarrow as pa

from exgrpo.experience.pool import _COLUMNS, _DEFAULT_CHUNK_TOKENS, ExperiencePool

__all__ = [
    "FORMAT",
    "SCHEMA_VERSION",
    "PoolCheckpointError",
    "experience_exists",
    "load_experience",
    "save_experience",
]

FORMAT = "exgrpo-experience"
SCHEMA_VERSION = 1
HEADER = "header.json"
ENTRIES = "entries.arrow"
TOKENS = "tokens.arrow"

_TOKEN_SCHEMA = pa.schema([("token_ids", pa.int32()), ("behaviour_log_probs", pa.float32())])
_ENTRY_SCHEMA = pa.schema([(name, pa.from_numpy_dtype(np.dtype(dt))) for name, dt in _COLUMNS.items()])


class PoolCheckpointError(RuntimeError):
    """A saved experience directory is missing, truncated, corrupt or incompatible; names the file."""


def experience_exists(directory: str | os.PathLike[str]) -> bool:
    """Whether ``directory`` holds a saved experience state (its header is present)."""
    return (pathlib.Path(directory) / HEADER).is_file()


def _crc(*arrays: np.ndarray, value: int = 0) -> int:
    for a in arrays:
        value = zlib.crc32(memoryview(np.ascontiguousarray(a)).cast("B"), value)
    return value


def _fsync_file(path: pathlib.Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def save_experience(
    directory: str | os.PathLike[str],
    *,
    pool: ExperiencePool,
    sampler: Any | None = None,
    selector: Any | None = None,
    schedule: Any | None = None,
    extra: dict[str, Any] | None = None,
    batch_tokens: int = _DEFAULT_CHUNK_TOKENS,
    fsync: bool = True,
) -> pathlib.Path:
    """Write the pool and the given components' ``state_dict()`` atomically to ``directory``.

    ``extra``: a JSON-serialisable dict of the caller's own state (e.g. the trainer's leftover fresh prompt
    indices), returned by :func:`load_experience`. ``fsync``: flush the files to disk before the rename.
    """
    target = pathlib.Path(directory)
    header: dict[str, Any] = {"format": FORMAT, "schema_version": SCHEMA_VERSION}
    for name, comp in (("sampler", sampler), ("selector", selector), ("schedule", schedule)):
        header[name] = None if comp is None else comp.state_dict()
    header["extra"] = {} if extra is None else extra
    try:  # fail before writing anything
        json.dumps(header, allow_nan=False)
    except (TypeError, ValueError) as e:
        raise ValueError(f"experience state (extra or component state) is not JSON-serialisable: {e}") from e

    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = pathlib.Path(tempfile.mkdtemp(prefix=f".{target.name}.tmp-", dir=target.parent))
    try:
        meta, entries, ranges, order = pool._export(batch_tokens)
        header["pool"] = meta
        # entries.arrow
        cols = [pa.array(entries[name]) for name in _COLUMNS]
        with pa.OSFile(str(tmp / ENTRIES), "wb") as f, pa.ipc.new_file(f, _ENTRY_SCHEMA) as w:
            w.write_batch(pa.record_batch(cols, schema=_ENTRY_SCHEMA))
        entries_info = {"rows": int(entries["entry_id"].shape[0]), "crc32": _crc(*(entries[n] for n in _COLUMNS))}
        # tokens.arrow, streamed batch by batch (one batch of copies in memory at a time)
        # One pair of batch buffers is reused for every batch: the writer has copied a batch out before the
        # next one is gathered, and fresh memory is what makes a multi-GB save slow.
        batches = []
        buf = (np.empty(batch_tokens, dtype=np.int32), np.empty(batch_tokens, dtype=np.float32))
        with pa.OSFile(str(tmp / TOKENS), "wb") as f, pa.ipc.new_file(f, _TOKEN_SCHEMA) as w:
            for start, stop in ranges:
                ids, lps = pool._batch_tokens(order, start, stop, out=buf)
                w.write_batch(pa.record_batch([pa.array(ids), pa.array(lps)], schema=_TOKEN_SCHEMA))
                batches.append({"rows": [start, stop], "tokens": int(ids.shape[0]), "crc32": _crc(ids, lps)})
                del ids, lps
        del buf
        header["files"] = {
            ENTRIES: {"bytes": (tmp / ENTRIES).stat().st_size, **entries_info},
            TOKENS: {"bytes": (tmp / TOKENS).stat().st_size, "batches": batches},
        }
        (tmp / HEADER).write_text(json.dumps(header, allow_nan=False), encoding="utf-8")
        if fsync:
            for name in (ENTRIES, TOKENS, HEADER):
                _fsync_file(tmp / name)
        if target.exists():
            # A directory cannot be renamed over a non-empty one: move the old one aside first.
            old = target.parent / f".{target.name}.old-{uuid.uuid4().hex[:8]}"
            os.replace(target, old)
            os.replace(tmp, target)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, target)
        if fsync:
            _fsync_file(target.parent)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return target


def _read_header(path: pathlib.Path) -> dict[str, Any]:
    if not path.is_file():
        raise PoolCheckpointError(f"{path}: missing (not a saved experience directory, or an interrupted save)")
    try:
        header = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise PoolCheckpointError(f"{path}: unreadable or corrupt JSON header: {e}") from e
    if not isinstance(header, dict) or header.get("format") != FORMAT:
        raise PoolCheckpointError(f"{path}: not an ExGRPO experience header (format tag {FORMAT!r} missing)")
    version = header.get("schema_version")
    if version != SCHEMA_VERSION:
        raise PoolCheckpointError(
            f"{path}: schema_version {version!r} is not supported (this code reads {SCHEMA_VERSION})"
        )
    for key in ("pool", "files", "extra"):
        if key not in header:
            raise PoolCheckpointError(f"{path}: header lacks the {key!r} section")
    return header


def _open_arrow(
    path: pathlib.Path, expected_bytes: int, schema: pa.Schema
) -> tuple[pa.MemoryMappedFile, pa.ipc.RecordBatchFileReader]:
    """Memory-map and open an Arrow IPC file: batches are read zero-copy from the page cache and copied once,
    straight into the pool's own arrays (no intermediate buffers). The caller closes the map."""
    if not path.is_file():
        raise PoolCheckpointError(f"{path}: missing")
    size = path.stat().st_size
    if size != expected_bytes:
        raise PoolCheckpointError(
            f"{path}: truncated or modified: the header records {expected_bytes} bytes, found {size}"
        )
    source = None
    try:
        source = pa.memory_map(str(path), "r")
        reader = pa.ipc.open_file(source)
    except (pa.ArrowException, OSError) as e:
        if source is not None:
            source.close()
        raise PoolCheckpointError(f"{path}: not a readable Arrow IPC file: {e}") from e
    if not reader.schema.equals(schema):
        source.close()
        raise PoolCheckpointError(f"{path}: unexpected columns {reader.schema.names}, expected {schema.names}")
    return source, reader


def load_experience(
    directory: str | os.PathLike[str],
    *,
    pool: ExperiencePool,
    sampler: Any | None = None,
    selector: Any | None = None,
    schedule: Any | None = None,
) -> dict[str, Any]:
    """Restore the pool (and the given components) from ``directory``; returns the saved ``extra`` dict.

    Raises :class:`PoolCheckpointError` (naming the file) for a missing, truncated, corrupt or incompatible
    checkpoint. After an error the components are in an undefined state: build fresh ones.
    """
    d = pathlib.Path(directory)
    if not d.is_dir():
        raise PoolCheckpointError(f"{d}: no saved experience directory")
    header = _read_header(d / HEADER)
    files = header["files"]
    meta = header["pool"]
    if int(meta.get("k", -1)) != pool.k:
        raise PoolCheckpointError(
            f"{d / HEADER}: the saved pool has K={meta.get('k')} but this run has K={pool.k} "
            "(buckets are success counts out of K; they cannot be converted)"
        )

    # entries.arrow
    epath = d / ENTRIES
    try:
        einfo = files[ENTRIES]
        source, reader = _open_arrow(epath, int(einfo["bytes"]), _ENTRY_SCHEMA)
        with source:
            table = reader.read_all()
            entries = {name: table.column(name).to_numpy().copy() for name in _COLUMNS}
            del table, reader
    except PoolCheckpointError:
        raise
    except (pa.ArrowException, OSError, KeyError, TypeError, ValueError) as e:
        raise PoolCheckpointError(f"{epath}: unreadable: {e}") from e
    if entries["entry_id"].shape[0] != int(einfo["rows"]) or _crc(*(entries[n] for n in _COLUMNS)) != einfo["crc32"]:
        raise PoolCheckpointError(f"{epath}: checksum or row-count mismatch (corrupt file)")

    # tokens.arrow, batch by batch
    tpath = d / TOKENS
    try:
        tinfo = files[TOKENS]
        batch_info = list(tinfo["batches"])
    except (KeyError, TypeError) as e:
        raise PoolCheckpointError(f"{d / HEADER}: malformed file table: {e}") from e
    tsource, treader = _open_arrow(tpath, int(tinfo["bytes"]), _TOKEN_SCHEMA)
    if treader.num_record_batches != len(batch_info):
        tsource.close()
        raise PoolCheckpointError(
            f"{tpath}: holds {treader.num_record_batches} record batches, the header records {len(batch_info)}"
        )

    def token_batches() -> Iterator[tuple[int, int, np.ndarray, np.ndarray]]:
        for i, info in enumerate(batch_info):
            try:
                rb = treader.get_batch(i)
                ids = rb.column(0).to_numpy(zero_copy_only=True)
                lps = rb.column(1).to_numpy(zero_copy_only=True)
            except (pa.ArrowException, OSError) as e:
                raise PoolCheckpointError(f"{tpath}: record batch {i} unreadable: {e}") from e
            if ids.shape[0] != int(info["tokens"]) or _crc(ids, lps) != int(info["crc32"]):
                raise PoolCheckpointError(f"{tpath}: record batch {i} fails its checksum (corrupt file)")
            start, stop = info["rows"]
            yield int(start), int(stop), ids, lps

    try:
        with tsource:  # the stores copy every batch, so no view into the map outlives it
            pool._import(meta, entries, token_batches())
    except PoolCheckpointError:
        raise
    except (ValueError, KeyError, TypeError) as e:
        raise PoolCheckpointError(f"{d}: {HEADER}, {ENTRIES} and {TOKENS} are inconsistent: {e}") from e

    for name, comp in (("sampler", sampler), ("selector", selector), ("schedule", schedule)):
        if comp is None:
            continue
        state = header.get(name)
        if state is None:
            raise PoolCheckpointError(f"{d / HEADER}: no saved {name} state to load")
        try:
            comp.load_state_dict(state)
        except (ValueError, KeyError, TypeError) as e:
            raise PoolCheckpointError(f"{d / HEADER}: invalid {name} state: {e}") from e
    return dict(header["extra"])
