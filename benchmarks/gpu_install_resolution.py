"""How long the GPU install takes to resolve, with and without requirements-gpu.lock, side by side.

Resolution only, for this interpreter's Python on this machine (Linux x86_64), each run from a fresh virtual
environment and a fresh cache, as a new user's first install:
- ``pip <version> unlocked``: ``pip install --dry-run --ignore-installed --report R -r requirements.txt``
- ``pip <version> locked``:   the same with ``-c requirements-gpu.lock`` (scripts/install_gpu.sh without uv)
- ``uv unlocked`` / ``uv locked``: ``uv pip compile requirements.txt [-c requirements-gpu.lock]`` for
  x86_64-manylinux_2_28 (install_gpu.sh with uv resolves the same way)

pip runs with ``--use-feature=fast-deps``: it reads each wheel's metadata with HTTP range requests where the index
does not serve PEP 658 metadata files, so no run downloads the CUDA wheels (an index with metadata files is used
through them either way). Every command runs without pip's or uv's configuration files and PIP_*/UV_* settings,
and is stopped (with its whole process group) at ``--cap-s``: a run still resolving then shows as "> cap".
Printed per run: wall seconds, packages resolved, the packages pip said it backtracked on, and the packages
whose version differs from the lock's.

``--install`` also times a real install (downloads the wheels, about 10 GB on disk) with the lock into fresh
environments, with uv and with pip, and removes them afterwards. It needs no GPU.

    python benchmarks/gpu_install_resolution.py                          # pip (bundled and pinned), uv
    python benchmarks/gpu_install_resolution.py --pip 26.3 --cap-s 900
    python benchmarks/gpu_install_resolution.py --only none --install --pip 26.3    # the installs only
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script: the repository first

from benchmarks.common import REPO, argument_parser, comma_list, run_stoppable  # noqa: E402
from recipe.exgrpo.launch_checks.env_check import GPU_LOCK, locked_versions, parse_lock, read_lock  # noqa: E402

PLATFORM = "x86_64-manylinux_2_28"


def resolver_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PIP_", "UV_"))}
    env.update(PIP_CONFIG_FILE=os.devnull, PIP_DISABLE_PIP_VERSION_CHECK="1", **extra)
    return env


@dataclass
class Run:
    variant: str
    command: str
    seconds: float
    finished: bool
    rc: int | None
    packages: int | None = None
    backtracked: list[str] = field(default_factory=list)
    differ: list[str] = field(default_factory=list)
    note: str = ""


def timed(cmd: list[str], cap_s: float, env: dict[str, str], log: Path) -> tuple[float, int | None]:
    """Wall seconds and exit code (None: stopped at the cap, its process group killed)."""
    start = time.perf_counter()
    with log.open("w") as out:
        proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            rc = proc.wait(timeout=cap_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            rc = None
    return time.perf_counter() - start, rc


def shown(cmd: list[str], work: Path) -> str:
    """The command as printed: the temporary folder as $TMP."""
    return " ".join(cmd).replace(str(work), "$TMP")


def differ_from_lock(resolved: dict[str, str], locked: dict[str, str]) -> list[str]:
    names = sorted(set(resolved) | set(locked))
    return [
        f"{n} {resolved.get(n, '-')} (lock {locked.get(n, '-')})" for n in names if resolved.get(n) != locked.get(n)
    ]


def canonical(name: str) -> str:
    return name.lower().replace("_", "-").replace(".", "-")


def make_venv(path: Path, pip_version: str) -> Path:
    subprocess.run([sys.executable, "-m", "venv", str(path)], check=True)
    python = path / "bin" / "python"
    if pip_version != "bundled":
        subprocess.run(
            [str(python), "-m", "pip", "install", "-q", f"pip=={pip_version}"], env=resolver_env(), check=True
        )
    return python


def pip_runs(pip_version: str, cap_s: float, work: Path, locked: dict[str, str]) -> list[Run]:
    python = make_venv(work / f"venv-pip-{pip_version}", pip_version)
    version = subprocess.run([str(python), "-m", "pip", "--version"], capture_output=True, text=True).stdout.split()[1]
    runs = []
    for with_lock in (False, True):
        tag = f"pip {version} {'locked' if with_lock else 'unlocked'}"
        report = work / f"report-{version}-{with_lock}.json"
        cmd = [str(python), "-m", "pip", "--isolated", "install", "--dry-run", "--ignore-installed", "--report",
               str(report), "--cache-dir", str(work / f"pip-cache-{version}-{with_lock}"), "--use-feature=fast-deps",
               "-v", "-r", "requirements.txt"] + (["-c", GPU_LOCK] if with_lock else [])  # fmt: skip
        log = work / f"{tag.replace(' ', '-')}.log"
        seconds, rc = timed(cmd, cap_s, resolver_env(), log)
        text = log.read_text(errors="replace")
        run = Run(tag, shown(cmd, work), seconds, rc is not None, rc)
        run.backtracked = sorted(set(re.findall(r"pip is (?:still )?looking at multiple versions of (\S+)", text)))
        if rc == 0 and report.is_file():
            install = json.loads(report.read_text())["install"]
            resolved = {canonical(i["metadata"]["name"]): i["metadata"]["version"] for i in install}
            run.packages, run.differ = len(resolved), differ_from_lock(resolved, locked)
        elif rc:
            run.note = text.strip().splitlines()[-1][:200]
        runs.append(run)
    return runs


def uv_bin() -> str:
    here = Path(sys.executable).parent / "uv"
    found = str(here) if here.is_file() else shutil.which("uv")
    if not found:
        raise SystemExit("uv not found (bash scripts/setup_env.sh installs it into .venv)")
    return found


def uv_runs(cap_s: float, work: Path, locked: dict[str, str]) -> list[Run]:
    uv, python = uv_bin(), f"{sys.version_info[0]}.{sys.version_info[1]}"
    runs = []
    for with_lock in (False, True):
        tag = f"uv {'locked' if with_lock else 'unlocked'}"
        resolved_file = work / f"uv-{with_lock}.txt"
        cmd = [uv, "--no-config", "pip", "compile", "requirements.txt", "--python-platform", PLATFORM,
               "--python-version", python, "--no-header", "--no-annotate", "--quiet", "-o", str(resolved_file),
               "--cache-dir", str(work / f"uv-cache-{with_lock}")]  # fmt: skip
        cmd += ["-c", GPU_LOCK] if with_lock else []
        log = work / f"{tag.replace(' ', '-')}.log"
        seconds, rc = timed(cmd, cap_s, resolver_env(), log)
        run = Run(tag, shown(cmd, work), seconds, rc is not None, rc)
        if rc == 0:
            resolved = locked_versions(parse_lock(resolved_file.read_text(), source=tag))
            run.packages, run.differ = len(resolved), differ_from_lock(resolved, locked)
        elif rc:
            run.note = log.read_text(errors="replace").strip()[-200:]
        runs.append(run)
    return runs


def install_runs(pip_version: str, cap_s: float, work: Path, keep: bool) -> list[Run]:
    runs = []
    uv = uv_bin()
    for tool in ("uv", "pip"):
        venv = work / f"venv-install-{tool}"
        python = make_venv(venv, pip_version)
        cache = work / f"install-cache-{tool}"
        if tool == "uv":
            cmd = [uv, "--no-config", "pip", "install", "--python", str(python), "--cache-dir", str(cache)]
        else:
            cmd = [str(python), "-m", "pip", "--isolated", "install", "--cache-dir", str(cache)]
        cmd += ["-r", "requirements.txt", "-c", GPU_LOCK]
        seconds, rc = timed(cmd, cap_s, resolver_env(), work / f"install-{tool}.log")
        size = subprocess.run(["du", "-sh", str(venv)], capture_output=True, text=True).stdout.split()[0]
        run = Run(f"install with {tool}, locked", shown(cmd, work), seconds, rc is not None, rc)
        run.note = f"environment {size}" if rc == 0 else (work / f"install-{tool}.log").read_text()[-200:]
        runs.append(run)
        shutil.rmtree(cache, ignore_errors=True)
        if not keep:
            shutil.rmtree(venv, ignore_errors=True)
    return runs


def main() -> None:
    p = argument_parser(__doc__)
    p.add_argument("--pip", default="bundled,26.3", help="pip versions, comma-separated ('bundled': the venv's own)")
    p.add_argument(
        "--only", default="pip,uv", help="which resolutions: pip, uv (comma-separated; none: only --install)"
    )
    p.add_argument("--cap-s", type=float, default=600.0, help="stop a run after this many seconds")
    p.add_argument("--install", action="store_true", help="also time a real install with the lock (uv and pip)")
    p.add_argument("--install-cap-s", type=float, default=1800.0, help="stop an install after this many seconds")
    p.add_argument(
        "--keep", action="store_true", help="keep the work folder (logs, reports, the installed environments)"
    )
    args = p.parse_args()

    locked = locked_versions(read_lock(REPO / GPU_LOCK))
    work = Path(tempfile.mkdtemp(prefix="gpu-resolution-"))
    print(f"Python {sys.version.split()[0]}, {len(locked)} locked packages for it; logs in {work}", flush=True)
    runs: list[Run] = []
    try:
        only = set(comma_list(args.only))
        if "uv" in only:
            runs += uv_runs(args.cap_s, work, locked)
        if "pip" in only:
            for version in comma_list(args.pip):
                runs += pip_runs(version, args.cap_s, work, locked)
        if args.install:
            runs += install_runs(comma_list(args.pip)[-1], args.install_cap_s, work, args.keep)
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)

    print(f"\n{'variant':<26} {'seconds':>9} {'packages':>8}  backtracked on / differs from the lock / note")
    for r in runs:
        secs = f"{r.seconds:9.1f}" if r.finished else f"> {r.seconds:6.0f}"
        pkgs = "-" if r.packages is None else str(r.packages)
        extra = []
        if r.backtracked:
            extra.append("backtracked on " + ", ".join(r.backtracked))
        if r.packages is not None:
            extra.append(f"{len(r.differ)} differ from the lock" + (f": {', '.join(r.differ[:5])}" if r.differ else ""))
        if not r.finished:
            extra.append(
                "still installing at the cap" if r.variant.startswith("install") else "still resolving at the cap"
            )
        elif r.rc:
            extra.append(f"exit {r.rc}")
        if r.note:
            extra.append(r.note)
        print(f"{r.variant:<26} {secs} {pkgs:>8}  {'; '.join(extra)}")
    print("\ncommands:")
    for r in runs:
        print(f"  {r.variant}: {r.command}")


if __name__ == "__main__":
    sys.exit(run_stoppable(main, "gpu_install_resolution"))
