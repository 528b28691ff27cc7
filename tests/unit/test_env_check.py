"""The GPU install path: requirements.txt installs with one pip command (no source-only flash-attn in it),
scripts/install_gpu.sh runs its steps in order, and ``python -m recipe.exgrpo.env_check`` reports what is installed
against the pins."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest

from recipe.exgrpo.env_check import driver_major, read_requirements, version_problems

REPO = Path(__file__).resolve().parents[2]


def test_requirements_pin_the_gpu_stack_and_leave_flash_attn_to_its_own_step():
    gpu = read_requirements([REPO / "requirements.txt"])
    assert gpu["torch"] == "==2.11.0" and gpu["vllm"] == "==0.24.0" and gpu["verl"] == "==0.9.1"
    assert gpu["transformers"] == "==5.9.0"
    # flash-attn 2.8.3 is source-only on PyPI and its build imports torch: in the same pip command it fails
    assert "flash-attn" not in gpu
    assert read_requirements([REPO / "requirements-flash-attn.txt"]) == {"flash-attn": "==2.8.3"}


def test_version_problems():
    expected = {"torch": "==2.11.0", "ray": ">=2.41.0", "vllm": "==0.24.0", "tqdm": ""}
    installed = {"torch": "2.11.0+cu130", "ray": "2.40.1", "vllm": None, "tqdm": "4.67.0"}
    assert version_problems(expected, installed) == [
        "ray 2.40.1 does not satisfy >=2.41.0",
        "vllm is not installed (wanted ==0.24.0)",
    ]  # a local version (+cu130) matches its public version
    assert version_problems({"torch": "==2.11.0"}, {"torch": "2.13.0+cpu"}) == [
        "torch 2.13.0+cpu does not satisfy ==2.11.0"
    ]
    assert (driver_major("580.65.06"), driver_major("535.104.05"), driver_major(None)) == (580, 535, None)


def _env_check(*args: str) -> tuple[int, dict]:
    proc = subprocess.run(
        [sys.executable, "-m", "recipe.exgrpo.env_check", "--json", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    return proc.returncode, json.loads(proc.stdout)


def test_env_check_reports_what_is_installed():
    import torch

    rc, report = _env_check("--cpu")
    assert report["mode"] == "CPU" and report["versions"]["torch"] == metadata.version("torch")
    assert report["versions"]["verl"] == metadata.version("verl")
    assert report["gpu"]["visible"] == (torch.cuda.device_count() if torch.cuda.is_available() else 0)
    assert rc == (0 if report["ok"] else 1) and report["ok"] == (report["problems"] == [])


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="the GPU stack is installed here")
def test_env_check_of_the_gpu_stack_fails_on_the_cpu_stack():
    rc, report = _env_check()
    assert rc == 1 and not report["ok"]
    assert "vllm is not installed (wanted ==0.24.0)" in report["problems"]
    assert "flash-attn is not installed (wanted ==2.8.3)" in report["problems"]
    text = subprocess.run(
        [sys.executable, "-m", "recipe.exgrpo.env_check"], cwd=REPO, capture_output=True, text=True, timeout=120
    ).stdout
    for line in ("  torch ", "  GPUs ", "  vllm ", "  flash-attn ", "  verl ", "  transformers ", "result: "):
        assert line in text


def _install(tmp_path: Path, **env: str) -> subprocess.CompletedProcess:
    full = {**os.environ, "PYTHON": sys.executable, "DRY_RUN": "1", "PATH": os.environ["PATH"], **env}
    return subprocess.run(
        ["bash", str(REPO / "scripts" / "install_gpu.sh")], cwd=tmp_path, env=full, capture_output=True, text=True
    )


def test_install_gpu_runs_its_steps_in_order(tmp_path):
    proc = _install(tmp_path)
    assert proc.returncode == 0, proc.stderr
    commands = [line[2:] for line in proc.stderr.splitlines() if line.startswith("+ ")]
    py = f"{sys.version_info[0]}{sys.version_info[1]}"
    assert commands == [
        f"{sys.executable} -m pip install -r requirements.txt",
        f"{sys.executable} -m pip install --no-deps https://github.com/mjun0812/flash-attention-prebuild-wheels/"
        f"releases/download/v0.9.4/flash_attn-2.8.3%2Bcu130torch2.11-cp{py}-cp{py}-linux_x86_64.whl",
        f"{sys.executable} -m pip install -e . --no-deps",
        f"{sys.executable} -m recipe.exgrpo.env_check",
    ]
    source = _install(tmp_path, FLASH_ATTN="source")
    assert f"+ {sys.executable} -m pip install --no-build-isolation -r requirements-flash-attn.txt" in source.stderr
    bad = _install(tmp_path, FLASH_ATTN="maybe")
    assert bad.returncode == 2 and "FLASH_ATTN=maybe" in bad.stderr
