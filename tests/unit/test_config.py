"""ExGRPOConfig: defaults, round trip, unknown keys with suggestions, range checks naming the key."""

import json

import pytest

from exgrpo.config import ConfigError, ExGRPOConfig
from exgrpo.experience import sampler as sampler_mod


def test_defaults_follow_algorithm_md():
    cfg = ExGRPOConfig.from_dict({}, k=8)
    assert cfg.k == 8
    assert cfg.replay_ratio == 0.5 and cfg.mode_options.delayed_start_threshold == 0.35
    assert cfg.resolved_rbound == 7 and cfg.bucket_rbound is None and cfg.bucket_lbound == 0  # None -> K-1
    assert cfg.resolved_sigma == pytest.approx(1 / 8) and cfg.sigma is None  # None -> 1/K (accuracy units)
    assert cfg.weighting == "normal" and cfg.mu == 0.5
    assert cfg.trajectory_metric == "entropy" and cfg.trajectory_mode == "min"
    assert cfg.zero_success == "bucket0" and cfg.collect_from == "start"
    assert cfg.count_replayed_in_k is True and cfg.retire_fresh_prompts is True
    assert cfg.shaping == "policy_shaping" and cfg.shaping_beta == 0.1
    assert cfg.is_correction is True and cfg.fresh_clip == "released"
    assert cfg.weight_terms_by_ratio is False and cfg.resume_pool == "required" and cfg.enable is True
    assert cfg.dual_clip is False and cfg.loss_scale == "global" and cfg.skip_grad_norm_above is None


def test_round_trip_and_json():
    d = {
        "seed": 3,
        "replay_ratio": 0.25,
        "replay_ratio_ramp_steps": 10,
        "delayed_start_threshold": -1.0,
        "bucket_lbound": 1,
        "bucket_rbound": 5,
        "zero_success": "keep",
        "max_total_tokens": 1000,
        "weighting": "linear_clip",
        "sigma": 0.2,
        "trajectory_metric": "diversity",
        "trajectory_mode": "max",
        "max_candidates_per_question": 4,
        "shaping": "none",
        "shaping_beta": 0.3,
    }
    cfg = ExGRPOConfig.from_dict(d, k=8)
    out = cfg.to_dict()
    json.dumps(out)
    again = ExGRPOConfig.from_dict(out)
    assert again == cfg
    assert again.resolved_sigma == 0.2 and again.resolved_rbound == 5


def test_k_argument_overrides_and_is_required():
    assert ExGRPOConfig.from_dict({"k": 4}, k=16).k == 16
    assert ExGRPOConfig.from_dict({"k": 4}).k == 4
    with pytest.raises(ConfigError, match=r"exgrpo\.k .*must be set"):
        ExGRPOConfig.from_dict({})
    with pytest.raises(ConfigError, match=r"exgrpo\.k must be an integer in \[2, inf\)"):
        ExGRPOConfig.from_dict({}, k=1)


@pytest.mark.parametrize(
    ("d", "pattern"),
    [
        ({"repaly_ratio": 0.3}, r"exgrpo\.repaly_ratio \(did you mean exgrpo\.replay_ratio\?\)"),
        ({"weightng": "normal"}, r"exgrpo\.weightng \(did you mean exgrpo\.weighting\?\)"),
        ({"trajectory_metrics": "entropy"}, r"did you mean exgrpo\.trajectory_metric\?"),
        ({"bogus_key_zz": 1}, r"unknown key\(s\) exgrpo\.bogus_key_zz; allowed keys: enable, k,"),
    ],
)
def test_unknown_keys_are_named_with_suggestion(d, pattern):
    with pytest.raises(ConfigError, match=pattern):
        ExGRPOConfig.from_dict(d, k=8)


@pytest.mark.parametrize(
    ("d", "key", "rng"),
    [
        ({"replay_ratio": 1.0}, "replay_ratio", r"\[0\.0, 1\.0\)"),
        ({"replay_ratio": -0.1}, "replay_ratio", r"\[0\.0, 1\.0\)"),
        ({"replay_ratio_ramp_steps": -1}, "replay_ratio_ramp_steps", r"\[0, inf\)"),
        ({"delayed_start_threshold": 1.0}, "delayed_start_threshold", r"\(-inf, 1\.0\)"),
        ({"shaping_beta": 0.0}, "shaping_beta", r"\(0\.0, inf\)"),
        ({"sigma": 0.0}, "sigma", r"\(0\.0, inf\)"),
        ({"mu": 1.5}, "mu", r"\[0\.0, 1\.0\]"),
        ({"bucket_rbound": 8}, "bucket_rbound", r"\[1, 7\]"),
        ({"bucket_lbound": 7}, "bucket_lbound", r"\[0, 6\]"),
        ({"max_entries_per_question": 0}, "max_entries_per_question", r"\[1, inf\)"),
        ({"seed": -1}, "seed", r"\[0, inf\)"),
        ({"seed": 1.5}, "seed", r"\[0, inf\)"),
        ({"replay_ratio": float("nan")}, "replay_ratio", r"\[0\.0, 1\.0\)"),
        ({"replay_ratio": "0.5"}, "replay_ratio", r"\[0\.0, 1\.0\)"),
    ],
)
def test_ranges_name_the_key_and_range(d, key, rng):
    with pytest.raises(ConfigError, match=rf"exgrpo\.{key} must be .*{rng}"):
        ExGRPOConfig.from_dict(d, k=8)


