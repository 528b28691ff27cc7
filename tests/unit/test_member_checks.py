"""A collect call's member checks against their per-member definitions as they were before they were made cheaper.

``masks.log_prob_defect`` decides a valid trajectory with two reductions (the maximum and the minimum),
``masks.prepare`` counts a mask's ones once, and a collect call checks the log-probs and masks of all the members it
stores at once (``masks.prepare_many`` / ``records.member_arrays_many``: a constant number of numpy calls) in a
pass between planning its groups and applying the plans. The definitions they replace are copied below as they were
(``as_mask``, ``trajectory_defect``, ``encode``, and the one-pass ``CollectionRules.collect``). On random inputs,
with every kind of defect (NaN, +-inf, log-probs above the bound and at it, masks of no model token, masks that end
on a tool token, all-ones masks), malformed members and groups, duplicates, repeated and retired questions and the
caps, the results must be the same bit for bit: stored log-probs, masked counts, defects and their reasons, errors,
and the pool and the call's metrics after each call.
"""

from __future__ import annotations

import hashlib

import numpy as np
import pytest

from exgrpo.experience import ExperiencePool, Group, GroupMember, masks
from exgrpo.experience.collection import CollectionRules
from exgrpo.experience.entries import EntryBatch
from exgrpo.experience.records import CollectStats, member_arrays, member_arrays_many
from exgrpo.modes.binary import BinaryMode

K = 4


# ------------------------------------------------------------------ the per-member definitions, as they were
def ref_as_mask(qid, loss_mask, n):
    if loss_mask is None:
        return None
    m = np.asarray(loss_mask)
    if m.shape != (n,):
        raise ValueError(f"question {qid!r}: the loss mask has shape {m.shape}, the response {n} tokens")
    if m.dtype != np.bool_:
        if m.dtype.kind not in "iuf" or not np.isin(m, (0, 1)).all():
            raise ValueError(f"question {qid!r}: the loss mask must hold 0 and 1 only (1 = a token the model made)")
        m = m.astype(np.bool_)
    return None if bool(m.all()) else m


def ref_trajectory_defect(log_probs, mask):
    if mask is not None:
        if not mask.any():
            return masks.INCONSISTENT, "no token of the trajectory is the model's"
        if not mask[-1]:
            return masks.TRUNCATED, "it ends on a token that is not the model's (cut in a tool response)"
    model = log_probs if mask is None else log_probs[mask]
    bad = ~(np.isfinite(model) & (model <= masks.MAX_LOG_PROB))
    if bad.any():
        value = float(model[np.flatnonzero(bad)[0]])
        return (
            masks.INCONSISTENT,
            f"{int(bad.sum())} of its model tokens have no valid behaviour log-prob (e.g. {value})",
        )
    return None


def ref_encode(log_probs, mask):
    if mask is None:
        return log_probs
    out = np.array(log_probs, dtype=np.float32, copy=True)
    out[~mask] = masks.MASKED_LOG_PROB
    return out


def ref_prepare(qid, loss_mask, lps):
    """What ``member_arrays`` did per member: (stored log-probs, masked count, defect)."""
    mask = ref_as_mask(qid, loss_mask, lps.shape[0])
    defect = ref_trajectory_defect(lps, mask)
    masked = 0 if mask is None else int(mask.shape[0] - np.count_nonzero(mask))
    return ref_encode(lps, mask), masked, defect


# ------------------------------------------------------------------ random members with every kind of defect
BOUND = np.float32(masks.MAX_LOG_PROB)
SPECIAL = np.array(
    [
        np.nan,
        np.inf,
        -np.inf,
        BOUND,  # the bound itself: valid
        np.nextafter(BOUND, np.float32(1)),  # just above: invalid
        np.nextafter(BOUND, np.float32(0)),
        0.0,
        -0.0,
        0.5,
        -3.0e38,  # finite however negative: valid
        np.finfo(np.float32).max,
    ],
    dtype=np.float32,
)


def random_log_probs(rng, n):
    lps = -rng.exponential(0.7, n).astype(np.float32)
    if rng.random() < 0.5:  # a few special values somewhere
        at = rng.integers(0, n, int(rng.integers(1, 4)))
        lps[at] = rng.choice(SPECIAL, at.shape[0])
    return lps


