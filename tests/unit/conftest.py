"""Fixtures of the unit tests (the plain helpers they share are in tests/helpers/)."""

import pytest


@pytest.fixture
def left_out(monkeypatch):
    """Leave protection layers of the sandbox out of the next calls (the fault injection of the sandbox tests'
    controls): "rlimits", "capabilities", "landlock", "seccomp", a part of one ("landlock:reads", "seccomp:<group>"
    of ``exgrpo.sandbox.child.SECCOMP_GROUPS``) or the runner's "cleanup"."""
    from exgrpo.sandbox import runner

    def leave_out(*layers: str) -> None:
        monkeypatch.setattr(runner, "_LEFT_OUT", frozenset(layers))

    return leave_out
