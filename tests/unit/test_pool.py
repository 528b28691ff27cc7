"""Experience pool: collection rules of docs/algorithm.md §3, dedup, caps/eviction, storage layouts, stats."""

import numpy as np
import pytest
import torch

from exgrpo.config import ExGRPOConfig
from exgrpo.experience import BucketSampler, ExperiencePool, Group, GroupMember

K = 8
LAYOUTS = ["arena", "per_entry"]


def member(tokens, ok, replayed=False, lp=-0.25):
    ids = np.asarray(tokens, dtype=np.int64)
    return GroupMember(ids, np.full(ids.shape[0], lp, dtype=np.float32), 1.0 if ok else 0.0, replayed)


def group(qid, n_ok, k=K, salt=0, replayed_ok=None):
    """n_ok correct fresh members with distinct tokens; optionally a replayed member first."""
    members = []
    if replayed_ok is not None:
        members.append(member([100, 1, 2], replayed_ok, replayed=True))
    while len(members) < k:
        i = len(members)
        members.append(member([salt, i, i + 1, 2], i - (replayed_ok is not None) < n_ok))
    return Group(qid, members)


@pytest.fixture(params=LAYOUTS)
def layout(request):
    return request.param


def test_partial_group_is_stored_with_bucket(layout):
    pool = ExperiencePool(K, storage=layout)
    stats = pool.collect(1, [group("q", 3)])
    assert stats.added_entries == 3 and stats.bucket_updates == 1
    assert pool.bucket_of("q") == 3 and len(pool) == 3 and pool.total_tokens == 12
    entries = pool.entries("q")
    assert [e.token_ids.tolist() for e in entries] == [[0, 0, 1, 2], [0, 1, 2, 2], [0, 2, 3, 2]]
    assert all(e.token_ids.dtype == np.int32 and e.behaviour_log_probs.dtype == np.float32 for e in entries)
    assert all(e.step == 1 and e.reward == 1.0 for e in entries)
    assert [e.entry_id for e in entries] == pool.entry_ids("q") == [0, 1, 2]
    # a later result moves the bucket to the latest k and adds the new correct trajectories
    pool.collect(2, [group("q", 5, salt=1)])
    assert pool.bucket_of("q") == 5 and len(pool) == 8


def test_dedup_by_token_ids_within_group_and_across_steps(layout):
    pool = ExperiencePool(K, storage=layout)
    same = [member([5, 6, 7], True), member([5, 6, 7], True)] + [member([1], False)] * 6
    stats = pool.collect(1, [Group("q", same)])
    assert stats.added_entries == 1 and stats.duplicates == 1
    again = [member([5, 6, 7], True), member([5, 6, 8], True)] + [member([1], False)] * 6
    stats = pool.collect(2, [Group("q", again)])
    assert stats.added_entries == 1 and stats.duplicates == 1 and len(pool) == 2
    # same tokens for another question are a different trajectory
    assert pool.collect(3, [Group("r", same[:1] + [member([1], False)] * 7)]).added_entries == 1


def test_retirement_removes_everything_and_is_permanent(layout):
    pool = ExperiencePool(K, storage=layout)
    pool.collect(1, [group("q", 2), group("r", 4)])
    stats = pool.collect(2, [group("q", 8, salt=3)])
    assert stats.retired == 1 and "q" in pool.retired and pool.is_retired("q")
    assert pool.bucket_of("q") is None and pool.num_entries("q") == 0 and len(pool) == 4
    stats = pool.collect(3, [group("q", 3, salt=4)])  # e.g. still drawn as fresh (retire_fresh_prompts off)
    assert stats.ignored_retired == 1 and pool.num_entries("q") == 0 and pool.bucket_of("q") is None
    with pytest.raises(ValueError, match="retired"):
        pool.add("q", [1, 2], [0.0, 0.0])
    # a question never stored is retired too (so the trainer stops drawing it as fresh)
    pool.collect(4, [group("new", 8)])
    assert "new" in pool.retired and len(pool.retired) == 2


