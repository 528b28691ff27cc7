"""The dataset -> verl parquet commands (data_preprocess.openr1_math, data_preprocess.benchmarks): formats, ids,
filters, counts, and the errors for bad input."""

from __future__ import annotations

from pathlib import Path

import pyarrow.parquet as pq
import pytest

from data_preprocess import benchmarks, openr1_math
from data_preprocess.common import (
    LUFFY_SYSTEM_PROMPT,
    VERL_SCHEMA,
    DuplicateQuestionError,
    MissingColumnError,
    PreprocessError,
    clean_ground_truth,
    question_id,
)
from tests.helpers.jsonl import write_jsonl
from tests.helpers.tokenizers import build_tiny_tokenizer


def verl_shaped(question: str, answer, system: str = "old system prompt") -> dict:
    """A row shaped like Elliott/Openr1-Math-46k-8192 (verl columns plus the reference solution)."""
    return {
        "data_source": "openr1",
        "prompt": [{"role": "system", "content": system}, {"role": "user", "content": question}],
        "target": [{"role": "assistant", "content": "a long reference solution " * 50}],
        "ability": "math",
        "reward_model": {"ground_truth": answer, "style": "rule"},
        "extra_info": {"index": 0, "split": "train"},
    }


def run_openr1(*argv: str) -> openr1_math.Report:
    args = openr1_math.build_parser().parse_args([*argv, "--no-progress"])
    return openr1_math.run(args)


# ------------------------------------------------------------------------------------------------ helpers


def test_question_id_is_stable_under_whitespace_and_unicode_forms():
    assert question_id("What is  1+1?\n") == question_id("What is 1+1?")
    assert question_id("ﬁnd x") == question_id("find x")  # NFKC folds the ligature
    assert question_id("What is 1+1?") != question_id("What is 1+2?")
    assert len(question_id("q")) == 40


def test_system_prompt_matches_the_released_evaluation_files(shared_benchmarks):
    table = pq.read_table(shared_benchmarks / "arc_c.parquet", columns=["prompt"]).slice(0, 1).to_pylist()
    assert table[0]["prompt"][0] == {"content": LUFFY_SYSTEM_PROMPT, "role": "system"}


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("  7 ", "7"),
        (142.0, "142.0"),
        (3, "3"),
        (["x"], "x"),
        ("", None),
        ("   ", None),
        (None, None),
        (float("nan"), None),
        (["1", "2"], None),
        ({"a": 1}, None),
        (True, None),
    ],
)
def test_clean_ground_truth(value, expected):
    assert clean_ground_truth(value) == expected


# ---------------------------------------------------------------------------------------------- openr1_math


def test_openr1_verl_shaped_input_to_verl_parquet(tmp_path):
    rows = [
        verl_shaped("What is $1+1$?", "2"),
        verl_shaped("Compute $\\frac{1}{2}+\\frac{1}{4}$.", "\\frac{3}{4}"),
        verl_shaped("An empty answer", ""),
        verl_shaped("A malformed answer", "\\frac{"),
        verl_shaped("Find the positive x with $x^2=4$.", 2),
    ]
    src = write_jsonl(tmp_path / "in.jsonl", rows)
    out = tmp_path / "out" / "train.parquet"
    report = run_openr1("--input", str(src), "--output", str(out))
    assert report.counts["input rows"] == 5
    assert report.counts["dropped: empty or unusable ground truth"] == 1
    assert report.counts["dropped: unparseable ground truth"] == 1
    assert report.counts["kept"] == 3
    table = pq.read_table(out)
    assert table.schema.equals(VERL_SCHEMA)
    got = table.to_pylist()
    assert [r["extra_info"]["index"] for r in got] == [0, 1, 2]
    assert [r["extra_info"]["source_row"] for r in got] == [0, 1, 4]
    assert [r["reward_model"] for r in got] == [
        {"ground_truth": "2", "style": "rule"},
        {"ground_truth": "\\frac{3}{4}", "style": "rule"},
        {"ground_truth": "2", "style": "rule"},
    ]
    first = got[0]
    assert first["prompt"] == [
        {"content": LUFFY_SYSTEM_PROMPT, "role": "system"},
        {"content": "What is $1+1$?", "role": "user"},
    ]
    assert first["data_source"] == "openr1" and first["ability"] == "math"
    assert first["extra_info"]["question_id"] == question_id("What is $1+1$?")
    assert first["extra_info"]["split"] == "train"


