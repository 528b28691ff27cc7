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
from itertools import repeat
from operator import is_not
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
try:  # the C function behind np.count_nonzero, without its dispatch layer: a collect call counts each masked member
    from numpy._core.multiarray import count_nonzero as _count_nonzero
except ImportError:  # another numpy layout: the public function (the same counts)
    _count_nonzero = np.count_nonzero


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
    the member's own array where :func:`prepare` gives it (no mask, or all ones), else a view of its encoded
    log-probs: where ``stage`` wrote them, or in one new array.

    The members' log-probs are written once, block by block (about :data:`_MASKED_BLOCK_TOKENS` tokens, so that each
    block's passes read what the cache holds), and each block, right after it is written, gets the bounds of
    :func:`log_prob_defect` on every token (a masked member's tool tokens hold log-probs too: the trainer's pass
    computes them) and, where it holds masked members, their masks' counts and the NaN encoding in place.
    ``stage``: a token storage's :meth:`~exgrpo.experience.storage.TokenStorage.stage`, given the log-probs of the
    non-empty members in order, their lengths and that per-block work: the members it writes where they will be
    stored are checked and encoded there (and it is told which of them are stored as the encoded views), the others
    in a new array.
    """
    n_members = len(log_probs)
    stored = list(log_probs)  # per member what is stored: its own array, or (below) a view of its encoded log-probs
    defects: list[tuple[str, str] | None] = [None] * n_members
    if lengths is None:
        lengths = _lengths(stored)
    if loss_masks is not None and not any(map(is_not, loss_masks, repeat(None))):
        loss_masks = None
    if not n_members:
        return stored, [], defects
    if lengths.all():  # the common call: no empty array
        members: Sequence[int] = range(n_members)
        arrays, sizes, given = log_probs, lengths, loss_masks
    else:  # prepare's answer for no token: nothing to check (a segment of reduceat is never empty)
        members = [i for i, n in enumerate(lengths.tolist()) if n]
        arrays, sizes = [log_probs[i] for i in members], lengths[members]
        given = None if loss_masks is None else [loss_masks[i] for i in members]
        if not members:
            return stored, [0] * n_members, defects
    found = _Checks(arrays, sizes, given)
    view = None if stage is None else stage(arrays, sizes, found.check)
    found.rest(0 if view is None else view.shape[0])
    masked_count = (sizes - found.model).tolist()  # 0 without a mask (model = its length)
    if len(members) == n_members:
        counts = masked_count
    else:
        counts = [0] * n_members
        for k, i in enumerate(members):
            counts[i] = masked_count[k]
    if len(members) == n_members:
        stored = found.stored
    else:
        for k, i in enumerate(members):
            stored[i] = found.stored[k]
    for k in found.unusual():  # the members that may have a defect: member by member, as prepare finds it
        i, a, mask = members[k], arrays[k], None if given is None else given[k]
        model, n = int(found.model[k]), int(sizes[k])
        if mask is None or model == n:  # no mask, or all ones: the bounds of every token
            if found.bad[k]:
                defects[i] = log_prob_defect(a)
        elif model == 0:
            defects[i] = (INCONSISTENT, _NO_MODEL_TOKEN)
        elif not found.last[k]:
            defects[i] = (TRUNCATED, _ENDS_MASKED)
        elif found.bad[k]:
            defects[i] = log_prob_defect(a[mask])
    return stored, counts, defects


class _Checks:
    """:func:`prepare_many`'s per-block work on the members ``arrays`` (non-empty; ``sizes`` tokens each, ``given``
    their masks or None): :meth:`check` on each block where it is written (by a storage's ``stage`` or by
    :meth:`rest`), which finds per member whether its log-probs fail the bounds (``bad``), its model tokens
    (``model``), whether it ends on one (``last``) and, for a masked one, encodes it in place (``stored``: per member
    its own array, or the view of its encoded log-probs for those :func:`prepare` encodes)."""

    def __init__(self, arrays: Sequence[np.ndarray], sizes: np.ndarray, given: Sequence[np.ndarray | None] | None):
        self.arrays, self.sizes, self.given = arrays, sizes, given
        self.starts, self.ends = _segments(sizes)
        m = len(arrays)
        self.bad = np.zeros(m, dtype=np.bool_)
        self.model = sizes.copy()  # every token the model's until a mask says otherwise
        self.last = np.ones(m, dtype=np.bool_)
        self.stored = list(arrays)
        self._ones: np.ndarray | None = None  # the mask of a member without one, in a block with masked members
        self._size_list: list[int] | None = None
        self._other: np.ndarray | None = None  # a block's tokens that are not the model's

    def check(self, first: int, stop: int, written: np.ndarray) -> list[np.ndarray] | None:
        """The work on members first..stop-1, whose log-probs ``written`` holds (concatenated, writable); returns
        what is to be stored for them where it encoded some (views of ``written``), else None."""
        at = self.starts[first:stop] - self.starts[first]
        # the bounds, on the whole block first: a block within them has every member within them
        if not (_max(written, axis=None) <= MAX_LOG_PROB and _min(written, axis=None) > -np.inf):
            hi, lo = np.maximum.reduceat(written, at), np.minimum.reduceat(written, at)
            self.bad[first:stop] = ~((hi <= MAX_LOG_PROB) & (lo > -np.inf))
        if self.given is None:
            return None
        masks = self.given[first:stop]
        if not any(map(is_not, masks, repeat(None))):
            return None
        if self._size_list is None:
            self._size_list = self.sizes.tolist()
            self._ones = np.ones(max(self._size_list), dtype=np.bool_)
        sizes = self._size_list[first:stop]
        ones = self._ones
        if self._other is None or self._other.shape[0] < written.shape[0]:  # one buffer for every block of the call
            self._other = np.empty(written.shape[0], dtype=np.bool_)
        other = self._other[: written.shape[0]]
        np.concatenate([ones[:n] if mask is None else mask for mask, n in zip(masks, sizes)], out=other)  # type: ignore[index]
        np.logical_not(other, out=other)  # True on the tokens that are not the model's
        np.copyto(written, MASKED_LOG_PROB, where=other)  # the encoding, in place (a member without any: as it was)
        self.last[first:stop] = ~other[at + self.sizes[first:stop] - 1]
        model = [n if mask is None else _count_nonzero(mask) for mask, n in zip(masks, sizes)]
        self.model[first:stop] = model
        out = [  # a member without masked tokens (no mask, or all ones): its own array
            written[a : a + n] if m != n else array
            for array, a, n, m in zip(self.arrays[first:stop], at.tolist(), sizes, model)
        ]
        self.stored[first:stop] = out
        return out

    def rest(self, written: int) -> None:
        """:meth:`check` the members after the first ``written`` tokens (a storage's staging took those) in a new
        array of their own, block by block."""
        ends = self.ends
        first = int(np.searchsorted(ends, written, side="right"))
        m = len(self.arrays)
        if first >= m:
            return
        base = int(ends[first - 1]) if first else 0
        values = np.empty(int(ends[-1]) - base, dtype=np.float32)
        cuts = np.searchsorted(ends, np.arange(base + _MASKED_BLOCK_TOKENS, int(ends[-1]), _MASKED_BLOCK_TOKENS))
        bounds = [first, *sorted(set(cuts.tolist()) - {first}), m]
        for a, b in zip(bounds[:-1], bounds[1:]):
            lo = int(ends[a - 1]) if a else 0
            block = values[lo - base : int(ends[b - 1]) - base]
            np.concatenate(self.arrays[a:b], out=block)
            self.check(a, b, block)

    def unusual(self) -> list[int]:
        """The members that may have a defect: outside the bounds, or masked without a model token or not ending on
        one."""
        odd = self.bad | ~self.last | (self.model == 0)
        return np.flatnonzero(odd).tolist()


#: tokens per block of prepare_many's passes where it writes the log-probs itself (256 KB of log-probs a block)
_MASKED_BLOCK_TOKENS = 1 << 16


def _lengths(arrays: Sequence[np.ndarray]) -> np.ndarray:
    return np.fromiter(map(len, arrays), dtype=np.int64, count=len(arrays))  # 1-D arrays


def _segments(lengths: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The starts and ends of consecutive segments of ``lengths`` tokens."""
    ends = np.cumsum(lengths)
    return ends - lengths, ends


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