def test_replayed_member_counts_in_k_by_default():
    pool = ExperiencePool(K)
    pool.collect(1, [group("q", 2)])
    # replayed member correct + 7 fresh correct = 8/8 -> retired
    assert pool.collect(2, [group("q", 7, salt=1, replayed_ok=True)]).retired == 1
    pool.collect(3, [group("r", 2)])
    # replayed correct + 6 fresh correct = 7 -> bucket 7; the replayed member is not re-inserted
    stats = pool.collect(4, [group("r", 6, salt=1, replayed_ok=True)])
    assert pool.bucket_of("r") == 7 and stats.added_entries == 6
    assert all(e.token_ids.tolist()[0] != 100 for e in pool.entries("r"))


def test_count_fresh_members_only():
    pool = ExperiencePool(K, count_replayed_in_k=False)
    pool.collect(1, [group("q", 2), group("r", 2)])
    stats = pool.collect(2, [group("q", 6, salt=1, replayed_ok=True)])
    assert pool.bucket_of("q") == 6 and stats.mode_stats["success_counts"] == [6]
    # all K-1 fresh members correct: every counted member succeeded -> retired
    assert pool.collect(3, [group("r", 7, salt=1, replayed_ok=True)]).retired == 1
    # replayed correct but no fresh success: k = 0
    pool.collect(4, [group("s", 3)])
    assert pool.collect(5, [group("s", 0, salt=1, replayed_ok=True)]).zero_success == 1
    assert pool.bucket_of("s") == 0


def test_zero_success_moves_to_bucket0_keeping_trajectories():
    pool = ExperiencePool(K)  # zero_success='bucket0' (OUR CHOICE)
    pool.collect(1, [group("q", 3)])
    stats = pool.collect(2, [group("q", 0, salt=1)])
    assert stats.moved_to_bucket0 == 1 and pool.bucket_of("q") == 0 and pool.num_entries("q") == 3
    assert len(BucketSampler(K).draw(pool, 10)) == 0  # bucket 0 is never sampled
    pool.collect(3, [group("q", 4, salt=2)])
    assert pool.bucket_of("q") == 4 and pool.num_entries("q") == 7
    # 0/K for a question never stored: nothing
    pool.collect(4, [group("never", 0)])
    assert pool.bucket_of("never") is None and pool.num_entries("never") == 0


def test_zero_success_keep_leaves_bucket():
    pool = ExperiencePool(K, zero_success="keep")
    pool.collect(1, [group("q", 3)])
    stats = pool.collect(2, [group("q", 0, salt=1)])
    assert stats.zero_success == 1 and stats.moved_to_bucket0 == 0 and pool.bucket_of("q") == 3


def test_collection_bounds():
    pool = ExperiencePool(K, lbound=2, rbound=5)
    stats = pool.collect(1, [group("a", 1), group("b", 2), group("c", 3), group("d", 5), group("e", 6)])
    assert stats.out_of_range == 3 and stats.bucket_updates == 2
    assert {q: pool.bucket_of(q) for q in "abcde"} == {"a": None, "b": None, "c": 3, "d": 5, "e": None}
    pool.collect(2, [group("c", 6, salt=1)])  # out of range later: bucket and entries unchanged
    assert pool.bucket_of("c") == 3 and pool.num_entries("c") == 3


def test_collect_from_mixed_stores_nothing_before_the_switch_but_retires():
    # Released behaviour: K/K questions are retired from step 1; storing trajectories waits for mixed mode.
    pool = ExperiencePool(K, collect_from="mixed")
    stats = pool.collect(1, [group("q", 3), group("r", 8), group("s", 0)], mixed=False)
    assert stats.skipped and stats.retired == 1 and stats.mode_stats["success_counts"] == [3, 8, 0]
    assert list(pool.retired) == ["r"] and len(pool) == 0 and pool.total_tokens == 0
    assert pool.bucket_of("q") is None and pool.bucket_of("s") is None
    assert stats.added_entries == 0 and stats.bucket_updates == 0 and stats.zero_success == 0
    # a retired question seen again before the switch is ignored, as after it
    stats = pool.collect(2, [group("r", 3, salt=1), group("u", 8, salt=1)], mixed=False)
    assert stats.ignored_retired == 1 and stats.retired == 1 and set(pool.retired) == {"r", "u"}
    # after the switch: collection as usual (3 correct members of q stored in bucket 3; t retired)
    stats = pool.collect(3, [group("q", 3), group("r", 8, salt=2), group("t", 8)], mixed=True)
    assert not stats.skipped and stats.added_entries == 3 and stats.retired == 1 and stats.ignored_retired == 1
    assert pool.bucket_of("q") == 3 and len(pool) == 3 and set(pool.retired) == {"r", "u", "t"}