def test_a_removed_key_says_what_replaced_it():
    with pytest.raises(ConfigError, match=r"exgrpo\.entropy_token_budget was removed: .*old-log-prob pass"):
        ExGRPOConfig.from_dict({"entropy_token_budget": 4096}, k=8)


def test_bounds_must_be_ordered():
    with pytest.raises(ConfigError, match=r"exgrpo\.bucket_lbound \(3\) must be < exgrpo\.bucket_rbound \(2\)"):
        ExGRPOConfig.from_dict({"bucket_lbound": 3, "bucket_rbound": 2}, k=8)
    with pytest.raises(ConfigError, match=r"bucket_lbound \(4\) must be < .*bucket_rbound \(4\)"):
        ExGRPOConfig.from_dict({"bucket_lbound": 4, "bucket_rbound": 4}, k=8)


@pytest.mark.parametrize(
    ("d", "key", "hint"),
    [
        ({"weighting": "gausian"}, "weighting", None),
        ({"trajectory_metric": "entropi"}, "trajectory_metric", "entropy"),
        ({"trajectory_mode": "argmin"}, "trajectory_mode", None),
        ({"zero_success": "bucket_0"}, "zero_success", "bucket0"),
        ({"collect_from": "switch"}, "collect_from", None),
        ({"resume_pool": "require"}, "resume_pool", "required"),
        ({"shaping": "policy-shaping"}, "shaping", "policy_shaping"),
        ({"fresh_clip": "sometimes"}, "fresh_clip", None),
        ({"loss_scale": "per-rank"}, "loss_scale", "per_rank"),
    ],
)
def test_choices_are_validated(d, key, hint):
    with pytest.raises(ConfigError, match=rf"exgrpo\.{key} must be one of") as e:
        ExGRPOConfig.from_dict(d, k=8)
    if hint:
        assert f"did you mean {hint!r}" in str(e.value)


def test_training_semantics_switches():
    cfg = ExGRPOConfig.from_dict(
        {"fresh_clip": "never", "dual_clip": True, "loss_scale": "per_rank", "skip_grad_norm_above": 500}, k=8
    )
    assert (cfg.fresh_clip, cfg.dual_clip, cfg.loss_scale, cfg.skip_grad_norm_above) == ("never", True, "per_rank", 500)
    for bad in (0, -1.0, float("inf"), "500", True):
        with pytest.raises(ConfigError, match=r"exgrpo\.skip_grad_norm_above must be a number in \(0\.0, inf\)"):
            ExGRPOConfig.from_dict({"skip_grad_norm_above": bad}, k=8)
    with pytest.raises(ConfigError, match=r"exgrpo\.dual_clip must be true or false"):
        ExGRPOConfig.from_dict({"dual_clip": "no"}, k=8)


def test_bools_are_not_coerced():
    with pytest.raises(ConfigError, match=r"exgrpo\.count_replayed_in_k must be true or false"):
        ExGRPOConfig.from_dict({"count_replayed_in_k": "yes"}, k=8)
    with pytest.raises(ConfigError, match=r"exgrpo\.enable must be true or false"):
        ExGRPOConfig.from_dict({"enable": 1}, k=8)


def test_block_must_be_mapping_and_none_means_defaults():
    with pytest.raises(ConfigError, match=r"exgrpo must be a mapping"):
        ExGRPOConfig.from_dict([("seed", 1)], k=8)
    assert ExGRPOConfig.from_dict(None, k=8) == ExGRPOConfig(k=8)


def test_a_newly_registered_weighting_is_accepted():
    name = "test_only_weighting"
    sampler_mod.register_bucket_weighting(name)(lambda b, k, mu, s: b * 0 + 1)
    try:
        assert ExGRPOConfig.from_dict({"weighting": name}, k=8).weighting == name
    finally:
        sampler_mod.BUCKET_WEIGHTINGS.unregister(name)
    with pytest.raises(ConfigError):
        ExGRPOConfig.from_dict({"weighting": name}, k=8)


def test_a_newly_registered_shaping_is_accepted():
    from exgrpo.objective import SHAPING_REGISTRY, register_shaping

    name = "test_only_shaping"
    register_shaping(name)(lambda log_ratio, *, beta: log_ratio)
    try:
        assert ExGRPOConfig.from_dict({"shaping": name}, k=8).shaping == name
    finally:
        SHAPING_REGISTRY.unregister(name)
    with pytest.raises(ConfigError, match="exgrpo.shaping must be one of"):
        ExGRPOConfig.from_dict({"shaping": name}, k=8)
