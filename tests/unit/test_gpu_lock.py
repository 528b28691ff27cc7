"""requirements-gpu.lock agrees with requirements.txt (offline): every requirement is locked, for each Python the
lock is for, at a version that satisfies it; every entry is pinned to one version; the header says how to
regenerate it. Resolving with the lock (and regenerating it) needs the package index:
tests/integration/test_gpu_lock_resolve.py."""

from __future__ import annotations

from pathlib import Path

import pytest
from packaging.markers import Marker
from packaging.requirements import Requirement

from recipe.exgrpo.launch_checks.env_check import GPU_LOCK, locked_versions, parse_lock, target_environment

REPO = Path(__file__).resolve().parents[2]
PYTHONS = ("3.10", "3.11", "3.12")  # README "Training on GPUs", scripts/install_gpu.sh


def requirement_lines(text: str) -> list[Requirement]:
    out = []
    for line in text.splitlines():
        line = line.split("#", 1)[0].strip()
        if line and not line.startswith("-"):
            out.append(Requirement(line))
    return out


def disagreements(requirements_text: str, lock_text: str, python: str) -> list[str]:
    """Each requirement (whose marker holds on Linux x86_64 + ``python``) that the lock misses or pins outside
    its specifier."""
    env = target_environment(python)
    locked = locked_versions(parse_lock(lock_text), env)
    out = []
    for req in requirement_lines(requirements_text):
        if req.marker and not Marker(str(req.marker)).evaluate(env):
            continue
        name = req.name.lower().replace("_", "-").replace(".", "-")
        if name not in locked:
            out.append(f"Python {python}: {req} is not in the lock")
        elif not req.specifier.contains(locked[name], prereleases=True):
            out.append(f"Python {python}: {req} but the lock has {name}=={locked[name]}")
    return out


@pytest.fixture(scope="module")
def lock_text() -> str:
    return (REPO / GPU_LOCK).read_text(encoding="utf-8")


@pytest.mark.parametrize("python", PYTHONS)
def test_every_requirement_is_locked_at_a_version_that_satisfies_it(lock_text, python):
    requirements = (REPO / "requirements.txt").read_text(encoding="utf-8")
    assert disagreements(requirements, lock_text, python) == [], "regenerate the lock: bash scripts/lock_gpu.sh"
    locked = locked_versions(parse_lock(lock_text), target_environment(python))
    # the stack the docs name, and its size (one resolution of 260-odd packages; a lock of a few lines is wrong)
    assert {k: locked[k] for k in ("verl", "torch", "vllm", "transformers")} == {
        "verl": "0.9.1",
        "torch": "2.11.0",
        "vllm": "0.24.0",
        "transformers": "5.9.0",
    }
    assert len(locked) > 200
    assert "flash-attn" not in locked  # its own step: PyPI has only its source, whose build needs torch


def test_the_check_names_a_missing_or_unsatisfied_requirement():
    lock = "torch==2.11.0\nnumpy==2.2.6 ; python_full_version < '3.11'\nnumpy==2.3.5 ; python_full_version >= '3.11'\n"
    requirements = "torch==2.11.0\nnumpy>=2.3\nray[default]>=2.41.0\nwinonly ; sys_platform == 'win32'\n"
    assert disagreements(requirements, lock, "3.11") == ["Python 3.11: ray[default]>=2.41.0 is not in the lock"]
    assert disagreements(requirements, lock, "3.10") == [
        "Python 3.10: numpy>=2.3 but the lock has numpy==2.2.6",
        "Python 3.10: ray[default]>=2.41.0 is not in the lock",
    ]


def test_the_lock_is_pinned_and_says_how_to_regenerate_it(lock_text):
    entries = parse_lock(lock_text)  # raises on any line that is not name==version
    assert len(entries) == len({(e.name, e.marker) for e in entries})
    header = [line for line in lock_text.splitlines()[:12] if line.startswith("#")]
    assert "#    bash scripts/lock_gpu.sh" in header
    assert any("uv pip compile requirements.txt --universal --python-version 3.10 --exclude-newer" in h for h in header)
    with pytest.raises(ValueError, match=r"requirements-gpu.lock:2: 'numpy>=2' is not pinned"):
        parse_lock("torch==2.11.0\nnumpy>=2\n")
    with pytest.raises(ValueError, match="both 1.0 and 2.0"):
        locked_versions(parse_lock("a==1.0\na==2.0 ; python_version >= '3.10'\n"), target_environment("3.11"))
