"""The calculator task's pieces against verl's own (recipe/exgrpo/harness/tool_task.py, the demo's ``--tools``):

- the warm-up's exchanges are tokenised exactly as verl's tool agent loop builds them (its Qwen continuous-token
  builder: the prompt, the model's call, the newline it inserts, the tool's turn, the answer), so what the warm-up
  teaches is what RL samples and stores;
- verl's hermes parser reads the warm-up's call, and verl's function-tool loader loads the calculator file and
  calls it (good and bad calls alike answer with text);
- the tool task's reward and the trainer's tool-turn metrics read an exchange as intended.
"""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from recipe.exgrpo.harness.assets import build_tokenizer, response_text
from recipe.exgrpo.harness.tool_task import (
    CALCULATOR_FILE,
    TOOL_NAME,
    add_tool_tokens,
    encode_tool_exchange,
    parse_tool_call,
    tool_answer,
    tool_call_text,
)

QUESTION = "What is 523 + 47? Put the final answer in \\boxed{}."


@pytest.fixture(scope="module")
def tokenizer():
    tok = build_tokenizer()
    add_tool_tokens(tok)
    return tok


def test_the_warmup_exchange_is_the_agent_loops_token_for_token(tokenizer):
    from verl.utils.tokenizer.continuous_token_wiring import create_continuous_token_builder

    final = response_text("570")
    ids, mask, n_prompt = encode_tool_exchange(tokenizer, QUESTION, "523 + 47", final)
    builder = create_continuous_token_builder(tokenizer, hf_model_type="qwen2")  # the tiny model's model_type
    user = [{"role": "user", "content": QUESTION}]
    prompt = builder.build_initial_tokens(user)
    call = tokenizer.encode(tool_call_text("523 + 47"), add_special_tokens=False) + [tokenizer.eos_token_id]
    after_call = builder.merge_assistant_tokens(prompt, call).token_ids
    messages = user + [{"role": "assistant", "content": ""}]
    merged = builder.merge_context_tokens(messages, messages + [{"role": "tool", "content": "570"}], after_call)
    answer = tokenizer.encode(final, add_special_tokens=False) + [tokenizer.eos_token_id]
    assert ids == merged.token_ids + answer
    assert n_prompt == len(prompt)
    # the loss mask: the model's two turns (their <|im_end|> included), not the newline and the tool's turn
    expected = [0] * len(prompt) + [1] * len(call) + [0] * (len(merged.token_ids) - len(after_call)) + [1] * len(answer)
    assert mask == expected
    # the two tool tokens are single added tokens, as Qwen2.5's
    assert tokenizer.convert_tokens_to_ids("<tool_call>") in ids and len(ids) < 200


def test_verls_hermes_parser_reads_the_call_and_the_loader_runs_the_calculator(tokenizer):
    from verl.experimental.agent_loop.tool_parser import ToolParser
    from verl.tools.function_tool import load_function_tools_from_path

    parser = ToolParser.get_tool_parser("hermes", tokenizer)
    turn = tokenizer.encode(tool_call_text("523 + 47"), add_special_tokens=False) + [tokenizer.eos_token_id]
    _, calls = asyncio.run(parser.extract_tool_calls(turn))
    assert [(c.name, c.arguments) for c in calls] == [(TOOL_NAME, '{"expression": "523 + 47"}')]
    assert parse_tool_call(tokenizer.decode(turn)) == (TOOL_NAME, {"expression": "523 + 47"})

    (tool,) = load_function_tools_from_path(str(CALCULATOR_FILE))
    assert tool.name == TOOL_NAME
    assert list(tool.tool_schema.function.parameters.properties) == ["expression"]

    async def call(arguments):
        return await tool.call(arguments)

    assert asyncio.run(call({"expression": "523 + 47"})) == "570"
    # bad calls: an answer that says what was wrong, never an exception out of the tool
    for arguments, says in (
        ({"expression": 570}, "must be a string"),
        ({"expression": "9 ** 9 ** 9"}, "larger than"),
        ({"expression": "__import__('os')"}, "not allowed"),
        ({"expression": "1 / 0"}, "division by zero"),
    ):
        answer = asyncio.run(call(arguments))
        assert answer.startswith("error: ") and says in answer, answer
    # what the in-process check answers for calls verl would not pass to the function
    assert tool_answer("search", {"q": 1}).startswith("Unknown function 'search'")
    assert tool_answer(TOOL_NAME, {"expr": "1 + 1"}).startswith(f"Error executing tool '{TOOL_NAME}'")


