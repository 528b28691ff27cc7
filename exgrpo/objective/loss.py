"""``mixed_policy_loss``: ExGRPO's objective for one micro-batch (docs/algorithm.md §8, paper Eq. 4).

Checks the inputs, builds both terms per token (:mod:`exgrpo.objective.terms`), applies the optional Eq. 4 term
weights, aggregates like verl (:mod:`exgrpo.objective.aggregation`), subtracts the entropy bonus and computes the
metrics (:mod:`exgrpo.objective.metrics`). Every setting comes from one :class:`LossSettings`.
"""

from __future__ import annotations

from functools import partial

import torch

from exgrpo.objective.aggregation import Normalisers, aggregate_loss
from exgrpo.objective.metrics import loss_metrics
from exgrpo.objective.settings import LossSettings
from exgrpo.objective.terms import TokenTerms, check_shape, fresh_term, log_ratios, replayed_term, term_weights

__all__ = ["mixed_policy_loss"]

_ONE_RANK = Normalisers()


def _checked_advantages(
    log_prob: torch.Tensor,
    old_log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    replay_mask: torch.Tensor,
    entropy: torch.Tensor | None,
) -> torch.Tensor:
    """Shape checks naming the argument; returns ``advantages`` as [batch, response_len]."""
    if log_prob.dim() != 2:
        raise ValueError(f"log_prob must be [batch, response_len], got shape {tuple(log_prob.shape)}")
    shape = log_prob.shape
    check_shape("old_log_prob", old_log_prob, shape)
    check_shape("response_mask", response_mask, shape)
    if advantages.dim() == 1 and advantages.shape[0] == shape[0]:
        advantages = advantages.unsqueeze(-1).expand(shape)
    check_shape("advantages", advantages, shape)
    if replay_mask.shape != (shape[0],):
        raise ValueError(
            f"replay_mask must have shape ({shape[0]},) (one flag per row), got {tuple(replay_mask.shape)}"
        )
    if entropy is not None:
        check_shape("entropy", entropy, shape)
    return advantages


def mixed_policy_loss(
    log_prob: torch.Tensor,
    old_log_prob: torch.Tensor,
    behaviour_log_prob: torch.Tensor | None,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    replay_mask: torch.Tensor,
    settings: LossSettings,
    *,
    mixed: bool = False,
    replay_ratio: float | None = None,
    experience_group_mask: torch.Tensor | None = None,
    entropy: torch.Tensor | None = None,
    normalisers: Normalisers = _ONE_RANK,
    metric_prefix: str = "exgrpo/",
) -> tuple[torch.Tensor, dict[str, float]]:
    """ExGRPO's mixed-policy loss for one micro-batch; returns (loss, metrics).

    Tensors are [batch, response_len] except ``replay_mask`` ([batch] bool: the row is a replayed trajectory)
    and ``advantages`` ([batch, response_len] or per-row [batch]). ``behaviour_log_prob`` (the stored
    log-probs of the policy that produced a replayed trajectory) is read on replayed rows only and may be
    None when no row is replayed or ``settings.is_correction`` is False; its values on fresh rows are ignored.

    Args:
        settings: the run's loss settings (shaping, IS correction, clips, aggregation, term weights, entropy
            coefficient; :class:`LossSettings`).
        mixed: whether this step is in mixed mode (after the delayed start); resolves ``fresh_clip=released``.
        replay_ratio: this step's scheduled ρ; read only with ``settings.weight_terms_by_ratio``.
        experience_group_mask: [batch] bool, the rows of the Eq. 4 experience term (whole replay groups,
            :func:`exgrpo.advantage.experience_group_rows`); None = the replayed rows alone.
        entropy: per-token entropies for the bonus loss −= entropy_coeff · agg(entropy); required when
            ``settings.entropy_coeff`` is not 0.
        normalisers: verl's per-mini-batch figures (:class:`Normalisers`); default: the micro-batch alone.
        metric_prefix: prefix of every metric name (see :data:`LOSS_METRIC_KINDS` for the names).
    """
    advantages = _checked_advantages(log_prob, old_log_prob, advantages, response_mask, replay_mask, entropy)
    if settings.entropy_coeff != 0.0 and entropy is None:
        raise ValueError(f"entropy_coeff={settings.entropy_coeff} but no entropy tensor was given")

    # ---- both terms per token (docs/algorithm.md §8)
    mask = response_mask.bool()
    replay_rows = replay_mask.to(device=mask.device).bool()
    log_ratio = log_ratios(log_prob, old_log_prob, behaviour_log_prob, mask, replay_rows, settings)
    # the advantage is zeroed on padding too (it may hold NaN there)
    adv = torch.where(mask, advantages.to(log_prob.dtype), torch.zeros_like(log_prob))
    ratio = torch.exp(log_ratio)
    fresh = fresh_term(adv, ratio, settings, mixed=mixed)
    replayed = replayed_term(adv, log_ratio, settings)
    replayed_tokens = replay_rows.unsqueeze(-1) & mask
    terms = TokenTerms(
        mask=mask,
        replay_rows=replay_rows,
        fresh_tokens=~replay_rows.unsqueeze(-1) & mask,
        replayed_tokens=replayed_tokens,
        log_ratio=log_ratio,
        ratio=ratio,
        fresh=fresh,
        replayed=replayed,
        losses=torch.where(replayed_tokens, replayed.losses, fresh.losses),
        dtype=log_prob.dtype,
    )

    # ---- paper Eq. 4's term weights (exgrpo.weight_terms_by_ratio), the aggregation, the entropy bonus
    token_losses = terms.losses
    weights = term_weights(
        terms.replay_rows,
        settings,
        replay_ratio=replay_ratio,
        experience_group_mask=experience_group_mask,
        dtype=log_prob.dtype,
    )
    if weights is not None:
        token_losses = token_losses * weights.unsqueeze(-1)

    policy_mode, entropy_mode = settings.aggregation_modes()
    aggregate = partial(
        aggregate_loss, loss_mask=terms.mask, loss_scale_factor=settings.loss_scale_factor, **normalisers.as_kwargs()
    )
    pg_loss = aggregate(token_losses, loss_agg_mode=policy_mode)
    loss = pg_loss
    entropy_loss = None
    if entropy is not None:
        entropy_loss = aggregate(entropy, loss_agg_mode=entropy_mode)
        loss = loss - settings.entropy_coeff * entropy_loss

    metrics = loss_metrics(
        terms, token_losses, pg_loss, entropy_loss, partial(aggregate, loss_agg_mode=policy_mode), prefix=metric_prefix
    )
    return loss, metrics
