"""Unit tests for exgrpo.objective (docs/algorithm.md §8): hand-computed values, gradients, edge cases."""

from __future__ import annotations

import dataclasses
import math
import pickle
from functools import partial

import pytest
import torch

from exgrpo.advantage import experience_group_rows, group_relative_advantages
from exgrpo.config import ExGRPOConfig
from exgrpo.objective import (
    AGG_MODES,
    LOG_RATIO_CLAMP,
    LOSS_AGG_MODES,
    LOSS_METRIC_KINDS,
    RANK_SUM_NORM,
    SHAPING_REGISTRY,
    LossSettings,
    Normalisers,
    aggregate_loss,
    get_shaping_fn,
    mixed_policy_loss,
    register_shaping,
)

BETA = 0.1
#: The settings these tests start from: fresh tokens PPO-clipped with verl's dual clip (c = 3), ε = 0.2.
S = partial(LossSettings, fresh_clip="always", dual_clip=True)
#: fresh_clip parametrised as on/off: "always" clips in every step, "never" in none.
FRESH_CLIP = {True: "always", False: "never"}


def _f(w: float, beta: float = BETA) -> float:
    return w / (w + beta)


# ------------------------------------------------------------------------------------------------ shaping
def test_registry_has_the_two_documented_shapings():
    assert {"none", "policy_shaping"} <= set(SHAPING_REGISTRY)


@pytest.mark.parametrize("w", [1e-3, 0.1, 0.5, 1.0, 2.0, 10.0])
def test_policy_shaping_is_w_over_w_plus_beta(w):
    got = get_shaping_fn("policy_shaping")(torch.tensor(math.log(w), dtype=torch.float64), beta=BETA)
    assert got.item() == pytest.approx(w / (w + BETA), rel=1e-12)
    got_none = get_shaping_fn("none")(torch.tensor(math.log(w), dtype=torch.float64), beta=BETA)
    assert got_none.item() == pytest.approx(w, rel=1e-12)


def test_unknown_shaping_names_the_registered_ones():
    with pytest.raises(ValueError, match="unknown shaping 'nope'.*policy_shaping"):
        get_shaping_fn("nope")


def test_adding_a_shaping_is_one_decorated_function():
    name = "_test_half_ratio"
    try:

        @register_shaping(name)
        def half(log_ratio: torch.Tensor, *, beta: float) -> torch.Tensor:
            return 0.5 * torch.exp(log_ratio)

        lp = torch.zeros(1, 1)
        loss, _ = mixed_policy_loss(
            lp,
            lp,
            lp,
            torch.tensor([[2.0]]),
            torch.ones(1, 1),
            torch.tensor([True]),
            S(loss_agg_mode="token-mean", shaping=name),
        )
        assert loss.item() == pytest.approx(-2.0 * 0.5)
        with pytest.raises(ValueError, match="already registered"):
            register_shaping(name)(lambda log_ratio, *, beta: log_ratio)
    finally:
        SHAPING_REGISTRY.unregister(name)


# ------------------------------------------------------------------------------------------------ settings
def test_loss_settings_defaults_are_the_config_defaults():
    """One source of defaults: LossSettings() holds ExGRPOConfig's defaults for every exgrpo key it carries."""
    cfg = ExGRPOConfig(k=8)
    assert LossSettings.from_config(cfg) == LossSettings()
    assert {key: getattr(LossSettings(), key) for key in LossSettings.EXGRPO_KEYS} == {
        key: getattr(cfg, key) for key in LossSettings.EXGRPO_KEYS
    }
    # every loss key of the config reaches the settings (nothing is dropped on the way to the workers)
    assert set(LossSettings.EXGRPO_KEYS) <= {f.name for f in dataclasses.fields(ExGRPOConfig)}


def test_loss_settings_from_config_keeps_the_config_strings_and_resolves_them():
    cfg = ExGRPOConfig.from_dict(
        {
            "shaping": "none",
            "shaping_beta": 1,
            "is_correction": False,
            "fresh_clip": "always",
            "dual_clip": True,
            "weight_terms_by_ratio": True,
            "loss_scale": "per_rank",
            "skip_grad_norm_above": 500,
        },
        k=4,
    )
    settings = LossSettings.from_config(cfg, loss_agg_mode="seq-mean-token-sum-norm", loss_scale_factor=8192)
    assert settings.fresh_clip == "always" and settings.loss_scale == "per_rank" and settings.shaping == "none"
    assert settings.shaping_beta == 1.0 and isinstance(settings.shaping_beta, float)
    assert settings.skip_grad_norm_above == 500.0 and isinstance(settings.skip_grad_norm_above, float)
    assert (settings.is_correction, settings.dual_clip, settings.weight_terms_by_ratio) == (False, True, True)
    assert [settings.fresh_clip_on(m) for m in (False, True)] == [True, True]
    assert settings.dual_clip_c == 3.0 and LossSettings().dual_clip_c is None
    assert settings.aggregation_modes() == (RANK_SUM_NORM, "token-mean")
    assert LossSettings(loss_agg_mode="token-sum").aggregation_modes() == ("token-sum", "token-sum")
    released = LossSettings(fresh_clip="released")
    assert [released.fresh_clip_on(m) for m in (False, True)] == [True, False]


def test_loss_settings_travel_small_and_whole():
    """The settings are pickled into every Ray worker: a frozen value of a few scalars."""
    settings = LossSettings.from_config(ExGRPOConfig(k=8)).with_actor(clip_ratio_low=0.1, entropy_coeff=0.001)
    blob = pickle.dumps(settings)
    assert pickle.loads(blob) == settings and len(blob) < 1024
    with pytest.raises(dataclasses.FrozenInstanceError):
        settings.fresh_clip = "never"  # type: ignore[misc]
    with pytest.raises(TypeError, match="not verl actor settings of the loss: \\['shaping'\\]"):
        settings.with_actor(shaping="none")


