"""The pool inspector (``python -m exgrpo.pool``): every figure of the summary table equals a count made by hand
from hand-made groups, the JSON carries the same figures, the export round-trips the pool's tokens, ``show`` reads
one question through a tokenizer, ``--across`` follows a run's checkpoints, and every bad input or damaged file is
one line naming it with the documented exit status (1: damaged pool, the loader's error; 2: bad input)."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from exgrpo.config import ExGRPOConfig
from exgrpo.experience import ExperiencePool, Group, GroupMember, load_experience, save_experience
from exgrpo.experience.manager import ExperienceManager
from exgrpo.pool.cli import main
from tests.helpers.tokenizers import build_tiny_tokenizer

REPO = Path(__file__).resolve().parents[2]
K = 4


def _member(first: int, n: int, reward: float, lp: float = -0.5, replayed: bool = False) -> GroupMember:
    """Tokens first, first+1, ... (n of them), every behaviour log-prob = lp (exact in float32)."""
    return GroupMember(np.arange(first, first + n), np.full(n, lp, dtype=np.float32), reward, replayed)


def _wrong(first: int = 900) -> GroupMember:
    return _member(first, 1, 0.0)


def _binary_steps() -> list[dict[str, list[GroupMember]]]:
    """Three steps of hand-made groups (K = 4), what each does in the comments."""
    step1 = {
        "qA": [_member(10, 3, 1.0), _member(20, 5, 1.0), _wrong(), _wrong()],  # k=2: bucket 2, stores len 3 and 5
        "qB": [_member(30, 4, 1.0, lp=-1.0), _wrong(), _wrong(), _wrong()],  # k=1: bucket 1, stores len 4
        "qC": [_member(40, 2, 1.0)] * 4,  # k=4: retired at step 1
        "qD": [_wrong()] * 4,  # k=0 with nothing stored: not recorded
    }
    step2 = {
        # k=3 (the replayed member counts): bucket 3; the replayed member is not re-inserted, the fresh copy of the
        # stored len-5 answer is a duplicate, the len-6 one is new
        "qA": [_member(10, 3, 1.0, replayed=True), _member(20, 5, 1.0), _member(50, 6, 1.0, lp=-0.25), _wrong()],
        "qB": [_wrong()] * 4,  # k=0, stored: moves to bucket 0, keeps its trajectory
        # k=3: bucket 3; two equal len-2 answers (one duplicate) and a len-7 one
        "qE": [_member(60, 2, 1.0, lp=-2.0), _member(60, 2, 1.0, lp=-2.0), _member(70, 7, 1.0, lp=-2.0), _wrong()],
    }
    step3 = {"qF": [_member(80, 8, 1.0), _wrong(), _wrong(), _wrong()]}  # k=1: bucket 1, stores len 8
    return [step1, step2, step3]


# What the three steps leave, counted by hand (last collect step 3, so age = 3 - step collected):
#   qA (bucket 3): len 3 step 1 lp -0.5, len 5 step 1 lp -0.5, len 6 step 2 lp -0.25   -> ages 2, 2, 1
#   qB (bucket 0): len 4 step 1 lp -1.0                                                -> age 2
#   qE (bucket 3): len 2 step 2 lp -2.0, len 7 step 2 lp -2.0                          -> ages 1, 1
#   qF (bucket 1): len 8 step 3 lp -0.5                                                -> age 0
#   qC retired at step 1.
HAND_BINARY = {
    "questions": 4,
    "trajectories": 7,
    "tokens": 3 + 5 + 6 + 4 + 2 + 7 + 8,  # 35
    "retired": 1,
    "memory_bytes": 35 * 8 + 7 * 28,  # int32 id + float32 log-prob per token; entry_id, question, length, reward, step
    "last_step": 3,
    "step": 3,
    "reward_mode": "binary",
    "k": 4,
    "entries_per_question": {"mean": 7 / 4, "min": 1, "median": 1.5, "max": 3},  # qA 3, qB 1, qE 2, qF 1
    "length": {"mean": 5.0, "min": 2, "median": 5, "max": 8},  # 2 3 4 5 6 7 8
    "age": {"mean": 9 / 7, "min": 0, "median": 1, "max": 2},  # 0 1 1 1 2 2 2
    # (3 + 5) * -0.5 + 6 * -0.25 + 4 * -1.0 + (2 + 7) * -2.0 + 8 * -0.5 = -31.5 over 35 tokens
    "log_prob_mean": -31.5 / 35,
    "counters": {"collected": 7, "duplicates": 2, "evicted": 0, "retired": 1, "unretired": 0, "collect_calls": 3},
}
HAND_BINARY_BUCKETS = [
    # label, questions, trajectories, tokens, len mean, len median, len max, age mean, age max, reward, log-prob
    ("0/4", 1, 1, 4, 4.0, 4.0, 4, 2.0, 2, 1.0, -1.0),
    ("1/4", 1, 1, 8, 8.0, 8.0, 8, 0.0, 0, 1.0, -0.5),
    ("2/4", 0, 0, 0, None, None, None, None, None, None, None),
    ("3/4", 2, 5, 23, 23 / 5, 5.0, 7, 7 / 5, 2, 1.0, -23.5 / 23),  # qA and qE: lengths 3 5 6 2 7, ages 2 2 1 1 1
    ("all", 4, 7, 35, 5.0, 5.0, 8, 9 / 7, 2, 1.0, -31.5 / 35),
]
COLUMN_KEYS = [
    "questions",
    "trajectories",
    "tokens",
    "length_mean",
    "length_median",
    "length_max",
    "age_mean",
    "age_max",
    "reward_mean",
    "log_prob_mean",
]


def _binary_manager() -> ExperienceManager:
    cfg = ExGRPOConfig.from_dict({"delayed_start_threshold": -1.0, "seed": 3}, k=K)
    mgr = ExperienceManager(cfg)
    for step, groups in enumerate(_binary_steps(), start=1):
        mgr.collect(step, groups)
    return mgr


@pytest.fixture
def binary_ckpt(tmp_path: Path) -> Path:
    """A checkpoint as the trainer writes it: ``global_step_3/exgrpo/pool``, the token file in many small batches
    (at most 10 tokens each: [3, 5], [4, 6], [2, 7], [8]) so that every reader crosses batch boundaries and
    splits batches of several entries."""
    mgr = _binary_manager()
    step_dir = tmp_path / "run" / "global_step_3"
    save_experience(
        step_dir / "exgrpo" / "pool",
        pool=mgr.pool,
        sampler=mgr.sampler,
        selector=mgr.selector,
        schedule=mgr.schedule,
        extra={"trainer_state": {"global_steps": 3}},
        batch_tokens=10,
        fsync=False,
    )
    return step_dir


def _run(argv: list[str], capsys) -> tuple[int, str, str]:
    rc = main(argv)
    out, err = capsys.readouterr()
    return rc, out, err


def _approx(value, expected) -> bool:
    return value is None if expected is None else value == pytest.approx(expected, rel=1e-6, abs=1e-9)


# ------------------------------------------------------------------------------------------- the table
def test_every_figure_of_the_json_equals_the_hand_count(binary_ckpt: Path, capsys):
    rc, out, err = _run(["inspect", str(binary_ckpt), "--json"], capsys)
    assert rc == 0, err
    f = json.loads(out)
    for key, expected in HAND_BINARY.items():
        if isinstance(expected, dict):
            assert set(f[key]) == set(expected), key
            for sub, v in expected.items():
                assert _approx(f[key][sub], v), (key, sub, f[key][sub], v)
        elif isinstance(expected, (int, float)) and not isinstance(expected, bool):
            assert _approx(f[key], expected), (key, f[key], expected)
        else:
            assert f[key] == expected, key
    assert f["pool"] == str(binary_ckpt / "exgrpo" / "pool")  # the checkpoint's step folder resolves to its pool
    rows = [*f["buckets"], f["total"]]
    assert [r["label"] for r in rows] == [b[0] for b in HAND_BINARY_BUCKETS]
    for row, hand in zip(rows, HAND_BINARY_BUCKETS, strict=True):
        for key, expected in zip(COLUMN_KEYS, hand[1:], strict=True):
            assert _approx(row[key], expected), (row["label"], key, row[key], expected)


def test_every_figure_of_the_text_table_equals_the_hand_count(binary_ckpt: Path, capsys):
    rc, out, err = _run(["inspect", str(binary_ckpt / "exgrpo" / "pool")], capsys)
    assert rc == 0, err
    lines = out.splitlines()
    line = {ln.split()[0]: ln for ln in lines if ln.strip()}
    assert "4 with stored trajectories, 1 retired" in line["questions"]
    assert line["trajectories"].startswith("trajectories  7 (per question: mean 1.75, min 1, median 1.5, max 3)")
    assert "35 (response length: mean 5.00, min 2, median 5, max 8)" in line["tokens"]
    assert "476 B of tokens and entry columns" in line["memory"]
    assert "mean 1.29, min 0, median 1, max 2" in line["age"]
    assert line["log-prob"].endswith(f"{-31.5 / 35:.4f}")
    assert "binary: bucket = successes out of K = 4" in line["reward"]
    assert "step 3, last collect at step 3" in line["saved"]
    assert "collected 7, duplicates 2, evicted 0, retired 1, unretired 0, collect_calls 3" in line["counters"]
    start = next(i for i, ln in enumerate(lines) if ln.startswith("bucket "))
    table = [ln.split() for ln in lines[start + 1 :]]
    assert len(table) == len(HAND_BINARY_BUCKETS)
    formats = ["{:.0f}", "{:.0f}", "{:.0f}", "{:.1f}", "{:.1f}", "{:.0f}", "{:.2f}", "{:.0f}", "{:.3f}", "{:.4f}"]
    for cells, hand in zip(table, HAND_BINARY_BUCKETS, strict=True):
        expected = [hand[0]] + ["-" if v is None else fmt.format(v) for v, fmt in zip(hand[1:], formats, strict=True)]
        assert cells == expected


def test_continuous_pool_has_spread_buckets_counted_by_hand(tmp_path: Path, capsys):
    """K = 4, ε = 1/4. One step: σ over the four groups is 0.2236 (qX), 0.5 (qY), 0 (qZ, flat), 0.0866 (qW);
    min–max normalised (σ_min 0, σ_max 0.5): 0.447 -> round(1.79) = bucket 2, 1 -> 4 clipped to 3, flat, 0.173
    floored at 0.25 -> bucket 1. The members above their group's mean are stored."""
    pool = ExperiencePool.from_config(ExGRPOConfig.from_dict({"reward_mode": "continuous"}, k=K))  # ε = 1/K
    rewards = {"qX": [0.2, 0.4, 0.6, 0.8], "qY": [0.0, 0.0, 1.0, 1.0], "qZ": [0.5] * 4, "qW": [0.1, 0.1, 0.1, 0.3]}
    groups = [
        Group(q, [_member(100 * i + 10 * j, 2 + j, r) for j, r in enumerate(rs)])
        for i, (q, rs) in enumerate(rewards.items())
    ]
    pool.collect(1, groups)
    save_experience(tmp_path / "pool", pool=pool, fsync=False)
    rc, out, err = _run(["inspect", str(tmp_path / "pool"), "--json"], capsys)
    assert rc == 0, err
    f = json.loads(out)
    assert f["reward_mode"] == "continuous" and "reward-spread bucket" in f["bucket_meaning"]
    # qX: 0.6 (len 4), 0.8 (len 5); qY: 1.0 (len 4), 1.0 (len 5); qW: 0.3 (len 5)
    assert (f["questions"], f["trajectories"], f["tokens"], f["retired"]) == (3, 5, 23, 0)
    hand = {  # label: questions, trajectories, tokens, reward mean
        "spread 0": (0, 0, 0, None),
        "spread 1": (1, 1, 5, 0.3),
        "spread 2": (1, 2, 9, 0.7),
        "spread 3": (1, 2, 9, 1.0),
    }
    got = {r["label"]: (r["questions"], r["trajectories"], r["tokens"], r["reward_mean"]) for r in f["buckets"]}
    assert set(got) == set(hand)
    for label, (q, n, t, reward) in hand.items():
        assert got[label][:3] == (q, n, t), label
        assert _approx(got[label][3], reward), label
    rc, out, _ = _run(["inspect", str(tmp_path / "pool")], capsys)
    assert rc == 0 and "spread 2" in out and "continuous: bucket = reward-spread bucket" in out


