"""The synthetic toy arithmetic dataset: verl's parquet schema, determinism, disjoint splits, correct answers,
the difficulty split and stable question ids."""

from __future__ import annotations

import re
from collections import Counter

import pyarrow.parquet as pq
import pytest

from data_preprocess.toy_arithmetic import (
    DEFAULT_LEVELS,
    Difficulty,
    QuestionFamily,
    ToyArithmeticConfig,
    answer,
    generate_splits,
    has_carry,
    held_out_questions,
    main,
    question_id,
    write_parquet,
)

QUESTION = re.compile(r"^What is (\d+) ([+\-*]) (\d+)\? Put the final answer in \\boxed\{\}\.$")
SMALL = ToyArithmeticConfig(train_per_level=8, val_per_level=4)
MIXED = (
    Difficulty("easy", (QuestionFamily("+", 0, 9, 0, 9), QuestionFamily("*", 0, 9, 0, 9))),
    Difficulty("hard", (QuestionFamily("-", 10, 99, 10, 99),)),
)


def _operands(row: dict) -> tuple[int, str, int]:
    a, op, b = QUESTION.match(row["prompt"][0]["content"]).groups()
    return int(a), op, int(b)


def test_rows_follow_verl_rl_schema():
    splits = generate_splits(SMALL)
    row = splits["train"][0]
    assert set(row) == {"data_source", "prompt", "ability", "reward_model", "extra_info"}
    assert row["prompt"][0]["role"] == "user" and len(row["prompt"]) == 1
    assert row["reward_model"]["style"] == "rule"
    assert {"index", "split", "question_id", "difficulty"} <= set(row["extra_info"])
    assert [r["extra_info"]["index"] for r in splits["train"]] == list(range(24))
    assert {r["extra_info"]["split"] for r in splits["val"]} == {"val"}


def test_each_level_gets_its_share_and_its_own_data_source():
    splits = generate_splits(ToyArithmeticConfig(train_per_level=40, val_per_level=10))
    for split, per_level in (("train", 40), ("val", 10)):
        levels = Counter(r["extra_info"]["difficulty"] for r in splits[split])
        assert levels == {"easy": per_level, "medium": per_level, "hard": per_level}
        for row in splits[split]:
            # verl groups validation metrics by data_source: one per level
            assert row["data_source"] == f"toy_arithmetic_{row['extra_info']['difficulty']}"
    # training batches mix the levels (the train split is shuffled across levels, not level by level)
    first = [r["extra_info"]["difficulty"] for r in splits["train"][:20]]
    assert len(set(first)) == 3


def test_default_levels_grow_with_carries_and_digits():
    """easy: 2-digit sums without a carry, medium: 2-digit sums with one, hard: 3-digit + 2-digit (docs/learning.md)."""
    splits = generate_splits(ToyArithmeticConfig(train_per_level=200, val_per_level=50))
    shapes: dict[str, set] = {"easy": set(), "medium": set(), "hard": set()}
    for row in splits["train"] + splits["val"]:
        a, op, b = _operands(row)
        shapes[row["extra_info"]["difficulty"]].add((op, len(str(a)), len(str(b)), has_carry(a, b)))
    assert shapes["easy"] == {("+", 2, 2, False)}
    assert shapes["medium"] == {("+", 2, 2, True)}
    assert {s[:3] for s in shapes["hard"]} == {("+", 3, 2)}
    assert [level.name for level in DEFAULT_LEVELS] == ["easy", "medium", "hard"]


@pytest.mark.parametrize(
    ("a", "b", "carries"),
    [(23, 45, False), (27, 45, True), (55, 45, True), (91, 12, True), (100, 899, False), (0, 0, False)],
)
def test_has_carry(a, b, carries):
    assert has_carry(a, b) is carries


def test_carry_filter_splits_a_family_in_two():
    none = QuestionFamily("+", 10, 99, 10, 99, carry="none").questions()
    some = QuestionFamily("+", 10, 99, 10, 99, carry="some").questions()
    every = QuestionFamily("+", 10, 99, 10, 99).questions()
    assert len(none) == 36 * 55 and len(none) + len(some) == len(every) == 90 * 90
    assert not set(none) & set(some)


def test_ground_truth_is_the_arithmetic_answer_and_id_names_the_question():
    for rows in generate_splits(ToyArithmeticConfig(train_per_level=50, val_per_level=10, levels=MIXED)).values():
        for row in rows:
            a, op, b = _operands(row)
            assert row["reward_model"]["ground_truth"] == str(answer(a, op, b))
            assert row["extra_info"]["question_id"] == question_id(a, op, b)
            if op == "-":
                assert a >= b  # non_negative keeps answers >= 0


@pytest.mark.parametrize("seed", [0, 7])
def test_same_seed_same_rows_other_seed_other_rows(seed):
    a = generate_splits(ToyArithmeticConfig(seed=seed, train_per_level=20, val_per_level=5))
    b = generate_splits(ToyArithmeticConfig(seed=seed, train_per_level=20, val_per_level=5))
    c = generate_splits(ToyArithmeticConfig(seed=seed + 1, train_per_level=20, val_per_level=5))
    assert a == b
    assert [r["extra_info"]["question_id"] for r in a["train"]] != [r["extra_info"]["question_id"] for r in c["train"]]