# ------------------------------------------------------------------------------------------------ aggregation
# Token losses [[1, 2, 3], [4, 5, 6], [nan, nan, nan]] with mask [[1, 1, 0], [1, 0, 0], [0, 0, 0]]:
# valid tokens 1, 2 | 4; the third row has no token (and NaN values that must not leak).
AGG_LOSS = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0], [float("nan")] * 3])
AGG_MASK = torch.tensor([[1, 1, 0], [1, 0, 0], [0, 0, 0]], dtype=torch.bool)
AGG_EXPECTED = {
    "token-mean": (1 + 2 + 4) / 3,
    "token-sum": 1 + 2 + 4,
    "seq-mean-token-sum": ((1 + 2) + 4) / 2,
    "seq-mean-token-mean": ((1 + 2) / 2 + 4 / 1) / 2,
    "seq-mean-token-sum-norm": ((1 + 2) + 4) / 2 / 3,  # default L = response_len = 3
}


@pytest.mark.parametrize("mode", AGG_MODES)
def test_aggregate_loss_hand_computed(mode):
    assert aggregate_loss(AGG_LOSS, AGG_MASK, mode).item() == pytest.approx(AGG_EXPECTED[mode])


def test_aggregate_loss_constant_normaliser_and_global_counts():
    got = aggregate_loss(AGG_LOSS, AGG_MASK, "seq-mean-token-sum-norm", loss_scale_factor=8192)
    assert got.item() == pytest.approx(7 / 2 / 8192)
    # Global normalisers of a 2-rank mini-batch: local sum / global count * dp_size.
    got = aggregate_loss(AGG_LOSS, AGG_MASK, "token-mean", dp_size=2, global_token_count=10)
    assert got.item() == pytest.approx(7 / 10 * 2)
    got = aggregate_loss(AGG_LOSS, AGG_MASK, "seq-mean-token-sum", dp_size=2, global_seq_count=4)
    assert got.item() == pytest.approx(7 / 4 * 2)
    got = aggregate_loss(AGG_LOSS, AGG_MASK, "seq-mean-token-mean", dp_size=2, global_seq_count=torch.tensor(4))
    assert got.item() == pytest.approx(5.5 / 4 * 2)


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-sum", "seq-mean-token-mean"])
def test_aggregate_loss_requires_global_counts_with_several_ranks(mode):
    with pytest.raises(ValueError, match="required when dp_size > 1"):
        aggregate_loss(AGG_LOSS, AGG_MASK, mode, dp_size=2)


def test_aggregate_loss_rejects_unknown_mode():
    with pytest.raises(ValueError, match="invalid loss_agg_mode 'mean'"):
        aggregate_loss(AGG_LOSS, AGG_MASK, "mean")


# ------------------------------------------------------------------------------------------------ §7 example
def _section7_batch():
    """One replay group of K = 8 (docs/algorithm.md §7): the replayed row (reward 1) plus 7 failing fresh rows.

    A* = 1 − 1/8 = 7/8, A_fresh = −1/8. All ratios are 1 (log_prob = old = behaviour). The replayed row has
    2 tokens, the fresh rows 1, 2, 1, 2, 1, 2, 1 tokens (10 fresh tokens)."""
    lengths = [2, 1, 2, 1, 2, 1, 2, 1]
    mask = torch.tensor([[1.0] * n + [0.0] * (2 - n) for n in lengths])
    adv = torch.tensor([7 / 8] + [-1 / 8] * 7).unsqueeze(-1) * mask
    lp = torch.full((8, 2), -0.7)
    replay = torch.tensor([True] + [False] * 7)
    return lp, adv, mask, replay


def _section7_expected(mode: str, replay_token_loss: float) -> float:
    fresh_token_loss = 1 / 8  # −A·w with A = −1/8, w = 1 (the clip is inactive at w = 1)
    total = 2 * replay_token_loss + 10 * fresh_token_loss
    if mode == "token-mean":
        return total / 12
    if mode == "token-sum":
        return total
    if mode == "seq-mean-token-sum":
        return total / 8
    if mode == "seq-mean-token-mean":
        return (replay_token_loss + 7 * fresh_token_loss) / 8
    return total / 8 / 2  # seq-mean-token-sum-norm, L = response_len = 2


@pytest.mark.parametrize("mode", AGG_MODES)
@pytest.mark.parametrize("fresh_clip", [True, False])
def test_section7_example_every_mode(mode, fresh_clip):
    lp, adv, mask, replay = _section7_batch()
    loss, metrics = mixed_policy_loss(
        lp, lp, lp, adv, mask, replay, S(loss_agg_mode=mode, fresh_clip=FRESH_CLIP[fresh_clip])
    )
    # Replayed token: −A*·f(1) = −(7/8)·(1/1.1).
    assert loss.item() == pytest.approx(_section7_expected(mode, -7 / 8 * _f(1.0)), rel=1e-6)
    assert metrics["exgrpo/replayed_shaped_weight_mean"] == pytest.approx(1 / 1.1)
    assert metrics["exgrpo/fresh_tokens"] == 10 and metrics["exgrpo/replayed_tokens"] == 2
    assert metrics["exgrpo/replayed_token_share"] == pytest.approx(2 / 12)


@pytest.mark.parametrize("mode", AGG_MODES)
def test_section7_example_without_shaping(mode):
    lp, adv, mask, replay = _section7_batch()
    loss, _ = mixed_policy_loss(lp, lp, lp, adv, mask, replay, S(loss_agg_mode=mode, shaping="none"))
    assert loss.item() == pytest.approx(_section7_expected(mode, -7 / 8), rel=1e-6)


def test_section7_constant_normaliser_lmax():
    lp, adv, mask, replay = _section7_batch()
    loss, _ = mixed_policy_loss(
        lp, lp, lp, adv, mask, replay, S(loss_agg_mode="seq-mean-token-sum-norm", loss_scale_factor=8192)
    )
    total = 2 * (-7 / 8 * _f(1.0)) + 10 * (1 / 8)
    assert loss.item() == pytest.approx(total / 8 / 8192, rel=1e-6)


