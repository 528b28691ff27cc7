"""The continuous reward mode (docs/algorithm.md §13) on hand-computed rewards: σ_q, σ̃, buckets, which members
are stored, flat groups, retirement, the delayed start, persistence of the mode and the config keys."""

from __future__ import annotations

import math

import pytest

from exgrpo.config import ConfigError, ExGRPOConfig
from exgrpo.experience import (
    BucketSampler,
    ExperiencePool,
    Group,
    PoolCheckpointError,
    TrajectorySelector,
    load_experience,
    save_experience,
)
from exgrpo.experience.manager import ExperienceManager
from exgrpo.modes.continuous import (
    ContinuousRules,
    group_spread,
    normalised_spreads,
    plan_groups,
    resolved_spread_epsilon,
    spread_bucket,
)
from exgrpo.schedule import ExperienceSchedule
from tests.helpers.experience import group

K = 4


def cont_cfg(**kw) -> ExGRPOConfig:
    return ExGRPOConfig.from_dict({"reward_mode": "continuous", **kw}, k=K)


# The hand-computed example used below (K = 4, population standard deviations):
#   A [0, 1, 1, 1]          mean 0.75  σ = sqrt(3/16)      = 0.43301  (the largest)
#   B [0.4, 0.6, 0.5, 0.5]  mean 0.5   σ = sqrt(0.02/4)    = 0.07071
#   C [0.5, 0.5, 0.5, 0.5]  mean 0.5   σ = 0                (flat, also the smallest)
#   D [0, 0.5, 0.25, 0.25]  mean 0.25  σ = sqrt(0.125/4)   = 0.17678
# With C in the step, σ_min = 0: σ̃ = max(σ / σ_max, ε = 1/K = 0.25): A 1, B 0.25 (0.16330 floored), D 0.40825;
# bucket = round(σ̃·4) clipped to 1..3: A 3, B 1, D 2.
A, B, C, D = [0, 1, 1, 1], [0.4, 0.6, 0.5, 0.5], [0.5] * 4, [0, 0.5, 0.25, 0.25]


def test_group_spread_is_the_population_std():
    assert group_spread(A) == pytest.approx(math.sqrt(3 / 16))
    assert group_spread(B) == pytest.approx(math.sqrt(0.005))
    assert group_spread(C) == 0.0
    assert group_spread([1.0, 2.0, 3.0, 4.0]) == pytest.approx(math.sqrt(1.25))
    with pytest.raises(ValueError, match="at least one"):
        group_spread([])


def test_normalised_spreads_min_max_with_epsilon_floor_and_equal_spreads():
    s = normalised_spreads([0.1, 0.3, 0.5], epsilon=0.125)
    assert s.tolist() == pytest.approx([0.125, 0.5, 1.0])  # the minimum is floored at ε
    assert normalised_spreads([0.2, 0.2], epsilon=0.1).tolist() == [1.0, 1.0]  # equal_spread=max (default)
    assert normalised_spreads([0.2], epsilon=0.1, equal_spread="mid").tolist() == [0.5]
    assert normalised_spreads([0.2, 0.2], epsilon=0.1, equal_spread="min").tolist() == [0.1, 0.1]


def test_spread_bucket_rounds_half_up_and_clips_to_the_sampled_buckets():
    assert [spread_bucket(t, 8) for t in (0.0, 0.05, 0.125, 0.3125, 0.5, 0.8, 0.9375, 1.0)] == [1, 1, 1, 3, 4, 6, 7, 7]
    assert [spread_bucket(t, 4) for t in (0.1633, 0.4082, 0.625, 1.0)] == [1, 2, 3, 3]


