"""The actor loss installed in verl's FSDP workers: verl's ``ppo_loss`` contract, ExGRPO's mixed objective.

verl's ``ActorRolloutRefWorker`` calls ``loss_fn(model_output=..., data=micro_batch, dp_group=...)`` once per
micro-batch; the trainer installs ``partial(exgrpo_actor_loss, config=actor_config,
settings=LossSettings.from_config(exgrpo))`` once, at start-up, through the worker group's ``set_loss_fn``. Each
call completes the settings with verl's actor values (``with_actor_config``: clip ε, dual-clip c, aggregation,
L_max, entropy coefficient, read from the ``config`` verl passes, as its own ``ppo_loss`` does). Each
micro-batch carries every per-row tensor of the driver's batch, so the replay mask and the stored behaviour
log-probs reach the loss intact.

The normalisers (``dp_size``, ``batch_num_tokens``, ``global_batch_size``, ``loss_scale_factor``) are passed
through exactly as verl's ``ppo_loss`` does, so the loss scale does not depend on micro-batching or GPU count
(``exgrpo.loss_scale=global``). ``exgrpo.loss_scale=per_rank`` reproduces the released code's scale instead:
each rank's token sum / L_max (``rank-token-sum-norm``), with the entropy bonus as a token mean.
"""

from __future__ import annotations

import sys

from tensordict import TensorDict
from verl.utils.metric import AggregationType, Metric
from verl.workers.utils.padding import no_padding_2_padding

from exgrpo.objective import LOSS_METRIC_KINDS, LossSettings, Normalisers, mixed_policy_loss
from recipe.exgrpo.replay_step.fields import (
    BEHAVIOUR_LOG_PROBS_KEY,
    EXPERIENCE_GROUP_KEY,
    IS_REPLAY_KEY,
    MIXED_KEY,
    RATIO_KEY,
)

METRIC_PREFIX = "exgrpo/"


def with_actor_config(settings: LossSettings, config) -> LossSettings:
    """``settings`` with verl's actor values (``actor_rollout_ref.actor``, the ``config`` verl passes the loss)."""
    return settings.with_actor(
        loss_agg_mode=config.loss_agg_mode,
        loss_scale_factor=config.loss_scale_factor,
        clip_ratio_low=config.clip_ratio_low if config.clip_ratio_low is not None else config.clip_ratio,
        clip_ratio_high=config.clip_ratio_high if config.clip_ratio_high is not None else config.clip_ratio,
        clip_ratio_c=config.get("clip_ratio_c", 3.0),
        entropy_coeff=float(config.entropy_coeff or 0.0),
    )


ENGINES_MODULE = "recipe.exgrpo.runtime.grad_norm_guard"
_HOOK_CHECKED: set[float] = set()


def _check_grad_norm_hook(bound: float) -> None:
    """Once per worker process: the engine hook of ``exgrpo.skip_grad_norm_above`` is installed."""
    if bound in _HOOK_CHECKED:
        return
    # Look the hook up before importing the checker: it counts only if verl's import loaded it (this import,
    # coming late, would wrap the engine registry after the engine was built).
    modules = {ENGINES_MODULE: sys.modules.get(ENGINES_MODULE)}
    from recipe.exgrpo.runtime.grad_norm_guard import check_installed

    check_installed(bound, modules)
    _HOOK_CHECKED.add(bound)


def _kind_to_aggregation(kind: str, loss_aggregation: AggregationType) -> AggregationType:
    return {
        "loss": loss_aggregation,
        "mean": AggregationType.MEAN,
        "max": AggregationType.MAX,
        "count": AggregationType.SUM,
    }.get(kind, AggregationType.MEAN)


def exgrpo_actor_loss(config, model_output, data: TensorDict, dp_group=None, *, settings: LossSettings):
    """Drop-in replacement of verl 0.9.1's ``ppo_loss`` (workers/utils/losses.py) with the mixed objective."""
    if settings.skip_grad_norm_above is not None:
        _check_grad_norm_hook(settings.skip_grad_norm_above)
    log_prob = no_padding_2_padding(model_output["log_probs"], data)
    entropy = model_output.get("entropy", None)
    if entropy is not None:
        entropy = no_padding_2_padding(entropy, data)

    dp_size = data["dp_size"]
    batch_num_tokens = data["batch_num_tokens"]
    global_batch_size = data["global_batch_size"]
    if dp_size > 1 or batch_num_tokens is not None or global_batch_size is not None or config.loss_scale_factor:
        loss_aggregation = AggregationType.SUM
    else:
        loss_aggregation = AggregationType.MEAN

    fields = ["response_mask", "old_log_probs", "advantages", IS_REPLAY_KEY, BEHAVIOUR_LOG_PROBS_KEY, MIXED_KEY]
    missing = [f for f in fields if f not in data.keys()]
    if missing:
        raise KeyError(
            f"ExGRPO actor loss: the micro-batch lacks {missing}; it is installed by RayExGRPOTrainer, which adds "
            "them to every batch (is the loss installed on a plain RayPPOTrainer?)"
        )
    if settings.weight_terms_by_ratio:
        missing = [f for f in (RATIO_KEY, EXPERIENCE_GROUP_KEY) if f not in data.keys()]
        if missing:
            raise KeyError(
                f"exgrpo.weight_terms_by_ratio=true but the micro-batch lacks {missing}: the trainer adds them with "
                "ReplayStep.mark_update_rows (recipe/exgrpo/replay_step/step.py) once the replayed members are appended"
            )
        fields += [RATIO_KEY, EXPERIENCE_GROUP_KEY]
    padded = data.select(*fields).to_padded_tensor()
    replay_mask = padded[IS_REPLAY_KEY].bool().reshape(-1)
    mixed = bool(padded[MIXED_KEY].bool().any().item())
    replay_ratio, experience_group_mask = None, None
    if settings.weight_terms_by_ratio:
        replay_ratio = float(padded[RATIO_KEY].float().reshape(-1)[0].item())
        experience_group_mask = padded[EXPERIENCE_GROUP_KEY].bool().reshape(-1)

    settings = with_actor_config(settings, config)
    loss, raw_metrics = mixed_policy_loss(
        log_prob,
        padded["old_log_probs"],
        padded[BEHAVIOUR_LOG_PROBS_KEY],
        padded["advantages"],
        padded["response_mask"].bool(),
        replay_mask,
        settings,
        mixed=mixed,
        replay_ratio=replay_ratio,
        experience_group_mask=experience_group_mask,
        entropy=entropy if settings.entropy_coeff != 0.0 else None,
        normalisers=Normalisers(dp_size, batch_num_tokens, global_batch_size),
        metric_prefix=METRIC_PREFIX,
    )
    metrics = {}
    for name, value in raw_metrics.items():
        kind = LOSS_METRIC_KINDS.get(name.removeprefix(METRIC_PREFIX), "mean")
        metrics[name] = Metric(value=value, aggregation=_kind_to_aggregation(kind, loss_aggregation))
    # verl's own names, so dashboards built for verl keep working
    metrics["pg_loss"] = Metric(value=raw_metrics[METRIC_PREFIX + "pg_loss"], aggregation=loss_aggregation)
    for verl_name, ours in (("pg_clipfrac", "fresh_clip_frac"), ("ppo_kl", "fresh_ppo_kl")):
        metrics[verl_name] = Metric(value=raw_metrics[METRIC_PREFIX + ours], aggregation=AggregationType.MEAN)
    return loss, metrics
