"""The docs as a site and the pages generated or checked from the code: the settings reference is what the code
declares, the version is written once and the changelog starts with it (the site's own build, ``mkdocs build
--strict``, runs in scripts/run_tests.sh)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

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


# ------------------------------------------------------------------------------------------------- the README
README = REPO / "README.md"
#: the README's budget: what a new user reads in a few minutes (every other figure lives in docs/ with its command)
README_MAX_BYTES = 12 * 1024


def _bash_blocks(text: str) -> list[tuple[int, list[str]]]:
    """(first line number, the commands) of every ```bash block, comments and blank lines dropped."""
    blocks, current, start = [], None, 0
    for n, line in enumerate(text.splitlines(), 1):
        if line.startswith("```"):
            if current is None and line.strip() == "```bash":
                current, start = [], n
            elif current is not None:
                blocks.append((start, current))
                current = None
        elif current is not None and line.split("#")[0].strip():
            current.append(line.split("  #")[0].strip())
    return blocks


def test_the_readme_is_short_and_opens_with_the_two_commands_the_gpu_quickstart_and_the_features():
    text = README.read_text(encoding="utf-8")
    assert len(text.encode("utf-8")) <= README_MAX_BYTES, f"README.md is {len(text.encode())} bytes"
    top = "\n".join(text.splitlines()[:60])
    (first_line, first), (gpu_line, gpu), *_ = _bash_blocks(text)
    assert first == ["bash scripts/demo_cpu.sh", "bash scripts/run_tests.sh"], first  # exactly these two, first
    assert first_line < gpu_line < 60
    for step in ("scripts/install_gpu.sh", "scripts/prepare_data.sh", "scripts/train/", "scripts/eval/"):
        assert any(step in c for c in gpu), f"the GPU quickstart has no {step}"
    assert "arXiv 2510.02245" in top or "arxiv.org/abs/2510.02245" in top
    table = [line for line in top.splitlines() if line.startswith("| ")]
    assert table and table[0].startswith("| feature |"), "no feature table in the first 60 lines"
    for feature in (
        "verl 0.9.1",
        "v1 trainer",
        "one actor pass",
        "checkpoints",
        "continuous",
        "tool-calling",
        "vLLM",
        "CPU demo",
        "tested on CPU",
    ):
        assert any(feature.lower() in row.lower() for row in table), f"the feature table has no row on {feature!r}"


# -------------------------------------------------------------------------------------------------- the site
def test_every_docs_page_is_in_the_sites_navigation():
    import yaml

    config = yaml.safe_load((REPO / "mkdocs.yml").read_text(encoding="utf-8"))

    def pages(nav) -> list[str]:
        out = []
        for item in nav:
            value = next(iter(item.values())) if isinstance(item, dict) else item
            out += pages(value) if isinstance(value, list) else [value]
        return out

    listed = pages(config["nav"])
    assert sorted(p.name for p in DOCS.glob("*.md")) == sorted(p for p in listed if p != "changelog.md")
    assert config["validation"] == {
        "omitted_files": "warn",
        "absolute_links": "warn",
        "unrecognized_links": "warn",
        "anchors": "warn",
    }
    assert "mkdocs build --strict" in (REPO / "scripts" / "run_tests.sh").read_text(encoding="utf-8")


def test_the_build_checks_the_readmes_links(tmp_path):
    """The hook names a README link to a missing page, a missing anchor, a missing file and a missing heading."""
    import importlib.util

    if importlib.util.find_spec("mkdocs") is None:
        pytest.skip("mkdocs is not installed (bash scripts/setup_env.sh installs it)")
    from mkdocs.structure.files import File, Files

    spec = importlib.util.spec_from_file_location("mkdocs_hooks", REPO / "scripts" / "lib" / "mkdocs_hooks.py")
    hooks = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hooks)

    class Page:
        present_anchor_ids = {"stage-deadlines"}

    page_file = File("trainer.md", str(DOCS), str(tmp_path), use_directory_urls=True)
    page_file.page = Page()
    readme = (
        "# Title\n## Two commands\n[ok](docs/trainer.md#stage-deadlines) [ok](#two-commands) [ok](CHANGELOG.md) "
        "[ok](https://arxiv.org/abs/2510.02245)\n[a](docs/nowhere.md) [b](docs/trainer.md#nope) [c](missing.txt) "
        "[d](#nope)\n"
    )
    problems = hooks.readme_link_problems(readme, Files([page_file]))
    assert len(problems) == 4, problems
    assert [p.split("'")[1] for p in problems] == ["docs/nowhere.md", "docs/trainer.md#nope", "missing.txt", "#nope"]
