"""Save/load of the whole experience state: round trip, resume equivalence, atomicity, corruption errors."""

import json
import os
import zlib

import numpy as np
import pytest

from exgrpo.config import ExGRPOConfig
from exgrpo.experience import (
    BucketSampler,
    ExperiencePool,
    Group,
    GroupMember,
    PoolCheckpointError,
    TokenStorage,
    TrajectorySelector,
    experience_exists,
    load_experience,
    save_experience,
)
from exgrpo.experience import persistence as persistence_mod
from exgrpo.schedule import ExperienceSchedule, batch_pass_rate
from tests.helpers.experience import resign_header

K = 4
B = 8
N_QUESTIONS = 40


def components(layout="arena", metric="random", seed=11):
    cfg = ExGRPOConfig.from_dict(
        {
            "seed": seed,
            "delayed_start_threshold": 0.3,
            "replay_ratio_ramp_steps": 3,
            "trajectory_metric": metric,
            "max_candidates_per_question": 3,
            "pool_storage": layout,
            "max_total_tokens": 3000,
        },
        k=K,
    )
    return (
        cfg,
        ExperiencePool.from_config(cfg, chunk_tokens=200),
        BucketSampler.from_config(cfg),
        TrajectorySelector.from_config(cfg),
        ExperienceSchedule.from_config(cfg),
    )


def provider(cands, quantity):
    """A deterministic stand-in for the current policy's mean token entropy."""
    return [float(np.mean(c.token_ids % 7)) + 0.01 * c.length for c in cands]


def run_step(step, cfg, pool, sampler, selector, schedule):
    """One synthetic training step in the trainer's order; the environment depends only on the step."""
    env = np.random.default_rng([1234, step])
    order = env.permutation(N_QUESTIONS)
    fresh_pool = [f"q{i}" for i in order if f"q{i}" not in pool.retired]
    n = schedule.num_replay(step, B)
    draw = sampler.draw(pool, n, exclude=set(fresh_pool[:B]))
    fresh = fresh_pool[: B - len(draw)]
    cands = pool.candidates(draw.question_ids, max_per_question=cfg.max_candidates_per_question)
    selected = selector.select(cands, provider if selector.needs_scores else None)
    groups, rewards = [], []
    for qid, replayed in [(q, None) for q in fresh] + [(s.question_id, s) for s in selected]:
        difficulty = int(qid[1:]) / N_QUESTIONS
        members = []
        if replayed is not None:
            members.append(GroupMember(replayed.token_ids, replayed.behaviour_log_probs, 1.0, True))
        while len(members) < K:
            length = int(env.integers(3, 25))
            ids = env.integers(0, 12, length)
            members.append(GroupMember(ids, -env.random(length).astype(np.float32), float(env.random() > difficulty)))
        groups.append(Group(qid, members))
        rewards += [m.reward for m in members]
    stats = pool.collect(step, groups, mixed=schedule.mixed)
    schedule.update(step, batch_pass_rate(rewards))
    return {
        "draw": list(draw.question_ids),
        "selected": [(s.question_id, s.entry_id) for s in selected],
        "fresh": fresh,
        "added": stats.added_entries,
        "retired": stats.retired,
    }


def snapshot(pool):
    st = pool.state_dict()
    meta = {k: v for k, v in st["meta"].items() if k != "settings"}  # the loading pool's own switches
    return (
        json.dumps(meta, sort_keys=True),
        {k: v.tolist() for k, v in st["entries"].items()},
        st["token_ids"].tolist(),
        st["behaviour_log_probs"].tolist(),
    )


@pytest.mark.parametrize("metric", ["random", "entropy"])
@pytest.mark.parametrize(
    ("layout_a", "layout_b"), [("arena", "arena"), ("per_entry", "per_entry"), ("arena", "per_entry")]
)
def test_resume_equivalence(tmp_path, metric, layout_a, layout_b):
    cfg, *a = components(layout_a, metric)
    history = [run_step(t, cfg, *a) for t in range(1, 16)]
    assert a[3].mixed, "the synthetic run must reach mixed mode before the save"
    save_experience(tmp_path / "ckpt", pool=a[0], sampler=a[1], selector=a[2], schedule=a[3], extra={"leftover": [3]})
    uninterrupted = [run_step(t, cfg, *a) for t in range(16, 31)]

    cfg_b, *b = components(layout_b, metric)
    extra = load_experience(tmp_path / "ckpt", pool=b[0], sampler=b[1], selector=b[2], schedule=b[3])
    assert extra == {"leftover": [3]}
    resumed = [run_step(t, cfg_b, *b) for t in range(16, 31)]

    assert resumed == uninterrupted
    assert sum(len(r["draw"]) for r in resumed) > 20 and sum(r["added"] for r in history + resumed) > 0
    assert snapshot(a[0]) == snapshot(b[0])
    assert a[1].state_dict() == b[1].state_dict() and a[2].state_dict() == b[2].state_dict()
    assert a[3].state_dict() == b[3].state_dict()


