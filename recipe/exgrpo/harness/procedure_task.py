"""The procedure-choice task: a sum the tiny model can get right, if it picks the careful of two procedures it knows.

Built for ExGRPO's mechanism (docs/learning.md, "Where replay helps"): successes on the medium and hard questions are
rare at the start, the knowledge to succeed is already in the model, and what RL has to learn is to use it. The
warm-up (``recipe.exgrpo.harness.assets`` with a :class:`ProcedureSpec`) teaches two ways to answer a two-digit sum,
each announced in the think block before the answer:

- ``careful</think>\\boxed{72}``: the column addition with its carries (27 + 45 = 72);
- ``quick</think>\\boxed{62}``: the column addition that drops every carry into the next column (the leading column
  keeps its whole digit sum: 78 + 45 gives 113 instead of 123), the classic slip.

A ``careful_share`` of the warm-up examples (15 % by default) is careful, on every level alike, so the warmed-up
model announces ``careful`` on about that share of its answers whatever the question. Both procedures give the same
sum when no column carries, so the levels are cut by the carries (:data:`PROCEDURE_LEVELS`):

- easy: no column carries; both procedures are right;
- medium: the units column carries, the tens column does not (27 + 45); only the careful procedure is right;
- hard: both columns carry (78 + 45 = 123); only the careful procedure is right, and its three-digit sum is harder.

The think block is always closed in the warm-up (the format is right at step 0), so what the think-gated reward
rewards is the sum, and what RL can raise on the medium and hard levels is the share of careful answers times how well
the careful procedure adds. The criteria the task must meet before any comparison runs on it (pass@8 well above
pass@1 on medium, a third of the groups without reward variance, the think block closed) are measured by
:func:`procedure_report` into the assets' report and checked by :func:`criteria_problems`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from data_preprocess.toy_arithmetic import Difficulty, QuestionFamily, ToyArithmeticConfig
from exgrpo.reward.extract import THINK_CLOSE, last_boxed

CAREFUL = "careful"
QUICK = "quick"
PROCEDURES = (CAREFUL, QUICK)

#: the task's levels, cut by the carries of a two-digit sum (none / the units only / both columns)
PROCEDURE_LEVELS: tuple[Difficulty, ...] = (
    Difficulty("easy", (QuestionFamily("+", 10, 99, 10, 99, carry="none"),)),
    Difficulty("medium", (QuestionFamily("+", 10, 99, 10, 99, carry="units"),)),
    Difficulty("hard", (QuestionFamily("+", 10, 99, 10, 99, carry="all"),)),
)
#: its rows' data source prefix (verl's validation metrics per level: ``val-core/procedures_medium/...``)
PROCEDURE_DATA_SOURCE = "procedures"
PROCEDURE_DATA = ToyArithmeticConfig(levels=PROCEDURE_LEVELS, data_source=PROCEDURE_DATA_SOURCE)

#: what a CPU run on the task changes from the demo's settings: room for its longest answer,
#: "careful</think>\\boxed{123}<|im_end|>" (27 tokens)
PROCEDURE_RUN_SETTINGS: dict = {"max_response_length": 32}
#: the settings each CPU task changes in a run (the benchmarks' ``--task``): the demo's sums change nothing
TASK_RUN_SETTINGS: dict[str, dict] = {"sums": {}, "procedures": PROCEDURE_RUN_SETTINGS}

#: what the task must show after the warm-up, before a comparison is run on it (docs/learning.md)
CRITERIA = {
    # pass@8 - pass@1 on the medium level: the success is in the model, rare per sample
    "medium_pass_at_k_gap_min": 0.3,
    # the share of questions (groups of K) whose K samples all score alike, at step 0
    "zero_variance_share_min": 1 / 3,
    # the answers that close the think block: the format is not what RL gains
    "think_closed_min": 0.95,
}


@dataclass(frozen=True)
class ProcedureSpec:
    """What the warm-up teaches about the two procedures (part of the assets' digest when set)."""

    # share of the warm-up examples that follow the careful procedure, drawn from every level alike
    careful_share: float = 0.15

    def __post_init__(self) -> None:
        if not 0.0 < self.careful_share < 1.0:
            raise ValueError(f"ProcedureSpec.careful_share must be in (0, 1), got {self.careful_share}")


def quick_sum(a: int, b: int) -> int:
    """``a + b`` with every carry into the next column dropped; the leading column keeps its whole digit sum."""
    out, place = 0, 1
    while a >= 10 or b >= 10:
        out += (a % 10 + b % 10) % 10 * place
        a, b, place = a // 10, b // 10, place * 10
    return out + (a + b) * place


def procedure_response(procedure: str, a: int, b: int) -> str:
    """The response text of ``procedure`` for ``a + b`` (the warm-up's target, without the end-of-turn token)."""
    if procedure not in PROCEDURES:
        raise ValueError(f"procedure must be one of {PROCEDURES}, got {procedure!r}")
    value = a + b if procedure == CAREFUL else quick_sum(a, b)
    return f"{procedure}{THINK_CLOSE}\\boxed{{{value}}}"


def procedure_of(text: str) -> str | None:
    """The procedure a response announced (its think block's text), or None for any other."""
    head = text.split(THINK_CLOSE, 1)[0].strip()
    return head if head in PROCEDURES else None


def score_sample(text: str, ground_truth: str) -> dict[str, bool]:
    """One response's figures: think block closed, careful announced, right (the think-gated reward)."""
    closed = THINK_CLOSE in text
    right = closed and last_boxed(text.rsplit(THINK_CLOSE, 1)[1]) == ground_truth
    return {"closed": closed, "careful": procedure_of(text) == CAREFUL, "correct": right}


def procedure_report(rows: list[dict], samples: list[list[str]]) -> dict[str, Any]:
    """The criteria figures per level and overall from ``samples[j][i]``, the j-th sampled response to row i.

    pass@1 is the mean success rate, pass@K the share of questions with at least one success in K, the zero-variance
    share the share of questions whose K samples all score alike (GRPO gives their group no gradient), plus the
    share of answers that close the think block, that announce the careful procedure, and the careful answers'
    success rate (how well the procedure the RL should pick adds).
    """
    k = len(samples)
    per_row = []
    for i, row in enumerate(rows):
        scored = [score_sample(samples[j][i], row["reward_model"]["ground_truth"]) for j in range(k)]
        per_row.append((row["extra_info"].get("difficulty", "all"), scored))

    def figures(items: list[list[dict[str, bool]]]) -> dict[str, Any]:
        flat = [s for scored in items for s in scored]
        n = max(1, len(flat))
        successes = [sum(s["correct"] for s in scored) for scored in items]
        careful = [s for s in flat if s["careful"]]
        return {
            "questions": len(items),
            "pass_at_1": sum(successes) / n,
            f"pass_at_{k}": sum(c > 0 for c in successes) / max(1, len(items)),
            "zero_variance_share": sum(c in (0, k) for c in successes) / max(1, len(items)),
            "think_closed": sum(s["closed"] for s in flat) / n,
            "careful_share": len(careful) / n,
            "careful_pass_rate": sum(s["correct"] for s in careful) / len(careful) if careful else float("nan"),
            "success_count_histogram": [sum(c == j for c in successes) for j in range(k + 1)],
        }

    levels: dict[str, list] = {}
    for level, scored in per_row:
        levels.setdefault(level, []).append(scored)
    return {
        "samples_per_question": k,
        **figures([s for _, s in per_row]),
        "per_level": {level: figures(items) for level, items in levels.items()},
    }


def criteria_problems(report: dict[str, Any]) -> list[str]:
    """What the report of a built procedure task falls short of in :data:`CRITERIA` (empty: every one is met)."""
    k = report["samples_per_question"]
    problems = []
    medium = report["per_level"].get("medium")
    if medium is None:
        problems.append("the report has no medium level")
    else:
        gap = medium[f"pass_at_{k}"] - medium["pass_at_1"]
        if gap < CRITERIA["medium_pass_at_k_gap_min"]:
            problems.append(
                f"medium pass@{k} - pass@1 = {gap:.3f} < {CRITERIA['medium_pass_at_k_gap_min']} (the success is not "
                "latent enough for RL to sharpen)"
            )
    if report["zero_variance_share"] < CRITERIA["zero_variance_share_min"]:
        problems.append(
            f"zero-variance groups at step 0: {report['zero_variance_share']:.3f} < "
            f"{CRITERIA['zero_variance_share_min']:.3f}"
        )
    if report["think_closed"] < CRITERIA["think_closed_min"]:
        problems.append(
            f"think block closed in {report['think_closed']:.3f} of the answers < {CRITERIA['think_closed_min']} (the "
            "format would be part of what RL gains)"
        )
    return problems
