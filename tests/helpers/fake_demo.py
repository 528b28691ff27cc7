"""``python -m tests.helpers.fake_demo [the demo's arguments]``: the CPU demo (``recipe/exgrpo/harness/demo.py``) as a
user runs it, with the trainer replaced by ``tests/helpers/fake_trainer.py`` and the tiny assets by placeholders:
its command line, its start-up lines, its output folder, its resume and its signal handling, in a second and
without Ray. The trainer and its "Ray cluster" still run in their own process session, as the real ones do."""

from __future__ import annotations

import operator
import shutil
import sys
import tempfile
import types
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

FAKE_TRAINER = Path(__file__).with_name("fake_trainer.py")
#: what the placeholder assets report of the warmed-up model
WARM_PASS_RATE = 0.22


def stand_in(
    folder: Path,
    setattr_: Callable[[Any, str, Any], None] = setattr,
    setitem_: Callable[[Any, str, Any], None] = operator.setitem,
) -> None:
    """Make the demo start the stand-in trainer (an interpreter written into ``folder``) on placeholder assets, from
    a stand-in of ``recipe.exgrpo.harness.assets`` (the real one imports torch: seconds); ``setattr_``, ``setitem_``:
    how to patch (a test's ``monkeypatch.setattr`` and ``monkeypatch.setitem`` undo it afterwards)."""
    from recipe.exgrpo.harness import demo

    shim = folder / "python"  # the interpreter the demo starts "-m recipe.exgrpo.main_exgrpo" with
    shim.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{FAKE_TRAINER}" "$@"\n')
    shim.chmod(0o755)
    report = {"pass_rate": WARM_PASS_RATE, "per_level": {"easy": {"pass_rate": 0.4}, "hard": {"pass_rate": 0.04}}}
    placeholders = SimpleNamespace(
        report=report,
        root=folder,
        model_path=folder / "model",
        train_file=folder / "train.parquet",
        val_file=folder / "val.parquet",
    )
    assets = types.ModuleType("recipe.exgrpo.harness.assets")
    assets.asset_spec = lambda *a, **k: None  # type: ignore[attr-defined]
    assets.ensure_assets = lambda *a, **k: placeholders  # type: ignore[attr-defined]
    setitem_(sys.modules, "recipe.exgrpo.harness.assets", assets)
    original = demo.demo_run

    def demo_run(out, **kw):
        run = original(out, **kw)
        run.python = str(shim)
        return run

    setattr_(demo, "demo_run", demo_run)


def main(argv: list[str]) -> int:
    from recipe.exgrpo.harness import demo

    folder = Path(tempfile.mkdtemp(prefix="fake-demo-"))
    try:
        stand_in(folder)
        return demo.main(argv)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
