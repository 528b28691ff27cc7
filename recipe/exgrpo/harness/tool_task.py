"""The toy task with a calculator: what the tiny model is taught about tool calls, and how its exchanges look.

The CPU tool demo (``python -m recipe.exgrpo.cpu_demo --tools``, docs/tools.md) runs the toy sums through verl's tool
agent loop with one function tool, the exact calculator of ``exgrpo.calculator``
(``recipe/exgrpo/agent_tools/calculator.py``). A model has to be taught a tool-call format before RL can reward
it for calling; real models learn theirs in post-training (Qwen2.5's hermes format), the tiny model learns it in its
warm-up (``recipe.exgrpo.harness.assets`` with a :class:`ToolUseSpec`):

- the tokenizer gets ``<tool_call>`` and ``</tool_call>`` as added, non-special tokens, as in Qwen2.5's vocabulary
  (they survive ``skip_special_tokens``, so the reward sees the call);
- a minority of the warm-up examples are whole exchanges, tokenised exactly as verl's agent loop builds them
  (:func:`encode_tool_exchange`): the model's call ``<tool_call>{"name":"calculator","arguments":{"expression":
  "523 + 47"}}</tool_call><|im_end|>``, the newline verl's Qwen builder inserts and the tool's turn rendered by the
  chat template (both loss mask 0, as in RL), then the model's answer ``</think>\\boxed{570}<|im_end|>``; the other
  examples answer in one turn. The prompt never names the tool: like a fine-tuned model, the tiny one knows it.

So the warmed-up model calls the calculator on about the warm-up's share of its answers, on every level; it adds the
two-digit sums well in its head and the three-digit ones badly, and RL can learn where a call pays.
:func:`tool_exchange_counts` measures that in process (the same exchange, the same calculator), for the assets'
report.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from exgrpo.calculator import calculate
from exgrpo.reward.extract import THINK_CLOSE, last_boxed

REPO_ROOT = Path(__file__).resolve().parents[3]
TOOL_CALL_OPEN = "<tool_call>"
TOOL_CALL_CLOSE = "</tool_call>"
TOOL_NAME = "calculator"
#: the verl function-tool file of the calculator (``multi_turn.function_tool_path``)
CALCULATOR_FILE = REPO_ROOT / "recipe" / "exgrpo" / "agent_tools" / "calculator.py"
#: verl's agent loop that calls tools (the ``agent_name`` column of every row of the tool task's data)
TOOL_AGENT = "tool_agent"
#: the call as verl's hermes parser reads it (``tool_parser.py``: the same pattern)
_CALL = re.compile(re.escape(TOOL_CALL_OPEN) + r"(.*?)" + re.escape(TOOL_CALL_CLOSE), re.DOTALL)
# the system and user messages the tool turn is rendered after (any will do: only the tool turn's tokens are kept)
_CONTEXT = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]


@dataclass(frozen=True)
class ToolUseSpec:
    """What the warm-up teaches about the calculator (part of the assets' digest when set)."""

    # share of the warm-up examples that are calculator exchanges, drawn from every level alike
    call_share: float = 0.25
    # longest turn the report samples (a call is ~60 tokens: 2 added tokens, the JSON, the expression)
    eval_max_turn_tokens: int = 80

    def __post_init__(self) -> None:
        if not 0.0 <= self.call_share <= 1.0:
            raise ValueError(f"ToolUseSpec.call_share must be in [0, 1], got {self.call_share}")
        if self.eval_max_turn_tokens < 1:
            raise ValueError(f"ToolUseSpec.eval_max_turn_tokens must be >= 1, got {self.eval_max_turn_tokens}")


def add_tool_tokens(tokenizer) -> list[int]:
    """Add ``<tool_call>`` and ``</tool_call>`` as non-special tokens (Qwen2.5's kind); return their ids."""
    from tokenizers import AddedToken

    tokenizer.add_tokens([AddedToken(t, special=False, normalized=False) for t in (TOOL_CALL_OPEN, TOOL_CALL_CLOSE)])
    return [tokenizer.convert_tokens_to_ids(t) for t in (TOOL_CALL_OPEN, TOOL_CALL_CLOSE)]


def expression_of(a: int, op: str, b: int) -> str:
    """The expression the model copies from the question ``What is 523 + 47? ...``."""
    return f"{a} {op} {b}"


def tool_call_text(expression: str) -> str:
    """The model's calling turn (without its ``<|im_end|>``), hermes format, compact JSON."""
    call = {"name": TOOL_NAME, "arguments": {"expression": expression}}
    return TOOL_CALL_OPEN + json.dumps(call, separators=(",", ":")) + TOOL_CALL_CLOSE


def parse_tool_call(text: str) -> tuple[str, Any] | None:
    """``(name, arguments)`` of the first call in ``text`` as verl's hermes parser reads it, or None (no call, or one
    it cannot decode: verl then ends the exchange)."""
    found = _CALL.findall(text)
    if not found:
        return None
    try:
        call = json.loads(found[0])
        return call["name"], call["arguments"]
    except (ValueError, KeyError, TypeError):
        return None


def tool_answer(name: str, arguments: Any) -> str:
    """What the exchange gets back for a call: the calculator's answer, or the message verl gives for another name."""
    if name != TOOL_NAME:
        return f"Unknown function '{name}'. Available tools: ['{TOOL_NAME}']"
    if not isinstance(arguments, dict) or set(arguments) != {"expression"}:
        # verl calls the function with the arguments as keywords: a wrong set of them raises inside its call
        return f"Error executing tool '{TOOL_NAME}': bad arguments {arguments!r}"
    return calculate(arguments["expression"])


def _ids(tokenizer, text: str) -> list[int]:
    return tokenizer.encode(text, add_special_tokens=False)


def tool_turn_ids(tokenizer, answer: str) -> list[int]:
    """The tokens verl's agent loop appends after a calling turn that ended on ``<|im_end|>``: the newline its Qwen
    builder inserts, then the tool's turn and the next generation prompt, rendered by the chat template."""
    prefix = tokenizer.apply_chat_template(_CONTEXT, tokenize=False)
    full = tokenizer.apply_chat_template(
        _CONTEXT + [{"role": "tool", "content": answer}], tokenize=False, add_generation_prompt=True
    )
    if not full.startswith(prefix):
        raise ValueError("the chat template renders a tool turn by changing what came before it")
    return _ids(tokenizer, "\n") + _ids(tokenizer, full[len(prefix) :])


def prompt_ids(tokenizer, question: str) -> list[int]:
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": question}], add_generation_prompt=True, tokenize=False
    )
    return _ids(tokenizer, text)


