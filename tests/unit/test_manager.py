"""ExperienceManager: the step calls a trainer makes, and save → load resume equivalence (prompts included)."""

import numpy as np
import pytest

from exgrpo.config import ExGRPOConfig
from exgrpo.experience.manager import ExperienceManager
from exgrpo.experience.persistence import PoolCheckpointError
from exgrpo.experience.pool import GroupMember

K = 4


def _cfg(**kw):
    base = {"delayed_start_threshold": -1.0, "replay_ratio": 0.5, "seed": 7, "trajectory_metric": "entropy"}
    base.update(kw)
    return ExGRPOConfig.from_dict(base, k=K)


def _groups(rng, step, n_questions=12):
    """Groups with 1..K-1 successes so every question lands in the pool, distinct random responses."""
    out = {}
    for q in range(n_questions):
        k = 1 + (q + step) % (K - 1)
        members = []
        for j in range(K):
            length = int(rng.integers(3, 9))
            members.append(
                GroupMember(
                    rng.integers(10, 200, size=length).astype(np.int32),
                    rng.normal(-1.0, 0.3, size=length).astype(np.float32),
                    1.0 if j < k else 0.0,
                )
            )
        out[f"q{q}"] = (np.arange(5 + q % 3, dtype=np.int32), members)
    return out


def _score_fn(prompts, responses):
    # a deterministic stand-in for the actor's pass: entropy = a function of the tokens
    return {
        "entropy": [np.sin(r.astype(np.float64)) + 1.0 + 0.01 * len(p) for p, r in zip(prompts, responses)],
        "log_prob": [-np.cos(r.astype(np.float64)) - 1.0 for r in responses],
    }


def _run_steps(mgr, rng, steps):
    draws = []
    for step in steps:
        qids = mgr.draw_replay(8, step)
        sel = mgr.select(qids, _score_fn)
        draws.append((qids, [(s.question_id, s.entry_id) for s in sel]))
        mgr.collect(step, _groups(rng, step))
        mgr.observe_pass_rate(0.5, step)
    return draws


def test_collect_draw_select_and_metrics():
    mgr = ExperienceManager(_cfg())
    rng = np.random.default_rng(0)
    mgr.collect(1, _groups(rng, 1))
    assert mgr.pool.num_questions == 12 and len(mgr.prompts) == 12
    qids = mgr.draw_replay(8, 2)
    assert len(qids) == 4 and len(set(qids)) == 4  # floor(0.5 * 8), no duplicates
    sel = mgr.select(qids, _score_fn)
    for s in sel:
        cands = mgr.candidates([s.question_id])[0]
        scores = [np.mean(_score_fn([mgr.prompts[c.question_id]], [c.token_ids])["entropy"][0]) for c in cands]
        assert s.entry_id == cands[int(np.argmin(scores))].entry_id  # lowest mean entropy wins
    m = mgr.metrics(2)
    assert m["exgrpo/replay/questions"] == 4.0 and m["exgrpo/mixed"] == 1.0
    assert any(k.startswith("exgrpo/pool/") for k in m)


def test_no_replay_before_delayed_start_and_strict_switch():
    mgr = ExperienceManager(_cfg(delayed_start_threshold=0.35))
    rng = np.random.default_rng(1)
    mgr.collect(1, _groups(rng, 1))  # collect_from=start: the pool fills before the switch
    assert mgr.pool.num_questions > 0 and mgr.draw_replay(8, 1) == []
    assert not mgr.observe_pass_rate(0.35, 1)  # strict >
    assert mgr.observe_pass_rate(0.36, 2) and mgr.draw_replay(8, 3)


def test_save_load_resume_equivalence(tmp_path):
    uninterrupted = ExperienceManager(_cfg())
    resumed = ExperienceManager(_cfg())
    rng_a, rng_b = np.random.default_rng(3), np.random.default_rng(3)
    _run_steps(uninterrupted, rng_a, [1, 2, 3])
    _run_steps(resumed, rng_b, [1, 2, 3])
    resumed.save(tmp_path / "exp", trainer_state={"leftover_rows": [4, 5]})
    fresh = ExperienceManager(_cfg())
    state = fresh.load(tmp_path / "exp")
    assert state == {"leftover_rows": [4, 5]}
    assert set(fresh.prompts) == set(uninterrupted.prompts)
    later_a = _run_steps(uninterrupted, rng_a, [4, 5, 6])
    later_b = _run_steps(fresh, rng_b, [4, 5, 6])
    assert later_a == later_b and any(q for q, _ in later_a)


def test_missing_or_corrupt_prompt_file_is_a_clear_error(tmp_path):
    mgr = ExperienceManager(_cfg())
    _run_steps(mgr, np.random.default_rng(4), [1, 2])
    mgr.save(tmp_path / "exp")
    (tmp_path / "exp" / "prompts.arrow").write_bytes(b"garbage")
    with pytest.raises(PoolCheckpointError, match="prompts.arrow"):
        ExperienceManager(_cfg()).load(tmp_path / "exp")
    (tmp_path / "exp" / "prompts.arrow").unlink()
    with pytest.raises(PoolCheckpointError, match="missing"):
        ExperienceManager(_cfg()).load(tmp_path / "exp")


def test_state_digest_tracks_every_part(tmp_path):
    mgr = ExperienceManager(_cfg())
    rng = np.random.default_rng(5)
    _run_steps(mgr, rng, [1, 2])
    before = mgr.state_digest()
    mgr.save(tmp_path / "exp")
    restored = ExperienceManager(_cfg())
    restored.load(tmp_path / "exp")
    assert restored.state_digest() == before
    mgr.draw_replay(8, 3)  # advances the sampler's RNG only
    after = mgr.state_digest()
    assert after["sampler"] != before["sampler"] and after["pool"] == before["pool"]
    mgr.collect(3, _groups(rng, 3))
    assert mgr.state_digest()["pool"] != before["pool"]


def _retire_all(mgr, step, n_questions=12):
    groups = {}
    for q in range(n_questions):
        members = [GroupMember(np.array([5, q, 9], np.int32), np.full(3, -0.5, np.float32), 1.0) for _ in range(K)]
        groups[f"q{q}"] = (np.arange(4, dtype=np.int32), members)
    mgr.collect(step, groups)


def test_readd_retired_every_n_steps_with_checkpointed_rng(tmp_path):
    mgr = ExperienceManager(_cfg(readd_retired_fraction=0.25, readd_retired_every=5))
    _retire_all(mgr, 1)
    assert len(mgr.retired) == 12
    assert mgr.readd_retired(4) == []  # not a multiple of readd_retired_every
    mgr.save(tmp_path / "exp")
    back = mgr.readd_retired(5)
    assert len(back) == 3 and len(mgr.retired) == 9  # floor(0.25 * 12)
    assert not any(q in mgr.retired for q in back)
    assert mgr.metrics(5)["exgrpo/readded_retired"] == 3.0
    restored = ExperienceManager(_cfg(readd_retired_fraction=0.25, readd_retired_every=5))
    restored.load(tmp_path / "exp")
    assert restored.readd_retired(5) == back  # same draw after a resume
    off = ExperienceManager(_cfg())
    _retire_all(off, 1)
    assert off.readd_retired(25) == [] and len(off.retired) == 12  # default: off


def test_readd_retired_config_is_validated():
    with pytest.raises(ValueError, match="exgrpo.readd_retired_fraction"):
        _cfg(readd_retired_fraction=1.5)
    with pytest.raises(ValueError, match="exgrpo.readd_retired_every"):
        _cfg(readd_retired_every=0)
