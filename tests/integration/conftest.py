"""Fixtures of the integration tests (the plain helpers they share are in tests/helpers/)."""

import pytest

from tests.helpers.launch_scripts import clear_dry_run_env


@pytest.fixture
def gpu_dry_run_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """The dry run of a GPU launch in this process, as on a machine where the CPU backend is off and none of the
    dry run's settings is exported (``tests.helpers.launch_scripts.DRY_RUN_ENV``). A file whose tests dry-run the
    launch scripts' GPU launches uses it for every test: ``pytestmark = pytest.mark.usefixtures("gpu_dry_run_env")``."""
    clear_dry_run_env(monkeypatch)