def random_mask(rng, n):
    kind = rng.integers(0, 7)
    if kind <= 1:
        return None
    if kind == 2:
        return np.ones(n, dtype=np.bool_)  # all ones: no mask
    if kind == 3:
        return np.zeros(n, dtype=np.bool_)  # no model token
    mask = rng.random(n) < 0.7
    if kind == 4:
        mask[-1] = False  # cut in a tool turn
    elif kind == 5:
        mask[-1] = True
        mask[: int(rng.integers(0, n))] = True
    return mask


def assert_same(found, expected):
    stored, masked, defect = found
    ref_stored, ref_masked, ref_defect = expected
    assert stored.dtype == np.float32 and stored.shape == ref_stored.shape
    assert stored.tobytes() == ref_stored.tobytes()  # NaN bits included
    assert masked == ref_masked
    assert defect == ref_defect


@pytest.mark.parametrize("seed", range(6))
def test_prepare_and_prepare_many_match_the_per_member_definition(monkeypatch, seed):
    if seed % 2:  # the masked members in blocks of a few members each, as a call's thousands of tokens are
        monkeypatch.setattr(masks, "_MASKED_BLOCK_TOKENS", 37)
    rng = np.random.default_rng(seed)
    lps, mks = [], []
    for n in [int(rng.integers(1, 40)) for _ in range(200)] + [300, 40_000, 70_000]:  # long ones: counts past 2**15
        lps.append(random_log_probs(rng, n))
        mks.append(random_mask(rng, n))
    expected = [ref_prepare("q", m, a) for a, m in zip(lps, mks, strict=True)]
    for a, m, e in zip(lps, mks, expected, strict=True):
        assert_same(masks.prepare("q", m, a), e)
        assert masks.trajectory_defect(a, masks.as_mask("q", m, a.shape[0])) == e[2]
    # all at once, and in the mixes a collect call sees: only plain members, only masked ones, a few of each
    subsets = [
        range(len(lps)),
        [i for i, m in enumerate(mks) if m is None],
        [i for i, m in enumerate(mks) if m is not None],
    ]
    subsets += [sorted(rng.choice(len(lps), int(rng.integers(1, 6)), replace=False).tolist()) for _ in range(20)]
    staged = []

    def stage(arrays, lengths, check=None):  # a storage that stages (in blocks of three): the checks read its copy
        assert lengths.tolist() == [len(a) for a in arrays]
        staged.append(list(arrays))
        return stage_part(arrays, lengths, check, len(arrays))

    def stage_part(arrays, lengths, check=None, n=None):  # one that has room for the first half only
        n = (len(arrays) + 1) // 2 if n is None else n
        written = np.concatenate(arrays[:n])
        ends = np.cumsum(lengths)
        for first in range(0, n, 3) if check is not None else ():
            stop = min(first + 3, n)
            block = written[ends[first] - lengths[first] : ends[stop - 1]]
            rewritten = check(first, stop, block)
            if rewritten is not None:  # the check encoded some in place: those views are what is stored for them
                assert len(rewritten) == stop - first
                assert all(r is a or np.shares_memory(r, block) for r, a in zip(rewritten, arrays[first:stop]))
                if n == len(arrays) and staged:
                    staged[-1][first:stop] = rewritten
        return written

    for subset in subsets:
        for how in (None, stage, stage_part, lambda arrays, lengths, check=None: None):
            staged.clear()
            columns = masks.prepare_many([lps[i] for i in subset], [mks[i] for i in subset], stage=how)
            found = list(zip(*columns, strict=True))
            assert len(found) == len(subset)
            for f, i in zip(found, subset, strict=True):
                assert_same(f, expected[i])
            if how is stage:  # given what is stored, in order
                assert len(staged) == 1 and all(a is f[0] for a, f in zip(staged[0], found, strict=True))
    assert masks.prepare_many([], []) == ([], [], [])


def test_the_two_reductions_decide_like_the_token_by_token_check():
    rng = np.random.default_rng(7)
    for _ in range(3000):
        n = int(rng.integers(1, 12))
        a = rng.choice(SPECIAL, n) if rng.random() < 0.5 else random_log_probs(rng, n)
        assert masks.log_prob_defect(a) == ref_trajectory_defect(a, None)
        wide = a.astype(np.float64)  # another dtype: the same answers
        assert masks.log_prob_defect(wide) == ref_trajectory_defect(wide, None)
    empty = np.zeros(0, dtype=np.float32)
    assert masks.log_prob_defect(empty) is None and masks.prepare_many([empty], [None])[2] == [None]


