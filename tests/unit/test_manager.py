"""ExperienceManager: the step calls a trainer makes (plan, select from token statistics, collect), and
save → load resume equivalence."""

import json
import shutil

import numpy as np
import pytest
import torch

from exgrpo.config import ExGRPOConfig
from exgrpo.experience.experience_pool import GroupMember
from exgrpo.experience.manager import ExperienceManager
from exgrpo.experience.selection import CandidateTokenStats

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
        out[f"q{q}"] = members
    return out


def _token_entropy(tokens):
    # a deterministic stand-in for the actor's per-token entropies: a function of the tokens
    return np.sin(np.asarray(tokens, dtype=np.float64)) + 1.0


def _stats(plan):
    """Padded per-token statistics of the plan's candidates, as the trainer's old-log-prob pass returns them."""
    flat = [c for g in plan.candidates for c in g]
    width = max(c.length for c in flat)
    mask = torch.zeros(len(flat), width)
    ent = torch.full((len(flat), width), 99.0)  # padding: must never count
    lp = torch.full((len(flat), width), -99.0)
    for i, c in enumerate(flat):
        mask[i, : c.length] = 1
        ent[i, : c.length] = torch.as_tensor(_token_entropy(c.token_ids))
        lp[i, : c.length] = torch.as_tensor(-np.cos(c.token_ids.astype(np.float64)) - 1.0)
    return CandidateTokenStats(mask, entropy=ent, log_prob=lp)


def _run_steps(mgr, rng, steps):
    draws = []
    for step in steps:
        plan = mgr.plan_replay(8, step)
        sel = mgr.select(plan, _stats(plan) if plan.needs_scores else None)
        draws.append((plan.question_ids, [(s.question_id, s.entry_id) for s in sel]))
        mgr.collect(step, _groups(rng, step))
        mgr.observe_pass_rate(0.5, step)
    return draws


def test_collect_plan_select_and_metrics():
    mgr = ExperienceManager(_cfg())
    rng = np.random.default_rng(0)
    mgr.collect(1, _groups(rng, 1))
    assert mgr.pool.num_questions == 12
    plan = mgr.plan_replay(8, 2)
    qids = plan.question_ids
    assert len(qids) == 4 and len(set(qids)) == 4  # floor(0.5 * 8), no duplicates
    assert plan.needs_scores and plan.num_candidates == sum(mgr.pool.num_entries(q) for q in qids)
    sel = mgr.select(plan, _stats(plan))
    for s in sel:
        cands = mgr.candidates([s.question_id])[0]
        scores = [np.mean(_token_entropy(c.token_ids)) for c in cands]
        assert s.entry_id == cands[int(np.argmin(scores))].entry_id  # lowest mean entropy wins
    with pytest.raises(ValueError, match="token statistics"):
        mgr.select(plan, None)
    m = mgr.metrics(2)
    assert m["exgrpo/replay/questions"] == 4.0 and m["exgrpo/mixed"] == 1.0
    assert any(k.startswith("exgrpo/pool/") for k in m)


def test_candidates_respect_the_response_limit_and_the_cap():
    """Trajectories longer than the current response limit are left out and counted; a question with none left
    is not replayed (a run resumed with a lower data.max_response_length must not crash)."""
    long_, short1, short2 = (np.arange(n, dtype=np.int32) + 10 * n for n in (9, 3, 4))
    ok = [GroupMember(t, np.full(len(t), -0.5, np.float32), 1.0) for t in (long_, short1, short2)]
    bad = GroupMember(np.array([1, 2], np.int32), np.zeros(2, np.float32), 0.0)
    mgr = ExperienceManager(_cfg(max_candidates_per_question=2))
    mgr.collect(1, {"a": [*ok, bad], "b": [ok[0], bad, bad, bad]})  # a: 9, 3, 4 tokens stored; b: 9 tokens
    assert [c.length for c in mgr.candidates(["a"])[0]] == [3, 4]  # the newest 2
    assert [c.length for c in mgr.candidates(["a"], max_response_length=8)[0]] == [3, 4]
    assert [[c.length for c in g] for g in mgr.candidates(["a", "b"], max_response_length=3)] == [[3], []]
    assert mgr.metrics(1)["exgrpo/selection/too_long_candidates"] == 3.0  # a: 9 and 4 tokens; b: 9
    plan = mgr.plan_replay(4, 2, max_response_length=8)  # floor(0.5 * 4) = 2: both questions drawn
    assert plan.question_ids == ["a"] and [c.length for c in plan.candidates[0]] == [3, 4]
    assert mgr.metrics(2)["exgrpo/replay/dropped_too_long"] == 1.0
    assert mgr.plan_replay(4, 3, max_response_length=2).question_ids == []


def test_random_metric_is_preselected_without_the_model():
    mgr = ExperienceManager(_cfg(trajectory_metric="random"))
    mgr.collect(1, _groups(np.random.default_rng(2), 1))
    plan = mgr.plan_replay(8, 2)
    assert len(plan) == 4 and not plan.needs_scores
    assert [len(g) for g in plan.candidates] == [1, 1, 1, 1]  # only the chosen trajectory enters the pass
    sel = mgr.select(plan)
    assert [s.entry_id for s in sel] == [g[0].entry_id for g in plan.candidates]


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
    later_a = _run_steps(uninterrupted, rng_a, [4, 5, 6])
    later_b = _run_steps(fresh, rng_b, [4, 5, 6])
    assert later_a == later_b and any(q for q, _ in later_a)


def test_checkpoint_of_the_earlier_version_with_a_prompt_store_still_loads(tmp_path):
    """Checkpoints written before the fused pass also hold prompts.arrow and manifest.json: ignored on load."""
    mgr = ExperienceManager(_cfg())
    _run_steps(mgr, np.random.default_rng(4), [1, 2])
    mgr.save(tmp_path / "exp", trainer_state={"loader_epoch": 1})
    assert sorted(p.name for p in (tmp_path / "exp").iterdir()) == ["pool"]
    (tmp_path / "exp" / "prompts.arrow").write_bytes(b"an old prompt store")
    (tmp_path / "exp" / "manifest.json").write_text(json.dumps({"pool": "pool", "prompts": "prompts.arrow"}))
    restored = ExperienceManager(_cfg())
    assert restored.load(tmp_path / "exp") == {"loader_epoch": 1}
    assert restored.state_digest() == mgr.state_digest()
    shutil.rmtree(tmp_path / "exp" / "pool")
    with pytest.raises(Exception, match="pool"):
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
        groups[f"q{q}"] = members
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
