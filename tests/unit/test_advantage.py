"""Unit tests for exgrpo.advantage (docs/algorithm.md §7)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from exgrpo.advantage import (
    experience_group_rows,
    group_ids,
    group_relative_advantages,
    token_level_advantages,
)


def test_section7_replay_group_example():
    # Replayed member (reward 1) first, its 7 fresh siblings all fail: A* = 7/8, A_fresh = −1/8.
    adv = group_relative_advantages([1.0] + [0.0] * 7, ["q"] * 8)
    assert adv[0] == pytest.approx(7 / 8)
    np.testing.assert_allclose(adv[1:], -1 / 8)
    assert adv.sum() == pytest.approx(0.0)


def test_mixed_groups_interleaved_and_any_uid_type():
    scores = [1, 0, 1, 1, 0, 0, 1, 0]
    uids = ["a", "b", "a", "b", "a", "c", "b", "c"]
    # a: rewards 1, 1, 0 -> mean 2/3 | b: 0, 1, 1 -> mean 2/3 | c: 0, 0 -> all equal
    expected = [1 / 3, -2 / 3, 1 / 3, 1 / 3, -2 / 3, 0.0, 1 / 3, 0.0]
    np.testing.assert_allclose(group_relative_advantages(scores, uids), expected)
    np.testing.assert_allclose(group_relative_advantages(np.array(scores), np.array(uids, dtype=object)), expected)
    int_uids = [{"a": 10, "b": 7, "c": 99}[u] for u in uids]
    np.testing.assert_allclose(group_relative_advantages(torch.tensor(scores), np.array(int_uids)), expected)


def test_mixed_uid_types_do_not_collide():
    # 1 and "1" are different questions; numpy cannot sort them together.
    adv = group_relative_advantages([1.0, 0.0, 0.0, 0.0], [1, "1", 1, "1"])
    np.testing.assert_allclose(adv, [0.5, 0.0, -0.5, 0.0])


def test_std_division_hand_computed():
    # Group a: 1, 0, 0, 0 -> mean 1/4, unbiased std sqrt((9/16 + 3/16) / 3) = 1/2.
    adv = group_relative_advantages([1, 0, 0, 0, 1, 0], ["a"] * 4 + ["b"] * 2, norm_by_std=True, epsilon=0.0)
    np.testing.assert_allclose(adv[:4], [1.5, -0.5, -0.5, -0.5])
    # Group b: 1, 0 -> mean 1/2, std sqrt(1/2) -> ±(1/2)/sqrt(1/2).
    np.testing.assert_allclose(adv[4:], [0.5 / math.sqrt(0.5), -0.5 / math.sqrt(0.5)])
    eps = group_relative_advantages([1, 0, 0, 0], ["a"] * 4, norm_by_std=True, epsilon=0.5)
    np.testing.assert_allclose(eps, np.array([0.75, -0.25, -0.25, -0.25]) / (0.5 + 0.5))


@pytest.mark.parametrize("norm_by_std", [False, True])
def test_one_member_and_equal_reward_groups_are_exactly_zero(norm_by_std):
    scores = [1.0, 0.1, 0.1, 0.1, 0.0, 0.0, 0.7, 1.0, 0.0]
    uids = ["solo", "eq", "eq", "eq", "zero", "zero", "solo2", "mix", "mix"]
    adv = group_relative_advantages(scores, uids, norm_by_std=norm_by_std, epsilon=1e-6)
    assert np.all(adv[:7] == 0.0)
    assert np.all(np.isfinite(adv))
    assert adv[7] > 0 > adv[8]


def test_matches_a_naive_loop_on_1024_rows():
    rng = np.random.default_rng(0)
    uids = rng.integers(0, 128, size=1024).astype(str)
    scores = rng.integers(0, 2, size=1024).astype(float)
    for norm in (False, True):
        got = group_relative_advantages(scores, uids, norm_by_std=norm)
        expected = np.zeros(1024)
        for u in np.unique(uids):
            idx = np.flatnonzero(uids == u)
            g = scores[idx]
            if len(g) < 2 or g.min() == g.max():
                continue
            expected[idx] = g - g.mean()
            if norm:
                expected[idx] /= g.std(ddof=1) + 1e-6
        np.testing.assert_allclose(got, expected, rtol=1e-12, atol=1e-12)


def test_group_ids_are_dense():
    ids, n = group_ids(["x", "y", "x", "z"])
    assert n == 3 and ids[0] == ids[2] and len({ids[0], ids[1], ids[3]}) == 3
    ids, n = group_ids([])
    assert n == 0 and ids.size == 0


def test_token_level_broadcast():
    mask = torch.tensor([[1, 1, 0], [1, 0, 0], [0, 0, 0]])
    out = token_level_advantages(np.array([0.5, -2.0, 3.0]), mask)
    assert out.dtype == torch.float32
    torch.testing.assert_close(out, torch.tensor([[0.5, 0.5, 0.0], [-2.0, 0.0, 0.0], [0.0, 0.0, 0.0]]))
    out64 = token_level_advantages(torch.tensor([1.0, 2.0, 3.0]), mask.double())
    assert out64.dtype == torch.float64 and out64[1, 0] == 2.0
    with pytest.raises(ValueError, match="row_advantages must have shape"):
        token_level_advantages([1.0, 2.0], mask)


def test_experience_group_rows():
    uids = ["a", "b", "a", "c", "b"]
    got = experience_group_rows(uids, [False, False, True, False, False])
    np.testing.assert_array_equal(got, [True, False, True, False, False])
    np.testing.assert_array_equal(experience_group_rows(uids, np.zeros(5, bool)), np.zeros(5, bool))


def test_input_errors_are_clear():
    with pytest.raises(ValueError, match="scores has 3 rows but uids has 2"):
        group_relative_advantages([1, 0, 1], ["a", "a"])
    with pytest.raises(ValueError, match="scores must be finite"):
        group_relative_advantages([1, float("nan")], ["a", "a"])
    with pytest.raises(ValueError, match="scores must be 1-D"):
        group_relative_advantages(np.zeros((2, 2)), ["a", "a"])
    assert group_relative_advantages([], []).shape == (0,)
