"""Generation with a different number of samples per prompt, through the legacy trainer's own rollout path.

How verl 0.9.1's legacy ``RayPPOTrainer.fit`` generates (ray_trainer.py): it takes the prompt batch, strips it to
the generation keys (``_get_gen_batch``, reached through ``verl_compat.gen_batch``), repeats it ``rollout.n`` times
itself (``gen_batch.repeat(rollout.n, interleave=True)``) and hands the already-expanded batch to
``self.async_rollout_manager.generate_sequences(...)``. The agent-loop manager produces **exactly one response
per row**; ``rollout.n`` plays no part in generation. So a trainer that needs K samples for fresh questions and
K−1 for replayed ones (docs/algorithm.md §6) expands the batch with per-row counts and calls the same manager:
:func:`generate_with_counts`, with the padding verl's manager needs when it splits the batch across several
agent-loop workers. ``RayExGRPOTrainer._generate`` uses it; ``python -m tests.e2e.expanded_generation_probe``
checks it on the real stack (CPU backend, Ray, hf rollout).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from verl.protocol import pad_dataproto_to_divisor, unpad_dataproto

__all__ = ["expand_by_counts", "generate_with_counts"]


def expand_by_counts(batch: Any, counts: Sequence[int]) -> Any:
    """Row i of ``batch`` (a ``DataProto``) repeated ``counts[i]`` times, consecutively (uid and all other keys
    repeated too)."""
    counts = [int(c) for c in counts]
    if len(counts) != len(batch):
        raise ValueError(f"counts has {len(counts)} entries for a batch of {len(batch)} prompts")
    if any(c < 1 for c in counts):
        raise ValueError(f"every prompt needs at least one sample, got counts={counts}")
    return batch.sample_level_repeat(counts)


def generate_with_counts(
    rollout_manager: Any,
    gen_batch: Any,
    counts: Sequence[int],
    *,
    num_workers: int,
    sleep: Callable[[], None] | None = None,
) -> Any:
    """Generate ``counts[i]`` responses for prompt ``i`` with a legacy ``RayPPOTrainer``'s rollout manager
    (``trainer.async_rollout_manager``), whose agent-loop workers (``rollout.agent.num_workers``) each take an equal
    share of the rows.

    ``gen_batch`` is what ``verl_compat.gen_batch(trainer, batch)`` returns (with ``uid`` set and
    ``meta_info['global_steps']`` filled in). Returns one output row per sample, prompt-major, aligned with
    ``expand_by_counts(batch, counts)`` of the full batch (repeat the full batch the same way before ``union``).
    ``sleep`` (the checkpoint manager's ``sleep_replicas``) puts the rollout replicas to sleep once the responses are
    in, so the actor may use the GPUs.
    """
    expanded = expand_by_counts(gen_batch, counts)
    padded, pad_size = pad_dataproto_to_divisor(expanded, int(num_workers))
    output = rollout_manager.generate_sequences(padded)
    if sleep is not None:
        sleep()
    return unpad_dataproto(output, pad_size=pad_size)
