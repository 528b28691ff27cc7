"""scripts/setup_env.sh on a Python other than the one its constraints are resolved for stops before installing
anything, in one line that names the version and what to set."""

from __future__ import annotations

import subprocess

from tests.helpers.launch_scripts import REPO


def test_another_python_stops_before_anything_is_installed(tmp_path):
    fake = tmp_path / "python3.10"
    fake.write_text("#!/bin/sh\necho 3.10\n")
    fake.chmod(0o755)
    venv = tmp_path / "venv"
    env = {"PATH": "/usr/bin:/bin", "PYTHON": str(fake), "VENV": str(venv), "HOME": str(tmp_path)}
    proc = subprocess.run(
        ["bash", "scripts/setup_env.sh"], cwd=REPO, env=env, capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 2, proc.stderr
    assert f"{fake} is Python 3.10; the CPU stacks are pinned for Python 3.11" in proc.stderr
    assert "set PYTHON to a python3.11" in proc.stderr
    assert not venv.exists()  # nothing was made