def test_no_tokens_skips_the_log_probs_only(binary_ckpt: Path, capsys):
    rc, out, _ = _run(["inspect", str(binary_ckpt), "--json", "--no-tokens"], capsys)
    assert rc == 0
    f = json.loads(out)
    assert f["log_prob_mean"] is None and f["tokens_read"] is False
    assert (f["trajectories"], f["tokens"]) == (7, 35)
    assert all(r["log_prob_mean"] is None for r in f["buckets"])


def test_plot_writes_a_png(binary_ckpt: Path, tmp_path: Path, capsys):
    png = tmp_path / "figs" / "pool.png"
    rc, _, err = _run(["inspect", str(binary_ckpt), "--plot", str(png)], capsys)
    assert rc == 0, err
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_figures_count_in_whole_numbers(binary_ckpt: Path, tmp_path: Path, monkeypatch):
    """Counts, lengths and ages get whole-number ticks (the per-question panel showed 0.75 trajectories)."""
    from exgrpo.experience.persistence import open_experience
    from exgrpo.pool import plot
    from exgrpo.pool.source import resolve_pool_dir
    from exgrpo.pool.summary import summarize

    figures = []
    monkeypatch.setattr(plot, "_save", lambda fig, out: figures.append(fig) or Path(out))
    plot.plot_summary(summarize(open_experience(resolve_pool_dir(binary_ckpt))), tmp_path / "pool.png")
    (fig,) = figures
    for ax in fig.axes:
        for axis in (ax.yaxis, *([ax.xaxis] if ax is not fig.axes[0] else [])):  # the first: bucket labels
            low, high = axis.get_view_interval()
            ticks = [t for t in axis.get_majorticklocs() if low <= t <= high]
            assert all(float(t).is_integer() for t in ticks), (ax.get_title(), ticks)