def test_resume_without_rng_state_diverges(tmp_path):
    """Control for the test above: the sampler's saved RNG state is what makes the draws identical."""
    cfg, *a = components()
    for t in range(1, 16):
        run_step(t, cfg, *a)
    save_experience(tmp_path / "ckpt", pool=a[0], sampler=a[1], selector=a[2], schedule=a[3])
    uninterrupted = [run_step(t, cfg, *a) for t in range(16, 31)]
    cfg_b, *b = components(seed=12)
    load_experience(tmp_path / "ckpt", pool=b[0], selector=b[2], schedule=b[3])  # sampler state not loaded
    assert [run_step(t, cfg_b, *b)["draw"] for t in range(16, 31)] != [r["draw"] for r in uninterrupted]


def _filled(layout="arena"):
    cfg, pool, sampler, selector, schedule = components(layout)
    for t in range(1, 12):
        run_step(t, cfg, pool, sampler, selector, schedule)
    return pool, sampler, selector, schedule


def test_round_trip_contents_multi_batch(tmp_path):
    pool, sampler, selector, schedule = _filled()
    assert len(pool) > 20 and len(pool.retired) > 0
    out = save_experience(tmp_path / "p", pool=pool, sampler=sampler, batch_tokens=100)
    header = json.loads((out / "header.json").read_text())
    assert header["schema_version"] == 2 and len(header["files"]["tokens.arrow"]["batches"]) > 3
    assert sorted(os.listdir(out)) == ["entries.arrow", "header.json", "tokens.arrow"]  # no pickle anywhere
    fresh = ExperiencePool(K)
    assert load_experience(out, pool=fresh) == {}
    assert snapshot(fresh) == snapshot(pool)
    assert list(fresh.retired) == list(pool.retired) and fresh.counters == pool.counters
    assert fresh.buckets.state_dict() == pool.buckets.state_dict()
    for q in pool.question_ids():
        assert [(c.entry_id, c.step, c.reward) for c in fresh.entries(q)] == [
            (c.entry_id, c.step, c.reward) for c in pool.entries(q)
        ]


def test_empty_pool_and_int_question_ids(tmp_path):
    save_experience(tmp_path / "e", pool=ExperiencePool(K))
    p = ExperiencePool(K)
    load_experience(tmp_path / "e", pool=p)
    assert len(p) == 0 and p.total_tokens == 0
    pool = ExperiencePool(K)
    pool.collect(
        1,
        [
            Group(
                7,
                [GroupMember(np.array([1, 2]), np.array([-0.1, -0.2]), 1.0)]
                + [GroupMember(np.array([3]), np.array([-1.0]), 0.0)] * (K - 1),
            ),
            Group(8, [GroupMember(np.array([1]), np.array([-0.1]), 1.0)] * K),
        ],
    )
    save_experience(tmp_path / "i", pool=pool)
    q = ExperiencePool(K)
    load_experience(tmp_path / "i", pool=q)
    assert q.bucket_of(7) == 1 and q.bucket_of("7") is None and 8 in q.retired


def test_save_replaces_atomically_and_failure_keeps_previous(tmp_path, monkeypatch):
    pool, *_ = _filled()
    target = tmp_path / "ckpt"
    save_experience(target, pool=ExperiencePool(K))
    save_experience(target, pool=pool)  # over an existing checkpoint
    loaded = ExperiencePool(K)
    load_experience(target, pool=loaded)
    assert len(loaded) == len(pool)

    def boom(*args, **kwargs):
        raise OSError("disk full (simulated)")

    monkeypatch.setattr(TokenStorage, "gather", boom)
    bigger = ExperiencePool(K)
    bigger.add("x", [1, 2, 3], [0.0, 0.0, 0.0])
    with pytest.raises(OSError, match="simulated"):
        save_experience(target, pool=bigger)
    monkeypatch.undo()
    again = ExperiencePool(K)
    load_experience(target, pool=again)
    assert snapshot(again) == snapshot(pool)
    assert sorted(os.listdir(tmp_path)) == ["ckpt"]  # no temporary directory left behind


