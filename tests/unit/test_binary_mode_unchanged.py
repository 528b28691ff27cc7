"""The binary reward mode is bit for bit what it was before the continuous mode was added.

``tests/binary_mode_driver.py`` runs the same scripted sequence of draws, selections, collections, delayed start
and re-added retired questions, saves the pool and computes the mixed loss and its gradient, once with this
checkout's ``exgrpo`` and once with the ``exgrpo`` package of :data:`BEFORE` (the last commit before the reward
mode existed, extracted with ``git archive``). The state digests, the saved files (entries, tokens, the header
without its save time) and the loss, metrics and gradient must be equal.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DRIVER = REPO / "tests" / "binary_mode_driver.py"
#: the last commit of the project before the continuous reward mode (its exgrpo package is the "before")
BEFORE = "f627cf2"


def _fingerprint(tree: Path, out: Path) -> dict:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    proc = subprocess.run(
        [sys.executable, str(DRIVER), str(out)], env=env, capture_output=True, text=True, timeout=300, cwd=out.parent
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert Path(result["package"]) == (tree / "exgrpo").resolve(), result["package"]
    return result


@pytest.fixture(scope="module")
def before_tree(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("before")
    try:
        archive = subprocess.run(
            ["git", "-C", str(REPO), "archive", BEFORE, "exgrpo"], capture_output=True, check=True, timeout=60
        ).stdout
    except (OSError, subprocess.CalledProcessError, subprocess.TimeoutExpired) as e:
        pytest.skip(f"git history with {BEFORE} is not available here: {e}")
    subprocess.run(["tar", "-x", "-C", str(root)], input=archive, check=True)
    return root


def test_binary_pool_and_loss_match_the_code_before_the_reward_mode(before_tree, tmp_path):
    before = _fingerprint(before_tree, tmp_path / "before")
    after = _fingerprint(REPO, tmp_path / "after")
    # the sequence did exercise the pool: trajectories stored, questions retired, mixed mode on
    assert before["pool"]["pool_entries"] > 0 and before["pool"]["retired"] > 0 and before["pool"]["mixed"]
    assert after["pool"] == before["pool"]
    assert after["loss"] == before["loss"]
