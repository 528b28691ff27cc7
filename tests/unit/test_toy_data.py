"""The synthetic toy arithmetic dataset: verl's parquet schema, determinism, disjoint splits, correct answers."""

from __future__ import annotations

import re

import pyarrow.parquet as pq
import pytest

from data_preprocess.toy_arithmetic import (
    ToyArithmeticConfig,
    answer,
    generate_splits,
    main,
    question_id,
    write_parquet,
)

QUESTION = re.compile(r"^What is (\d+) ([+\-*]) (\d+)\? Put the final answer in \\boxed\{\}\.$")


def test_rows_follow_verl_rl_schema():
    splits = generate_splits(ToyArithmeticConfig(n_train=8, n_val=4))
    row = splits["train"][0]
    assert set(row) == {"data_source", "prompt", "ability", "reward_model", "extra_info"}
    assert row["data_source"] == "toy_arithmetic"
    assert row["prompt"][0]["role"] == "user" and len(row["prompt"]) == 1
    assert row["reward_model"]["style"] == "rule"
    assert {"index", "split", "question_id"} <= set(row["extra_info"])
    assert [r["extra_info"]["index"] for r in splits["train"]] == list(range(8))
    assert {r["extra_info"]["split"] for r in splits["val"]} == {"val"}


def test_ground_truth_is_the_arithmetic_answer_and_id_names_the_question():
    config = ToyArithmeticConfig(n_train=50, n_val=10, operators=("+", "-", "*"), max_operand=20)
    for rows in generate_splits(config).values():
        for row in rows:
            a, op, b = QUESTION.match(row["prompt"][0]["content"]).groups()
            a, b = int(a), int(b)
            assert row["reward_model"]["ground_truth"] == str(answer(a, op, b))
            assert row["extra_info"]["question_id"] == question_id(a, op, b)
            if op == "-":
                assert a >= b  # non_negative keeps answers >= 0


@pytest.mark.parametrize("seed", [0, 7])
def test_same_seed_same_rows_other_seed_other_rows(seed):
    a = generate_splits(ToyArithmeticConfig(seed=seed, n_train=20, n_val=5))
    b = generate_splits(ToyArithmeticConfig(seed=seed, n_train=20, n_val=5))
    c = generate_splits(ToyArithmeticConfig(seed=seed + 1, n_train=20, n_val=5))
    assert a == b
    assert [r["extra_info"]["question_id"] for r in a["train"]] != [r["extra_info"]["question_id"] for r in c["train"]]


def test_splits_are_disjoint_and_ids_unique():
    splits = generate_splits(ToyArithmeticConfig(n_train=300, n_val=60, max_operand=20))
    train = [r["extra_info"]["question_id"] for r in splits["train"]]
    val = [r["extra_info"]["question_id"] for r in splits["val"]]
    assert len(set(train)) == 300 and len(set(val)) == 60
    assert not set(train) & set(val)


def test_question_id_is_stable_across_seeds():
    ids = {}
    for seed in range(3):
        for row in generate_splits(ToyArithmeticConfig(seed=seed, n_train=100, n_val=0, max_operand=9))["train"]:
            qid = row["extra_info"]["question_id"]
            ids.setdefault(qid, set()).add(row["prompt"][0]["content"])
    assert all(len(texts) == 1 for texts in ids.values())


@pytest.mark.parametrize(
    ("kwargs", "key"),
    [
        ({"n_train": 0}, "n_train"),
        ({"operators": ("/",)}, "operators"),
        ({"min_operand": 5, "max_operand": 2}, "max_operand"),
        ({"max_operand": 3, "n_train": 50, "n_val": 0}, "exceeds"),
    ],
)
def test_bad_config_names_the_problem(kwargs, key):
    with pytest.raises(ValueError, match=key):
        ToyArithmeticConfig(**kwargs)


def test_parquet_round_trip(tmp_path):
    paths = write_parquet(tmp_path, ToyArithmeticConfig(n_train=16, n_val=4))
    table = pq.read_table(paths["train"])
    assert table.num_rows == 16
    assert set(table.column_names) == {"data_source", "prompt", "ability", "reward_model", "extra_info"}
    first = table.slice(0, 1).to_pylist()[0]
    assert first == generate_splits(ToyArithmeticConfig(n_train=16, n_val=4))["train"][0]
    assert pq.read_table(paths["val"]).num_rows == 4


def test_cli_writes_both_splits(tmp_path, capsys):
    main(["--out", str(tmp_path), "--n-train", "10", "--n-val", "3", "--operators", "+-", "--max-operand", "9"])
    assert pq.read_table(tmp_path / "train.parquet").num_rows == 10
    assert pq.read_table(tmp_path / "val.parquet").num_rows == 3
    assert "train.parquet" in capsys.readouterr().out
