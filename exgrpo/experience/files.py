"""Checksummed Arrow IPC files: how every component of the pool writes and reads its bytes.

A file is written through :func:`write_arrow`, which computes the CRC-32 of the bytes on their way to disk (a save
reads nothing back); :func:`map_verified` memory-maps a file and checks its size and whole-file CRC-32 against
the record the header kept before Arrow parses a byte of it (the load); :func:`open_verified` checks the same
record by reading the file through one small buffer and hands it back for streaming (the pool inspector, whose
memory must not grow with the token file). Both apply the same checks. Every failure is a
:class:`PoolCheckpointError` naming the file.
"""

from __future__ import annotations

import pathlib
import zlib
from collections.abc import Iterator
from typing import Any

import pyarrow as pa

__all__ = ["PoolCheckpointError", "map_verified", "open_ipc", "open_verified", "write_arrow"]


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


def _check_record(path: pathlib.Path, record: Any) -> None:
    """The header's record of ``path`` is well formed, the file exists and has the recorded size."""
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


def _check_crc(path: pathlib.Path, crc: int, record: dict[str, Any]) -> None:
    if crc != record["crc32"]:
        raise PoolCheckpointError(f"{path}: checksum mismatch (corrupt file)")


def map_verified(path: pathlib.Path, record: Any) -> tuple[pa.MemoryMappedFile, pa.Buffer]:
    """Memory-map a data file and check its size and whole-file CRC-32 against ``record`` (from the header).
    The caller closes the map; Arrow then reads batches zero-copy from it."""
    _check_record(path, record)
    source = None
    try:
        source = pa.memory_map(str(path), "r")
        buf = source.read_buffer()
        crc = zlib.crc32(memoryview(buf))
    except (pa.ArrowException, OSError, ValueError) as e:
        if source is not None:
            source.close()
        raise PoolCheckpointError(f"{path}: unreadable: {e}") from e
    try:
        _check_crc(path, crc, record)
    except PoolCheckpointError:
        source.close()
        raise
    return source, buf


#: Bytes read per call while :func:`open_verified` checks a file (one reused buffer).
VERIFY_CHUNK_BYTES = 1 << 23


def open_verified(path: pathlib.Path, record: Any, *, chunk_bytes: int = VERIFY_CHUNK_BYTES) -> pa.NativeFile:
    """Open a data file for streaming: its size and whole-file CRC-32 are checked against ``record`` by reading it
    through one reused buffer of ``chunk_bytes`` (nothing is mapped, so memory stays at that buffer however large
    the file), then the same open file is handed back at offset 0 for Arrow to read batch by batch. Holding one file
    descriptor from the check to the last read means a save that replaces the directory meanwhile cannot slip other
    bytes in. The caller closes it."""
    _check_record(path, record)
    try:
        raw = open(path, "rb")  # closed by the caller, through the Arrow file
    except OSError as e:
        raise PoolCheckpointError(f"{path}: unreadable: {e}") from e
    try:
        buf = bytearray(chunk_bytes)
        view = memoryview(buf)
        crc, size = 0, 0
        while True:
            n = raw.readinto(buf)
            if not n:
                break
            crc = zlib.crc32(view[:n], crc)
            size += n
        if size != record["bytes"]:  # changed since the size check
            raise PoolCheckpointError(
                f"{path}: truncated or modified: the header records {record['bytes']} bytes, read {size}"
            )
        _check_crc(path, crc, record)
        raw.seek(0)
        return pa.PythonFile(raw, mode="r")
    except OSError as e:
        raw.close()
        raise PoolCheckpointError(f"{path}: unreadable: {e}") from e
    except BaseException:
        raw.close()
        raise


def open_ipc(path: pathlib.Path, buf: pa.Buffer | pa.NativeFile, schema: pa.Schema) -> pa.ipc.RecordBatchFileReader:
    """An Arrow IPC reader over a verified buffer (or a file :func:`open_verified` opened), with exactly the
    expected columns."""
    try:
        reader = pa.ipc.open_file(buf)
    except (pa.ArrowException, OSError) as e:
        raise PoolCheckpointError(f"{path}: not a readable Arrow IPC file: {e}") from e
    if not reader.schema.equals(schema):
        raise PoolCheckpointError(f"{path}: unexpected columns {reader.schema.names}, expected {schema.names}")
    return reader
