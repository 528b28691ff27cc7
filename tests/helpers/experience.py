"""Experience-pool inputs and damage, as the unit tests make them: groups of members with given rewards, and a pool
checkpoint's header edited behind its checksum."""

from __future__ import annotations

import json
from collections.abc import Callable, Collection, Sequence
from pathlib import Path

import numpy as np

from exgrpo.experience import Group, GroupMember
from exgrpo.experience import persistence as persistence_mod


def members(rewards: Sequence[float], replayed: Collection[int] = (), salt: int = 0) -> list[GroupMember]:
    """One member per reward: member i has reward ``rewards[i]``, is replayed when i is in ``replayed``, and has its
    own three tokens ``[salt, i, 7]`` (no two members of a group alike, so none is deduplicated; another ``salt``,
    other tokens) with log-prob -0.5 each."""
    return [
        GroupMember(
            np.asarray([salt, i, 7], dtype=np.int64), np.full(3, -0.5, dtype=np.float32), float(r), i in replayed
        )
        for i, r in enumerate(rewards)
    ]


def group(qid, rewards: Sequence[float], replayed: Collection[int] = (), salt: int = 0) -> Group:
    """The group of question ``qid`` whose members are :func:`members` of ``rewards``."""
    return Group(qid, members(rewards, replayed, salt))


def binary_group(qid, n_ok: int, k: int, salt: int = 0) -> Group:
    """A binary-reward group of ``k`` members, the first ``n_ok`` correct (reward 1) and the others wrong (0)."""
    return group(qid, [1.0] * n_ok + [0.0] * (k - n_ok), salt=salt)


def header_body(pool_dir: Path) -> dict:
    """The header of a saved pool (``header.json``), without its checksum."""
    body = json.loads((pool_dir / "header.json").read_text())
    del body["sha256"]
    return body


def write_header(pool_dir: Path, body: dict) -> None:
    """Write ``body`` as the pool's header with a valid checksum: damage that the checksum cannot see."""
    (pool_dir / "header.json").write_bytes(persistence_mod._encode_header(body))


def resign_header(pool_dir: Path, edit: Callable[[dict], object]) -> None:
    """Edit the header's body in place (``edit(body)``) and write it back with a valid checksum."""
    body = header_body(pool_dir)
    edit(body)
    write_header(pool_dir, body)
