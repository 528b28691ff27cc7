"""The verl adapter without Ray: mixed batches on hand-made DataProtos, and the installed actor loss on a
hand-made micro-batch TensorDict equals the exgrpo objective."""

from __future__ import annotations

import numpy as np
import pytest
import torch

pytest.importorskip("verl")

from verl import DataProto  # noqa: E402
from verl.utils import tensordict_utils as tu  # noqa: E402
from verl.workers.config import ActorConfig  # noqa: E402
from verl.workers.utils.padding import left_right_2_no_padding  # noqa: E402

from exgrpo.experience.experience_pool import Candidate  # noqa: E402
from exgrpo.experience.selection import SelectedTrajectory  # noqa: E402
from exgrpo.objective import LossSettings, mixed_policy_loss  # noqa: E402
from recipe.exgrpo.actor_loss import exgrpo_actor_loss  # noqa: E402
from recipe.exgrpo.dataset import QUESTION_ID_KEY  # noqa: E402
from recipe.exgrpo.legacy.trainer import replay_group_metrics  # noqa: E402
from recipe.exgrpo.replay_step.batch import (  # noqa: E402
    BEHAVIOUR_LOG_PROBS_KEY,
    CANDIDATE_KEY,
    IS_REPLAY_KEY,
    MIXED_KEY,
    RATIO_KEY,
    append_candidates,
    build_replay_members,
    candidate_rows,
    collection_groups,
    generation_counts,
    keep_selected,
    mark_fresh,
    selected_candidate_indices,
)

PAD = 0
P_LEN, R_LEN = 5, 6


def _generated_rows(prompt_lens, response_lens, uids, seed=0) -> DataProto:
    """Rows shaped like verl's agent-loop output after ``batch.union(gen_output)``."""
    g = torch.Generator().manual_seed(seed)
    n = len(prompt_lens)
    prompts = torch.full((n, P_LEN), PAD)
    responses = torch.full((n, R_LEN), PAD)
    attn = torch.zeros(n, P_LEN + R_LEN, dtype=torch.int64)
    for i, (p, r) in enumerate(zip(prompt_lens, response_lens)):
        prompts[i, P_LEN - p :] = torch.randint(3, 50, (p,), generator=g)
        responses[i, :r] = torch.randint(3, 50, (r,), generator=g)
        attn[i, P_LEN - p : P_LEN + r] = 1
    response_mask = attn[:, P_LEN:].clone()
    batch = {
        "prompts": prompts,
        "responses": responses,
        "response_mask": response_mask,
        "input_ids": torch.cat([prompts, responses], 1),
        "attention_mask": attn,
        "position_ids": torch.clip(torch.cumsum(attn, -1) - 1, min=0),
        "rm_scores": torch.zeros(n, R_LEN),
        "rollout_log_probs": -torch.rand(n, R_LEN, generator=g),
    }
    non_tensor = {
        "uid": np.array(uids, dtype=object),
        "data_source": np.array(["toy"] * n, dtype=object),
        "reward_model": np.array([{"ground_truth": str(i)} for i in range(n)], dtype=object),
    }
    return DataProto.from_single_dict({**batch, **non_tensor})


def test_generation_counts_k_for_fresh_k_minus_1_for_replayed():
    assert generation_counts(3, 2, 4).tolist() == [4, 4, 4, 3, 3]
    with pytest.raises(ValueError, match="rollout.n"):
        generation_counts(1, 1, 1)


def test_replay_members_join_their_groups_with_stored_tokens():
    # two groups: "a" (fresh, 3 rows) and "b" (replay group: 2 generated rows, K = 3)
    gen = _generated_rows([3, 3, 3, 4, 4], [6, 2, 4, 5, 1], ["a", "a", "a", "b", "b"])
    mark_fresh(gen)
    stored_ids = [np.array([7, 8, 9, 2], dtype=np.int32)]
    stored_lp = [np.array([-0.1, -0.2, -0.3, -0.4], dtype=np.float32)]
    template = gen.select_idxs(np.array([3]))
    replay = build_replay_members(template, stored_ids, stored_lp, PAD)
    b = replay.batch
    assert replay.non_tensor_batch["uid"].tolist() == ["b"]
    assert torch.equal(b["prompts"], gen.batch["prompts"][3:4])
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
    assert gen.batch["responses"][3].tolist() != b["responses"][0].tolist()
    mixed = DataProto.concat([gen, replay])
    m = replay_group_metrics(mixed)
    assert m == {"exgrpo/replayed_rows": 1.0, "exgrpo/replay_group_size_min": 3.0, "exgrpo/replay_group_size_max": 3.0}


