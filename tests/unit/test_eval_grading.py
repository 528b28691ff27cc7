"""The evaluation's answer rules, prompt rendering and ``score --out``, with hand-computed expectations.

The grading goes through the real checker of the training reward (math-verify), graded inline (timeout 0, no
worker processes). No model is loaded: generations come from a scripted backend.
"""

from __future__ import annotations

import json
import shutil

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from exgrpo.eval import cli
from exgrpo.eval.backends import Completion
from exgrpo.eval.cli import EvalConfig, generate, score
from exgrpo.eval.generate import PromptFormat, SamplingSettings
from exgrpo.eval.grading import NO_BOXED, Grader, paper_answer
from exgrpo.prompts import LLAMA_BASE_PROMPT

# --- the paper's answer rule ---------------------------------------------------------------------------------

PAPER_ANSWERS = [
    # (response, the answer the paper's rule grades)
    ("The answer is 42.", None),  # no box anywhere: wrong, whatever the text says
    ("\\boxed{42}", "42"),  # no </think>: the whole response (not penalised at test time)
    ("<think>try \\boxed{41}</think> so \\boxed{42}", "42"),
    ("<think>\\boxed{42}</think> I am done.", None),  # the box is only inside the think block
    ("<think>a</think> \\boxed{41} then \\boxed{42}", "42"),  # the last box after </think>
    ("<think>a</think> \\boxed{42} <think>b</think> done", "42"),  # after the FIRST </think>
    ("<think>a</think> \\boxed{\\frac{1}{2}}", "\\frac{1}{2}"),  # nested braces kept
    ("<think>a</think> \\boxed{42", None),  # a box cut off by the token limit is no answer
]


@pytest.mark.parametrize(("response", "expected"), PAPER_ANSWERS, ids=[r for r, _ in PAPER_ANSWERS])
def test_paper_answer(response, expected):
    assert paper_answer(response) == expected


GRADES = [
    # (response, ground truth, data_source, paper rule score, training reward's rule without / with think gate)
    ("The answer is 42.", "42", "aime", 0.0, 1.0, 0.0),  # the reward accepts an unboxed final number
    ("\\boxed{42}", "42", "aime", 1.0, 1.0, 0.0),  # no </think>: only the reward's gate gives 0
    ("<think>x</think> \\boxed{42}", "42", "aime", 1.0, 1.0, 1.0),
    ("<think>x</think> \\boxed{42} <think>y</think> done", "42", "aime", 1.0, 1.0, 0.0),  # first vs last </think>
    ("<think>x</think> \\boxed{\\frac{1}{2}}", "0.5", "math", 1.0, 1.0, 1.0),  # equivalence by math-verify
    ("<think>x</think> \\boxed{41}", "42", "math", 0.0, 0.0, 0.0),
    ("<think>x</think> \\boxed{1} and then \\boxed{2}", "2", "math", 1.0, 1.0, 1.0),  # the last box counts
    ("<think>x</think> \\boxed{1} and then \\boxed{2}", "1", "math", 0.0, 0.0, 0.0),
    ("<think>x</think> \\boxed{B}", "B", "gpqa", 1.0, 1.0, 1.0),  # multiple choice: the boxed letter
    ("<think>x</think> \\boxed{\\text{(B)}}", "B", "gpqa", 1.0, 1.0, 1.0),
    ("<think>x</think> \\boxed{C}", "B", "gpqa", 0.0, 0.0, 0.0),
    ("<think>x</think> ANSWER: B", "B", "gpqa", 0.0, 1.0, 1.0),  # no box: wrong at test time
    ("<think>x</think> \\boxed{B}", "B", "arc_c", 1.0, 1.0, 1.0),
    ("<think>x</think> \\boxed{42}", "B", "mmlu_pro", 0.0, 0.0, 0.0),  # a number is not an option
]