# ------------------------------------------------------------------------------------------- across a run
def test_across_follows_the_checkpoints_in_step_order(tmp_path: Path, capsys):
    """Checkpoints after steps 1, 2 and 10 (numeric order, not the names' order) and one without a pool."""
    cfg = ExGRPOConfig.from_dict({"delayed_start_threshold": -1.0, "seed": 3}, k=K)
    mgr = ExperienceManager(cfg)
    run = tmp_path / "run"
    saved_at = {1: 1, 2: 2, 3: 10}  # steps 1, 2, 3 of the groups saved as global_step_1, _2, _10
    for step, groups in enumerate(_binary_steps(), start=1):
        mgr.collect(step, groups)
        mgr.save(run / f"global_step_{saved_at[step]}" / "exgrpo", {"global_steps": saved_at[step]})
    (run / "global_step_5" / "actor").mkdir(parents=True)  # a checkpoint whose pool was pruned
    png = tmp_path / "across.png"
    rc, out, err = _run(["inspect", str(run), "--across", "--json", "--plot", str(png)], capsys)
    assert rc == 0, err
    got = json.loads(out)
    rows = got["checkpoints"]
    assert [r["step"] for r in rows] == [1, 2, 10] and got["skipped_steps"] == [5]
    # by hand, after step 1: qA bucket 2 (2 traj, 8 tokens), qB bucket 1 (1 traj, 4 tokens), qC retired
    # after step 2: qB bucket 0, qA and qE bucket 3; 6 trajectories, 27 tokens; after step 3: + qF in bucket 1
    hand = [
        (1, 2, 3, 12, 1, [0, 1, 1, 0]),
        (2, 3, 6, 27, 1, [1, 0, 0, 2]),
        (10, 4, 7, 35, 1, [1, 1, 0, 2]),
    ]
    for r, (step, q, n, t, ret, buckets) in zip(rows, hand, strict=True):
        assert (r["step"], r["questions"], r["trajectories"], r["tokens"], r["retired"], r["buckets"]) == (
            step,
            q,
            n,
            t,
            ret,
            buckets,
        )
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    rc, out, _ = _run(["inspect", str(run), "--across"], capsys)
    assert rc == 0
    table = [ln.split() for ln in out.splitlines() if ln and ln.split()[0].isdigit()]
    assert table == [[str(s), str(n), str(t), str(q), str(ret), *map(str, b)] for s, q, n, t, ret, b in hand]
    assert "steps 5" in out