def test_the_tool_reward_and_the_tool_turn_metrics(tokenizer):
    from recipe.exgrpo.harness.tool_reward import compute_score
    from recipe.exgrpo.replay_step.metrics import tool_turn_metrics

    ids, mask, n_prompt = encode_tool_exchange(tokenizer, QUESTION, "523 + 47", response_text("570"))
    exchange = tokenizer.decode(ids[n_prompt:], skip_special_tokens=True)  # what verl's reward manager decodes
    assert "<tool_call>" in exchange  # a non-special added token survives skip_special_tokens
    right = compute_score("toy_arithmetic_hard", exchange, "570")
    assert right == {"score": 1.0, "acc": 1.0, "think_closed": 1.0, "tool_call": 1.0, "tool_answered": 1.0}
    wrong = compute_score("toy_arithmetic_hard", exchange.replace("boxed{570}", "boxed{571}"), "570")
    assert wrong["score"] == 0.0 and wrong["tool_call"] == 1.0 and wrong["tool_answered"] == 1.0
    # a call the agent loop never answered (the exchange ends on it): called, not answered
    cut = tokenizer.decode(ids[n_prompt : n_prompt + 30], skip_special_tokens=True)  # cut inside the call
    unanswered = tokenizer.decode(
        tokenizer.encode(tool_call_text("523 + 47"), add_special_tokens=False), skip_special_tokens=True
    )
    assert compute_score("s", unanswered, "570")["tool_answered"] == 0.0
    assert compute_score("s", unanswered, "570")["tool_call"] == 1.0
    assert compute_score("s", cut, "570")["tool_call"] == 0.0  # no closing marker: the parser reads no call
    one_turn = compute_score("toy_arithmetic_easy", response_text("81"), "81")
    assert one_turn["score"] == 1.0 and one_turn["tool_call"] == 0.0
    assert set(compute_score("s", None, "1")) == set(right)  # same keys, whatever the input

    response = np.asarray(mask[n_prompt:] + [0] * 8)
    one = np.asarray([1] * 20 + [0] * (len(response) - 20))
    masks = np.stack([response, one, response, one])
    lengths = np.asarray([len(mask) - n_prompt, 20] * 2)  # the padding after each response is not its own
    scores = np.asarray([1.0, 0.0, 0.0, 1.0])
    metrics = tool_turn_metrics(scores, masks, np.asarray([True, True, True, False]), lengths)
    assert metrics == {
        "exgrpo/multi_turn/replayed_tool_turn_share": 0.0,
        "exgrpo/multi_turn/tool_turn_share": pytest.approx(2 / 3),
        "exgrpo/multi_turn/reward_with_tool_turn": 0.5,
        "exgrpo/multi_turn/reward_without_tool_turn": 0.0,
    }
    replayed_call = tool_turn_metrics(scores, masks, np.asarray([True, True, False, True]), lengths)
    assert replayed_call["exgrpo/multi_turn/replayed_tool_turn_share"] == 1.0
    assert replayed_call["exgrpo/multi_turn/tool_turn_share"] == pytest.approx(1 / 3)


def test_rows_with_a_tool_turn_match_the_per_row_definition():
    """The vectorised check against its definition, one row at a time: a context token (0) within the response's
    length beside its model tokens (1); the padding after the length and rows without a model token do not count."""
    from recipe.exgrpo.replay_step.metrics import rows_with_tool_turn

    rng = np.random.default_rng(0)
    masks = (rng.random((500, 12)) < rng.random((500, 1))).astype(np.int64)
    lengths = rng.integers(0, 13, 500)
    masks[np.arange(12)[None, :] >= lengths[:, None]] = 0  # the padding: never the model's
    masks[:3], lengths[:3] = [[0] * 12, [1] * 5 + [0] * 7, [1, 1, 0, 1] + [0] * 8], [12, 5, 4]

    def one(mask, length):
        return bool(mask[:length].any()) and not mask[:length].all()

    expected = np.asarray([one(m, n) for m, n in zip(masks, lengths)])
    assert list(expected[:3]) == [False, False, True] and 0 < expected.sum() < len(masks)
    assert (rows_with_tool_turn(masks, lengths) == expected).all()


def test_an_exchange_cut_inside_the_tools_answer_holds_a_tool_turn():
    """The response length cut the exchange inside the tool's answer: a model turn, then tool tokens up to the
    end, no model token after them. Its mask is the mask of a one-turn answer followed by padding (zeros after the
    last 1), so only the response's length tells them apart: the cut exchange has a tool turn, the padded answer
    has none. Counted by the mask alone (the definition before: a 0 before the last 1), the cut exchange had no
    tool turn, and this test failed."""
    from recipe.exgrpo.replay_step.metrics import rows_with_tool_turn, tool_turn_metrics

    mask = np.asarray([[1, 1, 1, 0, 0, 0, 0, 0]] * 2)
    lengths = np.asarray([8, 3])  # cut in the tool's answer; a one-turn answer of 3 tokens and its padding
    assert rows_with_tool_turn(mask, lengths).tolist() == [True, False]
    metrics = tool_turn_metrics(np.asarray([0.0, 1.0]), mask, np.asarray([True, True]), lengths)
    assert metrics["exgrpo/multi_turn/tool_turn_share"] == 0.5
    assert metrics["exgrpo/multi_turn/reward_with_tool_turn"] == 0.0
    with pytest.raises(ValueError, match="2 lengths for 1 rows"):
        rows_with_tool_turn(mask[:1], lengths)


def test_the_tool_assets_are_their_own_and_the_call_share_is_part_of_the_digest():
    from recipe.exgrpo.harness.assets import asset_spec

    plain, tools = asset_spec("hf"), asset_spec("hf", tools=True)
    assert plain.tools is None and tools.tools.call_share == 0.25
    assert len({plain.digest(), tools.digest(), asset_spec("vllm", tools=True).digest()}) == 3
    assert asset_spec("hf", tools=True, call_share=0.25).digest() == tools.digest()
    rare = asset_spec("hf", tools=True, call_share=0.05)
    assert rare.tools.call_share == 0.05 and rare.digest() != tools.digest()
    with pytest.raises(ValueError, match="call_share is the calculator task's"):
        asset_spec("hf", call_share=0.05)
    with pytest.raises(ValueError, match=r"call_share must be in \[0, 1\], got 1.5"):
        asset_spec("hf", tools=True, call_share=1.5)
