"""Step metrics of the replay step that the learnability check relies on, on hand-made rows (no verl, no Ray)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from exgrpo.config import ExGRPOConfig
from recipe.exgrpo.replay_step import ReplayStep, Rows
from recipe.exgrpo.replay_step.fields import IS_REPLAY_KEY
from recipe.exgrpo.replay_step.metrics import reward_health, rollout_actor_agreement, sampled_pass_rate


def _batch(rollout: torch.Tensor, actor: torch.Tensor, mask: torch.Tensor, replay: list[bool]) -> Rows:
    return Rows.of(
        {
            "rollout_log_probs": rollout,
            "old_log_probs": actor,
            "response_mask": mask,
            IS_REPLAY_KEY: torch.tensor(replay),
        }
    )


def _replay_step() -> ReplayStep:
    """A replay step of a new run: only its agreement baseline matters here."""
    return ReplayStep(
        ExGRPOConfig.from_dict({}, k=2),
        questions_per_step=1,
        question_ids=[],
        row_of_question={},
        epoch_batches=list,
        pad_token_id=0,
        response_width=1,
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
    batch = Rows.of({"old_log_probs": torch.zeros(2, 3), "response_mask": torch.ones(2, 3)})
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


# ------------------------------------------------------------------------------ rollout/actor agreement on GPUs
ROWS, TOKENS, VOCAB = 64, 256, 32
MEAN, MAX, PEARSON, VS_FIRST = (
    f"exgrpo/rollout_actor_log_prob_{k}" for k in ("diff_mean", "diff_max", "pearson", "diff_mean_vs_first")
)


def _bf16_noise(gen: torch.Generator, shape) -> torch.Tensor:
    """Rollout-vs-trainer numerics of two bf16 engines: ~1e-2 per token, with a few tokens off by more than 1."""
    noise = 0.01 * torch.randn(shape, generator=gen)
    outliers = torch.rand(shape, generator=gen) < 2e-3
    return torch.where(outliers, 1.5 * torch.randn(shape, generator=gen).sign(), noise)


def _step(gen, base, drift, actor_steps: int, rollout_steps: int | None, wrong: float = 0.0) -> Rows:
    """One step's generated rows: the actor has taken ``actor_steps`` updates (logits ``base + drift * t``), the
    rollout serves the weights of ``rollout_steps`` (None: weights that are not the actor's at all); tokens are
    sampled from the rollout, and each side's log-prob of them carries its own bf16 noise."""
    actor_logits = base + drift * actor_steps
    if rollout_steps is None:
        rollout_logits = base + wrong * torch.randn(base.shape, generator=gen)
    else:
        rollout_logits = base + drift * rollout_steps
    rollout_lp_all = torch.log_softmax(rollout_logits, -1)
    tokens = torch.multinomial(rollout_lp_all.exp().view(-1, VOCAB), 1, generator=gen).view(ROWS, TOKENS, 1)
    rollout = rollout_lp_all.gather(-1, tokens).squeeze(-1) + _bf16_noise(gen, (ROWS, TOKENS))
    actor = torch.log_softmax(actor_logits, -1).gather(-1, tokens).squeeze(-1) + _bf16_noise(gen, (ROWS, TOKENS))
    return _batch(rollout, actor, torch.ones(ROWS, TOKENS), [False] * ROWS)


def _run(rollout_steps_of, steps=(0, 1, 10, 50, 100), seed=0, **kw) -> list[dict]:
    """The trainer's per-step metric over a run whose rollout serves ``rollout_steps_of(t)``'s weights at step t."""
    gen = torch.Generator().manual_seed(seed)
    base = 2.0 * torch.randn(ROWS, TOKENS, VOCAB, generator=gen)
    drift = 2e-3 * torch.randn(ROWS, TOKENS, VOCAB, generator=gen)  # one update at a small learning rate
    replay = _replay_step()
    return [replay._rollout_actor_agreement(_step(gen, base, drift, t, rollout_steps_of(t), **kw)) for t in steps]


def test_agreement_on_gpu_noise_stays_at_its_floor():
    """A working sync under bf16 noise: the gap is ~1e-2 with maxima above 1 (as on GPUs), yet the correlation
    stays near 1 and the gap relative to the first step near 1, step after step."""
    for seed in range(3):
        run = _run(lambda t: t, seed=seed)
        assert run[0][VS_FIRST] == 1.0
        for m in run:
            assert 5e-3 < m[MEAN] < 5e-2 and m[MAX] > 1.0  # the GPU noise floor: |diff| alone says nothing
            assert m[PEARSON] > 0.99
            assert 0.7 < m[VS_FIRST] < 1.4


def test_agreement_shows_a_rollout_left_on_stale_weights():
    """The sync never happens: the rollout keeps the first weights while the actor moves. One stale update hides in
    the noise; the ratio to the first step then climbs with every update, far above the noise run's band."""
    for seed in range(3):
        run = _run(lambda t: 0, seed=seed)
        ratios = [m[VS_FIRST] for m in run]
        assert ratios[1] < 1.4  # one update at a small lr: within the noise
        assert ratios[2] < ratios[3] < ratios[4] and ratios[4] > 3.0
        assert run[4][PEARSON] < run[0][PEARSON]


def test_agreement_shows_weights_that_are_not_the_actors():
    """A sync that loads wrong weights (a partial or mismatched load): the correlation falls far below the noise
    floor's at once, and the gap jumps."""
    run = _run(lambda t: t if t == 0 else None, wrong=1.0)
    assert run[0][PEARSON] > 0.99
    for m in run[1:]:
        assert m[PEARSON] < 0.95 and m[VS_FIRST] > 10.0


def test_agreement_keys_and_the_first_step_baseline():
    trainer = _replay_step()
    actor = torch.tensor([[-1.0, -2.0, -3.0], [-0.5, -1.5, -2.5]])
    mask = torch.ones(2, 3)
    first = trainer._rollout_actor_agreement(_batch(actor + 0.01, actor, mask, [False, False]))
    assert set(first) == {MEAN, MAX, PEARSON, VS_FIRST} and first[VS_FIRST] == 1.0
    assert first[MEAN] == pytest.approx(0.01) and first[PEARSON] == pytest.approx(1.0)
    later = trainer._rollout_actor_agreement(_batch(actor + 0.03, actor, mask, [False, False]))
    assert later[VS_FIRST] == pytest.approx(3.0)
    # an exact match (no noise at all) gives no baseline to divide by: the ratio waits for a non-zero gap
    exact = _replay_step()
    assert VS_FIRST not in exact._rollout_actor_agreement(_batch(actor, actor, mask, [False, False]))
    assert exact._rollout_actor_agreement(_batch(actor + 0.02, actor, mask, [False, False]))[VS_FIRST] == 1.0
