"""Fixtures for the real-verl CPU runs: cached offline assets and a hard-timeout runner that kills Ray too."""

from __future__ import annotations

import os
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path

import pytest

from recipe.exgrpo.harness.assets import Assets, ensure_assets
from recipe.exgrpo.harness.procs import RunResult, run_ray_command_in_new_session

E2E_DIR = Path(__file__).resolve().parent
TOY_REWARD = E2E_DIR / "toy_reward.py"


@pytest.fixture(scope="session")
def toy_reward_path() -> Path:
    return TOY_REWARD


@pytest.fixture
def ray_temp_dir() -> Iterator[str]:
    """A short, private Ray temp dir (Ray's socket paths must stay under ~107 characters)."""
    with tempfile.TemporaryDirectory(prefix="exgray-", dir="/tmp") as path:
        yield path


@pytest.fixture(scope="session")
def new_ray_temp_dir() -> Iterator[Callable[[], str]]:
    """``new_ray_temp_dir()``: another short, private Ray temp dir under /tmp, for module-scoped runs (all removed
    at the session's end). Not under pytest's ``tmp_path_factory``: its base can be deep (the test command gives
    each session its own, and a checkout may live at any depth), and a Ray socket path over 107 bytes fails
    ``ray.init`` at once."""
    made: list[tempfile.TemporaryDirectory] = []

    def new() -> str:
        made.append(tempfile.TemporaryDirectory(prefix="exgray-", dir="/tmp"))
        return made[-1].name

    yield new
    for d in made:
        d.cleanup()


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
        return run_ray_command_in_new_session(
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
# set by scripts/run_tests.sh, which builds the stack in the background: the build's exit code (once it ended), its log
SETUP_STATUS_ENV = "EXGRPO_VLLM_SETUP_STATUS"
SETUP_LOG_ENV = "EXGRPO_VLLM_SETUP_LOG"
SETUP_WAIT_S = 3600  # a backstop: a cold build takes minutes


def _background_setup_problem() -> str | None:
    """Wait for the background build of the vLLM CPU stack, if one runs; why it failed, or None."""
    status = os.environ.get(SETUP_STATUS_ENV)
    if not status:
        return None
    deadline = time.monotonic() + SETUP_WAIT_S
    while not Path(status).exists():
        if time.monotonic() > deadline:
            return f"the background build of the vLLM CPU stack did not end within {SETUP_WAIT_S} s"
        time.sleep(1)
    code = Path(status).read_text().strip()
    if code == "0":
        return None
    log = Path(os.environ.get(SETUP_LOG_ENV, ""))
    tail = log.read_text(errors="replace")[-3000:] if log.is_file() else ""
    return f"building the vLLM CPU stack failed (exit {code}; log {log}):\n{tail}"


@pytest.fixture(scope="session")
def vllm_python(repo_root: Path) -> str:
    """The interpreter of the vLLM CPU stack (``bash scripts/setup_env.sh --vllm``: ``.venv-vllm``, or
    ``$EXGRPO_VLLM_PYTHON``), once its background build (by the test command) has ended. Missing, the vLLM tests
    skip, unless ``EXGRPO_REQUIRE_VLLM=1`` (the test command sets it), where they fail."""
    import subprocess

    python = os.environ.get(VLLM_PYTHON_ENV) or str(repo_root / ".venv-vllm" / "bin" / "python")
    problem = _background_setup_problem()
    if problem:
        pytest.fail(problem)
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
    from recipe.exgrpo.harness.assets import asset_spec

    return ensure_assets(asset_spec("vllm"))
