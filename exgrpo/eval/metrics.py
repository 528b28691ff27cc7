"""Accuracy metrics of the evaluation protocol (docs/algorithm.md §12).

The paper reports avg@32 on AIME24, AIME25 and AMC (mean accuracy over 32 samples per question, then over
questions) and pass@1 on the other benchmarks (one sample per question). Both are the same estimator — the mean
of per-question success rates — evaluated at a different number of samples per question, so one function serves
both. pass@k uses the unbiased estimator of Chen et al. (2021), "Evaluating Large Language Models Trained on
Code", in its numerically stable product form.

Benchmark keys are verl ``data_source`` values; the paper's column order and names live in ``PAPER_COLUMNS``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field

# --- the paper's columns -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Column:
    """One column of the paper's tables: a benchmark (``kind`` "id"/"ood") or a macro average ("avg")."""

    key: str  # data_source for benchmarks; "id_avg" / "ood_avg" for averages
    header: str  # the paper's column header
    kind: str  # "id", "ood" or "avg"


# Order and headers exactly as in the paper's Tables 1 and 5 (docs/paper_results.md).
PAPER_COLUMNS: tuple[Column, ...] = (
    Column("aime", "AIME24", "id"),
    Column("aime25", "AIME25", "id"),
    Column("amc", "AMC", "id"),
    Column("math", "MATH-500", "id"),
    Column("minerva", "Minerva", "id"),
    Column("olympiad_bench", "Olympiad", "id"),
    Column("id_avg", "ID Avg", "avg"),
    Column("arc_c", "ARC-c", "ood"),
    Column("gpqa", "GPQA*", "ood"),
    Column("mmlu_pro", "MMLU-Pro", "ood"),
    Column("ood_avg", "OOD Avg", "avg"),
)
ID_BENCHMARKS: tuple[str, ...] = tuple(c.key for c in PAPER_COLUMNS if c.kind == "id")
OOD_BENCHMARKS: tuple[str, ...] = tuple(c.key for c in PAPER_COLUMNS if c.kind == "ood")
AVERAGES: dict[str, tuple[str, ...]] = {"id_avg": ID_BENCHMARKS, "ood_avg": OOD_BENCHMARKS}

# Samples per question in the protocol: avg@32 on AIME24/AIME25/AMC, one sample elsewhere (docs/algorithm.md §12).
PROTOCOL_SAMPLES_PER_QUESTION: dict[str, int] = {"aime": 32, "aime25": 32, "amc": 32}

# Other spellings of the data_source values seen in public eval sets, mapped to the keys above.
DATA_SOURCE_ALIASES: dict[str, str] = {
    "aime24": "aime",
    "aime_2024": "aime",
    "aime2024": "aime",
    "aime_2025": "aime25",
    "aime2025": "aime25",
    "amc23": "amc",
    "math500": "math",
    "math-500": "math",
    "math_500": "math",
    "olympiadbench": "olympiad_bench",
    "olympiad": "olympiad_bench",
    "minerva_math": "minerva",
    "arc-c": "arc_c",
    "arc_challenge": "arc_c",
    "gpqa_diamond": "gpqa",
    "gpqa-diamond": "gpqa",
    "mmlu-pro": "mmlu_pro",
    "mmlupro": "mmlu_pro",
}


def canonical_benchmark(data_source: str) -> str:
    """Map a ``data_source`` value to the benchmark key used in the tables (unknown values pass through)."""
    key = str(data_source).strip().lower()
    return DATA_SOURCE_ALIASES.get(key, key)


def protocol_samples_per_question(data_source: str) -> int:
    """Samples per question the paper's protocol uses for this benchmark (32 for AIME24/AIME25/AMC, else 1)."""
    return PROTOCOL_SAMPLES_PER_QUESTION.get(canonical_benchmark(data_source), 1)


# --- estimators ----------------------------------------------------------------------------------------------


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k for one question with ``n`` samples of which ``c`` are correct (Chen et al. 2021).

    pass@k = 1 - C(n-c, k) / C(n, k), computed as 1 - prod_{i=n-c+1}^{n} (1 - k/i) so that no large
    binomial coefficient is formed.
    """
    if n < 1 or k < 1:
        raise ValueError(f"pass_at_k needs n >= 1 and k >= 1, got n={n}, k={k}")
    if not 0 <= c <= n:
        raise ValueError(f"pass_at_k needs 0 <= c <= n, got c={c}, n={n}")
    if k > n:
        raise ValueError(f"pass_at_k needs k <= n (k={k} samples asked of n={n} drawn)")
    if n - c < k:  # every size-k subset contains a correct sample
        return 1.0
    prod = 1.0
    for i in range(n - c + 1, n + 1):
        prod *= 1.0 - k / i
    return 1.0 - prod


def avg_at_k(per_question_scores: Iterable[Sequence[float]]) -> float:
    """Mean over questions of the mean score over each question's samples (avg@k; pass@1 when k = 1)."""
    means = []
    for scores in per_question_scores:
        if len(scores) == 0:
            raise ValueError("avg_at_k got a question with no samples")
        means.append(math.fsum(scores) / len(scores))
    if not means:
        raise ValueError("avg_at_k got no questions")
    return math.fsum(means) / len(means)


