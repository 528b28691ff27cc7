"""The smallest Qwen2 causal LM the in-process actor tests build (2 layers, hidden size 32, GQA 4:2): random
weights, seeded by the caller; no file, no download."""

from __future__ import annotations

from typing import Any


def tiny_qwen2(vocab_size: int, **config: Any):
    """A ``Qwen2ForCausalLM`` of ``vocab_size`` tokens; ``config`` overrides or adds ``Qwen2Config`` fields."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    settings = dict(
        vocab_size=vocab_size,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
    )
    return Qwen2ForCausalLM(Qwen2Config(**{**settings, **config}))
