"""data_preprocess/wildchat_if.py on hand-made files: the three input shapes, stable conversation ids, the
deterministic validation split, duplicates, the prompt-length filter, and bad input (exit 2, the file, row and
column named, nothing written)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from data_preprocess import wildchat_if
from data_preprocess.common import VERL_SCHEMA, DuplicateQuestionError, MissingColumnError, PreprocessError
from tests.helpers.tokenizers import build_tiny_tokenizer

REPO = Path(__file__).resolve().parents[2]


def conv(*turns: tuple[str, str]) -> list[dict[str, str]]:
    return [{"role": r, "content": c} for r, c in turns]


CONVERSATIONS = [
    conv(("user", "Write a haiku about rain.")),
    conv(("system", "Be brief."), ("user", "List three colours.")),
    conv(("user", "Hi"), ("assistant", "Hello! How can I help?"), ("user", "Summarise  this   text: ...")),
    conv(("user", "Translate 'cat' to French."), ("assistant", "chat")),  # the trailing answer is dropped
]


def run(tmp_path: Path, *argv: str) -> tuple[int, str]:
    args = wildchat_if.build_parser().parse_args([*argv, "--no-progress"])
    try:
        report = wildchat_if.run(args)
    except PreprocessError as e:
        return 2, str(e)
    return 0, report.format()


def rows(path: Path) -> list[dict]:
    table = pq.read_table(path)
    assert table.schema.equals(VERL_SCHEMA, check_metadata=False)
    return table.to_pylist()


def test_verl_rows_to_verl_parquet_with_stable_ids(tmp_path):
    src = tmp_path / "in.parquet"
    pq.write_table(pa.table({"prompt": CONVERSATIONS, "data_source": ["x"] * 4}), src)
    rc, text = run(tmp_path, "--input", str(src), "--output", str(tmp_path / "train.parquet"))
    assert rc == 0, text
    out = rows(tmp_path / "train.parquet")
    assert len(out) == 4 and all(r["ability"] == "chat" and r["data_source"] == "wildchat_if" for r in out)
    assert out[3]["prompt"] == conv(("user", "Translate 'cat' to French."))
    assert out[1]["prompt"] == CONVERSATIONS[1] and out[0]["reward_model"] == {"ground_truth": "", "style": "model"}
    assert [r["extra_info"]["index"] for r in out] == [0, 1, 2, 3]
    # the id depends on the conversation only: reversed rows, whitespace changes and another file keep it
    src2 = tmp_path / "in2.jsonl"
    spaced = [conv(*[(m["role"], "  " + m["content"].replace(" ", "   ")) for m in c]) for c in CONVERSATIONS[::-1]]
    src2.write_text("".join(json.dumps({"messages": c}) + "\n" for c in spaced))
    assert run(tmp_path, "--input", str(src2), "--output", str(tmp_path / "t2.parquet"))[0] == 0
    ids = {r["extra_info"]["question_id"] for r in out}
    assert {r["extra_info"]["question_id"] for r in rows(tmp_path / "t2.parquet")} == ids and len(ids) == 4
    assert out[0]["extra_info"]["question_id"] == wildchat_if.conversation_id(CONVERSATIONS[0])


def test_plain_instructions_and_dropped_rows_are_counted(tmp_path):
    src = tmp_path / "in.json"
    src.write_text(json.dumps([{"instruction": "Say hi."}, {"instruction": "   "}, {"instruction": None}]))
    rc, text = run(tmp_path, "--input", str(src), "--output", str(tmp_path / "o.parquet"))
    assert rc == 0 and "dropped: no user message         2" in text.replace(",", ""), text
    assert [r["prompt"] for r in rows(tmp_path / "o.parquet")] == [conv(("user", "Say hi."))]
    only_system = tmp_path / "sys.jsonl"
    only_system.write_text(
        json.dumps({"messages": conv(("system", "S"))}) + "\n" + json.dumps({"messages": conv(("user", ""))}) + "\n"
    )
    rc, text = run(tmp_path, "--input", str(only_system), "--output", str(tmp_path / "none.parquet"))
    assert rc == 2 and "no rows left after filtering" in text and not (tmp_path / "none.parquet").exists()


def test_the_validation_split_is_the_same_whatever_the_row_order(tmp_path):
    many = [conv(("user", f"Question number {i}?")) for i in range(30)]
    for name, order in (("a", many), ("b", many[::-1])):
        src = tmp_path / f"{name}.parquet"
        pq.write_table(pa.table({"prompt": order}), src)
        argv = ["--input", str(src), "--output", str(tmp_path / f"{name}_train.parquet")]
        assert run(tmp_path, *argv, "--val-output", str(tmp_path / f"{name}_val.parquet"), "--val-size", "5")[0] == 0
    val_a = {r["extra_info"]["question_id"] for r in rows(tmp_path / "a_val.parquet")}
    val_b = {r["extra_info"]["question_id"] for r in rows(tmp_path / "b_val.parquet")}
    train_a = {r["extra_info"]["question_id"] for r in rows(tmp_path / "a_train.parquet")}
    assert val_a == val_b and len(val_a) == 5 and len(train_a) == 25 and not val_a & train_a
    assert {r["extra_info"]["split"] for r in rows(tmp_path / "a_val.parquet")} == {"val"}
    rc, text = run(tmp_path, "--input", str(tmp_path / "a.parquet"), "--output", str(tmp_path / "x.parquet"),
                   "--val-output", str(tmp_path / "y.parquet"), "--val-size", "30")  # fmt: skip
    assert rc == 2 and "leaves no training row" in text and not (tmp_path / "x.parquet").exists()


def test_duplicates_are_an_error_unless_dropped(tmp_path):
    src = tmp_path / "d.jsonl"
    src.write_text("".join(json.dumps({"prompt": c}) + "\n" for c in [CONVERSATIONS[0], CONVERSATIONS[1]] * 2))
    with pytest.raises(DuplicateQuestionError, match="--drop-duplicates"):
        wildchat_if.run(
            wildchat_if.build_parser().parse_args(["--input", str(src), "--output", str(tmp_path / "o.parquet")])
        )
    rc, text = run(tmp_path, "--input", str(src), "--output", str(tmp_path / "o.parquet"), "--drop-duplicates")
    assert rc == 0 and len(rows(tmp_path / "o.parquet")) == 2 and "duplicate conversation" in text


def test_the_prompt_length_filter_uses_the_chat_template(tmp_path):
    tok = build_tiny_tokenizer(tmp_path / "tok")
    src = tmp_path / "in.parquet"
    pq.write_table(pa.table({"prompt": [conv(("user", "short")), conv(("user", "x" * 500))]}), src)
    rc, text = run(tmp_path, "--input", str(src), "--output", str(tmp_path / "o.parquet"), "--tokenizer", str(tok),
                   "--max-prompt-tokens", "100")  # fmt: skip
    assert rc == 0 and "dropped: prompt > 100 tokens" in text
    assert [r["prompt"][0]["content"] for r in rows(tmp_path / "o.parquet")] == ["short"]


@pytest.mark.parametrize(
    ("column", "value", "message"),
    [
        ("prompt", [{"role": "narrator", "content": "x"}], "message 0 has role 'narrator'"),
        ("prompt", [{"role": "user", "content": 3}], "message 0 (user) has non-text content (int)"),
        ("prompt", ["just a string in a list"], "message 0 is not a {role, content} object"),
        ("prompt", 42, "must hold a list of {role, content} messages or a string, got int"),
    ],
)
def test_malformed_conversations_name_file_row_and_column(tmp_path, column, value, message):
    src = tmp_path / "bad.jsonl"
    src.write_text(json.dumps({column: CONVERSATIONS[0]}) + "\n" + json.dumps({column: value}) + "\n")
    rc, text = run(tmp_path, "--input", str(src), "--output", str(tmp_path / "o.parquet"))
    assert rc == 2 and f"{src}: row 1: column {column!r}" in text and message in text, text
    assert not (tmp_path / "o.parquet").exists()


def test_cli_exit_2_names_the_missing_column_and_writes_nothing(tmp_path):
    src = tmp_path / "in.parquet"
    pq.write_table(pa.table({"text": ["a"]}), src)
    with pytest.raises(MissingColumnError, match=r"missing prompt column 'prompt' or 'messages'"):
        wildchat_if.load_input(wildchat_if.build_parser().parse_args(["--input", str(src), "--output", "x.parquet"]))
    proc = subprocess.run(
        [sys.executable, "-m", "data_preprocess.wildchat_if", "--input", str(src), "--output",
         str(tmp_path / "o.parquet"), "--val-output", str(tmp_path / "v.parquet"), "--no-progress"],
        cwd=REPO, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert (
        proc.returncode == 2
        and f"error: {src}: missing prompt column" in proc.stderr
        and "(found: text)" in proc.stderr
    )
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "o.parquet").exists() and not (tmp_path / "v.parquet").exists()