def test_openr1_plain_parquet_input_and_options(tmp_path):
    import pyarrow as pa

    src = tmp_path / "plain.parquet"
    pq.write_table(pa.Table.from_pylist([{"problem": "Q1?", "answer": "1"}, {"problem": "Q2?", "answer": "2"}]), src)
    out = tmp_path / "o.parquet"
    report = run_openr1("--input", str(src), "--output", str(out), "--system-prompt", "none", "--data-source", "mine")
    assert report.counts["kept"] == 2 and "input shape: plain" in report.notes
    got = pq.read_table(out).to_pylist()
    assert got[0]["prompt"] == [{"content": "Q1?", "role": "user"}]
    assert {r["data_source"] for r in got} == {"mine"}
    custom = tmp_path / "sys.txt"
    custom.write_text("Be brief.", encoding="utf-8")
    run_openr1("--input", str(src), "--output", str(out), "--system-prompt-file", str(custom), "--skip-gt-check")
    assert pq.read_table(out).to_pylist()[1]["prompt"][0] == {"content": "Be brief.", "role": "system"}


def test_openr1_missing_column_names_the_column_and_the_file(tmp_path):
    src = write_jsonl(tmp_path / "bad.jsonl", [{"problem": "Q?", "solution": "long"}])
    with pytest.raises(MissingColumnError) as e:
        run_openr1("--input", str(src), "--output", str(tmp_path / "o.parquet"))
    assert "'answer'" in str(e.value) and str(src) in str(e.value)
    with pytest.raises(MissingColumnError, match="'label'"):
        run_openr1("--input", str(src), "--output", str(tmp_path / "o.parquet"), "--answer-key", "label")


def test_openr1_duplicate_questions_are_an_error_unless_dropped(tmp_path):
    rows = [verl_shaped("Same question?", "1"), verl_shaped("Other?", "2"), verl_shaped("Same  question?\n", "1")]
    src = write_jsonl(tmp_path / "dup.jsonl", rows)
    out = tmp_path / "o.parquet"
    with pytest.raises(DuplicateQuestionError) as e:
        run_openr1("--input", str(src), "--output", str(out))
    assert question_id("Same question?")[:12] in str(e.value) and "rows [0, 2]" in str(e.value)
    report = run_openr1("--input", str(src), "--output", str(out), "--drop-duplicates")
    assert report.counts["dropped: duplicate question"] == 1 and report.counts["kept"] == 2


def test_openr1_prompt_length_filter_with_a_tokenizer(tmp_path):
    tok = build_tiny_tokenizer(tmp_path / "tok")
    rows = [verl_shaped("short?", "1"), verl_shaped("long " * 400 + "?", "2"), verl_shaped("also short?", "3")]
    src = write_jsonl(tmp_path / "in.jsonl", rows)
    out = tmp_path / "o.parquet"
    # the released system prompt alone is ~900 byte tokens; the long question adds 2,000
    report = run_openr1(
        "--input", str(src), "--output", str(out), "--tokenizer", str(tok), "--max-prompt-tokens", "1024"
    )
    assert report.counts["dropped: prompt > 1024 tokens"] == 1 and report.counts["kept"] == 2
    assert [r["extra_info"]["source_row"] for r in pq.read_table(out).to_pylist()] == [0, 2]
    with pytest.raises(PreprocessError, match="no rows left"):  # every prompt is longer than 10 tokens
        run_openr1("--input", str(src), "--output", str(out), "--tokenizer", str(tok), "--max-prompt-tokens", "10")


def test_openr1_no_rows_left_and_cli_exit_code(tmp_path, capsys):
    src = write_jsonl(tmp_path / "in.jsonl", [verl_shaped("Q?", "")])
    assert openr1_math.main(["--input", str(src), "--output", str(tmp_path / "o.parquet"), "--no-progress"]) == 2
    assert "no rows left" in capsys.readouterr().err
    assert openr1_math.main(["--input", str(tmp_path / "missing.jsonl"), "--output", str(tmp_path / "o.parquet")]) == 2
    with pytest.raises(PreprocessError, match="unsupported input format"):
        run_openr1("--input", str(write_jsonl(tmp_path / "x.csv", [])), "--output", str(tmp_path / "o.parquet"))


# ----------------------------------------------------------------------------------------------- benchmarks


