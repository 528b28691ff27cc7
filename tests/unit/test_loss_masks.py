"""Multi-turn trajectories in the pool: the loss mask is stored with the tokens and behaviour log-probs (encoded as
NaN log-probs, at no byte), comes back exactly from candidates, survives save/load in both layouts and across them,
is checked against the log-probs at collection (a disagreement or an exchange cut in a tool turn is counted, not
stored), and a pool saved before loss masks existed loads as all-model-token trajectories."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from exgrpo.config import ExGRPOConfig
from exgrpo.experience import (
    ExperiencePool,
    Group,
    GroupMember,
    PoolCheckpointError,
    load_experience,
    masks,
    save_experience,
)
from exgrpo.experience import persistence as persistence_mod
from exgrpo.experience.manager import ExperienceManager
from tests.helpers.experience import resign_header

REPO = Path(__file__).resolve().parents[2]
K = 4
LAYOUTS = ("arena", "per_entry")


def exchange(rng, turns=2, tool_len=5, turn_len=(2, 6)):
    """A multi-turn trajectory: model turn, tool output, model turn ...: (ids, mask, log-probs with junk on tool
    tokens, as verl's old-log-prob pass gives them: every position has a value)."""
    ids, mask = [], []
    for t in range(turns):
        n = int(rng.integers(*turn_len))
        ids += rng.integers(3, 200, n).tolist()
        mask += [1] * n
        if t < turns - 1:
            ids += rng.integers(3, 200, tool_len).tolist()
            mask += [0] * tool_len
    lps = -rng.exponential(0.5, len(ids)).astype(np.float32)
    return np.asarray(ids, dtype=np.int64), np.asarray(mask, dtype=np.int64), lps


def member(rng, reward=1.0, turns=2, **kw):
    ids, mask, lps = exchange(rng, turns, **kw)
    return GroupMember(ids, lps, reward, loss_mask=mask)


def wrong():
    return GroupMember(np.array([1, 2], dtype=np.int64), np.array([-0.5, -0.5], np.float32), 0.0)


def test_encode_decode_and_the_mask_checks():
    lps = np.array([-0.1, -0.2, -0.3, -0.4], np.float32)
    mask = masks.as_mask("q", [1, 0, 0, 1], 4)
    stored = masks.encode(lps, mask)
    assert np.isnan(stored).tolist() == [False, True, True, False] and masks.count_masked(stored) == 2
    clean, back = masks.decode(stored)
    assert back.tolist() == [True, False, False, True] and clean.tolist() == pytest.approx([-0.1, 0, 0, -0.4])
    assert masks.as_mask("q", [1, 1, 1, 1], 4) is None and masks.as_mask("q", None, 4) is None
    assert masks.encode(lps, None) is lps and masks.decode(lps)[1] is None
    with pytest.raises(ValueError, match="question 'q'.*0 and 1"):
        masks.as_mask("q", [1, 2, 0, 1], 4)
    with pytest.raises(ValueError, match="shape"):
        masks.as_mask("q", [1, 0], 4)
    assert masks.trajectory_defect(lps, mask) is None
    assert masks.trajectory_defect(lps, masks.as_mask("q", [1, 1, 1, 0], 4))[0] == masks.TRUNCATED
    assert masks.trajectory_defect(lps, masks.as_mask("q", [0, 0, 0, 0], 4))[0] == masks.INCONSISTENT
    bad = lps.copy()
    bad[3] = np.nan  # a model token without a log-prob
    assert masks.trajectory_defect(bad, mask)[0] == masks.INCONSISTENT
    bad[3] = 0.5  # a positive log-prob is no log-prob
    assert masks.trajectory_defect(bad, mask)[0] == masks.INCONSISTENT
    bad[1] = np.nan  # a tool token's log-prob is never read
    bad[3] = -0.1
    assert masks.trajectory_defect(bad, mask) is None


@pytest.mark.parametrize("layout", LAYOUTS)
def test_candidates_give_back_the_stored_tokens_mask_and_clean_log_probs(layout):
    rng = np.random.default_rng(0)
    pool = ExperiencePool(K, storage=layout, chunk_tokens=64)
    multi = [member(rng, turns=3), member(rng, turns=2)]
    single = GroupMember(np.arange(5, 12), -np.linspace(0.1, 0.7, 7).astype(np.float32), 1.0)
    stats = pool.collect(1, [Group("q", [*multi, single, wrong()])])
    assert stats.added_entries == 3 and pool.bucket_of("q") == 3
    masked = sum(int((np.asarray(m.loss_mask) == 0).sum()) for m in multi)
    assert pool.stats()["pool/tool_tokens"] == masked and pool.total_tokens == sum(len(m.token_ids) for m in multi) + 7
    for copy in (True, False):
        cands = pool.candidates(["q"], copy=copy)[0]
        for c, m in zip(cands, [*multi, single]):
            assert c.token_ids.tolist() == np.asarray(m.token_ids).tolist()
            expected_mask = np.ones(len(m.token_ids), bool) if m.loss_mask is None else np.asarray(m.loss_mask) == 1
            assert c.mask.tolist() == expected_mask.tolist() and c.num_model_tokens == int(expected_mask.sum())
            # the model tokens' log-probs as collected, 0.0 (verl's value) on the others: no NaN leaves the pool
            want = np.where(expected_mask, m.behaviour_log_probs, 0.0)
            assert np.array_equal(c.behaviour_log_probs, want.astype(np.float32))
            assert not copy or c.behaviour_log_probs.flags.writeable
        assert cands[2].loss_mask is None  # a single-turn trajectory has no mask to carry
        if not copy:
            assert not cands[0].behaviour_log_probs.flags.writeable and not cands[0].token_ids.flags.writeable
    # the length filter uses the whole stored length (tool tokens included)
    longest = max(len(m.token_ids) for m in multi)
    assert all(c.length < longest for c in pool.candidates(["q"], max_length=longest - 1)[0])
    # retirement releases the masked tokens' count with the entries
    pool.collect(2, [Group("q", [member(rng) for _ in range(K)])])
    assert pool.is_retired("q") and pool.stats()["pool/tool_tokens"] == 0 and pool.table.total_masked == 0


def test_dedup_compares_the_mask_too():
    rng = np.random.default_rng(1)
    pool = ExperiencePool(K)
    m = member(rng)
    other = GroupMember(m.token_ids, m.behaviour_log_probs, 1.0, loss_mask=np.roll(m.loss_mask, 1))
    other.loss_mask[-1] = 1  # still ends on a model token
    stats = pool.collect(1, [Group("q", [m, m, other, wrong()])])
    assert stats.added_entries == 2 and stats.duplicates == 1
    assert [c.mask.tolist() for c in pool.entries("q")] == [
        (np.asarray(m.loss_mask) == 1).tolist(),
        (np.asarray(other.loss_mask) == 1).tolist(),
    ]


def test_a_member_whose_mask_and_log_probs_disagree_or_that_was_cut_in_a_tool_turn_is_counted_not_stored():
    rng = np.random.default_rng(2)
    ok = member(rng)
    nan_on_model_token = member(rng)
    nan_on_model_token.behaviour_log_probs[0] = np.nan
    ends_in_tool_output = member(rng)
    ends_in_tool_output.loss_mask[-1] = 0
    flagged = member(rng)
    flagged.defect = masks.TRUNCATED  # the trainer saw an unanswered tool call in its last turn
    asked = []
    lazy = member(rng)
    lazy.defect = lambda: asked.append(1) or None  # the trainer's check, run only for a member to store
    pool = ExperiencePool(K)
    stats = pool.collect(1, [Group("q", [ok, nan_on_model_token, ends_in_tool_output, flagged])])
    # all four were correct: k = 4 retires the question, nothing is checked
    assert pool.is_retired("q") and stats.rejected_inconsistent == stats.rejected_truncated == 0
    stats = pool.collect(1, [Group("p", [ok, nan_on_model_token, ends_in_tool_output, wrong()])])
    assert stats.added_entries == 1 and stats.rejected_inconsistent == 1 and stats.rejected_truncated == 1
    lazy_wrong = member(rng, reward=0.0)
    lazy_wrong.defect = lambda: asked.append(0) or None
    stats = pool.collect(1, [Group("u", [lazy, lazy_wrong, wrong(), wrong()])])
    assert stats.added_entries == 1 and asked == [1]  # asked for the member to store, not for the wrong one
    assert pool.bucket_of("p") == 3  # the rejected members still count as successes of the group
    stats = pool.collect(2, [Group("r", [flagged, wrong(), wrong(), wrong()])])
    assert stats.added_entries == 0 and stats.rejected_truncated == 1 and pool.bucket_of("r") is None
    metrics = stats.as_metrics("exgrpo/collect/")
    assert metrics["exgrpo/collect/rejected_truncated"] == 1.0 and "exgrpo/collect/rejected_inconsistent" in metrics
    with pytest.raises(ValueError, match="unknown member defect"):
        pool.collect(3, [Group("s", [GroupMember([4], [-0.1], 1.0, defect="odd"), wrong(), wrong(), wrong()])])
    with pytest.raises(ValueError, match="cannot be stored"):
        n = len(ends_in_tool_output.token_ids)
        pool.add("t", ends_in_tool_output.token_ids, ends_in_tool_output.behaviour_log_probs, loss_mask=[0] * n)


def _masked_pool(layout="arena", seed=3):
    rng = np.random.default_rng(seed)
    pool = ExperiencePool(K, storage=layout, chunk_tokens=50)
    for q in range(12):
        members = [member(rng, turns=1 + q % 3) for _ in range(1 + q % 3)]
        members += [wrong()] * (K - len(members))
        pool.collect(1 + q // 4, [Group(f"q{q}", members)])
    assert pool.table.total_masked > 0
    return pool


def _contents(pool):
    return {
        q: [
            (c.entry_id, c.token_ids.tobytes(), c.behaviour_log_probs.tobytes(), c.mask.tobytes())
            for c in pool.entries(q)
        ]
        for q in pool.question_ids()
    }


@pytest.mark.parametrize("save_layout,load_layout", [(a, b) for a in LAYOUTS for b in LAYOUTS])
def test_masks_round_trip_through_the_checkpoint(tmp_path, save_layout, load_layout):
    pool = _masked_pool(save_layout)
    out = save_experience(tmp_path / "p", pool=pool, batch_tokens=40, fsync=False)
    header = json.loads((out / "header.json").read_text())
    record = header["files"]["tokens.arrow"]
    assert header["schema_version"] == persistence_mod.SCHEMA_VERSION == 3 and len(record["batches"]) > 2
    assert record["loss_mask"] == {"encoding": masks.ENCODING, "masked_tokens": pool.table.total_masked}
    fresh = ExperiencePool(K, storage=load_layout)
    load_experience(out, pool=fresh)
    assert _contents(fresh) == _contents(pool)
    held = ("pool/bytes", "pool/bytes_per_token")  # memory held depends on the layout and its chunks, not the pool

    def stats(p):
        return {k: v for k, v in p.stats().items() if k not in held}

    assert fresh.table.total_masked == pool.table.total_masked and stats(fresh) == stats(pool)
    st_a, st_b = fresh.state_dict(), pool.state_dict()
    assert st_a["behaviour_log_probs"].tobytes() == st_b["behaviour_log_probs"].tobytes()
    # the in-memory state round trip restores the masks as well
    again = ExperiencePool(K, storage=load_layout)
    again.load_state_dict(pool.state_dict())
    assert _contents(again) == _contents(pool) and again.table.total_masked == pool.table.total_masked


def test_a_pool_without_masked_tokens_is_written_as_before(tmp_path):
    rng = np.random.default_rng(4)
    pool = ExperiencePool(K)
    pool.collect(1, [Group("q", [GroupMember(np.arange(3, 9), -rng.random(6).astype(np.float32), 1.0), wrong()] * 2)])
    out = save_experience(tmp_path / "p", pool=pool, fsync=False)
    header = json.loads((out / "header.json").read_text())
    assert header["schema_version"] == 2 and "loss_mask" not in header["files"]["tokens.arrow"]
    fresh = ExperiencePool(K)
    load_experience(out, pool=fresh)
    assert all(c.loss_mask is None for c in fresh.entries("q")) and fresh.table.total_masked == 0


def _drop_mask_record(body):
    body["files"]["tokens.arrow"].pop("loss_mask")
    body["schema_version"] = 2


@pytest.mark.parametrize(
    ("edit", "pattern"),
    [
        (lambda b: b["files"]["tokens.arrow"]["loss_mask"].update(masked_tokens=1), r"holds \d+ tokens marked"),
        (lambda b: b["files"]["tokens.arrow"]["loss_mask"].update(encoding="bits"), "encoding 'bits' is not one"),
        (lambda b: b["files"]["tokens.arrow"]["loss_mask"].update(masked_tokens="3"), "malformed loss_mask"),
        (_drop_mask_record, r"header records 0 \(no loss mask\)"),
        (lambda b: b.update(schema_version=2), "schema_version 2 cannot have a 'loss_mask' record"),
        (lambda b: b["files"]["tokens.arrow"].pop("loss_mask"), "schema_version 3 requires a 'loss_mask' record"),
    ],
)
def test_a_header_whose_loss_mask_does_not_fit_the_file_is_named(tmp_path, edit, pattern):
    out = save_experience(tmp_path / "p", pool=_masked_pool(), fsync=False)
    resign_header(out, edit)
    with pytest.raises(PoolCheckpointError, match=pattern):
        load_experience(out, pool=ExperiencePool(K))


def test_the_state_digest_covers_the_mask():
    cfg = ExGRPOConfig.from_dict({}, k=K)
    a, b = ExperienceManager(cfg), ExperienceManager(cfg)
    rng = np.random.default_rng(5)
    m = member(rng)
    shifted = GroupMember(m.token_ids, m.behaviour_log_probs, 1.0, loss_mask=m.loss_mask.copy())
    shifted.loss_mask[0] = 0  # one more masked token, same ids and log-probs
    a.collect(1, {"q": [m, wrong(), wrong(), wrong()]})
    b.collect(1, {"q": [shifted, wrong(), wrong(), wrong()]})
    assert a.state_digest()["pool"] != b.state_digest()["pool"]


#: the last commit before loss masks existed: its pools (format 2) must load here, and it must refuse ours (3)
BEFORE = "eb47d55"

_OLD_SIDE = textwrap.dedent(
    """
    import json, sys
    import numpy as np
    from exgrpo.experience import ExperiencePool, Group, GroupMember, PoolCheckpointError, load_experience
    from exgrpo.experience import save_experience
    action, path = sys.argv[1], sys.argv[2]
    if action == "save":
        rng = np.random.default_rng(6)
        pool = ExperiencePool(4)
        good = [GroupMember(rng.integers(3, 99, 7), -rng.random(7).astype(np.float32), 1.0) for _ in range(2)]
        bad = GroupMember(np.array([1, 2]), np.array([-0.5, -0.5], np.float32), 0.0)
        pool.collect(1, [Group("q", good + [bad, bad])])
        save_experience(path, pool=pool, fsync=False)
        print(json.dumps([[c.token_ids.tolist(), c.behaviour_log_probs.tolist()] for c in pool.entries("q")]))
    else:
        try:
            load_experience(path, pool=ExperiencePool(4))
            print("loaded")
        except PoolCheckpointError as e:
            print("refused: " + str(e))
    """
)


@pytest.fixture(scope="module")
def before_tree(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("before_masks")
    try:
        archive = subprocess.run(
            ["git", "-C", str(REPO), "archive", BEFORE, "exgrpo"], capture_output=True, check=True, timeout=60
        ).stdout
    except (OSError, subprocess.CalledProcessError, subprocess.TimeoutExpired) as e:
        pytest.skip(f"git history with {BEFORE} is not available here: {e}")
    subprocess.run(["tar", "-x", "-C", str(root)], input=archive, check=True)
    (root / "old_side.py").write_text(_OLD_SIDE)
    return root


def _old(tree: Path, *args: str) -> str:
    proc = subprocess.run(
        [sys.executable, str(tree / "old_side.py"), *args],
        env={**os.environ, "PYTHONPATH": str(tree)},
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tree,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout.strip().splitlines()[-1]


def test_a_pool_saved_before_loss_masks_loads_as_model_tokens_and_the_old_code_refuses_a_masked_pool(
    before_tree, tmp_path
):
    saved = json.loads(_old(before_tree, "save", str(tmp_path / "old")))
    pool = ExperiencePool(K)
    load_experience(tmp_path / "old", pool=pool)
    entries = pool.entries("q")
    assert [[c.token_ids.tolist(), c.behaviour_log_probs.tolist()] for c in entries] == saved
    assert all(c.loss_mask is None and c.mask.all() for c in entries)
    save_experience(tmp_path / "new", pool=_masked_pool(), fsync=False)
    assert _old(before_tree, "load", str(tmp_path / "new")).startswith("refused: ")
    assert "schema_version 3 is not supported" in _old(before_tree, "load", str(tmp_path / "new"))


# ------------------------------------------------------------------------------------------------ the objective
AGG_MODES = ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm")


def _loss_inputs(seed=7):
    import torch

    g = torch.Generator().manual_seed(seed)
    rows, length = 6, 12
    mask = torch.ones(rows, length, dtype=torch.bool)
    mask[:, 3:6] = False  # a tool output inside every row
    mask[1, 9:] = False  # and padding after a shorter row
    replay = torch.tensor([True, False, True, False, False, True])
    old = -torch.rand(rows, length, generator=g, dtype=torch.float64)
    return {
        "log_prob": (old + 0.2 * torch.randn(rows, length, generator=g, dtype=torch.float64)),
        "old_log_prob": old,
        "behaviour_log_prob": -torch.rand(rows, length, generator=g, dtype=torch.float64),
        "advantages": torch.randn(rows, generator=g, dtype=torch.float64),
        "response_mask": mask,
        "replay_mask": replay,
        "entropy": torch.rand(rows, length, generator=g, dtype=torch.float64),
    }


def _loss_and_grad(inputs, agg):
    import torch

    from exgrpo.objective import LossSettings, mixed_policy_loss

    settings = LossSettings(loss_agg_mode=agg, loss_scale_factor=12.0, entropy_coeff=0.01, fresh_clip="always")
    log_prob = inputs["log_prob"].clone().requires_grad_(True)
    loss, _ = mixed_policy_loss(
        log_prob,
        inputs["old_log_prob"],
        inputs["behaviour_log_prob"],
        inputs["advantages"],
        inputs["response_mask"],
        inputs["replay_mask"],
        settings,
        mixed=True,
        entropy=inputs["entropy"],
    )
    (grad,) = torch.autograd.grad(loss, log_prob)
    return loss.detach(), grad


@pytest.mark.parametrize("agg", AGG_MODES)
def test_tool_tokens_log_probs_do_not_move_the_loss_a_model_tokens_do(agg):
    import torch

    base = _loss_inputs()
    loss, grad = _loss_and_grad(base, agg)
    tool = ~base["response_mask"]
    assert float(grad[tool].abs().max()) == 0.0 and float(grad[base["response_mask"]].abs().max()) > 0
    # every log-prob of the tool tokens changed: the current policy's, the recomputed and the stored behaviour ones
    changed = dict(base)
    for key in ("log_prob", "old_log_prob", "behaviour_log_prob", "entropy"):
        changed[key] = torch.where(tool, base[key] - 3.0 * torch.rand_like(base[key]), base[key])
    loss2, grad2 = _loss_and_grad(changed, agg)
    assert torch.equal(loss2, loss) and torch.equal(grad2, grad)
    # one model token of a replayed row: its stored behaviour log-prob changes the importance ratio, loss and gradient
    model = dict(base)
    model["behaviour_log_prob"] = base["behaviour_log_prob"].clone()
    model["behaviour_log_prob"][0, 7] -= 0.5
    loss3, grad3 = _loss_and_grad(model, agg)
    assert not torch.equal(loss3, loss) and not torch.equal(grad3[0, 7], grad[0, 7])


@pytest.mark.parametrize("seed", range(4))
def test_masked_members_encoded_where_they_are_staged_are_stored_as_without_staging(seed):
    """A collect call encodes its masked members' log-probs where the arena stages them and stores those views; what
    the call does between the staging and the store (a question twice, retirements that free and compact the chunk
    or release it, duplicates, defects and the cap that drop staged entries, a tail too short for all) never changes
    what is stored: the same pool as the per-entry layout, which stages nothing."""
    rng = np.random.default_rng(seed)

    def fresh(r):
        kind = r.integers(0, 5)
        ids, mask, lps = exchange(r, turns=int(r.integers(1, 4)))
        if kind == 0:  # a plain member
            return GroupMember(ids.astype(np.int32), lps, 1.0)
        if kind == 1:  # cut in a tool turn: a defect, not stored
            return GroupMember(np.r_[ids, 7], np.r_[lps, -0.1].astype(np.float32), 1.0, loss_mask=np.r_[mask, 0])
        if kind == 2:  # as the trainer hands them: int32 ids and a bool mask
            return GroupMember(ids.astype(np.int32), lps, 1.0, loss_mask=mask.astype(np.bool_))
        return GroupMember(ids, lps, 1.0, loss_mask=mask)

    calls = []
    for _ in range(12):
        groups, seen = [], []
        for _ in range(int(rng.integers(2, 7))):
            q = f"q{int(rng.integers(0, 10))}"
            r = np.random.default_rng(int(rng.integers(0, 1 << 30)))
            if rng.random() < 0.15:  # K/K: retire it (frees its slots mid-call)
                groups.append(Group(q, [fresh(r) for _ in range(K)]))
                continue
            members = [fresh(r) for _ in range(int(rng.integers(1, K)))]
            if seen and rng.random() < 0.3:  # a duplicate of a member staged earlier in the call
                members[0] = seen[int(rng.integers(0, len(seen)))]
            seen += members
            groups.append(Group(q, members + [wrong()] * (K - len(members))))
        calls.append(groups)
    pools = {
        "arena, small chunks": ExperiencePool(K, chunk_tokens=48, max_entries_per_question=2),
        "arena": ExperiencePool(K, chunk_tokens=4096, max_entries_per_question=2),
        "per_entry": ExperiencePool(K, storage="per_entry", max_entries_per_question=2),
    }
    stats = {name: [] for name in pools}
    for step, groups in enumerate(calls, start=1):
        for name, pool in pools.items():
            stats[name].append(pool.collect(step, groups).as_metrics())
    expected = _contents(pools["per_entry"])
    assert any(c for c in expected.values()) and pools["per_entry"].table.total_masked > 0
    for name, pool in pools.items():
        assert _contents(pool) == expected, name
        assert stats[name] == stats["per_entry"] and pool.counters == pools["per_entry"].counters, name
        assert pool.table.total_masked == pools["per_entry"].table.total_masked, name


def _state(pool):
    """Everything a pool holds, in order: questions in table order with each entry's id, reward, step, tokens, stored
    log-probs and mask; the buckets' member lists; the retired questions; the counters."""
    entries = [
        (
            q,
            [
                (c.entry_id, c.reward, c.step, c.token_ids.tobytes(), c.behaviour_log_probs.tobytes(), c.mask.tobytes())
                for c in pool.entries(q)
            ],
        )
        for q in pool.question_ids()
    ]
    buckets = [list(pool.buckets.members(b)) for b in range(pool.k)]
    return entries, buckets, list(pool.retired), dict(pool.counters)


@pytest.mark.parametrize("mode", ["binary", "binary, replayed not counted", "continuous"])
@pytest.mark.parametrize("seed", range(3))
def test_the_common_case_in_one_call_stores_what_the_general_path_stores(seed, mode, monkeypatch):
    """A collect call applies most groups (a question without stored trajectories, members of distinct lengths, a
    clean call) in one call instead of the general path's five. With that path switched off, the same calls leave
    the same pool: entries (rewards and steps included), question order, buckets, retired questions, counters and
    every call's statistics. Both kinds of group occur (the one-call path is taken and declined), and calls without
    it (a member with a defect, a trainer's check as a function), replayed members and rewards of several values."""
    from exgrpo.config import ExGRPOConfig
    from exgrpo.experience.collection import CollectionRules

    rng = np.random.default_rng(100 + seed)
    continuous = mode == "continuous"
    won = (0.25, 0.5, 0.75, 1.0) if continuous else (1.0, 1.25, 2.0)  # rewards of members that count as right

    def fresh(r, length=None, defect=False, check=False):
        kind = 4 if check else r.integers(0, 4)
        reward = float(r.choice(won))
        ids, mask, lps = exchange(r, turns=int(r.integers(1, 4)))
        if defect:  # cut in a tool turn: a defect, not stored (and the call is not clean)
            return GroupMember(np.r_[ids, 7], np.r_[lps, -0.1].astype(np.float32), reward, loss_mask=np.r_[mask, 0])
        if length is not None:  # a given length: the dedup has something to compare
            ids, lps = np.resize(ids, length), np.resize(lps, length)
            mask = None
        if kind == 4:  # the trainer's check, asked only of a member to store (the call takes the general path)
            return GroupMember(ids.astype(np.int32), lps, reward, defect=lambda: None)
        if kind < 2 or mask is None:
            return GroupMember(ids.astype(np.int32), lps, reward, is_replayed=bool(kind == 1 and r.random() < 0.3))
        return GroupMember(ids, lps, reward, loss_mask=mask.astype(np.bool_))

    calls, given = [], {}
    for _ in range(16):
        groups, seen = [], []
        defect_at = int(rng.integers(0, 8)) if rng.random() < 0.2 else -1
        check_at = int(rng.integers(0, 8)) if rng.random() < 0.2 else -1
        for g in range(int(rng.integers(2, 8))):
            q = f"q{int(rng.integers(0, 40))}"
            r = np.random.default_rng(int(rng.integers(0, 1 << 30)))
            if rng.random() < 0.1:  # all right: retire it
                groups.append(Group(q, [fresh(r) for _ in range(K)]))
                continue
            same = int(r.integers(5, 8)) if rng.random() < 0.2 else None  # members of one length
            members = [
                fresh(r, same, defect=g == defect_at and i == 0, check=g == check_at and i == 0)
                for i in range(int(rng.integers(1, K)))
            ]
            if seen and rng.random() < 0.2:  # a duplicate of a member of the call
                members[0] = seen[int(rng.integers(0, len(seen)))]
            elif given.get(q) and rng.random() < 0.3:  # one the question was given in an earlier call
                members[0] = given[q][int(rng.integers(0, len(given[q])))]
            seen += members
            given.setdefault(q, []).extend(members)
            groups.append(Group(q, members + [wrong()] * (K - len(members))))
        calls.append(groups)

    taken = {True: 0, False: 0}
    one_call = CollectionRules._admit_new_question

    def counted(self, *args):
        done = one_call(self, *args)
        taken[done] += 1
        return done

    def new_pool():
        if continuous:
            return ExperiencePool.from_config(
                ExGRPOConfig.from_dict({"reward_mode": "continuous"}, k=K), chunk_tokens=64
            )
        return ExperiencePool(K, chunk_tokens=64, count_replayed_in_k=mode == "binary")

    def run(path):
        monkeypatch.setattr(CollectionRules, "_admit_new_question", path)
        pool = new_pool()
        stats = [pool.collect(step, groups).as_metrics() for step, groups in enumerate(calls, start=1)]
        return pool, stats

    pool, stats = run(counted)
    general, general_stats = run(lambda self, *args: False)
    assert taken[True] >= 8 and taken[False] >= 3, taken
    assert _state(pool) == _state(general) and len(general) > 10
    assert len({c.reward for q in general.question_ids() for c in general.entries(q)}) > 1
    assert stats == general_stats