# ------------------------------------------------------------------------------------------------ fresh tokens
# Four one-token fresh rows: (A, w) = (+1, 1.5), (−1, 0.5), (−1, 5), (+1, 0.5).
CLIP_A = torch.tensor([[1.0], [-1.0], [-1.0], [1.0]])
CLIP_W = torch.tensor([[1.5], [0.5], [5.0], [0.5]])


def _clip_case(replayed: bool, **settings):
    old = torch.zeros(4, 1)
    lp = torch.log(CLIP_W)
    replay = torch.full((4,), replayed)
    return mixed_policy_loss(lp, old, old, CLIP_A, torch.ones(4, 1), replay, S(loss_agg_mode="token-sum", **settings))


def test_fresh_ppo_clip_with_dual_clip_hand_computed():
    loss, m = _clip_case(False)
    # max(−A·w, −A·clip(w, 0.8, 1.2)), then min(·, −A·3) for A < 0:
    # row0 max(−1.5, −1.2) = −1.2 | row1 max(0.5, 0.8) = 0.8 | row2 min(max(5, 1.2), 3) = 3 | row3 max(−0.5, −0.8)
    assert loss.item() == pytest.approx(-1.2 + 0.8 + 3.0 - 0.5, rel=1e-6)
    assert m["exgrpo/fresh_clip_frac"] == pytest.approx(2 / 4)  # rows 0 and 1
    assert m["exgrpo/fresh_clip_frac_lower"] == pytest.approx(1 / 4)  # row 2
    assert m["exgrpo/fresh_ratio_max"] == pytest.approx(5.0)
    assert m["exgrpo/fresh_ratio_mean"] == pytest.approx((1.5 + 0.5 + 5 + 0.5) / 4)
    assert m["exgrpo/replayed_tokens"] == 0 and m["exgrpo/replayed_ratio_max"] == 0.0


def test_fresh_clip_without_dual_clip_and_asymmetric_eps():
    loss, _ = _clip_case(False, dual_clip=False)
    assert loss.item() == pytest.approx(-1.2 + 0.8 + 5.0 - 0.5, rel=1e-6)
    loss, _ = _clip_case(False, clip_ratio_low=0.1, clip_ratio_high=0.3, clip_ratio_c=2.0)
    # row0 max(−1.5, −1.3) | row1 max(0.5, 0.9) | row2 min(max(5, 1.3), 2) | row3 max(−0.5, −0.9)
    assert loss.item() == pytest.approx(-1.3 + 0.9 + 2.0 - 0.5, rel=1e-6)


def test_fresh_unclipped_is_minus_a_times_w():
    loss, m = _clip_case(False, fresh_clip="never")
    assert loss.item() == pytest.approx(-1.5 + 0.5 + 5.0 - 0.5, rel=1e-6)
    assert m["exgrpo/fresh_clip_frac"] == pytest.approx(2 / 4)  # reported as "would be clipped"


@pytest.mark.parametrize("shaping", ["policy_shaping", "none"])
def test_replayed_tokens_are_never_clipped(shaping):
    loss, m = _clip_case(True, shaping=shaping)
    fn = _f if shaping == "policy_shaping" else (lambda w: w)
    expected = -fn(1.5) + fn(0.5) + fn(5.0) - fn(0.5)
    assert loss.item() == pytest.approx(expected, rel=1e-6, abs=1e-6)  # float32 sum with cancellation
    assert m["exgrpo/fresh_tokens"] == 0 and m["exgrpo/fresh_clip_frac"] == 0.0
    assert m["exgrpo/replayed_ratio_max"] == pytest.approx(5.0)


# ------------------------------------------------------------------------------------------------ IS correction
def test_is_correction_uses_behaviour_log_probs_for_replayed_rows_only():
    # Row 0 replayed, row 1 fresh; π_θ = 1 (log 0), recomputed old 0.5, stored behaviour 0.25.
    lp = torch.zeros(2, 1)
    old = torch.full((2, 1), math.log(0.5))
    beh = torch.full((2, 1), math.log(0.25))
    adv = torch.ones(2, 1)
    kw = dict(loss_agg_mode="token-sum", shaping="none", fresh_clip="never")
    on, m_on = mixed_policy_loss(lp, old, beh, adv, torch.ones(2, 1), torch.tensor([True, False]), S(**kw))
    off, m_off = mixed_policy_loss(
        lp, old, beh, adv, torch.ones(2, 1), torch.tensor([True, False]), S(**kw, is_correction=False)
    )
    assert on.item() == pytest.approx(-4.0 - 2.0)  # replayed w = 1/0.25, fresh w = 1/0.5
    assert off.item() == pytest.approx(-2.0 - 2.0)  # both against the recomputed old log-probs
    assert m_on["exgrpo/replayed_ratio_mean"] == pytest.approx(4.0)
    assert m_off["exgrpo/replayed_ratio_mean"] == pytest.approx(2.0)


def test_behaviour_log_prob_required_only_when_used():
    lp = torch.zeros(2, 3)
    with pytest.raises(ValueError, match="behaviour_log_prob is required"):
        mixed_policy_loss(
            lp, lp, None, lp, torch.ones(2, 3), torch.tensor([True, False]), S(loss_agg_mode="token-mean")
        )
    # No replayed row, or IS correction off: None is fine.
    mixed_policy_loss(lp, lp, None, lp, torch.ones(2, 3), torch.tensor([False, False]), S(loss_agg_mode="token-mean"))
    mixed_policy_loss(
        lp,
        lp,
        None,
        lp,
        torch.ones(2, 3),
        torch.tensor([True, False]),
        S(loss_agg_mode="token-mean", is_correction=False),
    )


