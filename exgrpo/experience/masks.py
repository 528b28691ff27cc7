"""The loss mask of a stored trajectory, encoded in its behaviour log-probs (docs/experience.md, "Loss masks").

A multi-turn trajectory (the model's turns and the tool outputs between them) has a loss mask: 1 on the tokens the
policy generated, 0 on the others (a tool's response and the chat template's turn boundaries around it). Only the
first kind has a behaviour log-prob, and only they are trained. The pool stores the mask *inside* the float32
log-prob column: a masked token's stored log-prob is NaN, a value no log-prob takes (log-probs are finite and
<= 0). So a trajectory without masked tokens is stored exactly as before (every token the model's: no NaN, the
same bytes), a mask costs no byte, and the conversion happens at the pool's boundary only:

* in: :func:`encode` (the writer, from a member's mask and log-probs) after :func:`trajectory_defect` checked that
  the two agree (every model token has a finite log-prob <= :data:`MAX_LOG_PROB`);
* out: :func:`decode` (a :class:`~exgrpo.experience.records.Candidate`: the boolean mask and clean log-probs, 0.0 on
  masked tokens, which is what verl's agent loop puts there);
* on disk: the saved file holds the NaNs; the header records the encoding (:data:`ENCODING`) and the count of
  masked tokens, checked against the file on load.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from itertools import compress, repeat
from operator import is_not, not_
from typing import Any

import numpy as np

__all__ = [
    "DEFECTS",
    "ENCODING",
    "INCONSISTENT",
    "MASKED_LOG_PROB",
    "MAX_LOG_PROB",
    "TRUNCATED",
    "as_mask",
    "bool_mask",
    "count_masked",
    "decode",
    "encode",
    "log_prob_defect",
    "prepare",
    "prepare_many",
    "trajectory_defect",
]

#: the header's name of this encoding (the token file's ``loss_mask.encoding``)
ENCODING = "nan_behaviour_log_prob"
#: the stored log-prob of a masked token (a quiet NaN; its bits are what the file holds)
MASKED_LOG_PROB = np.float32(np.nan)
#: a model token's behaviour log-prob may exceed 0 by float rounding (log-softmax in bf16 or fused kernels), not more
MAX_LOG_PROB = 1e-3
#: why a trajectory is not stored: its mask and log-probs disagree ...
INCONSISTENT = "inconsistent"
#: ... or the exchange was cut in a tool turn (mid tool call, mid tool response, a call that got no answer)
TRUNCATED = "truncated"
DEFECTS = (INCONSISTENT, TRUNCATED)


def as_mask(qid: Any, loss_mask: Any, n: int) -> np.ndarray | None:
    """``loss_mask`` as a bool array of ``n`` (True = a token the policy generated), or None when every token is the
    model's (None given, or all ones). ValueError naming the question for a wrong shape or values other than 0/1."""
    if loss_mask is None:
        return None
    m = bool_mask(qid, loss_mask, n)
    return None if bool(m.all()) else m


def bool_mask(qid: Any, loss_mask: Any, n: int) -> np.ndarray:
    """``loss_mask`` (not None) as a bool array of ``n``, checked as :func:`as_mask` does (all ones included)."""
    m = np.asarray(loss_mask)
    if m.shape != (n,):
        raise ValueError(f"question {qid!r}: the loss mask has shape {m.shape}, the response {n} tokens")
    if m.dtype != np.bool_:
        if m.dtype.kind not in "iuf" or not np.isin(m, (0, 1)).all():
            raise ValueError(f"question {qid!r}: the loss mask must hold 0 and 1 only (1 = a token the model made)")
        m = m.astype(np.bool_)
    return m


