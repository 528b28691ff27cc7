"""exgrpo.objective against verl 0.9.1 itself: with no replayed rows and the clip on, mixed_policy_loss must be
verl's registered "vanilla" policy loss (loss and gradient), and aggregate_loss must be verl's agg_loss."""

from __future__ import annotations

import pytest

pytest.importorskip("verl")

import torch  # noqa: E402
from verl.trainer.ppo.core_algos import agg_loss, get_policy_loss_fn  # noqa: E402
from verl.workers.config import ActorConfig  # noqa: E402

from exgrpo.objective import AGG_MODES, LossSettings, Normalisers, aggregate_loss, mixed_policy_loss  # noqa: E402

CLIPS = [(0.2, 0.2, 3.0), (0.1, 0.28, 2.5)]


def _actor_config(low: float, high: float, c: float, mode: str, **global_batch_info) -> ActorConfig:
    # compute_policy_loss_vanilla reads clip_ratio(_low/_high), clip_ratio_c (config.get) and, for agg_loss,
    # config.global_batch_info (dp_size, batch_num_tokens, global_batch_size, loss_scale_factor), which verl's
    # ppo_loss fills per micro-batch. strategy/rollout_n/micro-batch size are only required by __post_init__.
    cfg = ActorConfig(
        strategy="fsdp",
        rollout_n=1,
        ppo_micro_batch_size_per_gpu=1,
        clip_ratio=low,
        clip_ratio_low=low,
        clip_ratio_high=high,
        clip_ratio_c=c,
        loss_agg_mode=mode,
    )
    cfg.global_batch_info.update(global_batch_info)
    return cfg


