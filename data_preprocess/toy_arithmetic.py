"""Synthetic verifiable dataset: toy arithmetic questions with ``\\boxed{}`` answers and a difficulty split.

The embedded default for tests, the CPU demo and the CPU learning benchmark (no download needed). Every row is one
question such as ``What is 23 + 58? Put the final answer in \\boxed{}.`` with ground truth ``81``. Columns follow
verl's RL dataset convention (``data_source``, ``prompt`` as chat messages, ``ability``, ``reward_model`` with
``ground_truth``/``style``, ``extra_info`` with ``index``/``split``) plus

- ``extra_info.question_id``: a stable string such as ``toy_add_23_58``. It depends only on the question
  (operator and operands), never on the seed, the level or the row order, so the experience pool can key
  questions by it across runs and resumes (docs/algorithm.md §2);
- ``extra_info.difficulty``: the question's level (``easy``, ``medium``, ``hard`` by default), and
  ``data_source = toy_arithmetic_<level>``: verl's validation reports its metrics per data source, so the
  validation accuracy comes split by difficulty for free (``val-core/toy_arithmetic_hard/acc/mean@1``).

A level is a set of question families (operator, operand ranges, carries); the default levels grow with the
carries and the digits, which is what makes a tiny transformer's success rate fall (docs/learning.md has the
measured spread):

======== ============================================================ ===
Deterministic given the config: the same seed gives the same rows in the same order; train and val never share
a question, and each level contributes the same number of rows to each split.

CLI: ``python -m data_preprocess.toy_arithmetic --out DIR [--seed 0 --train-per-level 512 --val-per-level 128
--levels easy,medium,hard]``
"""

from __future__ import annotations

import argparse
import json
import random
from dataclasses import asdict, dataclass, field
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

DATA_SOURCE = "toy_arithmetic"
ABILITY = "math"
OPERATORS = {"+": "add", "-": "sub", "*": "mul"}
PROMPT_TEMPLATE = "What is {a} {op} {b}? Put the final answer in \\boxed{{}}."

Question = tuple[int, str, int]


CARRY_MODES = ("any", "none", "some", "units", "all")


def has_carry(a: int, b: int) -> bool:
    """Whether the column addition of ``a + b`` carries at least once."""
    return any(carry_columns(a, b))


def carry_columns(a: int, b: int) -> list[bool]:
    """For each column of the addition ``a + b``, units first, whether it carries into the next one."""
    out, carry = [], 0
    while a or b:
        carry = int(a % 10 + b % 10 + carry >= 10)
        out.append(bool(carry))
        a, b = a // 10, b // 10
    return out


def _carry_matches(a: int, b: int, mode: str) -> bool:
    if mode == "any":
        return True
    columns = carry_columns(a, b)
    if mode in ("none", "some"):
        return any(columns) == (mode == "some")
    if mode == "units":  # the units column carries, no other does
        return columns[:1] == [True] and not any(columns[1:])
    return bool(columns) and all(columns)  # "all": every column carries


@dataclass(frozen=True)
class QuestionFamily:
    """Questions ``a <op> b`` with ``a`` in ``[a_min, a_max]`` and ``b`` in ``[b_min, b_max]`` (inclusive).

    ``carry`` (additions only) keeps the sums whose column addition never carries (``none``), carries at least once
    (``some``), carries from the units column only (``units``), carries from every column (``all``), or all of them
    (``any``): carrying is what makes a sum hard for a small transformer.
    """

    op: str
    a_min: int
    a_max: int
    b_min: int
    b_max: int
    carry: str = "any"

    def __post_init__(self) -> None:
        if self.op not in OPERATORS:
            raise ValueError(f"operator must be one of {sorted(OPERATORS)}, got {self.op!r}")
        if not (0 <= self.a_min <= self.a_max and 0 <= self.b_min <= self.b_max):
            raise ValueError(
                f"operand ranges must satisfy 0 <= min <= max, got a in [{self.a_min}, {self.a_max}], "
                f"b in [{self.b_min}, {self.b_max}]"
            )
        if self.carry not in CARRY_MODES:
            raise ValueError(f"carry must be one of {CARRY_MODES}, got {self.carry!r}")
        if self.carry != "any" and self.op != "+":
            raise ValueError(f"carry={self.carry!r} applies to additions only, got operator {self.op!r}")

    def questions(self, non_negative: bool = True) -> list[Question]:
        return [
            (a, self.op, b)
            for a in range(self.a_min, self.a_max + 1)
            for b in range(self.b_min, self.b_max + 1)
            if not (non_negative and self.op == "-" and a < b) and (self.op != "+" or _carry_matches(a, b, self.carry))
        ]


