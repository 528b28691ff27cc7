"""The mixed-policy objective of ExGRPO (docs/algorithm.md §8): shaping functions, the per-token mixed loss,
verl-compatible loss aggregation and the loss metrics.

Pure torch, no verl import: the verl adapter (recipe/exgrpo) calls :func:`mixed_policy_loss` from its actor
loss and passes verl's global normalisers through explicitly (see docs/objective.md).

Per response token t of row i (mask m):

* w = exp(log π_θ − ℓ_ref). ℓ_ref is the recomputed old log-prob for fresh rows; for replayed rows it is the
  stored behaviour log-prob (IS correction on, default) or the recomputed one (off).
* fresh tokens: PPO clip (ε_low/ε_high, optional dual clip for A < 0, as verl's ``vanilla`` loss) or, with
  ``fresh_clip=False``, the released code's unclipped −A·w.
* replayed tokens: −A·f(w), f from the shaping registry (default w/(w+β), β = 0.1), never clipped.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Protocol

import torch

__all__ = [
    "AGG_MODES",
    "LOG_RATIO_CLAMP",
    "LOSS_AGG_MODES",
    "LOSS_METRIC_KINDS",
    "RANK_SUM_NORM",
    "SHAPING_REGISTRY",
    "ShapingFn",
    "aggregate_loss",
    "get_shaping_fn",
    "mixed_policy_loss",
    "register_shaping",
    "shaping_none",
    "shaping_policy",
]

# verl clamps the log-ratio to ±20 before exp (core_algos.compute_policy_loss_vanilla). The clamp is the
# identity inside (−20, 20), so gradients there are untouched; outside it the gradient is zero and
# exp(20) ≈ 4.9e8 stays finite in float32 (and bf16).
LOG_RATIO_CLAMP = 20.0

# The aggregation modes of verl 0.9.1's agg_loss (core_algos.py), same names and arithmetic.
AGG_MODES = ("token-mean", "token-sum", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm")
# The released code's scale (exgrpo.loss_scale=per_rank): each data-parallel rank's token sum / L_max, with no
# global normaliser; averaging gradients over ranks then gives (global token sum) / (dp_size · L_max).
RANK_SUM_NORM = "rank-token-sum-norm"
#: Every mode :func:`aggregate_loss` and :func:`mixed_policy_loss` accept: verl's plus :data:`RANK_SUM_NORM`.
LOSS_AGG_MODES = AGG_MODES + (RANK_SUM_NORM,)


# ----------------------------------------------------------------------------------------------------------
# Shaping registry (docs/algorithm.md §8): adding a shaping function is one decorated function.
# ----------------------------------------------------------------------------------------------------------
class ShapingFn(Protocol):
    def __call__(self, log_ratio: torch.Tensor, *, beta: float) -> torch.Tensor:
        """Map the (clamped) token log-ratio log w to the shaped weight f(w) that multiplies −A."""
        ...


SHAPING_REGISTRY: dict[str, ShapingFn] = {}


def register_shaping(name: str) -> Callable[[ShapingFn], ShapingFn]:
    """Register a shaping function under ``name`` (like verl's ``register_policy_loss``)."""

    def decorator(fn: ShapingFn) -> ShapingFn:
        if name in SHAPING_REGISTRY and SHAPING_REGISTRY[name] is not fn:
            raise ValueError(f"shaping function {name!r} is already registered")
        SHAPING_REGISTRY[name] = fn
        return fn

    return decorator


def get_shaping_fn(name: str) -> ShapingFn:
    try:
        return SHAPING_REGISTRY[name]
    except KeyError:
        raise ValueError(f"unknown shaping {name!r}; registered: {sorted(SHAPING_REGISTRY)}") from None


@register_shaping("none")
def shaping_none(log_ratio: torch.Tensor, *, beta: float) -> torch.Tensor:
    """Plain importance ratio w (the "w/o policy shaping" ablation, docs/algorithm.md §8). ``beta`` is unused."""
    return torch.exp(log_ratio)


@register_shaping("policy_shaping")
def shaping_policy(log_ratio: torch.Tensor, *, beta: float) -> torch.Tensor:
    """f(w) = w/(w+β) (docs/algorithm.md §8), computed as sigmoid(log w − log β).

    The sigmoid form is the same function but cannot overflow for any log-ratio, and its derivative
    sigmoid'(x) = f(1−f) = β·w/(w+β)² is the gradient weight the paper describes (0.083 at w = 1, β = 0.1).
    """
    return torch.sigmoid(log_ratio - math.log(beta))


# ----------------------------------------------------------------------------------------------------------
# Aggregation: verl 0.9.1's agg_loss, with explicit global normalisers and guards for empty masks.
# ----------------------------------------------------------------------------------------------------------
def _as_denominator(count: int | float | torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    # A count of 0 can only come with an all-zero numerator (no valid tokens/rows anywhere); clamping it to 1
    # returns 0 instead of 0/0 = NaN and is a no-op for every real count (≥ 1).
    return torch.as_tensor(count, dtype=like.dtype, device=like.device).clamp_min(1.0)


def aggregate_loss(
    loss_mat: torch.Tensor,
    loss_mask: torch.Tensor,
    loss_agg_mode: str,
    *,
    dp_size: int = 1,
    global_token_count: int | float | torch.Tensor | None = None,
    global_seq_count: int | float | torch.Tensor | None = None,
    loss_scale_factor: float | None = None,
) -> torch.Tensor:
    """Aggregate a [batch, response_len] token-loss matrix into a scalar, exactly as verl 0.9.1's ``agg_loss``.

    ``global_token_count`` is verl's ``batch_num_tokens`` (valid tokens of the whole mini-batch, summed over
    all data-parallel ranks) and ``global_seq_count`` its ``global_batch_size`` (rows of the whole mini-batch
    over all ranks). With them, each micro-batch returns its share of the mini-batch mean times ``dp_size``:
    summing micro-batch losses (gradient accumulation) and averaging over ranks (FSDP/DDP all-reduce) gives the
    mini-batch mean, whatever the micro-batching. Without them (``dp_size == 1``) the local micro-batch is the
    normaliser, as in verl. ``loss_scale_factor`` is the constant L_max of ``seq-mean-token-sum-norm``
    (default: ``response_len``, as verl).

    Differences from verl, only where verl returns NaN: an all-zero mask gives 0 instead of 0/0.

    One mode verl does not have, :data:`RANK_SUM_NORM` (``"rank-token-sum-norm"``): the local masked token sum
    divided by ``loss_scale_factor`` (default ``response_len``), with no ``dp_size`` factor and no global counts.
    Summed over micro-batches it is the rank's token sum / L_max, the released code's loss; after the gradient
    average over ranks the update is Σ_all tokens / (dp_size · L_max), where ``seq-mean-token-sum-norm`` with
    global counts gives Σ_all tokens / (global rows · L_max).
    """
    if loss_agg_mode not in LOSS_AGG_MODES:
        raise ValueError(f"invalid loss_agg_mode {loss_agg_mode!r}; expected one of {LOSS_AGG_MODES}")
    if loss_mat.shape != loss_mask.shape:
        raise ValueError(f"loss_mat shape {tuple(loss_mat.shape)} != loss_mask shape {tuple(loss_mask.shape)}")
    if dp_size < 1:
        raise ValueError(f"dp_size must be >= 1, got {dp_size}")
    mask = loss_mask.to(loss_mat.dtype)
    # where() first so a NaN/Inf in a masked-out position can reach neither the value nor the gradient.
    masked = torch.where(loss_mask.bool(), loss_mat, torch.zeros_like(loss_mat)) * mask

    if loss_agg_mode == "token-mean":
        if global_token_count is None:
            if dp_size > 1:
                raise ValueError("global_token_count (verl: batch_num_tokens) is required when dp_size > 1")
            global_token_count = mask.sum()
        return masked.sum() / _as_denominator(global_token_count, masked) * dp_size
    if loss_agg_mode == "token-sum":
        return masked.sum() * dp_size
    if loss_agg_mode == RANK_SUM_NORM:
        return masked.sum() / _scale_factor(loss_scale_factor, loss_mask)

    if loss_agg_mode == "seq-mean-token-mean":
        seq_tokens = mask.sum(dim=-1)
        # +1e-8 as verl: identical values for non-empty rows; an empty row gives 0/1e-8 = 0.
        seq_losses = masked.sum(dim=-1) / (seq_tokens + 1e-8)
    else:  # seq-mean-token-sum, seq-mean-token-sum-norm
        seq_tokens = mask.sum(dim=-1)
        seq_losses = masked.sum(dim=-1)
    seq_valid = (seq_tokens > 0).to(loss_mat.dtype)  # rows without tokens are not sequences of the mean
    if global_seq_count is None:
        if dp_size > 1:
            raise ValueError("global_seq_count (verl: global_batch_size) is required when dp_size > 1")
        global_seq_count = seq_valid.sum()
    loss = (seq_losses * seq_valid).sum() / _as_denominator(global_seq_count, masked) * dp_size
    if loss_agg_mode == "seq-mean-token-sum-norm":
        loss = loss / _scale_factor(loss_scale_factor, loss_mask)
    return loss


def _scale_factor(loss_scale_factor: float | None, loss_mask: torch.Tensor) -> float:
    scale = loss_mask.shape[-1] if loss_scale_factor is None else loss_scale_factor
    if scale <= 0:
        raise ValueError(f"loss_scale_factor must be > 0, got {loss_scale_factor}")
    return scale


# ----------------------------------------------------------------------------------------------------------
# Metrics
# ----------------------------------------------------------------------------------------------------------
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


# ----------------------------------------------------------------------------------------------------------
# The mixed-policy loss
# ----------------------------------------------------------------------------------------------------------
def _check_2d(name: str, t: torch.Tensor, shape: torch.Size) -> None:
    if t.shape != shape:
        raise ValueError(f"{name} must have shape {tuple(shape)} like log_prob, got {tuple(t.shape)}")


def mixed_policy_loss(
    log_prob: torch.Tensor,
    old_log_prob: torch.Tensor,
    behaviour_log_prob: torch.Tensor | None,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    replay_mask: torch.Tensor,
    *,
    loss_agg_mode: str,
    shaping: str = "policy_shaping",
    shaping_beta: float = 0.1,
    is_correction: bool = True,
    fresh_clip: bool = True,
    clip_ratio_low: float = 0.2,
    clip_ratio_high: float = 0.2,
    clip_ratio_c: float | None = 3.0,
    loss_scale_factor: float | None = None,
    dp_size: int = 1,
    global_token_count: int | float | torch.Tensor | None = None,
    global_seq_count: int | float | torch.Tensor | None = None,
    replay_ratio: float | None = None,
    weight_terms: bool = False,
    experience_group_mask: torch.Tensor | None = None,
    entropy: torch.Tensor | None = None,
    entropy_coeff: float = 0.0,
    entropy_agg_mode: str | None = None,
    metric_prefix: str = "exgrpo/",
) -> tuple[torch.Tensor, dict[str, float]]:
    """ExGRPO's mixed-policy loss (docs/algorithm.md §8) for one micro-batch; returns (loss, metrics).

    Tensors are [batch, response_len] except ``replay_mask`` ([batch] bool: the row is a replayed trajectory)
    and ``advantages`` ([batch, response_len] or per-row [batch]). ``behaviour_log_prob`` (the stored
    log-probs of the policy that produced a replayed trajectory) is read on replayed rows only and may be
    None when no row is replayed or ``is_correction`` is False; its values on fresh rows are ignored.

    Args:
        loss_agg_mode: one of :data:`LOSS_AGG_MODES` (verl's names and arithmetic, plus the released code's
            per-rank sum; see :func:`aggregate_loss`).
        shaping: name in :data:`SHAPING_REGISTRY` applied to replayed tokens; ``shaping_beta`` is its β.
        is_correction: replayed ratio against the stored behaviour log-probs (True) or the recomputed old
            log-probs ("w/o IS correction" ablation).
        fresh_clip: PPO clip on fresh tokens (paper Eq. 4) or the unclipped −A·w of the released code's mixed
            phase. ``clip_ratio_c`` (dual clip for A < 0, verl's default 3.0; None = off) only applies with
            the clip on.
        loss_scale_factor, dp_size, global_token_count, global_seq_count: the normalisers of
            :func:`aggregate_loss` (verl: loss_scale_factor, dp_size, batch_num_tokens, global_batch_size).
        replay_ratio, weight_terms: with ``weight_terms=True`` the paper's explicit Eq. 4 weights: the
            experience term × ρ and the on-policy term × (1−ρ). Rows of the experience term are
            ``experience_group_mask`` ([batch] bool) when given (e.g. whole replay groups,
            :func:`exgrpo.advantage.experience_group_rows`), else the replayed rows. Off by default (the
            released code weights only through the batch split). The weights multiply token losses under
            the common normaliser.
        entropy, entropy_coeff: entropy bonus, aggregated like the policy loss: loss −= coeff · agg(entropy),
            or with ``entropy_agg_mode`` when given (the released code's bonus is a token mean).
        metric_prefix: prefix of every metric name (see :data:`LOSS_METRIC_KINDS` for the names).
    """
    # ---- validation (clear errors naming the argument) ----
    if log_prob.dim() != 2:
        raise ValueError(f"log_prob must be [batch, response_len], got shape {tuple(log_prob.shape)}")
    shape = log_prob.shape
    _check_2d("old_log_prob", old_log_prob, shape)
    _check_2d("response_mask", response_mask, shape)
    if advantages.dim() == 1 and advantages.shape[0] == shape[0]:
        advantages = advantages.unsqueeze(-1).expand(shape)
    _check_2d("advantages", advantages, shape)
    if replay_mask.shape != (shape[0],):
        raise ValueError(
            f"replay_mask must have shape ({shape[0]},) (one flag per row), got {tuple(replay_mask.shape)}"
        )
    if loss_agg_mode not in LOSS_AGG_MODES:
        raise ValueError(f"invalid loss_agg_mode {loss_agg_mode!r}; expected one of {LOSS_AGG_MODES}")
    if entropy_agg_mode is not None and entropy_agg_mode not in LOSS_AGG_MODES:
        raise ValueError(f"invalid entropy_agg_mode {entropy_agg_mode!r}; expected one of {LOSS_AGG_MODES}")
    shaping_fn = get_shaping_fn(shaping)
    if not shaping_beta > 0:
        raise ValueError(f"shaping_beta must be > 0, got {shaping_beta}")
    if clip_ratio_low < 0 or clip_ratio_high < 0:
        raise ValueError(f"clip_ratio_low/high must be >= 0, got {clip_ratio_low}/{clip_ratio_high}")
    if clip_ratio_c is not None and not clip_ratio_c > 1.0:
        raise ValueError(f"clip_ratio_c (dual clip) must be > 1 or None, got {clip_ratio_c}")
    if weight_terms and (replay_ratio is None or not 0.0 <= replay_ratio <= 1.0):
        raise ValueError(f"weight_terms=True needs replay_ratio in [0, 1], got {replay_ratio}")
    if entropy_coeff != 0.0 and entropy is None:
        raise ValueError(f"entropy_coeff={entropy_coeff} but no entropy tensor was given")
    if entropy is not None:
        _check_2d("entropy", entropy, shape)

    mask = response_mask.bool()
    replay_rows = replay_mask.to(device=mask.device).bool()
    replay_tok = replay_rows.unsqueeze(-1) & mask
    fresh_tok = ~replay_rows.unsqueeze(-1) & mask
    any_replay = bool(replay_rows.any())

    # ---- reference log-probs: old for fresh rows; behaviour for replayed rows with IS correction ----
    ref_log_prob = old_log_prob
    if is_correction and any_replay:
        if behaviour_log_prob is None:
            raise ValueError("behaviour_log_prob is required: the batch has replayed rows and is_correction=True")
        _check_2d("behaviour_log_prob", behaviour_log_prob, shape)
        ref_log_prob = torch.where(replay_rows.unsqueeze(-1), behaviour_log_prob.to(old_log_prob.dtype), old_log_prob)

    zeros = torch.zeros_like(log_prob)
    # Zero the log-ratio and advantage on masked-out positions before anything else: padding may hold
    # −inf/NaN log-probs, and this keeps both the loss and its gradient exactly zero there.
    log_ratio = torch.where(mask, log_prob - ref_log_prob, zeros)
    log_ratio = torch.clamp(log_ratio, min=-LOG_RATIO_CLAMP, max=LOG_RATIO_CLAMP)
    adv = torch.where(mask, advantages.to(log_prob.dtype), zeros)
    ratio = torch.exp(log_ratio)

    # ---- fresh tokens: PPO clip with dual clip (verl's vanilla loss, same operations) or unclipped ----
    pg_unclipped = -adv * ratio
    pg_clipped = -adv * torch.clamp(ratio, 1.0 - clip_ratio_low, 1.0 + clip_ratio_high)
    pg_max = torch.maximum(pg_unclipped, pg_clipped)
    if clip_ratio_c is not None:
        pg_dual = torch.minimum(-adv * clip_ratio_c, pg_max)
        pg_ppo = torch.where(adv < 0, pg_dual, pg_max)
    else:
        pg_ppo = pg_max
    fresh_losses = pg_ppo if fresh_clip else pg_unclipped

    # ---- replayed tokens: −A·f(w), no clip ----
    shaped = shaping_fn(log_ratio, beta=shaping_beta)
    replay_losses = -adv * shaped

    token_losses = torch.where(replay_tok, replay_losses, fresh_losses)
    if weight_terms:
        assert replay_ratio is not None  # checked above
        if experience_group_mask is not None:
            if experience_group_mask.shape != (shape[0],):
                raise ValueError(
                    f"experience_group_mask must have shape ({shape[0]},), got {tuple(experience_group_mask.shape)}"
                )
            term_rows = experience_group_mask.to(device=mask.device).bool()
            if bool((replay_rows & ~term_rows).any()):
                raise ValueError("experience_group_mask must include every replayed row (its group is replayed)")
        else:
            term_rows = replay_rows
        term_weight = torch.where(term_rows, replay_ratio, 1.0 - replay_ratio).to(log_prob.dtype)
        token_losses = token_losses * term_weight.unsqueeze(-1)

    agg_kwargs = dict(
        dp_size=dp_size,
        global_token_count=global_token_count,
        global_seq_count=global_seq_count,
        loss_scale_factor=loss_scale_factor,
    )
    pg_loss = aggregate_loss(token_losses, mask, loss_agg_mode, **agg_kwargs)
    loss = pg_loss

    entropy_loss = None
    if entropy is not None:
        entropy_loss = aggregate_loss(entropy, mask, entropy_agg_mode or loss_agg_mode, **agg_kwargs)
        loss = loss - entropy_coeff * entropy_loss

    # ---- metrics (floats; detached) ----
    with torch.no_grad():
        n_fresh = int(fresh_tok.sum())
        n_replay = int(replay_tok.sum())
        d_losses = token_losses.detach()
        # Every mode is linear in the token losses for fixed masks, so aggregating each part with the full
        # mask splits pg_loss exactly: fresh_loss + replayed_loss == pg_loss.
        fresh_part = aggregate_loss(torch.where(fresh_tok, d_losses, 0.0), mask, loss_agg_mode, **agg_kwargs)
        replay_part = aggregate_loss(torch.where(replay_tok, d_losses, 0.0), mask, loss_agg_mode, **agg_kwargs)
        clipped = torch.gt(pg_clipped, pg_unclipped)  # the ε clip is (or, unclipped, would be) active
        clipped_lower = torch.gt(pg_max, -adv * clip_ratio_c) & (adv < 0) if clip_ratio_c is not None else None
        raw = {
            "pg_loss": float(pg_loss.detach()),
            "fresh_loss": float(fresh_part),
            "replayed_loss": float(replay_part),
            "fresh_ratio_mean": _masked_mean(ratio.detach(), fresh_tok),
            "fresh_ratio_max": _masked_max(ratio.detach(), fresh_tok),
            "fresh_clip_frac": _masked_mean(clipped.to(log_prob.dtype), fresh_tok),
            "fresh_clip_frac_lower": (
                _masked_mean(clipped_lower.to(log_prob.dtype), fresh_tok) if clipped_lower is not None else 0.0
            ),
            "fresh_ppo_kl": _masked_mean(-log_ratio.detach(), fresh_tok),
            "replayed_ratio_mean": _masked_mean(ratio.detach(), replay_tok),
            "replayed_ratio_max": _masked_max(ratio.detach(), replay_tok),
            "replayed_shaped_weight_mean": _masked_mean(shaped.detach(), replay_tok),
            "replayed_token_share": n_replay / (n_fresh + n_replay) if (n_fresh + n_replay) else 0.0,
            "fresh_tokens": float(n_fresh),
            "replayed_tokens": float(n_replay),
            "replayed_rows": float(replay_rows.sum()),
        }
        if entropy_loss is not None:
            raw["entropy_loss"] = float(entropy_loss.detach())
    metrics = {f"{metric_prefix}{k}": v for k, v in raw.items()}
    return loss, metrics