def trajectory_defect(log_probs: np.ndarray, mask: np.ndarray | None) -> tuple[str, str] | None:
    """Why a trajectory must not be stored, as (one of :data:`DEFECTS`, the reason in words), or None.

    ``mask`` from :func:`as_mask`. :data:`INCONSISTENT`: no token is the model's, or a model token's log-prob is not
    a finite value <= :data:`MAX_LOG_PROB` (the log-prob of a token the model did not sample, or a broken pass; a
    NaN would also read as a masked token). :data:`TRUNCATED`: the trajectory ends on a masked token, i.e. the
    exchange was cut in a tool's response and no model turn follows it.
    """
    if mask is not None:
        if not mask.any():
            return INCONSISTENT, _NO_MODEL_TOKEN
        if not mask[-1]:
            return TRUNCATED, _ENDS_MASKED
    return log_prob_defect(log_probs if mask is None else log_probs[mask])


_NO_MODEL_TOKEN = "no token of the trajectory is the model's"
_ENDS_MASKED = "it ends on a token that is not the model's (cut in a tool response)"
_max, _min = np.maximum.reduce, np.minimum.reduce


def log_prob_defect(model: np.ndarray) -> tuple[str, str] | None:
    """:data:`INCONSISTENT` with its reason when one of the model tokens' log-probs ``model`` is not a finite value
    <= :data:`MAX_LOG_PROB`, else None (:func:`trajectory_defect` without the mask's own checks).

    Two reductions decide the common case, a valid trajectory: the maximum is NaN when any value is (NaN propagates)
    and exceeds the bound for +inf or any value above it, the minimum is -inf when any value is; only a trajectory
    that fails them is looked at token by token (for the count and the example in the reason).
    """
    if not model.size or (_max(model, axis=None) <= MAX_LOG_PROB and _min(model, axis=None) > -np.inf):
        return None
    bad = ~(np.isfinite(model) & (model <= MAX_LOG_PROB))
    if bad.any():
        value = float(model[np.flatnonzero(bad)[0]])
        return INCONSISTENT, f"{int(bad.sum())} of its model tokens have no valid behaviour log-prob (e.g. {value})"
    return None


def prepare(qid: Any, loss_mask: Any, log_probs: np.ndarray) -> tuple[np.ndarray, int, tuple[str, str] | None]:
    """One member's log-probs as the pool stores them (float32 ``log_probs`` of a 1-D response): (the stored
    log-probs, :func:`encode`'s; the count of masked tokens; :func:`trajectory_defect`'s finding), with
    :func:`as_mask`'s checks and errors. The same as those three functions in a row, with fewer passes over the
    mask (one count of its ones says whether it is all ones, has none, and how many tokens it masks)."""
    if loss_mask is None:
        return log_probs, 0, log_prob_defect(log_probs)
    n = log_probs.shape[0]
    mask = bool_mask(qid, loss_mask, n)
    model = int(np.count_nonzero(mask))
    if model == n:  # all ones: no mask (as_mask gives None)
        return log_probs, 0, log_prob_defect(log_probs)
    if model == 0:
        defect: tuple[str, str] | None = (INCONSISTENT, _NO_MODEL_TOKEN)
    elif not mask[-1]:
        defect = (TRUNCATED, _ENDS_MASKED)
    else:
        defect = log_prob_defect(log_probs[mask])
    return encode(log_probs, mask), n - model, defect