def test_plan_groups_on_hand_computed_rewards():
    rules = ContinuousRules(epsilon=1 / K)
    plans = plan_groups([group("A", A), group("B", B), group("C", C), group("D", D)], rules, K)
    a, b, c, d = plans
    assert [p.sigma for p in plans] == pytest.approx([math.sqrt(3 / 16), math.sqrt(0.005), 0.0, math.sqrt(0.03125)])
    assert (a.sigma_tilde, b.sigma_tilde, d.sigma_tilde) == pytest.approx((1.0, 0.25, 0.40825), abs=1e-5)
    assert (a.bucket, b.bucket, d.bucket) == (3, 1, 2)
    assert c.flat and c.bucket is None and c.sigma_tilde is None and not c.retire
    # above_mean: strictly above the group's mean
    assert (a.members, b.members, c.members, d.members) == ((1, 2, 3), (1,), (), (1,))
    # without C, σ_min is B's σ: B σ̃ = ε = 0.25 (bucket 1), D (0.17678 − 0.07071)/(0.43301 − 0.07071) = 0.29276
    a, b, d = plan_groups([group("A", A), group("B", B), group("D", D)], rules, K)
    assert (b.sigma_tilde, d.sigma_tilde) == pytest.approx((0.25, 0.29276), abs=1e-5) and (b.bucket, d.bucket) == (1, 1)


def test_the_replayed_member_counts_in_sigma_unless_switched_off_and_is_never_stored():
    rules = ContinuousRules(epsilon=1 / K)
    group_a = group("A", A, replayed=(1,))
    counted = plan_groups([group_a, group("D", D)], rules, K)[0]
    assert counted.sigma == pytest.approx(math.sqrt(3 / 16)) and counted.members == (2, 3)
    # count_replayed_in_k=false: the fresh members [0, 1, 1] alone: mean 2/3, σ = sqrt(2/9)
    fresh_only = plan_groups([group_a, group("D", D)], rules, K, count_replayed=False)[0]
    assert fresh_only.mean == pytest.approx(2 / 3) and fresh_only.sigma == pytest.approx(math.sqrt(2 / 9))
    assert fresh_only.members == (2, 3)


def test_member_rules_top_1_and_above_threshold():
    top = plan_groups([group("D", D), group("A", A)], ContinuousRules(epsilon=0.25, members="top_1"), K)
    assert top[0].members == (1,) and top[1].members == (1,)  # a tie goes to the first best member
    # the best fresh member below the mean (the replayed one is the best) stores nothing
    best_replayed = group("E", [2, 0, 0.9, 0], replayed=(0,))  # mean 0.725: the best fresh member, 0.9, is above it
    assert plan_groups([best_replayed, group("A", A)], ContinuousRules(0.25, members="top_1"), K)[0].members == (2,)
    only_replayed_high = group("F", [2, 0, 0, 0], replayed=(0,))  # mean 0.5: no fresh member above it
    assert plan_groups([only_replayed_high, group("A", A)], ContinuousRules(0.25, members="top_1"), K)[0].members == ()
    thr = ContinuousRules(epsilon=0.25, members="above_threshold", member_threshold=0.5)
    assert [p.members for p in plan_groups([group("A", A), group("D", D)], thr, K)] == [(1, 2, 3), (1,)]
    # what the rules need is checked once, with the config (ContinuousRules.from_config trusts it)
    with pytest.raises(ValueError, match="exgrpo.continuous_members=above_threshold needs exgrpo.member_threshold"):
        cont_cfg(continuous_members="above_threshold")
    with pytest.raises(ValueError, match="exgrpo.continuous_members must be one of .*did you mean 'top_1'"):
        cont_cfg(continuous_members="top1")


def test_collection_buckets_members_and_flat_groups(tmp_path):
    pool = ExperiencePool.from_config(cont_cfg())
    assert pool.reward_mode == "continuous"
    stats = pool.collect(1, [group("A", A), group("B", B), group("C", C), group("D", D)])
    assert (pool.bucket_of("A"), pool.bucket_of("B"), pool.bucket_of("C"), pool.bucket_of("D")) == (3, 1, None, 2)
    assert (pool.num_entries("A"), pool.num_entries("B"), pool.num_entries("D")) == (3, 1, 1)
    # the float reward is stored with the trajectory (float32, as the entry table keeps it)
    assert sorted(e.reward for e in pool.entries("D")) == [0.5] and pool.entries("B")[0].reward == pytest.approx(0.6)
    metrics = stats.as_metrics("c/")
    assert metrics["c/flat_groups"] == 1 and metrics["c/added_entries"] == 5 and metrics["c/bucket_updates"] == 3
    assert metrics["c/group_std_max"] == pytest.approx(math.sqrt(3 / 16))
    assert "success_counts" not in stats.mode_stats and stats.mode_stats["spread_buckets"] == [3, 1, 2]
    # A flat later (everyone scored 0.9): zero_success=bucket0 keeps its trajectories in the never-sampled bucket 0
    pool.collect(2, [group("A", [0.9] * 4, salt=1), group("B", B, salt=1)])
    assert pool.bucket_of("A") == 0 and pool.num_entries("A") == 3 and not pool.is_retired("A")
    # B alone in its call: every group has the same σ, so σ̃ = 1 (equal_spread=max) and B moves to bucket 3
    assert pool.bucket_of("B") == 3 and pool.num_entries("B") == 2
    # a binary pool never gets a reward_mode in its settings (its saved header is as it always was)
    assert "reward_mode" not in ExperiencePool(K).settings() and pool.settings()["reward_mode"] == "continuous"


