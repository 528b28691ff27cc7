"""The one registry helper: register once, look up with a did-you-mean, tags instead of side tables."""

import pytest

from exgrpo.registry import Registry


def test_register_lookup_and_mapping_behaviour():
    reg = Registry("bucket weighting", key="exgrpo.weighting")

    @reg.register("normal")
    def normal():
        return 1

    @reg.register("uniform", per_question=True)
    def uniform():
        return 2

    assert reg.get("normal") is normal and reg["uniform"] is uniform
    assert "normal" in reg and sorted(reg) == ["normal", "uniform"] and len(reg) == 2
    assert reg.tag("uniform", "per_question") is True and reg.tag("normal", "per_question") is None
    assert reg.names_with("per_question") == ["uniform"]
    assert tuple(reg) == ("normal", "uniform")  # registration order


def test_unknown_names_and_duplicates_are_errors():
    reg = Registry("shaping function", key="exgrpo.shaping")
    reg.register("policy_shaping")(lambda: 0)
    with pytest.raises(
        ValueError,
        match=r"unknown shaping function 'policy_shapin' \(exgrpo\.shaping\); "
        r"registered: \['policy_shaping'\]; did you mean 'policy_shaping'\?",
    ):
        reg.get("policy_shapin")
    with pytest.raises(ValueError, match="unknown shaping function 'zzz'.*registered") as info:
        reg.get("zzz")
    assert "did you mean" not in str(info.value)
    fn = reg["policy_shaping"]
    with pytest.raises(ValueError, match="already registered"):
        reg.register("policy_shaping")(fn)  # even the same object: one name, one registration
    with pytest.raises(ValueError, match="non-empty string"):
        reg.register("")
    with pytest.raises(KeyError):
        reg["nope"]  # plain Mapping access keeps dict semantics
    with pytest.raises(ValueError, match="unknown"):
        reg.tag("nope", "x")
    reg.unregister("policy_shaping")
    assert len(reg) == 0