@pytest.mark.parametrize(("response", "gt", "source", "paper", "reward", "gated"), GRADES)
def test_grading_rules(response, gt, source, paper, reward, gated):
    assert Grader(timeout_s=0)(response, gt, source) == paper  # the default is the paper's rule
    assert Grader(grading="reward", think_gate=False, timeout_s=0)(response, gt, source) == reward
    assert Grader(grading="reward", think_gate=True, timeout_s=0)(response, gt, source) == gated


def test_grade_many_matches_one_by_one_and_reports_outcomes():
    records = [{"response": r, "ground_truth": gt, "data_source": src} for r, gt, src, *_ in GRADES]
    graded = Grader(timeout_s=0).grade_many(records)
    assert [s for s, _ in graded] == [g[3] for g in GRADES]
    outcomes = [o for _, o in graded]
    assert outcomes[0] == NO_BOXED and outcomes[11] == NO_BOXED  # "The answer is 42." and "ANSWER: B"
    assert outcomes[1] == "correct" and outcomes[5] == "wrong"
    gated = Grader(grading="reward", think_gate=True, timeout_s=0).grade_many(records)
    assert [s for s, _ in gated] == [g[5] for g in GRADES]
    assert gated[1][1] == "no_think"


def test_a_custom_checker_gets_the_boxed_answer_under_the_paper_rule():
    seen = []

    def checker(response, ground_truth):
        seen.append(response)
        return response == f"\\boxed{{{ground_truth}}}"

    grader = Grader(spec="tests:checker", fn=checker)
    assert grader("<think>\\boxed{1}</think> it is \\boxed{7}.", "7") == 1.0
    assert grader("it is 7", "7") == 0.0  # no box: the checker is not even asked
    assert seen == ["\\boxed{7}"]
    assert Grader(spec="tests:checker", fn=checker, grading="reward", think_gate=True)("no think \\boxed{7}", "7") == 0


def test_grader_records_its_rule():
    assert Grader(timeout_s=0).describe()["grading"] == "paper"
    assert Grader(timeout_s=0).describe()["think_gate"] is None  # the gate has no meaning under the paper rule
    assert Grader(grading="reward", think_gate=False, timeout_s=0).describe()["think_gate"] is False
    with pytest.raises(ValueError, match="grading"):
        Grader(grading="strict")


# --- prompts -------------------------------------------------------------------------------------------------


class ChatMLTokenizer:
    """Just enough of a tokenizer for PromptFormat: a ChatML template that adds Qwen's default system message
    when the messages have none."""

    chat_template = "chatml-with-default-system"
    bos_token = None

    def apply_chat_template(self, messages, tokenize, add_generation_prompt):
        assert tokenize is False and add_generation_prompt is True
        if messages[0]["role"] != "system":
            messages = [{"role": "system", "content": "DEFAULT"}, *messages]
        body = "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in messages)
        return body + "<|im_start|>assistant\n<think>\n"


MESSAGES = [{"role": "system", "content": "LUFFY SYSTEM"}, {"role": "user", "content": "What is 2 + 2?"}]


def test_the_default_prompt_drops_the_dataset_system_message_and_uses_the_model_template():
    fmt = PromptFormat()
    assert fmt.system_prompt_mode == "none"
    assert fmt.render(ChatMLTokenizer(), MESSAGES) == (
        "<|im_start|>system\nDEFAULT<|im_end|>\n<|im_start|>user\nWhat is 2 + 2?<|im_end|>\n"
        "<|im_start|>assistant\n<think>\n"
    )
    kept = PromptFormat(system_prompt=None)  # --keep-system-prompt
    assert kept.system_prompt_mode == "dataset" and "LUFFY SYSTEM" in kept.render(ChatMLTokenizer(), MESSAGES)
    assert "NEW" in PromptFormat(system_prompt="NEW").render(ChatMLTokenizer(), MESSAGES)


