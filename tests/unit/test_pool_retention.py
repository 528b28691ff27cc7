"""The pools of old checkpoints follow verl's retention (trainer.max_actor_ckpt_to_keep)."""

from __future__ import annotations

import pytest

from recipe.exgrpo.replay_step import POOL_DIRNAME, prune_pools


def _checkpoints(root, steps):
    for s in steps:
        (root / f"global_step_{s}" / POOL_DIRNAME / "pool").mkdir(parents=True)
        (root / f"global_step_{s}" / "data.pt").write_bytes(b"loader")
    (root / "global_step_x").mkdir()  # not a checkpoint of ours: untouched
    (root / "latest_checkpointed_iteration.txt").write_text(str(max(steps)))


def test_only_the_newest_pools_are_kept(tmp_path):
    _checkpoints(tmp_path, [50, 100, 150, 1000])
    removed = prune_pools(str(tmp_path), 2)
    assert sorted(removed) == sorted(str(tmp_path / f"global_step_{s}" / POOL_DIRNAME) for s in (50, 100))
    kept = sorted(p.parent.name for p in tmp_path.glob(f"global_step_*/{POOL_DIRNAME}"))
    assert kept == ["global_step_1000", "global_step_150"]  # by step number, not by name
    assert (tmp_path / "global_step_50" / "data.pt").exists()  # verl's files are verl's business
    assert prune_pools(str(tmp_path), 2) == []


@pytest.mark.parametrize("keep", [None, 0, -1])
def test_keep_all_when_verl_keeps_all(tmp_path, keep):
    _checkpoints(tmp_path, [1, 2, 3])
    assert prune_pools(str(tmp_path), keep) == []
    assert len(list(tmp_path.glob(f"global_step_*/{POOL_DIRNAME}"))) == 3


def test_missing_directory(tmp_path):
    assert prune_pools(str(tmp_path / "nope"), 2) == []
