"""Step metrics of RayExGRPOTrainer that the learnability check relies on, on hand-made DataProtos (no Ray)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

pytest.importorskip("verl")

from verl import DataProto  # noqa: E402

from recipe.exgrpo.exgrpo_ray_trainer import (  # noqa: E402
    reward_health,
    rollout_actor_agreement,
    sampled_pass_rate,
)
from recipe.exgrpo.mixed_batch import IS_REPLAY_KEY  # noqa: E402


def _batch(rollout: torch.Tensor, actor: torch.Tensor, mask: torch.Tensor, replay: list[bool]) -> DataProto:
    return DataProto.from_dict(
        tensors={
            "rollout_log_probs": rollout,
            "old_log_probs": actor,
            "response_mask": mask,
            IS_REPLAY_KEY: torch.tensor(replay),
        }
    )


def test_gap_is_measured_on_generated_tokens_only():
    actor = torch.tensor([[-1.0, -2.0, -3.0], [-1.0, -1.0, -1.0], [-0.5, -0.5, -0.5]])
    rollout = actor.clone()
    rollout[0, 1] += 0.25  # a generated token whose rollout log-prob is off (e.g. stale rollout weights)
    rollout[0, 2] += 9.0  # padding: ignored
    rollout[2] -= 5.0  # a replayed row: its "rollout" log-probs are a past policy's, ignored
    mask = torch.tensor([[1, 1, 0], [1, 1, 1], [1, 1, 1]])
    out = rollout_actor_agreement(_batch(rollout, actor, mask, [False, False, True]))
    assert out["exgrpo/rollout_actor_log_prob_diff_max"] == pytest.approx(0.25)
    assert out["exgrpo/rollout_actor_log_prob_diff_mean"] == pytest.approx(0.25 / 5)


def test_gap_is_absent_without_rollout_log_probs():
    batch = DataProto.from_dict(tensors={"old_log_probs": torch.zeros(2, 3), "response_mask": torch.ones(2, 3)})
    assert rollout_actor_agreement(batch) == {}


def test_sampled_pass_rate_leaves_replayed_members_out():
    scores = np.array([1.0, 0.0, 0.0, 1.0, 1.0])
    batch = _batch(torch.zeros(5, 2), torch.zeros(5, 2), torch.ones(5, 2), [False, False, False, True, True])
    assert sampled_pass_rate(scores, batch) == pytest.approx(1 / 3)
    all_replayed = _batch(torch.zeros(2, 2), torch.zeros(2, 2), torch.ones(2, 2), [True, True])
    assert math.isnan(sampled_pass_rate(np.array([1.0, 1.0]), all_replayed))


def test_reward_health_from_the_recipe_reward_keys():
    extra = {
        "reward_error": [0.0, 1.0, 0.0, 0.0],
        "reward_timeout": [0.0, 0.0, 1.0, 1.0],
        "reward_queue_s": [0.0, 0.5, 2.0, 1.5],
        "pred": ["1", "2", "", ""],
    }
    assert reward_health(extra) == {
        "exgrpo/reward/error_rate": 0.25,
        "exgrpo/reward/timeout_rate": 0.5,
        "exgrpo/reward/queue_s_mean": 1.0,
        "exgrpo/reward/queue_s_max": 2.0,
    }
    # a custom reward without those keys (or an empty batch) adds nothing
    assert reward_health({"acc": [1.0]}) == {}
    assert reward_health({"reward_queue_s": []}) == {}