def run_benchmarks(tmp_path: Path, *argv: str) -> list:
    args = benchmarks.build_parser().parse_args(["--output-dir", str(tmp_path / "out"), *argv, "--no-progress"])
    return benchmarks.run(args)


def test_math_benchmark_with_avg_at_k_repetition(tmp_path):
    src = write_jsonl(tmp_path / "aime.jsonl", [{"problem": "P0", "answer": "204"}, {"problem": "P1", "answer": "70"}])
    math_src = write_jsonl(tmp_path / "m.jsonl", [{"problem": "M0", "answer": "\\frac{1}{2}", "solution": "..."}])
    run_benchmarks(
        tmp_path,
        "--benchmarks",
        "aime24,math500",
        "--input",
        f"aime24={src}",
        "--input",
        f"math500={math_src}",
        "--repeat",
        "3",
        "--combined",
        "all.parquet",
    )
    aime = pq.read_table(tmp_path / "out" / "aime24.parquet").to_pylist()
    assert [r["extra_info"]["index"] for r in aime] == [0, 0, 0, 1, 1, 1]
    assert [r["extra_info"]["sample"] for r in aime] == [0, 1, 2] * 2
    assert {r["data_source"] for r in aime} == {"aime"}
    assert aime[3]["prompt"] == [{"content": LUFFY_SYSTEM_PROMPT, "role": "system"}, {"content": "P1", "role": "user"}]
    assert aime[3]["reward_model"]["ground_truth"] == "70"
    math = pq.read_table(tmp_path / "out" / "math500.parquet").to_pylist()
    assert len(math) == 1 and math[0]["data_source"] == "math"  # pass@1: --repeat K is for AIME/AMC only
    assert pq.read_table(tmp_path / "out" / "all.parquet").num_rows == 7


def test_repeat_per_benchmark_and_bad_values(tmp_path):
    assert benchmarks.parse_repeat("aime24=8,amc=4", ["aime24"]) == {"aime24": 8, "amc": 4}
    assert benchmarks.parse_repeat("32", ["aime24", "aime25", "amc"]) == {"aime24": 32, "aime25": 32, "amc": 32}
    for bad in ("x", "aime24=x", "nope=3", "0"):
        with pytest.raises(PreprocessError):
            benchmarks.parse_repeat(bad, ["aime24"])
    with pytest.raises(PreprocessError, match="unknown"):
        run_benchmarks(tmp_path, "--benchmarks", "aime24,gsm8k")
    with pytest.raises(PreprocessError, match="NAME=PATH"):
        run_benchmarks(tmp_path, "--benchmarks", "aime24", "--input", "aime24")


def test_arc_formatting_and_option_checks(tmp_path):
    rows = [
        {
            "question": "Which?",
            "choices": {"text": ["x", "y", "z", "w"], "label": ["A", "B", "C", "D"]},
            "answerKey": "C",
        },
        {"question": "Numbered?", "choices": {"text": ["p", "q"], "label": ["1", "2"]}, "answerKey": "2"},
        {"question": "Bad key?", "choices": {"text": ["p", "q"], "label": ["A", "B"]}, "answerKey": "E"},
    ]
    report = run_benchmarks(
        tmp_path, "--benchmarks", "arc_c", "--input", f"arc_c={write_jsonl(tmp_path / 'a.jsonl', rows)}"
    )
    assert report[0].counts["dropped: answer is not a listed option"] == 1
    got = pq.read_table(tmp_path / "out" / "arc_c.parquet").to_pylist()
    assert got[0]["prompt"][1]["content"] == "Which?\n\nA) x\nB) y\nC) z\nD) w\n"
    assert got[1]["prompt"][1]["content"] == "Numbered?\n\n1) p\n2) q\n"
    assert [r["reward_model"]["ground_truth"] for r in got] == ["C", "2"]
    assert {r["data_source"] for r in got} == {"arc_c"}


