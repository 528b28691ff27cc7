"""Small things a new user meets: the Ray helpers' dry run and their answer when no cluster runs, the CPU demo's
help, its line when validation is off, and a mistyped demo override caught with the launch scripts' did-you-mean."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from recipe.exgrpo.harness import demo
from tests.helpers.launch_scripts import TRAIN_DIR, run_script, script_env

COMMON = TRAIN_DIR / "common.sh"


def test_a_dry_run_ray_head_says_nothing_started():
    proc = run_script(COMMON, "ray-head", env=script_env(DRY_RUN="1", N_GPUS_PER_NODE="4"))
    assert proc.returncode == 0, proc.stderr
    assert "dry run, would run: " in proc.stderr and "start --head --port=6379 --num-gpus=4" in proc.stderr
    assert "head started" not in proc.stderr
    assert "[exgrpo] dry run: nothing was started. After a real ray-head, on every other node" in proc.stderr


def _ray_without_a_cluster(tmp_path: Path) -> Path:
    """A stand-in for $PYTHON whose ``ray status`` answers as Ray 2.60's does when no cluster runs: a traceback ending
    in the ConnectionError (a real one may find another user's cluster on a shared machine, or wait ~40 s for an
    address that does not answer)."""
    shim = tmp_path / "python"
    shim.write_text(
        "#!/usr/bin/env bash\n"
        'if [[ "$*" == *"ray.scripts.scripts status"* ]]; then\n'
        "  echo 'Traceback (most recent call last):' >&2\n"
        "  echo '  File \"ray/_private/services.py\", line 753, in canonicalize_bootstrap_address_or_die' >&2\n"
        "  echo 'ConnectionError: Could not find any running Ray instance. Please specify the one to connect to by "
        "setting the `--address` flag or `RAY_ADDRESS` environment variable.' >&2\n"
        "  exit 1\n"
        "fi\n"
        f'exec {sys.executable} "$@"\n',
        encoding="utf-8",
    )
    shim.chmod(shim.stat().st_mode | stat.S_IXUSR)
    return shim


def test_ray_status_without_a_cluster_is_one_line(tmp_path):
    env = script_env(PYTHON=str(_ray_without_a_cluster(tmp_path)), HOME=str(tmp_path))
    proc = run_script(COMMON, "ray-status", env=env)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    (error,) = [line for line in proc.stderr.splitlines() if "error" in line]
    assert error == (
        "[exgrpo] error: ray status failed: ConnectionError: Could not find any running Ray instance. Please specify "
        "the one to connect to by setting the `--address` flag or `RAY_ADDRESS` environment variable. Is a cluster "
        "running? Start one with 'bash scripts/train/common.sh ray-head' (and RAY_ADDRESS=HOST:PORT for another "
        "node's)"
    )


def test_the_demo_says_its_defaults_and_when_validation_is_off():
    help_text = " ".join(demo.build_parser().format_help().split())
    assert "--steps STEPS training steps (default 60)" in help_text
    assert "seed of data order, sampling and replay (default 0)" in help_text
    assert "(default 10; 0: off)" in help_text and "(default 1500)" in help_text
    run = demo.demo_run(".")
    assert demo.run_description(run, 10).endswith("validation every 10 steps (sampled at T = 1)")
    assert demo.run_description(run, 0) == "60 steps of 16 questions x K = 8, lr 0.0002, no validation (--test-freq 0)"


def test_a_mistyped_demo_override_stops_before_the_assets_with_a_did_you_mean(tmp_path, monkeypatch, capsys):
    from recipe.exgrpo.harness import assets

    monkeypatch.setattr(assets, "ensure_assets", lambda *a, **k: pytest.fail("the assets were built before the check"))
    rc = demo.main(["--out", str(tmp_path / "out"), "exgrpo.replay_ratoi=0.25", "trainer.save_freq=5"])
    err = capsys.readouterr().err
    assert rc == 2, err
    assert "[demo] the extra overrides do not validate:" in err
    assert (
        "[demo]   - unknown key exgrpo.replay_ratoi (did you mean exgrpo.replay_ratio?); to add a new key on purpose "
        "write +exgrpo.replay_ratoi=VALUE" in err
    )
    bad_value = demo.override_problems(demo.demo_run(tmp_path, extra_overrides=["exgrpo.replay_ratio=1.5"]))
    assert any("exgrpo.replay_ratio" in p and "1.5" in p for p in bad_value), bad_value
    assert demo.override_problems(demo.demo_run(tmp_path, extra_overrides=["exgrpo.replay_ratio=0.25"])) == []


def _stub(path: Path, log: Path) -> None:
    path.write_text(f'#!/usr/bin/env bash\necho "$(basename "$0") $*" >> "{log}"\n')
    path.chmod(0o755)


def test_the_test_command_on_a_selection_builds_nothing_it_may_not_need(tmp_path, repo_root):
    """``run_tests.sh -k PATTERN`` built the vLLM venv and all three tiny models (minutes) before its few tests."""
    root, log = tmp_path / "checkout", tmp_path / "calls.log"
    (root / "scripts").mkdir(parents=True)
    (root / "scripts" / "run_tests.sh").write_text((repo_root / "scripts" / "run_tests.sh").read_text())
    _stub(root / "scripts" / "setup_env.sh", log)
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    for tool in ("python", "ruff"):
        _stub(venv / "bin" / tool, log)

    def calls(*args: str) -> list[str]:  # what the test command ran
        log.unlink(missing_ok=True)
        env = {k: v for k, v in os.environ.items() if not k.startswith("EXGRPO_")}
        proc = subprocess.run(
            ["bash", str(root / "scripts" / "run_tests.sh"), *args],
            env={**env, "VENV": str(venv)},
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert proc.returncode == 0, proc.stderr
        return log.read_text().splitlines()

    selection = calls("-k", "pool")
    assert "setup_env.sh --vllm" not in selection and not [c for c in selection if "harness.assets" in c]
    assert [c for c in selection if c.startswith("python -m pytest")] == ["python -m pytest --durations=25 -k pool"]
    # (the whole suite, no arguments, still builds both beside its sessions: CI runs that path every time)