def test_retirement_of_flat_groups_only_with_a_threshold():
    never = ExperiencePool.from_config(cont_cfg())
    never.collect(1, [group("A", A), group("S", [1.0] * 4)])
    assert not never.is_retired("S")  # retire_mean_reward null (the default): a flat group never retires
    pool = ExperiencePool.from_config(cont_cfg(retire_mean_reward=1.0, flat_std=0.01))
    # S: σ 0 and mean 1.0 >= 1.0: retired. N: [1, 1, 0.99, 1] has σ = 0.00433 <= flat_std (flat) but its mean
    # 0.9975 < 1.0: not retired, it follows zero_success. L: flat at 0.3.
    stats = pool.collect(
        1, [group("A", A), group("S", [1.0] * 4), group("N", [1.0, 1.0, 0.99, 1.0]), group("L", [0.3] * 4)]
    )
    assert pool.is_retired("S") and stats.retired == 1
    assert not pool.is_retired("N") and not pool.is_retired("L") and stats.mode_stats["flat_groups"] == 2
    assert pool.bucket_of("A") == 3 and pool.num_entries("N") == 0


def test_collection_bounds_apply_to_the_spread_bucket():
    pool = ExperiencePool.from_config(cont_cfg(bucket_lbound=1))
    stats = pool.collect(1, [group("A", A), group("B", B), group("C", C), group("D", D)])
    assert pool.bucket_of("B") is None and stats.out_of_range == 1 and pool.bucket_of("D") == 2


def test_malformed_group_stops_the_call_before_anything_changes():
    pool = ExperiencePool.from_config(cont_cfg())
    with pytest.raises(ValueError, match="expected K=4"):
        pool.collect(1, [group("A", A), Group("X", group("B", B).members[:3])])
    assert len(pool) == 0 and pool.counters["collect_calls"] == 0
    with pytest.raises(ValueError, match="non-finite reward"):
        pool.collect(1, [group("A", [0, float("nan"), 1, 1])])


def test_sampler_draws_from_the_spread_buckets():
    cfg = cont_cfg(seed=3)
    pool = ExperiencePool.from_config(cfg)
    pool.collect(1, [group("A", A), group("B", B), group("C", C), group("D", D)])
    draw = BucketSampler.from_config(cfg).draw(pool, 3)
    assert sorted(draw.question_ids) == ["A", "B", "D"] and draw.bucket_counts == {1: 1, 2: 1, 3: 1}


def test_pool_checkpoint_records_the_mode_and_refuses_the_other_one(tmp_path):
    cfg = cont_cfg()
    pool = ExperiencePool.from_config(cfg)
    pool.collect(1, [group("A", A), group("B", B), group("C", C), group("D", D)])
    save_experience(tmp_path / "cont", pool=pool, fsync=False)
    again = ExperiencePool.from_config(cfg)
    load_experience(tmp_path / "cont", pool=again)
    assert again.state_dict()["meta"] == pool.state_dict()["meta"] and again.bucket_of("D") == 2
    with pytest.raises(PoolCheckpointError, match="reward_mode=continuous but this run has exgrpo.reward_mode=binary"):
        load_experience(tmp_path / "cont", pool=ExperiencePool(K))
    binary = ExperiencePool(K)
    save_experience(tmp_path / "bin", pool=binary, fsync=False)
    with pytest.raises(
        PoolCheckpointError, match="header.json: the saved pool was collected with exgrpo.reward_mode=bin"
    ):
        load_experience(tmp_path / "bin", pool=ExperiencePool.from_config(cfg))


