"""Synthetic verifiable dataset: toy arithmetic questions with ``\\boxed{}`` answers, in verl's parquet format.

The embedded default for tests and the CPU demo (no download needed). Every row is one question such as
``What is 23 + 58? Put the final answer in \\boxed{}.`` with ground truth ``81``. Columns follow verl's RL
dataset convention (``data_source``, ``prompt`` as chat messages, ``ability``, ``reward_model`` with
``ground_truth``/``style``, ``extra_info`` with ``index``/``split``) plus a stable string ``question_id`` in
``extra_info``: it depends only on the question (operator and operands), never on the seed or the row order, so
the experience pool can key questions by it across runs and resumes (docs/algorithm.md §2).

Deterministic given the config: the same seed gives the same rows in the same order; train and val never share
a question.

CLI: ``python -m data_preprocess.toy_arithmetic --out DIR [--seed 0 --n-train 512 --n-val 64]``
"""

from __future__ import annotations

import argparse
import json
import random
from dataclasses import asdict, dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

DATA_SOURCE = "toy_arithmetic"
ABILITY = "math"
OPERATORS = {"+": "add", "-": "sub", "*": "mul"}
PROMPT_TEMPLATE = "What is {a} {op} {b}? Put the final answer in \\boxed{{}}."


@dataclass(frozen=True)
class ToyArithmeticConfig:
    """What the generator draws. Operands are integers in ``[min_operand, max_operand]``.

    ``max_operand`` / ``operators`` set the difficulty (the tiny CPU model reaches a partial pass rate on
    two-digit sums after a short warm-up, see recipe/exgrpo/cpu/assets.py).
    """

    seed: int = 0
    n_train: int = 512
    n_val: int = 64
    min_operand: int = 0
    max_operand: int = 99
    operators: tuple[str, ...] = ("+",)
    non_negative: bool = True
    data_source: str = DATA_SOURCE

    def __post_init__(self) -> None:
        if self.n_train < 1 or self.n_val < 0:
            raise ValueError(f"n_train must be >= 1 and n_val >= 0, got n_train={self.n_train}, n_val={self.n_val}")
        if self.min_operand < 0 or self.max_operand < self.min_operand:
            raise ValueError(
                f"need 0 <= min_operand <= max_operand, got min_operand={self.min_operand}, "
                f"max_operand={self.max_operand}"
            )
        bad = [op for op in self.operators if op not in OPERATORS]
        if not self.operators or bad:
            raise ValueError(f"operators must be a non-empty subset of {sorted(OPERATORS)}, got {self.operators!r}")
        if self.n_train + self.n_val > self.capacity():
            raise ValueError(
                f"n_train + n_val = {self.n_train + self.n_val} exceeds the {self.capacity()} distinct questions "
                f"that operands {self.min_operand}..{self.max_operand} with operators {self.operators} allow"
            )

    def capacity(self) -> int:
        """Number of distinct questions the config can produce."""
        return len(self.all_questions())

    def all_questions(self) -> list[tuple[int, str, int]]:
        span = range(self.min_operand, self.max_operand + 1)
        return [
            (a, op, b)
            for op in self.operators
            for a in span
            for b in span
            if not (self.non_negative and op == "-" and a < b)
        ]


def question_id(a: int, op: str, b: int) -> str:
    """Stable id of one question, e.g. ``toy_add_23_58``."""
    return f"toy_{OPERATORS[op]}_{a}_{b}"


def answer(a: int, op: str, b: int) -> int:
    if op == "+":
        return a + b
    if op == "-":
        return a - b
    if op == "*":
        return a * b
    raise ValueError(f"unknown operator {op!r}; allowed: {sorted(OPERATORS)}")


def question_text(a: int, op: str, b: int) -> str:
    return PROMPT_TEMPLATE.format(a=a, op=op, b=b)


def make_row(a: int, op: str, b: int, index: int, split: str, data_source: str = DATA_SOURCE) -> dict:
    """One verl RL row."""
    return {
        "data_source": data_source,
        "prompt": [{"role": "user", "content": question_text(a, op, b)}],
        "ability": ABILITY,
        "reward_model": {"ground_truth": str(answer(a, op, b)), "style": "rule"},
        "extra_info": {
            "index": index,
            "split": split,
            "question_id": question_id(a, op, b),
            "question": question_text(a, op, b),
            "answer": str(answer(a, op, b)),
        },
    }


def generate_splits(config: ToyArithmeticConfig) -> dict[str, list[dict]]:
    """Rows of the train and val splits: a seeded draw without replacement, so the splits are disjoint."""
    questions = config.all_questions()
    rng = random.Random(config.seed)
    picked = rng.sample(questions, config.n_train + config.n_val)
    train_q, val_q = picked[: config.n_train], picked[config.n_train :]
    return {
        "train": [make_row(a, op, b, i, "train", config.data_source) for i, (a, op, b) in enumerate(train_q)],
        "val": [make_row(a, op, b, i, "val", config.data_source) for i, (a, op, b) in enumerate(val_q)],
    }


def rows_to_table(rows: list[dict]) -> pa.Table:
    return pa.Table.from_pylist(rows)


def write_parquet(out_dir: str | Path, config: ToyArithmeticConfig | None = None) -> dict[str, Path]:
    """Write ``train.parquet`` and ``val.parquet`` (and the config as JSON) into ``out_dir``; return the paths."""
    config = config or ToyArithmeticConfig()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = {}
    for split, rows in generate_splits(config).items():
        path = out / f"{split}.parquet"
        pq.write_table(rows_to_table(rows), path)
        paths[split] = path
    (out / "toy_arithmetic_config.json").write_text(json.dumps(asdict(config), indent=2) + "\n")
    return paths


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, help="output directory for train.parquet and val.parquet")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--n-train", type=int, default=ToyArithmeticConfig.n_train)
    parser.add_argument("--n-val", type=int, default=ToyArithmeticConfig.n_val)
    parser.add_argument("--min-operand", type=int, default=ToyArithmeticConfig.min_operand)
    parser.add_argument("--max-operand", type=int, default=ToyArithmeticConfig.max_operand)
    parser.add_argument("--operators", default="+", help="subset of '+-*', e.g. '+-'")
    args = parser.parse_args(argv)
    config = ToyArithmeticConfig(
        seed=args.seed,
        n_train=args.n_train,
        n_val=args.n_val,
        min_operand=args.min_operand,
        max_operand=args.max_operand,
        operators=tuple(args.operators),
    )
    paths = write_parquet(args.out, config)
    print(json.dumps({k: str(v) for k, v in paths.items()}))


if __name__ == "__main__":
    main()