def test_collect_from_start_is_the_default():
    stats = ExperiencePool(K).collect(1, [group("q", 3), group("r", 8)], mixed=False)
    assert stats.added_entries == 3 and stats.retired == 1 and not stats.skipped


def test_max_entries_per_question_evicts_oldest(layout):
    pool = ExperiencePool(K, max_entries_per_question=2, storage=layout)
    stats = pool.collect(1, [group("q", 3)])
    assert stats.evicted_entries == 1 and pool.entry_ids("q") == [1, 2]
    pool.collect(2, [group("q", 1, salt=9)])
    assert pool.entry_ids("q") == [2, 3] and pool.counters["evicted"] == 2


def test_max_total_tokens_evicts_globally_oldest(layout):
    pool = ExperiencePool(K, max_total_tokens=20, storage=layout)
    pool.collect(1, [group("a", 2)])  # 8 tokens, entry ids 0, 1
    pool.collect(2, [group("b", 3)])  # 12 tokens, ids 2-4 -> 20, at the cap
    assert len(pool) == 5
    stats = pool.collect(3, [group("c", 2)])  # 8 more: evict a's two entries (oldest)
    assert stats.evicted_entries == 2 and stats.evicted_tokens == 8 and pool.total_tokens == 20
    assert pool.num_entries("a") == 0 and pool.bucket_of("a") is None  # nothing left: leaves its bucket
    assert pool.entry_ids("b") == [2, 3, 4] and pool.entry_ids("c") == [5, 6]


def test_group_and_member_validation():
    pool = ExperiencePool(K)
    with pytest.raises(ValueError, match=r"question 'q' has 3 members; expected K=8"):
        pool.collect(1, [Group("q", [member([1], True)] * 3)])
    bad = [GroupMember(np.array([1, 2]), np.array([0.0]), 1.0)] + [member([1], False)] * 7
    with pytest.raises(ValueError, match="one value per response token"):
        pool.collect(1, [Group("q", bad)])
    empty = [GroupMember(np.array([], dtype=np.int64), np.array([]), 1.0)] + [member([1], False)] * 7
    with pytest.raises(ValueError, match="non-empty 1-D integer"):
        pool.collect(1, [Group("q", empty)])
    floats = [GroupMember(np.array([1.0, 2.0]), np.array([0.0, 0.0]), 1.0)] + [member([1], False)] * 7
    with pytest.raises(ValueError, match="integer"):
        pool.collect(1, [Group("q", floats)])
    with pytest.raises(TypeError, match="str or int"):
        pool.add(("tuple",), [1], [0.0])


def test_torch_inputs_and_int_question_ids():
    pool = ExperiencePool(K)
    ids = torch.tensor([11, 12, 13], dtype=torch.int64)
    lps = torch.tensor([-0.1, -0.2, -0.3], dtype=torch.float32)
    members = [GroupMember(ids, lps, 1.0)] + [member([1], False)] * 7
    pool.collect(1, [Group(17, members)])
    (e,) = pool.entries(17)
    assert e.question_id == 17 and e.token_ids.tolist() == [11, 12, 13]
    np.testing.assert_allclose(e.behaviour_log_probs, [-0.1, -0.2, -0.3])
    assert pool.entries("17") == []


def test_candidates_copy_view_cap_and_errors(layout):
    pool = ExperiencePool(K, storage=layout)
    pool.collect(1, [group("q", 4), group("r", 2)])
    (cq, cr) = pool.candidates(["q", "r"])
    assert [c.entry_id for c in cq] == [0, 1, 2, 3] and [c.entry_id for c in cr] == [4, 5]
    (capped,) = pool.candidates(["q"], max_per_question=2)
    assert [c.entry_id for c in capped] == [2, 3]  # the newest ones
    copy = cq[0].token_ids
    copy[0] = 999  # a copy: the pool is unaffected
    assert pool.get("q", 0).token_ids[0] == 0
    (views,) = pool.candidates(["q"], copy=False)
    assert not views[0].token_ids.flags.writeable
    with pytest.raises(ValueError):
        views[0].token_ids[0] = 1
    with pytest.raises(KeyError, match="'zz' has no stored trajectories"):
        pool.candidates(["zz"])
    with pytest.raises(KeyError):
        pool.get("q", 99)
    pool.remove_entry("r", 4)
    pool.remove_entry("r", 5)
    assert pool.bucket_of("r") is None and pool.num_questions == 1