def test_collection_groups_hand_each_member_its_tokens_log_probs_and_reward():
    """Group "a" fresh (2 rows), group "b" = 1 generated row + the appended replayed member (stored log-probs)."""
    gen = _generated_rows([3, 3, 4], [2, 3, 1], ["a", "a", "b"])
    mark_fresh(gen)
    gen.batch["old_log_probs"] = -torch.arange(3 * R_LEN, dtype=torch.float32).reshape(3, R_LEN) / 10
    replay = build_replay_members(gen.select_idxs(np.array([2])), [np.array([7, 8, 9])], [np.full(3, -0.5)], PAD)
    replay.batch["old_log_probs"] = torch.full((1, R_LEN), -9.0)  # recomputed this step; not what is stored
    batch = DataProto.concat([gen, replay])
    batch.non_tensor_batch[QUESTION_ID_KEY] = np.array(["qa", "qa", "qb", "qb"], dtype=object)
    rewards = [1.0, 0.0, 0.0, 1.0]
    batch.batch["token_level_scores"] = torch.zeros(4, R_LEN)
    for i, r in enumerate(rewards):  # the reward sits on one token, as verl's reward tensors
        batch.batch["token_level_scores"][i, 0] = r
    groups = collection_groups(batch)
    assert list(groups) == ["qa", "qb"] and [len(g) for g in groups.values()] == [2, 2]
    a0, a1 = groups["qa"]
    assert a0.token_ids.tolist() == gen.batch["responses"][0, :2].tolist() and a0.reward == 1.0
    assert np.allclose(a0.behaviour_log_probs, [0.0, -0.1]) and not a0.is_replayed
    assert len(a1.token_ids) == 3 and a1.reward == 0.0
    b_gen, b_replayed = groups["qb"]
    assert len(b_gen.token_ids) == 1 and not b_gen.is_replayed
    assert b_replayed.is_replayed and b_replayed.reward == 1.0 and b_replayed.token_ids.tolist() == [7, 8, 9]
    assert np.allclose(b_replayed.behaviour_log_probs, [-0.5] * 3)  # the stored ones, not the recomputed −9


def test_replay_member_errors_are_clear():
    gen = _generated_rows([3], [4], ["a"])
    with pytest.raises(ValueError, match="exceeds the response length"):
        build_replay_members(gen, [np.arange(3, 3 + R_LEN + 1)], [np.zeros(R_LEN + 1, np.float32)], PAD)
    with pytest.raises(ValueError, match="behaviour log-probs"):
        build_replay_members(gen, [np.array([5, 6])], [np.zeros(3, np.float32)], PAD)


def _cand(qid, eid, tokens):
    ids = np.asarray(tokens, dtype=np.int32)
    return Candidate(qid, eid, ids, -np.arange(1, len(ids) + 1, dtype=np.float32) / 10, 1.0, 1)


def test_candidates_are_rows_of_their_question_group_and_the_unselected_are_dropped():
    # fresh "a" (K = 3 rows), replayed "b" and "c" (K - 1 = 2 generated rows each)
    gen = _generated_rows([3] * 7, [2, 3, 4, 5, 1, 2, 3], ["a"] * 3 + ["b"] * 2 + ["c"] * 2)
    mark_fresh(gen)
    counts = np.array([3, 2, 2])
    cands = [[_cand("b", 10, [7, 8]), _cand("b", 11, [9, 9, 9])], [_cand("c", 12, [4])]]
    batch = append_candidates(gen, counts, 1, cands, PAD)
    assert len(batch) == 10
    assert batch.batch[CANDIDATE_KEY].tolist() == [-1] * 7 + [0, 1, 2]
    assert batch.non_tensor_batch["uid"][7:].tolist() == ["b", "b", "c"]
    assert torch.equal(batch.batch["prompts"][7], gen.batch["prompts"][3])  # b's first generated row
    assert torch.equal(batch.batch["prompts"][9], gen.batch["prompts"][5])
    assert batch.batch["responses"][8, :4].tolist() == [9, 9, 9, PAD]
    assert torch.allclose(batch.batch[BEHAVIOUR_LOG_PROBS_KEY][8, :3], torch.tensor([-0.1, -0.2, -0.3]))
    assert batch.batch[IS_REPLAY_KEY].tolist() == [False] * 7 + [True] * 3
    # wherever the rows go (dp balancing reorders them), candidate_rows finds them in candidate order
    shuffled = batch.select_idxs(np.array([9, 0, 8, 1, 2, 3, 7, 4, 5, 6]))
    assert candidate_rows(shuffled).tolist() == [6, 2, 0]
    picked = [SelectedTrajectory(cands[0][1], 0.1, 2), SelectedTrajectory(cands[1][0], 0.2, 1)]
    flat = selected_candidate_indices(cands, picked)
    assert flat == [1, 2]
    kept = keep_selected(batch, flat)
    assert len(kept) == 9 and CANDIDATE_KEY not in kept.batch.keys()
    assert kept.non_tensor_batch["uid"].tolist() == ["a"] * 3 + ["b"] * 2 + ["c"] * 2 + ["b", "c"]
    assert kept.batch["responses"][7, :3].tolist() == [9, 9, 9]
    m = replay_group_metrics(kept)
    assert m == {"exgrpo/replayed_rows": 2.0, "exgrpo/replay_group_size_min": 3.0, "exgrpo/replay_group_size_max": 3.0}


