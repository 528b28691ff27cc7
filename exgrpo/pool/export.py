"""A saved pool as a table (Parquet, for pandas or DuckDB) and one question's stored trajectories as text.

Both stream ``tokens.arrow`` one record batch at a time (:meth:`SavedExperience.token_batches`), so memory holds
one batch (4M tokens) and its rows, whatever the size of the pool. The Parquet file is written next to its target
and renamed onto it once complete: a damaged pool found half way leaves no partial file behind.
"""

from __future__ import annotations

import os
import pathlib
import tempfile
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from exgrpo.experience.persistence import SavedExperience
from exgrpo.pool.source import InputError
from exgrpo.pool.summary import bucket_label, entry_arrays, question_ids, reward_mode

__all__ = ["export_parquet", "export_schema", "find_question", "show_question"]


def _umask() -> int:
    """This process's umask (read by setting it, so set it back at once)."""
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _question_type(qids: list[Any]) -> pa.DataType:
    """int64 when every question id is an int, else string (ints written as their decimal text)."""
    return pa.int64() if all(isinstance(q, int) for q in qids) else pa.string()


def export_schema(qtype: pa.DataType, *, text: bool, log_probs: bool) -> pa.Schema:
    """The columns of the export, one row per stored trajectory, then one per retired question."""
    fields = [
        pa.field("question_id", qtype),
        pa.field("entry_id", pa.int64()),  # null for a retired question's row
        pa.field("step", pa.int64()),  # step collected; null for a retired question's row
        pa.field("age", pa.int64()),  # steps since collected: the pool's last collect step - step
        pa.field("reward", pa.float32()),
        pa.field("length", pa.int32()),
        pa.field("bucket", pa.int32()),  # the question's bucket (null: retired)
        pa.field("retired", pa.bool_()),
        pa.field("retired_step", pa.int64()),  # the step the question retired at (null: not retired)
        pa.field("token_ids", pa.list_(pa.int32())),
        pa.field("model_tokens", pa.int32()),  # tokens the model generated (the rest: tool outputs, loss mask 0)
    ]
    if log_probs:  # NaN on a tool token (its loss mask, as the pool stores it)
        fields.append(pa.field("behaviour_log_probs", pa.list_(pa.float32())))
    if text:
        fields.append(pa.field("text", pa.string()))
    return pa.schema(fields)


def _decode(tokenizer: Any, ids: np.ndarray, offsets: np.ndarray) -> list[str]:
    rows = [ids[a:b].tolist() for a, b in zip(offsets[:-1].tolist(), offsets[1:].tolist())]
    return list(tokenizer.batch_decode(rows, skip_special_tokens=False))


def export_parquet(
    saved: SavedExperience,
    out: str | os.PathLike[str],
    *,
    tokenizer: Any | None = None,
    log_probs: bool = False,
    retired: bool = True,
) -> dict[str, int]:
    """Write one row per stored trajectory (entry-id order: question id, entry id, step collected, age, reward,
    length, bucket, token ids, model tokens; the stored behaviour log-probs, NaN on tool tokens, with
    ``log_probs``; the decoded text with ``tokenizer``), then, with ``retired``, one row per retired question
    (``retired`` true, the step it retired at, no trajectory: retirement drops a question's trajectories, so a
    stored one never belongs to a retired question). One Parquet row group per token batch. Returns the rows
    written."""
    out = pathlib.Path(out)
    arrays = entry_arrays(saved, tokens=False)
    qids = question_ids(saved)
    retired_rows = [[q, s] for q, s in saved.meta.get("retired", [])] if retired else []
    qtype = _question_type(qids + [q for q, _ in retired_rows])
    schema = export_schema(qtype, text=tokenizer is not None, log_probs=log_probs)
    qcol = pa.array([q if qtype == pa.int64() else str(q) for q in qids], type=qtype)
    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{out.name}.tmp-", dir=out.parent)
    os.close(fd)
    tmp = pathlib.Path(tmp_name)
    rows = 0
    try:
        with pq.ParquetWriter(tmp, schema) as writer:
            for start, stop, ids, lps in saved.token_batches():
                lengths = arrays["length"][start:stop]
                offsets = np.zeros(stop - start + 1, dtype=np.int32)
                np.cumsum(lengths, out=offsets[1:])
                bucket = arrays["bucket"][start:stop]
                cols: dict[str, Any] = {
                    "question_id": qcol.take(pa.array(arrays["question"][start:stop])),
                    "entry_id": pa.array(arrays["entry_id"][start:stop]),
                    "step": pa.array(arrays["step"][start:stop]),
                    "age": pa.array(arrays["age"][start:stop]),
                    "reward": pa.array(arrays["reward"][start:stop].astype(np.float32)),
                    "length": pa.array(lengths.astype(np.int32)),
                    "bucket": pa.array(bucket.astype(np.int32), mask=bucket < 0),
                    "retired": pa.array(np.zeros(stop - start, dtype=bool)),
                    "retired_step": pa.nulls(stop - start, pa.int64()),
                    "token_ids": pa.ListArray.from_arrays(pa.array(offsets), pa.array(ids)),
                    "model_tokens": pa.array(
                        np.add.reduceat((~np.isnan(lps)).astype(np.int32), offsets[:-1]).astype(np.int32)
                    ),
                }
                if log_probs:
                    cols["behaviour_log_probs"] = pa.ListArray.from_arrays(pa.array(offsets), pa.array(lps))
                if tokenizer is not None:
                    cols["text"] = pa.array(_decode(tokenizer, ids, offsets), type=pa.string())
                writer.write_table(pa.table(cols, schema=schema))
                rows += stop - start
            if retired_rows:
                n = len(retired_rows)
                cols = {f.name: pa.nulls(n, f.type) for f in schema}
                cols["question_id"] = pa.array(
                    [q if qtype == pa.int64() else str(q) for q, _ in retired_rows], type=qtype
                )
                cols["retired"] = pa.array(np.ones(n, dtype=bool))
                cols["retired_step"] = pa.array([int(s) for _, s in retired_rows], type=pa.int64())
                writer.write_table(pa.table(cols, schema=schema))
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp's file is private (0600); the export is an ordinary output
        os.replace(tmp, out)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return {"trajectories": rows, "retired": len(retired_rows)}


