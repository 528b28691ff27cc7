"""Checksummed Arrow IPC files: how every component of the pool writes and reads its bytes.

A file is written through :func:`write_arrow`, which computes the CRC-32 of the bytes on their way to disk (a save
reads nothing back); :func:`map_verified` memory-maps a file and checks its size and whole-file CRC-32 against
the record the header kept before Arrow parses a byte of it. Every failure is a :class:`PoolCheckpointError`
naming the file.
"""

from __future__ import annotations

import pathlib
import zlib
from collections.abc import Iterator
from typing import Any

import pyarrow as pa

__all__ = ["PoolCheckpointError", "map_verified", "open_ipc", "write_arrow"]


class PoolCheckpointError(RuntimeError):
    """A saved experience directory is missing, truncated, corrupt or incompatible; names the file."""


class _ChecksumSink:
    """A write-only file object for ``pa.PythonFile`` that CRC-32s every byte on its way to ``raw``."""

    def __init__(self, raw: Any) -> None:
        self.raw = raw
        self.crc = 0
        self.size = 0

    def write(self, data: Any) -> int:
        view = memoryview(data).cast("B")
        self.crc = zlib.crc32(view, self.crc)
        self.size += view.nbytes
        return self.raw.write(view)

    def flush(self) -> None:
        self.raw.flush()

    def tell(self) -> int:
        return self.size

    def close(self) -> None:  # the caller closes ``raw``
        pass

    @property
    def closed(self) -> bool:
        return self.raw.closed

    def writable(self) -> bool:
        return True


def write_arrow(path: pathlib.Path, schema: pa.Schema, batches: Iterator[pa.RecordBatch]) -> dict[str, int]:
    """Write an Arrow IPC file batch by batch; returns its record ``{"bytes": size, "crc32": whole-file CRC}``."""
    with open(path, "wb") as raw:
        sink = _ChecksumSink(raw)
        with pa.PythonFile(sink, mode="w") as f, pa.ipc.new_file(f, schema) as writer:
            for batch in batches:
                writer.write_batch(batch)
    return {"bytes": sink.size, "crc32": sink.crc}


def map_verified(path: pathlib.Path, record: Any) -> tuple[pa.MemoryMappedFile, pa.Buffer]:
    """Memory-map a data file and check its size and whole-file CRC-32 against ``record`` (from the header).
    The caller closes the map; Arrow then reads batches zero-copy from it."""
    if (
        not isinstance(record, dict)
        or not isinstance(record.get("bytes"), int)
        or not isinstance(record.get("crc32"), int)
    ):
        raise PoolCheckpointError(f"{path}: the header's record of this file is malformed")
    if not path.is_file():
        raise PoolCheckpointError(f"{path}: missing")
    size = path.stat().st_size
    if size != record["bytes"]:
        raise PoolCheckpointError(
            f"{path}: truncated or modified: the header records {record['bytes']} bytes, found {size}"
        )
    source = None
    try:
        source = pa.memory_map(str(path), "r")
        buf = source.read_buffer()
        crc = zlib.crc32(memoryview(buf))
    except (pa.ArrowException, OSError, ValueError) as e:
        if source is not None:
            source.close()
        raise PoolCheckpointError(f"{path}: unreadable: {e}") from e
    if crc != record["crc32"]:
        source.close()
        raise PoolCheckpointError(f"{path}: checksum mismatch (corrupt file)")
    return source, buf


def open_ipc(path: pathlib.Path, buf: pa.Buffer, schema: pa.Schema) -> pa.ipc.RecordBatchFileReader:
    """An Arrow IPC reader over a verified buffer, with exactly the expected columns."""
    try:
        reader = pa.ipc.open_file(buf)
    except (pa.ArrowException, OSError) as e:
        raise PoolCheckpointError(f"{path}: not a readable Arrow IPC file: {e}") from e
    if not reader.schema.equals(schema):
        raise PoolCheckpointError(f"{path}: unexpected columns {reader.schema.names}, expected {schema.names}")
    return reader
