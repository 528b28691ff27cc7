"""verl's ``DataProto`` and the replay step's :class:`~recipe.exgrpo.replay_step.Rows`, one into the other without
copying: the same tensors, per-row arrays and meta dict. The legacy trainer keeps a step's rows as a ``DataProto``;
both adapters hand rows to verl's reward loop (``compute_rm_score``) as one."""

from __future__ import annotations

from verl import DataProto

from recipe.exgrpo.replay_step import Rows

__all__ = ["as_dataproto", "rows_of"]


def rows_of(batch: DataProto) -> Rows:
    """A ``DataProto``'s rows for the replay step."""
    return Rows(batch.batch, batch.non_tensor_batch, batch.meta_info)


def as_dataproto(rows: Rows) -> DataProto:
    """The replay step's rows as a ``DataProto`` for verl."""
    return DataProto(batch=rows.tensors, non_tensor_batch=rows.columns, meta_info=rows.meta)
