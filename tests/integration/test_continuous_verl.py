"""The verl side of the continuous reward mode without Ray: stored replay rewards placed like verl places a
score, the reward's metrics, the colocated reward model's scoring hook, and collection of a continuous step's rows
into a continuous pool (hand-made DataProtos)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

pytest.importorskip("verl")

from omegaconf import OmegaConf  # noqa: E402
from verl import DataProto  # noqa: E402
from verl.experimental.reward_loop.reward_manager.base import RewardManagerBase  # noqa: E402

from exgrpo.config import ExGRPOConfig  # noqa: E402
from exgrpo.experience.manager import ExperienceManager  # noqa: E402
from exgrpo.modes.continuous import ContinuousMode, ContinuousRules  # noqa: E402
from recipe.exgrpo.config_bridge import reward_model_colocated  # noqa: E402
from recipe.exgrpo.dataproto import as_dataproto, rows_of  # noqa: E402
from recipe.exgrpo.replay_step import ReplayStep, Rows, StepState  # noqa: E402
from recipe.exgrpo.replay_step.batch import build_replay_members, collection_groups, mark_fresh  # noqa: E402
from recipe.exgrpo.replay_step.fields import IS_REPLAY_KEY, QUESTION_ID_KEY  # noqa: E402
from recipe.exgrpo.replay_step.scoring import mode_reward_metrics, set_stored_replay_rewards  # noqa: E402

P_LEN, R_LEN = 4, 5


def _rows(response_lens, uids, rewards) -> Rows:
    n = len(uids)
    prompts = torch.full((n, P_LEN), 0)
    responses = torch.zeros((n, R_LEN), dtype=torch.int64)
    attn = torch.zeros(n, P_LEN + R_LEN, dtype=torch.int64)
    attn[:, :P_LEN] = 1
    scores = torch.zeros(n, R_LEN)
    for i, r in enumerate(response_lens):
        prompts[i] = torch.arange(3, 3 + P_LEN)
        responses[i, :r] = torch.arange(10 + i, 10 + i + r)
        attn[i, P_LEN : P_LEN + r] = 1
        scores[i, r - 1] = rewards[i]
    batch = {
        "prompts": prompts,
        "responses": responses,
        "response_mask": attn[:, P_LEN:].clone(),
        "input_ids": torch.cat([prompts, responses], 1),
        "attention_mask": attn,
        "position_ids": torch.clip(torch.cumsum(attn, -1) - 1, min=0),
        "rm_scores": scores,
    }
    non_tensor = {
        "uid": np.array(uids, dtype=object),
        QUESTION_ID_KEY: np.array([f"q{u}" for u in uids], dtype=object),
        "credit": np.array([float(r) / 2 for r in rewards]),
        "pred": np.array([str(r) for r in rewards], dtype=object),
    }
    return Rows.of(batch, non_tensor, reward_extra_keys=["credit", "pred"])


def _with_replayed_member(stored_reward: float) -> Rows:
    """Group "a": 3 generated rows; group "b": 2 generated rows plus a replayed member built from row 3."""
    gen = _rows([5, 2, 3, 4, 1], ["a", "a", "a", "b", "b"], [0.2, 0.9, 0.4, 0.3, 0.9])
    mark_fresh(gen)
    member = build_replay_members(
        gen.select(np.array([3])), [np.array([40, 41], dtype=np.int32)], [np.array([-0.1, -0.2])], 0
    )
    member.tensors["rm_scores"][0, 1] = 123.0  # as if a stale score were there: it must be replaced
    return Rows.concat([gen, member])


def test_stored_replay_reward_goes_to_the_last_response_token_like_verl_places_scores():
    batch = _with_replayed_member(0.75)
    set_stored_replay_rewards(batch, [0.75])
    row = batch.tensors["rm_scores"][5]
    assert row.tolist() == [0.0, 0.75, 0.0, 0.0, 0.0]  # the stored response has 2 tokens
    # the same place verl's reward managers use for a score
    expected = RewardManagerBase.assemble_rm_scores(as_dataproto(batch.select(np.array([5]))), [0.75])
    assert torch.equal(row, expected[0])
    # the generated rows keep theirs; the replayed row's copied extras (its template's) are blanked
    assert batch.tensors["rm_scores"][1, 1] == pytest.approx(0.9)
    assert np.isnan(batch.columns["credit"][5]) and batch.columns["pred"][5] is None
    assert batch.columns["credit"][3] == pytest.approx(0.15)
    with pytest.raises(ValueError, match="2 stored rewards for 1 replayed rows"):
        set_stored_replay_rewards(batch, [0.1, 0.2])


def test_continuous_reward_metrics_on_hand_computed_rewards():
    batch = _with_replayed_member(0.75)
    set_stored_replay_rewards(batch, [0.75])
    scores = batch.tensors["rm_scores"].sum(-1).numpy().astype(np.float64)
    extra = {k: batch.columns[k] for k in ("credit", "pred")}
    m = mode_reward_metrics(ContinuousMode(ContinuousRules(epsilon=0.25)), scores, batch, extra)
    gen = np.array([0.2, 0.9, 0.4, 0.3, 0.9])
    assert m["exgrpo/batch_mean_reward"] == pytest.approx((gen.sum() + 0.75) / 6)
    assert m["exgrpo/reward/mean"] == pytest.approx(gen.mean()) and m["exgrpo/reward/max"] == pytest.approx(0.9)
    assert m["exgrpo/reward/std"] == pytest.approx(gen.std())
    assert m["exgrpo/reward/replayed_mean"] == pytest.approx(0.75)
    std_a, std_b = np.std([0.2, 0.9, 0.4]), np.std([0.3, 0.9, 0.75])
    assert m["exgrpo/reward/group_std_mean"] == pytest.approx((std_a + std_b) / 2)
    assert m["exgrpo/reward/flat_group_share"] == 0.0
    # numeric extra keys over the generated rows (the replayed row's NaN left out); strings are not metrics
    assert m["exgrpo/reward/extra/credit"] == pytest.approx(gen.mean() / 2) and "exgrpo/reward/extra/pred" not in m


class _RecordingRewardLoop:
    """Stands in for verl's RewardLoopManager (whose reward model needs GPUs): records the rows it scores."""

    def __init__(self):
        self.calls = []

    def compute_rm_score(self, data: DataProto) -> DataProto:
        self.calls.append(len(data))
        scores = RewardManagerBase.assemble_rm_scores(data, [float(i) for i in range(len(data))])
        return DataProto.from_dict(tensors={"rm_scores": scores}, meta_info={"reward_extra_keys": []})


