"""Shared test fixtures. Subfolders keep their own fixtures in their own conftest.py."""

import pathlib

import pytest

REPO_ROOT = pathlib.Path(__file__).resolve().parents[1]
SHARED_BENCHMARKS = REPO_ROOT.parent / "shared" / "data" / "benchmarks"


@pytest.fixture(scope="session")
def repo_root() -> pathlib.Path:
    return REPO_ROOT


@pytest.fixture(scope="session")
def shared_benchmarks() -> pathlib.Path:
    """The real evaluation parquets in ../shared/data/benchmarks; skips when absent (a user's clone)."""
    if not (SHARED_BENCHMARKS / "test_id.parquet").exists():
        pytest.skip(f"real benchmark data not found at {SHARED_BENCHMARKS}")
    return SHARED_BENCHMARKS
