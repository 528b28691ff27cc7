"""The two terms of the mixed objective per token (docs/algorithm.md §8, paper Eq. 4) and their Eq. 4 weights.

* :func:`log_ratios`: log w against the recomputed old log-probs (fresh rows) or the stored behaviour log-probs
  (replayed rows, IS correction), zero on padding, clamped to ±20 like verl.
* :func:`fresh_term`: PPO clip (ε_low/ε_high, optional dual clip for A < 0: verl's ``vanilla`` loss, same
  operations) or the released code's unclipped −A·w, as ``exgrpo.fresh_clip`` says for this step.
* :func:`replayed_term`: −A·f(w), f from the shaping registry, never clipped.
* :func:`term_weights`: ρ for the experience term, 1−ρ for the on-policy term (``exgrpo.weight_terms_by_ratio``).
* :class:`TokenTerms`: all of it for one micro-batch (built by :func:`exgrpo.objective.mixed_policy_loss`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from exgrpo.objective.settings import LossSettings
from exgrpo.objective.shaping import get_shaping_fn

__all__ = [
    "LOG_RATIO_CLAMP",
    "FreshTerm",
    "ReplayedTerm",
    "TokenTerms",
    "fresh_term",
    "log_ratios",
    "replayed_term",
    "term_weights",
]

# verl clamps the log-ratio to ±20 before exp (core_algos.compute_policy_loss_vanilla). The clamp is the
# identity inside (−20, 20), so gradients there are untouched; outside it the gradient is zero and
# exp(20) ≈ 4.9e8 stays finite in float32 (and bf16).
LOG_RATIO_CLAMP = 20.0


def check_shape(name: str, t: torch.Tensor, shape: torch.Size) -> None:
    if t.shape != shape:
        raise ValueError(f"{name} must have shape {tuple(shape)} like log_prob, got {tuple(t.shape)}")


def log_ratios(
    log_prob: torch.Tensor,
    old_log_prob: torch.Tensor,
    behaviour_log_prob: torch.Tensor | None,
    mask: torch.Tensor,
    replay_rows: torch.Tensor,
    settings: LossSettings,
) -> torch.Tensor:
    """log w per token, zero on padding and clamped to ±:data:`LOG_RATIO_CLAMP`.

    The reference is the recomputed old log-prob, except on replayed rows with ``is_correction``: there it is
    the stored behaviour log-prob (read on replayed rows only; it may be None when no row is replayed).
    """
    ref_log_prob = old_log_prob
    if settings.is_correction and bool(replay_rows.any()):
        if behaviour_log_prob is None:
            raise ValueError("behaviour_log_prob is required: the batch has replayed rows and is_correction=True")
        check_shape("behaviour_log_prob", behaviour_log_prob, log_prob.shape)
        ref_log_prob = torch.where(replay_rows.unsqueeze(-1), behaviour_log_prob.to(old_log_prob.dtype), old_log_prob)
    # Zero the log-ratio on masked-out positions before anything else: padding may hold −inf/NaN log-probs, and
    # this keeps both the loss and its gradient exactly zero there.
    log_ratio = torch.where(mask, log_prob - ref_log_prob, torch.zeros_like(log_prob))
    return torch.clamp(log_ratio, min=-LOG_RATIO_CLAMP, max=LOG_RATIO_CLAMP)


@dataclass(frozen=True)
class FreshTerm:
    """Per-token loss of the on-policy (fresh) term at every position, and where its clips act."""

    losses: torch.Tensor
    #: the ε clip is active (with the clip off: would be) — verl's pg_clipfrac
    clipped: torch.Tensor
    #: the dual clip is active (None when the dual clip is off) — verl's pg_clipfrac_lower
    clipped_lower: torch.Tensor | None


def fresh_term(adv: torch.Tensor, ratio: torch.Tensor, settings: LossSettings, *, mixed: bool) -> FreshTerm:
    """PPO clip with optional dual clip (verl's ``vanilla`` loss) or unclipped −A·w, per ``settings`` this step."""
    pg_unclipped = -adv * ratio
    pg_clipped = -adv * torch.clamp(ratio, 1.0 - settings.clip_ratio_low, 1.0 + settings.clip_ratio_high)
    pg_max = torch.maximum(pg_unclipped, pg_clipped)
    clip_ratio_c = settings.dual_clip_c
    if clip_ratio_c is not None:
        pg_dual = torch.minimum(-adv * clip_ratio_c, pg_max)
        pg_ppo = torch.where(adv < 0, pg_dual, pg_max)
    else:
        pg_ppo = pg_max
    with torch.no_grad():
        clipped = torch.gt(pg_clipped, pg_unclipped)
        clipped_lower = torch.gt(pg_max, -adv * clip_ratio_c) & (adv < 0) if clip_ratio_c is not None else None
    losses = pg_ppo if settings.fresh_clip_on(mixed) else pg_unclipped
    return FreshTerm(losses=losses, clipped=clipped, clipped_lower=clipped_lower)


@dataclass(frozen=True)
class ReplayedTerm:
    """Per-token loss of the experience (replayed) term at every position, and the shaped weight f(w)."""

    losses: torch.Tensor
    shaped: torch.Tensor


def replayed_term(adv: torch.Tensor, log_ratio: torch.Tensor, settings: LossSettings) -> ReplayedTerm:
    """−A·f(w) with f = ``settings.shaping`` (β = ``settings.shaping_beta``); never clipped."""
    shaped = get_shaping_fn(settings.shaping)(log_ratio, beta=settings.shaping_beta)
    return ReplayedTerm(losses=-adv * shaped, shaped=shaped)


def term_weights(
    replay_rows: torch.Tensor,
    settings: LossSettings,
    *,
    replay_ratio: float | None,
    experience_group_mask: torch.Tensor | None,
    dtype: torch.dtype,
) -> torch.Tensor | None:
    """Per-row weights of paper Eq. 4, or None with ``weight_terms_by_ratio`` off (the release weights only
    through the batch split). ρ on the experience term's rows — ``experience_group_mask`` when given (whole replay
    groups, :func:`exgrpo.advantage.experience_group_rows`), else the replayed rows — and 1−ρ on the others.

    ``replay_ratio`` is the schedule's ρ of the step, in [0, 1) since ``exgrpo.replay_ratio`` is validated with the
    config: its range is not checked again here; only its absence is an error (the caller did not pass it)."""
    if not settings.weight_terms_by_ratio:
        return None
    if replay_ratio is None:
        raise ValueError("exgrpo.weight_terms_by_ratio needs this step's replay_ratio (the schedule's rho), got None")
    n = replay_rows.shape[0]
    if experience_group_mask is not None:
        if experience_group_mask.shape != (n,):
            raise ValueError(f"experience_group_mask must have shape ({n},), got {tuple(experience_group_mask.shape)}")
        term_rows = experience_group_mask.to(device=replay_rows.device).bool()
        if bool((replay_rows & ~term_rows).any()):
            raise ValueError("experience_group_mask must include every replayed row (its group is replayed)")
    else:
        term_rows = replay_rows
    return torch.where(term_rows, replay_ratio, 1.0 - replay_ratio).to(dtype)


@dataclass(frozen=True)
class TokenTerms:
    """One micro-batch, per token: which tokens are fresh or replayed, w, both terms, and the mixed losses."""

    mask: torch.Tensor
    replay_rows: torch.Tensor
    fresh_tokens: torch.Tensor
    replayed_tokens: torch.Tensor
    log_ratio: torch.Tensor
    ratio: torch.Tensor
    fresh: FreshTerm
    replayed: ReplayedTerm
    #: the replayed term's loss on replayed tokens, the fresh term's elsewhere (before any Eq. 4 weights)
    losses: torch.Tensor
    #: dtype of the model's log-probs (the metrics' clip fractions are computed in it)
    dtype: torch.dtype
