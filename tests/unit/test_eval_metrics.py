"""Metrics of the evaluation protocol (docs/algorithm.md §12): avg@k, unbiased pass@k, macro averages, the sample
plan, the grader adapter and the resumable generation file."""

import json
import math
import random

import pytest

from exgrpo.eval.generate import EvalRow, plan_samples, read_generations
from exgrpo.eval.grading import Grader, summarize
from exgrpo.eval.metrics import (
    ID_BENCHMARKS,
    OOD_BENCHMARKS,
    PAPER_COLUMNS,
    avg_at_k,
    canonical_benchmark,
    compute_benchmark_metrics,
    default_ks,
    macro_average,
    macro_averages,
    pass_at_k,
)


@pytest.mark.parametrize(
    ("n", "c", "k", "expected"),
    [
        (4, 1, 2, 1 - 3 / 6),  # 1 - C(3,2)/C(4,2)
        (5, 2, 2, 1 - 3 / 10),  # 1 - C(3,2)/C(5,2)
        (5, 2, 3, 1 - 1 / 10),  # 1 - C(3,3)/C(5,3)
        (4, 3, 2, 1.0),  # every pair holds a correct sample
        (10, 0, 5, 0.0),
        (8, 8, 8, 1.0),
        (32, 4, 1, 4 / 32),  # pass@1 = c/n
        (32, 1, 32, 1.0),
    ],
)
def test_pass_at_k_hand_computed(n, c, k, expected):
    assert pass_at_k(n, c, k) == pytest.approx(expected, abs=1e-12)


def test_pass_at_k_matches_binomial_form_and_stays_finite_for_large_n():
    rng = random.Random(0)
    for _ in range(200):
        n = rng.randint(1, 60)
        c = rng.randint(0, n)
        k = rng.randint(1, n)
        exact = 1 - math.comb(n - c, k) / math.comb(n, k)
        assert pass_at_k(n, c, k) == pytest.approx(exact, abs=1e-12), (n, c, k)
    # C(1000, 500) overflows a float; the product form does not need it.
    v = pass_at_k(1000, 3, 500)
    assert v == pytest.approx(1 - (500 * 499 * 498) / (1000 * 999 * 998), rel=1e-12)


@pytest.mark.parametrize(("n", "c", "k"), [(4, 5, 1), (4, -1, 1), (4, 1, 5), (0, 0, 1), (4, 1, 0)])
def test_pass_at_k_rejects_bad_arguments(n, c, k):
    with pytest.raises(ValueError, match="pass_at_k"):
        pass_at_k(n, c, k)


def test_avg_at_k_is_mean_of_per_question_means():
    # (2/4 + 4/4 + 0/1) / 3
    assert avg_at_k([[1, 0, 0, 1], [1, 1, 1, 1], [0]]) == pytest.approx(0.5)
    assert avg_at_k([[0.0], [1.0], [1.0], [0.0]]) == pytest.approx(0.5)  # pass@1 with one sample
    with pytest.raises(ValueError, match="no samples"):
        avg_at_k([[1], []])


def test_benchmark_metrics_hand_computed():
    m = compute_benchmark_metrics("aime", {"q1": [1, 0, 0, 0], "q2": [0, 1, 1, 0]}, truncated=2)
    assert m.num_questions == 2 and m.num_samples == 8 and m.samples_per_question == 4
    assert m.metric_name == "avg@4"
    assert m.score == pytest.approx(100 * (1 / 4 + 2 / 4) / 2)  # 37.5
    assert m.pass_at_1 == pytest.approx(m.score)
    assert sorted(m.pass_at_k) == [1, 2, 4]
    assert m.pass_at_k[2] == pytest.approx(100 * ((1 - 3 / 6) + (1 - 1 / 6)) / 2)
    assert m.pass_at_k[4] == pytest.approx(100.0)
    assert m.truncated_fraction == pytest.approx(2 / 8)
    single = compute_benchmark_metrics("math", {"a": [1], "b": [0], "c": [0], "d": [1]})
    assert single.metric_name == "pass@1" and single.score == pytest.approx(50.0)
    with pytest.raises(ValueError, match="k=\\[8\\]"):
        compute_benchmark_metrics("amc", {"q": [1, 0]}, ks=[8])


def test_default_ks():
    assert default_ks(32) == [1, 2, 4, 8, 16, 32]
    assert default_ks(6) == [1, 2, 4, 6]
    assert default_ks(1) == [1]


def test_macro_averages_follow_the_paper_columns():
    assert [c.header for c in PAPER_COLUMNS] == [
        "AIME24", "AIME25", "AMC", "MATH-500", "Minerva", "Olympiad", "ID Avg", "ARC-c", "GPQA*", "MMLU-Pro", "OOD Avg",
    ]  # fmt: skip
    scores = dict(zip(ID_BENCHMARKS + OOD_BENCHMARKS, [10.0, 20, 30, 40, 50, 60, 70, 80, 93]))
    avgs = macro_averages(scores)
    assert avgs["id_avg"].value == pytest.approx(35.0) and avgs["id_avg"].complete
    assert avgs["ood_avg"].value == pytest.approx(81.0) and avgs["ood_avg"].complete
    part = macro_average({"arc_c": 40.0, "gpqa": 20.0}, OOD_BENCHMARKS)
    assert part.value == pytest.approx(30.0) and not part.complete and part.columns == ("arc_c", "gpqa")
    assert macro_average({}, OOD_BENCHMARKS).value is None


