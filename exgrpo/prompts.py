"""Prompt formats shared by the preprocessing commands, the launch scripts and the evaluation.

Three ways a question reaches a model:

- ``chat`` (every backbone but Llama-3.1-8B base): verl parquet rows hold messages (the released LUFFY system
  instruction, then the question as the user message) and the model's own chat template renders them. The
  released Qwen2.5-Math-7B backbone is a 16k-context "think" variant whose template is ChatML with a generation
  prompt ending in ``<think>\\n``, so every response starts inside the think block and must close ``</think>``.
- ``llama_base`` (the paper's Llama-3.1-8B base setting): no system prompt and no chat template, only the text
  ``LLAMA_BASE_PROMPT`` after the tokenizer's BOS token. The preprocessing commands write that text as the one
  user message (``--prompt-style llama_base``) and the launch script renders it verbatim with
  ``RAW_CHAT_TEMPLATE`` as verl's ``actor_rollout_ref.model.custom_chat_template``.
- ``tir`` (tool-integrated reasoning, scripts/train/*_tir.sh): ``chat`` with a system instruction that says a Python
  tool is available and asks for the final answer in ``\\boxed{}``, and every row routed to verl's tool agent loop
  (the row's ``agent_name`` column, :data:`STYLE_AGENT_NAMES`). The tool's schema is not in the data: verl passes it
  to ``apply_chat_template(tools=...)`` and the model's template (Qwen2.5's) writes it into the system prompt,
  with the ``<tool_call>`` format to call it.
"""

from __future__ import annotations

PROMPT_STYLES = ("chat", "llama_base", "tir")

#: verl's agent loop for every row of a style (the data's ``agent_name``); a style not listed writes no such column,
#: so verl runs its rows through its default loop (single turn).
STYLE_AGENT_NAMES: dict[str, str] = {"tir": "tool_agent"}

#: The Llama-3.1-8B base prompt of the paper's setting (no system prompt).
LLAMA_BASE_PROMPT = "User: {question} Answer: Let's think step by step.\n"

#: A chat template that renders the messages' contents verbatim after the BOS token, with no role markers and no
#: generation prompt: the prompt text is already complete in the data. Double quotes only, so that it passes
#: through a single-quoted hydra override unchanged (scripts/train/common.sh holds the same string; a test
#: checks that they agree).
RAW_CHAT_TEMPLATE = '{{ bos_token }}{% for message in messages %}{{ message["content"] }}{% endfor %}'


def llama_base_prompt(question: str) -> str:
    """The question in the Llama-3.1-8B base prompt."""
    return LLAMA_BASE_PROMPT.format(question=question)
