"""Shared test fixtures. Subfolders keep their own fixtures in their own conftest.py."""

import pathlib

import pytest

from recipe.exgrpo.harness.procs import install_termination_handlers

REPO_ROOT = pathlib.Path(__file__).resolve().parents[1]
SHARED_BENCHMARKS = REPO_ROOT.parent / "shared" / "data" / "benchmarks"


def pytest_configure(config: pytest.Config) -> None:
    # SIGTERM/SIGHUP (a cancelled CI job, a closed terminal) kill every run session a test started (Ray, its
    # workers, a vLLM engine) before pytest stops, instead of leaving them to their own watchdogs
    install_termination_handlers()


def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config, items: list[pytest.Item]) -> None:
    # the tests on the vLLM CPU stack run late (in their own order), and those marked ``built_late`` after them:
    # scripts/run_tests.sh builds that stack, and the models those tests need, in the background while the others run
    on_vllm = [item for item in items if "vllm_python" in getattr(item, "fixturenames", ())]
    late = [item for item in items if item.get_closest_marker("built_late") is not None]
    tail = [item for item in on_vllm if item not in late] + late
    if tail:
        items[:] = [item for item in items if item not in set(tail)] + tail


@pytest.fixture(scope="session")
def repo_root() -> pathlib.Path:
    return REPO_ROOT


@pytest.fixture(scope="session")
def cpu_assets():
    """The tiny warmed-up model and the toy parquet files of the CPU runs (``recipe.exgrpo.harness.assets``: built
    once, then read from <repo>/.cache)."""
    from recipe.exgrpo.harness.assets import ensure_assets  # (torch: only for the tests that use it)

    return ensure_assets()


@pytest.fixture(scope="session")
def shared_benchmarks() -> pathlib.Path:
    """The real evaluation parquets in ../shared/data/benchmarks; skips when absent (a user's clone)."""
    if not (SHARED_BENCHMARKS / "test_id.parquet").exists():
        pytest.skip(f"real benchmark data not found at {SHARED_BENCHMARKS}")
    return SHARED_BENCHMARKS
