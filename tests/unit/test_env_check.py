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

from recipe.exgrpo.launch_checks.env_check import (
    CPU_FILES,
    SHOWN_LOCK_PROBLEMS,
    VLLM_CPU_FILES,
    check_lock,
    cpu_stack,
    driver_major,
    lock_problems,
    locked_versions,
    parse_lock,
    read_lock,
    read_requirements,
    target_environment,
    version_problems,
)

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


# a lock as scripts/lock_gpu.sh writes it: comments, "# via" annotations, entries that differ by Python version
HAND_LOCK = """\
# header
numpy==2.2.6 ; python_full_version < '3.11'
    # via torch
numpy==2.3.5 ; python_full_version >= '3.11'
torch==2.11.0
triton==3.6.0 ; platform_machine == 'x86_64' and sys_platform == 'linux'
    # via torch
win32-setctime==1.2.1 ; sys_platform == 'win32'
Huggingface_Hub==1.33.0
"""


def test_locked_versions_follow_the_markers_of_the_target():
    entries = parse_lock(HAND_LOCK)
    assert len(entries) == 6 and entries[0].marker == 'python_full_version < "3.11"'
    assert locked_versions(entries, target_environment("3.10")) == {
        "numpy": "2.2.6",
        "torch": "2.11.0",
        "triton": "3.6.0",
        "huggingface-hub": "1.33.0",
    }
    assert locked_versions(entries, target_environment("3.12"))["numpy"] == "2.3.5"


def test_lock_problems_name_each_missing_or_other_version():
    locked = locked_versions(parse_lock(HAND_LOCK), target_environment("3.11"))
    installed = {
        "numpy": "2.3.5",
        "torch": "2.11.0+cu130",  # a local build matches the lock's public version
        "triton": "3.5.1",
        "huggingface-hub": "1.33.0",
        "pandas": "3.1.1",  # not in the lock: not a problem
    }
    assert lock_problems(locked, installed) == ["triton 3.5.1 is installed, the lock has 3.6.0"]
    del installed["numpy"]
    installed["torch"] = "2.13.0+cpu"
    assert lock_problems(locked, installed) == [
        "numpy is not installed (the lock has 2.3.5)",
        "torch 2.13.0+cpu is installed, the lock has 2.11.0",
        "triton 3.5.1 is installed, the lock has 3.6.0",
    ]
    assert lock_problems(locked, installed, skip=["torch"]) == [
        "numpy is not installed (the lock has 2.3.5)",
        "triton 3.5.1 is installed, the lock has 3.6.0",
    ]
    assert lock_problems({"torch": "2.11.0+cu130"}, {"torch": "2.11.0"}) == [
        "torch 2.11.0 is installed, the lock has 2.11.0+cu130"
    ]


def test_check_lock_reports_an_unusable_lock(tmp_path):
    missing = check_lock(tmp_path / "requirements-gpu.lock", {})
    assert missing.packages == 0 and "requirements-gpu.lock not found" in missing.problems[0]
    (tmp_path / "bad.lock").write_text("torch==2.11.0\nvllm>=0.24\n")
    bad = check_lock(tmp_path / "bad.lock", {"torch": "2.11.0"})
    assert bad.problems == ["bad.lock cannot be read: bad.lock:2: 'vllm>=0.24' is not pinned to one version with =="]
    (tmp_path / "ok.lock").write_text(HAND_LOCK)
    ok = check_lock(tmp_path / "ok.lock", {"numpy": "2.3.5", "torch": "2.11.0", "huggingface-hub": "1.33.0"})
    assert ok.problems == ["triton is not installed (the lock has 3.6.0)"] and ok.packages == 4


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
    # the CPU stack against the lock: each package at another version is named, once
    lock = report["lock"]
    assert lock["path"] == "requirements-gpu.lock" and lock["packages"] > 200
    assert set(lock["problems"]) <= set(report["problems"]) and len(set(report["problems"])) == len(report["problems"])
    numpy_locked = locked_versions(read_lock(REPO / "requirements-gpu.lock"))["numpy"]
    if metadata.version("numpy") != numpy_locked:
        assert f"numpy {metadata.version('numpy')} is installed, the lock has {numpy_locked}" in lock["problems"]
    assert not any(p.startswith(("torch ", "vllm ", "transformers ")) for p in lock["problems"])  # reported above
    text = subprocess.run(
        [sys.executable, "-m", "recipe.exgrpo.env_check"], cwd=REPO, capture_output=True, text=True, timeout=120
    ).stdout
    for line in (
        "  torch ",
        "  GPUs ",
        "  vllm ",
        "  flash-attn ",
        "  verl ",
        "  transformers ",
        "  lock ",
        "result: ",
    ):
        assert line in text


