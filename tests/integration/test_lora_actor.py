"""Under LoRA only the adapter trains: verl's own LoRA wrapping of the FSDP actor's model (the engine's
``_build_lora_module``, with the settings verl reads from ``actor_rollout_ref.model``), ExGRPO's mixed loss on fresh
and replayed rows, one AdamW step: every gradient is an adapter parameter's, every base weight is byte-identical after
the step, the adapter's B matrices (zero at the start, so the adapted model starts as the base model) moved, and the
policy's log-probs moved with them."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

pytest.importorskip("peft")
from verl.workers.engine.fsdp.transformer_impl import FSDPEngine  # noqa: E402

from exgrpo.objective.loss import mixed_policy_loss  # noqa: E402
from exgrpo.objective.settings import LossSettings  # noqa: E402
from tests.helpers.tiny_qwen2 import tiny_qwen2  # noqa: E402

VOCAB, PROMPT, RESPONSE, ROWS = 48, 5, 7, 6


def _tiny_model() -> torch.nn.Module:
    torch.manual_seed(0)
    return tiny_qwen2(VOCAB, tie_word_embeddings=False).float()


def _lora(module: torch.nn.Module, rank: int = 4) -> torch.nn.Module:
    """The model wrapped as verl's FSDP engine wraps it for ``lora_rank > 0`` (its own method, on the fields of
    ``actor_rollout_ref.model`` it reads)."""
    model_config = SimpleNamespace(
        lora_rank=rank,
        lora_alpha=8,
        target_modules="all-linear",
        target_parameters=None,
        exclude_modules=None,
        lora_adapter_path=None,
        use_shm=False,
    )
    return FSDPEngine._build_lora_module(SimpleNamespace(model_config=model_config), module)


def _response_log_probs(model: torch.nn.Module, tokens: torch.Tensor) -> torch.Tensor:
    logits = model(input_ids=tokens).logits[:, PROMPT - 1 : -1]
    return torch.log_softmax(logits.float(), dim=-1).gather(-1, tokens[:, PROMPT:, None]).squeeze(-1)


def test_only_the_adapter_receives_gradients_and_changes():
    model = _lora(_tiny_model())
    base = {n: p.detach().clone() for n, p in model.named_parameters() if not p.requires_grad}
    adapter = {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}
    assert adapter and all(".lora_A." in n or ".lora_B." in n for n in adapter), sorted(adapter)[:4]
    assert sum(t.numel() for t in base.values()) > sum(t.numel() for t in adapter.values()) > 0

    g = torch.Generator().manual_seed(1)
    tokens = torch.randint(0, VOCAB, (ROWS, PROMPT + RESPONSE), generator=g)
    mask = torch.ones(ROWS, RESPONSE)
    mask[0, -2:] = 0
    replay = torch.tensor([False, False, False, True, False, True])
    with torch.no_grad():
        old = _response_log_probs(model, tokens)
    behaviour = old - 0.1 * torch.rand(ROWS, RESPONSE, generator=g)  # the stored log-probs of an older policy
    advantages = torch.tensor([1.0, -1.0, 0.5, 1.0, -0.5, 0.8])
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)

    log_prob = _response_log_probs(model, tokens)
    loss, metrics = mixed_policy_loss(
        log_prob, old, behaviour, advantages, mask, replay, LossSettings(), mixed=True, replay_ratio=0.5
    )
    loss.backward()
    assert metrics["exgrpo/replayed_tokens"] > 0
    with_grad = {n for n, p in model.named_parameters() if p.grad is not None}
    assert with_grad == set(adapter), "a gradient outside the adapter (or an adapter weight without one)"
    assert any(model.get_parameter(n).grad.abs().sum() > 0 for n in adapter if ".lora_B." in n)
    optimizer.step()

    for n, before in base.items():
        assert torch.equal(model.get_parameter(n), before), f"{n}: a base weight changed"
    moved = [n for n in adapter if not torch.equal(model.get_parameter(n), adapter[n])]
    assert any(".lora_B." in n for n in moved), "the adapter did not change"
    with torch.no_grad():
        assert (_response_log_probs(model, tokens) - old).abs().max() > 1e-4, "the policy did not change"


def test_a_fresh_adapter_leaves_the_policy_unchanged_and_turning_it_off_gives_the_base_model():
    """B starts at zero: the adapted policy at step 0 is the base model's, token for token (so the first rollout and
    the first stored behaviour log-probs are the base model's)."""
    plain = _tiny_model()
    g = torch.Generator().manual_seed(2)
    tokens = torch.randint(0, VOCAB, (3, PROMPT + RESPONSE), generator=g)
    with torch.no_grad():
        expected = _response_log_probs(plain, tokens)
        adapted = _lora(_tiny_model())
        assert torch.allclose(_response_log_probs(adapted, tokens), expected, atol=1e-6)
