"""The mixed batch of the replay step (recipe/exgrpo/replay_step/batch.py) on hand-made rows, no verl: replayed
members join their groups with the stored tokens, candidates become rows of their question's group and the unselected
ones are dropped, collection groups hand each member its tokens, log-probs and reward."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from exgrpo.experience.experience_pool import Candidate
from exgrpo.experience.selection import SelectedTrajectory
from recipe.exgrpo.replay_step import Rows
from recipe.exgrpo.replay_step.batch import (
    append_candidates,
    build_replay_members,
    candidate_rows,
    collection_groups,
    generation_counts,
    keep_selected,
    mark_fresh,
    selected_candidate_indices,
)
from recipe.exgrpo.replay_step.fields import BEHAVIOUR_LOG_PROBS_KEY, CANDIDATE_KEY, IS_REPLAY_KEY, QUESTION_ID_KEY
from recipe.exgrpo.replay_step.metrics import replay_group_metrics
from tests.helpers.replay_rows import PAD, R_LEN, generated_rows


def test_generation_counts_k_for_fresh_k_minus_1_for_replayed():
    assert generation_counts(3, 2, 4).tolist() == [4, 4, 4, 3, 3]
    with pytest.raises(ValueError, match="rollout.n"):
        generation_counts(1, 1, 1)


def test_replay_members_join_their_groups_with_stored_tokens():
    # two groups: "a" (fresh, 3 rows) and "b" (replay group: 2 generated rows, K = 3)
    gen = generated_rows([3, 3, 3, 4, 4], [6, 2, 4, 5, 1], ["a", "a", "a", "b", "b"])
    mark_fresh(gen)
    stored_ids = [np.array([7, 8, 9, 2], dtype=np.int32)]
    stored_lp = [np.array([-0.1, -0.2, -0.3, -0.4], dtype=np.float32)]
    template = gen.select(np.array([3]))
    replay = build_replay_members(template, stored_ids, stored_lp, PAD)
    b = replay.tensors
    assert replay.columns["uid"].tolist() == ["b"]
    assert torch.equal(b["prompts"], gen.tensors["prompts"][3:4])
    assert b["responses"][0].tolist() == [7, 8, 9, 2, PAD, PAD]
    assert b["response_mask"][0].tolist() == [1, 1, 1, 1, 0, 0]
    assert torch.equal(b["input_ids"], torch.cat([b["prompts"], b["responses"]], 1))
    # attention: the template's prompt part, then the stored response
    assert b["attention_mask"][0].tolist() == [0, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0]
    assert b["position_ids"][0, 1:9].tolist() == list(range(8))
    assert torch.allclose(b[BEHAVIOUR_LOG_PROBS_KEY][0, :4], torch.tensor(stored_lp[0]))
    assert torch.allclose(b["rollout_log_probs"][0, :4], torch.tensor(stored_lp[0]))
    assert b[IS_REPLAY_KEY].tolist() == [True] and float(b["rm_scores"].abs().sum()) == 0.0
    # the template itself is untouched
    assert gen.tensors["responses"][3].tolist() != b["responses"][0].tolist()
    mixed = Rows.concat([gen, replay])
    m = replay_group_metrics(mixed)
    assert m == {"exgrpo/replayed_rows": 1.0, "exgrpo/replay_group_size_min": 3.0, "exgrpo/replay_group_size_max": 3.0}


def test_collection_groups_hand_each_member_its_tokens_log_probs_and_reward():
    """Group "a" fresh (2 rows), group "b" = 1 generated row + the appended replayed member (stored log-probs)."""
    gen = generated_rows([3, 3, 4], [2, 3, 1], ["a", "a", "b"])
    mark_fresh(gen)
    gen.tensors["old_log_probs"] = -torch.arange(3 * R_LEN, dtype=torch.float32).reshape(3, R_LEN) / 10
    replay = build_replay_members(gen.select(np.array([2])), [np.array([7, 8, 9])], [np.full(3, -0.5)], PAD)
    replay.tensors["old_log_probs"] = torch.full((1, R_LEN), -9.0)  # recomputed this step; not what is stored
    batch = Rows.concat([gen, replay])
    batch.columns[QUESTION_ID_KEY] = np.array(["qa", "qa", "qb", "qb"], dtype=object)
    rewards = [1.0, 0.0, 0.0, 1.0]
    batch.tensors["token_level_scores"] = torch.zeros(4, R_LEN)
    for i, r in enumerate(rewards):  # the reward sits on one token, as verl's reward tensors
        batch.tensors["token_level_scores"][i, 0] = r
    groups = collection_groups(batch)
    assert list(groups) == ["qa", "qb"] and [len(g) for g in groups.values()] == [2, 2]
    a0, a1 = groups["qa"]
    assert a0.token_ids.tolist() == gen.tensors["responses"][0, :2].tolist() and a0.reward == 1.0
    assert np.allclose(a0.behaviour_log_probs, [0.0, -0.1]) and not a0.is_replayed
    assert len(a1.token_ids) == 3 and a1.reward == 0.0
    b_gen, b_replayed = groups["qb"]
    assert len(b_gen.token_ids) == 1 and not b_gen.is_replayed
    assert b_replayed.is_replayed and b_replayed.reward == 1.0 and b_replayed.token_ids.tolist() == [7, 8, 9]
    assert np.allclose(b_replayed.behaviour_log_probs, [-0.5] * 3)  # the stored ones, not the recomputed −9


def test_collection_groups_store_rollout_log_probs_of_asynchronous_rollouts():
    """Asynchronous rollouts (docs/algorithm.md §15): a generated member is stored with its rollout log-probs token for
    token (the policy versions that sampled it), not the step's recomputed old log-probs; the replayed member keeps its
    stored ones; rows without rollout log-probs are refused."""
    gen = generated_rows([3, 3], [2, 3], ["a", "a"])
    mark_fresh(gen)
    gen.tensors["old_log_probs"] = torch.full((2, R_LEN), -9.0)
    rollout = -torch.arange(2 * R_LEN, dtype=torch.float32).reshape(2, R_LEN) / 10
    gen.tensors["rollout_log_probs"] = rollout * gen.tensors["response_mask"]
    gen.columns[QUESTION_ID_KEY] = np.array(["qa", "qa"], dtype=object)
    gen.tensors["token_level_scores"] = torch.zeros(2, R_LEN)
    a0, a1 = collection_groups(gen, behaviour_from_rollout=True)["qa"]
    assert np.allclose(a0.behaviour_log_probs, rollout[0, :2].numpy())
    assert np.allclose(a1.behaviour_log_probs, rollout[1, :3].numpy())
    assert np.allclose(collection_groups(gen)["qa"][0].behaviour_log_probs, [-9.0, -9.0])  # the sync mode's
    gen.tensors.pop("rollout_log_probs")
    with pytest.raises(KeyError, match="calculate_log_probs"):
        collection_groups(gen, behaviour_from_rollout=True)


def test_replay_member_errors_are_clear():
    gen = generated_rows([3], [4], ["a"])
    with pytest.raises(ValueError, match="exceeds the response length"):
        build_replay_members(gen, [np.arange(3, 3 + R_LEN + 1)], [np.zeros(R_LEN + 1, np.float32)], PAD)
    with pytest.raises(ValueError, match="behaviour log-probs"):
        build_replay_members(gen, [np.array([5, 6])], [np.zeros(3, np.float32)], PAD)


def _cand(qid, eid, tokens):
    ids = np.asarray(tokens, dtype=np.int32)
    return Candidate(qid, eid, ids, -np.arange(1, len(ids) + 1, dtype=np.float32) / 10, 1.0, 1)


def test_candidates_are_rows_of_their_question_group_and_the_unselected_are_dropped():
    # fresh "a" (K = 3 rows), replayed "b" and "c" (K - 1 = 2 generated rows each)
    gen = generated_rows([3] * 7, [2, 3, 4, 5, 1, 2, 3], ["a"] * 3 + ["b"] * 2 + ["c"] * 2)
    mark_fresh(gen)
    counts = np.array([3, 2, 2])
    cands = [[_cand("b", 10, [7, 8]), _cand("b", 11, [9, 9, 9])], [_cand("c", 12, [4])]]
    batch = append_candidates(gen, counts, 1, cands, PAD)
    assert len(batch) == 10
    assert batch.tensors[CANDIDATE_KEY].tolist() == [-1] * 7 + [0, 1, 2]
    assert batch.columns["uid"][7:].tolist() == ["b", "b", "c"]
    assert torch.equal(batch.tensors["prompts"][7], gen.tensors["prompts"][3])  # b's first generated row
    assert torch.equal(batch.tensors["prompts"][9], gen.tensors["prompts"][5])
    assert batch.tensors["responses"][8, :4].tolist() == [9, 9, 9, PAD]
    assert torch.allclose(batch.tensors[BEHAVIOUR_LOG_PROBS_KEY][8, :3], torch.tensor([-0.1, -0.2, -0.3]))
    assert batch.tensors[IS_REPLAY_KEY].tolist() == [False] * 7 + [True] * 3
    # wherever the rows go (dp balancing reorders them), candidate_rows finds them in candidate order
    shuffled = batch.select(np.array([9, 0, 8, 1, 2, 3, 7, 4, 5, 6]))
    assert candidate_rows(shuffled).tolist() == [6, 2, 0]
    picked = [SelectedTrajectory(cands[0][1], 0.1, 2), SelectedTrajectory(cands[1][0], 0.2, 1)]
    flat = selected_candidate_indices(cands, picked)
    assert flat == [1, 2]
    kept = keep_selected(batch, flat)
    assert len(kept) == 9 and CANDIDATE_KEY not in kept.tensors.keys()
    assert kept.columns["uid"].tolist() == ["a"] * 3 + ["b"] * 2 + ["c"] * 2 + ["b", "c"]
    assert kept.tensors["responses"][7, :3].tolist() == [9, 9, 9]
    m = replay_group_metrics(kept)
    assert m == {"exgrpo/replayed_rows": 2.0, "exgrpo/replay_group_size_min": 3.0, "exgrpo/replay_group_size_max": 3.0}


def test_candidate_helpers_reject_mismatches():
    gen = generated_rows([3] * 3, [2, 3, 4], ["a", "a", "b"])
    with pytest.raises(KeyError, match="mark_fresh"):
        append_candidates(gen, np.array([2, 1]), 1, [[_cand("b", 1, [3])]], PAD)
    mark_fresh(gen)
    with pytest.raises(ValueError, match="2 candidate lists for 1 replayed"):
        append_candidates(gen, np.array([2, 1]), 1, [[_cand("b", 1, [3])], [_cand("c", 2, [3])]], PAD)
    cands = [[_cand("b", 1, [3])]]
    with pytest.raises(ValueError, match="not a candidate"):
        selected_candidate_indices(cands, [SelectedTrajectory(_cand("b", 5, [3]), 0.0, 1)])
    batch = append_candidates(gen, np.array([2, 1]), 1, cands, PAD)
    with pytest.raises(ValueError, match="not all candidate rows"):
        keep_selected(batch, [3])