def prepare_many(
    log_probs: Sequence[np.ndarray],
    loss_masks: Sequence[np.ndarray | None] | None,
    *,
    stage: Callable[..., np.ndarray | None] | None = None,
    lengths: np.ndarray | None = None,
) -> tuple[list[np.ndarray], list[int], list[tuple[str, str] | None]]:
    """:func:`prepare` of many members at once, column by column: per member the same stored log-probs, masked
    count and defect, from a constant number of numpy calls for all of them instead of a few per member (what
    checking a collect call's members costs is mostly the calls, not the arithmetic).

    Each of ``log_probs`` must be a 1-D float32 array and each of ``loss_masks`` None or what :func:`bool_mask` gives
    for it (the caller has converted and checked them, as :func:`prepare`'s caller does); ``loss_masks`` None: none
    has a mask. ``lengths``: the arrays' lengths (int64), when the caller has them. The stored log-probs are
    the member's own array where :func:`prepare` gives it (no mask, or all ones), else a view into one new array
    that holds the encoded log-probs of all the masked members.

    ``stage``: a token storage's :meth:`~exgrpo.experience.storage.TokenStorage.stage`, given the stored log-probs
    of the non-empty members in order, their lengths and the check of their bounds, which it calls on each block it
    writes; the checks then read them where it wrote them (instead of a copy of their own), and a store that finds
    them there in place does not copy them again. The masked members' log-probs are checked and encoded in blocks
    of :data:`_MASKED_BLOCK_TOKENS` tokens.
    """
    n_members = len(log_probs)
    stored = list(log_probs)  # per member what is stored: its own array, or (below) its encoded log-probs
    counts = [0] * n_members
    defects: list[tuple[str, str] | None] = [None] * n_members
    if lengths is None:
        lengths = _lengths(stored)
    if loss_masks is None or not any(map(is_not, loss_masks, repeat(None))):
        loss_masks = [None] * n_members
        if lengths.all():  # the common call: no mask, no empty array
            if n_members:
                valid = _staged_bounds(stored, lengths, stage)
                if not all(valid):
                    for i in compress(range(n_members), map(not_, valid)):
                        defects[i] = log_prob_defect(stored[i])
            return stored, counts, defects
    if lengths.all():
        members: Sequence[int] = range(n_members)
        masked = [i for i, x in enumerate(loss_masks) if x is not None]
    else:  # prepare's answer for no token: nothing to check (a segment of reduceat is never empty)
        members = [i for i, n in enumerate(lengths.tolist()) if n]
        masked = [i for i in members if loss_masks[i] is not None]
    if masked:  # in blocks of about _MASKED_BLOCK_TOKENS tokens: each block's passes read what the cache holds
        ends = np.cumsum(lengths[masked])
        cuts = np.searchsorted(ends, np.arange(_MASKED_BLOCK_TOKENS, int(ends[-1]), _MASKED_BLOCK_TOKENS))
        bounds = [0, *sorted(set(cuts.tolist()) - {0}), len(masked)]
        for first, stop in zip(bounds[:-1], bounds[1:]):
            _encode_masked(masked[first:stop], log_probs, loss_masks, lengths, stored, counts, defects)
    if members:
        arrays = stored if len(members) == n_members else [stored[i] for i in members]
        sizes = lengths if len(members) == n_members else lengths[members]
        if len(masked) < len(members):  # the bounds of the members without a mask (and the staging)
            for i in compress(members, map(not_, _staged_bounds(arrays, sizes, stage))):  # type: ignore[arg-type]
                if loss_masks[i] is None:  # (a masked member's NaNs fail the bounds: it was looked at above)
                    defects[i] = log_prob_defect(log_probs[i])
        elif stage is not None:
            stage(arrays, sizes)  # type: ignore[arg-type]
    return stored, counts, defects


def _encode_masked(
    masked: list[int],
    log_probs: Sequence[np.ndarray],
    loss_masks: Sequence[np.ndarray | None],
    lengths: np.ndarray,
    stored: list[np.ndarray],
    counts: list[int],
    defects: list[tuple[str, str] | None],
) -> None:
    """:func:`prepare` of the members ``masked`` (non-empty, each with a mask), into ``stored``, ``counts`` and
    ``defects`` (indexed like ``log_probs``)."""
    arrays = [log_probs[i] for i in masked]
    given = [loss_masks[i] for i in masked]
    values = np.concatenate(arrays)
    keep = np.concatenate(given, dtype=np.int32)  # 1 on the model's tokens
    starts, ends = _segments(lengths[masked])
    model_tokens = np.add.reduceat(keep, starts, dtype=np.int32).tolist()  # (int64 would cast every one)
    ends_on_model = keep[ends - 1].tolist()
    # The bounds on every token: the masked ones hold log-probs as well (the trainer's pass computes them), so a
    # member within them has its model tokens within them; one that is not is looked at token by token below.
    rough = _bounds_ok(values, starts)
    # The encoding, in place, in the one copy of the members' log-probs, on their bits (whole-array integer
    # operations, where a boolean assignment costs several times as much): all bits set on the masked tokens, then
    # flipped to MASKED_LOG_PROB's.
    np.subtract(keep, 1, out=keep)  # 0 on the model's tokens, all bits set on the masked ones
    bits = values.view(np.int32)
    np.bitwise_or(bits, keep, out=bits)
    np.bitwise_and(keep, ~_MASKED_BITS, out=keep)
    np.bitwise_xor(bits, keep, out=bits)
    for k, (i, a, m, start, end) in enumerate(zip(masked, arrays, given, starts.tolist(), ends.tolist())):
        n, model = end - start, model_tokens[k]
        if model == n:  # all ones: no mask (prepare stores the array itself)
            if not rough[k]:
                defects[i] = log_prob_defect(a)
            continue
        if model == 0:
            defects[i] = (INCONSISTENT, _NO_MODEL_TOKEN)
        elif not ends_on_model[k]:
            defects[i] = (TRUNCATED, _ENDS_MASKED)
        elif not rough[k]:
            defects[i] = log_prob_defect(a[m])  # type: ignore[index]
        stored[i], counts[i] = values[start:end], n - model