def test_canonical_benchmark_aliases():
    assert canonical_benchmark("AIME24") == "aime"
    assert canonical_benchmark("gpqa_diamond") == "gpqa"
    assert canonical_benchmark("MATH-500") == "math"
    assert canonical_benchmark("olympiad_bench") == "olympiad_bench"


def _row(i, bench, q):
    return EvalRow(row=i, data_source=bench, benchmark=bench, question_id=q, messages=[], ground_truth="1")


def test_sample_plan_reaches_avg_at_32_for_repeated_and_single_rows():
    repeated = [_row(i, "aime", "q0") for i in range(32)] + [_row(32, "math", "m0")]
    assert set(plan_samples(repeated).values()) == {1}  # test_id.parquet: already 32 rows per question
    eight = [_row(i, "amc", "q0") for i in range(8)]
    assert sum(plan_samples(eight).values()) == 32  # valid_id.parquet repeats AIME 8x: 4 samples per row
    single = [_row(0, "aime25", "q0"), _row(1, "gpqa", "g0")]
    assert plan_samples(single) == {0: 32, 1: 1}
    assert plan_samples(single, n_samples=3) == {0: 3, 1: 3}


def test_summarize_groups_repeated_rows_by_question():
    graded = [
        {"benchmark": "aime", "question_id": "q0", "row": r, "sample": 0, "score": float(r < 1)} for r in range(4)
    ] + [{"benchmark": "aime", "question_id": "q1", "row": 10 + r, "sample": 0, "score": 1.0} for r in range(4)]
    graded[0]["finish_reason"] = "length"
    for g in graded:
        g["outcome"] = "correct" if g["score"] else "no_think"
    m = summarize(graded)["aime"]
    assert m.num_questions == 2 and m.samples_per_question == 4
    assert m.score == pytest.approx(100 * (0.25 + 1.0) / 2)
    assert m.truncated_fraction == pytest.approx(1 / 8)
    assert m.outcomes == {"correct": 5, "no_think": 3}


def test_grader_adapter_think_gate_and_return_types():
    seen = {}

    def plain(response, ground_truth):
        seen["response"] = response
        return ground_truth in response

    g = Grader(spec="test:plain", fn=plain, think_gate=True, grading="reward")
    assert g("no think block \\boxed{3}", "3") == 0.0  # gated: never closed </think>
    assert g("<think>3?</think> so \\boxed{4}", "3") == 0.0  # only the text after </think> is graded
    assert seen["response"] == " so \\boxed{4}"
    assert g("<think>...</think> \\boxed{3}", "3") == 1.0
    assert Grader(spec="test:plain", fn=plain, think_gate=False, grading="reward")("\\boxed{3}", "3") == 1.0

    calls = {}

    def gated(response, ground_truth, *, data_source=None, think_gate=True, timeout_s=1.0):
        calls.update(data_source=data_source, think_gate=think_gate, timeout_s=timeout_s)
        return {"score": 1.0, "acc": False}

    g2 = Grader(spec="test:gated", fn=gated, think_gate=False, timeout_s=3.0, grading="reward")
    assert g2("x", "y", "gpqa") == 0.0  # "acc" wins over a shaped "score"
    assert calls == {"data_source": "gpqa", "think_gate": False, "timeout_s": 3.0}  # the checker gates itself
    assert g2.describe()["think_gate"] is False and g2.describe()["spec"] == "test:gated"

    with pytest.raises(TypeError, match="test:bad"):
        Grader(spec="test:bad", fn=lambda r, gt: "yes", think_gate=False, grading="reward")("a", "b")
    with pytest.raises(ImportError, match="no_such_module_xyz"):
        Grader(spec="no_such_module_xyz:score")


def test_generation_file_drops_a_torn_last_line(tmp_path):
    path = tmp_path / "gen.jsonl"
    good = [{"row": r, "sample": 0, "response": str(r)} for r in range(3)]
    path.write_text("".join(json.dumps(x) + "\n" for x in good) + '{"row": 3, "sam', encoding="utf-8")
    assert sorted(read_generations(path)) == [(0, 0), (1, 0), (2, 0)]
    read_generations(path, repair=True)
    assert path.read_text(encoding="utf-8").endswith("}\n")  # the torn tail is cut
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"row": 0, "sample": 0}\nnot json\n{"row": 1, "sample": 0}\n', encoding="utf-8")
    with pytest.raises(ValueError, match="line 2"):
        read_generations(bad)


def test_default_grader_is_the_reward_checker_with_outcomes():
    pytest.importorskip("exgrpo.reward")
    records = [
        {"response": "<think>2+2</think> so \\boxed{4}", "ground_truth": "4", "data_source": "math"},
        {"response": "\\boxed{4}", "ground_truth": "4", "data_source": "math"},  # never closed </think>
        {"response": "<think>hm</think> ANSWER: B", "ground_truth": "B", "data_source": "gpqa"},
    ]
    gated = Grader(think_gate=True, timeout_s=5.0, grading="reward")
    assert gated.describe()["spec"] == "exgrpo.reward:score"
    assert gated.grade_many(records) == [(1.0, "correct"), (0.0, "no_think"), (1.0, "correct")]
    assert Grader(think_gate=False, timeout_s=5.0, grading="reward").grade_many(records[1:2]) == [(1.0, "correct")]
    # the single-answer path agrees with the batch path
    assert [gated(r["response"], r["ground_truth"], r["data_source"]) for r in records] == [1.0, 0.0, 1.0]
    # the default, the paper's rule: no </think> is fine, no \boxed{} is wrong
    paper = Grader(timeout_s=5.0)
    assert paper.grade_many(records) == [(1.0, "correct"), (1.0, "correct"), (0.0, "no_boxed")]
