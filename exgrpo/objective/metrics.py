"""The loss metrics of one micro-batch (docs/objective.md, "Metrics"): floats, detached, named by
:data:`LOSS_METRIC_KINDS`, which also says how a trainer combines each over micro-batches."""

from __future__ import annotations

from collections.abc import Callable

import torch

from exgrpo.objective.terms import TokenTerms

__all__ = ["LOSS_METRIC_KINDS", "loss_metrics"]

# How each metric of mixed_policy_loss combines over micro-batches (keys without the prefix):
#   "loss":  a share of the global-batch loss when global normalisers are given -> sum over micro-batches
#            (verl's AggregationType.SUM, as its actor/pg_loss); without them -> mean.
#   "mean":  a per-micro-batch statistic -> mean;  "max": -> max;  "count": token/row counts -> sum.
LOSS_METRIC_KINDS: dict[str, str] = {
    "pg_loss": "loss",
    "fresh_loss": "loss",
    "replayed_loss": "loss",
    "entropy_loss": "loss",
    "fresh_ratio_mean": "mean",
    "fresh_ratio_max": "max",
    "fresh_clip_frac": "mean",
    "fresh_clip_frac_lower": "mean",
    "fresh_ppo_kl": "mean",
    "replayed_ratio_mean": "mean",
    "replayed_ratio_max": "max",
    "replayed_shaped_weight_mean": "mean",
    "replayed_token_share": "mean",
    "fresh_tokens": "count",
    "replayed_tokens": "count",
    "replayed_rows": "count",
}


def _masked_mean(values: torch.Tensor, mask: torch.Tensor) -> float:
    n = int(mask.sum())
    return float(torch.where(mask, values, torch.zeros_like(values)).sum() / n) if n else 0.0


def _masked_max(values: torch.Tensor, mask: torch.Tensor) -> float:
    return float(values[mask].max()) if bool(mask.any()) else 0.0


def loss_metrics(
    terms: TokenTerms,
    token_losses: torch.Tensor,
    pg_loss: torch.Tensor,
    entropy_loss: torch.Tensor | None,
    aggregate: Callable[[torch.Tensor], torch.Tensor],
    *,
    prefix: str = "exgrpo/",
) -> dict[str, float]:
    """Every metric of :data:`LOSS_METRIC_KINDS` (``entropy_loss`` only with an entropy bonus), keys ``prefix +
    name``. ``token_losses``: the weighted token losses ``pg_loss`` aggregates; ``aggregate``: the policy loss's
    aggregation (mode and normalisers), so ``fresh_loss + replayed_loss == pg_loss``."""
    with torch.no_grad():
        fresh_tok, replay_tok = terms.fresh_tokens, terms.replayed_tokens
        n_fresh = int(fresh_tok.sum())
        n_replay = int(replay_tok.sum())
        d_losses = token_losses.detach()
        ratio = terms.ratio.detach()
        # Every mode is linear in the token losses for fixed masks, so aggregating each part with the full
        # mask splits pg_loss exactly: fresh_loss + replayed_loss == pg_loss.
        fresh_part = aggregate(torch.where(fresh_tok, d_losses, 0.0))
        replay_part = aggregate(torch.where(replay_tok, d_losses, 0.0))
        lower = terms.fresh.clipped_lower
        raw = {
            "pg_loss": float(pg_loss.detach()),
            "fresh_loss": float(fresh_part),
            "replayed_loss": float(replay_part),
            "fresh_ratio_mean": _masked_mean(ratio, fresh_tok),
            "fresh_ratio_max": _masked_max(ratio, fresh_tok),
            "fresh_clip_frac": _masked_mean(terms.fresh.clipped.to(terms.dtype), fresh_tok),
            "fresh_clip_frac_lower": _masked_mean(lower.to(terms.dtype), fresh_tok) if lower is not None else 0.0,
            "fresh_ppo_kl": _masked_mean(-terms.log_ratio.detach(), fresh_tok),
            "replayed_ratio_mean": _masked_mean(ratio, replay_tok),
            "replayed_ratio_max": _masked_max(ratio, replay_tok),
            "replayed_shaped_weight_mean": _masked_mean(terms.replayed.shaped.detach(), replay_tok),
            "replayed_token_share": n_replay / (n_fresh + n_replay) if (n_fresh + n_replay) else 0.0,
            "fresh_tokens": float(n_fresh),
            "replayed_tokens": float(n_replay),
            "replayed_rows": float(terms.replay_rows.sum()),
        }
        if entropy_loss is not None:
            raw["entropy_loss"] = float(entropy_loss.detach())
    return {f"{prefix}{k}": v for k, v in raw.items()}
