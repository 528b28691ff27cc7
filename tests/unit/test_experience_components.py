"""The experience pool's components, each on its own: entry table, token storages, bucket index, collection rules,
RNG state helpers and the registries; each one's ``state_dict`` / ``load_state_dict`` (and file dump / load)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from exgrpo.experience import (
    ArenaStorage,
    BucketIndex,
    BucketSampler,
    CollectionRules,
    EntryTable,
    ExperiencePool,
    Group,
    GroupMember,
    PerEntryStorage,
    PoolCheckpointError,
    TrajectorySelector,
)
from exgrpo.experience.entries import EntryBatch
from exgrpo.experience.rng import rng_state, set_rng_state
from exgrpo.experience.storage import batch_ranges
from exgrpo.experience.trajectory_metrics import TRAJECTORY_METRICS, register_trajectory_metric
from exgrpo.experience.weightings import BUCKET_WEIGHTINGS, is_per_question
from exgrpo.registry import Registry
from tests.helpers.experience import binary_group

K = 4
STORAGES = [lambda: ArenaStorage(chunk_tokens=64), PerEntryStorage]


def tokens(rng, n):
    return rng.integers(0, 1000, n).astype(np.int32), -rng.random(n).astype(np.float32)


def put_all(storage, data):
    """Store ``data`` ({slot: (ids, lps)}) in one put_many call."""
    arrays = list(data.values())
    lengths = np.array([ids.shape[0] for ids, _ in arrays])
    storage.put_many(list(data), [a[0] for a in arrays], [a[1] for a in arrays], lengths)


def batch_of(rows):
    """An EntryBatch of (question index, entry id, length, seed) rows."""
    b = EntryBatch()
    for qi, eid, n, seed in rows:
        ids, lps = tokens(np.random.default_rng(seed), n)
        b.append(qi, eid, ids, lps, 1.0, 3)
    return b


# ------------------------------------------------------------------------------------------ entry table
def test_entry_table_allocates_reuses_slots_and_round_trips():
    t = EntryTable()
    qa, qb = t.question_index("a"), t.question_index(7)
    first = t.reserve_entry_ids(3)
    slots = t.allocate(batch_of([(qa, first, 5, 0), (qb, first + 1, 3, 1), (qa, first + 2, 4, 2)]))
    assert slots.tolist() == [0, 1, 2] and t.slots_of("a") == [0, 2] and t.slots_of(7) == [1]
    assert (t.num_entries, t.total_tokens, t.next_entry_id) == (3, 12, 3)
    t.drop(qa, 0)
    assert t.release(0) == 5 and t.num_entries == 2 and t.total_tokens == 7
    (reused,) = t.allocate(batch_of([(qb, t.reserve_entry_ids(1), 6, 3)]))
    assert reused == 0 and t.slots_of(7) == [1, 0]  # the freed slot is reused; the list keeps insertion order
    state = t.state_dict()
    assert state["questions"] == ["a", 7] and state["columns"]["entry_id"].tolist() == [1, 2, 3]
    assert state["columns"]["question"].tolist() == [1, 0, 1] and state["next_entry_id"] == 4
    json.dumps({k: v for k, v in state.items() if k != "columns"})  # the header part is JSON
    u = EntryTable()
    u.load_state_dict(state)
    again = u.state_dict()
    assert {k: v for k, v in again.items() if k != "columns"} == {k: v for k, v in state.items() if k != "columns"}
    assert all(np.array_equal(again["columns"][c], state["columns"][c]) for c in state["columns"])
    assert u.slots_of(7) == [0, 2] and u.slots_of("a") == [1]  # entry-id order: slots 0..n-1


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda s: s["columns"]["entry_id"].__setitem__(1, 0), "not strictly increasing"),
        (lambda s: s["columns"]["length"].__setitem__(0, 0), "non-positive length"),
        (lambda s: s["columns"]["question"].__setitem__(0, 9), "outside the question table"),
        (lambda s: s["questions"].append(s["questions"][0]), "appears twice"),
        (lambda s: s.update(next_entry_id=1), "next entry id"),
        (lambda s: s.update(total_tokens=1), "claims"),
    ],
)
def test_entry_table_rejects_a_state_that_does_not_hold_together(edit, message):
    t = EntryTable()
    qa, qb = t.question_index("a"), t.question_index("b")
    t.allocate(batch_of([(qa, t.reserve_entry_ids(1), 5, 0), (qb, t.reserve_entry_ids(1), 3, 1)]))
    state = t.state_dict()
    edit(state)
    with pytest.raises(ValueError, match=message):
        EntryTable().load_state_dict(state)


def test_entry_table_oldest_matches_a_sort_of_the_live_entries():
    rng = np.random.default_rng(4)
    t = EntryTable()
    live: dict[int, int] = {}  # slot -> entry id
    for round_ in range(60):
        rows = [
            (t.question_index(f"q{rng.integers(0, 9)}"), t.reserve_entry_ids(1), int(rng.integers(1, 50)), i)
            for i in range(int(rng.integers(1, 30)))
        ]
        for s, (_, eid, _, _) in zip(t.allocate(batch_of(rows)).tolist(), rows, strict=True):
            live[s] = eid
        if round_ == 20:
            t.oldest(1)  # from here on the insertion log is kept up
        for s in rng.choice(sorted(live), size=len(live) // 3, replace=False).tolist():
            t.drop(int(t.columns["question"][s]), s)
            t.release(s)
            del live[s]
        want = int(rng.integers(1, max(2, t.total_tokens)))
        order = sorted(live, key=live.get)
        cum = np.cumsum([int(t.columns["length"][s]) for s in order])
        expected = order[: int(np.searchsorted(cum, want, side="left")) + 1]
        assert t.oldest(want) == expected


# ------------------------------------------------------------------------------------------ token storage
@pytest.mark.parametrize("make", STORAGES)
def test_token_storage_put_view_free_gather_and_state(make):
    rng = np.random.default_rng(0)
    st = make()
    st.resize(8)
    data = {s: tokens(rng, int(rng.integers(1, 40))) for s in range(8)}
    put_all(st, data)
    for s in (1, 4, 6):
        st.free(s)
        del data[s]
    for s, (ids, lps) in data.items():
        v_ids, v_lps = st.view(s)
        assert np.array_equal(v_ids, ids) and np.array_equal(v_lps, lps)
    assert st.live_slots().tolist() == sorted(data)
    order = np.array([7, 0, 3])
    ids, lps = st.gather(order)
    assert np.array_equal(ids, np.concatenate([data[s][0] for s in order.tolist()]))
    assert np.array_equal(lps, np.concatenate([data[s][1] for s in order.tolist()]))
    state = st.state_dict()
    for other in (ArenaStorage(chunk_tokens=16), PerEntryStorage()):  # either layout loads either state
        other.load_state_dict(state)
        assert other.live_slots().tolist() == sorted(data)
        for s, (ids, lps) in data.items():
            assert np.array_equal(other.view(s)[0], ids) and np.array_equal(other.view(s)[1], lps)


@pytest.mark.parametrize("make", STORAGES)
def test_token_storage_dump_and_load_its_file(tmp_path, make):
    rng = np.random.default_rng(1)
    st = make()
    st.resize(30)
    data = [tokens(rng, int(rng.integers(1, 25))) for _ in range(30)]
    put_all(st, dict(enumerate(data)))
    order = np.arange(30)[::-1].copy()
    record = st.dump(tmp_path / "tokens.arrow", order, batch_tokens=60)
    assert len(record["batches"]) > 3 and all(b["tokens"] <= 60 for b in record["batches"])
    assert sum(b["tokens"] for b in record["batches"]) == sum(d[0].shape[0] for d in data)
    lengths = np.array([data[s][0].shape[0] for s in order.tolist()])
    back = ArenaStorage(chunk_tokens=64)
    back.resize(30)
    back.load(tmp_path / "tokens.arrow", record, np.arange(30), lengths)  # file row i -> slot i
    for i, s in enumerate(order.tolist()):
        assert np.array_equal(back.view(i)[0], data[s][0]) and np.array_equal(back.view(i)[1], data[s][1])
    with pytest.raises(ValueError, match="entry lengths say"):
        ArenaStorage().load(tmp_path / "tokens.arrow", record, np.arange(30), lengths + 1)
    raw = bytearray((tmp_path / "tokens.arrow").read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    (tmp_path / "tokens.arrow").write_bytes(bytes(raw))
    with pytest.raises(PoolCheckpointError, match=r"tokens\.arrow: checksum mismatch"):
        ArenaStorage().load(tmp_path / "tokens.arrow", record, np.arange(30), lengths)


def test_batch_ranges_never_split_an_entry():
    assert batch_ranges(np.array([3, 3, 3, 10, 1]), 6) == [(0, 2), (2, 3), (3, 4), (4, 5)]
    assert batch_ranges(np.array([], dtype=np.int64), 6) == []


def test_arena_places_a_run_of_entries_like_one_by_one_and_never_across_chunks():
    rng = np.random.default_rng(2)
    lengths = rng.integers(1, 30, 200)
    data = [tokens(rng, int(n)) for n in lengths]
    together, one_by_one = ArenaStorage(chunk_tokens=100), ArenaStorage(chunk_tokens=100)
    for st in (together, one_by_one):
        st.resize(200)
    put_all(together, dict(enumerate(data)))
    for s, (ids, lps) in enumerate(data):
        one_by_one.put(s, ids, lps)
    assert together.chunk_usage() == one_by_one.chunk_usage()
    for s, (ids, lps) in enumerate(data):
        assert np.array_equal(together.view(s)[0], ids) and np.array_equal(together.view(s)[1], lps)
        # a view lies inside one chunk: it shares memory with exactly one chunk array
        assert sum(np.shares_memory(together.view(s)[0], c) for c in together._ids if c is not None) == 1


def test_arena_compaction_moves_runs_and_keeps_every_entry():
    rng = np.random.default_rng(3)
    st = ArenaStorage(chunk_tokens=512)
    st.resize(300)
    data = {s: tokens(rng, int(rng.integers(1, 12))) for s in range(300)}
    put_all(st, data)
    for s in rng.choice(300, size=200, replace=False).tolist():  # holes everywhere: compactions run
        st.free(s)
        del data[s]
    for capacity, used, live in st.chunk_usage():
        if capacity:
            assert used - live <= capacity // 32
    for s, (ids, lps) in data.items():
        assert np.array_equal(st.view(s)[0], ids) and np.array_equal(st.view(s)[1], lps)


def test_arena_staging_is_used_in_place_and_never_changes_what_is_stored():
    """stage() writes log-probs where put_many would put them (the first entries only, when the open chunk's tail
    holds no more); put_many then skips their copy, and whatever else happens in between (other entries, entries
    freed, compaction, a chunk released) it stores what it is given."""
    rng = np.random.default_rng(4)

    def run(stage: bool, events: str) -> ArenaStorage:
        st = ArenaStorage(chunk_tokens=256)
        st.resize(100)
        data = {s: tokens(np.random.default_rng(s), 5 + s % 7) for s in range(40)}
        put_all(st, {s: data[s] for s in range(10)})
        batch = [data[s] for s in range(10, 40 if "long" in events else 20)]  # long: more than the tail holds
        if stage:
            view = st.stage([lps for _, lps in batch])
            fit = len(batch) if "long" not in events else 22  # 74 tokens stored, 182 left: entries 10..31
            assert view is not None and np.array_equal(view, np.concatenate([lps for _, lps in batch[:fit]]))
            assert st.chunk_usage() == [
                (256, sum(len(data[s][0]) for s in range(10)), sum(len(data[s][0]) for s in range(10)))
            ]
        if "other" in events:  # another entry first: the staged place is written over
            put_all(st, {30: data[30]})
        if "free" in events:  # holes: a compaction moves the tail down
            for s in range(0, 10, 2):
                st.free(s)
        if "release" in events:  # the open chunk released
            for s in range(10):
                if st._chunk[s] >= 0:
                    st.free(s)
            if "other" in events:
                st.free(30)
        put_all(st, {10 + i: a for i, a in enumerate(batch[:4])})  # two stores, as a call with a repeated question
        put_all(st, {14 + i: a for i, a in enumerate(batch[4:])})
        return st

    for events in ("", "long", "other", "free", "release", "free other", "release other", "long free"):
        staged, plain = run(True, events), run(False, events)
        assert staged.chunk_usage() == plain.chunk_usage()
        for s in np.flatnonzero(plain._chunk >= 0).tolist():
            assert np.array_equal(staged.view(s)[0], plain.view(s)[0]) and np.array_equal(
                staged.view(s)[1], plain.view(s)[1]
            )
        if events == "":
            assert staged._staged is not None and staged._staged_next == 10  # every entry found in place
        elif events == "long":  # the staged ones found in place, then the rest copied to a new chunk
            assert len(staged.chunk_usage()) == 2 and staged._staged is None
        else:
            assert staged._staged is None  # the staging was given up
    st = ArenaStorage(chunk_tokens=8)
    st.resize(1)
    assert st.stage([np.zeros(3, np.float32)]) is None  # no open chunk yet
    put_all(st, {0: tokens(rng, 6)})
    assert st.stage([np.zeros(3, np.float32)]) is None  # no room left in it
    assert PerEntryStorage().stage([np.zeros(3, np.float32)]) is None


# ------------------------------------------------------------------------------------------ bucket index
def test_bucket_index_state_keeps_the_draw_order():
    b = BucketIndex(K)
    for q, k in [("a", 1), ("b", 1), ("c", 1), ("d", 2), ("e", 3)]:
        b.set(q, k)
    b.remove("a")  # swap-remove: "c" takes "a"'s place
    b.set("d", 1)
    state = b.state_dict()
    assert state == {"members": [[], ["c", "b", "d"], [], ["e"]]}
    c = BucketIndex(K)
    c.load_state_dict(json.loads(json.dumps(state)))
    assert c.state_dict() == state and c.position("d") == 2 and c.bucket_of("e") == 3
    with pytest.raises(ValueError, match="K=2"):
        BucketIndex(K).load_state_dict({"members": [[], []]})
    with pytest.raises(ValueError, match="two buckets"):
        BucketIndex(K).load_state_dict({"members": [["x"], ["x"], [], []]})


# ------------------------------------------------------------------------------------------ collection rules
def _writer(**kwargs):
    table, storage, buckets = EntryTable(), PerEntryStorage(), BucketIndex(K)
    return CollectionRules(table, storage, buckets, **kwargs), table, buckets


def test_collection_rules_on_their_own_components_and_state_round_trip():
    w, table, buckets = _writer(max_entries_per_question=2)
    stats = w.collect(5, [binary_group("a", 3, K), binary_group("b", 4, K), binary_group("c", 1, K)])
    assert (stats.added_entries, stats.retired, stats.evicted_entries) == (4, 1, 1)
    assert table.slots_of("a") and buckets.bucket_of("a") == 3 and buckets.bucket_of("c") == 1
    assert list(w.retired) == ["b"] and w.counters["collected"] == 4 and w.counters["evicted"] == 1
    state = w.state_dict()
    assert state == json.loads(json.dumps(state)) and state["last_step"] == 5
    v, _, _ = _writer()
    v.load_state_dict(state)
    assert v.state_dict() == state
    with pytest.raises(ValueError, match="unknown collection counters"):
        v.load_state_dict({**state, "counters": {"added": 1}})


def test_a_question_twice_in_one_call_is_collected_as_in_two_calls():
    one = ExperiencePool(K)
    # the last one retires it
    one.collect(1, [binary_group("a", 2, K), binary_group("a", 3, K, salt=1), binary_group("a", 4, K)])
    two = ExperiencePool(K)
    for g in (binary_group("a", 2, K), binary_group("a", 3, K, salt=1), binary_group("a", 4, K)):
        two.collect(1, [g])
    assert list(one.retired) == list(two.retired) == ["a"] and len(one) == len(two) == 0
    one.collect(2, [binary_group("b", 2, K), binary_group("b", 3, K, salt=1)])
    two.collect(2, [binary_group("b", 2, K)])
    two.collect(2, [binary_group("b", 3, K, salt=1)])
    assert one.entry_ids("b") == two.entry_ids("b") and one.bucket_of("b") == two.bucket_of("b") == 3


def test_a_malformed_group_stores_what_came_before_and_nothing_of_itself():
    pool = ExperiencePool(K)
    bad = Group("bad", [GroupMember([1, 2], [0.0], 1.0)] + [GroupMember([3], [0.0], 0.0)] * (K - 1))
    with pytest.raises(ValueError, match="one value per response token"):
        pool.collect(1, [binary_group("ok", 2, K), bad])
    assert pool.num_entries("ok") == 2 and pool.bucket_of("ok") == 2
    assert pool.num_entries("bad") == 0 and pool.bucket_of("bad") is None


def test_pool_dump_and_load_without_the_persistence_layer(tmp_path):
    pool = ExperiencePool(K, chunk_tokens=16)
    pool.collect(1, [binary_group("a", 2, K), binary_group(3, 1, K), binary_group("r", 4, K)])
    meta, records = pool.dump(tmp_path, batch_tokens=4)
    assert sorted(records) == ["entries.arrow", "tokens.arrow"] and meta == json.loads(json.dumps(meta))
    back = ExperiencePool(K, storage="per_entry")
    back.load(tmp_path, meta, records)
    a, b = pool.state_dict(), back.state_dict()
    assert {**a["meta"], "settings": None} == {**b["meta"], "settings": None}
    assert np.array_equal(a["token_ids"], b["token_ids"]) and list(back.retired) == ["r"]
    memory = ExperiencePool(K)
    memory.load_state_dict(a)
    assert memory.state_dict()["meta"] == a["meta"]


# ------------------------------------------------------------------------------------------ RNG and registries
def test_rng_state_helpers_round_trip_and_check_the_generator():
    rng = np.random.default_rng(9)
    rng.random(5)
    state = json.loads(json.dumps(rng_state(rng)))
    expected = rng.random(3)
    other = np.random.default_rng(0)
    set_rng_state(other, state)
    assert np.array_equal(other.random(3), expected)
    with pytest.raises(ValueError, match="expected 'PCG64'"):
        set_rng_state(np.random.default_rng(0), {**state, "bit_generator": "MT19937"})
    for comp in (BucketSampler(K, seed=3), TrajectorySelector("random", seed=3)):
        copy = type(comp)(K) if isinstance(comp, BucketSampler) else TrajectorySelector("random")
        copy.load_state_dict(json.loads(json.dumps(comp.state_dict())))
        assert copy.rng.random() == comp.rng.random()


def test_registries_are_the_one_helper_with_tags():
    assert isinstance(BUCKET_WEIGHTINGS, Registry) and isinstance(TRAJECTORY_METRICS, Registry)
    assert is_per_question("uniform") and not is_per_question("normal")
    assert BUCKET_WEIGHTINGS.names_with("per_question") == ["uniform"]
    assert sorted(TRAJECTORY_METRICS.names_with("needs_scores")) == ["entropy", "nll"]
    assert TrajectorySelector("entropy").needs_scores and not TrajectorySelector("random").needs_scores

    @register_trajectory_metric("test_scored", needs_scores=True)
    def scored(groups, ctx):
        return [np.asarray(ctx.score_provider([c for c in g], "nll")) for g in groups]

    try:
        assert TrajectorySelector("test_scored").needs_scores  # a custom model-scored metric is run by the trainer
    finally:
        TRAJECTORY_METRICS.unregister("test_scored")
