"""The reward of tool-calling exchanges (``reward_kwargs.strip_tool_responses``): a tool's answer is not the model's.

verl's reward loop (``verl/experimental/reward_loop/reward_manager/naive.py``) grades
``tokenizer.decode(response_ids, skip_special_tokens=True)`` of the whole exchange after the prompt: the model's turns
and, between them, the tool's answers as the chat template wrapped them. Qwen2.5's template (hermes format) puts a
tool's answer in a user turn, ``<|im_start|>user\\n<tool_response>\\n...\\n</tool_response><|im_end|>``; the turn
markers are special tokens and vanish from the decoded text, the ``<tool_response>`` markers are ordinary text (added
tokens that are not special in Qwen3) and stay.
"""

from __future__ import annotations

import time

import pytest

from exgrpo.reward import grade, strip_tool_responses
from recipe.exgrpo.reward import compute_score, to_verl_dict
from tests.helpers.tokenizers import build_tiny_tokenizer

CALL = '<tool_call>\n{"name": "python", "arguments": {"code": "print(6 * 7)"}}\n</tool_call>'


def exchange(tool_output: str, final_turn: str) -> str:
    """A decoded exchange as verl grades it: a model turn with a call, the tool's answer, the model's last turn."""
    return f"Let me compute.\n{CALL}\nuser\n<tool_response>\n{tool_output}\n</tool_response>\nassistant\n{final_turn}"


# --------------------------------------------------------------------------------------------------- the cut


def test_every_tool_response_span_is_cut_with_its_markers():
    text = "a<tool_response>x</tool_response>b<tool_response>\ny\n</tool_response>c"
    assert strip_tool_responses(text) == "abc"
    assert strip_tool_responses("no tool here \\boxed{1}") == "no tool here \\boxed{1}"
    assert strip_tool_responses("") == ""
    # an exchange cut inside a tool's answer: nothing after the opening marker is the model's
    assert strip_tool_responses("model <tool_response>\n\\boxed{42} and more") == "model "
    # a stray closing marker is the model's own text, kept
    assert strip_tool_responses("</tool_response> \\boxed{3}") == "</tool_response> \\boxed{3}"


def test_the_cut_stays_linear_when_no_span_closes():
    text = "<tool_response>" + "x" * 10 + ("<tool_response>" * 20_000)
    start = time.perf_counter()
    assert strip_tool_responses(text) == ""
    assert strip_tool_responses("y" + "<tool_response>z</tool_response>" * 20_000 + "w") == "yw"
    assert time.perf_counter() - start < 1.0


# ------------------------------------------------------------------------------------------------ the reward


def test_a_boxed_answer_the_tool_printed_is_graded_only_with_the_option_off():
    text = exchange("\\boxed{42}", "So the result is as printed above.")  # the model never boxes an answer
    off = compute_score("openr1_math", text, "42", think_gate=False)
    on = compute_score("openr1_math", text, "42", think_gate=False, strip_tool_responses=True)
    assert off["score"] == 1.0 and off["pred"] == "42"  # the tool's box, graded as if the model wrote it
    assert on["score"] == 0.0 and on["pred"] != "42"  # no box of its own: whatever math-verify finds, not 42
    assert set(on) == set(off)  # the same keys, on or off (verl stacks them by the first response's keys)


def test_the_models_own_answer_is_graded_with_the_option_on():
    text = exchange("\\boxed{41}", "The tool printed a wrong box; the answer is \\boxed{42}.")
    assert compute_score("openr1_math", text, "42", think_gate=False, strip_tool_responses=True)["score"] == 1.0
    # the model's last box wins either way when it comes after the tool's
    assert compute_score("openr1_math", text, "42", think_gate=False)["score"] == 1.0
    # a box the tool printed after the model's last turn began cannot stand in for it
    cut = "I will check.\n" + CALL + "\nuser\n<tool_response>\n\\boxed{42}"  # exchange cut in the tool's answer
    assert compute_score("openr1_math", cut, "42", think_gate=False, strip_tool_responses=True)["score"] == 0.0


def test_a_think_close_in_a_tool_answer_does_not_open_the_gate():
    text = exchange("</think> \\boxed{42}", "no closing of my own")
    assert compute_score("openr1_math", text, "42")["score"] == 1.0  # off: the tool's </think> passes the gate
    on = compute_score("openr1_math", text, "42", strip_tool_responses=True)
    assert on["score"] == 0.0 and on["think_closed"] == 0.0


@pytest.mark.parametrize("value", [True, "true", "1", "yes", 1])
def test_the_option_reads_booleans_from_hydra_and_the_shell(value):
    text = exchange("\\boxed{42}", "done")
    assert compute_score("openr1_math", text, "42", think_gate=False, strip_tool_responses=value)["score"] == 0.0


@pytest.mark.parametrize("value", ["maybe", 2, "tool", None])
def test_a_bad_value_of_the_option_names_it(value):
    with pytest.raises(ValueError, match=r"reward_kwargs\.strip_tool_responses must be a boolean") as err:
        compute_score("openr1_math", "\\boxed{1}", "1", think_gate=False, strip_tool_responses=value)
    assert repr(value) in str(err.value)


def test_every_call_returns_the_same_keys_on_or_off():
    expected = set(to_verl_dict(grade("\\boxed{1}", "1", think_gate=False)))
    cases = [
        (exchange("\\boxed{42}", "done"), "42"),  # off: correct (the tool's box); on: no answer
        (exchange("\\boxed{1}", "\\boxed{2}"), "2"),  # correct
        (exchange("\\boxed{1}", "\\boxed{3}"), "2"),  # wrong
        ("<tool_response>", "1"),  # nothing left to grade
        ("x", ""),  # a bad ground truth: error
    ]
    for strip in (False, True):
        for text, gt in cases:
            assert set(compute_score("openr1_math", text, gt, think_gate=False, strip_tool_responses=strip)) == expected
    # off is the default: every existing run grades exactly as before
    assert compute_score("openr1_math", cases[0][0], "42", think_gate=False)["score"] == 1.0


def test_the_markers_survive_the_decode_verl_grades(tmp_path):
    """The exchange as token ids, rendered as Qwen2.5's template renders a tool turn, decoded as verl's reward loop
    decodes it: the turn markers (special tokens) are gone, the tool-response markers are still there to cut."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(build_tiny_tokenizer(tmp_path / "tok"))
    rendered = (
        f"Let me compute.\n{CALL}<|im_end|>\n<|im_start|>user\n<tool_response>\n\\boxed{{42}}\n</tool_response>"
        "<|im_end|>\n<|im_start|>assistant\nSo that is it.<|im_end|>"
    )
    ids = tok(rendered, add_special_tokens=False)["input_ids"]
    decoded = tok.decode(ids, skip_special_tokens=True)
    assert "<|im_start|>" not in decoded and "<tool_response>" in decoded and "</tool_response>" in decoded
    assert compute_score("openr1_math", decoded, "42", think_gate=False)["score"] == 1.0
    assert compute_score("openr1_math", decoded, "42", think_gate=False, strip_tool_responses=True)["score"] == 0.0