def test_across_draws_the_mean_length_beside_the_trajectories(tmp_path: Path, monkeypatch):
    """The pool's tokens grow with its trajectories: on a twin axis the two lines lay on top of each other."""
    from exgrpo.pool import plot

    figures = []
    monkeypatch.setattr(plot, "_save", lambda fig, out: figures.append(fig) or Path(out))
    rows = [
        {"step": s, "k": 2, "reward_mode": "binary", "buckets": [n, 0], "retired": 0, "trajectories": n, "tokens": t}
        for s, n, t in ((5, 4, 80), (10, 10, 190), (15, 20, 420))
    ]
    plot.plot_across(rows, tmp_path / "across.png")
    (fig,) = figures
    twin = fig.axes[-1]
    (line,) = twin.get_lines()
    assert line.get_label() == "tokens per trajectory" and list(line.get_ydata()) == [20.0, 19.0, 21.0]
    steps = fig.axes[1].xaxis.get_majorticklocs()
    assert all(float(t).is_integer() for t in steps), steps


def test_across_finds_the_demo_layout_under_checkpoints(binary_ckpt: Path, capsys):
    """The CPU demo's output folder holds the checkpoints under checkpoints/."""
    demo_out = binary_ckpt.parent.parent / "demo"
    (demo_out / "checkpoints").mkdir(parents=True)
    binary_ckpt.rename(demo_out / "checkpoints" / binary_ckpt.name)
    rc, out, err = _run(["inspect", str(demo_out), "--across", "--json"], capsys)
    assert rc == 0, err
    assert [r["step"] for r in json.loads(out)["checkpoints"]] == [3]


