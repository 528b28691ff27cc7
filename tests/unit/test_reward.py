"""The verifiable reward (exgrpo.reward, recipe/exgrpo/reward.py): extraction, grading rules, timeout, no raising."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from exgrpo.reward import (
    GraderPool,
    canonical_answer,
    choice_labels,
    extract_choice_label,
    grade,
    grade_batch,
    is_multiple_choice,
    last_boxed,
    reset_reward_stats,
    reward_stats,
    score,
    split_after_think,
)
from exgrpo.reward.extract import DIGIT_LABELS, LETTER_LABELS
from recipe.exgrpo.reward import compute_score, to_verl_dict

# sympy evaluates this power tower exactly: it never finishes, inside C code that holds the GIL.
HANG = "<think>x</think> \\boxed{9^{9^{9^{9}}}}"


# ------------------------------------------------------------------------------------------------ extraction


def test_split_after_think_takes_text_after_the_last_marker():
    assert split_after_think("a</think>b</think> final") == " final"
    assert split_after_think("<think>never closed \\boxed{1}") is None
    assert split_after_think("</think>") == ""


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("so \\boxed{\\frac{1}{2}}.", "\\frac{1}{2}"),
        ("\\boxed{1} then \\boxed{2}", "2"),
        ("\\boxed{a} and \\fbox{b}", "b"),
        ("\\fbox{x} and \\boxed{\\{1,2\\}}", "\\{1,2\\}"),  # escaped braces are not groups
        ("\\boxed{\\left( 3, \\frac{\\pi}{2} \\right)}", "\\left( 3, \\frac{\\pi}{2} \\right)"),
        ("\\boxed{7} then truncated \\boxed{\\frac{1}{", "7"),  # an unclosed last box is skipped
        ("answer: \\boxed 5$ done", "5"),  # MATH's brace-less form
        ("\\boxedsymbol{3}", None),
        ("no box at all", None),
        ("\\boxed{}", ""),
    ],
)
def test_last_boxed(text, expected):
    assert last_boxed(text) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("so the answer is \\boxed{B}", "B"),
        ("\\boxed{(C)}", "C"),
        ("\\boxed{\\text{D}}", "D"),
        ("\\boxed{\\textbf{(A)}}", "A"),
        ("\\boxed{b}", "B"),  # a lone boxed lower-case letter
        ("\\boxed{B) 10^-11 eV}", "B"),
        ("\\boxed{Option C}", "C"),
        ("reasoning...\nANSWER: B", "B"),
        ("The answer is (C).", "C"),
        ("Answer: **D**", "D"),
        ("the answer is A, wait no. Final answer: $C$", "C"),  # last phrase wins
        ("Option (A) is wrong and (B) is wrong.\n(D)", "D"),  # final line only
        ("lots of thinking\nB.", "B"),
        ("lots of thinking\nC) Planetary days will become shorter.", "C"),
        ("Option (A) is wrong, (C) looks right", None),  # mentions in running text are no answer
        ("A good question.", None),  # a sentence starting with the article "A"
        ("the answer is a tricky one", None),  # lower case outside a box
        ("\\boxed{a + b}", None),  # a boxed expression is not option A
        ("", None),
    ],
)
def test_extract_choice_label_letters(text, expected):
    assert extract_choice_label(text, LETTER_LABELS) == expected


def test_extract_choice_label_digits_and_label_sets():
    assert extract_choice_label("\\boxed{2}", DIGIT_LABELS) == "2"
    assert extract_choice_label("The answer is 3", DIGIT_LABELS) == "3"
    assert extract_choice_label("\\boxed{K}", LETTER_LABELS) is None  # MMLU-Pro stops at J
    assert choice_labels("C") == LETTER_LABELS and choice_labels(" (b) ") == LETTER_LABELS
    assert choice_labels("4") == DIGIT_LABELS
    assert choice_labels("42") is None and choice_labels("\\frac12") is None
    with pytest.raises(ValueError, match="labels"):
        extract_choice_label("B", "ABC")


def test_answer_phrase_scan_stays_linear_on_pathological_text():
    # long whitespace runs after "answer" would make a naive regex quadratic; the window bounds it
    text = ("answer" + " " * 5000) * 200 + "\nB"
    assert extract_choice_label(text, LETTER_LABELS) == "B"


def test_canonical_answer_drops_only_what_latex_ignores():
    assert canonical_answer(" \\left( 1,\\ 2 \\right) ") == canonical_answer("(1,2)")
    assert canonical_answer("$42$.") == "42"
    assert canonical_answer("\\leftarrow") != canonical_answer("arrow")
    assert canonical_answer("12") != canonical_answer("1.2")


def test_is_multiple_choice_by_data_source():
    for ds in ("arc_c", "gpqa", "gpqa_diamond", "mmlu_pro", "MMLU-Pro", "mmlu_pro_physics"):
        assert is_multiple_choice(ds), ds
    for ds in (None, "", "math", "aime", "arc_easy_math", "toy_arithmetic", "gpqax"):
        assert not is_multiple_choice(ds), ds
    assert is_multiple_choice("my_mc", sources=("my_mc",))


# ------------------------------------------------------------------------------------------------- grading


@pytest.mark.parametrize(
    ("response", "gt"),
    [
        ("<think>x</think> so \\boxed{\\frac{1}{2}}", "0.5"),
        ("<think>x</think> \\boxed{x+1}", "1+x"),
        ("<think>x</think> \\boxed{\\dfrac{14}{3}}", "\\frac{14}{3}"),
        ("<think>x</think> \\boxed{142}", "142.0"),
        ("<think>x</think> \\boxed{(1, 2]}", "(1,2]"),
        ("<think>x</think> The answer is $3$.", "3"),  # no box: math-verify's own extraction
    ],
)
def test_math_equivalence_scores_one(response, gt):
    result = grade(response, gt, exact_shortcut=False)
    assert result.score == 1.0 and result.outcome == "correct", result


@pytest.mark.parametrize(
    ("response", "gt"),
    [
        ("<think>x</think> \\boxed{\\frac{1}{3}}", "0.5"),
        ("<think>x</think> \\boxed{4} and later \\boxed{5}", "4"),  # the last box counts
        ("<think>\\boxed{4}</think> nothing boxed after", "4"),  # the box inside the think block is ignored
        ("<think>x</think> \\boxed{x-1}", "1+x"),
    ],
)
def test_wrong_answers_score_zero(response, gt):
    assert grade(response, gt).score == 0.0


def test_think_gate_on_and_off():
    no_close = "I think the answer is \\boxed{7}"
    on = grade(no_close, "7", think_gate=True)
    off = grade(no_close, "7", think_gate=False)
    assert (on.score, on.outcome, on.think_closed) == (0.0, "no_think", False)
    assert (off.score, off.outcome) == (1.0, "correct")
    # with the gate off the whole response is read, so the last box wins even across </think>
    assert grade("\\boxed{7}</think>\\boxed{8}", "8", think_gate=False).score == 1.0
    assert grade("<think>\\boxed{7}</think>", "7", think_gate=False).think_closed


def test_multiple_choice_by_data_source_and_fallbacks():
    assert grade("<think>x</think> ANSWER: B", "B", data_source="gpqa").score == 1.0
    assert grade("<think>x</think> \\boxed{C}", "B", data_source="arc_c").score == 0.0
    assert grade("<think>x</think> \\boxed{2}", "2", data_source="arc_c").score == 1.0  # numbered ARC options
    # an MC source whose ground truth is no option label is graded as math
    assert grade("<think>x</think> \\boxed{0.5}", "\\frac{1}{2}", data_source="mmlu_pro").score == 1.0
    # a letter answer on a math source is not read as an option
    assert grade("<think>x</think> The answer is B", "B", data_source="math").outcome != "correct"
    none = grade("<think>x</think> I am not sure", "B", data_source="gpqa")
    assert none.outcome == "no_answer" and none.score == 0.0


def test_ground_truth_forms():
    response = "<think>x</think> \\boxed{12}"
    assert score(response, ["11", "12"]) == 1.0  # a list holds alternatives
    assert score(response, 12) == 1.0
    assert score(response, ("13",)) == 0.0
    assert grade("<think>x</think> \\boxed{B}", ["B"], data_source="gpqa").score == 1.0


def test_bad_inputs_score_zero_and_are_counted_not_raised():
    reset_reward_stats()
    results = [
        grade("<think>x</think> \\boxed{1}", ""),
        grade("<think>x</think> \\boxed{1}", None),
        grade("<think>x</think> \\boxed{1}", [["1"]]),
        grade(None, "1"),  # type: ignore[arg-type]
        grade(b"bytes", "1"),  # type: ignore[arg-type]
    ]
    assert [r.outcome for r in results] == ["error"] * 5
    assert all(r.score == 0.0 and r.error for r in results)
    assert "empty ground truth" in results[0].error
    stats = reward_stats()
    assert stats["error"] == 5 and stats["calls"] == 5


def test_verl_dict_has_the_same_keys_for_every_outcome():
    results = [
        grade("<think>x</think> \\boxed{1}", "1"),
        grade("<think>x</think> \\boxed{2}", "1"),
        grade("no close", "1"),
        grade("<think>x</think>", "1"),
        grade("<think>x</think> \\boxed{1}", ""),
    ]
    assert {r.outcome for r in results} == {"correct", "wrong", "no_think", "no_answer", "error"}
    key_sets = {tuple(sorted(to_verl_dict(r))) for r in results}
    assert key_sets == {("acc", "pred", "reward_error", "reward_queue_s", "reward_timeout", "score", "think_closed")}
    for r in results:
        d = to_verl_dict(r)
        assert isinstance(d["pred"], str)
        assert all(isinstance(v, float) for k, v in d.items() if k != "pred")


# ------------------------------------------------------------------------------------------------- timeout


def test_hanging_check_times_out_and_the_pool_recovers():
    pool = GraderPool(max_workers=1)
    try:
        reset_reward_stats()
        hung = grade(HANG, "1", timeout_s=1.0, pool=pool, exact_shortcut=False)
        assert (hung.score, hung.outcome) == (0.0, "timeout")
        assert to_verl_dict(hung)["reward_timeout"] == 1.0
        assert pool.killed == 1
        after = grade("<think>x</think> \\boxed{\\sqrt{4}}", "2", timeout_s=30.0, pool=pool, exact_shortcut=False)
        assert after.score == 1.0 and pool.started == 2
        assert reward_stats()["timeout"] == 1
    finally:
        pool.close()


def test_a_worker_killed_from_outside_scores_error_once_then_recovers():
    pool = GraderPool(max_workers=1)
    try:
        assert grade("<think>x</think> \\boxed{2/4}", "0.5", pool=pool).score == 1.0
        (worker,) = list(pool._live)
        worker.process.kill()
        worker.process.wait(timeout=10)
        crashed = grade("<think>x</think> \\boxed{3/4}", "0.75", pool=pool)
        assert crashed.outcome == "error" and "GraderCrashed" in crashed.error
        # the next call waits for the replacement worker: its start-up on a loaded machine (several test sessions
        # on two cores) can take longer than the default 10 s deadline
        assert grade("<think>x</think> \\boxed{3/4}", "0.75", timeout_s=60.0, pool=pool).score == 1.0
    finally:
        pool.close()


def test_a_closed_pools_workers_dying_as_they_start_is_no_news(monkeypatch, caplog):
    """A command that ends (here: a duplicate-question error in preprocessing) closes the pool at exit while a worker
    is still starting; that worker dies with the thread that forked it. That was logged as "grading worker start
    failed"; a start that fails while the pool is open still is."""
    import logging
    from types import SimpleNamespace

    from exgrpo.reward import isolation

    release = threading.Event()

    def launch(self):  # a worker that never says ready: its start fails once released
        replies = SimpleNamespace(poll=lambda timeout: release.wait(30) and False, close=lambda: None)
        return SimpleNamespace(kill=lambda: None, replies=replies, process=SimpleNamespace(poll=lambda: -9))

    monkeypatch.setattr(isolation.GraderPool, "_launch", launch)
    caplog.set_level(logging.WARNING, logger=isolation.logger.name)
    for close_first in (True, False):
        pool = GraderPool(max_workers=1)
        pool.start(wait=False)
        if close_first:
            pool.close()
        release.set()
        end = time.monotonic() + 30  # a backstop: the failure follows at once
        while pool._starting and time.monotonic() < end:
            time.sleep(0.01)
        assert pool._starting == 0 and pool.live_workers == 0
        failed = [r for r in caplog.records if "grading worker start failed" in r.getMessage()]
        assert len(failed) == (0 if close_first else 1), (close_first, failed)
        pool.close()
        release.clear()