def test_gpqa_raw_rows_are_shuffled_reproducibly_and_keep_the_answer(tmp_path):
    rows = [
        {
            "Question": f"Q{i}?",
            "Correct Answer": f"right{i}",
            "Incorrect Answer 1": "w1",
            "Incorrect Answer 2": "w2",
            "Incorrect Answer 3": "w3",
        }
        for i in range(12)
    ]
    src = write_jsonl(tmp_path / "g.jsonl", rows)
    run_benchmarks(tmp_path, "--benchmarks", "gpqa_diamond", "--input", f"gpqa_diamond={src}")
    first = pq.read_table(tmp_path / "out" / "gpqa_diamond.parquet").to_pylist()
    run_benchmarks(tmp_path, "--benchmarks", "gpqa_diamond", "--input", f"gpqa_diamond={src}")
    assert pq.read_table(tmp_path / "out" / "gpqa_diamond.parquet").to_pylist() == first
    letters = set()
    for i, row in enumerate(first):
        user = row["prompt"][1]["content"]
        assert user.startswith(benchmarks.GPQA_INSTRUCTION + f"\n\nQ{i}?\n\n")
        letter = row["reward_model"]["ground_truth"]
        assert f"{letter}) right{i}" in user.splitlines()
        letters.add(letter)
        assert row["data_source"] == "gpqa"
    assert len(letters) > 1  # the correct answer is not always in the same place


def test_gpqa_lettered_rows_keep_their_order(tmp_path):
    rows = [{"question": "Q?", "options": ["a", "b", "c", "d"], "answer": "B"}]
    run_benchmarks(
        tmp_path, "--benchmarks", "gpqa_diamond", "--input", f"gpqa_diamond={write_jsonl(tmp_path / 'g.jsonl', rows)}"
    )
    row = pq.read_table(tmp_path / "out" / "gpqa_diamond.parquet").to_pylist()[0]
    assert row["prompt"][1]["content"] == benchmarks.GPQA_INSTRUCTION + "\n\nQ?\n\nA) a\nB) b\nC) c\nD) d"
    assert row["reward_model"]["ground_truth"] == "B"


def test_mmlu_pro_ten_options_and_answer_index(tmp_path):
    opts = [f"o{i}" for i in range(10)]
    rows = [
        {"question": "Q1", "options": opts, "answer": "J", "category": "x"},
        {"question": "Q2", "options": opts[:4], "answer": "", "answer_index": 2},
    ]
    src = write_jsonl(tmp_path / "m.jsonl", [rows[0]])
    run_benchmarks(tmp_path, "--benchmarks", "mmlu_pro", "--input", f"mmlu_pro={src}")
    row = pq.read_table(tmp_path / "out" / "mmlu_pro.parquet").to_pylist()[0]
    assert row["prompt"][1]["content"] == "Q1\n\n" + "".join(f"{'ABCDEFGHIJ'[i]}) o{i}\n" for i in range(10))
    assert row["reward_model"]["ground_truth"] == "J" and row["data_source"] == "mmlu_pro"
    src2 = write_jsonl(tmp_path / "m2.jsonl", [{k: v for k, v in rows[1].items() if k != "answer"}])
    run_benchmarks(tmp_path, "--benchmarks", "mmlu_pro", "--input", f"mmlu_pro={src2}")
    assert pq.read_table(tmp_path / "out" / "mmlu_pro.parquet").to_pylist()[0]["reward_model"]["ground_truth"] == "C"


def test_benchmark_bad_input_errors(tmp_path):
    dup = write_jsonl(tmp_path / "d.jsonl", [{"problem": "P", "answer": "1"}, {"problem": " P ", "answer": "1"}])
    with pytest.raises(DuplicateQuestionError, match="rows \\[0, 1\\]"):
        run_benchmarks(tmp_path, "--benchmarks", "amc", "--input", f"amc={dup}")
    nocol = write_jsonl(tmp_path / "n.jsonl", [{"problem": "P", "solution": "x"}])
    with pytest.raises(MissingColumnError) as e:
        run_benchmarks(tmp_path, "--benchmarks", "minerva", "--input", f"minerva={nocol}")
    assert "answer" in str(e.value) and str(nocol) in str(e.value)
    arc = write_jsonl(tmp_path / "arc.jsonl", [{"question": "Q", "answerKey": "A"}])
    with pytest.raises(MissingColumnError, match="'choices'"):
        run_benchmarks(tmp_path, "--benchmarks", "arc_c", "--input", f"arc_c={arc}")
    empty = write_jsonl(tmp_path / "e.jsonl", [{"problem": "P", "answer": " "}, {"problem": "Q", "answer": "\\frac{"}])
    with pytest.raises(PreprocessError, match="no rows left") as e:
        run_benchmarks(tmp_path, "--benchmarks", "amc", "--input", f"amc={empty}")
    assert "dropped: empty or unusable ground truth" in str(e.value) and "dropped: unparseable" in str(e.value)