def test_splits_are_disjoint_and_ids_unique():
    splits = generate_splits(ToyArithmeticConfig(train_per_level=100, val_per_level=60, levels=MIXED))
    train = [r["extra_info"]["question_id"] for r in splits["train"]]
    val = [r["extra_info"]["question_id"] for r in splits["val"]]
    assert len(set(train)) == 200 and len(set(val)) == 120
    assert not set(train) & set(val)


def test_question_id_depends_only_on_the_question():
    """The same question gets the same id whatever the seed, the split sizes or the row order."""
    texts_by_id: dict[str, set[str]] = {}
    level_by_id: dict[str, set[str]] = {}
    for seed in range(3):
        for per_level in (30, 60):
            splits = generate_splits(ToyArithmeticConfig(seed=seed, train_per_level=per_level, val_per_level=10))
            for row in splits["train"] + splits["val"]:
                qid = row["extra_info"]["question_id"]
                texts_by_id.setdefault(qid, set()).add(row["prompt"][0]["content"])
                level_by_id.setdefault(qid, set()).add(row["extra_info"]["difficulty"])
    assert all(len(texts) == 1 for texts in texts_by_id.values())
    assert all(len(levels) == 1 for levels in level_by_id.values())
    assert question_id(23, "+", 58) == "toy_add_23_58"  # the documented form, used by existing pools


def test_held_out_questions_avoid_both_splits():
    config = ToyArithmeticConfig(train_per_level=50, val_per_level=20)
    used = {q["extra_info"]["question_id"] for rows in generate_splits(config).values() for q in rows}
    held = held_out_questions(config, per_level=300)
    assert Counter(level for _, level in held) == {"easy": 300, "medium": 300, "hard": 300}
    assert not {question_id(*q) for q, _ in held} & used
    assert held == held_out_questions(config, per_level=300)  # deterministic


@pytest.mark.parametrize(
    ("kwargs", "key"),
    [
        ({"train_per_level": 0}, "train_per_level"),
        ({"levels": ()}, "levels"),
        ({"levels": (MIXED[0], MIXED[0])}, "unique"),
        ({"levels": (MIXED[0], Difficulty("again", (QuestionFamily("+", 5, 9, 5, 9),)))}, "two levels"),
        ({"levels": MIXED, "train_per_level": 200, "val_per_level": 1}, "exceeds"),
    ],
)
def test_bad_config_names_the_problem(kwargs, key):
    with pytest.raises(ValueError, match=key):
        ToyArithmeticConfig(**kwargs)


@pytest.mark.parametrize(
    ("args", "key"),
    [
        (("/", 0, 9, 0, 9), "operator"),
        (("+", 5, 2, 0, 9), "min <= max"),
        (("+", 0, 9, 0, 9, "often"), "carry must be"),
        (("*", 0, 9, 0, 9, "none"), "additions only"),
    ],
)
def test_bad_family_names_the_problem(args, key):
    with pytest.raises(ValueError, match=key):
        QuestionFamily(*args)


def test_parquet_round_trip(tmp_path):
    paths = write_parquet(tmp_path, SMALL)
    table = pq.read_table(paths["train"])
    assert table.num_rows == 24
    assert set(table.column_names) == {"data_source", "prompt", "ability", "reward_model", "extra_info"}
    first = table.slice(0, 1).to_pylist()[0]
    assert first == generate_splits(SMALL)["train"][0]
    assert pq.read_table(paths["val"]).num_rows == 12


def test_cli_writes_both_splits(tmp_path, capsys):
    main(["--out", str(tmp_path), "--train-per-level", "10", "--val-per-level", "3", "--levels", "easy,hard"])
    assert pq.read_table(tmp_path / "train.parquet").num_rows == 20
    val = pq.read_table(tmp_path / "val.parquet").to_pylist()
    assert Counter(r["extra_info"]["difficulty"] for r in val) == {"easy": 3, "hard": 3}
    assert "train.parquet" in capsys.readouterr().out


def test_cli_rejects_an_unknown_level(tmp_path):
    with pytest.raises(SystemExit):
        main(["--out", str(tmp_path), "--levels", "easy,impossible"])


@pytest.mark.parametrize(
    "args, message",
    [
        (["--train-per-level", "-1"], "--train-per-level must be at least 1, got -1"),
        (["--val-per-level", "-2"], "--val-per-level must be at least 0, got -2"),
        (
            ["--train-per-level", "5000", "--levels", "easy"],
            "--train-per-level 5000 --val-per-level 128: level 'easy': train_per_level + val_per_level = 5128 "
            "exceeds its 1980 distinct questions",
        ),
    ],
)
def test_cli_bad_counts_are_one_line_naming_the_flag(tmp_path, capsys, args, message):
    with pytest.raises(SystemExit) as exc:  # was a ValueError traceback
        main(["--out", str(tmp_path / "o"), *args])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and err.splitlines()[-1] == f"python -m data_preprocess.toy_arithmetic: error: {message}"
    assert not (tmp_path / "o").exists()
