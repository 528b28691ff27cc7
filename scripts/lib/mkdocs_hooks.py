"""MkDocs hooks of the docs site (mkdocs.yml ``hooks:``): the changelog as a page, and the README's links checked.

- ``CHANGELOG.md`` lives at the repository's root (where people look for it); the site shows it as ``changelog.md``.
- The README is not a page of the site (its index is written for the site), but its links are checked with the
  site's: every ``docs/X.md#anchor`` must name a page and an anchor the build made, every other relative link a file
  or folder of the checkout. A broken one is a warning, which ``mkdocs build --strict`` turns into a failure.
"""

from __future__ import annotations

import logging
import re
from pathlib import Path

from mkdocs.structure.files import File, Files

log = logging.getLogger("mkdocs.hooks.exgrpo")
REPO = Path(__file__).resolve().parents[2]
LINK = re.compile(r"\]\(([^)\s]+)\)")
_files: Files | None = None


def on_files(files: Files, config) -> Files:
    global _files
    changelog = (REPO / "CHANGELOG.md").read_text(encoding="utf-8")
    files.append(File.generated(config, "changelog.md", content=changelog))
    _files = files
    return files


def readme_link_problems(readme: str, files: Files) -> list[str]:
    """Every link of the README that does not land: (a message per broken link)."""
    from markdown.extensions.toc import slugify

    own = {slugify(m[1].replace("`", ""), "-") for m in re.finditer(r"^#{1,6} (.+)$", readme, re.M)}
    problems = []
    for target in LINK.findall(readme):
        if re.match(r"^[a-z]+:", target):  # https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        if not path:
            if anchor not in own:
                problems.append(f"README.md links to '#{anchor}', which is not one of its headings")
            continue
        if path.startswith("docs/") and path.endswith(".md"):
            page_file = files.get_file_from_path(path[len("docs/") :])
            if page_file is None or page_file.page is None:
                problems.append(f"README.md links to '{target}', which is not a page of the site")
            elif anchor and anchor not in (page_file.page.present_anchor_ids or set()):
                problems.append(f"README.md links to '{target}', but {path} has no anchor '#{anchor}'")
        elif not (REPO / path).exists():
            problems.append(f"README.md links to '{target}', which is not in the checkout")
    return problems


def on_post_build(config) -> None:
    assert _files is not None
    for problem in readme_link_problems((REPO / "README.md").read_text(encoding="utf-8"), _files):
        log.warning(problem)