def test_behaviour_values_on_fresh_rows_are_ignored():
    lp, old = torch.randn(3, 4), torch.randn(3, 4)
    beh = torch.randn(3, 4)
    beh_garbage = beh.clone()
    beh_garbage[1:] = float("nan")  # fresh rows: never read
    replay = torch.tensor([True, False, False])
    adv = torch.randn(3, 4)
    a, _ = mixed_policy_loss(lp, old, beh, adv, torch.ones(3, 4), replay, S(loss_agg_mode="token-mean"))
    b, _ = mixed_policy_loss(lp, old, beh_garbage, adv, torch.ones(3, 4), replay, S(loss_agg_mode="token-mean"))
    assert torch.equal(a, b)


# ------------------------------------------------------------------------------------------------ gradients
@pytest.mark.parametrize("w", [1.0, BETA, 10.0, 0.37, 3.0])
@pytest.mark.parametrize("advantage", [0.7, -1.3])
def test_replayed_gradient_is_beta_w_over_w_plus_beta_squared(w, advantage):
    """∂(objective)/∂log π = β·w/(w+β)²·A for a replayed token (docs/algorithm.md §8); objective = −loss."""
    beh = torch.tensor([[-1.2, -0.4]], dtype=torch.float64)
    lp = (beh + math.log(w)).requires_grad_(True)
    adv = torch.tensor([[advantage, advantage]], dtype=torch.float64)
    loss, _ = mixed_policy_loss(
        lp, torch.zeros_like(beh), beh, adv, torch.ones_like(beh), torch.tensor([True]), S(loss_agg_mode="token-mean")
    )
    loss.backward()
    expected = BETA * w / (w + BETA) ** 2 * advantage / 2  # token-mean over 2 tokens
    torch.testing.assert_close(-lp.grad, torch.full_like(lp, expected), rtol=1e-10, atol=0)


def test_gradient_weight_reference_values():
    def weight(w: float) -> float:
        lp = torch.tensor([[math.log(w)]], dtype=torch.float64, requires_grad=True)
        z = torch.zeros(1, 1, dtype=torch.float64)
        loss, _ = mixed_policy_loss(
            lp, z, z, torch.ones_like(z), torch.ones_like(z), torch.tensor([True]), S(loss_agg_mode="token-mean")
        )
        loss.backward()
        return -lp.grad.item()

    assert weight(1.0) == pytest.approx(0.0826, abs=5e-5)  # "0.083·A at w = 1"
    assert weight(BETA) == pytest.approx(0.25)  # peak at w = β
    assert weight(10.0) == pytest.approx(0.0098, abs=5e-5)


def test_fresh_unclipped_gradient_is_a_times_w():
    lp = torch.tensor([[math.log(1.7)]], dtype=torch.float64, requires_grad=True)
    z = torch.zeros(1, 1, dtype=torch.float64)
    loss, _ = mixed_policy_loss(
        lp,
        z,
        None,
        torch.full_like(z, 0.5),
        torch.ones_like(z),
        torch.tensor([False]),
        S(loss_agg_mode="token-mean", fresh_clip="never"),
    )
    loss.backward()
    assert -lp.grad.item() == pytest.approx(0.5 * 1.7)


def test_advantages_per_row_equal_token_level():
    torch.manual_seed(1)
    lp, old, beh = torch.randn(4, 5), torch.randn(4, 5), torch.randn(4, 5)
    mask = (torch.rand(4, 5) > 0.3).float()
    row_adv = torch.randn(4)
    replay = torch.tensor([True, False, True, False])
    a, _ = mixed_policy_loss(lp, old, beh, row_adv, mask, replay, S(loss_agg_mode="token-mean"))
    b, _ = mixed_policy_loss(lp, old, beh, row_adv[:, None] * mask, mask, replay, S(loss_agg_mode="token-mean"))
    torch.testing.assert_close(a, b)


# ------------------------------------------------------------------------------------------------ robustness
@pytest.mark.parametrize("mode", AGG_MODES)
@pytest.mark.parametrize("shaping", ["policy_shaping", "none"])
@pytest.mark.parametrize("fresh_clip", [True, False])
def test_extreme_log_ratios_stay_finite(mode, shaping, fresh_clip):
    lp = torch.tensor([[50.0, -50.0, 0.0], [50.0, -50.0, 0.0], [0.0, 0.0, float("-inf")]], requires_grad=True)
    old = torch.tensor([[0.0, 0.0, 0.0], [0.0, 0.0, 0.0], [0.0, 0.0, float("-inf")]])
    beh = torch.zeros(3, 3)
    adv = torch.tensor([[1.0, -1.0, 1.0], [-1.0, 1.0, 1.0], [1.0, 1.0, float("nan")]])
    mask = torch.tensor([[1, 1, 1], [1, 1, 1], [1, 1, 0]])  # the NaN/−inf position is padding
    loss, metrics = mixed_policy_loss(
        lp,
        old,
        beh,
        adv,
        mask,
        torch.tensor([False, True, False]),
        S(loss_agg_mode=mode, shaping=shaping, fresh_clip=FRESH_CLIP[fresh_clip], entropy_coeff=0.001),
        entropy=torch.rand(3, 3),
    )
    loss.backward()
    assert torch.isfinite(loss)
    assert torch.isfinite(lp.grad).all()
    assert lp.grad[2, 2] == 0
    assert all(math.isfinite(v) for v in metrics.values())
    assert LOG_RATIO_CLAMP == 20.0  # verl clamps the log-ratio to ±20 too
    assert metrics["exgrpo/fresh_ratio_max"] == pytest.approx(math.exp(20.0), rel=1e-5)


def test_log_ratio_clamp_does_not_change_gradients_in_the_normal_range():
    lp = torch.linspace(-5, 5, 11, dtype=torch.float64).reshape(1, -1).requires_grad_(True)
    z = torch.zeros_like(lp)
    loss, _ = mixed_policy_loss(
        lp,
        z,
        None,
        torch.ones_like(z),
        torch.ones_like(z),
        torch.tensor([False]),
        S(loss_agg_mode="token-sum", fresh_clip="never"),
    )
    loss.backward()
    torch.testing.assert_close(-lp.grad, torch.exp(lp.detach()))  # d(w)/d log π = w, untouched by the clamp


