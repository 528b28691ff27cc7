"""Which Python the shell scripts run (scripts/lib/python.sh): PYTHON when set; else an activated environment's
python, the checkout's .venv, python on PATH, the first that has the packages; else one line saying what to set.

The candidates are stand-ins: a ``.venv/bin/python`` that runs this interpreter, and a ``python`` on PATH that runs
it with ``-S`` (no site-packages, so it lacks every third-party package, as a bare system Python does)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
HELPER = REPO / "scripts" / "lib" / "python.sh"


def _exe(path: Path, body: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"#!/bin/sh\n{body}\n", encoding="utf-8")
    path.chmod(0o755)
    return path


def _venv(root: Path) -> Path:
    """``root/.venv/bin/python``: this interpreter (which has the packages)."""
    return _exe(root / ".venv" / "bin" / "python", f'exec {sys.executable} "$@"')


def _bare_path(tmp_path: Path) -> str:
    """A PATH whose ``python`` has no third-party packages, then the system directories (bash, sed, ...)."""
    _exe(tmp_path / "bin" / "python", f'exec {sys.executable} -S "$@"')
    return f"{tmp_path / 'bin'}:/usr/bin:/bin"


def _env(path: str, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHON", "VIRTUAL_ENV", "CONDA_PREFIX", "DRY_RUN")}
    env["PATH"] = path
    env.update(extra)
    return env


def _pick(root: Path, env: dict[str, str], *modules: str) -> subprocess.CompletedProcess:
    script = f'source {HELPER}; exgrpo_pick_python {root} test "HINT" {" ".join(modules)}; echo "$PYTHON"'
    return subprocess.run(["bash", "-c", script], env=env, capture_output=True, text=True, timeout=60)


def test_the_checkout_venv_is_picked_when_python_is_unset(tmp_path):
    root = tmp_path / "checkout"
    venv = _venv(root)
    proc = _pick(root, _env(_bare_path(tmp_path)), "omegaconf", "hydra")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == str(venv)
    assert f"[test] python: {venv} (the checkout's .venv; PYTHON unset: set it to use another)" in proc.stderr


def test_without_a_venv_one_line_says_what_to_set(tmp_path):
    proc = _pick(tmp_path / "checkout", _env(_bare_path(tmp_path)), "omegaconf", "hydra")
    assert proc.returncode == 2 and proc.stdout == ""
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("[test] error: no Python here has omegaconf, hydra (tried: ")
    assert f"{tmp_path / 'checkout'}/.venv/bin/python: not there" in lines[0]
    assert f"{tmp_path / 'bin' / 'python'}: lacks omegaconf, hydra" in lines[0]
    assert "Set PYTHON to the python of the environment that has them: HINT" in lines[0]
    soft = _pick(tmp_path / "checkout", _env(_bare_path(tmp_path), EXGRPO_PICK_SOFT="1"), "omegaconf")
    assert soft.returncode == 0 and soft.stdout.strip() == "python" and "[test] warning: no Python" in soft.stderr


def test_python_on_path_or_an_activated_environment(tmp_path):
    good = tmp_path / "env" / "bin"
    _exe(good / "python", f'exec {sys.executable} "$@"')
    path = f"{good}:/usr/bin:/bin"
    root = tmp_path / "checkout"
    proc = _pick(root, _env(path), "omegaconf")  # no .venv: python on PATH has the packages
    assert proc.stdout.strip() == str(good / "python") and "(python on PATH;" in proc.stderr
    _venv(root)
    proc = _pick(root, _env(path, VIRTUAL_ENV=str(tmp_path / "env")), "omegaconf")  # activated: before the .venv
    assert proc.stdout.strip() == str(good / "python")
    assert f"(the activated environment {tmp_path / 'env'};" in proc.stderr
    proc = _pick(root, _env(path), "omegaconf")  # not activated: the checkout's .venv first
    assert proc.stdout.strip() == str(root / ".venv" / "bin" / "python")


def test_an_explicit_python_wins_and_must_exist(tmp_path):
    root = tmp_path / "checkout"
    _venv(root)
    proc = _pick(root, _env(_bare_path(tmp_path), PYTHON=sys.executable), "omegaconf")
    assert proc.stdout.strip() == sys.executable and f"[test] python: {sys.executable} (PYTHON)" in proc.stderr
    proc = _pick(root, _env(_bare_path(tmp_path), PYTHON="/no/such/python"), "omegaconf")
    assert proc.returncode == 2 and "PYTHON=/no/such/python is not a command that exists here" in proc.stderr


@pytest.fixture
def checkout(tmp_path) -> Path:
    """A copy of the scripts beside the project's packages: a checkout with its own (stand-in) .venv."""
    root = tmp_path / "checkout"
    shutil.copytree(REPO / "scripts", root / "scripts")
    for name in ("recipe", "exgrpo", "data_preprocess"):
        (root / name).symlink_to(REPO / name)
    return root


def test_a_dry_run_picks_the_checkout_venv(checkout, tmp_path):
    """``DRY_RUN=1 bash scripts/train/...`` from a fresh clone with .venv built and PYTHON unset."""
    venv = _venv(checkout)
    env = _env(_bare_path(tmp_path), DRY_RUN="1", DRY_RUN_QUIET="1", CKPT_DIR=str(tmp_path / "ckpt"))
    env.pop("VERL_PLATFORM", None)
    script = checkout / "scripts" / "train" / "exgrpo_qwen2.5_math_1.5b.sh"
    proc = subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"[exgrpo] python: {venv} (the checkout's .venv" in proc.stderr and "[dry-run] OK" in proc.stderr
    data = subprocess.run(
        ["bash", str(checkout / "scripts" / "prepare_data.sh")], env=env, capture_output=True, text=True, timeout=60
    )
    assert data.returncode == 0, data.stderr
    commands = [line for line in data.stderr.splitlines() if line.startswith("+ ")]
    assert len(commands) == 4 and all(c.startswith(f"+ {venv} -m data_preprocess.") for c in commands)


def test_without_any_python_the_scripts_say_what_to_set(checkout, tmp_path):
    env = _env(_bare_path(tmp_path), DRY_RUN="1", CKPT_DIR=str(tmp_path / "ckpt"))
    for script in ("train/exgrpo_qwen2.5_math_7b.sh", "train/ablations/mu_0.25.sh"):
        proc = subprocess.run(
            ["bash", str(checkout / "scripts" / script)], env=env, capture_output=True, text=True, timeout=60
        )
        assert proc.returncode == 2, proc.stderr
        assert "Traceback" not in proc.stderr and "ModuleNotFoundError" not in proc.stderr
        (error,) = [line for line in proc.stderr.splitlines() if "error" in line]
        assert error.startswith("[exgrpo] error: no Python here has omegaconf, hydra, verl")
        assert "Set PYTHON to" in error and "bash scripts/setup_env.sh builds .venv" in error
    env.pop("DRY_RUN")
    data = subprocess.run(
        ["bash", str(checkout / "scripts" / "prepare_data.sh")], env=env, capture_output=True, text=True, timeout=60
    )
    assert data.returncode == 2 and "No module named" not in data.stderr
    assert "[prepare_data] error: no Python here has pyarrow, tqdm, math_verify, datasets" in data.stderr