def test_stats_and_memory():
    pool = ExperiencePool(K, chunk_tokens=1 << 16)
    rng = np.random.default_rng(0)
    groups = []
    for q in range(60):
        ms = [member(rng.integers(0, 150_000, 500), i < 1 + q % 7) for i in range(K)]
        groups.append(Group(f"q{q}", ms))
    pool.collect(1, groups)
    st = pool.stats()
    assert st["pool/entries"] == len(pool) == sum(1 + q % 7 for q in range(60))
    assert st["pool/tokens"] == 500 * len(pool) and st["pool/questions"] == 60
    assert [st[f"pool/bucket_{b}"] for b in range(1, 8)] == [9, 9, 9, 9, 8, 8, 8]
    assert st["pool/retired"] == 0 and st["pool/sampleable_questions"] == 60
    assert all(isinstance(v, float) for v in st.values())
    # int32 ids + float32 log-probs: 8 bytes per token, plus a small overhead (chunk tail, metadata)
    assert 8.0 <= pool.memory_bytes() / pool.total_tokens < 9.5
    empty = ExperiencePool(K).stats()
    assert empty["pool/mean_entries_per_question"] == 0.0 and empty["pool/bytes_per_token"] == 0.0


def test_arena_compaction_keeps_data_intact_and_memory_tight():
    """Random churn against a reference dict, with tiny chunks so that compaction and release run often."""
    rng = np.random.default_rng(1)
    pool = ExperiencePool(K, chunk_tokens=256)
    ref: dict[tuple[str, int], np.ndarray] = {}
    for step in range(300):
        q = f"q{rng.integers(0, 40)}"
        n = int(rng.integers(1, 60))
        ids = rng.integers(0, 1000, n)
        eid = pool.add(q, ids, -ids.astype(np.float32) / 1000, step=step)
        if eid is not None:
            ref[(q, eid)] = ids
            pool.buckets.set(q, 3)
        if rng.random() < 0.4 and ref:
            keys = list(ref)
            q2, e2 = keys[int(rng.integers(0, len(keys)))]
            pool.remove_entry(q2, e2)
            del ref[(q2, e2)]
    assert len(pool) == len(ref) and pool.total_tokens == sum(len(v) for v in ref.values())
    for (q, eid), ids in ref.items():
        c = pool.get(q, eid)
        np.testing.assert_array_equal(c.token_ids, ids)
        np.testing.assert_allclose(c.behaviour_log_probs, -ids / 1000, rtol=1e-6)
    usage = pool.token_storage.chunk_usage()  # per chunk index: (capacity, used, live); a released one (0, 0, 0)
    held = sum(capacity for capacity, _, _ in usage)
    # every chunk's holes stay below 1/32 of it; what remains is free tail space in partly filled chunks
    for capacity, used, live in usage:
        if capacity:
            assert used - live <= capacity // 32
    assert held < pool.total_tokens + 256 * (1 + len(usage))


def test_layouts_behave_identically():
    rng = np.random.default_rng(2)
    pools = [ExperiencePool(K, storage=s, chunk_tokens=128, max_total_tokens=3000) for s in LAYOUTS]
    for step in range(40):
        groups = []
        for q in rng.choice(30, size=6, replace=False):
            ks = int(rng.integers(0, K + 1))
            ms = [member(rng.integers(0, 50, int(rng.integers(1, 40))), i < ks) for i in range(K)]
            groups.append(Group(f"q{q}", ms))
        stats = [p.collect(step, groups) for p in pools]
        assert stats[0] == stats[1]
    a, b = pools
    assert a.stats()["pool/tokens"] == b.stats()["pool/tokens"] and a.buckets.state_dict() == b.buckets.state_dict()
    for q in a.question_ids():
        assert [c.token_ids.tolist() for c in a.entries(q)] == [c.token_ids.tolist() for c in b.entries(q)]


def test_from_config():
    cfg = ExGRPOConfig.from_dict({"bucket_lbound": 1, "zero_success": "keep", "pool_storage": "per_entry"}, k=4)
    pool = ExperiencePool.from_config(cfg)
    settings = (pool.k, pool.writer.lbound, pool.writer.rbound, pool.writer.zero_success, pool.storage)
    assert settings == (4, 1, 3, "keep", "per_entry")