def _random_tensors(seed: int, b: int = 6, t: int = 9, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    log_prob = torch.randn(b, t, generator=g, dtype=dtype) * 0.5 - 1.0
    old = log_prob + torch.randn(b, t, generator=g, dtype=dtype) * 0.4  # ratios spread across the clip range
    adv = torch.randn(b, 1, generator=g, dtype=dtype).expand(b, t).clone()
    lengths = torch.randint(1, t + 1, (b,), generator=g)
    lengths[2] = 0  # a row with no response token
    mask = torch.arange(t)[None, :] < lengths[:, None]
    return log_prob, old, adv, mask


def _ours_and_verl(seed, low, high, c, mode, ours_kwargs, verl_info):
    log_prob, old, adv, mask = _random_tensors(seed)
    lp_ours = log_prob.clone().requires_grad_(True)
    lp_verl = log_prob.clone().requires_grad_(True)
    ours_kwargs = dict(ours_kwargs)
    settings = LossSettings(
        loss_agg_mode=mode,
        fresh_clip="always",
        dual_clip=True,  # verl's vanilla loss always applies the dual clip
        clip_ratio_low=low,
        clip_ratio_high=high,
        clip_ratio_c=c,
        loss_scale_factor=ours_kwargs.pop("loss_scale_factor", None),
    )
    ours, metrics = mixed_policy_loss(
        lp_ours,
        old,
        None,
        adv,
        mask,
        torch.zeros(mask.shape[0], dtype=torch.bool),
        settings,
        normalisers=Normalisers(**ours_kwargs),
    )
    vanilla = get_policy_loss_fn("vanilla")
    theirs, verl_metrics = vanilla(
        old_log_prob=old,
        log_prob=lp_verl,
        advantages=adv,
        response_mask=mask,
        loss_agg_mode=mode,
        config=_actor_config(low, high, c, mode, **verl_info),
        rollout_is_weights=None,
    )
    ours.backward()
    theirs.backward()
    return ours, theirs, lp_ours.grad, lp_verl.grad, metrics, verl_metrics


@pytest.mark.parametrize(("low", "high", "c"), CLIPS)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_token_mean_equals_verl_vanilla_loss_and_gradient(seed, low, high, c):
    ours, theirs, g_ours, g_verl, m, vm = _ours_and_verl(seed, low, high, c, "token-mean", {}, {})
    torch.testing.assert_close(ours, theirs)
    torch.testing.assert_close(g_ours, g_verl)
    assert g_verl.abs().sum() > 0  # the comparison is not between two zero gradients
    assert m["exgrpo/fresh_clip_frac"] == pytest.approx(vm["actor/pg_clipfrac"], abs=1e-6)
    assert m["exgrpo/fresh_clip_frac_lower"] == pytest.approx(vm["actor/pg_clipfrac_lower"], abs=1e-6)
    assert m["exgrpo/fresh_ppo_kl"] == pytest.approx(vm["actor/ppo_kl"], abs=1e-6)
    assert vm["actor/pg_clipfrac"] > 0  # the clip was exercised


@pytest.mark.parametrize("mode", AGG_MODES)
@pytest.mark.parametrize("global_info", [False, True])
def test_every_mode_equals_verl_vanilla_with_its_global_batch_info(mode, global_info):
    if global_info:
        # A 2-rank mini-batch: this micro-batch is part of 40 tokens / 10 rows over both ranks.
        ours_kw = dict(dp_size=2, global_token_count=40, global_seq_count=10, loss_scale_factor=64)
        verl_info = dict(dp_size=2, batch_num_tokens=40, global_batch_size=10, loss_scale_factor=64)
    else:
        ours_kw, verl_info = {}, {}
    ours, theirs, g_ours, g_verl, _, _ = _ours_and_verl(7, 0.2, 0.28, 3.0, mode, ours_kw, verl_info)
    torch.testing.assert_close(ours, theirs)
    torch.testing.assert_close(g_ours, g_verl)


@pytest.mark.parametrize("mode", AGG_MODES)
@pytest.mark.parametrize(
    "normalisers",
    [
        {},
        {"loss_scale_factor": 8192},
        {"dp_size": 4, "global_token_count": 123, "global_seq_count": 32, "loss_scale_factor": 8192},
    ],
)
def test_aggregate_loss_equals_verl_agg_loss(mode, normalisers):
    g = torch.Generator().manual_seed(11)
    loss_mat = torch.randn(7, 13, generator=g, requires_grad=True)
    lengths = torch.tensor([13, 1, 0, 7, 5, 12, 3])
    mask = torch.arange(13)[None, :] < lengths[:, None]
    ours = aggregate_loss(loss_mat, mask, mode, **normalisers)
    verl_kwargs = {
        "dp_size": normalisers.get("dp_size", 1),
        "batch_num_tokens": normalisers.get("global_token_count"),
        "global_batch_size": normalisers.get("global_seq_count"),
        "loss_scale_factor": normalisers.get("loss_scale_factor"),
    }
    theirs = agg_loss(loss_mat=loss_mat, loss_mask=mask, loss_agg_mode=mode, **verl_kwargs)
    torch.testing.assert_close(ours, theirs)
    (g_ours,) = torch.autograd.grad(ours, loss_mat)
    (g_verl,) = torch.autograd.grad(theirs, loss_mat)
    torch.testing.assert_close(g_ours, g_verl)


def test_entropy_term_matches_verl_ppo_loss_arithmetic():
    # verl's ppo_loss: policy_loss = pg_loss − entropy_coeff · agg_loss(entropy, same mode and normalisers).
    log_prob, old, adv, mask = _random_tensors(5)
    ent = torch.rand(mask.shape, generator=torch.Generator().manual_seed(3))
    mode = "seq-mean-token-sum-norm"
    ours, _ = mixed_policy_loss(
        log_prob,
        old,
        None,
        adv,
        mask,
        torch.zeros(mask.shape[0], dtype=torch.bool),
        LossSettings(
            loss_agg_mode=mode, fresh_clip="always", dual_clip=True, loss_scale_factor=32, entropy_coeff=0.001
        ),
        entropy=ent,
    )
    cfg = _actor_config(0.2, 0.2, 3.0, mode, loss_scale_factor=32)
    pg, _ = get_policy_loss_fn("vanilla")(old, log_prob, adv, mask, mode, cfg, None)
    theirs = pg - 0.001 * agg_loss(loss_mat=ent, loss_mask=mask, loss_agg_mode=mode, **cfg.global_batch_info)
    torch.testing.assert_close(ours, theirs)