@pytest.mark.parametrize("mode", AGG_MODES)
def test_empty_mask_gives_zero_loss_and_zero_gradient(mode):
    lp = torch.randn(3, 4, requires_grad=True)
    loss, metrics = mixed_policy_loss(
        lp,
        torch.randn(3, 4),
        torch.randn(3, 4),
        torch.randn(3, 4),
        torch.zeros(3, 4),
        torch.tensor([True, False, False]),
        S(loss_agg_mode=mode, entropy_coeff=0.01),
        entropy=torch.rand(3, 4),
    )
    loss.backward()
    assert loss.item() == 0.0
    assert torch.equal(lp.grad, torch.zeros(3, 4))
    assert all(math.isfinite(v) for v in metrics.values())
    assert metrics["exgrpo/fresh_tokens"] == 0 and metrics["exgrpo/replayed_token_share"] == 0.0


def test_empty_batch():
    e = torch.zeros(0, 5)
    loss, metrics = mixed_policy_loss(e, e, None, e, e, torch.zeros(0, dtype=torch.bool), S(loss_agg_mode="token-mean"))
    assert loss.item() == 0.0 and all(math.isfinite(v) for v in metrics.values())


@pytest.mark.parametrize("mode", [m for m in AGG_MODES if m != "seq-mean-token-sum-norm"])
def test_zero_token_rows_do_not_change_the_loss(mode):
    torch.manual_seed(2)
    lp, old, beh, adv = (torch.randn(4, 5) for _ in range(4))
    mask = (torch.rand(4, 5) > 0.3).float()
    mask[0, 0] = 1.0
    replay = torch.tensor([True, False, True, False])
    full_mask = mask.clone()
    full_mask[1] = 0.0  # row 1 has no response token
    keep = [0, 2, 3]
    a, _ = mixed_policy_loss(lp, old, beh, adv, full_mask, replay, S(loss_agg_mode=mode))
    b, _ = mixed_policy_loss(lp[keep], old[keep], beh[keep], adv[keep], mask[keep], replay[keep], S(loss_agg_mode=mode))
    torch.testing.assert_close(a, b)


# ------------------------------------------------------------------------------------------------ normalisation
def _random_batch(seed: int, b: int = 8, t: int = 6):
    g = torch.Generator().manual_seed(seed)
    lp = torch.randn(b, t, generator=g, dtype=torch.float64) * 0.3 - 1.0
    old = lp + torch.randn(b, t, generator=g, dtype=torch.float64) * 0.2
    beh = lp + torch.randn(b, t, generator=g, dtype=torch.float64) * 0.5
    adv = torch.randn(b, 1, generator=g, dtype=torch.float64).expand(b, t).clone()
    lengths = torch.randint(0, t + 1, (b,), generator=g)
    mask = (torch.arange(t)[None, :] < lengths[:, None]).to(torch.float64)
    replay = torch.rand(b, generator=g) < 0.4
    return lp, old, beh, adv, mask, replay


@pytest.mark.parametrize("mode", AGG_MODES)
def test_loss_and_gradient_do_not_depend_on_micro_batching(mode):
    """Summed micro-batch losses with global normalisers equal the whole-batch loss (verl's accumulation)."""
    lp, old, beh, adv, mask, replay = _random_batch(3)
    settings = S(loss_agg_mode=mode, loss_scale_factor=16, fresh_clip="always")
    whole_lp = lp.clone().requires_grad_(True)
    whole, _ = mixed_policy_loss(whole_lp, old, beh, adv, mask, replay, settings)
    whole.backward()

    n_tokens = mask.sum()
    n_seqs = int((mask.sum(-1) > 0).sum())
    micro_lp = lp.clone().requires_grad_(True)
    total = torch.zeros((), dtype=torch.float64)
    for rows in (slice(0, 3), slice(3, 4), slice(4, 8)):
        part, _ = mixed_policy_loss(
            micro_lp[rows],
            old[rows],
            beh[rows],
            adv[rows],
            mask[rows],
            replay[rows],
            settings,
            normalisers=Normalisers(global_token_count=n_tokens, global_seq_count=n_seqs),
        )
        part.backward()
        total = total + part.detach()
    torch.testing.assert_close(total, whole.detach())
    torch.testing.assert_close(micro_lp.grad, whole_lp.grad)


@pytest.mark.parametrize("mode", AGG_MODES)
def test_data_parallel_mean_of_ranks_equals_whole_batch(mode):
    lp, old, beh, adv, mask, replay = _random_batch(4)
    settings = S(loss_agg_mode=mode, loss_scale_factor=16)
    whole, _ = mixed_policy_loss(lp, old, beh, adv, mask, replay, settings)
    n_tokens, n_seqs = mask.sum(), int((mask.sum(-1) > 0).sum())
    ranks = [
        mixed_policy_loss(
            lp[r],
            old[r],
            beh[r],
            adv[r],
            mask[r],
            replay[r],
            settings,
            normalisers=Normalisers(dp_size=2, global_token_count=n_tokens, global_seq_count=n_seqs),
        )[0]
        for r in (slice(0, 4), slice(4, 8))
    ]
    # Each rank scales its share by dp_size; the gradient all-reduce averages the ranks.
    torch.testing.assert_close(sum(ranks) / 2, whole)


# ------------------------------------------------------------------------------------------------ metrics
EXPECTED_METRICS = {
    "pg_loss",
    "fresh_loss",
    "replayed_loss",
    "fresh_ratio_mean",
    "fresh_ratio_max",
    "fresh_clip_frac",
    "fresh_clip_frac_lower",
    "fresh_ppo_kl",
    "replayed_ratio_mean",
    "replayed_ratio_max",
    "replayed_shaped_weight_mean",
    "replayed_token_share",
    "fresh_tokens",
    "replayed_tokens",
    "replayed_rows",
}