def test_prepare_converts_and_refuses_masks_as_before():
    lps = np.array([-0.1, -0.2, -0.3, -0.4], np.float32)
    for mask in ([1, 0, 0, 1], [1, 1, 1, 1], [0, 0, 0, 0], [1.0, 0.0, 1.0, 1.0], np.array([1, 0, 1, 0], np.uint8)):
        assert_same(masks.prepare("q", mask, lps), ref_prepare("q", mask, lps))
    for bad in ([1, 2, 0, 1], [1, 0], [[1, 1, 1, 1]], ["1", "0", "1", "1"], [0.5, 1, 1, 1]):
        with pytest.raises(ValueError) as expected:
            ref_prepare("q", bad, lps)
        with pytest.raises(ValueError) as found:
            masks.prepare("q", bad, lps)
        assert str(found.value) == str(expected.value)


def member(rng, qid_ok=True):
    """A random GroupMember, now and then with arrays ``member_arrays`` refuses (an error) or converts."""
    n = int(rng.integers(1, 30))
    ids = rng.integers(0, 60, n)
    lps = random_log_probs(rng, n)
    mask = random_mask(rng, n)
    kind = rng.integers(0, 10)
    if kind == 0:
        ids = ids.astype(np.int64)  # converted to int32
    elif kind == 1:
        lps = lps.astype(np.float64)  # converted to float32
    elif kind == 2 and not qid_ok:
        lps = lps[:-1] if n > 1 else np.zeros((1, 1), np.float32)  # refused: one log-prob per token
    elif kind == 3 and not qid_ok:
        mask = np.ones(n + 1, dtype=np.bool_)  # refused: the mask's shape
    elif kind == 4:
        mask = None if mask is None else mask.astype(np.int64)  # 0/1 integers: converted
    else:
        ids = ids.astype(np.int32)
    return GroupMember(ids, lps, 1.0, loss_mask=mask)


def test_member_arrays_many_matches_member_arrays_and_leaves_errors_to_it():
    rng = np.random.default_rng(11)
    todo = [(f"q{i % 5}", member(rng, qid_ok=False)) for i in range(400)]
    plain = [  # no conversion and no mask: the path of a call with nothing to look at one by one
        (q, m)
        for q, m in todo
        if m.loss_mask is None
        and np.asarray(m.token_ids).dtype == np.int32
        and m.behaviour_log_probs.dtype == np.float32
    ]
    errors = 0
    for members in (todo, plain):
        columns = member_arrays_many([q for q, _ in members], [m for _, m in members])
        assert len(columns) == len(members)
        for k, (qid, m) in enumerate(members):
            f = columns.arrays(k)
            try:
                expected = member_arrays(qid, m.token_ids, m.behaviour_log_probs, m.loss_mask)
            except ValueError:
                assert f is None
                errors += 1
                continue
            assert f is not None and f.token_ids.dtype == np.int32
            assert f.token_ids.tobytes() == expected.token_ids.tobytes()
            assert_same(
                (f.stored_log_probs, f.masked, f.defect), (expected.stored_log_probs, expected.masked, expected.defect)
            )
    assert errors > 10 and len(plain) > 30


# ------------------------------------------------------------------ whole collect calls, both ways
def pool_digest(pool: ExperiencePool) -> str:
    h = hashlib.sha256()
    h.update(repr(sorted(pool.stats().items())).encode())
    h.update(repr([list(pool.buckets.members(b)) for b in range(K)]).encode())
    h.update(repr((list(pool.retired), pool.counters, pool.table.next_entry_id, pool.table.total_masked)).encode())
    for q in pool.question_ids():
        for c in pool.entries(q, copy=False):
            h.update(f"{q}:{c.entry_id}:{c.reward}:{c.step}".encode())
            h.update(c.token_ids.tobytes() + c.behaviour_log_probs.tobytes() + c.mask.tobytes())
    return h.hexdigest()


