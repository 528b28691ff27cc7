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
