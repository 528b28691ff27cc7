"""The figures of a saved pool: one checkpoint's summary table, and a whole run's evolution across checkpoints.

A summary is computed from what the loader verifies and restores (:func:`~exgrpo.experience.persistence.
open_experience`): the header (settings, bucket lists, retired set, counters, last step) and ``entries.arrow``
(per stored trajectory its question, length, reward and step collected). Only the figures that need the tokens
themselves (the stored behaviour log-probs, and the loss mask stored in them) stream ``tokens.arrow``, one record
batch at a time, through :data:`TOKEN_REDUCTIONS`; ``tokens=False`` leaves the token file unread.

The per-bucket table is a list of :class:`BucketColumn` s over per-entry arrays. A new per-entry figure is one
entry in :data:`TOKEN_REDUCTIONS` (when it comes from the tokens: e.g. a per-token loss mask's count of model
tokens, for multi-turn tool rollouts) and one :class:`BucketColumn` reading it; the text table, the JSON and the
plots pick it up from there.
"""

from __future__ import annotations

import datetime
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from exgrpo.experience.entries import ENTRY_SCHEMA
from exgrpo.experience.persistence import SavedExperience
from exgrpo.experience.storage import TOKEN_SCHEMA
from exgrpo.modes import REWARD_MODES, RewardMode, saved_mode_name

__all__ = [
    "BUCKET_COLUMNS",
    "TOKEN_REDUCTIONS",
    "BucketColumn",
    "PoolSummary",
    "across_row",
    "bucket_axis",
    "bucket_label",
    "bucket_meaning",
    "format_across",
    "format_summary",
    "reward_mode",
    "summarize",
]

