"""Where the pool inspector reads from: a checkpoint's pool directory, a run's checkpoints, a tokenizer.

Every bad input (a path that does not exist, a directory without a pool, a run without checkpoints, a tokenizer
that does not load) is an :class:`InputError` with one line naming the path; the command line prints it and exits
with status 2. A pool that is there but damaged is the loader's :class:`~exgrpo.experience.PoolCheckpointError`
(status 1), raised by :func:`~exgrpo.experience.persistence.open_experience`.
"""

from __future__ import annotations

import pathlib
import re
from dataclasses import dataclass
from typing import Any

from exgrpo.experience.experience_pool import DATA_FILES
from exgrpo.experience.persistence import HEADER, experience_exists

__all__ = ["Checkpoint", "InputError", "find_checkpoints", "load_tokenizer", "resolve_pool_dir"]

#: Where verl's trainer puts the pool inside a checkpoint (recipe/exgrpo: ``global_step_N/exgrpo`` holds the
#: manager's directory, ``exgrpo.experience.manager.POOL_SUBDIR`` the pool inside it).
_POOL_IN_CHECKPOINT = ("exgrpo", "pool")
_STEP_DIR = re.compile(r"global_step_(\d+)")


class InputError(Exception):
    """A bad input of the inspector (path, question id, tokenizer): one line naming it, exit status 2."""


def _holds_pool(d: pathlib.Path) -> bool:
    """A pool directory, intact or not (its header or one of its data files is there), or an interrupted
    overwrite's previous copy (``.NAME.old-*``, which the loader finds)."""
    return experience_exists(d) or (d.is_dir() and any((d / name).exists() for name in (HEADER, *DATA_FILES)))


def resolve_pool_dir(path: str | pathlib.Path) -> pathlib.Path:
    """The pool directory ``path`` names: the pool itself, or the trainer's ``global_step_N/exgrpo`` or
    ``global_step_N`` above it. InputError when there is none."""
    p = pathlib.Path(path)
    if not p.exists() and not experience_exists(p):
        raise InputError(f"{p}: no such file or directory")
    if p.exists() and not p.is_dir():
        raise InputError(f"{p}: not a directory (a saved pool is a directory holding {HEADER})")
    for candidate in (p, p / _POOL_IN_CHECKPOINT[1], p.joinpath(*_POOL_IN_CHECKPOINT)):
        if _holds_pool(candidate):
            return candidate
    raise InputError(
        f"{p}: no saved experience pool (no {HEADER} in it, nor in {'/'.join(_POOL_IN_CHECKPOINT[1:])}/ or "
        f"{'/'.join(_POOL_IN_CHECKPOINT)}/ below it)"
    )


@dataclass(frozen=True)
class Checkpoint:
    """One ``global_step_N`` of a run and its pool directory (None: the checkpoint holds no pool, e.g. pruned by
    ``trainer.max_actor_ckpt_to_keep``)."""

    step: int
    directory: pathlib.Path
    pool_dir: pathlib.Path | None


def find_checkpoints(run_dir: str | pathlib.Path) -> list[Checkpoint]:
    """Every ``global_step_N`` of a run in step order: those directly under ``run_dir`` (verl's
    ``trainer.default_local_dir``), or else under ``run_dir/checkpoints`` (the CPU demo's output folder).
    InputError when there are none."""
    run = pathlib.Path(run_dir)
    if not run.is_dir():
        raise InputError(f"{run}: no such directory" if not run.exists() else f"{run}: not a directory")
    for base in (run, run / "checkpoints"):
        found = []
        if base.is_dir():
            for child in base.iterdir():
                m = _STEP_DIR.fullmatch(child.name)
                if m and child.is_dir():
                    pool = child.joinpath(*_POOL_IN_CHECKPOINT)
                    found.append(Checkpoint(int(m.group(1)), child, pool if _holds_pool(pool) else None))
        if found:
            return sorted(found, key=lambda c: c.step)
    raise InputError(f"{run}: no global_step_N checkpoints in it (nor in {run / 'checkpoints'})")


def load_tokenizer(path: str | pathlib.Path) -> Any:
    """A Hugging Face tokenizer from a local directory (``transformers.AutoTokenizer``, imported only now; nothing
    is downloaded). InputError naming the path when it cannot be loaded."""
    p = pathlib.Path(path)
    if not p.is_dir():
        raise InputError(f"tokenizer {p}: no such directory" if not p.exists() else f"tokenizer {p}: not a directory")
    try:
        from transformers import AutoTokenizer
    except Exception as e:  # a broken install is a bad input of this command too
        raise InputError(f"tokenizer {p}: transformers cannot be imported ({type(e).__name__}: {e})") from e
    try:
        return AutoTokenizer.from_pretrained(str(p), local_files_only=True)
    except Exception as e:  # whatever transformers raises for a directory without a tokenizer
        reason = str(e).strip().splitlines()[0] if str(e).strip() else ""
        raise InputError(f"tokenizer {p}: cannot be loaded ({type(e).__name__}: {reason})") from e