def test_a_runs_folder_without_across_says_what_to_type(binary_ckpt: Path, capsys):
    demo_out = binary_ckpt.parent.parent / "demo"
    (demo_out / "checkpoints").mkdir(parents=True)
    binary_ckpt.rename(demo_out / "checkpoints" / binary_ckpt.name)
    rc, _, err = _run(["inspect", str(demo_out)], capsys)
    assert rc == 2 and _one_line_error(err) == (
        f"error: {demo_out}: a run's folder, with 1 checkpoint(s) (steps 3): add --across for the whole run, or give "
        f"one checkpoint, e.g. {demo_out / 'checkpoints' / binary_ckpt.name}"
    )


def test_an_interrupted_overwrite_is_read_from_its_previous_copy(binary_ckpt: Path, capsys):
    """Killed between the two renames of an overwrite, a save leaves no pool/ but a complete .pool.old-*: the
    inspector reads it, as a resume does, and ``--across`` counts the checkpoint."""
    pool_dir = binary_ckpt / "exgrpo" / "pool"
    pool_dir.rename(pool_dir.parent / ".pool.old-0123abcd")
    rc, out, err = _run(["inspect", str(binary_ckpt), "--json", "--no-tokens"], capsys)
    assert rc == 0, err
    f = json.loads(out)
    assert f["pool"].endswith(".pool.old-0123abcd") and f["trajectories"] == 7
    rc, out, err = _run(["inspect", str(binary_ckpt.parent), "--across", "--json"], capsys)
    assert rc == 0, err
    assert [r["trajectories"] for r in json.loads(out)["checkpoints"]] == [7]


# ------------------------------------------------------------------------------------------- export / show
def test_export_round_trips_the_pools_tokens(binary_ckpt: Path, tmp_path: Path, capsys):
    out_file = tmp_path / "pool.parquet"
    rc, out, err = _run(["export", str(binary_ckpt), str(out_file), "--log-probs"], capsys)
    assert rc == 0, err
    assert "7 trajectories and 1 retired questions" in out
    table = pq.read_table(out_file).to_pylist()
    stored = [r for r in table if not r["retired"]]
    # the pool itself, loaded by the trainer's loader, entry by entry
    pool = ExperiencePool(K)
    load_experience(binary_ckpt / "exgrpo" / "pool", pool=pool)
    expected = {
        c.entry_id: (q, c.token_ids.tolist(), c.behaviour_log_probs.tolist(), c.step, c.reward, pool.bucket_of(q))
        for q in pool.question_ids()
        for c in pool.entries(q)
    }
    assert [r["entry_id"] for r in stored] == sorted(expected)  # entry-id order, every stored trajectory once
    for r in stored:
        q, ids, lps, step, reward, bucket = expected[r["entry_id"]]
        assert r["question_id"] == q and r["token_ids"] == ids and r["behaviour_log_probs"] == lps
        assert (r["step"], r["age"], r["reward"], r["length"]) == (step, 3 - step, reward, len(ids))
        assert r["bucket"] == bucket
        assert r["retired_step"] is None
    assert [(r["question_id"], r["retired_step"], r["token_ids"], r["entry_id"]) for r in table if r["retired"]] == [
        ("qC", 1, None, None)
    ]
    rc, _, _ = _run(["export", str(binary_ckpt), str(tmp_path / "b.parquet"), "--no-retired"], capsys)
    assert rc == 0
    b = pq.read_table(tmp_path / "b.parquet")
    assert b.num_rows == 7 and "behaviour_log_probs" not in b.column_names and "text" not in b.column_names


