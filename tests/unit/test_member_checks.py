"""A member's checks against their per-member definitions as they were before they were made cheaper.

``masks.log_prob_defect`` decides a valid trajectory with two reductions (the maximum and the minimum) and
``masks.prepare`` counts a mask's ones once; the definitions they replace are copied below as they were
(``as_mask``, ``trajectory_defect``, ``encode``). On random inputs, with every kind of defect (NaN, +-inf, log-probs
above the bound and at it, masks of no model token, masks that end on a tool token, all-ones masks), the results must
be the same bit for bit: stored log-probs, masked counts, defects and their reasons.
"""

from __future__ import annotations

import numpy as np
import pytest

from exgrpo.experience import masks


# ------------------------------------------------------------------ the per-member definitions, as they were
def ref_as_mask(qid, loss_mask, n):
    if loss_mask is None:
        return None
    m = np.asarray(loss_mask)
    if m.shape != (n,):
        raise ValueError(f"question {qid!r}: the loss mask has shape {m.shape}, the response {n} tokens")
    if m.dtype != np.bool_:
        if m.dtype.kind not in "iuf" or not np.isin(m, (0, 1)).all():
            raise ValueError(f"question {qid!r}: the loss mask must hold 0 and 1 only (1 = a token the model made)")
        m = m.astype(np.bool_)
    return None if bool(m.all()) else m


def ref_trajectory_defect(log_probs, mask):
    if mask is not None:
        if not mask.any():
            return masks.INCONSISTENT, "no token of the trajectory is the model's"
        if not mask[-1]:
            return masks.TRUNCATED, "it ends on a token that is not the model's (cut in a tool response)"
    model = log_probs if mask is None else log_probs[mask]
    bad = ~(np.isfinite(model) & (model <= masks.MAX_LOG_PROB))
    if bad.any():
        value = float(model[np.flatnonzero(bad)[0]])
        return (
            masks.INCONSISTENT,
            f"{int(bad.sum())} of its model tokens have no valid behaviour log-prob (e.g. {value})",
        )
    return None


def ref_encode(log_probs, mask):
    if mask is None:
        return log_probs
    out = np.array(log_probs, dtype=np.float32, copy=True)
    out[~mask] = masks.MASKED_LOG_PROB
    return out


def ref_prepare(qid, loss_mask, lps):
    """What ``member_arrays`` did per member: (stored log-probs, masked count, defect)."""
    mask = ref_as_mask(qid, loss_mask, lps.shape[0])
    defect = ref_trajectory_defect(lps, mask)
    masked = 0 if mask is None else int(mask.shape[0] - np.count_nonzero(mask))
    return ref_encode(lps, mask), masked, defect


# ------------------------------------------------------------------ random members with every kind of defect
BOUND = np.float32(masks.MAX_LOG_PROB)
SPECIAL = np.array(
    [
        np.nan,
        np.inf,
        -np.inf,
        BOUND,  # the bound itself: valid
        np.nextafter(BOUND, np.float32(1)),  # just above: invalid
        np.nextafter(BOUND, np.float32(0)),
        0.0,
        -0.0,
        0.5,
        -3.0e38,  # finite however negative: valid
        np.finfo(np.float32).max,
    ],
    dtype=np.float32,
)


def random_log_probs(rng, n):
    lps = -rng.exponential(0.7, n).astype(np.float32)
    if rng.random() < 0.5:  # a few special values somewhere
        at = rng.integers(0, n, int(rng.integers(1, 4)))
        lps[at] = rng.choice(SPECIAL, at.shape[0])
    return lps


def random_mask(rng, n):
    kind = rng.integers(0, 7)
    if kind <= 1:
        return None
    if kind == 2:
        return np.ones(n, dtype=np.bool_)  # all ones: no mask
    if kind == 3:
        return np.zeros(n, dtype=np.bool_)  # no model token
    mask = rng.random(n) < 0.7
    if kind == 4:
        mask[-1] = False  # cut in a tool turn
    elif kind == 5:
        mask[-1] = True
        mask[: int(rng.integers(0, n))] = True
    return mask


def assert_same(found, expected):
    stored, masked, defect = found
    ref_stored, ref_masked, ref_defect = expected
    assert stored.dtype == np.float32 and stored.shape == ref_stored.shape
    assert stored.tobytes() == ref_stored.tobytes()  # NaN bits included
    assert masked == ref_masked
    assert defect == ref_defect


@pytest.mark.parametrize("seed", range(6))
def test_prepare_matches_the_per_member_definition(seed):
    rng = np.random.default_rng(seed)
    lps, mks = [], []
    for _ in range(200):
        n = int(rng.integers(1, 40))
        lps.append(random_log_probs(rng, n))
        mks.append(random_mask(rng, n))
    expected = [ref_prepare("q", m, a) for a, m in zip(lps, mks, strict=True)]
    for a, m, e in zip(lps, mks, expected, strict=True):
        assert_same(masks.prepare("q", m, a), e)
        assert masks.trajectory_defect(a, masks.as_mask("q", m, a.shape[0])) == e[2]


def test_the_two_reductions_decide_like_the_token_by_token_check():
    rng = np.random.default_rng(7)
    for _ in range(3000):
        n = int(rng.integers(1, 12))
        a = rng.choice(SPECIAL, n) if rng.random() < 0.5 else random_log_probs(rng, n)
        assert masks.log_prob_defect(a) == ref_trajectory_defect(a, None)
        wide = a.astype(np.float64)  # another dtype: the same answers
        assert masks.log_prob_defect(wide) == ref_trajectory_defect(wide, None)
    empty = np.zeros(0, dtype=np.float32)
    assert masks.log_prob_defect(empty) is None


def test_prepare_converts_and_refuses_masks_as_before():
    lps = np.array([-0.1, -0.2, -0.3, -0.4], np.float32)
    for mask in ([1, 0, 0, 1], [1, 1, 1, 1], [0, 0, 0, 0], [1.0, 0.0, 1.0, 1.0], np.array([1, 0, 1, 0], np.uint8)):
        assert_same(masks.prepare("q", mask, lps), ref_prepare("q", mask, lps))
    for bad in ([1, 2, 0, 1], [1, 0], [[1, 1, 1, 1]], ["1", "0", "1", "1"], [0.5, 1, 1, 1]):
        with pytest.raises(ValueError) as expected:
            ref_prepare("q", bad, lps)
        with pytest.raises(ValueError) as found:
            masks.prepare("q", bad, lps)
        assert str(found.value) == str(expected.value)
