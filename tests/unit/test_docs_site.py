"""The docs as a site and the pages generated or checked from the code: the settings reference is what the code
declares, the version is written once and the changelog starts with it (the site's own build, ``mkdocs build
--strict``, runs in scripts/run_tests.sh)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import exgrpo
from exgrpo import settings_doc
from exgrpo.config import ExGRPOConfig, settings_reference

REPO = Path(__file__).resolve().parents[2]
DOCS = REPO / "docs"


# ------------------------------------------------------------------------------------------ settings reference
def test_the_settings_reference_page_is_what_the_code_declares():
    page = (DOCS / "settings.md").read_text(encoding="utf-8")
    assert page == settings_doc.render(), "docs/settings.md is stale: python -m exgrpo.settings_doc > docs/settings.md"


def test_the_settings_reference_lists_every_key_once_with_its_default():
    page = (DOCS / "settings.md").read_text(encoding="utf-8")
    rows = {m[1]: m[0] for m in re.finditer(r"^\| `exgrpo\.(\w+)` \|.*$", page, re.M)}
    assert sorted(rows) == sorted(r.key for r in settings_reference())
    assert set(ExGRPOConfig.key_names()) <= set(rows)
    assert "| `exgrpo.replay_ratio` | float | `0.5` | `[0.0, 1.0)` |" in rows["replay_ratio"]
    assert "`normal`, `linear`" in rows["weighting"]  # a registry's names
    assert "from `actor_rollout_ref.rollout.n`" in rows["k"]


def test_the_settings_check_fails_on_a_stale_page(tmp_path):
    stale = tmp_path / "settings.md"
    stale.write_text(settings_doc.render().replace("| `0.5` |", "| `0.25` |", 1), encoding="utf-8")
    proc = subprocess.run(
        [sys.executable, "-m", "exgrpo.settings_doc", "--check", str(stale)], cwd=REPO, capture_output=True, text=True
    )
    assert proc.returncode == 1 and "python -m exgrpo.settings_doc >" in proc.stderr
    assert settings_doc.main(["--check", str(DOCS / "settings.md")]) == 0


# ------------------------------------------------------------------------------------------------- versioning
def test_the_version_is_written_once_and_the_changelog_starts_with_it():
    assert re.fullmatch(r"\d+\.\d+\.\d+", exgrpo.__version__)
    setup = (REPO / "setup.py").read_text(encoding="utf-8")
    assert exgrpo.__version__ not in setup and "version=VERSION" in setup
    proc = subprocess.run([sys.executable, "setup.py", "--version"], cwd=REPO, capture_output=True, text=True)
    assert proc.stdout.strip().splitlines()[-1] == exgrpo.__version__
    changelog = (REPO / "CHANGELOG.md").read_text(encoding="utf-8")
    versions = re.findall(r"^## (\d+\.\d+\.\d+)", changelog, re.M)
    assert versions[0] == exgrpo.__version__, f"CHANGELOG.md's newest version is {versions[0]}"
    for section in re.split(r"^## ", changelog, flags=re.M)[1:]:
        assert "Checked on: verl " in section, f"CHANGELOG.md {section.split()[0]}: say what it was checked on"


# ---------------------------------------------------------------------------------------- environment variables
#: variables the scripts read that a user does not set, and why
NOT_USER_SETTINGS = {
    "VIRTUAL_ENV": "set by an activated venv: which Python the scripts pick (the PYTHON row says so)",
    "CONDA_PREFIX": "set by an activated conda environment: which Python the scripts pick (the PYTHON row)",
    "PYTHONPATH": "the launch scripts put the checkout in front of a caller's own",
    "EXGRPO_PICK_SOFT": "passed between prepare_data.sh and scripts/lib/python.sh",
    "EXGRPO_PYTHON_PICKED": "marks that scripts/lib/python.sh has chosen the Python already",
    "EXGRPO_EXPECT_THINK_TEMPLATE": "set by a launch script's own --think-template argument",
    "EXGRPO_GPUS_PER_NODE": "set by the launch script for its dry run (N_GPUS_PER_NODE is the user's)",
    "EXGRPO_RUN_TOKEN": "set by the driver in every process of a run, to find them (runtime/stacks.py)",
    "EXGRPO_SKIP_GRAD_NORM_ABOVE": "set by the driver for the actor workers from exgrpo.skip_grad_norm_above",
    "VERL_USE_EXTERNAL_MODULES": "set by the driver so that verl's workers import the gradient-norm guard",
    "RAY_OVERRIDE_JOB_RUNTIME_ENV": "set by the driver of a submitted Ray job (runtime/ray_job.py)",
}


def script_variables() -> set[str]:
    """Every variable a script under scripts/ reads from its environment: those read with a default or a check
    (``${VAR:-x}``, ``${VAR-x}``, ``${VAR:?}``, ``${VAR:=x}``, ``${VAR:+x}``), those a launch requires
    (``exgrpo_require_var VAR``) and those the launch checks read in Python (``*_ENV = "VAR"``)."""
    names: set[str] = set()
    for f in (REPO / "scripts").rglob("*.sh"):
        text = "\n".join(
            line for line in f.read_text(encoding="utf-8").splitlines() if not line.lstrip().startswith("#")
        )
        names |= set(re.findall(r"\$\{([A-Z][A-Z0-9_]*):?[-=?+]", text))
        names |= set(re.findall(r"exgrpo_require_var ([A-Z][A-Z0-9_]*)", text))
    for f in [*(REPO / "recipe/exgrpo/launch_checks").rglob("*.py"), *(REPO / "recipe/exgrpo/runtime").rglob("*.py")]:
        names |= set(re.findall(r'^[A-Z_]+_ENV = "([A-Z][A-Z0-9_]*)"', f.read_text(encoding="utf-8"), re.M))
    return names


def documented_variables() -> set[str]:
    page = (DOCS / "environment.md").read_text(encoding="utf-8")
    first_cells = re.findall(r"^\| ([^|]+) \|", page, re.M)
    return {name for cell in first_cells for name in re.findall(r"`([A-Z][A-Z0-9_]*)`", cell)}


def test_every_variable_the_scripts_read_is_in_the_environment_table():
    read = script_variables()
    assert {"MODEL_PATH", "N_GPUS_PER_NODE", "DRY_RUN", "TRAINER", "RM_PATH", "GPU_MEMORY_GIB"} <= read  # the reader
    missing = sorted(read - documented_variables() - set(NOT_USER_SETTINGS))
    assert not missing, f"docs/environment.md has no row for {missing}"
    assert not set(NOT_USER_SETTINGS) - read, "NOT_USER_SETTINGS names a variable no script reads any more"


# ------------------------------------------------------------------------------------------- troubleshooting
def _exception_classes() -> tuple[dict[str, str], set[str]]:
    """(every exception class defined in exgrpo/ and recipe/exgrpo/ -> its file, the names of those the code raises
    or builds: ``raise X``, ``raise X(...)``, ``X(...)``, as an error returned to be raised is)."""
    import ast
    import builtins

    files = [*(REPO / "exgrpo").rglob("*.py"), *(REPO / "recipe" / "exgrpo").rglob("*.py")]
    trees = {f: ast.parse(f.read_text(encoding="utf-8")) for f in files}
    bases: dict[str, set[str]] = {}
    where: dict[str, str] = {}
    for f, tree in trees.items():
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                names = {b.id if isinstance(b, ast.Name) else getattr(b, "attr", "") for b in node.bases}
                bases.setdefault(node.name, set()).update(names)
                where.setdefault(node.name, str(f.relative_to(REPO)))

    def is_exception(name: str, seen: frozenset[str] = frozenset()) -> bool:
        builtin = getattr(builtins, name, None)
        if isinstance(builtin, type) and issubclass(builtin, BaseException):
            return True
        return name not in seen and any(is_exception(b, seen | {name}) for b in bases.get(name, ()))

    classes = {name: f for name, f in where.items() if name in bases and is_exception(name)}
    used: set[str] = set()
    for tree in trees.values():
        for node in ast.walk(tree):
            target = node.exc if isinstance(node, ast.Raise) else node if isinstance(node, ast.Call) else None
            if isinstance(target, ast.Call):
                target = target.func
            name = target.id if isinstance(target, ast.Name) else getattr(target, "attr", None)
            if name in classes:
                used.add(name)
    return classes, used


def _headings(page: str) -> dict[str, str]:
    """heading text -> its anchor, as the site (Python-Markdown's toc) makes it."""
    from markdown.extensions.toc import slugify

    out = {}
    for line in page.splitlines():
        if m := re.match(r"^#{1,6} (.+)$", line):
            text = m[1].strip()
            out[text] = slugify(text.replace("`", ""), "-")
    return out


def test_every_error_the_code_raises_has_an_entry_on_the_troubleshooting_page():
    classes, raised = _exception_classes()
    assert {"StageDeadlineError", "PoolCheckpointError", "ConfigError", "WeightSyncError"} <= raised  # the reader
    headings = _headings((DOCS / "troubleshooting.md").read_text(encoding="utf-8"))
    missing = sorted(f"{name} ({classes[name]})" for name in raised if f"`{name}`" not in headings)
    assert not missing, f"docs/troubleshooting.md has no '### `Name`' entry for {missing}"
    assert headings["`StageDeadlineError`"] == "stagedeadlineerror"  # the anchor the messages link to


def test_the_links_to_the_troubleshooting_page_land_on_an_entry():
    """Messages in the code and the scripts that say docs/troubleshooting.md#anchor name an anchor the page has."""
    anchors = set(_headings((DOCS / "troubleshooting.md").read_text(encoding="utf-8")).values())
    links = []
    for top in ("exgrpo", "recipe", "scripts"):
        for f in (REPO / top).rglob("*"):
            if f.suffix in (".py", ".sh"):
                links += [(f, a) for a in re.findall(r"troubleshooting\.md#([\w-]+)", f.read_text(encoding="utf-8"))]
    assert links, "no message links to the troubleshooting page"
    bad = [f"{f.relative_to(REPO)}: #{a}" for f, a in links if a not in anchors]
    assert not bad, f"links to anchors docs/troubleshooting.md does not have: {bad}"