@pytest.fixture(scope="module")
def tiny_tokenizer(tmp_path_factory) -> tuple[Path, object]:
    path = build_tiny_tokenizer(tmp_path_factory.mktemp("tok"))
    from transformers import AutoTokenizer

    return path, AutoTokenizer.from_pretrained(str(path))


def _text_pool(tmp_path: Path, tokenizer) -> Path:
    pool = ExperiencePool(K)
    answers = ["12+30=42", "</think>\\boxed{42}"]
    members = [
        GroupMember(tokenizer.encode(a), np.full(len(tokenizer.encode(a)), -0.5, np.float32), 1.0) for a in answers
    ]
    groups = [Group(17, [*members, _wrong(5), _wrong(6)]), Group(18, [members[0], _wrong(), _wrong(), _wrong()])]
    pool.collect(1, groups)
    save_experience(tmp_path / "pool", pool=pool, fsync=False, batch_tokens=30)  # [8, 18], [8] tokens
    return tmp_path / "pool"


def test_show_decodes_one_question_with_a_tokenizer(tmp_path: Path, tiny_tokenizer, capsys):
    tok_path, tokenizer = tiny_tokenizer
    pool_dir = _text_pool(tmp_path, tokenizer)
    rc, out, err = _run(["show", str(pool_dir), "17", "--tokenizer", str(tok_path)], capsys)
    assert rc == 0, err
    assert out.splitlines()[0].startswith("question 17: bucket 2 (2/4), 2 stored trajectories")
    texts = [out.splitlines()[i + 1] for i, ln in enumerate(out.splitlines()) if ln.startswith("--- entry")]
    assert texts == ["12+30=42", "</think>\\boxed{42}"]
    assert "--- entry 0: step 1 (age 0), reward 1, 8 tokens, behaviour log-prob per model token -0.5000" in out
    rc, out, _ = _run(["show", str(pool_dir), "18"], capsys)  # no tokenizer: the token ids
    assert rc == 0 and "token ids: " + " ".join(map(str, tokenizer.encode("12+30=42"))) in out
    out_file = tmp_path / "text.parquet"
    rc, _, err = _run(["export", str(pool_dir), str(out_file), "--tokenizer", str(tok_path)], capsys)
    assert rc == 0, err
    rows = pq.read_table(out_file).to_pylist()
    texts = [(r["question_id"], r["text"]) for r in rows]
    assert texts == [(17, "12+30=42"), (17, "</think>\\boxed{42}"), (18, "12+30=42")]


# ------------------------------------------------------------------------------------------- multi-turn pools
# one question, K = 4, two correct members: an exchange of 8 tokens whose tokens 2-4 are a tool's output (loss mask 0;
# the model's 5 tokens at -0.5) and a single-turn answer of 4 tokens at -1.0; bucket 2
TOOL_MASK = [1, 1, 0, 0, 0, 1, 1, 1]


def _multi_turn_pool(tmp_path: Path) -> Path:
    pool = ExperiencePool(K)
    exchange = GroupMember(np.arange(10, 18), np.full(8, -0.5, np.float32), 1.0, loss_mask=np.array(TOOL_MASK))
    pool.collect(1, [Group("qT", [exchange, _member(30, 4, 1.0, lp=-1.0), _wrong(), _wrong()])])
    save_experience(tmp_path / "pool", pool=pool, fsync=False, batch_tokens=10)
    return tmp_path / "pool"