def random_call(rng, step, questions):
    groups = []
    for _ in range(int(rng.integers(1, 9))):
        qid = f"q{int(rng.integers(0, questions))}"  # repeats: the same question twice in a call, retired ones
        members = []
        for _ in range(K):
            if rng.random() < 0.3 and members:
                m = members[int(rng.integers(0, len(members)))]  # the same member again: a duplicate
            else:
                m = member(rng, qid_ok=rng.random() < 0.97)
                m.token_ids = np.asarray(m.token_ids)[: int(rng.integers(1, 4))] if rng.random() < 0.3 else m.token_ids
                m.behaviour_log_probs = np.asarray(m.behaviour_log_probs)[: np.asarray(m.token_ids).shape[0]]
                if m.loss_mask is not None:
                    m.loss_mask = np.asarray(m.loss_mask)[: np.asarray(m.token_ids).shape[0]]
                m.reward = float(rng.random() < 0.6)
                if rng.random() < 0.1:
                    m.defect = str(rng.choice(masks.DEFECTS))
            members.append(m)
        if rng.random() < 0.05:
            members = members[:-1]  # a malformed group: the call stops there
        groups.append(Group(qid, members))
    return groups


def one_pass_collect(self, step, groups, *, mixed=True):
    """``CollectionRules.collect`` as it was: one pass, each group planned, checked member by member and applied in
    turn."""
    groups = list(groups)
    stats = CollectStats(step=step, groups=len(groups), mode=self.mode, mode_stats=self.mode.new_stats())
    planner = self.mode.planner(
        groups, self.k, count_replayed=self.count_replayed_in_k, stats=stats, check_size=self._check_size
    )
    self.counters["collect_calls"] += 1
    self.last_step = step
    retire_only = self.collect_from == "mixed" and not mixed
    stats.skipped = retire_only
    batch = EntryBatch()
    pending = set()
    try:
        for i, g in enumerate(groups):
            if g.question_id in self.retired:
                self._check_size(g)
                stats.ignored_retired += 1
                continue
            if g.question_id in pending:
                self.store(batch)
                pending.clear()
            self._check_size(g)
            if self._collect_group(g, planner(i, g), step, retire_only, stats, batch):
                pending.add(g.question_id)
    finally:
        self.store(batch)
    if self.max_total_tokens is not None and self.table.total_tokens > self.max_total_tokens:
        n, t = self.evict_oldest_until(self.max_total_tokens)
        stats.evicted_entries += n
        stats.evicted_tokens += t
    self.counters["evicted"] += stats.evicted_entries
    return stats


# arena chunks of 64 tokens: a call's members rarely fit the open chunk's tail; of 4096: they are staged there
@pytest.mark.parametrize("layout,chunk_tokens", [("arena", 64), ("arena", 4096), ("per_entry", 64)])
@pytest.mark.parametrize("seed", range(4))
def test_collect_ends_as_the_one_pass_collect_with_its_member_by_member_checks(monkeypatch, layout, chunk_tokens, seed):
    def run(one_pass: bool):
        with monkeypatch.context() as patch:
            if one_pass:
                patch.setattr(CollectionRules, "collect", one_pass_collect)
            rng = np.random.default_rng(seed)
            pool = ExperiencePool(
                K, storage=layout, chunk_tokens=chunk_tokens, max_entries_per_question=3, max_total_tokens=400
            )
            outcomes = []
            for step in range(1, 40):
                try:
                    stats = pool.collect(step, random_call(rng, step, questions=12))
                    outcomes.append(sorted(stats.as_metrics().items()))
                except ValueError as e:
                    outcomes.append(str(e))
                outcomes.append(pool_digest(pool))
            return outcomes

    before, now = run(True), run(False)
    assert any(isinstance(o, str) and "members" in o for o in before)  # malformed groups stopped some calls
    assert any(isinstance(o, list) and dict(o)["collect/rejected_inconsistent"] for o in before)
    assert now == before


def test_the_binary_planner_asks_an_overridden_success_rule():
    """The planner applies success_reward itself, without a call per member, unless a subclass overrides is_success."""

    class HalfCredit(BinaryMode):  # a success from a reward of 0.5 on
        def is_success(self, reward: float) -> bool:
            return float(reward) >= 0.5

    class Threshold(BinaryMode):
        success_reward = 0.5

    def bucket(mode):
        pool = ExperiencePool(K, mode=mode)
        rewards = [1.0, 0.6, 0.5, 0.0]
        rng = np.random.default_rng(1)
        members = [
            GroupMember(rng.integers(0, 9, 3 + i).astype(np.int32), -np.ones(3 + i, np.float32), r)
            for i, r in enumerate(rewards)
        ]
        pool.collect(1, [Group("q", members)])
        return pool.bucket_of("q"), len(pool)

    assert bucket(BinaryMode()) == (1, 1)
    assert bucket(HalfCredit()) == bucket(Threshold()) == (3, 3)