def default_ks(n: int) -> list[int]:
    """The k values reported for pass@k: powers of two up to the smallest sample count, plus that count."""
    ks, k = [], 1
    while k <= n:
        ks.append(k)
        k *= 2
    if n >= 1 and ks[-1] != n:
        ks.append(n)
    return ks


# --- per-benchmark summary -----------------------------------------------------------------------------------


@dataclass
class BenchmarkMetrics:
    """Metrics of one benchmark. Accuracies are in percent, like the paper's tables.

    ``score`` is the number that goes into the paper-style table: avg@k with k the samples per question
    (avg@32 for AIME/AMC under the protocol, pass@1 = avg@1 otherwise).
    """

    benchmark: str
    num_questions: int
    num_samples: int
    samples_per_question: int  # the smallest count over questions (all equal under the protocol)
    max_samples_per_question: int
    score: float
    pass_at_1: float
    pass_at_k: dict[int, float] = field(default_factory=dict)
    truncated_fraction: float | None = None  # share of samples that hit the max-new-tokens limit
    outcomes: dict[str, int] | None = None  # grader outcome counts (correct, wrong, no_think, ...) when reported
    tools: dict[str, float] | None = None  # a multi-turn run's tool figures (grading.tool_figures)

    @property
    def metric_name(self) -> str:
        k = self.samples_per_question
        return "pass@1" if k == 1 else f"avg@{k}"

    def to_dict(self) -> dict:
        d = asdict(self)
        d["metric"] = self.metric_name
        d["pass_at_k"] = {str(k): v for k, v in self.pass_at_k.items()}
        return d

    @classmethod
    def from_dict(cls, d: Mapping) -> BenchmarkMetrics:
        known = {f for f in cls.__dataclass_fields__}
        kwargs = {k: v for k, v in d.items() if k in known}
        kwargs["pass_at_k"] = {int(k): float(v) for k, v in d.get("pass_at_k", {}).items()}
        return cls(**kwargs)


def compute_benchmark_metrics(
    benchmark: str,
    per_question_scores: Mapping[object, Sequence[float]],
    *,
    ks: Sequence[int] | None = None,
    truncated: int | None = None,
) -> BenchmarkMetrics:
    """Summarise one benchmark from ``{question key: [score of each sample]}`` (scores in [0, 1]).

    A sample counts as correct for pass@k when its score is >= 0.5 (the grader returns 0 or 1).
    """
    if not per_question_scores:
        raise ValueError(f"benchmark {benchmark!r} has no graded samples")
    groups = list(per_question_scores.values())
    counts = [len(g) for g in groups]
    n_min, n_max = min(counts), max(counts)
    if n_min < 1:
        raise ValueError(f"benchmark {benchmark!r} has a question with no samples")
    ks = list(ks) if ks is not None else default_ks(n_min)
    bad = [k for k in ks if k > n_min]
    if bad:
        raise ValueError(f"benchmark {benchmark!r}: pass@k asked for k={bad} > samples per question ({n_min})")
    correct = [sum(1 for s in g if s >= 0.5) for g in groups]
    pak = {k: 100.0 * math.fsum(pass_at_k(n, c, k) for n, c in zip(counts, correct)) / len(groups) for k in ks}
    n_samples = sum(counts)
    return BenchmarkMetrics(
        benchmark=benchmark,
        num_questions=len(groups),
        num_samples=n_samples,
        samples_per_question=n_min,
        max_samples_per_question=n_max,
        score=100.0 * avg_at_k(groups),
        pass_at_1=100.0 * math.fsum(c / n for n, c in zip(counts, correct)) / len(groups),
        pass_at_k=pak,
        truncated_fraction=None if truncated is None else truncated / n_samples,
    )


@dataclass(frozen=True)
class MacroAverage:
    """A macro average over the benchmark columns that were evaluated (``complete`` when all of them were)."""

    value: float | None
    columns: tuple[str, ...]
    expected: tuple[str, ...]

    @property
    def complete(self) -> bool:
        return set(self.columns) == set(self.expected)


def macro_average(scores: Mapping[str, float], benchmarks: Sequence[str]) -> MacroAverage:
    """Unweighted mean of ``scores`` over ``benchmarks`` present in it (the paper's ID Avg / OOD Avg)."""
    present = tuple(b for b in benchmarks if b in scores and scores[b] is not None)
    value = math.fsum(scores[b] for b in present) / len(present) if present else None
    return MacroAverage(value=value, columns=present, expected=tuple(benchmarks))


def macro_averages(scores: Mapping[str, float]) -> dict[str, MacroAverage]:
    """ID and OOD macro averages of per-benchmark scores keyed by benchmark."""
    return {name: macro_average(scores, members) for name, members in AVERAGES.items()}
