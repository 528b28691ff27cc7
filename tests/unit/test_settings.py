"""Each ``exgrpo.*`` key is declared once (exgrpo/settings.py): the declarations drive validation, the key list, the
settings reference, and the recipe's yaml must show exactly the declared keys with the declared defaults."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from exgrpo.checks import collecting
from exgrpo.config import ConfigError, ExGRPOConfig, settings_reference
from exgrpo.modes import REWARD_MODES, option_declarations
from exgrpo.settings import K, ModeOptions, check_settings, declared, setting

YAML = ("recipe", "exgrpo", "config", "exgrpo_trainer.yaml")


def _yaml_block(repo_root) -> dict:
    path = repo_root.joinpath(*YAML)
    if not path.exists():
        pytest.skip("recipe yaml not present")
    from omegaconf import OmegaConf

    return OmegaConf.to_container(OmegaConf.load(path).exgrpo, resolve=True)


def yaml_disagreements(block: dict) -> list[str]:
    """How the yaml's ``exgrpo:`` block differs from the declarations: a declared key it lacks (except those the
    trainer fills, K), a key no declaration has, a value or type (0 vs 0.0, true vs 1) other than the default."""
    declarations = {key: d for key, d in ExGRPOConfig.declarations().items() if d.setting.filled_from is None}
    declarations.update(option_declarations())  # the reward modes' keys: the yaml shows them too
    problems = [f"exgrpo.{key} is declared but not in the yaml" for key in declarations if key not in block]
    problems += [f"exgrpo.{key} is in the yaml but declared nowhere" for key in block if key not in declarations]
    for key, value in block.items():
        if key in declarations:
            default = declarations[key].default
            if value != default or type(value) is not type(default):
                problems.append(f"exgrpo.{key}: the yaml has {value!r}, the declaration's default is {default!r}")
    return problems


def test_the_yaml_shows_every_declared_key_with_its_default(repo_root):
    """Every key of the recipe's exgrpo: block is declared (the config's or a registered mode's), every declared key
    but K (filled from actor_rollout_ref.rollout.n) is in the yaml, so each switch is visible with its comment there,
    and every value is the declared default: the declarations are the one source of defaults, the yaml shows them."""
    block = _yaml_block(repo_root)
    problems = yaml_disagreements(block)
    assert not problems, "the yaml's exgrpo: block disagrees with the declarations:\n" + "\n".join(problems)
    ExGRPOConfig.from_dict(block, k=8)
    assert set(ExGRPOConfig.key_names()) - set(block) == {"k"}
    defaults = ExGRPOConfig().to_dict()
    differ = {key: (value, defaults[key]) for key, value in block.items() if value != defaults[key]}
    assert not differ, f"yaml exgrpo: values that differ from ExGRPOConfig's defaults (yaml, dataclass): {differ}"
    # the same types too (0 vs 0.0 or true vs 1 would compare equal)
    assert {key: type(value) for key, value in block.items()} == {key: type(defaults[key]) for key in block}


def test_the_yaml_check_names_each_disagreement(repo_root):
    block = _yaml_block(repo_root)
    bad = {**block, "mu": 0.6, "shaping_beta": 1, "not_a_key": 3}
    del bad["spread_epsilon"]
    assert sorted(yaml_disagreements(bad)) == [
        "exgrpo.mu: the yaml has 0.6, the declaration's default is 0.5",
        "exgrpo.not_a_key is in the yaml but declared nowhere",
        "exgrpo.shaping_beta: the yaml has 1, the declaration's default is 0.1",
        "exgrpo.spread_epsilon is declared but not in the yaml",
    ]


def test_the_reference_lists_every_key_with_help_type_default_and_allowed_values():
    rows = settings_reference()
    assert [r.key for r in rows] == ExGRPOConfig.key_names()
    for r in rows:
        assert r.help.strip() and "\n" not in r.help, f"exgrpo.{r.key} has no one-line help"
        assert r.type and r.allowed, r
    by_key = {r.key: r for r in rows}
    assert (by_key["replay_ratio"].type, by_key["replay_ratio"].default) == ("float", 0.5)
    assert by_key["replay_ratio"].allowed == "[0.0, 1.0)" and by_key["replay_ratio"].modes == ()
    assert by_key["bucket_lbound"].allowed == "[0, K-2]" and by_key["bucket_rbound"].allowed == "[1, K-1] | null"
    assert by_key["weighting"].allowed.startswith("one of: normal | linear")  # a registry's names, read now
    assert by_key["enable"].allowed == "true | false" and by_key["sigma"].type == "float | None"
    assert by_key["k"].filled_from == "actor_rollout_ref.rollout.n"
    assert by_key["delayed_start_threshold"].modes == ("binary",)
    assert by_key["spread_epsilon"].modes == ("continuous",) and by_key["spread_epsilon"].allowed == "(0.0, 1.0] | null"


@pytest.mark.parametrize("mode", sorted(REWARD_MODES))
def test_every_default_is_valid_by_its_own_declaration(mode):
    ExGRPOConfig(k=8, reward_mode=mode).validate()
    assert ExGRPOConfig.from_dict({"reward_mode": mode}, k=8).mode_options == REWARD_MODES[mode].options_class()


def test_the_config_holds_the_modes_own_options_as_real_attributes():
    cfg = ExGRPOConfig.from_dict({"reward_mode": "continuous", "flat_std": 0.5}, k=4)
    options = cfg.mode_options
    assert type(options).__name__ == "ContinuousOptions" and options.flat_std == 0.5
    assert cfg.to_dict()["flat_std"] == 0.5 and cfg.to_dict()["delayed_start_threshold"] == 0.35  # flat, as before
    assert not hasattr(cfg, "flat_std") and not hasattr(cfg, "options")  # no attribute of the config hides them
    with pytest.raises(TypeError, match="holds ContinuousOptions, not BinaryOptions"):
        REWARD_MODES["binary"].options_class.of(cfg)
    cfg.reward_mode = "binary"  # changed after it was built: the options are the other mode's
    with pytest.raises(ConfigError, match="reward_mode=binary reads BinaryOptions, but the config holds Continuous"):
        cfg.validate()


# ----------------------------------------------------------------------------------------- the declarations
@dataclass
class Example(ModeOptions):
    ratio: float = setting(0.5, lo=0.0, hi=1.0, hi_open=True, help="a ratio")
    count: int = setting(1, lo=1, hi=K - 1, hint="at most K-1", help="a count below K")
    cap: int | None = setting(None, lo=1, hint="null = no cap", help="an optional cap")
    flag: bool = setting(False, help="a switch")
    pick: str = setting("a", choices=("a", "b"), help="a choice")


def test_the_loop_checks_each_declared_key_with_its_range_and_hint():
    bad = Example(ratio=1.0, count=4, cap=0, flag="yes", pick="c")
    with pytest.raises(ConfigError) as info:
        with collecting():
            check_settings(bad, k=4)
    assert info.value.problems == [
        "exgrpo.ratio must be a number in [0.0, 1.0), got 1.0",
        "exgrpo.count must be an integer in [1, 3] (at most K-1), got 4",
        "exgrpo.cap must be an integer in [1, inf) (null = no cap), got 0",
        "exgrpo.flag must be true or false, got 'yes'",
        "exgrpo.pick must be one of ['a', 'b'], got 'c'",
    ]
    # K unknown: a bound relative to it is not checked; null is valid where the type allows it
    assert check_settings(Example(count=99), k=None) == {"ratio": True, "cap": True, "flag": True, "pick": True}
    seen = []
    check_settings(Example(), k=4, skip=("pick",), then={"count": lambda valid: seen.append(dict(valid))})
    assert seen == [{"ratio": True, "count": True}]  # a check across keys runs right after the key it follows


def test_a_declaration_needs_help_and_one_kind_of_constraint():
    with pytest.raises(ValueError, match="one line of help"):
        setting(1, help="")
    with pytest.raises(ValueError, match="one line of help"):
        setting(1, help="two\nlines")
    with pytest.raises(ValueError, match="a range or choices, not both"):
        setting("a", choices=("a",), lo=0, help="x")

    @dataclass
    class OpenInt:
        n: int = setting(1, lo=0, lo_open=True, help="an open integer range")

    with pytest.raises(TypeError, match="an integer setting's range is closed"):
        declared(OpenInt)

    @dataclass
    class Listy:
        xs: list = setting(None, help="a list")

    with pytest.raises(TypeError, match="must be one of bool, int, float, str"):
        declared(Listy)
    assert str(K - 2) == "K-2" and (K - 1).resolve(8) == 7 and str(K) == "K"