@pytest.mark.parametrize("mode", AGG_MODES)
def test_metrics_names_and_loss_split(mode):
    lp, old, beh, adv, mask, replay = _random_batch(5)
    loss, m = mixed_policy_loss(lp, old, beh, adv, mask, replay, S(loss_agg_mode=mode), metric_prefix="x/")
    assert set(m) == {f"x/{k}" for k in EXPECTED_METRICS}
    assert set(LOSS_METRIC_KINDS) == EXPECTED_METRICS | {"entropy_loss"}
    assert all(isinstance(v, float) for v in m.values())
    assert m["x/pg_loss"] == pytest.approx(loss.item())
    assert m["x/fresh_loss"] + m["x/replayed_loss"] == pytest.approx(m["x/pg_loss"])
    rows_tokens = mask.sum(-1)
    assert m["x/replayed_tokens"] == rows_tokens[replay].sum().item()
    assert m["x/fresh_tokens"] == rows_tokens[~replay].sum().item()
    assert m["x/replayed_rows"] == replay.sum().item()


def test_metric_values_hand_computed():
    # Row 0 replayed: w = 2 and 0.5 against behaviour; row 1 fresh: w = 1.5 (A = 1 -> clipped at 1.2).
    beh = torch.zeros(2, 2)
    lp = torch.log(torch.tensor([[2.0, 0.5], [1.5, 1.0]]))
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0]])
    adv = torch.tensor([[1.0, 1.0], [1.0, 0.0]])
    loss, m = mixed_policy_loss(lp, beh, beh, adv, mask, torch.tensor([True, False]), S(loss_agg_mode="token-mean"))
    assert m["exgrpo/replayed_ratio_mean"] == pytest.approx(1.25)
    assert m["exgrpo/replayed_ratio_max"] == pytest.approx(2.0)
    assert m["exgrpo/replayed_shaped_weight_mean"] == pytest.approx((_f(2.0) + _f(0.5)) / 2)
    assert m["exgrpo/fresh_ratio_mean"] == pytest.approx(1.5)
    assert m["exgrpo/fresh_clip_frac"] == pytest.approx(1.0)
    assert m["exgrpo/fresh_ppo_kl"] == pytest.approx(-math.log(1.5))
    assert m["exgrpo/replayed_token_share"] == pytest.approx(2 / 3)
    assert m["exgrpo/replayed_loss"] == pytest.approx(-(_f(2.0) + _f(0.5)) / 3, rel=1e-6)
    assert m["exgrpo/fresh_loss"] == pytest.approx(-1.2 / 3, rel=1e-6)
    assert loss.item() == pytest.approx(-(_f(2.0) + _f(0.5) + 1.2) / 3, rel=1e-6)


# ------------------------------------------------------------------------------------------------ options
def test_explicit_term_weights():
    lp, adv, mask, replay = _section7_batch()
    rho = 0.25
    loss, m = mixed_policy_loss(
        lp, lp, lp, adv, mask, replay, S(loss_agg_mode="token-mean", weight_terms_by_ratio=True), replay_ratio=rho
    )
    expected = (rho * 2 * (-7 / 8 * _f(1.0)) + (1 - rho) * 10 * (1 / 8)) / 12
    assert loss.item() == pytest.approx(expected, rel=1e-6)
    # Whole replay group as the experience term (paper Eq. 4): every row of this group gets ρ.
    loss, _ = mixed_policy_loss(
        lp,
        lp,
        lp,
        adv,
        mask,
        replay,
        S(loss_agg_mode="token-mean", weight_terms_by_ratio=True),
        replay_ratio=rho,
        experience_group_mask=torch.ones(8, dtype=torch.bool),
    )
    assert loss.item() == pytest.approx(rho * _section7_expected("token-mean", -7 / 8 * _f(1.0)), rel=1e-6)
    # replay_ratio alone changes nothing.
    plain, _ = mixed_policy_loss(lp, lp, lp, adv, mask, replay, S(loss_agg_mode="token-mean"), replay_ratio=rho)
    assert plain.item() == pytest.approx(_section7_expected("token-mean", -7 / 8 * _f(1.0)), rel=1e-6)
    with pytest.raises(ValueError, match="replay_ratio"):
        mixed_policy_loss(lp, lp, lp, adv, mask, replay, S(loss_agg_mode="token-mean", weight_terms_by_ratio=True))


def _two_group_batch():
    """K = 3, two groups, all ratios 1 (log_prob = old = behaviour).

    Group "a" is a replay group: its replayed row (reward 1, 2 tokens) and two failing fresh siblings (1 token
    each): A* = 2/3, A = −1/3, −1/3. Group "b" is on-policy: rewards 1, 0, 0 with 2, 1, 1 tokens: A = 2/3, −1/3,
    −1/3. Per-row token-loss sums: replayed −A*·f(1)·2 = −(2/3)(10/11)·2 = −40/33; every fresh row −A·1·tokens:
    +1/3, +1/3 | −4/3, +1/3, +1/3.
    """
    uids = ["a", "a", "a", "b", "b", "b"]
    replay = torch.tensor([True, False, False, False, False, False])
    adv_rows = group_relative_advantages([1, 0, 0, 1, 0, 0], uids)
    lengths = [2, 1, 1, 2, 1, 1]
    mask = torch.tensor([[1.0] * n + [0.0] * (2 - n) for n in lengths])
    adv = torch.as_tensor(adv_rows, dtype=torch.float32).unsqueeze(-1) * mask
    lp = torch.full((6, 2), -0.4)
    return uids, lp, adv, mask, replay