def encode_tool_exchange(
    tokenizer, question: str, expression: str, final_text: str
) -> tuple[list[int], list[int], int]:
    """``(ids, loss_mask, n_prompt)`` of one calculator exchange: prompt, the calling turn, the tool's turn, the
    answer turn. The mask is 1 on the model's two turns (their ``<|im_end|>`` included) and 0 on the prompt and the
    tool's tokens, as the agent loop's ``response_mask``."""
    eos = tokenizer.eos_token_id
    prompt = prompt_ids(tokenizer, question)
    call = _ids(tokenizer, tool_call_text(expression)) + [eos]
    tool = tool_turn_ids(tokenizer, calculate(expression))
    answer = _ids(tokenizer, final_text) + [eos]
    ids = prompt + call + tool + answer
    mask = [0] * len(prompt) + [1] * len(call) + [0] * len(tool) + [1] * len(answer)
    return ids, mask, len(prompt)


def tool_data(src: str | Path, dst: str | Path) -> None:
    """``src`` (a toy split) with every row served by verl's tool agent loop (an ``agent_name`` column)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pq.read_table(src)
    table = table.append_column("agent_name", pa.array([TOOL_AGENT] * table.num_rows, pa.string()))
    Path(dst).parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, dst)


def multi_turn_overrides(tool_file: str | Path = CALCULATOR_FILE) -> list[str]:
    """The hydra overrides of a run with the calculator: at most one call and one answer turn after it (a second
    call is never answered, and the recipe does not store an exchange that ends on one)."""
    mt = "actor_rollout_ref.rollout.multi_turn"
    return [
        f"{mt}.enable=True",
        f"{mt}.format=hermes",
        f"{mt}.function_tool_path={tool_file}",
        f"{mt}.max_user_turns=1",
        f"{mt}.max_assistant_turns=2",
    ]


# ---------------------------------------------------------------------------------------------- in-process check
def _generate(model, tokenizer, contexts: Sequence[list[int]], max_new_tokens: int, temperature: float) -> list:
    """One sampled continuation per context (left padding), cut after its first ``<|im_end|>``."""
    import torch
    from transformers import GenerationConfig

    pad, eos = tokenizer.pad_token_id, tokenizer.eos_token_id
    width = max(len(c) for c in contexts)
    input_ids = torch.full((len(contexts), width), pad, dtype=torch.long)
    attention_mask = torch.zeros_like(input_ids)
    for i, ids in enumerate(contexts):
        input_ids[i, width - len(ids) :] = torch.tensor(ids)
        attention_mask[i, width - len(ids) :] = 1
    config = GenerationConfig(
        max_new_tokens=max_new_tokens,
        do_sample=temperature > 0,
        temperature=temperature if temperature > 0 else 1.0,
        top_p=1.0,
        top_k=0 if temperature > 0 else None,
        eos_token_id=[eos, pad],
        pad_token_id=pad,
        bos_token_id=None,
    )
    out = model.generate(input_ids=input_ids, attention_mask=attention_mask, generation_config=config)
    turns = []
    for row in out[:, width:].tolist():
        cut = next((i + 1 for i, t in enumerate(row) if t in (eos, pad)), len(row))
        turns.append([t for t in row[:cut] if t != pad])
    return turns


def tool_exchange_counts(
    model,
    tokenizer,
    rows: list[dict],
    samples_per_question: int,
    temperature: float,
    max_turn_tokens: int,
    seed: int = 0,
    think_gate: bool = True,
) -> dict[str, list[int]]:
    """Per row, over ``samples_per_question`` sampled exchanges: how many were right (``correct``), called the
    calculator (``called``), got a number back from it (``answered``), and called it and were right
    (``correct_called``), run as verl's tool agent loop would (a call, the tool's turn, one answer turn; no call: the
    exchange ends)."""
    import torch

    torch.manual_seed(seed)
    prompts = [prompt_ids(tokenizer, row["prompt"][0]["content"]) for row in rows]
    counts = {key: [0] * len(rows) for key in ("correct", "called", "answered", "correct_called")}
    eos = tokenizer.eos_token_id
    for _ in range(samples_per_question):
        first = _generate(model, tokenizer, prompts, max_turn_tokens, temperature)
        responses = [list(turn) for turn in first]
        follow, follow_rows = [], []
        for i, turn in enumerate(first):
            call = parse_tool_call(tokenizer.decode(turn))
            if call is None:
                continue
            counts["called"][i] += 1
            answer = tool_answer(*call)
            counts["answered"][i] += int(answer.lstrip("-").isdigit())
            tool = tool_turn_ids(tokenizer, answer)
            # verl's Qwen builder inserts the newline only after a turn that ended on <|im_end|>
            responses[i] = turn + (tool if turn and turn[-1] == eos else tool[1:])
            follow.append(prompts[i] + responses[i])
            follow_rows.append(i)
        if follow:
            for i, turn in zip(follow_rows, _generate(model, tokenizer, follow, max_turn_tokens, temperature)):
                responses[i] = responses[i] + turn
        for i, (row, response) in enumerate(zip(rows, responses, strict=True)):
            text = tokenizer.decode(response, skip_special_tokens=True)
            if think_gate:
                if THINK_CLOSE not in text:
                    continue
                text = text.split(THINK_CLOSE, 1)[1]
            right = int(last_boxed(text) == row["reward_model"]["ground_truth"])
            counts["correct"][i] += right
            counts["correct_called"][i] += right * int(i in follow_rows)
    return counts