def test_extra_must_be_json(tmp_path):
    with pytest.raises(ValueError, match="not JSON-serialisable"):
        save_experience(tmp_path / "x", pool=ExperiencePool(K), extra={"a": object()})
    assert not (tmp_path / "x").exists()


@pytest.fixture
def saved(tmp_path):
    pool, sampler, selector, schedule = _filled()
    d = save_experience(tmp_path / "ckpt", pool=pool, sampler=sampler, selector=selector, schedule=schedule)
    assert experience_exists(d)
    return d


def _flip_byte(path, where):
    data = bytearray(path.read_bytes())
    pos = int(len(data) * where)
    data[pos] ^= 0xFF
    path.write_bytes(bytes(data))


def _zero_tokens_file_with_matching_crc(d):
    size = (d / "tokens.arrow").stat().st_size
    (d / "tokens.arrow").write_bytes(b"\0" * size)
    resign_header(d, lambda b: b["files"]["tokens.arrow"].update(crc32=zlib.crc32(b"\0" * size)))


@pytest.mark.parametrize(
    ("damage", "pattern"),
    [
        (
            lambda d: (d / "tokens.arrow").write_bytes((d / "tokens.arrow").read_bytes()[:-200]),
            r"tokens\.arrow: truncated",
        ),
        (lambda d: _flip_byte(d / "tokens.arrow", 0.5), r"tokens\.arrow: checksum mismatch"),
        (lambda d: _flip_byte(d / "entries.arrow", 0.5), r"entries\.arrow: checksum mismatch"),
        (lambda d: _flip_byte(d / "header.json", 0.5), r"header\.json: checksum mismatch"),
        (lambda d: (d / "entries.arrow").unlink(), r"entries\.arrow: missing"),
        (lambda d: (d / "header.json").write_text('{"format": '), r"header\.json: damaged header"),
        (lambda d: (d / "header.json").unlink(), r"header\.json: missing"),
        (lambda d: resign_header(d, lambda b: b.update(schema_version=99)), r"header\.json: schema_version 99"),
        (_zero_tokens_file_with_matching_crc, r"tokens\.arrow: not a readable Arrow IPC file"),
    ],
)
def test_damaged_checkpoint_raises_naming_the_file(saved, damage, pattern):
    damage(saved)
    pool = ExperiencePool(K)
    with pytest.raises(PoolCheckpointError, match=pattern):
        load_experience(saved, pool=pool)


def test_missing_directory_and_wrong_k(tmp_path, saved):
    with pytest.raises(PoolCheckpointError, match="no saved experience directory"):
        load_experience(tmp_path / "nope", pool=ExperiencePool(K))
    assert not experience_exists(tmp_path / "nope")
    with pytest.raises(PoolCheckpointError, match="saved pool has K=4 but this run has K=8"):
        load_experience(saved, pool=ExperiencePool(8))


def test_missing_component_state_is_an_error(tmp_path):
    d = save_experience(tmp_path / "c", pool=ExperiencePool(K))
    with pytest.raises(PoolCheckpointError, match="no saved sampler state"):
        load_experience(d, pool=ExperiencePool(K), sampler=BucketSampler(K))


def test_header_inconsistent_with_files(saved):
    resign_header(saved, lambda b: b["pool"].update(num_entries=b["pool"]["num_entries"] + 1))
    with pytest.raises(PoolCheckpointError, match=r"header\.json: inconsistent"):
        load_experience(saved, pool=ExperiencePool(K))


def test_save_time_hook_is_streaming(tmp_path, monkeypatch):
    """The tokens are written batch by batch: never the whole pool concatenated at once."""
    pool, *_ = _filled()
    seen = []
    real = TokenStorage.gather

    def spy(self, slots, out=None):
        ids, lps = real(self, slots, out=out)
        seen.append(ids.shape[0])
        return ids, lps

    monkeypatch.setattr(TokenStorage, "gather", spy)
    save_experience(tmp_path / "s", pool=pool, batch_tokens=64, fsync=False)
    assert len(seen) > 5 and max(seen) <= 64 + 25 and sum(seen) == pool.total_tokens
    # a pool without masked tokens is written in format 2 (what the code before loss masks reads); 3 adds them
    assert persistence_mod.UNMASKED_SCHEMA_VERSION == 2 and persistence_mod.SCHEMA_VERSION == 3