@dataclass(frozen=True)
class Difficulty:
    """One difficulty level: a name and the question families it draws from."""

    name: str
    families: tuple[QuestionFamily, ...]

    def __post_init__(self) -> None:
        if not self.name or not self.name.replace("_", "").isalnum():
            raise ValueError(f"a difficulty name must be a non-empty identifier, got {self.name!r}")
        if not self.families:
            raise ValueError(f"difficulty {self.name!r} has no question families")

    def questions(self, non_negative: bool = True) -> list[Question]:
        """The level's distinct questions, in a fixed order (families in order, duplicates dropped)."""
        seen: dict[Question, None] = {}
        for family in self.families:
            for q in family.questions(non_negative):
                seen.setdefault(q, None)
        return list(seen)


EASY = Difficulty("easy", (QuestionFamily("+", 10, 99, 10, 99, carry="none"),))
MEDIUM = Difficulty("medium", (QuestionFamily("+", 10, 99, 10, 99, carry="some"),))
HARD = Difficulty("hard", (QuestionFamily("+", 100, 999, 10, 99),))
DEFAULT_LEVELS: tuple[Difficulty, ...] = (EASY, MEDIUM, HARD)
PRESET_LEVELS = {level.name: level for level in DEFAULT_LEVELS}


@dataclass(frozen=True)
class ToyArithmeticConfig:
    """What the generator draws: ``train_per_level`` and ``val_per_level`` questions from each level."""

    seed: int = 0
    train_per_level: int = 512
    val_per_level: int = 128
    levels: tuple[Difficulty, ...] = field(default=DEFAULT_LEVELS)
    non_negative: bool = True
    data_source: str = DATA_SOURCE

    def __post_init__(self) -> None:
        if self.train_per_level < 1 or self.val_per_level < 0:
            raise ValueError(
                f"train_per_level must be >= 1 and val_per_level >= 0, got train_per_level={self.train_per_level}, "
                f"val_per_level={self.val_per_level}"
            )
        if not self.levels:
            raise ValueError("levels must name at least one difficulty level")
        names = [level.name for level in self.levels]
        if len(set(names)) != len(names):
            raise ValueError(f"difficulty names must be unique, got {names}")
        owner: dict[Question, str] = {}
        sizes = {}
        for level in self.levels:
            questions = level.questions(self.non_negative)
            sizes[level.name] = len(questions)
            for q in questions:
                if q in owner:
                    raise ValueError(
                        f"question {question_text(*q)!r} belongs to two levels ({owner[q]!r} and {level.name!r}); "
                        "the levels' question families must not overlap"
                    )
                owner[q] = level.name
        need = self.train_per_level + self.val_per_level
        for name, size in sizes.items():
            if need > size:
                raise ValueError(
                    f"level {name!r}: train_per_level + val_per_level = {need} exceeds its {size} distinct questions"
                )

    @property
    def n_train(self) -> int:
        return self.train_per_level * len(self.levels)

    @property
    def n_val(self) -> int:
        return self.val_per_level * len(self.levels)

    def level_names(self) -> list[str]:
        return [level.name for level in self.levels]

    def level_data_source(self, level: str) -> str:
        """The ``data_source`` of the level's rows (verl groups validation metrics by it)."""
        return f"{self.data_source}_{level}"


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


