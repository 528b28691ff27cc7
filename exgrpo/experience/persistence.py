"""Save and load the whole experience state to a directory, without pickle (docs/experience.md).

Layout of a saved directory (e.g. ``global_step_N/exgrpo/pool/`` next to verl's own checkpoint)::

    header.json     format tag, schema_version, save time, pool meta (question table, bucket member lists in
                    draw order, retired set, counters), sampler / selector / schedule state (RNG states
                    included), the caller's ``extra`` dict, per data file its size and CRC-32 of its whole
                    content, and last "sha256": the SHA-256 of the file's bytes written without that key
    entries.arrow   Arrow IPC file, one row per stored trajectory in entry-id order:
                    entry_id, question (index into the header's table), length, reward, step
    tokens.arrow    Arrow IPC file, record batches of (token_ids int32, behaviour_log_probs float32; NaN on
                    the tokens a loss mask marks as not the model's); each batch holds the tokens of a
                    contiguous run of entries (<= 4M tokens)

Every byte of the directory is covered by a checksum: the header by the SHA-256 it carries, each data file by the
CRC-32 the header records, checked before Arrow parses the file. A damaged, truncated or missing file, or
any inconsistency between them, raises :class:`PoolCheckpointError` naming the file; a load never yields a
silently different or half-loaded state.

Writes go to a temporary sibling ``.NAME.tmp-*`` which is renamed over the target (the old copy is first moved
aside to ``.NAME.old-*``, then deleted), so a crash mid-save leaves the previous checkpoint intact. A crash between
the two renames leaves no ``NAME`` but a complete ``.NAME.old-*``: loading finds and verifies that copy (the last
committed state) and says so. The next successful save deletes such leftovers (``.NAME.tmp-*`` / ``.NAME.old-*``).
The same format serves both token-store layouts (arena and per-entry).

Schema versions: 2 for a pool whose every stored token is the model's (byte for byte what the code before loss
masks wrote, and what it reads); 3 for a pool holding masked tokens (multi-turn trajectories: the token file's
record then says ``loss_mask``: the encoding and the count of masked tokens), which that code refuses instead of
reading the NaNs as log-probs. Both are read.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import pathlib
import shutil
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from exgrpo.experience.experience_pool import DATA_FILES, TOKENS_FILE, ExperiencePool
from exgrpo.experience.files import PoolCheckpointError
from exgrpo.experience.storage import DEFAULT_CHUNK_TOKENS, LOSS_MASK_KEY, read_token_batches
from exgrpo.modes.base import saved_mode_name

__all__ = [
    "FORMAT",
    "READ_SCHEMA_VERSIONS",
    "SCHEMA_VERSION",
    "UNMASKED_SCHEMA_VERSION",
    "PoolCheckpointError",
    "SavedExperience",
    "experience_exists",
    "load_experience",
    "open_experience",
    "save_experience",
]

logger = logging.getLogger(__name__)

FORMAT = "exgrpo-experience"
# 2: the header carries a SHA-256 of itself; data files are checksummed whole (1: per-batch CRCs, header bare).
# 3: as 2, and the token file holds masked tokens (its record's "loss_mask"); written only for such a pool.
SCHEMA_VERSION = 3
#: the version of a pool without masked tokens (what the code before loss masks wrote and reads)
UNMASKED_SCHEMA_VERSION = 2
READ_SCHEMA_VERSIONS = (UNMASKED_SCHEMA_VERSION, SCHEMA_VERSION)
HEADER = "header.json"

# header.json is the header's JSON object with one last key, "sha256": the SHA-256 (64 hex digits) of the exact
# bytes of that object written without it. Readers see the usual keys; the checksum covers every other byte.
_HEADER_SUM_KEY = b', "sha256": "'
_HEADER_END = b'"}\n'
_HEADER_TRAILER = len(_HEADER_SUM_KEY) + 64 + len(_HEADER_END)
_HEADER_MAX_BYTES = 1 << 30  # far above any real header (the question table of 10^6 questions is ~50 MB)


def experience_exists(directory: str | os.PathLike[str]) -> bool:
    """Whether ``directory`` holds a saved experience state (its header is present), or an overwrite of it was
    interrupted between its two renames and the previous copy waits under ``.NAME.old-*`` (where
    :func:`load_experience` finds it). Presence only: the load verifies the files."""
    d = pathlib.Path(directory)
    return (d / HEADER).is_file() or (not d.exists() and any((o / HEADER).is_file() for o in _leftovers(d, "old")))


def _leftovers(target: pathlib.Path, kind: str) -> list[pathlib.Path]:
    """The ``.NAME.tmp-*`` (kind "tmp") or ``.NAME.old-*`` (kind "old") siblings of ``target``."""
    try:
        return sorted(p for p in target.parent.glob(f".{target.name}.{kind}-*") if p.is_dir())
    except OSError:
        return []


def _fsync_path(path: pathlib.Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _encode_header(header: dict[str, Any]) -> bytes:
    body = json.dumps(header, allow_nan=False).encode("utf-8")  # a non-empty object: ends with "}"
    digest = hashlib.sha256(body).hexdigest().encode("ascii")
    return body[:-1] + _HEADER_SUM_KEY + digest + _HEADER_END


def _remove_leftovers(target: pathlib.Path, kinds: tuple[str, ...]) -> None:
    for kind in kinds:
        for path in _leftovers(target, kind):
            shutil.rmtree(path, ignore_errors=True)


def save_experience(
    directory: str | os.PathLike[str],
    *,
    pool: ExperiencePool,
    sampler: Any | None = None,
    selector: Any | None = None,
    schedule: Any | None = None,
    extra: dict[str, Any] | None = None,
    batch_tokens: int = DEFAULT_CHUNK_TOKENS,
    fsync: bool = True,
) -> pathlib.Path:
    """Write the pool and the given components' ``state_dict()`` atomically to ``directory``.

    ``extra``: a JSON-serialisable dict of the caller's own state (e.g. the trainer's leftover fresh prompt
    indices), returned by :func:`load_experience`. ``fsync``: flush the files to disk before the rename.
    Leftovers of interrupted earlier saves (``.NAME.tmp-*``, ``.NAME.old-*``) are deleted once this save is in
    place. One writer per directory at a time.
    """
    target = pathlib.Path(directory)
    header: dict[str, Any] = {"format": FORMAT, "schema_version": UNMASKED_SCHEMA_VERSION, "saved_at": time.time()}
    for name, comp in (("sampler", sampler), ("selector", selector), ("schedule", schedule)):
        header[name] = None if comp is None else comp.state_dict()
    header["extra"] = {} if extra is None else extra
    try:  # fail before writing anything
        json.dumps(header, allow_nan=False)
    except (TypeError, ValueError) as e:
        raise ValueError(f"experience state (extra or component state) is not JSON-serialisable: {e}") from e

    target.parent.mkdir(parents=True, exist_ok=True)
    # Temporaries of a dead save are never current; old copies are stale once the target exists (while it does
    # not, the newest old copy is the last committed state and stays until this save is in place).
    _remove_leftovers(target, ("tmp", "old") if target.exists() else ("tmp",))
    tmp = pathlib.Path(tempfile.mkdtemp(prefix=f".{target.name}.tmp-", dir=target.parent))
    try:
        # The pool writes the files its parts own (entries.arrow, tokens.arrow: streamed batch by batch, one
        # batch of copies in memory at a time) and returns its JSON state and each file's size and CRC-32.
        header["pool"], header["files"] = pool.dump(tmp, batch_tokens=batch_tokens)
        if LOSS_MASK_KEY in header["files"][TOKENS_FILE]:  # masked tokens: code that cannot read them refuses it
            header["schema_version"] = SCHEMA_VERSION
        (tmp / HEADER).write_bytes(_encode_header(header))
        if fsync:
            for name in (*header["files"], HEADER):
                _fsync_path(tmp / name)
            _fsync_path(tmp)
        if target.exists():
            # A directory cannot be renamed over a non-empty one: move the old one aside first. A crash between
            # the two renames leaves the old copy complete under .NAME.old-*, where load_experience finds it.
            old = target.parent / f".{target.name}.old-{uuid.uuid4().hex[:8]}"
            os.replace(target, old)
            os.replace(tmp, target)
        else:
            os.replace(tmp, target)
        if fsync:
            _fsync_path(target.parent)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    _remove_leftovers(target, ("tmp", "old"))
    return target


def _unframed_header_message(path: pathlib.Path, raw: bytes) -> str:
    """Why a header without the checksum trailer cannot be read: an earlier schema (bare JSON, no checksum), a
    newer one, or a damaged file. Only an intact header that names an earlier schema and carries no checksum key is
    called earlier; a header that names this schema (or carries a checksum) lost its trailer, so it is damaged."""
    damaged = f"{path}: damaged header (its checksum trailer is missing or altered: truncated, edited or corrupt file)"
    try:
        legacy = json.loads(raw)
    except ValueError:
        return damaged
    if not isinstance(legacy, dict) or legacy.get("format") != FORMAT:
        return f"{path}: unreadable or corrupt header (not a checksummed ExGRPO header)"
    version = legacy.get("schema_version")
    if (
        not isinstance(version, int)
        or isinstance(version, bool)
        or "sha256" in legacy
        or version in READ_SCHEMA_VERSIONS
    ):
        return f"{damaged}; it names schema_version {version!r}, which this code reads only with its checksum"
    reads = " and ".join(map(str, READ_SCHEMA_VERSIONS))
    if version > SCHEMA_VERSION:
        return (
            f"{path}: schema_version {version} is not supported (this code reads {reads}): it was written by "
            "a newer version of the recipe; resume with that version"
        )
    return (
        f"{path}: schema_version {version!r} is not supported (this code reads {reads}, whose headers carry "
        "their own checksum). It was written by an earlier version of the recipe: resume with that version, or move "
        "the checkpoint's exgrpo/ folder aside and set exgrpo.resume_pool=empty to resume verl's state with an empty "
        "pool"
    )


def _read_header(path: pathlib.Path) -> dict[str, Any]:
    """The verified header body; every failure is a PoolCheckpointError naming ``path``."""
    if not path.is_file():
        raise PoolCheckpointError(f"{path}: missing (not a saved experience directory, or an interrupted save)")
    try:
        size = path.stat().st_size
        if size > _HEADER_MAX_BYTES:
            raise PoolCheckpointError(f"{path}: {size} bytes, not a header (corrupt file)")
        raw = path.read_bytes()
    except OSError as e:
        raise PoolCheckpointError(f"{path}: unreadable: {e}") from e
    framed = (
        len(raw) > _HEADER_TRAILER
        and raw.endswith(_HEADER_END)
        and raw[-_HEADER_TRAILER : -_HEADER_TRAILER + len(_HEADER_SUM_KEY)] == _HEADER_SUM_KEY
    )
    if not framed:
        raise PoolCheckpointError(_unframed_header_message(path, raw))
    body = raw[:-_HEADER_TRAILER] + b"}"
    recorded = raw[-64 - len(_HEADER_END) : -len(_HEADER_END)]
    if hashlib.sha256(body).hexdigest().encode("ascii") != recorded:
        raise PoolCheckpointError(f"{path}: checksum mismatch (corrupt or modified header)")
    try:
        header = json.loads(body)
    except ValueError as e:  # only a writer bug gets here: the checksum matched
        raise PoolCheckpointError(f"{path}: unreadable or corrupt JSON header: {e}") from e
    if not isinstance(header, dict) or header.get("format") != FORMAT:
        raise PoolCheckpointError(f"{path}: not an ExGRPO experience header (format tag {FORMAT!r} missing)")
    version = header.get("schema_version")
    if version not in READ_SCHEMA_VERSIONS or isinstance(version, bool):
        raise PoolCheckpointError(
            f"{path}: schema_version {version!r} is not supported (this code reads "
            f"{' and '.join(map(str, READ_SCHEMA_VERSIONS))})"
        )
    for key, kind in (("pool", dict), ("files", dict), ("extra", dict)):
        if not isinstance(header.get(key), kind):
            raise PoolCheckpointError(f"{path}: header lacks the {key!r} section")
    tokens = header["files"].get(TOKENS_FILE)
    has_mask = isinstance(tokens, dict) and LOSS_MASK_KEY in tokens
    if has_mask != (version == SCHEMA_VERSION):
        raise PoolCheckpointError(
            f"{path}: schema_version {version} "
            + ("requires" if version == SCHEMA_VERSION else "cannot have")
            + f" a {LOSS_MASK_KEY!r} record for {TOKENS_FILE} (the pool's masked tokens); the header is inconsistent"
        )
    return header


def _resolve(directory: pathlib.Path) -> pathlib.Path:
    """``directory``, or when it is missing the newest complete ``.NAME.old-*`` an interrupted overwrite left."""
    if directory.is_dir():
        return directory
    found = []
    for old in _leftovers(directory, "old"):
        try:
            found.append((float(_read_header(old / HEADER).get("saved_at", 0.0)), old))
        except (PoolCheckpointError, TypeError, ValueError):
            continue
    if found:
        old = max(found)[1]
        logger.warning(
            "%s is missing: a save that replaced it was interrupted between its two renames; loading the previous "
            "copy from %s (the next save cleans it up)",
            directory,
            old,
        )
        return old
    leftovers = _leftovers(directory, "old") + _leftovers(directory, "tmp")
    hint = (
        f"; leftovers of interrupted saves (none loadable): {', '.join(str(p) for p in leftovers)}" if leftovers else ""
    )
    raise PoolCheckpointError(f"{directory}: no saved experience directory{hint}")


def _inconsistent(d: pathlib.Path, e: Exception) -> PoolCheckpointError:
    """The error for a header whose content does not fit the data files (a duplicated id ...), naming the header."""
    return PoolCheckpointError(
        f"{d / HEADER}: inconsistent with {' / '.join(DATA_FILES)} of {d}: {type(e).__name__}: {e}"
    )


def _load_pool(
    d: pathlib.Path, pool: ExperiencePool, meta: dict[str, Any], files: dict[str, Any], tokens: bool
) -> None:
    try:  # every file is verified against its checksum before it is parsed (PoolCheckpointError naming it)
        pool.load(d, meta, files, tokens=tokens)
    except PoolCheckpointError:
        raise
    except Exception as e:  # whatever a consistent-looking but wrong header trips over (a duplicated id ...)
        raise _inconsistent(d, e) from e


def load_experience(
    directory: str | os.PathLike[str],
    *,
    pool: ExperiencePool,
    sampler: Any | None = None,
    selector: Any | None = None,
    schedule: Any | None = None,
) -> dict[str, Any]:
    """Restore the pool (and the given components) from ``directory``; returns the saved ``extra`` dict.

    Every file is verified against its checksum before it is parsed. Raises :class:`PoolCheckpointError` (naming
    the file) for a missing, truncated, corrupt, inconsistent or incompatible checkpoint, never another exception.
    After an error the components are in an undefined state: build fresh ones.
    """
    d = _resolve(pathlib.Path(directory))
    hpath = d / HEADER
    header = _read_header(hpath)
    files, meta = header["files"], header["pool"]
    if meta.get("k") != pool.k:
        raise PoolCheckpointError(
            f"{hpath}: the saved pool has K={meta.get('k')} but this run has K={pool.k} "
            "(buckets are success counts out of K; they cannot be converted)"
        )
    saved_mode = saved_mode_name(meta.get("settings", {}))
    if saved_mode != pool.reward_mode:
        raise PoolCheckpointError(
            f"{hpath}: the saved pool was collected with exgrpo.reward_mode={saved_mode} but this run has "
            f"exgrpo.reward_mode={pool.reward_mode} (the buckets of two reward modes mean different things, e.g. "
            "success counts and reward spreads, and cannot be converted): resume with the same mode, or move the "
            "checkpoint's exgrpo/ folder aside and set exgrpo.resume_pool=empty"
        )
    _load_pool(d, pool, meta, files, tokens=True)

    for name, comp in (("sampler", sampler), ("selector", selector), ("schedule", schedule)):
        if comp is None:
            continue
        state = header.get(name)
        if state is None:
            raise PoolCheckpointError(f"{hpath}: no saved {name} state to load")
        try:
            comp.load_state_dict(state)
        except Exception as e:
            raise PoolCheckpointError(f"{hpath}: invalid {name} state: {type(e).__name__}: {e}") from e
    return dict(header["extra"])


@dataclass
class SavedExperience:
    """A saved experience directory opened read-only, for tools that look inside it (``python -m exgrpo.pool``).

    :func:`open_experience` verifies it as :func:`load_experience` does (the header's SHA-256, ``entries.arrow``'s
    size and CRC-32, every consistency check between them) but restores only the pool's index into ``pool``
    (entry table, buckets, retired set, counters; :meth:`ExperiencePool.load` with ``tokens=False``), so the token
    file, by far the largest, is not read. :meth:`token_batches` streams it batch by batch when a tool needs the
    tokens, its CRC-32 checked first through a small buffer. Errors are the load's: :class:`PoolCheckpointError`
    naming the file.
    """

    directory: pathlib.Path  # where it was read from (the previous copy when an overwrite was interrupted)
    header: dict[str, Any]
    pool: ExperiencePool  # index only: table, buckets, retired set, counters; no tokens

    @property
    def meta(self) -> dict[str, Any]:
        """The header's ``pool`` section (settings, question table, bucket lists, retired set, counters ...)."""
        return self.header["pool"]

    def file_bytes(self) -> dict[str, int]:
        """Bytes on disk of each file of the directory (header included)."""
        out = {HEADER: (self.directory / HEADER).stat().st_size}
        out.update({name: int(rec["bytes"]) for name, rec in self.header["files"].items()})
        return out

    def token_batches(self, rows: Any | None = None) -> Iterator[tuple[int, int, np.ndarray, np.ndarray]]:
        """The token file streamed: ``(start, stop, token_ids, behaviour_log_probs)`` per record batch, the
        concatenated tokens of entry rows [start, stop) in entry-id order (the rows of ``pool.table.columns``).
        ``rows``: only the batches holding one of these entry rows. One batch is held at a time."""
        n = len(self.pool)
        lengths = self.pool.table.columns["length"][:n].astype(np.int64)
        try:
            yield from read_token_batches(
                self.directory / TOKENS_FILE, self.header["files"].get(TOKENS_FILE), lengths, rows=rows
            )
        except PoolCheckpointError:
            raise
        except Exception as e:  # the header's batch table does not fit the entries: as the load names it
            raise _inconsistent(self.directory, e) from e


def open_experience(directory: str | os.PathLike[str]) -> SavedExperience:
    """Open a saved experience directory read-only (:class:`SavedExperience`): the header and ``entries.arrow``
    verified and the pool's index restored, the token file left for :meth:`SavedExperience.token_batches`.
    Raises :class:`PoolCheckpointError` naming the file, as :func:`load_experience` does; the reward mode and K are
    the saved ones (nothing to match them against)."""
    d = _resolve(pathlib.Path(directory))
    hpath = d / HEADER
    header = _read_header(hpath)
    meta = header["pool"]
    k = meta.get("k")
    if not isinstance(k, int) or isinstance(k, bool) or k < 2:
        raise PoolCheckpointError(f"{hpath}: the saved pool's K is {k!r}, not a group size (an integer >= 2)")
    pool = ExperiencePool(k)
    _load_pool(d, pool, meta, header["files"], tokens=False)
    return SavedExperience(d, header, pool)