def test_the_llama_base_prompt():
    class LlamaTokenizer:
        bos_token = "<|begin_of_text|>"
        chat_template = None

    text = PromptFormat(template="llama_base").render(LlamaTokenizer(), MESSAGES)
    assert text == "<|begin_of_text|>User: What is 2 + 2? Answer: Let's think step by step.\n"
    assert LLAMA_BASE_PROMPT == "User: {question} Answer: Let's think step by step.\n"
    assert PromptFormat(template="llama_base").system_prompt_mode == "none"


def test_cli_prompt_flags():
    parser = cli.build_parser()
    base = ["run", "--model", "m", "--data", "d.parquet", "--out", "o"]
    cfg = cli._config_from_args(parser.parse_args(base))
    assert cfg.prompt_format == PromptFormat(template="chat", system_prompt="")
    assert cfg.grading == "paper"
    cfg = cli._config_from_args(parser.parse_args([*base, "--keep-system-prompt", "--grading", "reward"]))
    assert cfg.prompt_format.system_prompt is None and cfg.grading == "reward"
    cfg = cli._config_from_args(parser.parse_args([*base, "--template", "llama_base"]))
    assert cfg.prompt_format.template == "llama_base"


# --- score --out ---------------------------------------------------------------------------------------------


class ScriptedBackend:
    """Answers each question with a fixed response."""

    name = "hf"
    tokenizer = ChatMLTokenizer()

    def __init__(self, responses: dict[str, str]):
        self.responses = responses

    def generate(self, prompts, n, seeds):
        out = []
        for prompt, k in zip(prompts, n):
            text = next(r for q, r in self.responses.items() if q in prompt)
            out.append([Completion(text, 5, "stop")] * k)
        return out


def _row(question: str, answer: str) -> dict:
    return {
        "data_source": "math",
        "prompt": [{"role": "system", "content": "SYS"}, {"role": "user", "content": question}],
        "ability": "math",
        "reward_model": {"ground_truth": answer, "style": "rule"},
        "extra_info": {"index": 0, "split": "test"},
    }


def test_score_out_writes_into_the_given_directory(tmp_path):
    data = tmp_path / "math_small.parquet"
    pq.write_table(pa.Table.from_pylist([_row("Q1: 2+2?", "4"), _row("Q2: 3+3?", "6")]), data)
    original = tmp_path / "original"
    cfg = EvalConfig(
        model="scripted",
        data=[str(data)],
        out_dir=str(original),
        backend="hf",
        progress=False,
        plot=False,
        grader_timeout_s=0,
        sampling=SamplingSettings(n_samples=1),
    )
    # Q1 boxed and right; Q2 right but unboxed: 50% under the paper rule, 100% under the reward without gate
    generate(cfg, backend=ScriptedBackend({"Q1": "\\boxed{4}", "Q2": "The answer is 6."}))
    assert cli.main(["score", "--out", str(original), "--no-plot", "--no-progress", "--grader-timeout", "0"]) == 0
    before = (original / "results.json").read_bytes()
    assert json.loads(before)["benchmarks"]["math"]["score"] == pytest.approx(50.0)

    copy = tmp_path / "copy"
    shutil.copytree(original, copy)
    argv = ["score", "--out", str(copy), "--no-plot", "--no-progress", "--grader-timeout", "0"]
    assert cli.main([*argv, "--grading", "reward", "--no-think-gate"]) == 0
    assert (original / "results.json").read_bytes() == before  # the original results are untouched
    regraded = json.loads((copy / "results.json").read_text())
    assert regraded["benchmarks"]["math"]["score"] == pytest.approx(100.0)
    assert regraded["metadata"]["grader"]["grading"] == "reward"
    assert (copy / "table.md").is_file() and (copy / "scores" / "math_small.jsonl").is_file()
    assert len((original / "scores" / "math_small.jsonl").read_text().splitlines()) == 2

    # the copy's generations are the ones graded: change one there and only the copy's score moves
    gen = copy / "generations" / "math_small.jsonl"
    lines = [json.loads(x) for x in gen.read_text().splitlines()]
    lines[0]["response"] = "\\boxed{5}"
    gen.write_text("".join(json.dumps(x) + "\n" for x in lines))
    assert cli.main(argv) == 0
    assert json.loads((copy / "results.json").read_text())["benchmarks"]["math"]["score"] == pytest.approx(0.0)
    assert (original / "results.json").read_bytes() == before


