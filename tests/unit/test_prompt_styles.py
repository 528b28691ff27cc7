"""The Llama-3.1-8B base prompt (``--prompt-style llama_base``): the preprocessing commands write it, the raw chat
template the launch script sets renders it verbatim, and the prompt-length filter counts what verl will count."""

from __future__ import annotations

import pyarrow.parquet as pq
import pytest

from data_preprocess import benchmarks, openr1_math
from data_preprocess.common import LUFFY_SYSTEM_PROMPT, PreprocessError, build_prompt, system_prompt_from_args
from exgrpo.prompts import RAW_CHAT_TEMPLATE, llama_base_prompt
from tests.helpers.jsonl import write_jsonl
from tests.helpers.tokenizers import build_tiny_tokenizer

QUESTION = "What is $2 + 2$?"
LLAMA_TEXT = "User: What is $2 + 2$? Answer: Let's think step by step.\n"


def test_build_prompt_styles():
    assert llama_base_prompt(QUESTION) == LLAMA_TEXT
    assert build_prompt(QUESTION, None, "llama_base") == [{"content": LLAMA_TEXT, "role": "user"}]
    assert build_prompt(QUESTION, "SYS") == [
        {"content": "SYS", "role": "system"},
        {"content": QUESTION, "role": "user"},
    ]
    assert system_prompt_from_args(None, None) == LUFFY_SYSTEM_PROMPT  # chat: the released instruction
    assert system_prompt_from_args(None, None, "llama_base") is None
    assert system_prompt_from_args("none", None, "llama_base") is None
    with pytest.raises(PreprocessError, match="no system prompt"):
        system_prompt_from_args("luffy", None, "llama_base")
    with pytest.raises(PreprocessError, match="--prompt-style"):
        system_prompt_from_args(None, None, "alpaca")


def test_the_raw_template_renders_the_prompt_verbatim_after_bos(tmp_path):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(build_tiny_tokenizer(tmp_path / "tok"))
    tok.bos_token = "<|im_start|>"  # the tiny tokenizer has none; Llama's is <|begin_of_text|>
    messages = build_prompt(QUESTION, None, "llama_base")
    text = tok.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=True, chat_template=RAW_CHAT_TEMPLATE
    )
    assert text == "<|im_start|>" + LLAMA_TEXT


def test_openr1_llama_base_rows_and_length_filter(tmp_path, capsys):
    tok = build_tiny_tokenizer(tmp_path / "tok")
    rows = [{"problem": QUESTION, "answer": "4"}, {"problem": "x" * 60, "answer": "1"}]
    src = write_jsonl(tmp_path / "in.jsonl", rows)
    out = tmp_path / "train_llama_base.parquet"
    # byte-level tokens, no BOS in this tokenizer: the first prompt is len(LLAMA_TEXT) = 57 tokens under the raw
    # template (the ChatML template would add 22 more), the second 101
    args = ["--input", str(src), "--output", str(out), "--prompt-style", "llama_base", "--no-progress"]
    args += ["--tokenizer", str(tok), "--max-prompt-tokens", "60"]
    report = openr1_math.run(openr1_math.build_parser().parse_args(args))
    assert report.counts["dropped: prompt > 60 tokens"] == 1 and report.counts["kept"] == 1
    (row,) = pq.read_table(out).to_pylist()
    assert row["prompt"] == [{"content": LLAMA_TEXT, "role": "user"}]
    # the question id is the question's, whatever the prompt style
    chat = tmp_path / "train.parquet"
    openr1_math.run(openr1_math.build_parser().parse_args(["--input", str(src), "--output", str(chat)]))
    assert pq.read_table(chat).to_pylist()[0]["extra_info"]["question_id"] == row["extra_info"]["question_id"]
    assert openr1_math.main([*args, "--system-prompt", "luffy"]) == 2  # the base-model setting has none
    assert "--prompt-style llama_base has no system prompt" in capsys.readouterr().err


def test_benchmarks_llama_base_rows(tmp_path):
    src = write_jsonl(tmp_path / "aime.jsonl", [{"problem": QUESTION, "answer": "4"}])
    args = ["--output-dir", str(tmp_path / "out"), "--benchmarks", "aime24", "--input", f"aime24={src}"]
    args += ["--repeat", "2", "--prompt-style", "llama_base", "--combined", "valid_id.parquet", "--no-progress"]
    benchmarks.run(benchmarks.build_parser().parse_args(args))
    rows = pq.read_table(tmp_path / "out" / "valid_id.parquet").to_pylist()
    assert [r["prompt"] for r in rows] == [[{"content": LLAMA_TEXT, "role": "user"}]] * 2
