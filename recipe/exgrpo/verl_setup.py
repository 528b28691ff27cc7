"""What both trainer adapters set up from verl's config and objects: the replay step of a run, and the mixed loss in
the actor workers (``recipe/exgrpo/legacy/trainer.py``, ``recipe/exgrpo/v1/trainer.py``)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from functools import partial
from typing import Any

from exgrpo.objective import LossSettings
from recipe.exgrpo.actor_loss import exgrpo_actor_loss
from recipe.exgrpo.config_bridge import exgrpo_config_from_hydra, replay_response_width, reward_model_colocated
from recipe.exgrpo.replay_step import ReplayStep
from recipe.exgrpo.replay_step.fields import ROW_KEY
from recipe.exgrpo.tool_turns import ToolCallDetector

__all__ = ["dataset_rows", "install_mixed_loss", "replay_step_for"]


def dataset_rows(dataloader: Iterable[dict]) -> Iterator[list[int]]:
    """The dataset rows of each batch of one pass of verl's data loader (which keeps its own position)."""
    return ([int(r) for r in batch_dict[ROW_KEY]] for batch_dict in dataloader)


def replay_step_for(
    config: Any, train_dataset: Any, tokenizer: Any, epoch_batches: Callable[[], Iterable]
) -> ReplayStep:
    """The replay step of a run: the validated ``exgrpo:`` block, the training data's stable question ids
    (``ExGRPODataset``; TypeError naming ``data.custom_cls`` otherwise), and what the run's verl config says about the
    step (its response width, tools, a colocated reward model, the advantage's std division, the trace folder)."""
    if not hasattr(train_dataset, "question_ids"):
        raise TypeError(
            "ExGRPO needs data.custom_cls = recipe/exgrpo/dataset.py:ExGRPODataset (stable question ids); got "
            f"{type(train_dataset).__name__}"
        )
    return ReplayStep(
        exgrpo_config_from_hydra(config),
        questions_per_step=int(config.data.train_batch_size),
        question_ids=train_dataset.question_ids,
        row_of_question=train_dataset.row_of(),
        epoch_batches=epoch_batches,
        pad_token_id=tokenizer.pad_token_id,
        response_width=replay_response_width(config),
        # rollouts that may call tools: a trajectory whose exchange ended on an unanswered tool call is not stored
        ends_in_tool_call=ToolCallDetector.from_config(config, tokenizer),
        colocated_reward_model=reward_model_colocated(config),
        norm_adv_by_std=bool(config.algorithm.get("norm_adv_by_std_in_grpo", False)),
        trace_dir=config.trainer.default_local_dir,
    )


def install_mixed_loss(actor_wg: Any, config: Any, replay: ReplayStep, on_actor_call: Callable[[], None]) -> None:
    """The mixed loss in every actor worker, once (verl warns that swapping the loss per step is unreliable,
    docs/cpu_backend.md), and ``on_actor_call`` on every actor forward call (the old-log-prob pass and any other
    caller: a step must make as many as a GRPO step, ``exgrpo/actor_log_prob_calls``)."""
    from verl.utils.config import omega_conf_to_dataclass

    actor_config = omega_conf_to_dataclass(config.actor_rollout_ref.actor)
    actor_wg.set_loss_fn(partial(exgrpo_actor_loss, config=actor_config, settings=LossSettings.from_config(replay.cfg)))
    compute_log_prob = actor_wg.compute_log_prob

    def counted_compute_log_prob(*args, **kwargs):
        on_actor_call()
        return compute_log_prob(*args, **kwargs)

    actor_wg.compute_log_prob = counted_compute_log_prob