def make_row(a: int, op: str, b: int, index: int, split: str, difficulty: str, data_source: str = DATA_SOURCE) -> dict:
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
            "difficulty": difficulty,
            "question": question_text(a, op, b),
            "answer": str(answer(a, op, b)),
        },
    }


def split_questions(config: ToyArithmeticConfig) -> dict[str, list[tuple[Question, str]]]:
    """(question, level) pairs of each split: a seeded draw without replacement per level, so splits are disjoint.

    Train questions of all levels are shuffled together (each batch mixes difficulties); validation questions
    come level by level.
    """
    rng = random.Random(config.seed)
    train: list[tuple[Question, str]] = []
    val: list[tuple[Question, str]] = []
    for level in config.levels:
        picked = rng.sample(level.questions(config.non_negative), config.train_per_level + config.val_per_level)
        train += [(q, level.name) for q in picked[: config.train_per_level]]
        val += [(q, level.name) for q in picked[config.train_per_level :]]
    rng.shuffle(train)
    return {"train": train, "val": val}


def generate_splits(config: ToyArithmeticConfig) -> dict[str, list[dict]]:
    """Rows of the train and val splits."""
    return {
        split: [
            make_row(a, op, b, i, split, level, config.level_data_source(level))
            for i, ((a, op, b), level) in enumerate(pairs)
        ]
        for split, pairs in split_questions(config).items()
    }


def held_out_questions(config: ToyArithmeticConfig, per_level: int, seed: int = 0) -> list[tuple[Question, str]]:
    """Up to ``per_level`` questions of each level that are in neither split (the CPU model's SFT warm-up set)."""
    used = {q for pairs in split_questions(config).values() for q, _ in pairs}
    rng = random.Random(seed)
    out: list[tuple[Question, str]] = []
    for level in config.levels:
        rest = [q for q in level.questions(config.non_negative) if q not in used]
        out += [(q, level.name) for q in (rng.sample(rest, per_level) if per_level < len(rest) else rest)]
    return out


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
    parser = argparse.ArgumentParser(
        prog="python -m data_preprocess.toy_arithmetic", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--out", required=True, help="output directory for train.parquet and val.parquet")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--train-per-level",
        type=int,
        default=ToyArithmeticConfig.train_per_level,
        help=f"training questions per level (default {ToyArithmeticConfig.train_per_level}; at least 1)",
    )
    parser.add_argument(
        "--val-per-level",
        type=int,
        default=ToyArithmeticConfig.val_per_level,
        help=f"validation questions per level (default {ToyArithmeticConfig.val_per_level}; 0: none)",
    )
    parser.add_argument(
        "--levels", default=",".join(PRESET_LEVELS), help=f"comma-separated subset of {sorted(PRESET_LEVELS)}"
    )
    args = parser.parse_args(argv)
    names = [n.strip() for n in args.levels.split(",") if n.strip()]
    unknown = [n for n in names if n not in PRESET_LEVELS]
    if unknown or not names:
        parser.error(f"--levels: unknown level(s) {unknown}; choose from {sorted(PRESET_LEVELS)}")
    if args.train_per_level < 1:
        parser.error(f"--train-per-level must be at least 1, got {args.train_per_level}")
    if args.val_per_level < 0:
        parser.error(f"--val-per-level must be at least 0, got {args.val_per_level}")
    try:
        config = ToyArithmeticConfig(
            seed=args.seed,
            train_per_level=args.train_per_level,
            val_per_level=args.val_per_level,
            levels=tuple(PRESET_LEVELS[n] for n in names),
        )
    except ValueError as e:  # e.g. more questions per level than the level has
        parser.error(f"--train-per-level {args.train_per_level} --val-per-level {args.val_per_level}: {e}")
    paths = write_parquet(args.out, config)
    print(json.dumps({k: str(v) for k, v in paths.items()}))


if __name__ == "__main__":
    main()
