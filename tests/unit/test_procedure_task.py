"""The procedure-choice task (recipe/exgrpo/harness/procedure_task.py): its levels, its two procedures, its report and
its criteria, each criterion checked by a report that misses it; the built asset's report meets them (when the asset
is in this checkout's cache: building it takes minutes)."""

from __future__ import annotations

import copy

import pytest

from data_preprocess.toy_arithmetic import QuestionFamily, carry_columns, generate_splits, has_carry
from recipe.exgrpo.harness.assets import asset_spec, cache_root, manifest_problems
from recipe.exgrpo.harness.procedure_task import (
    CAREFUL,
    CRITERIA,
    PROCEDURE_DATA,
    PROCEDURE_LEVELS,
    QUICK,
    ProcedureSpec,
    criteria_problems,
    procedure_of,
    procedure_report,
    procedure_response,
    quick_sum,
    score_sample,
)


@pytest.mark.parametrize(
    ("a", "b", "columns"),
    [
        (23, 45, [False, False]),
        (27, 45, [True, False]),
        (78, 45, [True, True]),
        (52, 61, [False, True]),
        (95, 5, [True, True]),
    ],
)
def test_carry_columns_follow_the_column_addition(a, b, columns):
    assert carry_columns(a, b) == columns and has_carry(a, b) is any(columns)


def test_the_units_and_all_carry_modes():
    units = QuestionFamily("+", 10, 99, 10, 99, carry="units").questions()
    every = QuestionFamily("+", 10, 99, 10, 99, carry="all").questions()
    assert (27, "+", 45) in units and (78, "+", 45) not in units and (52, "+", 61) not in units
    assert (78, "+", 45) in every and (27, "+", 45) not in every
    # 45 units pairs carry; of the tens digits 1..9, 28 pairs stay below 9 and 53 reach it with the carry
    assert len(units) == 45 * 28 and len(every) == 45 * 53


def test_the_quick_sum_differs_from_the_sum_exactly_where_the_units_carry():
    levels = {level.name: level.questions() for level in PROCEDURE_LEVELS}
    assert [len(levels[n]) for n in ("easy", "medium", "hard")] == [1980, 1260, 2385]
    for name, questions in levels.items():
        same = [quick_sum(a, b) == a + b for a, _, b in questions]
        assert all(same) if name == "easy" else not any(same), name
    assert quick_sum(27, 45) == 62 and quick_sum(78, 45) == 113 and quick_sum(352, 461) == 713 and quick_sum(5, 7) == 12


def test_the_responses_and_what_a_sample_scores():
    assert procedure_response(CAREFUL, 27, 45) == "careful</think>\\boxed{72}"
    assert procedure_response(QUICK, 27, 45) == "quick</think>\\boxed{62}"
    with pytest.raises(ValueError, match="procedure must be one of"):
        procedure_response("guess", 1, 2)
    assert procedure_of("careful</think>\\boxed{1}") == CAREFUL and procedure_of("maybe</think>x") is None
    assert score_sample("careful</think>\\boxed{72}", "72") == {"closed": True, "careful": True, "correct": True}
    assert score_sample("quick</think>\\boxed{62}", "72")["correct"] is False
    # the think gate: a right box without a closed think block scores 0
    assert score_sample("careful\\boxed{72}", "72") == {"closed": False, "careful": False, "correct": False}
    with pytest.raises(ValueError, match="careful_share"):
        ProcedureSpec(careful_share=0.0)


def _rows(levels: list[str]) -> list[dict]:
    return [{"reward_model": {"ground_truth": "72"}, "extra_info": {"difficulty": lv}} for lv in levels]


RIGHT, WRONG = "careful</think>\\boxed{72}", "quick</think>\\boxed{62}"


def test_the_report_counts_pass_at_1_pass_at_k_and_the_groups_without_variance():
    rows = _rows(["easy", "medium", "medium"])
    # K = 4 samples: easy all right; medium q1 one right of 4; medium q2 none
    samples = [[RIGHT, RIGHT, WRONG], [RIGHT, WRONG, WRONG], [RIGHT, WRONG, WRONG], [RIGHT, WRONG, "no think"]]
    report = procedure_report(rows, samples)
    medium = report["per_level"]["medium"]
    assert medium["pass_at_1"] == pytest.approx(1 / 8) and medium["pass_at_4"] == 0.5
    assert medium["zero_variance_share"] == 0.5 and medium["success_count_histogram"] == [1, 1, 0, 0, 0]
    assert report["zero_variance_share"] == pytest.approx(2 / 3)  # easy (4 of 4) and medium q2 (0 of 4)
    assert report["think_closed"] == pytest.approx(11 / 12) and report["careful_share"] == pytest.approx(5 / 12)
    assert report["careful_pass_rate"] == 1.0 and report["samples_per_question"] == 4


def _meeting() -> dict:
    return {
        "samples_per_question": 8,
        "zero_variance_share": 0.4,
        "think_closed": 0.99,
        "per_level": {"medium": {"pass_at_1": 0.1, "pass_at_8": 0.6}},
    }


@pytest.mark.parametrize(
    ("fault", "named"),
    [
        (lambda r: r["per_level"]["medium"].update(pass_at_8=0.35), "medium pass@8 - pass@1 = 0.250"),
        (lambda r: r.update(zero_variance_share=0.2), "zero-variance groups at step 0: 0.200"),
        (lambda r: r.update(think_closed=0.9), "think block closed in 0.900"),
        (lambda r: r["per_level"].pop("medium"), "no medium level"),
    ],
)
def test_each_criterion_names_a_report_that_misses_it(fault, named):
    assert criteria_problems(_meeting()) == []
    report = copy.deepcopy(_meeting())
    fault(report)
    problems = criteria_problems(report)
    assert len(problems) == 1 and named in problems[0], problems


def test_the_task_is_its_own_asset_and_leaves_the_others_digests_alone():
    spec = asset_spec(procedures=True)
    assert spec.data is PROCEDURE_DATA and spec.warmup.unclosed_think_rate == 0.0
    assert spec.warmup.eval_max_new_tokens >= 28  # "careful</think>\boxed{123}" and the end of turn, sampled whole
    assert "procedures" not in asset_spec().to_dict() and "procedures" in spec.to_dict()
    assert len({spec.digest(), asset_spec().digest(), asset_spec(tools=True).digest()}) == 3
    with pytest.raises(ValueError, match="two tasks"):
        asset_spec(tools=True, procedures=True)
    val = generate_splits(PROCEDURE_DATA)["val"]
    assert {r["data_source"] for r in val} == {"procedures_easy", "procedures_medium", "procedures_hard"}


def test_the_built_asset_meets_the_criteria():
    """The report of the procedure task's asset as built on this machine (docs/learning.md has the figures); the
    benchmark refuses to compare arms on an asset that misses them."""
    root = cache_root() / asset_spec(procedures=True).digest()
    if not root.is_dir() or manifest_problems(root):
        pytest.skip(
            f"the procedure task's asset is not built here ({root}): python -m recipe.exgrpo.harness.assets "
            "--procedures"
        )
    import json

    report = json.loads((root / "assets.json").read_text())
    assert report["criteria_problems"] == [] == criteria_problems(report)
    medium = report["per_level"]["medium"]
    assert medium["pass_at_8"] - medium["pass_at_1"] >= CRITERIA["medium_pass_at_k_gap_min"]
    # what RL can raise: the careful answers are mostly right, and rare
    assert medium["careful_pass_rate"] > 0.5 and medium["careful_share"] < 0.3