def _install(tmp_path: Path, script: Path = REPO / "scripts" / "install_gpu.sh", **env: str):
    full = {**os.environ, "PYTHON": sys.executable, "DRY_RUN": "1", "INSTALLER": "pip", **env}
    return subprocess.run(["bash", str(script)], cwd=tmp_path, env=full, capture_output=True, text=True, timeout=60)


def _commands(proc: subprocess.CompletedProcess) -> list[str]:
    return [line[2:] for line in proc.stderr.splitlines() if line.startswith("+ ")]


def test_install_gpu_runs_its_steps_in_order(tmp_path):
    proc = _install(tmp_path)
    assert proc.returncode == 0, proc.stderr
    commands = _commands(proc)
    py = f"{sys.version_info[0]}{sys.version_info[1]}"
    assert commands == [
        f"{sys.executable} -m pip install -r requirements.txt -c requirements-gpu.lock",
        f"{sys.executable} -m pip install --no-deps https://github.com/mjun0812/flash-attention-prebuild-wheels/"
        f"releases/download/v0.9.4/flash_attn-2.8.3%2Bcu130torch2.11-cp{py}-cp{py}-linux_x86_64.whl",
        f"{sys.executable} -m pip install -e . --no-deps",
        f"{sys.executable} -m recipe.exgrpo.env_check",
    ]
    source = _install(tmp_path, FLASH_ATTN="source")
    assert f"+ {sys.executable} -m pip install --no-build-isolation -r requirements-flash-attn.txt" in source.stderr
    bad = _install(tmp_path, FLASH_ATTN="maybe")
    assert bad.returncode == 2 and "FLASH_ATTN=maybe" in bad.stderr


def test_install_gpu_uses_uv_with_the_lock_when_uv_is_found(tmp_path):
    uv = Path(sys.executable).parent / "uv"  # requirements-cpu.txt installs it
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "uv").symlink_to(uv)
    path = f"{bin_dir}:/usr/bin:/bin"
    auto = _install(tmp_path, INSTALLER="auto", PATH=path)
    assert auto.returncode == 0, auto.stderr
    assert (
        _commands(auto)[0] == f"uv pip install --python {sys.executable} -r requirements.txt -c requirements-gpu.lock"
    )
    assert _commands(auto)[2] == f"{sys.executable} -m pip install -e . --no-deps"  # the later steps: pip
    no_uv = _install(tmp_path, INSTALLER="auto", PATH="/usr/bin:/bin", UV="uv-not-here")
    assert _commands(no_uv)[0] == f"{sys.executable} -m pip install -r requirements.txt -c requirements-gpu.lock"
    missing = _install(tmp_path, INSTALLER="uv", UV="uv-not-here")
    assert missing.returncode == 2 and "INSTALLER=uv but UV=uv-not-here is not found" in missing.stderr
    bad = _install(tmp_path, INSTALLER="conda")
    assert bad.returncode == 2 and "INSTALLER=conda" in bad.stderr


def test_install_gpu_stops_before_installing_without_pip_or_lock(tmp_path):
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(tmp_path / "nopip")], check=True, timeout=120)
    nopip = _install(tmp_path, PYTHON=str(tmp_path / "nopip" / "bin" / "python"))
    assert nopip.returncode == 2 and "has no pip" in nopip.stderr and _commands(nopip) == []
    # a checkout without the lock (the script run from a copy of the repository that lacks it)
    (tmp_path / "repo" / "scripts").mkdir(parents=True)
    (tmp_path / "repo" / "requirements.txt").write_text("torch==2.11.0\n")
    script = tmp_path / "repo" / "scripts" / "install_gpu.sh"
    script.write_text((REPO / "scripts" / "install_gpu.sh").read_text())
    nolock = _install(tmp_path, script=script)
    assert nolock.returncode == 2 and "requirements-gpu.lock not found" in nolock.stderr and _commands(nolock) == []


