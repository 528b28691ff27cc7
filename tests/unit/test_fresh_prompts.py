"""exgrpo.fresh_prompts: when retired questions leave the fresh prompt stream (exgrpo.retire_fresh_prompts)."""

import json

import pytest

from exgrpo.fresh_prompts import RELEASED_REMOVAL_MARGIN, FreshPromptFilter

N, B = 30, 8  # 30 questions, 8 per step: B + 20 = 28


def test_immediate_mode_skips_a_retired_question_at_once():
    f = FreshPromptFilter(immediate=True)
    retired = {"q3"}
    assert f.skips("q3", retired) and not f.skips("q4", retired)
    assert f.on_epoch_boundary(N, B, retired) == 0 and f.num_removed(retired) == 0
    assert not f.skips("q3", set())  # un-retired (re-added): drawn again


def test_released_mode_removes_at_epoch_boundaries_while_the_data_set_has_more_than_b_plus_20():
    assert RELEASED_REMOVAL_MARGIN == 20
    f = FreshPromptFilter(immediate=False)
    retired = {"q1", "q2"}
    assert not f.skips("q1", retired)  # retired during epoch 0: still drawn until the boundary
    # boundary 1: the data set has 30 > 28 questions -> both leave
    assert f.on_epoch_boundary(N, B, retired) == 2
    assert f.skips("q1", retired) and f.skips("q2", retired) and f.num_removed(retired) == 2
    retired |= {"q3", "q4", "q5"}
    assert not f.skips("q3", retired)
    # boundary 2: the data set now has 30 - 2 = 28 questions, not more than 28 -> nothing leaves
    assert f.on_epoch_boundary(N, B, retired) == 0
    assert not f.skips("q3", retired) and f.skips("q1", retired)
    # the "re-added" ablation un-retires q1: it is drawn again at once and counts in the data set again
    retired.discard("q1")
    assert not f.skips("q1", retired) and f.num_removed(retired) == 1
    # boundary 3: 30 - 1 = 29 > 28 -> the four still-retired questions not yet removed leave (q3, q4, q5)
    assert f.on_epoch_boundary(N, B, retired) == 3
    assert f.removed == {"q2", "q3", "q4", "q5"}


def test_a_small_data_set_keeps_its_retired_questions():
    f = FreshPromptFilter(immediate=False)
    assert f.on_epoch_boundary(B + 20, B, {"q1"}) == 0 and not f.skips("q1", {"q1"})
    assert f.on_epoch_boundary(B + 21, B, {"q1"}) == 1 and f.skips("q1", {"q1"})


def test_state_survives_a_json_checkpoint():
    f = FreshPromptFilter(immediate=False)
    f.on_epoch_boundary(N, B, {"q7", "q2"})
    state = json.loads(json.dumps(f.state_dict()))
    assert state["removed"] == ["q2", "q7"]
    g = FreshPromptFilter(immediate=False)
    g.load_state_dict(state)
    assert g.removed == {"q2", "q7"} and g.skips("q7", {"q7"})
    g.load_state_dict(None)  # a checkpoint written before this state existed: nothing removed
    assert g.removed == set()
    with pytest.raises(ValueError, match="margin"):
        FreshPromptFilter(immediate=False, margin=-1)