#: masked members' tokens per block of prepare_many's passes (~10 passes over 4-byte values: 256 KB a block)
_MASKED_BLOCK_TOKENS = 1 << 16
#: the bits of MASKED_LOG_PROB, as an int32
_MASKED_BITS = MASKED_LOG_PROB.view(np.int32)


def _lengths(arrays: Sequence[np.ndarray]) -> np.ndarray:
    return np.fromiter(map(len, arrays), dtype=np.int64, count=len(arrays))  # 1-D arrays


def _segments(lengths: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The starts and ends of consecutive segments of ``lengths`` tokens."""
    ends = np.cumsum(lengths)
    return ends - lengths, ends


def _staged_bounds(
    arrays: list[np.ndarray], lengths: np.ndarray, stage: Callable[..., np.ndarray | None] | None
) -> list[bool]:
    """:func:`_bounds_ok` of each of ``arrays`` (non-empty): read where ``stage`` writes them (for the first ones, or
    all; block by block, while the cache holds them), the others from a copy of their own."""
    starts, ends = _segments(lengths)
    hi = np.empty(len(arrays), dtype=np.float32)
    lo = np.empty(len(arrays), dtype=np.float32)

    def check(first: int, stop: int, written: np.ndarray) -> None:
        at = starts[first:stop] - starts[first]
        np.maximum.reduceat(written, at, out=hi[first:stop])
        np.minimum.reduceat(written, at, out=lo[first:stop])

    staged = None if stage is None else stage(arrays, lengths, check)
    n = 0 if staged is None else int(np.searchsorted(ends, staged.shape[0], side="right"))
    if n < len(arrays):
        check(n, len(arrays), np.concatenate(arrays[n:]))
    return ((hi <= MAX_LOG_PROB) & (lo > -np.inf)).tolist()


def _bounds_ok(values: np.ndarray, starts: np.ndarray) -> list[bool]:
    """Per segment of ``values`` (from each of ``starts``, increasing, to the next; none empty): whether
    :func:`log_prob_defect`'s two reductions pass on it."""
    return (
        (np.maximum.reduceat(values, starts) <= MAX_LOG_PROB) & (np.minimum.reduceat(values, starts) > -np.inf)
    ).tolist()


def encode(log_probs: np.ndarray, mask: np.ndarray | None) -> np.ndarray:
    """The float32 log-probs to store: NaN on the masked tokens (a copy), the array itself without a mask."""
    if mask is None:
        return log_probs
    out = np.array(log_probs, dtype=np.float32, copy=True)
    out[~mask] = MASKED_LOG_PROB
    return out


def decode(stored: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
    """(clean log-probs, mask) of stored log-probs: 0.0 and False where a NaN marks a masked token. Without one, the
    array itself and None (every token the model's)."""
    masked = np.isnan(stored)
    if not masked.any():
        return stored, None
    return np.where(masked, np.float32(0.0), stored).astype(np.float32, copy=False), ~masked


def count_masked(stored: np.ndarray) -> int:
    """Masked tokens (NaN log-probs) in stored log-probs."""
    return int(np.count_nonzero(np.isnan(stored)))