def test_whole_replay_group_in_the_experience_term_hand_computed():
    uids, lp, adv, mask, replay = _two_group_batch()
    groups = torch.as_tensor(experience_group_rows(uids, replay.numpy()))
    assert groups.tolist() == [True, True, True, False, False, False]
    rho = 0.25
    settings = S(loss_agg_mode="token-sum", weight_terms_by_ratio=True)
    whole, m = mixed_policy_loss(
        lp, lp, lp, adv, mask, replay, settings, replay_ratio=rho, experience_group_mask=groups
    )
    # group a (ρ): −40/33 + 1/3 + 1/3 = −6/11; group b (1−ρ): −4/3 + 1/3 + 1/3 = −2/3
    assert whole.item() == pytest.approx(0.25 * (-6 / 11) + 0.75 * (-2 / 3), rel=1e-6)  # = −7/11
    assert whole.item() == pytest.approx(-7 / 11, rel=1e-6)
    # the split metrics stay consistent: replayed part ρ·(−40/33), fresh part the rest
    assert m["exgrpo/replayed_loss"] == pytest.approx(0.25 * -40 / 33, rel=1e-6)
    assert m["exgrpo/fresh_loss"] + m["exgrpo/replayed_loss"] == pytest.approx(whole.item(), rel=1e-6)
    # only the replayed row in the experience term (the former behaviour, no group mask): its siblings get 1−ρ
    rows_only, _ = mixed_policy_loss(lp, lp, lp, adv, mask, replay, settings, replay_ratio=rho)
    assert rows_only.item() == pytest.approx(0.25 * (-40 / 33) + 0.75 * (2 / 3) + 0.75 * (-2 / 3), rel=1e-6)
    # no term weights (released): plain sum −40/33 + 2/3 − 2/3
    plain, _ = mixed_policy_loss(lp, lp, lp, adv, mask, replay, S(loss_agg_mode="token-sum"))
    assert plain.item() == pytest.approx(-40 / 33, rel=1e-6)
    # the common normaliser still applies: seq-mean-token-sum-norm over 6 rows, L_max = 4
    norm, _ = mixed_policy_loss(
        lp,
        lp,
        lp,
        adv,
        mask,
        replay,
        S(loss_agg_mode="seq-mean-token-sum-norm", loss_scale_factor=4, weight_terms_by_ratio=True),
        experience_group_mask=groups,
        replay_ratio=rho,
    )
    assert norm.item() == pytest.approx(-7 / 11 / 6 / 4, rel=1e-6)


def test_experience_group_mask_must_cover_the_replayed_rows():
    uids, lp, adv, mask, replay = _two_group_batch()
    wrong = torch.tensor([False, True, True, False, False, False])
    with pytest.raises(ValueError, match="experience_group_mask must include every replayed row"):
        mixed_policy_loss(
            lp,
            lp,
            lp,
            adv,
            mask,
            replay,
            S(loss_agg_mode="token-sum", weight_terms_by_ratio=True),
            replay_ratio=0.5,
            experience_group_mask=wrong,
        )


# ------------------------------------------------------------------------------------------------ loss scale
# Two data-parallel ranks, two rows each (token losses; 0 = padding). Rank token sums: 6 and 7. L_max = 4.
RANK_LOSSES = (torch.tensor([[1.0, 2.0, 0.0], [3.0, 0.0, 0.0]]), torch.tensor([[4.0, 0.0, 0.0], [1.0, 1.0, 1.0]]))
RANK_MASKS = (torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]]), torch.tensor([[1.0, 0.0, 0.0], [1.0, 1.0, 1.0]]))


def test_loss_scales_side_by_side_two_ranks():
    """global (verl's seq-mean-token-sum-norm) vs per_rank (the released code) on the same 2 × 2 rows."""
    # global: each rank returns (local sum) / (4 global rows) × dp_size 2 / L_max 4; ranks are averaged
    ours = [
        aggregate_loss(
            x, m, "seq-mean-token-sum-norm", dp_size=2, global_token_count=7, global_seq_count=4, loss_scale_factor=4
        ).item()
        for x, m in zip(RANK_LOSSES, RANK_MASKS)
    ]
    assert ours == pytest.approx([6 / 4 * 2 / 4, 7 / 4 * 2 / 4])  # 0.75, 0.875
    assert sum(ours) / 2 == pytest.approx(13 / 16)  # = Σ_all / (rows 4 × L_max 4)
    # per_rank: each rank returns its own token sum / L_max; ranks are averaged
    released = [
        aggregate_loss(x, m, RANK_SUM_NORM, loss_scale_factor=4).item() for x, m in zip(RANK_LOSSES, RANK_MASKS)
    ]
    assert released == pytest.approx([6 / 4, 7 / 4])
    assert sum(released) / 2 == pytest.approx(13 / 8)  # = Σ_all / (dp 2 × L_max 4)
    # the ratio is the rows per rank (4 rows / 2 ranks); it does not depend on the values
    assert (sum(released) / 2) / (sum(ours) / 2) == pytest.approx(2.0)


@pytest.mark.parametrize(("dp", "ratio"), [(1, 512), (2, 256), (8, 64)])
def test_released_scale_over_ours_is_rows_per_rank(dp, ratio):
    """The 7B run: mini-batch 64 questions × K = 8 = 512 rows; at 8 GPUs the released gradient is 64× ours."""
    rows, t = 512, 3
    loss = torch.ones(rows, t)
    mask = torch.ones(rows, t)
    per_rank = rows // dp
    ours = (
        sum(
            aggregate_loss(
                loss[r * per_rank : (r + 1) * per_rank],
                mask[:per_rank],
                "seq-mean-token-sum-norm",
                dp_size=dp,
                global_token_count=rows * t,
                global_seq_count=rows,
                loss_scale_factor=8192,
            )
            for r in range(dp)
        )
        / dp
    )
    released = (
        sum(
            aggregate_loss(
                loss[r * per_rank : (r + 1) * per_rank], mask[:per_rank], RANK_SUM_NORM, loss_scale_factor=8192
            )
            for r in range(dp)
        )
        / dp
    )
    assert ours.item() == pytest.approx(rows * t / (rows * 8192))
    assert released.item() == pytest.approx(rows * t / (dp * 8192))
    assert (released / ours).item() == pytest.approx(ratio)