# ------------------------------------------------------------------------------------- the CPU stacks
def test_requirement_files_are_read_with_their_includes(tmp_path):
    (tmp_path / "base.txt").write_text("verl==0.9.1\nfastapi\n")
    (tmp_path / "top.txt").write_text("-r base.txt\nregex\nfastapi[standard]>=0.133.0,<0.137.0\n")
    (tmp_path / "pins.txt").write_text("fastapi==0.136.3\n")
    assert read_requirements([tmp_path / "top.txt", tmp_path / "pins.txt"]) == {
        "verl": "==0.9.1",
        "fastapi": "==0.136.3",
        "regex": "",
    }
    vllm = read_requirements([REPO / f for f in VLLM_CPU_FILES])
    # the vLLM CPU stack's own pins, not the CPU stack's (these two differ between the stacks)
    cpu = read_requirements([REPO / f for f in CPU_FILES])
    for name in ("fastapi", "numpy"):
        assert vllm[name] != cpu[name] and vllm[name].startswith("==")
    assert vllm["vllm-cpu"] == "==0.27.1" and vllm["verl"] == "==0.9.1"


def test_cpu_picks_the_stack_this_interpreter_holds(monkeypatch):
    from recipe.exgrpo.cpu import vllm_stack

    monkeypatch.setattr(vllm_stack, "installed_version", lambda: "0.27.1")
    assert cpu_stack() == "vLLM CPU"
    monkeypatch.setattr(vllm_stack, "installed_version", lambda: None)
    assert cpu_stack() == "CPU"


def _vllm_python() -> str | None:
    python = os.environ.get("EXGRPO_VLLM_PYTHON") or str(REPO / ".venv-vllm" / "bin" / "python")
    return python if Path(python).exists() else None


def test_env_check_passes_on_the_vllm_cpu_stack_the_project_builds():
    """``.venv-vllm/bin/python -m recipe.exgrpo.env_check --cpu`` (scripts/setup_env.sh --vllm builds it)."""
    python = _vllm_python()
    if python is None:
        if os.environ.get("EXGRPO_REQUIRE_VLLM") == "1":
            pytest.fail("no vLLM CPU stack: bash scripts/setup_env.sh --vllm")
        pytest.skip("no vLLM CPU stack (.venv-vllm or EXGRPO_VLLM_PYTHON): bash scripts/setup_env.sh --vllm")
    proc = subprocess.run(
        [python, "-m", "recipe.exgrpo.env_check", "--cpu", "--json"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    report = json.loads(proc.stdout)
    assert report["mode"] == "vLLM CPU" and report["versions"]["vllm"].endswith("+cpu")
    assert proc.returncode == 0 and report["problems"] == [], report["problems"]


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="the GPU stack is installed here")
def test_the_gpu_check_on_a_cpu_stack_says_to_pass_cpu():
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is visible")
    rc, report = _env_check()
    assert rc == 1 and report["hint"].startswith("this interpreter holds a CPU stack (torch ")
    assert "python -m recipe.exgrpo.env_check --cpu checks it against" in report["hint"]
    text = subprocess.run(
        [sys.executable, "-m", "recipe.exgrpo.env_check"], cwd=REPO, capture_output=True, text=True, timeout=120
    ).stdout
    lines = text.splitlines()
    assert lines[-1] == f"hint: {report['hint']}"
    lock_lines = [line for line in lines if line.startswith("  - ") and line[4:] in set(report["lock"]["problems"])]
    assert len(lock_lines) == SHOWN_LOCK_PROBLEMS < len(report["lock"]["problems"])  # the JSON keeps all
    hidden = len(report["lock"]["problems"]) - SHOWN_LOCK_PROBLEMS
    assert f"  - ... and {hidden} more packages that differ from the lock (--json lists all)" in lines
    rc_cpu, cpu = _env_check("--cpu")
    assert cpu["mode"] == "CPU" and cpu["hint"] is None
