"""Every private name of verl/vLLM the recipe touches is reached through recipe/exgrpo/verl_compat.py, and that
module's check names each one that is missing or changed, with the installed version."""

from __future__ import annotations

import ast
import os
import subprocess
from pathlib import Path

import pytest

pytest.importorskip("verl")

from verl.trainer.ppo.ray_trainer import RayPPOTrainer  # noqa: E402

from recipe.exgrpo import verl_compat  # noqa: E402

REPO = Path(__file__).resolve().parents[2]


def test_every_private_name_is_present_in_the_installed_verl():
    assert verl_compat.check(("verl", "transformers")) == []


def test_a_missing_name_is_named_with_the_installed_version(monkeypatch):
    monkeypatch.delattr(RayPPOTrainer, "_get_dp_size")
    problems = verl_compat.check(("verl",))
    assert len(problems) == 1, problems
    assert problems[0].startswith("verl.trainer.ppo.ray_trainer.RayPPOTrainer._get_dp_size is gone (installed verl 0.9")
    assert "checked on 0.9.1" in problems[0] and "dp_size" in problems[0]


def test_a_changed_signature_is_named(monkeypatch):
    monkeypatch.setattr(RayPPOTrainer, "_balance_batch", lambda self, data, metrics=None: None)
    (problem,) = verl_compat.check(("verl",))
    assert "RayPPOTrainer._balance_batch takes ('self', 'data', 'metrics')" in problem
    assert "relies on ('self', 'batch', 'metrics', 'logging_prefix')" in problem


def test_a_missing_instance_attribute_and_module_are_named():
    gone = verl_compat.PrivateName("verl", "verl.workers.rollout.replica:RolloutReplica", "_no_such_handle", "x")
    assert gone.problem() == "verl.workers.rollout.replica.RolloutReplica._no_such_handle is gone"
    module = verl_compat.PrivateName("verl", "verl.no_such_module", "thing", "x")
    assert module.problem().startswith("verl.no_such_module cannot be imported: ModuleNotFoundError")


def test_the_command_line_exits_one_naming_what_is_missing(tmp_path):
    ok = subprocess.run(
        [_python(), "-m", "recipe.exgrpo.verl_compat", "verl"], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert ok.returncode == 0 and "every private name the recipe uses is present" in ok.stdout, ok.stderr[-2000:]
    # a verl without RayPPOTrainer._validate: a site-customisation removes it before the check runs
    (tmp_path / "sitecustomize.py").write_text(
        "import verl.trainer.ppo.ray_trainer as t\ndel t.RayPPOTrainer._validate\n", encoding="utf-8"
    )
    env = {**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{REPO}"}
    bad = subprocess.run(
        [_python(), "-m", "recipe.exgrpo.verl_compat", "verl"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert bad.returncode == 1, bad.stdout + bad.stderr[-2000:]
    assert "RayPPOTrainer._validate is gone (installed verl 0.9.1" in bad.stderr


def _python() -> str:
    import sys

    return sys.executable


def test_the_trainer_overrides_no_other_private_method_of_verl():
    from recipe.exgrpo.legacy.trainer import RayExGRPOTrainer

    own = {n for n in vars(RayExGRPOTrainer) if n.startswith("_") and not n.startswith("__")}
    assert own & set(dir(RayPPOTrainer)) == set(verl_compat.TRAINER_OVERRIDES)


def _private_attrs() -> set[str]:
    return {n.attr for n in verl_compat.PRIVATE_NAMES if n.attr and n.attr.startswith("_")}


def private_name_uses(source: str, names: set[str]) -> list[int]:
    """Lines that read or write one of ``names`` as an attribute. Allowed: ``super()._x()`` in an override, and
    ``self._x()`` for the trainer methods the recipe overrides (``verl_compat.TRAINER_OVERRIDES``: its own code)."""
    lines = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Attribute) and node.attr in names:
            value = node.value
            through_super = (
                isinstance(value, ast.Call) and isinstance(value.func, ast.Name) and value.func.id == "super"
            )
            own_override = (
                isinstance(value, ast.Name) and value.id == "self" and node.attr in verl_compat.TRAINER_OVERRIDES
            )
            if not (through_super or own_override):
                lines.append(node.lineno)
    return sorted(set(lines))


def test_only_the_compat_module_reaches_the_private_names():
    names = _private_attrs()
    offenders = {}
    for path in sorted((REPO / "recipe").rglob("*.py")):
        if path.name == "verl_compat.py":
            continue
        lines = private_name_uses(path.read_text(encoding="utf-8"), names)
        if lines:
            offenders[str(path.relative_to(REPO))] = lines
    assert not offenders, f"private verl/vLLM names used outside recipe/exgrpo/verl_compat.py: {offenders}"
    assert private_name_uses("x = trainer._get_gen_batch(b)\nsuper()._load_checkpoint()", names) == [1]
