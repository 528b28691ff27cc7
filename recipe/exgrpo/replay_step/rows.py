"""``Rows``: a step's rows as the replay step sees them, with no trainer's batch type in between.

Every trainer keeps a step's rows in its own container (verl's legacy trainer a ``DataProto``, its v1 trainer fields
in TransferQueue behind a ``KVBatchMeta``); the replay step works on three plain parts, which each adapter converts to
and from its own, without copying:

- ``tensors``: a ``TensorDict`` of per-row tensors (batch size ``[rows]``): prompt and response ids, masks, log-probs,
  scores, the step fields of ``fields.py``;
- ``columns``: per-row values that are not tensors, as numpy arrays of one entry per row (uid, question id, the
  reward's ground truth and extra keys, ...);
- ``meta``: values of the whole step (the reward's extra key names, the sampling temperature, ...).

Selecting and concatenating follow verl's ``DataProto`` (``select_idxs``, ``concat``, ``union``) exactly, meta
shared by a selection included, so a step gives the same rows through either.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from tensordict import TensorDict

__all__ = ["Rows"]


@dataclass
class Rows:
    """A step's rows: per-row ``tensors``, per-row ``columns`` and the step's ``meta`` (module docstring)."""

    tensors: TensorDict
    columns: dict[str, np.ndarray] = field(default_factory=dict)
    meta: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        n = len(self)
        for key, column in self.columns.items():
            if len(column) != n:
                raise ValueError(f"rows: column {key!r} has {len(column)} entries for {n} rows")

    @classmethod
    def of(cls, tensors: Mapping[str, torch.Tensor], columns: Mapping[str, Any] | None = None, **meta: Any) -> Rows:
        """Rows from a mapping of per-row tensors (all of one length) and one of per-row columns."""
        tensors = dict(tensors)
        n = len(next(iter(tensors.values()))) if tensors else 0
        cols = {k: v if isinstance(v, np.ndarray) else np.asarray(v, dtype=object) for k, v in (columns or {}).items()}
        return cls(TensorDict(tensors, batch_size=(n,)), cols, dict(meta))

    def __len__(self) -> int:
        return int(self.tensors.batch_size[0]) if self.tensors.batch_size else 0

    def keys(self) -> list[str]:
        """The names of the per-row tensors."""
        return list(self.tensors.keys())

    def select(self, idxs: Sequence[int] | np.ndarray | torch.Tensor) -> Rows:
        """The rows at ``idxs`` (integer positions, or a boolean mask), in that order; ``meta`` is shared."""
        if isinstance(idxs, list):
            idxs = torch.tensor(idxs)
            if idxs.dtype != torch.bool:
                idxs = idxs.type(torch.int32)
        if isinstance(idxs, np.ndarray):
            idxs_np, idxs_torch = idxs, torch.from_numpy(idxs)
        else:
            idxs_torch, idxs_np = idxs, idxs.detach().cpu().numpy()
        n = int(idxs_np.sum()) if idxs_np.dtype == bool else idxs_np.shape[0]
        tensors = TensorDict(
            {key: t[idxs_torch] for key, t in self.tensors.items()}, batch_size=(n,), device=self.tensors.device
        )
        return Rows(tensors, {key: col[idxs_np] for key, col in self.columns.items()}, self.meta)

    @staticmethod
    def concat(parts: Sequence[Rows]) -> Rows:
        """The rows of ``parts`` one after the other; every part must have the same tensors and columns, and the
        parts' meta must agree where they share a key."""
        if not parts:
            raise ValueError("Rows.concat needs at least one part")
        tensors = torch.cat([p.tensors for p in parts], dim=0)
        keys = list(parts[0].columns)
        for p in parts[1:]:
            if set(p.columns) != set(keys):
                raise ValueError(f"Rows.concat: parts with other columns ({sorted(p.columns)} vs {sorted(keys)})")
        columns = {k: np.concatenate([p.columns[k] for p in parts], axis=0) for k in keys}
        meta: dict[str, Any] = {}
        for p in parts:
            for k, v in p.meta.items():
                if k in meta and meta[k] != v:
                    raise ValueError(f"Rows.concat: conflicting values for meta key {k!r}")
                meta.setdefault(k, v)
        return Rows(tensors, columns, meta)

    def union(self, other: Rows) -> Rows:
        """These rows with the tensors, columns and meta of ``other`` (the same rows) added, in place; a key both have
        must hold equal values (NaN equal to NaN), as ``DataProto.union`` requires."""
        if len(other) != len(self):
            raise ValueError(f"Rows.union: {len(other)} rows joined to {len(self)}")
        for key, t in other.tensors.items():
            if key not in self.tensors.keys():
                self.tensors[key] = t
            elif not self.tensors[key].equal(t):
                raise ValueError(f"Rows.union: tensor {key!r} differs")
        for key, col in other.columns.items():
            if key in self.columns and not _same_values(self.columns[key], col):
                raise ValueError(f"Rows.union: column {key!r} differs")
            self.columns[key] = col
        for key, v in other.meta.items():
            if key in self.meta and self.meta[key] != v:
                raise ValueError(f"Rows.union: meta key {key!r} differs")
            self.meta[key] = v
        return self


def _same_values(a: Any, b: Any) -> bool:
    """Deep equality of two column values, NaN equal to NaN."""
    if type(a) is not type(b):
        return False
    if isinstance(a, np.ndarray):
        if a.dtype != b.dtype or a.shape != b.shape:
            return False
        if a.dtype != object:
            return bool(np.array_equal(a, b, equal_nan=a.dtype.kind in "fc"))
        return all(_same_values(x, y) for x, y in zip(a.flat, b.flat))
    if isinstance(a, float) and math.isnan(a):
        return math.isnan(b)
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same_values(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(_same_values(x, y) for x, y in zip(a, b))
    return bool(a == b)