#: Bytes per stored token (int32 id + float32 behaviour log-prob) and per entry (the entry columns), as stored.
TOKEN_BYTES = sum(f.type.bit_width // 8 for f in TOKEN_SCHEMA)
ENTRY_BYTES = sum(f.type.bit_width // 8 for f in ENTRY_SCHEMA)


def reward_mode(settings: Mapping[str, Any]) -> str:
    """The reward mode a pool was collected in, from its saved settings (``exgrpo.modes.saved_mode_name``: binary
    pools predate the key). The one place the inspector reads it."""
    return saved_mode_name(settings)


def _wording(mode: str) -> tuple[str, str, str]:
    """How the buckets of ``mode`` read (the mode's ``bucket_wording``); a mode this code does not know (a pool of
    another version) reads as plain bucket numbers."""
    return REWARD_MODES.get(mode, RewardMode).bucket_wording


def bucket_label(mode: str, bucket: int, k: int) -> str:
    """How bucket ``bucket`` of a pool of this mode reads (successes out of K, a reward-spread bucket ...)."""
    return _wording(mode)[0].format(b=bucket, k=k)


def bucket_meaning(mode: str, k: int) -> str:
    """What the buckets of a pool of this mode mean, in one line."""
    return _wording(mode)[1].format(k=k, k_1=k - 1)


def bucket_axis(mode: str) -> str:
    """An axis title for the buckets of this mode."""
    return _wording(mode)[2]


# ------------------------------------------------------------------------------------------------ per entry
#: Per-entry figures computed from the tokens, one streamed pass over ``tokens.arrow``:
#: name -> f(token_ids, behaviour_log_probs, starts) -> one float64 per entry of the batch (``starts``: each entry's
#: first token in the batch's arrays).
#: A multi-turn trajectory's tool tokens are stored with a NaN log-prob (its loss mask, exgrpo.experience.masks):
#: the log-prob figures cover the model's tokens, and ``model_tokens`` counts them.
TOKEN_REDUCTIONS: dict[str, Callable[[np.ndarray, np.ndarray, np.ndarray], np.ndarray]] = {
    "log_prob_sum": lambda ids, lps, starts: np.add.reduceat(np.nan_to_num(lps.astype(np.float64), nan=0.0), starts),
    "model_tokens": lambda ids, lps, starts: np.add.reduceat((~np.isnan(lps)).astype(np.float64), starts),
}


def _token_figures(saved: SavedExperience, n: int, lengths: np.ndarray) -> dict[str, np.ndarray]:
    out = {name: np.zeros(n, dtype=np.float64) for name in TOKEN_REDUCTIONS}
    for start, stop, ids, lps in saved.token_batches():
        seg = lengths[start:stop]
        starts = np.zeros(stop - start, dtype=np.int64)
        np.cumsum(seg[:-1], out=starts[1:])
        for name, fn in TOKEN_REDUCTIONS.items():
            out[name][start:stop] = fn(ids, lps, starts)
    return out


def entry_arrays(saved: SavedExperience, *, tokens: bool = True) -> dict[str, np.ndarray]:
    """Per stored trajectory, in entry-id order: ``entry_id``, ``question`` (index into :func:`question_ids`),
    ``bucket`` (-1 for none), ``length``, ``reward``, ``step`` collected, ``age`` (last collect step − step) and,
    with ``tokens``, every :data:`TOKEN_REDUCTIONS` figure."""
    pool = saved.pool
    n = len(pool)
    cols = pool.table.columns
    qcol = cols["question"][:n].astype(np.int64)
    qbucket = np.full(pool.table.num_question_ids, -1, dtype=np.int64)
    for qi in range(pool.table.num_question_ids):
        b = pool.bucket_of(pool.table.question_id(qi))
        if b is not None:
            qbucket[qi] = b
    out = {
        "entry_id": cols["entry_id"][:n].astype(np.int64),
        "question": qcol,
        "bucket": qbucket[qcol],
        "length": cols["length"][:n].astype(np.int64),
        "reward": cols["reward"][:n].astype(np.float64),
        "step": cols["step"][:n].astype(np.int64),
    }
    out["age"] = int(pool.writer.last_step) - out["step"]
    if tokens:
        out.update(_token_figures(saved, n, out["length"]))
    return out


def question_ids(saved: SavedExperience) -> list[Any]:
    """The question table: ``entry_arrays(...)["question"]`` indexes it."""
    table = saved.pool.table
    return [table.question_id(i) for i in range(table.num_question_ids)]


# ------------------------------------------------------------------------------------------------ columns
def _stat(values: np.ndarray, how: str) -> float | None:
    if values.shape[0] == 0:
        return None
    if how == "mean":
        return float(values.mean())
    if how == "median":
        return float(np.median(values))
    if how == "min":
        return float(values.min())
    return float(values.max())


def _log_prob_per_token(a: Mapping[str, np.ndarray]) -> float | None:
    """The stored behaviour log-prob per model token (tool tokens have none)."""
    if "log_prob_sum" not in a or a["model_tokens"].sum() == 0:
        return None
    return float(a["log_prob_sum"].sum() / a["model_tokens"].sum())


def _tool_tokens(a: Mapping[str, np.ndarray]) -> int | None:
    """Tokens of the stored trajectories that are not the model's (tool outputs, masked from the loss)."""
    if "model_tokens" not in a:
        return None
    return int(a["length"].sum() - round(float(a["model_tokens"].sum())))


@dataclass(frozen=True)
class BucketColumn:
    """One column of the per-bucket table: ``key`` (JSON), ``title`` (text table), ``fmt`` for a value, and the
    figure from the bucket's per-entry arrays (None when there is nothing to show)."""

    key: str
    title: str
    fmt: str
    figure: Callable[[Mapping[str, np.ndarray]], float | int | None]
    #: shown in the text table only when some row has a value other than 0 (a figure most pools do not have)
    optional: bool = False


BUCKET_COLUMNS: list[BucketColumn] = [
    BucketColumn("questions", "questions", "{:,.0f}", lambda a: int(np.unique(a["question"]).shape[0])),
    BucketColumn("trajectories", "trajectories", "{:,.0f}", lambda a: int(a["length"].shape[0])),
    BucketColumn("tokens", "tokens", "{:,.0f}", lambda a: int(a["length"].sum())),
    BucketColumn("length_mean", "len mean", "{:.1f}", lambda a: _stat(a["length"], "mean")),
    BucketColumn("length_median", "len median", "{:.1f}", lambda a: _stat(a["length"], "median")),
    BucketColumn("length_max", "len max", "{:.0f}", lambda a: _stat(a["length"], "max")),
    BucketColumn("age_mean", "age mean", "{:.2f}", lambda a: _stat(a["age"], "mean")),
    BucketColumn("age_max", "age max", "{:.0f}", lambda a: _stat(a["age"], "max")),
    BucketColumn("reward_mean", "reward mean", "{:.3f}", lambda a: _stat(a["reward"], "mean")),
    BucketColumn("tool_tokens", "tool tokens", "{:,.0f}", _tool_tokens, optional=True),
    BucketColumn("log_prob_mean", "log-prob/token", "{:.4f}", _log_prob_per_token),
]


def _subset(arrays: Mapping[str, np.ndarray], mask: np.ndarray) -> dict[str, np.ndarray]:
    return {name: a[mask] for name, a in arrays.items()}


def _distribution(values: np.ndarray) -> dict[str, float | None]:
    return {how: _stat(values, how) for how in ("mean", "min", "median", "max")}


# ------------------------------------------------------------------------------------------------ summary
@dataclass
class PoolSummary:
    """The figures of one saved pool. ``figures`` is what ``--json`` prints; ``arrays`` the per-entry arrays the
    plots draw from (not printed)."""

    figures: dict[str, Any]
    arrays: dict[str, np.ndarray] = field(repr=False)

    def to_json(self) -> dict[str, Any]:
        return self.figures


def _checkpoint_step(saved: SavedExperience) -> int | None:
    state = saved.header.get("extra", {}).get("trainer_state", {})
    step = state.get("global_steps") if isinstance(state, dict) else None
    return step if isinstance(step, int) else None


def summarize(saved: SavedExperience, *, tokens: bool = True) -> PoolSummary:
    """Every figure of the summary table (module docstring); ``tokens=False`` skips the pass over the token file
    (the log-prob column is then None)."""
    pool, meta = saved.pool, saved.meta
    k = pool.k
    mode = reward_mode(meta.get("settings", {}))
    arrays = entry_arrays(saved, tokens=tokens)
    n = int(arrays["length"].shape[0])
    per_question = np.bincount(arrays["question"], minlength=pool.table.num_question_ids)
    per_question = per_question[per_question > 0]
    buckets = []
    for b in [*range(k), -1]:
        mask = arrays["bucket"] == b
        if b == -1 and not mask.any():  # entries of a question in no bucket: never in a pool the rules built
            continue
        sub = _subset(arrays, mask)
        row: dict[str, Any] = {"bucket": b, "label": "none" if b == -1 else bucket_label(mode, b, k)}
        row.update({c.key: c.figure(sub) for c in BUCKET_COLUMNS})
        if b >= 0:  # the header's bucket lists count the questions (equal to the entries' count: the invariant)
            row["questions"] = pool.buckets.size(b)
        buckets.append(row)
    total: dict[str, Any] = {"bucket": None, "label": "all"}
    total.update({c.key: c.figure(arrays) for c in BUCKET_COLUMNS})
    total["questions"] = pool.num_questions
    files = saved.file_bytes()
    saved_at = saved.header.get("saved_at")
    figures: dict[str, Any] = {
        "pool": str(saved.directory),
        "step": _checkpoint_step(saved),
        "last_step": int(pool.writer.last_step),
        "saved_at": (
            datetime.datetime.fromtimestamp(saved_at, datetime.timezone.utc).isoformat(timespec="seconds")
            if isinstance(saved_at, (int, float)) and math.isfinite(saved_at)
            else None
        ),
        "reward_mode": mode,
        "k": k,
        "bucket_meaning": bucket_meaning(mode, k),
        "questions": pool.num_questions,
        "trajectories": n,
        "tokens": int(pool.total_tokens),
        "retired": len(pool.retired),
        "memory_bytes": TOKEN_BYTES * int(pool.total_tokens) + ENTRY_BYTES * n,
        "disk_bytes": sum(files.values()),
        "entries_per_question": _distribution(per_question),
        "length": _distribution(arrays["length"]),
        "age": _distribution(arrays["age"]),
        "tool_tokens": _tool_tokens(arrays),
        "log_prob_mean": _log_prob_per_token(arrays) if tokens else None,
        "tokens_read": tokens,
        "counters": dict(pool.counters),
        "settings": dict(meta.get("settings", {})),
        "buckets": buckets,
        "total": total,
    }
    return PoolSummary(figures, arrays)


def _fmt(value: Any, fmt: str) -> str:
    if value is None:
        return "-"
    return fmt.format(value)


def _dist_text(d: Mapping[str, float | None], fmt: str = "{:.2f}") -> str:
    if d["mean"] is None:
        return "none"
    return f"mean {fmt.format(d['mean'])}, min {d['min']:g}, median {d['median']:g}, max {d['max']:g}"


def format_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """A plain text table: first column left-aligned, the others right-aligned."""
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    lines = []
    for r in [header, *rows]:
        cells = [str(r[0]).ljust(widths[0])] + [str(c).rjust(w) for c, w in zip(r[1:], widths[1:])]
        lines.append("  ".join(cells).rstrip())
    return "\n".join(lines)


def format_summary(summary: PoolSummary) -> str:
    """The summary as text: the pool's figures, one per line, then the per-bucket table."""
    f = summary.figures
    step = f"step {f['step']}" if f["step"] is not None else "no trainer step recorded"
    counters = ", ".join(f"{name} {value:,}" for name, value in f["counters"].items())
    lp = f["log_prob_mean"]
    when = f", {f['saved_at']}" if f["saved_at"] else ""
    lines = [
        f"pool          {f['pool']}",
        f"saved         {step}, last collect at step {f['last_step']}{when}",
        f"reward mode   {f['reward_mode']}: {f['bucket_meaning']}",
        f"questions     {f['questions']:,} with stored trajectories, {f['retired']:,} retired",
        f"trajectories  {f['trajectories']:,} (per question: {_dist_text(f['entries_per_question'])})",
        f"tokens        {f['tokens']:,} (response length: {_dist_text(f['length'])})"
        + (f"; {f['tool_tokens']:,} of them tool tokens (masked from the loss)" if f["tool_tokens"] else ""),
        f"memory        {f['memory_bytes']:,} B of tokens and entry columns ({TOKEN_BYTES} B/token, {ENTRY_BYTES} "
        f"B/entry), {f['disk_bytes']:,} B on disk",
        f"age           steps since collected: {_dist_text(f['age'])}",
        "log-prob      stored behaviour log-prob per model token: "
        + (f"{lp:.4f}" if lp is not None else ("none" if f["tokens_read"] else "not read (--no-tokens)")),
        f"counters      {counters}",
        "",
    ]
    table_rows = [*f["buckets"], f["total"]]
    shown = [c for c in BUCKET_COLUMNS if not c.optional or any(r[c.key] for r in table_rows)]
    header = ["bucket", *(c.title for c in shown)]
    rows = [[r["label"], *(_fmt(r[c.key], c.fmt) for c in shown)] for r in table_rows]
    lines.append(format_table(header, rows))
    return "\n".join(lines)


# ------------------------------------------------------------------------------------------------ across a run
def across_row(step: int, saved: SavedExperience) -> dict[str, Any]:
    """The figures of one checkpoint in a run's evolution, from the header and entry table only (no tokens)."""
    pool = saved.pool
    return {
        "step": step,
        "pool": str(saved.directory),
        "reward_mode": reward_mode(saved.meta.get("settings", {})),
        "k": pool.k,
        "questions": pool.num_questions,
        "trajectories": len(pool),
        "tokens": int(pool.total_tokens),
        "retired": len(pool.retired),
        "buckets": pool.buckets.sizes(),
    }


def format_across(rows: Sequence[Mapping[str, Any]], skipped: Sequence[int] = ()) -> str:
    k = max((r["k"] for r in rows), default=0)
    mode = rows[0]["reward_mode"] if rows else "binary"
    header = ["step", "trajectories", "tokens", "questions", "retired", *(bucket_label(mode, b, k) for b in range(k))]
    table = [
        [
            str(r["step"]),
            f"{r['trajectories']:,}",
            f"{r['tokens']:,}",
            f"{r['questions']:,}",
            f"{r['retired']:,}",
            *(f"{v:,}" for v in [*r["buckets"], *[0] * (k - len(r["buckets"]))]),
        ]
        for r in rows
    ]
    out = f"questions per bucket ({bucket_meaning(mode, k)}), by checkpoint\n" + format_table(header, table)
    if skipped:
        out += f"\ncheckpoints without a pool (skipped): steps {', '.join(str(s) for s in skipped)}"
    return out