def test_a_multi_turn_pool_counts_its_tool_tokens_and_leaves_them_out_of_the_log_prob(tmp_path: Path, capsys):
    pool_dir = _multi_turn_pool(tmp_path)
    rc, out, err = _run(["inspect", str(pool_dir), "--json"], capsys)
    assert rc == 0, err
    f = json.loads(out)
    assert (f["trajectories"], f["tokens"], f["tool_tokens"]) == (2, 12, 3)
    assert _approx(f["log_prob_mean"], (5 * -0.5 + 4 * -1.0) / 9)  # over the 9 model tokens, no NaN
    assert [(r["label"], r["tool_tokens"]) for r in f["buckets"]] == [("0/4", 0), ("1/4", 0), ("2/4", 3), ("3/4", 0)]
    rc, out, _ = _run(["inspect", str(pool_dir)], capsys)
    assert rc == 0 and "12 (response length: mean 6.00, min 4, median 6, max 8); 3 of them tool tokens" in out
    lines = out.splitlines()
    header = next(ln for ln in lines if ln.startswith("bucket "))
    assert "tool tokens" in header  # shown: some bucket has tool tokens
    row = next(ln for ln in lines if ln.startswith("2/4 ")).split()
    assert row[3] == "12" and row[-2:] == ["3", f"{-6.5 / 9:.4f}"]
    rc, out, _ = _run(["show", str(pool_dir), "qT"], capsys)
    assert rc == 0
    assert "8 tokens (3 of them tool tokens, masked from the loss), behaviour log-prob per model token -0.5000" in out
    assert "4 tokens, behaviour log-prob per model token -1.0000" in out
    rc, _, err = _run(["export", str(pool_dir), str(tmp_path / "t.parquet"), "--log-probs"], capsys)
    assert rc == 0, err
    rows = [r for r in pq.read_table(tmp_path / "t.parquet").to_pylist() if not r["retired"]]
    assert [r["model_tokens"] for r in rows] == [5, 4]
    lps = np.array(rows[0]["behaviour_log_probs"], dtype=np.float32)
    assert np.isnan(lps).tolist() == [not m for m in TOOL_MASK] and (lps[~np.isnan(lps)] == -0.5).all()


def test_a_single_turn_pool_has_no_tool_tokens_column(binary_ckpt: Path, capsys):
    rc, out, _ = _run(["inspect", str(binary_ckpt)], capsys)
    assert rc == 0 and "tool tokens" not in out
    rc, out, _ = _run(["inspect", str(binary_ckpt), "--json"], capsys)
    assert json.loads(out)["tool_tokens"] == 0


# ------------------------------------------------------------------------------------------- bad inputs, faults
def _one_line_error(err: str) -> str:
    assert "Traceback" not in err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1, err
    return lines[0]


def test_unknown_and_retired_question_ids(binary_ckpt: Path, capsys):
    rc, _, err = _run(["show", str(binary_ckpt), "qZZ"], capsys)
    assert rc == 2 and "question 'qZZ' is not in the pool" in _one_line_error(err)
    rc, _, err = _run(["show", str(binary_ckpt), "qC"], capsys)
    assert rc == 2 and "question 'qC' retired at step 1" in _one_line_error(err)


def test_bad_tokenizer_paths(binary_ckpt: Path, tmp_path: Path, capsys):
    missing = tmp_path / "no-such-tokenizer"
    rc, _, err = _run(["show", str(binary_ckpt), "qA", "--tokenizer", str(missing)], capsys)
    assert rc == 2 and f"tokenizer {missing}: no such directory" in _one_line_error(err)
    empty = tmp_path / "empty"
    empty.mkdir()
    rc, _, err = _run(["export", str(binary_ckpt), str(tmp_path / "x.parquet"), "--tokenizer", str(empty)], capsys)
    assert rc == 2 and f"tokenizer {empty}: cannot be loaded" in _one_line_error(err)
    assert not (tmp_path / "x.parquet").exists()


def test_not_a_pool_and_missing_paths(tmp_path: Path, capsys):
    rc, _, err = _run(["inspect", str(tmp_path / "nope")], capsys)
    assert rc == 2 and f"{tmp_path / 'nope'}: no such file or directory" in _one_line_error(err)
    rc, _, err = _run(["inspect", str(tmp_path)], capsys)
    assert rc == 2 and f"{tmp_path}: no saved experience pool" in _one_line_error(err)
    rc, _, err = _run(["inspect", str(tmp_path), "--across"], capsys)
    assert rc == 2 and f"{tmp_path}: no global_step_N checkpoints" in _one_line_error(err)