def find_question(saved: SavedExperience, text: str) -> Any:
    """The question id the command line's ``text`` names: a stored id equal to it, or the integer it spells. An id
    that is retired or unknown is an InputError naming it."""
    table = saved.pool.table
    candidates: list[Any] = [text]
    try:
        candidates.append(int(text))
    except ValueError:
        pass
    for q in candidates:
        if table.slots_of(q):
            return q
    retired = dict((q, s) for q, s in saved.meta.get("retired", []))
    for q in candidates:
        if q in retired:
            raise InputError(
                f"question {text!r} retired at step {retired[q]}: its trajectories were dropped then "
                f"(nothing stored to show) in {saved.directory}"
            )
    raise InputError(
        f"question {text!r} is not in the pool {saved.directory} ({saved.pool.num_questions:,} questions with "
        f"stored trajectories, {len(retired):,} retired)"
    )


def show_question(saved: SavedExperience, qid: Any, tokenizer: Any | None = None) -> str:
    """One question's stored trajectories, oldest first: entry id, step collected, age, reward, length and mean
    behaviour log-prob per token, then the decoded text (``tokenizer``) or the token ids."""
    pool = saved.pool
    n = len(pool)
    slots = np.asarray(pool.table.slots_of(qid), dtype=np.int64)  # index-only pool: slots are entry rows 0..n-1
    cols = pool.table.columns
    lengths = cols["length"][:n].astype(np.int64)
    ends = np.cumsum(lengths)
    wanted = {int(s): None for s in slots}
    for start, stop, ids, lps in saved.token_batches(rows=np.sort(slots)):
        first = int(ends[start - 1]) if start else 0
        for s in wanted:
            if start <= s < stop:
                a, b = int(ends[s] - lengths[s]) - first, int(ends[s]) - first
                wanted[s] = (ids[a:b].copy(), lps[a:b].copy())
    mode = reward_mode(saved.meta.get("settings", {}))
    bucket = pool.bucket_of(qid)
    label = "none" if bucket is None else f"{bucket} ({bucket_label(mode, bucket, pool.k)})"
    last = int(pool.writer.last_step)
    lines = [
        f"question {qid!r}: bucket {label}, {len(slots)} stored trajector{'y' if len(slots) == 1 else 'ies'} "
        f"({mode} reward mode, last collect at step {last}) in {saved.directory}"
    ]
    for s in slots.tolist():
        ids, lps = wanted[s]  # type: ignore[misc]
        step, reward = int(cols["step"][s]), float(cols["reward"][s])
        model = ~np.isnan(lps)  # a tool token's stored log-prob is NaN (its loss mask)
        tools = "" if model.all() else f" ({int((~model).sum())} of them tool tokens, masked from the loss)"
        lines.append("")
        lines.append(
            f"--- entry {int(cols['entry_id'][s])}: step {step} (age {last - step}), reward {reward:g}, "
            f"{ids.shape[0]} tokens{tools}, behaviour log-prob per model token "
            f"{float(lps[model].astype(np.float64).mean()):.4f}"
        )
        if tokenizer is not None:
            lines.append(tokenizer.decode(ids.tolist(), skip_special_tokens=False))
        else:
            lines.append("token ids: " + " ".join(str(t) for t in ids.tolist()))
    return "\n".join(lines)
