"""Config validation reports every bad ``exgrpo.*`` value and unknown key together, each naming its key."""

from __future__ import annotations

import pytest

from exgrpo.checks import collecting, fail
from exgrpo.config import ConfigError, ExGRPOConfig


def test_every_problem_is_reported_in_one_error():
    bad = {
        "replay_ratio": 1.5,
        "mu": "half",
        "weighting": "gaussian",
        "bucket_rbound": 9,
        "shaping_beta": 0.0,
        "enable": "yes",
        "replay_ratoi": 0.5,  # unknown key
    }
    with pytest.raises(ConfigError) as info:
        ExGRPOConfig.from_dict(bad, k=8)
    problems = info.value.problems
    for key in ("replay_ratio", "mu", "weighting", "bucket_rbound", "shaping_beta", "enable"):
        assert sum(p.startswith(f"exgrpo.{key} must") for p in problems) == 1, (key, problems)
    assert sum(p.startswith("unknown key(s) exgrpo.replay_ratoi ") for p in problems) == 1
    assert len(problems) == len(bad)
    message = str(info.value)
    assert message.startswith(f"{len(bad)} problems in the exgrpo config:")
    assert all(p in message for p in problems)
    assert "did you mean exgrpo.replay_ratio?" in message


def test_a_missing_k_does_not_hide_the_other_problems_nor_cascade():
    with pytest.raises(ConfigError) as info:
        ExGRPOConfig.from_dict({"mu": 2.0, "bucket_lbound": 5})
    problems = info.value.problems
    assert any("exgrpo.k " in p and "must be set" in p for p in problems)
    assert any(p.startswith("exgrpo.mu ") for p in problems)
    assert not any("bucket_lbound" in p for p in problems), "bounds against an unknown K are not checked"
    assert len(problems) == 2


def test_a_single_problem_keeps_its_plain_message():
    with pytest.raises(ConfigError) as info:
        ExGRPOConfig.from_dict({"mu": 2.0}, k=8)
    assert info.value.problems == [str(info.value)]
    assert str(info.value).startswith("exgrpo.mu must be a number in [0.0, 1.0]")


def test_validate_on_a_built_config_reports_all_and_the_cross_check_only_on_valid_bounds():
    cfg = ExGRPOConfig(k=4, bucket_lbound=2, bucket_rbound=1, seed=-1, trajectory_metric="entropi")
    with pytest.raises(ConfigError) as info:
        cfg.validate()
    problems = info.value.problems
    assert [p.split()[0] for p in problems] == ["exgrpo.seed", "exgrpo.bucket_lbound", "exgrpo.trajectory_metric"]
    assert "did you mean 'entropy'?" in problems[-1]
    cfg = ExGRPOConfig(k=4, bucket_lbound=2, bucket_rbound=2)
    with pytest.raises(ConfigError, match=r"^exgrpo\.bucket_lbound \(2\) must be < exgrpo\.bucket_rbound \(2\)"):
        cfg.validate()


def test_a_check_that_raises_directly_joins_the_problems_found_before_it():
    with pytest.raises(ConfigError) as info:
        with collecting():
            fail("exgrpo.a is wrong")
            raise ConfigError("exgrpo.b cannot be checked further")
    assert info.value.problems == ["exgrpo.a is wrong", "exgrpo.b cannot be checked further"]
    with pytest.raises(ConfigError, match="^exgrpo.c alone$"):
        fail("exgrpo.c alone")  # outside validation a check raises at once