def test_an_export_is_an_ordinary_file_in_a_folder_that_exists(binary_ckpt: Path, tmp_path: Path, capsys):
    previous = os.umask(0o022)
    try:
        rc, _, err = _run(["export", str(binary_ckpt), str(tmp_path / "pool.parquet")], capsys)
    finally:
        os.umask(previous)
    assert rc == 0, err
    assert stat.S_IMODE((tmp_path / "pool.parquet").stat().st_mode) == 0o644  # as every other output (not 0600)
    missing = tmp_path / "no-such-folder"
    rc, _, err = _run(["export", str(binary_ckpt), str(missing / "pool.parquet")], capsys)
    assert rc == 2 and _one_line_error(err) == (
        f"error: {missing / 'pool.parquet'}: its folder {missing} does not exist (create it first)"
    )
    assert not missing.exists()


def test_outputs_that_cannot_be_written(binary_ckpt: Path, tmp_path: Path, capsys):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    for argv, out in [
        (["inspect", str(binary_ckpt), "--plot", str(blocker / "p.png")], blocker / "p.png"),
        (["export", str(binary_ckpt), str(blocker / "x.parquet")], blocker / "x.parquet"),
    ]:
        rc, _, err = _run(argv, capsys)
        assert rc == 2 and f"{out}: cannot be written" in _one_line_error(err), argv


def _flip(path: Path, offset: int) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x40
    path.write_bytes(bytes(data))


@pytest.mark.parametrize(
    "name, damage, expected",
    [
        ("header.json", "flip", "checksum mismatch (corrupt or modified header)"),
        ("header.json", "delete", "missing"),
        ("entries.arrow", "flip", "checksum mismatch (corrupt file)"),
        ("entries.arrow", "delete", "missing"),
        ("tokens.arrow", "flip", "checksum mismatch (corrupt file)"),
        ("tokens.arrow", "truncate", "truncated or modified"),
        ("tokens.arrow", "delete", "missing"),
    ],
)
def test_a_damaged_pool_names_the_file(binary_ckpt: Path, tmp_path: Path, capsys, name, damage, expected):
    pool_dir = binary_ckpt / "exgrpo" / "pool"
    path = pool_dir / name
    if damage == "flip":
        _flip(path, path.stat().st_size // 2)
    elif damage == "truncate":
        path.write_bytes(path.read_bytes()[:-1])
    else:
        path.unlink()
    # the loader a resume runs gives the same error
    with pytest.raises(Exception) as resume:
        load_experience(pool_dir, pool=ExperiencePool(K))
    assert type(resume.value).__name__ == "PoolCheckpointError" and str(path) in str(resume.value)
    out_file = tmp_path / "x.parquet"
    commands = [["inspect", str(binary_ckpt)], ["export", str(pool_dir), str(out_file)], ["show", str(pool_dir), "qA"]]
    for argv in commands:
        rc, _, err = _run(argv, capsys)
        line = _one_line_error(err)
        assert rc == 1, (argv, err)
        assert line == f"error: damaged pool: {resume.value}", argv
        assert str(path) in line and expected in line
    assert not out_file.exists() and not list(tmp_path.glob(".x.parquet.tmp-*"))


def test_the_module_entry_point_and_lazy_imports(binary_ckpt: Path, tmp_path: Path):
    """``python -m exgrpo.pool`` runs the same command line; reading a pool imports neither matplotlib nor
    transformers (they load only for --plot / --tokenizer), nor torch (the pool's reader never needs it)."""
    proc = subprocess.run(
        [sys.executable, "-m", "exgrpo.pool", "inspect", str(binary_ckpt), "--json"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["trajectories"] == 7
    bad = subprocess.run(
        [sys.executable, "-m", "exgrpo.pool", "inspect", str(tmp_path / "nope")],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert bad.returncode == 2 and "Traceback" not in bad.stderr
    code = (
        "import sys\n"
        "from exgrpo.pool.cli import main\n"
        f"assert main(['inspect', {str(binary_ckpt)!r}]) == 0\n"
        f"assert main(['export', {str(binary_ckpt)!r}, {str(tmp_path / 'e.parquet')!r}]) == 0\n"
        f"assert main(['show', {str(binary_ckpt)!r}, 'qA']) == 0\n"
        "lazy = ('matplotlib', 'transformers', 'torch', 'verl', 'ray')\n"
        "heavy = sorted(m for m in sys.modules if m.split('.')[0] in lazy)\n"
        "assert not heavy, heavy\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
