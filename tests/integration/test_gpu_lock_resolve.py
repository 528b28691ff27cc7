"""requirements-gpu.lock against the package index: regenerating it from requirements.txt changes nothing, and an
install with it resolves without backtracking, with uv for Linux x86_64 on Python 3.10, 3.11 and 3.12, and with
pip as scripts/install_gpu.sh runs it without uv (resolution only: ``--dry-run``; pip reads each wheel's metadata,
never a whole wheel, so none of the multi-GB CUDA wheels is downloaded).

These tests need the package index. An index that cannot be reached fails them with a message that says so; on a
machine that is offline on purpose, EXGRPO_OFFLINE=1 skips them (ignored in CI, CI=true, where they always run).
The resolvers run as on a user's machine: no pip or uv configuration file, no PIP_* or UV_* setting (a machine's
own index, find-links or constraints cannot change the result), each command under a hard timeout."""

from __future__ import annotations

import difflib
import json
import os
import platform
import re
import subprocess
import sys
from pathlib import Path

import pytest

from recipe.exgrpo.launch_checks.env_check import GPU_LOCK, locked_versions, parse_lock, read_lock, target_environment

REPO = Path(__file__).resolve().parents[2]
PYTHONS = ("3.10", "3.11", "3.12")
PLATFORM = "x86_64-manylinux_2_28"  # torch 2.11.0's and vLLM 0.24.0's Linux wheels
UV = Path(sys.executable).parent / "uv"  # pinned in constraints-cpu.txt, installed by scripts/setup_env.sh
# the pip dry run downloads a few source archives and build tools (about 1 MB); one CUDA wheel is 0.2-0.9 GB
MAX_DOWNLOAD_MB = 50
OFFLINE_HINT = "a machine that is offline on purpose can skip these tests with EXGRPO_OFFLINE=1 (never in CI)"


def resolver_env() -> dict[str, str]:
    """This process's environment without pip's and uv's settings; uv keeps a cache under .cache/uv."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PIP_", "UV_"))}
    env["PIP_CONFIG_FILE"] = os.devnull  # pip then reads no configuration file (global, user or site)
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    env["UV_CACHE_DIR"] = os.environ.get("UV_CACHE_DIR") or str(REPO / ".cache" / "uv")
    return env


def run(cmd: list[str], timeout: float, input: str | None = None, **extra_env: str) -> subprocess.CompletedProcess:
    env = {**resolver_env(), **extra_env}
    try:
        return subprocess.run(cmd, cwd=REPO, env=env, input=input, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        pytest.fail(f"`{' '.join(cmd[:8])} ...` did not finish within {timeout:.0f} s")


@pytest.fixture(scope="module")
def index() -> None:
    """Skip (EXGRPO_OFFLINE=1, outside CI) or fail with a clear message when the package index cannot be reached."""
    if os.environ.get("EXGRPO_OFFLINE") == "1" and os.environ.get("CI") != "true":
        pytest.skip("EXGRPO_OFFLINE=1: the lock's resolution tests need the package index")
    if not UV.is_file():
        pytest.fail(f"uv not found at {UV}: bash scripts/setup_env.sh installs it (requirements-cpu.txt)")
    probe = run(
        [str(UV), "--no-config", "pip", "compile", "-", "--python-version", "3.11", "-q", "--no-header"], 90, "six\n"
    )
    if probe.returncode != 0:
        pytest.fail(
            "the package index cannot be reached (uv pip compile of one package failed): "
            f"{probe.stderr.strip()[-800:]}\n{OFFLINE_HINT}"
        )


@pytest.mark.timeout(420)
def test_regenerating_the_lock_changes_nothing(index, tmp_path):
    out = tmp_path / GPU_LOCK
    proc = run(["bash", "scripts/lock_gpu.sh"], 360, UV=str(UV), OUT=str(out))
    assert proc.returncode == 0, f"scripts/lock_gpu.sh failed: {proc.stderr[-2000:]}"
    committed = (REPO / GPU_LOCK).read_text(encoding="utf-8")
    fresh = out.read_text(encoding="utf-8")
    diff = "".join(
        difflib.unified_diff(committed.splitlines(True), fresh.splitlines(True), "committed", "regenerated", n=1)
    )
    assert fresh == committed, f"the lock is stale: run bash scripts/lock_gpu.sh and commit it\n{diff[:4000]}"


@pytest.mark.timeout(240)
@pytest.mark.parametrize("python", PYTHONS)
def test_uv_resolves_every_package_at_its_locked_version(index, python):
    """uv's resolution of requirements.txt with the lock as constraints, for Linux x86_64 and ``python``: the
    lock's entries for that target, no more, no fewer, no other version."""
    proc = run(
        [str(UV), "--no-config", "pip", "compile", "requirements.txt", "-c", GPU_LOCK, "--python-platform", PLATFORM,
         "--python-version", python, "--no-header", "--no-annotate", "--quiet"],
        180,
    )  # fmt: skip
    assert proc.returncode == 0, f"uv could not resolve requirements.txt with the lock: {proc.stderr[-3000:]}"
    resolved = locked_versions(parse_lock(proc.stdout, source="uv's resolution"))
    assert resolved == locked_versions(read_lock(REPO / GPU_LOCK), target_environment(python))


def _is_lock_target() -> bool:
    return (
        sys.platform == "linux"
        and platform.machine() == "x86_64"
        and sys.version_info[:2] in {(3, 10), (3, 11), (3, 12)}
    )


@pytest.mark.timeout(900)
@pytest.mark.skipif(not _is_lock_target(), reason="pip resolves for this interpreter: Linux x86_64, Python 3.10-3.12")
def test_pip_resolves_with_the_lock_without_backtracking(index, tmp_path):
    """install_gpu.sh's pip path as a dry run for this interpreter: every package at its locked version, no
    backtracking, and no whole wheel downloaded (only metadata: the index's metadata files where it serves them,
    else HTTP range requests into each wheel; source-only packages are downloaded to read their metadata)."""
    report = tmp_path / "report.json"
    proc = run(
        [sys.executable, "-m", "pip", "--isolated", "install", "--dry-run", "--ignore-installed", "--report",
         str(report), "--cache-dir", str(tmp_path / "pip-cache"), "--use-feature=fast-deps", "-v",
         "-r", "requirements.txt", "-c", GPU_LOCK],
        840,  # 100-250 s measured: the metadata of 263 wheels, one after the other
    )  # fmt: skip
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"pip could not resolve requirements.txt with the lock: {log[-3000:]}"
    backtracked = sorted(set(re.findall(r"pip is (?:still )?looking at multiple versions of (\S+)", log)))
    assert backtracked == [], f"pip backtracked on {backtracked}"
    # what pip downloaded whole: the source-only packages and the build tools that read their metadata
    downloads = re.findall(r"^\s*Downloading (\S+) \(([\d.]+) ([kMG]?B)\)", log, flags=re.M)
    scale = {"B": 1e-6, "kB": 1e-3, "MB": 1.0, "GB": 1e3}
    total_mb = sum(float(size) * scale[unit] for _, size, unit in downloads)
    assert total_mb < MAX_DOWNLOAD_MB, f"pip downloaded {total_mb:.0f} MB to resolve: {downloads}"
    installed = {
        item["metadata"]["name"].lower().replace("_", "-").replace(".", "-"): item["metadata"]["version"]
        for item in json.loads(report.read_text())["install"]
    }
    assert installed == locked_versions(read_lock(REPO / GPU_LOCK))