def test_timeout_works_off_the_main_thread():
    # verl calls the reward from executor threads, where math-verify's signal.alarm cannot work
    pool = GraderPool(max_workers=2)
    results: list = []
    try:
        threads = [
            threading.Thread(target=lambda: results.append(grade(HANG, "1", timeout_s=1.0, pool=pool))),
            threading.Thread(
                target=lambda: results.append(grade("<think>x</think> \\boxed{0.5}", "\\frac12", pool=pool))
            ),
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=60)
        assert sorted(r.outcome for r in results) == ["correct", "timeout"]
    finally:
        pool.close()


def test_inline_grading_without_timeout():
    assert grade("<think>x</think> \\boxed{\\frac{2}{4}}", "0.5", timeout_s=None, exact_shortcut=False).score == 1.0


def test_grade_batch_keeps_order():
    responses = [f"<think>x</think> \\boxed{{{i}}}" for i in range(20)]
    gts = [str(i if i % 3 else i + 1) for i in range(20)]
    results = grade_batch(responses, gts, exact_shortcut=False)
    assert [r.score for r in results] == [0.0 if i % 3 == 0 else 1.0 for i in range(20)]
    with pytest.raises(ValueError, match="ground truths"):
        grade_batch(responses, gts[:3])


# -------------------------------------------------------------------------------------- verl entry point