def test_manager_round_trip_and_delayed_start_signals(tmp_path):
    mgr = ExperienceManager(cont_cfg(continuous_start_steps=2, seed=5))
    assert not mgr.mixed
    mgr.collect(1, {"A": group("A", A).members, "D": group("D", D).members})
    assert not mgr.observe_rewards(A + D, 1) and mgr.observe_rewards(A + D, 2) and mgr.mixed
    assert mgr.schedule.switch_step == 2 and mgr.schedule.last_pass_rate == pytest.approx(0.5)
    mgr.save(tmp_path, {"leftover_rows": [1]})
    other = ExperienceManager(cont_cfg(continuous_start_steps=2, seed=5))
    assert other.load(tmp_path) == {"leftover_rows": [1]} and other.state_digest() == mgr.state_digest()
    assert other.draw_replay(4, 3) == mgr.draw_replay(4, 3)
    # continuous_start_steps=0 (the default): mixed from step 1
    assert ExperienceManager(cont_cfg()).mixed
    # mean_reward: the first step whose mean reward is above τ, in reward units (a negative τ is a level, not
    # "from step 1" as the binary pass rate's negative τ)
    by_reward = ExperienceManager(cont_cfg(continuous_start="mean_reward", continuous_start_reward=-1.0))
    assert not by_reward.mixed
    assert not by_reward.observe_rewards([-3.0, -1.0], 1) and by_reward.observe_rewards([-1.0, -0.5], 2)


def test_binary_schedule_is_unchanged_by_the_signal_option():
    s = ExperienceSchedule(0.5, threshold=0.35)
    assert s.signal == "pass_rate" and not s.mixed and not s.update(1, 0.35) and s.update(2, 0.36)
    assert ExperienceSchedule(0.5, threshold=-1).mixed
    with pytest.raises(ValueError, match="start signal"):
        ExperienceSchedule(0.5, signal="accuracy")


def test_selector_is_shared_by_both_modes():
    # selection does not look at rewards: the same selector serves the continuous pool
    assert (
        TrajectorySelector.from_config(cont_cfg()).state_dict()
        == TrajectorySelector.from_config(ExGRPOConfig.from_dict({}, k=K)).state_dict()
    )


def test_config_keys_are_validated_with_the_key_and_range():
    assert resolved_spread_epsilon(cont_cfg()) == 0.25 and resolved_spread_epsilon(cont_cfg(spread_epsilon=0.5)) == 0.5
    with pytest.raises(ConfigError) as e:
        cont_cfg(
            spread_epsilon=1.5,
            equal_spread="median",
            flat_std=-1,
            continuous_members="above_threshold",
            continuous_start="mean_reward",
            continuous_start_steps=-2,
            replay_reward="cached",
        )
    text = "\n".join(e.value.problems)
    for needle in (
        "exgrpo.spread_epsilon must be a number in (0.0, 1.0]",
        "exgrpo.equal_spread must be one of ['max', 'mid', 'min']",
        "exgrpo.flat_std must be a number in [0.0, inf)",
        "exgrpo.continuous_members=above_threshold needs exgrpo.member_threshold",
        "exgrpo.continuous_start=mean_reward needs exgrpo.continuous_start_reward",
        "exgrpo.continuous_start_steps must be an integer in [0, inf)",
        "exgrpo.replay_reward must be one of ['rescore', 'stored']",
    ):
        assert needle in text, (needle, text)
    with pytest.raises(ConfigError, match="exgrpo.reward_mode must be one of"):
        ExGRPOConfig.from_dict({"reward_mode": "real"}, k=K)
    # a continuous-only key in binary mode would do nothing: an error naming it
    with pytest.raises(ConfigError, match=r"exgrpo.flat_std=0.1 applies only with exgrpo.reward_mode=continuous"):
        ExGRPOConfig.from_dict({"flat_std": 0.1}, k=K)
    # and the binary pass rate's τ does nothing in continuous mode
    with pytest.raises(ConfigError, match="exgrpo.delayed_start_threshold=0.5 is the binary pass rate's tau"):
        cont_cfg(delayed_start_threshold=0.5)
    # replay_reward is a switch of both modes
    assert ExGRPOConfig.from_dict({"replay_reward": "stored"}, k=K).replay_reward == "stored"
