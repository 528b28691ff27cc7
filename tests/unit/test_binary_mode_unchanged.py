"""The binary reward mode is bit for bit what it was before the continuous mode was added.

``tests/unit/binary_mode_driver.py`` runs the same scripted sequence of draws, selections, collections, delayed
start and re-added retired questions, saves the pool and computes the mixed loss and its gradient, with this
checkout's ``exgrpo`` and with the ``exgrpo`` package of :data:`BEFORE` (the last commit before the reward mode
existed). The state digests, the saved files (entries, tokens, the header without its save time) and the loss,
metrics and gradient must be equal.

The "before" side is the live old tree, extracted with ``git archive``, where the history holds :data:`BEFORE`;
in a clone without it (a shallow clone) it is the fingerprint recorded from that tree in :data:`RECORDED`. A second
test keeps the record honest: with the history, it must equal the live old tree's fingerprint; without it, the
file must be the one this module names by its SHA-256 (so it cannot be edited on its own). Neither test skips when
``CI`` is set. The fingerprint is the same with 1 and 2 threads and with torch's vectorised kernels on or off
(``ATEN_CPU_CAPABILITY=default`` vs ``avx2``: measured); the driver runs single-threaded all the same. The last bits
of the gradient do depend on the processor (a CI machine's differed from the recording machine's in the gradient's
digest only), so when one side is the record, made elsewhere, the gradient and the float metrics are compared value
by value within a relative 1e-12; when both sides ran here, everything is compared bit for bit. The fingerprint
depends on the versions of numpy, torch and pyarrow (the saved Arrow files): after an upgrade the record test fails,
and ``python tests/unit/test_binary_mode_unchanged.py --record`` (which needs the history) writes a new record.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import tempfile
from importlib.metadata import version
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DRIVER = Path(__file__).resolve().with_name("binary_mode_driver.py")
RECORDED = Path(__file__).resolve().with_name("binary_mode_fingerprint.json")
#: the SHA-256 of RECORDED as committed (update it together with the record)
RECORDED_SHA256 = "cf39dffe092835c02ec7ef02d17810c15af7f80bf39f145bab9021168d67e1e6"
#: the last commit of the project before the continuous reward mode (its exgrpo package is the "before")
BEFORE = "f627cf2"
VERSIONS = ("numpy", "torch", "pyarrow")


def _fingerprint(tree: Path, out: Path) -> dict:
    env = {**os.environ, "PYTHONPATH": str(tree), "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    proc = subprocess.run(
        [sys.executable, str(DRIVER), str(out)], env=env, capture_output=True, text=True, timeout=300, cwd=out.parent
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert Path(result.pop("package")) == (tree / "exgrpo").resolve()
    return result


#: how far a value recorded on another processor may be from the one computed here (relative)
CROSS_MACHINE_RTOL = 1e-12


def _close(a: str, b: str) -> bool:
    x, y = float.fromhex(a), float.fromhex(b)
    return x == y or abs(x - y) <= CROSS_MACHINE_RTOL * max(abs(x), abs(y))


def _loss_differences(here: dict, there: dict, exact: bool) -> list[str]:
    """What differs between two ``loss`` fingerprints: everything bit for bit when ``exact``, else the gradient
    values and the floats within :data:`CROSS_MACHINE_RTOL` (the gradient's digest is then left out)."""
    if exact:
        return [] if here == there else [f"{here} != {there}"]
    found = []
    if here.keys() != there.keys():
        return [f"the loss variants differ: {sorted(here)} vs {sorted(there)}"]
    for variant, a in here.items():
        b = there[variant]
        if a["metrics"].keys() != b["metrics"].keys():
            found.append(f"{variant}: the metric names differ")
            continue
        pairs = [("loss", a["loss"], b["loss"])] + [(k, v, b["metrics"][k]) for k, v in a["metrics"].items()]
        found += [f"{variant} {name}: {x} vs {y}" for name, x, y in pairs if not _close(x, y)]
        ga, gb = a.get("grad_values", []), b.get("grad_values", [])
        if not ga or len(ga) != len(gb):
            found.append(f"{variant}: gradient values missing or of different sizes ({len(ga)} vs {len(gb)})")
        else:
            found += [f"{variant} grad[{i}]: {x} vs {y}" for i, (x, y) in enumerate(zip(ga, gb)) if not _close(x, y)]
    return found


def _old_tree(root: Path) -> tuple[Path | None, str]:
    """``root`` holding the ``exgrpo`` package of :data:`BEFORE`, or None and why not."""
    try:
        archive = subprocess.run(
            ["git", "-C", str(REPO), "archive", BEFORE, "exgrpo"], capture_output=True, check=True, timeout=60
        ).stdout
    except (OSError, subprocess.CalledProcessError, subprocess.TimeoutExpired) as e:
        return None, f"the git history with {BEFORE} is not available here ({e})"
    root.mkdir(parents=True, exist_ok=True)
    subprocess.run(["tar", "-x", "-C", str(root)], input=archive, check=True)
    return root, ""


def _versions() -> dict[str, str]:
    return {name: version(name) for name in VERSIONS}


@pytest.fixture(scope="module")
def live_before(tmp_path_factory) -> dict | None:
    """The old tree's fingerprint, computed here; None (with the reason printed) without the history."""
    root = tmp_path_factory.mktemp("before")
    tree, why = _old_tree(root / "tree")
    if tree is None:
        print(f"{why}: comparing against the recorded fingerprint {RECORDED.name}")
        return None
    return _fingerprint(tree, root / "out")


def _recorded() -> dict:
    assert RECORDED.is_file(), f"{RECORDED} is missing: it is part of the repository (restore it with git)"
    return json.loads(RECORDED.read_text())


def test_binary_pool_and_loss_match_the_code_before_the_reward_mode(live_before, tmp_path):
    if live_before is not None:
        before, source, exact = live_before, f"the live tree of {BEFORE}", True
    elif RECORDED.is_file():
        record = _recorded()
        before, source, exact = record["fingerprint"], f"{RECORDED.name} (recorded with {record['versions']})", False
    elif os.environ.get("CI"):
        pytest.fail(f"neither the git history with {BEFORE} nor {RECORDED.name}: nothing to compare against")
    else:
        pytest.skip(f"neither the git history with {BEFORE} nor {RECORDED.name}")
    after = _fingerprint(REPO, tmp_path / "after")
    # the sequence did exercise the pool: trajectories stored, questions retired, mixed mode on
    assert before["pool"]["pool_entries"] > 0 and before["pool"]["retired"] > 0 and before["pool"]["mixed"]
    assert after["pool"] == before["pool"], f"pool differs from {source} (here: {_versions()})"
    differences = _loss_differences(after["loss"], before["loss"], exact)
    assert not differences, f"loss differs from {source} (here: {_versions()}): {differences[:5]}"


def test_the_recorded_fingerprint_is_the_old_trees(live_before):
    record = _recorded()
    assert record["commit"] == BEFORE
    if live_before is not None:
        assert record["fingerprint"]["pool"] == live_before["pool"], (
            f"{RECORDED.name}'s pool (made with {record['versions']}) differs from the live tree of {BEFORE}'s "
            f"(here: {_versions()}): rerun python tests/unit/test_binary_mode_unchanged.py --record and update "
            "RECORDED_SHA256"
        )
        differences = _loss_differences(live_before["loss"], record["fingerprint"]["loss"], exact=False)
        assert not differences, (
            f"{RECORDED.name} (made with {record['versions']}) differs from the live tree of {BEFORE} (here: "
            f"{_versions()}): rerun python tests/unit/test_binary_mode_unchanged.py --record and update "
            f"RECORDED_SHA256: {differences[:5]}"
        )
    else:  # no history: the record must at least be the committed one
        assert hashlib.sha256(RECORDED.read_bytes()).hexdigest() == RECORDED_SHA256, (
            f"{RECORDED.name} is not the file this test was committed with (RECORDED_SHA256)"
        )


def record() -> None:
    """Write :data:`RECORDED` from the live old tree (needs the history) and print its SHA-256."""
    with tempfile.TemporaryDirectory() as tmp:
        tree, why = _old_tree(Path(tmp) / "tree")
        if tree is None:
            raise SystemExit(why)
        (Path(tmp) / "out").mkdir()
        fingerprint = _fingerprint(tree, Path(tmp) / "out" / "before")
    payload = {"commit": BEFORE, "versions": _versions(), "fingerprint": fingerprint}
    RECORDED.write_text(json.dumps(payload, indent=1, sort_keys=True) + "\n")
    print(f"wrote {RECORDED}; RECORDED_SHA256 = {hashlib.sha256(RECORDED.read_bytes()).hexdigest()!r}")


if __name__ == "__main__":
    if sys.argv[1:] != ["--record"]:
        raise SystemExit("usage: python tests/unit/test_binary_mode_unchanged.py --record")
    sys.path.insert(0, str(REPO))
    record()