def test_compute_score_entry_point_returns_verl_dict():
    out = compute_score("math", "<think>x</think> \\boxed{\\frac{1}{2}}", "0.5", {"index": 0})
    assert out["score"] == 1.0 and out["acc"] == 1.0 and out["reward_error"] == 0.0
    # extra keyword arguments verl may pass are ignored
    assert compute_score("aime", "<think></think>\\boxed{3}", "3", None, reward_router_address=None)["score"] == 1.0


def test_compute_score_reward_kwargs():
    response = "no think block, \\boxed{9}"
    assert compute_score("toy_arithmetic", response, "9")["score"] == 0.0
    assert compute_score("toy_arithmetic", response, "9", think_gate=False)["score"] == 1.0
    assert compute_score("toy_arithmetic", response, "9", think_gate="false")["score"] == 1.0
    assert compute_score("x", "<think></think> \\boxed{B}", "B", multiple_choice_sources="x,y")["pred"] == "B"
    with pytest.raises(ValueError, match="think_gate"):
        compute_score("math", response, "9", think_gate="maybe")
    with pytest.raises(ValueError, match="timeout_s"):
        compute_score("math", response, "9", timeout_s="soon")


def test_compute_score_from_executor_threads_like_verl():
    rows = [(f"<think>t</think> \\boxed{{{i}/2}}", f"\\frac{{{i}}}{{2}}") for i in range(1, 33)]
    with ThreadPoolExecutor(max_workers=8) as ex:
        outs = list(ex.map(lambda r: compute_score("math", r[0], r[1], {}), rows))
    assert all(o["score"] == 1.0 for o in outs), [o for o in outs if o["score"] != 1.0]
