"""Tool-integrated reasoning data (``--prompt-style tir``, ``--agent-name``): the rows verl's tool agent loop serves.

verl picks the agent loop of each row from the data's ``agent_name`` column (``tool_agent``: the loop that calls the
tools of ``actor_rollout_ref.rollout.multi_turn``); a row without it goes to verl's single-turn default. The tir rows
carry the tir system instruction; the tool's schema is added by the chat template at rollout time, not stored.
"""

from __future__ import annotations

import pyarrow.parquet as pq
import pytest

from data_preprocess import benchmarks, openr1_math
from data_preprocess.common import (
    LUFFY_SYSTEM_PROMPT,
    TIR_SYSTEM_PROMPT,
    VERL_SCHEMA,
    PreprocessError,
    agent_name_from_args,
    system_prompt_from_args,
)
from exgrpo.prompts import PROMPT_STYLES, STYLE_AGENT_NAMES
from tests.helpers.jsonl import write_jsonl

ROWS = [{"problem": "What is $6 \\times 7$?", "answer": "42"}, {"problem": "What is $2 + 3$?", "answer": "5"}]


def run_openr1(*argv: str) -> openr1_math.Report:
    return openr1_math.run(openr1_math.build_parser().parse_args([*argv, "--no-progress"]))


def test_tir_rows_carry_the_agent_name_and_the_tir_instruction(tmp_path):
    src = write_jsonl(tmp_path / "in.jsonl", ROWS)
    out = tmp_path / "openr1_tir" / "train.parquet"
    report = run_openr1("--input", str(src), "--output", str(out), "--prompt-style", "tir")
    assert report.counts["kept"] == 2
    table = pq.read_table(out)
    assert table.schema.names == [*VERL_SCHEMA.names, "agent_name"]
    assert table.schema.remove(table.schema.get_field_index("agent_name")).equals(VERL_SCHEMA)
    rows = table.to_pylist()
    assert [r["agent_name"] for r in rows] == ["tool_agent", "tool_agent"]
    assert rows[0]["prompt"] == [
        {"content": TIR_SYSTEM_PROMPT, "role": "system"},
        {"content": ROWS[0]["problem"], "role": "user"},
    ]
    # the same question, the same id, whatever the style: the pool keys questions by it
    chat = tmp_path / "train.parquet"
    run_openr1("--input", str(src), "--output", str(chat))
    chat_table = pq.read_table(chat)
    assert chat_table.schema.equals(VERL_SCHEMA)  # no agent_name column: the existing files are unchanged
    assert [r["extra_info"]["question_id"] for r in chat_table.to_pylist()] == [
        r["extra_info"]["question_id"] for r in rows
    ]


def test_the_tir_instruction_offers_the_python_tool_and_asks_for_a_box():
    assert "tir" in PROMPT_STYLES and STYLE_AGENT_NAMES["tir"] == "tool_agent"
    assert "python tool" in TIR_SYSTEM_PROMPT and "fresh Python process" in TIR_SYSTEM_PROMPT
    assert TIR_SYSTEM_PROMPT.endswith("Put the final answer in \\boxed{}.")
    assert "<think>" not in TIR_SYSTEM_PROMPT  # the TIR runs grade with the think gate off
    assert "<tool_call>" not in TIR_SYSTEM_PROMPT  # the chat template teaches the call format with the schema
    assert system_prompt_from_args(None, None, "tir") == TIR_SYSTEM_PROMPT
    assert system_prompt_from_args(None, None, "chat") == LUFFY_SYSTEM_PROMPT  # the chat default is unchanged
    assert system_prompt_from_args("tir", None, "chat") == TIR_SYSTEM_PROMPT


def test_agent_name_option(tmp_path):
    src = write_jsonl(tmp_path / "in.jsonl", ROWS[:1])
    out = tmp_path / "o.parquet"
    run_openr1("--input", str(src), "--output", str(out), "--agent-name", "single_turn_agent")
    (row,) = pq.read_table(out).to_pylist()
    assert row["agent_name"] == "single_turn_agent" and row["prompt"][0]["content"] == LUFFY_SYSTEM_PROMPT
    run_openr1("--input", str(src), "--output", str(out), "--prompt-style", "tir", "--agent-name", "my_tool_loop")
    assert pq.read_table(out).to_pylist()[0]["agent_name"] == "my_tool_loop"
    run_openr1("--input", str(src), "--output", str(out), "--prompt-style", "tir", "--system-prompt", "none")
    (row,) = pq.read_table(out).to_pylist()
    assert row["prompt"] == [{"content": ROWS[0]["problem"], "role": "user"}] and row["agent_name"] == "tool_agent"
    assert agent_name_from_args(None, "chat") is None and agent_name_from_args("none", "chat") is None
    assert agent_name_from_args(None, "llama_base") is None


@pytest.mark.parametrize("bad", ["tool agent", "tool_agent;rm", "", "-x", "tool\nagent"])
def test_a_bad_agent_name_is_named(bad):
    with pytest.raises(PreprocessError) as err:
        agent_name_from_args(bad, "tir")
    assert "--agent-name" in str(err.value) and repr(bad) in str(err.value)


def test_tir_rows_without_an_agent_loop_are_refused():
    with pytest.raises(PreprocessError, match="--agent-name none: --prompt-style tir rows must be served"):
        agent_name_from_args("none", "tir")
    with pytest.raises(PreprocessError, match="--prompt-style must be one of .*'tir'.*got 'tools'"):
        agent_name_from_args(None, "tools")


def test_the_command_exits_2_naming_the_bad_value_and_writes_nothing(tmp_path, capsys):
    src = write_jsonl(tmp_path / "in.jsonl", ROWS)
    out = tmp_path / "o.parquet"
    args = ["--input", str(src), "--output", str(out), "--no-progress", "--prompt-style", "tir"]
    assert openr1_math.main([*args, "--agent-name", "tool agent"]) == 2
    assert "--agent-name must name a verl agent loop" in capsys.readouterr().err and not out.exists()
    assert openr1_math.main([*args, "--agent-name", "none"]) == 2
    assert "--agent-name none" in capsys.readouterr().err and not out.exists()
    with pytest.raises(SystemExit):  # argparse: an unknown style is named with the choices
        openr1_math.main([*args[:-1], "tool"])
    assert "invalid choice: 'tool'" in capsys.readouterr().err


def test_benchmarks_write_tir_validation_rows(tmp_path):
    src = write_jsonl(tmp_path / "aime.jsonl", ROWS)
    args = ["--output-dir", str(tmp_path / "valid_tir"), "--benchmarks", "aime24", "--input", f"aime24={src}"]
    args += ["--repeat", "2", "--prompt-style", "tir", "--combined", "valid_id.parquet", "--no-progress"]
    benchmarks.run(benchmarks.build_parser().parse_args(args))
    rows = pq.read_table(tmp_path / "valid_tir" / "valid_id.parquet").to_pylist()
    assert len(rows) == 4 and {r["agent_name"] for r in rows} == {"tool_agent"}
    assert {r["prompt"][0]["content"] for r in rows} == {TIR_SYSTEM_PROMPT}
    plain = ["--output-dir", str(tmp_path / "valid"), "--benchmarks", "aime24", "--input", f"aime24={src}"]
    benchmarks.run(benchmarks.build_parser().parse_args([*plain, "--no-progress"]))
    assert pq.read_table(tmp_path / "valid" / "aime24.parquet").schema.equals(VERL_SCHEMA)
