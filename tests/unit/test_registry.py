"""The one registry helper: register once, look up with a did-you-mean, tags instead of side tables; ``get`` and
``[]`` mean what they mean for any Mapping."""

import pytest

from exgrpo.registry import Registry, UnknownNameError


def test_register_lookup_and_mapping_behaviour():
    reg = Registry("bucket weighting", key="exgrpo.weighting")

    @reg.register("normal")
    def normal():
        return 1

    @reg.register("uniform", per_question=True)
    def uniform():
        return 2

    assert reg.get("normal") is normal and reg["uniform"] is uniform
    # get is the Mapping's: a default for an unknown name, never an error
    assert reg.get("nope") is None and reg.get("nope", normal) is normal and reg.get(["not", "a", "name"]) is None
    assert "normal" in reg and sorted(reg) == ["normal", "uniform"] and len(reg) == 2
    assert reg.tag("uniform", "per_question") is True and reg.tag("normal", "per_question") is None
    assert reg.names_with("per_question") == ["uniform"]
    assert tuple(reg) == ("normal", "uniform")  # registration order


def test_unknown_names_and_duplicates_are_errors():
    reg = Registry("shaping function", key="exgrpo.shaping")
    reg.register("policy_shaping")(lambda: 0)
    with pytest.raises(
        ValueError,
        match=r"^unknown shaping function 'policy_shapin' \(exgrpo\.shaping\); "
        r"registered: \['policy_shaping'\]; did you mean 'policy_shaping'\?$",
    ):
        reg["policy_shapin"]
    with pytest.raises(ValueError, match="unknown shaping function 'zzz'.*registered") as info:
        reg["zzz"]
    assert "did you mean" not in str(info.value)
    fn = reg["policy_shaping"]
    with pytest.raises(ValueError, match="already registered"):
        reg.register("policy_shaping")(fn)  # even the same object: one name, one registration
    with pytest.raises(ValueError, match="non-empty string"):
        reg.register("")
    with pytest.raises(KeyError, match=r"unknown shaping function 'nope'.*registered: \['policy_shaping'\]") as info:
        reg["nope"]  # a KeyError as for any Mapping, naming what is registered
    assert isinstance(info.value, UnknownNameError) and "nope" not in reg and reg.get("nope") is None
    with pytest.raises(ValueError, match="unknown"):
        reg.tag("nope", "x")
    reg.unregister("policy_shaping")
    assert len(reg) == 0
