"""Delayed start (strict >, one-way) and the replay-ratio ramp (docs/algorithm.md §9)."""

import json

import pytest

from exgrpo.config import ExGRPOConfig
from exgrpo.schedule import ExperienceSchedule, batch_pass_rate, replay_count


def test_switch_is_strict_and_one_way():
    s = ExperienceSchedule(0.5, threshold=0.35)
    assert not s.mixed and s.replay_ratio(1) == 0.0 and s.num_replay(1, 128) == 0
    assert s.update(1, 0.35) is False and not s.mixed  # equal is not enough
    assert s.update(2, 0.36) is True and s.mixed and s.switch_step == 2
    assert s.update(3, 0.0) is False and s.mixed  # never switches off
    assert s.replay_ratio(3) == 0.5 and s.num_replay(3, 128) == 64


def test_negative_threshold_is_mixed_from_step_one():
    s = ExperienceSchedule(0.5, threshold=-1.0)
    assert s.mixed and s.replay_ratio(1) == 0.5
    assert s.update(1, 0.0) is False and s.mixed


def test_ramp_after_switch():
    s = ExperienceSchedule(0.5, threshold=0.1, ramp_steps=4)
    s.update(10, 0.2)
    assert [s.replay_ratio(t) for t in range(10, 16)] == pytest.approx([0.0, 0.125, 0.25, 0.375, 0.5, 0.5])
    assert s.num_replay(11, 128) == 16


def test_ramp_from_step_one_with_negative_threshold():
    s = ExperienceSchedule(0.4, threshold=-0.5, ramp_steps=2)
    assert s.replay_ratio(1) == pytest.approx(0.2) and s.replay_ratio(2) == pytest.approx(0.4)


def test_replay_count_floor_is_robust():
    assert replay_count(128, 0.5) == 64
    assert replay_count(5, 0.5) == 2
    assert replay_count(100, 0.29) == 29  # 0.29 * 100 = 28.999999999999996 in floating point
    assert replay_count(10, 0.0) == 0


def test_batch_pass_rate():
    assert batch_pass_rate([1, 0, 1, 0, 0, 0, 0, 1]) == pytest.approx(3 / 8)
    with pytest.raises(ValueError):
        batch_pass_rate([])


def test_state_round_trip_and_from_config():
    cfg = ExGRPOConfig.from_dict({"replay_ratio": 0.25, "replay_ratio_ramp_steps": 3}, k=8)
    s = ExperienceSchedule.from_config(cfg)
    s.update(5, 0.9)
    state = json.loads(json.dumps(s.state_dict()))
    t = ExperienceSchedule.from_config(cfg)
    t.load_state_dict(state)
    assert t.mixed and t.switch_step == 5 and t.last_pass_rate == 0.9
    assert [t.replay_ratio(i) for i in range(5, 10)] == [s.replay_ratio(i) for i in range(5, 10)]


def test_invalid_values_stop_at_the_config():
    # the schedule trusts its validated config: what it reads is checked there, once, at start-up
    with pytest.raises(ValueError, match=r"exgrpo\.replay_ratio must be a number in \[0\.0, 1\.0\), got 1\.0"):
        ExperienceSchedule.from_config(ExGRPOConfig.from_dict({"replay_ratio": 1.0}, k=8))
    with pytest.raises(ValueError, match=r"exgrpo\.replay_ratio_ramp_steps must be an integer in \[0, inf\)"):
        ExperienceSchedule.from_config(ExGRPOConfig.from_dict({"replay_ratio_ramp_steps": -1}, k=8))