def test_score_in_python_uses_the_config_directory(tmp_path):
    data = tmp_path / "math_small.parquet"
    pq.write_table(pa.Table.from_pylist([_row("Q1: 2+2?", "4")]), data)
    cfg = EvalConfig(
        model="scripted", data=[str(data)], out_dir=str(tmp_path / "o"), backend="hf", progress=False,
        grader_timeout_s=0, sampling=SamplingSettings(n_samples=2),
    )  # fmt: skip
    generate(cfg, backend=ScriptedBackend({"Q1": "<think>\\boxed{3}</think> so \\boxed{4}"}))
    results = score(cfg)
    assert results.benchmarks["math"].score == pytest.approx(100.0)
    assert results.metadata["grader"]["grading"] == "paper"


def test_default_label_of_a_merged_checkpoint():
    def label(model):
        return EvalConfig(model=model, data=["d.parquet"], out_dir="o").resolved_label()

    assert label("/ckpt/exgrpo_7b/global_step_700/merged_hf") == "exgrpo_7b/global_step_700"
    assert label("/ckpt/exgrpo_7b/global_step_700/actor/huggingface") == "exgrpo_7b/global_step_700"
    assert label("/models/Qwen2.5-Math-7B") == "Qwen2.5-Math-7B"


def test_a_tool_answer_is_not_graded_as_the_models_when_stripped():
    """A multi-turn response holds the tool's answers; with ``strip_tool_responses`` (the evaluation with tools'
    default, as the TIR reward's option) a ``\\boxed{}`` the tool printed does not count, the model's own does. The
    control: without the option the tool's box is graded."""
    tool_boxed = '<tool_call>{"name": "python"}</tool_call>\n<tool_response>\n\\boxed{42}\n</tool_response>\nno idea'
    own = tool_boxed.replace("no idea", "so \\boxed{42}")
    for grading in ("paper", "reward"):
        stripped = Grader(grading=grading, think_gate=False, strip_tool_responses=True)
        assert stripped(tool_boxed, "42") == 0.0 and stripped(own, "42") == 1.0
        assert Grader(grading=grading, think_gate=False)(tool_boxed, "42") == 1.0  # control
    assert Grader(strip_tool_responses=True).describe()["strip_tool_responses"] is True


def test_the_tool_figures_of_a_multi_turn_run():
    from exgrpo.eval.grading import summarize

    def rec(row, score, calls, errors, turns, unanswered=False):
        return {
            "row": row, "sample": 0, "benchmark": "math500", "question_id": f"q{row}", "score": score,
            "tool_calls": calls, "tool_errors": errors, "num_turns": turns, "unanswered_call": unanswered,
        }  # fmt: skip

    graded = [rec(0, 1.0, 2, 1, 6), rec(1, 0.0, 1, 0, 4, True), rec(2, 1.0, 0, 0, 2), rec(3, 0.0, 0, 0, 2)]
    tools = summarize(graded)["math500"].tools
    assert tools == {
        "answers": 4.0,
        "calls_per_answer": 0.75,
        "answers_with_call": 0.5,
        "tool_errors": 1.0,
        "error_share_of_calls": pytest.approx(1 / 3),
        "turns_per_answer": 3.5,
        "ended_on_unanswered_call": 0.25,
        "accuracy_with_call": 50.0,
        "accuracy_without_call": 50.0,
    }
    single_turn = [{k: v for k, v in r.items() if k not in ("tool_calls", "tool_errors", "num_turns")} for r in graded]
    assert (
        summarize(single_turn)["math500"].tools is None
    )  # a single-turn run has none, and its results stay as they were