class _Backend:
    """The replay step's backend over the recording reward loop (the trainer's ``score_rows``, without Ray)."""

    def __init__(self, enable: bool, own_pool: bool):
        self.config = OmegaConf.create(
            {"reward": {"reward_model": {"enable": enable, "enable_resource_pool": own_pool}}}
        )
        self.reward_loop_manager = _RecordingRewardLoop()

    def score_rows(self, rows, state):
        return rows_of(self.reward_loop_manager.compute_rm_score(as_dataproto(rows)))

    def replay_step(self) -> ReplayStep:
        cfg = ExGRPOConfig.from_dict({"reward_mode": "continuous"}, k=3)
        return ReplayStep(
            cfg,
            questions_per_step=1,
            question_ids=[],
            row_of_question={},
            epoch_batches=list,
            pad_token_id=0,
            response_width=R_LEN,
            colocated_reward_model=reward_model_colocated(self.config),
        )


def test_a_colocated_reward_model_scores_the_generated_rows_once():
    gen = _rows([5, 2, 3], ["a", "a", "a"], [0, 0, 0])
    gen.tensors.pop("rm_scores")  # a colocated model: the agent loop left the rows unscored (and no extra keys)
    gen.meta.pop("reward_extra_keys")
    backend = _Backend(enable=True, own_pool=False)
    assert reward_model_colocated(backend.config)
    replay, state = backend.replay_step(), StepState(step=1, is_last=False, mixed=False)
    scored = replay._score_unscored(state, gen, backend)
    assert backend.reward_loop_manager.calls == [3] and "reward_model" in state.timing
    assert scored.tensors["rm_scores"].sum(-1).tolist() == [0.0, 1.0, 2.0]
    # rows that already carry scores (a reward model in its own pool scored them in the agent loop), or no model
    assert replay._score_unscored(state, scored, backend) is scored and backend.reward_loop_manager.calls == [3]
    for b in (_Backend(enable=True, own_pool=True), _Backend(enable=False, own_pool=False)):
        bare = _rows([1], ["a"], [0])
        bare.tensors.pop("rm_scores")
        bare.meta.pop("reward_extra_keys")
        assert b.replay_step()._score_unscored(state, bare, b) is bare and b.reward_loop_manager.calls == []


def test_a_continuous_step_collects_into_a_continuous_pool():
    """The rows of a step (after rewards) -> collection_groups -> a continuous manager: buckets from σ̃."""
    batch = _with_replayed_member(0.75)
    set_stored_replay_rewards(batch, [0.75])
    batch.tensors["token_level_scores"] = batch.tensors["rm_scores"]
    batch.tensors["old_log_probs"] = -torch.rand(len(batch), R_LEN)
    mgr = ExperienceManager(ExGRPOConfig.from_dict({"reward_mode": "continuous"}, k=3))
    metrics = mgr.collect(1, collection_groups(batch))
    # qa: [0.2, 0.9, 0.4] mean 0.5, σ 0.2944 (the largest: σ̃ 1, bucket round(3) clipped to K-1 = 2); qb: [0.3,
    # 0.9, 0.75] mean 0.65, σ 0.2550 (the smallest: σ̃ = ε = 1/3, bucket 1); above-mean fresh members: qa the 0.9
    # one, qb the 0.9 one (0.75 is the replayed member: already stored, never re-inserted)
    assert mgr.pool.bucket_of("qa") == 2 and mgr.pool.bucket_of("qb") == 1
    assert [e.reward for e in mgr.pool.entries("qa")] == pytest.approx([0.9])
    assert [e.reward for e in mgr.pool.entries("qb")] == pytest.approx([0.9])
    assert metrics["exgrpo/collect/added_entries"] == 2 and metrics["exgrpo/collect/flat_groups"] == 0
    assert batch.tensors[IS_REPLAY_KEY].tolist() == [False] * 5 + [True]