def test_rank_sum_norm_is_micro_batch_invariant_within_a_rank_and_defaults_to_response_len():
    x, m = RANK_LOSSES[1], RANK_MASKS[1]
    parts = aggregate_loss(x[:1], m[:1], RANK_SUM_NORM, loss_scale_factor=4) + aggregate_loss(
        x[1:], m[1:], RANK_SUM_NORM, loss_scale_factor=4
    )
    assert parts.item() == pytest.approx(aggregate_loss(x, m, RANK_SUM_NORM, loss_scale_factor=4).item())
    assert aggregate_loss(x, m, RANK_SUM_NORM).item() == pytest.approx(7 / 3)  # L = response_len = 3
    assert RANK_SUM_NORM in LOSS_AGG_MODES and RANK_SUM_NORM not in AGG_MODES  # not a verl mode


def test_entropy_can_use_its_own_aggregation():
    """loss_scale=per_rank: the policy term is the rank's token sum / L_max, the entropy bonus a token mean
    (released)."""
    lp, adv, mask, replay = _section7_batch()
    ent = torch.full_like(lp, 2.0) * mask
    loss, m = mixed_policy_loss(
        lp,
        lp,
        lp,
        adv,
        mask,
        replay,
        S(loss_scale="per_rank", loss_agg_mode="seq-mean-token-sum-norm", loss_scale_factor=4, entropy_coeff=0.001),
        entropy=ent,
    )
    assert S(loss_scale="per_rank", loss_scale_factor=4).aggregation_modes() == (RANK_SUM_NORM, "token-mean")
    total = 2 * (-7 / 8 * _f(1.0)) + 10 * (1 / 8)
    assert m["exgrpo/entropy_loss"] == pytest.approx(2.0)  # token mean of a constant 2
    assert loss.item() == pytest.approx(total / 4 - 0.001 * 2.0, rel=1e-6)
    with pytest.raises(ValueError, match="exgrpo.loss_scale must be one of"):  # checked once, with the config
        LossSettings.from_config(ExGRPOConfig.from_dict({"loss_scale": "per_token"}, k=4))
    with pytest.raises(ValueError, match="needs actor_rollout_ref.actor.loss_scale_factor"):
        mixed_policy_loss(lp, lp, lp, adv, mask, replay, S(loss_scale="per_rank"))


@pytest.mark.parametrize("mode", AGG_MODES)
def test_entropy_bonus_uses_the_same_aggregation(mode):
    lp, old, beh, adv, mask, replay = _random_batch(6)
    ent = torch.rand(lp.shape, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    base, _ = mixed_policy_loss(lp, old, beh, adv, mask, replay, S(loss_agg_mode=mode))
    loss, m = mixed_policy_loss(
        lp, old, beh, adv, mask, replay, S(loss_agg_mode=mode, entropy_coeff=0.001), entropy=ent
    )
    expected_ent = aggregate_loss(ent, mask, mode)
    assert m["exgrpo/entropy_loss"] == pytest.approx(expected_ent.item())
    assert loss.item() == pytest.approx(base.item() - 0.001 * expected_ent.item())


@pytest.mark.parametrize(
    ("settings", "call", "match"),
    [
        (dict(loss_agg_mode="seq-mean"), {}, "invalid loss_agg_mode 'seq-mean'"),
        (dict(loss_agg_mode="token-mean", shaping="w/(w+b)"), {}, "unknown shaping"),
        (dict(loss_agg_mode="token-mean", clip_ratio_c=1.0), {}, "clip_ratio_c"),
        (dict(loss_agg_mode="token-mean", clip_ratio_low=-0.1), {}, "clip_ratio_low"),
        (dict(loss_agg_mode="token-mean", fresh_clip="sometimes"), {}, "exgrpo.fresh_clip"),
        (dict(loss_agg_mode="token-mean", entropy_coeff=0.01), {}, "no entropy tensor"),
        (dict(loss_agg_mode="token-mean", weight_terms_by_ratio=True), {}, "needs this step's replay_ratio"),
    ],
)
def test_bad_options_raise_clear_errors(settings, call, match):
    lp = torch.zeros(2, 3)
    with pytest.raises(ValueError, match=match):
        mixed_policy_loss(lp, lp, lp, lp, torch.ones(2, 3), torch.tensor([True, False]), S(**settings), **call)


@pytest.mark.parametrize(
    ("exgrpo", "match"),
    [
        ({"shaping_beta": 0.0}, r"exgrpo\.shaping_beta must be a number in \(0\.0, inf\)"),
        ({"shaping": "w/(w+b)"}, r"exgrpo\.shaping must be one of \['none', 'policy_shaping'\]"),
        ({"fresh_clip": "sometimes"}, r"exgrpo\.fresh_clip must be one of"),
        ({"replay_ratio": 1.5}, r"exgrpo\.replay_ratio must be a number in \[0\.0, 1\.0\)"),
    ],
)
def test_the_losss_exgrpo_values_are_checked_once_with_the_config(exgrpo, match):
    """The loss trusts its validated config: a bad exgrpo value (or a step's rho out of [0, 1), which the schedule
    derives from exgrpo.replay_ratio) stops the run at start-up, where the config is validated."""
    with pytest.raises(ValueError, match=match):
        LossSettings.from_config(ExGRPOConfig.from_dict(exgrpo, k=4))


def test_bad_shapes_name_the_argument():
    lp = torch.zeros(2, 3)
    with pytest.raises(ValueError, match="replay_mask must have shape"):
        mixed_policy_loss(lp, lp, lp, lp, torch.ones(2, 3), torch.ones(2, 3).bool(), S(loss_agg_mode="token-mean"))
    with pytest.raises(ValueError, match="old_log_prob must have shape"):
        mixed_policy_loss(lp, lp[:1], lp, lp, torch.ones(2, 3), torch.ones(2).bool(), S(loss_agg_mode="token-mean"))
    with pytest.raises(ValueError, match="behaviour_log_prob must have shape"):
        mixed_policy_loss(lp, lp, lp[:, :2], lp, torch.ones(2, 3), torch.ones(2).bool(), S(loss_agg_mode="token-mean"))
