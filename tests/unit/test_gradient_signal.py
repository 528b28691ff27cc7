"""group_signal_metrics on hand-made rewards, uids and replay masks (K = 4 groups unless stated)."""

from __future__ import annotations

import numpy as np
import pytest

from exgrpo.advantage import group_relative_advantages
from exgrpo.gradient_signal import group_signal_metrics

P = "exgrpo/signal/"


def _metrics(scores, uids, replay):
    scores = np.asarray(scores, dtype=float)
    adv = group_relative_advantages(scores, uids)
    return group_signal_metrics(scores, uids, np.asarray(replay, dtype=bool), adv)


def test_on_policy_batch_counts_failed_solved_and_mixed_fresh_groups():
    # a: 0/4 (no gradient), b: 4/4 (no gradient), c: 2/4 (gradient), d: 0/4 (no gradient)
    scores = [0, 0, 0, 0] + [1, 1, 1, 1] + [1, 0, 1, 0] + [0, 0, 0, 0]
    uids = ["a"] * 4 + ["b"] * 4 + ["c"] * 4 + ["d"] * 4
    out = _metrics(scores, uids, [False] * 16)
    assert out[P + "zero_var_share"] == pytest.approx(3 / 4)
    assert out[P + "zero_var_fresh_share"] == pytest.approx(3 / 4)
    assert out[P + "zero_var_fresh_failed_share"] == pytest.approx(2 / 4)  # b is solved, not failed
    assert out[P + "nonzero_adv_row_share"] == pytest.approx(4 / 16)
    # no replay group: its keys are absent, and replay's share of |A| is 0
    assert P + "zero_var_replay_share" not in out and P + "replay_rescued_share" not in out
    assert out[P + "replayed_member_adv_share"] == 0.0
    assert out[P + "replay_group_adv_share"] == 0.0


def test_stored_member_rescues_a_group_whose_fresh_members_all_failed():
    # fresh group f: 0/4 (no gradient); replay group r: 3 failing fresh siblings + the stored correct member
    scores = [0, 0, 0, 0] + [0, 0, 0, 1]
    uids = ["f"] * 4 + ["r"] * 4
    replay = [False] * 7 + [True]
    out = _metrics(scores, uids, replay)
    assert out[P + "zero_var_fresh_share"] == 1.0
    assert out[P + "zero_var_fresh_failed_share"] == 1.0
    assert out[P + "zero_var_replay_share"] == 0.0
    assert out[P + "replay_rescued_share"] == 1.0
    assert out[P + "zero_var_share"] == pytest.approx(1 / 2)
    # A* = 3/4 on the stored member, -1/4 on each sibling: every bit of |A| is in the replay group, half on the member
    assert out[P + "replayed_member_adv_share"] == pytest.approx(0.5)
    assert out[P + "replay_group_adv_share"] == 1.0
    assert out[P + "nonzero_adv_row_share"] == pytest.approx(4 / 8)


def test_replay_group_with_mixed_fresh_members_is_not_rescued_and_solved_one_is_zero_variance():
    # r1: siblings 1,0,0 + stored 1 (has variance without the stored member); r2: siblings 1,1,1 + stored 1 (K/K)
    # f: fresh 1,0,0,0; uids as ints and rows interleaved, in any order
    scores = [1, 0, 1, 0, 1, 1, 0, 1, 0, 1, 0, 1]
    uids = [1, 1, 2, 1, 2, 2, 3, 1, 3, 2, 3, 3]
    replay = [False, False, False, False, False, False, False, True, False, True, False, False]
    # groups: 1 -> rows 0,1,3,7 (1,0,0,1 with row 7 stored); 2 -> rows 2,4,5,9 (1,1,1,1, row 9 stored);
    # 3 -> rows 6,8,10,11 (0,0,0,1 all fresh)
    out = _metrics(scores, uids, replay)
    assert out[P + "zero_var_replay_share"] == pytest.approx(1 / 2)  # group 2
    assert out[P + "replay_rescued_share"] == 0.0  # group 1's siblings already disagree; group 2 has no variance
    assert out[P + "zero_var_fresh_share"] == 0.0
    adv = np.abs(group_relative_advantages(np.asarray(scores, float), uids))
    assert out[P + "replayed_member_adv_share"] == pytest.approx(adv[7] / adv.sum())
    assert out[P + "replay_group_adv_share"] == pytest.approx(adv[[0, 1, 3, 7]].sum() / adv.sum())


def test_all_zero_advantages_leave_the_share_of_abs_a_out():
    out = _metrics([0, 0, 0, 0, 0, 0, 0, 0], ["a"] * 4 + ["b"] * 4, [False] * 7 + [True])
    assert out[P + "zero_var_share"] == 1.0 and out[P + "nonzero_adv_row_share"] == 0.0
    assert P + "replayed_member_adv_share" not in out and P + "replay_group_adv_share" not in out


def test_one_member_group_has_no_variance_and_continuous_rewards_are_compared_exactly():
    # a single-member group, and a group of equal continuous rewards (0.5 < success: failed), and 0.2/0.7
    out = _metrics([1.0, 0.5, 0.5, 0.2, 0.7], ["solo", "h", "h", "c", "c"], [False] * 5)
    assert out[P + "zero_var_fresh_share"] == pytest.approx(2 / 3)
    assert out[P + "zero_var_fresh_failed_share"] == pytest.approx(1 / 3)  # "h"; "solo" passed


def test_empty_batch_and_mismatched_lengths():
    assert group_signal_metrics([], [], [], []) == {}
    with pytest.raises(ValueError, match="advantages has 2 rows but scores has 3"):
        group_signal_metrics([0, 1, 0], ["a", "a", "a"], [False] * 3, [0.0, 0.0])
    with pytest.raises(ValueError, match="replay_mask has 1 rows"):
        group_signal_metrics([0, 1], ["a", "a"], [False], [0.0, 0.0])
