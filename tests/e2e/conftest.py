"""Fixtures for the real-verl CPU runs: cached offline assets and a hard-timeout runner that kills Ray too."""

from __future__ import annotations

import os
import sys
import tempfile
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path

import pytest

from recipe.exgrpo.cpu.assets import Assets, ensure_assets
from recipe.exgrpo.cpu.procs import RunResult, run_in_new_session

E2E_DIR = Path(__file__).resolve().parent
TOY_REWARD = E2E_DIR / "toy_reward.py"


@pytest.fixture(scope="session")
def cpu_assets() -> Assets:
    """The tiny warmed-up model and the toy parquet files (built once, then read from <repo>/.cache)."""
    return ensure_assets()


@pytest.fixture(scope="session")
def toy_reward_path() -> Path:
    return TOY_REWARD


@pytest.fixture
def ray_temp_dir() -> Iterator[str]:
    """A short, private Ray temp dir (Ray's socket paths must stay under ~107 characters)."""
    with tempfile.TemporaryDirectory(prefix="exgray-", dir="/tmp") as path:
        yield path


@pytest.fixture
def run_cpu_job(repo_root: Path) -> Callable[..., RunResult]:
    """``run_cpu_job(args, env, timeout_s, log_path, leftover_grace_s=5.0)``: run ``python <args>`` in its own
    session.

    The whole session (driver, Ray's GCS/raylet/workers) is killed when the command ends or hits
    ``timeout_s``, so a hung placement group cannot outlive the test. ``leftover_grace_s``: how long the session's
    other processes may take to exit after the command did (``RunResult.leftover_pids`` are those still alive).
    """

    def run(
        args: Sequence[str], env: Mapping[str, str], timeout_s: float, log_path: Path, leftover_grace_s: float = 5.0
    ) -> RunResult:
        return run_in_new_session(
            [sys.executable, *args],
            env={**os.environ, **env},
            timeout_s=timeout_s,
            log_path=log_path,
            cwd=repo_root,
            leftover_grace_s=leftover_grace_s,
        )

    return run


VLLM_PYTHON_ENV = "EXGRPO_VLLM_PYTHON"
REQUIRE_VLLM_ENV = "EXGRPO_REQUIRE_VLLM"


@pytest.fixture(scope="session")
def vllm_python(repo_root: Path) -> str:
    """The interpreter of the vLLM CPU stack (``bash scripts/setup_env.sh --vllm``: ``.venv-vllm``, or
    ``$EXGRPO_VLLM_PYTHON``). Missing, the vLLM tests skip, unless ``EXGRPO_REQUIRE_VLLM=1`` (the test command sets
    it after installing the stack), where they fail."""
    import subprocess

    python = os.environ.get(VLLM_PYTHON_ENV) or str(repo_root / ".venv-vllm" / "bin" / "python")
    problem = None
    if not Path(python).exists():
        problem = f"no vLLM CPU stack at {python}: run bash scripts/setup_env.sh --vllm"
    else:
        check = subprocess.run(
            [python, "-m", "recipe.exgrpo.cpu.vllm_stack", "check"],
            cwd=repo_root,
            capture_output=True,
            text=True,
            timeout=120,
        )
        if check.returncode != 0:
            problem = f"the vLLM CPU stack at {python} is not ready: {check.stderr.strip()}"
    if problem:
        if os.environ.get(REQUIRE_VLLM_ENV) == "1":
            pytest.fail(problem)
        pytest.skip(problem)
    return python


@pytest.fixture(scope="session")
def vllm_assets() -> Assets:
    """The tiny model with vLLM's CPU attention head size (32), warmed up like the default one, and the toy data."""
    from recipe.exgrpo.cpu.assets import asset_spec

    return ensure_assets(asset_spec("vllm"))