def test_candidate_helpers_reject_mismatches():
    gen = _generated_rows([3] * 3, [2, 3, 4], ["a", "a", "b"])
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


def _micro_batch(seed=1, replay_rows=(1, 3), mixed=True):
    """A micro-batch TensorDict in the form verl's engine hands to the loss, plus the model's log-probs."""
    gen = _generated_rows([2, 3, 4, 3], [6, 3, 5, 4], ["a", "a", "b", "b"], seed=seed)
    mark_fresh(gen)
    g = torch.Generator().manual_seed(seed + 10)
    n = len(gen)
    is_replay = torch.zeros(n, dtype=torch.bool)
    is_replay[list(replay_rows)] = True
    gen.batch[IS_REPLAY_KEY] = is_replay
    gen.batch[BEHAVIOUR_LOG_PROBS_KEY] = -torch.rand(n, R_LEN, generator=g) - 0.5
    gen.batch["old_log_probs"] = -torch.rand(n, R_LEN, generator=g) - 0.5
    gen.batch["advantages"] = torch.randn(n, 1, generator=g).expand(n, R_LEN) * gen.batch["response_mask"]
    gen.batch[MIXED_KEY] = torch.full((n,), mixed)
    gen.batch[RATIO_KEY] = torch.full((n,), 0.5)
    td = left_right_2_no_padding(gen.to_tensordict())
    tu.assign_non_tensor(td, dp_size=1, batch_num_tokens=None, global_batch_size=None)
    # the model's per-token log-probs of the whole packed sequence (values aligned one token left)
    total = int(gen.batch["attention_mask"].sum())
    flat = (-torch.rand(total, generator=g) - 0.5).requires_grad_(True)
    return gen, td, flat


def _padded_log_prob(gen, flat):
    attn = gen.batch["attention_mask"]
    offset = 0
    rows = []
    for i in range(len(gen)):
        p = int(attn[i, :P_LEN].sum())
        r = int(attn[i, P_LEN:].sum())
        seq = flat[offset : offset + p + r]
        rows.append(torch.nn.functional.pad(seq[p - 1 : p + r - 1], (0, R_LEN - r)))
        offset += p + r
    return torch.stack(rows)


@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-sum-norm"])
@pytest.mark.parametrize("mixed", [True, False])
def test_installed_loss_equals_the_exgrpo_objective(agg, mixed):
    gen, td, flat = _micro_batch(mixed=mixed)
    config = ActorConfig(
        strategy="fsdp2",
        loss_agg_mode=agg,
        loss_scale_factor=R_LEN if agg.endswith("norm") else None,
        entropy_coeff=0.0,
        ppo_mini_batch_size=4,
        ppo_micro_batch_size_per_gpu=4,
        rollout_n=1,
    )
    settings = LossSettings(shaping="policy_shaping", shaping_beta=0.1, is_correction=True, fresh_clip="released")
    loss, metrics = exgrpo_actor_loss(config, {"log_probs": flat}, td, settings=settings)
    (grad_installed,) = torch.autograd.grad(loss, flat)

    log_prob = _padded_log_prob(gen, flat)
    expected, raw = mixed_policy_loss(
        log_prob,
        gen.batch["old_log_probs"],
        gen.batch[BEHAVIOUR_LOG_PROBS_KEY],
        gen.batch["advantages"],
        gen.batch["response_mask"].bool(),
        gen.batch[IS_REPLAY_KEY],
        LossSettings(
            loss_agg_mode=agg,
            shaping="policy_shaping",
            shaping_beta=0.1,
            is_correction=True,
            fresh_clip="never" if mixed else "always",  # released: the clip before mixed mode, none after
            clip_ratio_low=config.clip_ratio_low,
            clip_ratio_high=config.clip_ratio_high,
            dual_clip=False,  # exgrpo.dual_clip is off by default (as released)
            loss_scale_factor=config.loss_scale_factor,
        ),
    )
    (grad_expected,) = torch.autograd.grad(expected, flat)
    assert torch.allclose(loss, expected, atol=1e-6)
    assert torch.allclose(grad_installed, grad_expected, atol=1e-6)
    assert float(metrics["exgrpo/replayed_tokens"].aggregate()) == raw["exgrpo/replayed_tokens"] > 0
    assert "pg_loss" in metrics and "pg_clipfrac" in metrics


def test_loss_without_the_exgrpo_fields_names_them():
    gen, td, flat = _micro_batch()
    del td[IS_REPLAY_KEY]
    config = ActorConfig(strategy="fsdp2", ppo_mini_batch_size=4, ppo_micro_batch_size_per_gpu=4, rollout_n=1)
    with pytest.raises(KeyError, match=IS_REPLAY_KEY):
        exgrpo_actor_loss(config, {"log_probs": flat}, td, settings=LossSettings())
