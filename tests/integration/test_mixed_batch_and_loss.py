"""The verl adapter without Ray: the installed actor loss on a hand-made micro-batch TensorDict equals the exgrpo
objective (the mixed batch itself: tests/unit/test_replay_step_batch.py)."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("verl")

from verl import DataProto  # noqa: E402
from verl.utils import tensordict_utils as tu  # noqa: E402
from verl.workers.config import ActorConfig  # noqa: E402
from verl.workers.utils.padding import left_right_2_no_padding  # noqa: E402

from exgrpo.objective import LossSettings, mixed_policy_loss  # noqa: E402
from recipe.exgrpo.actor_loss import exgrpo_actor_loss  # noqa: E402
from recipe.exgrpo.replay_step.batch import mark_fresh  # noqa: E402
from recipe.exgrpo.replay_step.fields import BEHAVIOUR_LOG_PROBS_KEY, IS_REPLAY_KEY, MIXED_KEY, RATIO_KEY  # noqa: E402
from tests.helpers.replay_rows import P_LEN, R_LEN, generated_rows  # noqa: E402


def _micro_batch(seed=1, replay_rows=(1, 3), mixed=True):
    """A micro-batch TensorDict in the form verl's engine hands to the loss, plus the model's log-probs."""
    gen = generated_rows([2, 3, 4, 3], [6, 3, 5, 4], ["a", "a", "b", "b"], seed=seed)
    mark_fresh(gen)
    gen = DataProto(batch=gen.tensors, non_tensor_batch=gen.columns, meta_info=gen.meta)
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
