"""Loss aggregation: verl 0.9.1's ``agg_loss`` (trainer/ppo/core_algos.py) with explicit global normalisers.

Same modes and arithmetic as verl, plus the released code's per-rank scale (:data:`RANK_SUM_NORM`); the only
difference from verl is 0 instead of NaN when nothing is valid. docs/objective.md ("Aggregation and
normalisers") says what to pass so that the loss scale depends neither on micro-batching nor on the GPU count.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

__all__ = ["AGG_MODES", "LOSS_AGG_MODES", "RANK_SUM_NORM", "Normalisers", "aggregate_loss"]

# The aggregation modes of verl 0.9.1's agg_loss (core_algos.py), same names and arithmetic.
AGG_MODES = ("token-mean", "token-sum", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm")
# The released code's scale (exgrpo.loss_scale=per_rank): each data-parallel rank's token sum / L_max, with no
# global normaliser; averaging gradients over ranks then gives (global token sum) / (dp_size · L_max).
RANK_SUM_NORM = "rank-token-sum-norm"
#: Every mode :func:`aggregate_loss` accepts: verl's plus :data:`RANK_SUM_NORM`.
LOSS_AGG_MODES = AGG_MODES + (RANK_SUM_NORM,)

Count = int | float | torch.Tensor


@dataclass(frozen=True)
class Normalisers:
    """The per-mini-batch figures verl's engine hands each micro-batch's loss (``dp_size``, ``batch_num_tokens``,
    ``global_batch_size``). The defaults (one rank, no global counts) make the micro-batch its own normaliser."""

    dp_size: int = 1
    #: valid tokens of the whole mini-batch over all data-parallel ranks (verl: ``batch_num_tokens``)
    global_token_count: Count | None = None
    #: rows of the whole mini-batch over all data-parallel ranks (verl: ``global_batch_size``)
    global_seq_count: Count | None = None

    def as_kwargs(self) -> dict[str, Any]:
        return {
            "dp_size": self.dp_size,
            "global_token_count": self.global_token_count,
            "global_seq_count": self.global_seq_count,
        }


def _as_denominator(count: Count, like: torch.Tensor) -> torch.Tensor:
    # A count of 0 can only come with an all-zero numerator (no valid tokens/rows anywhere); clamping it to 1
    # returns 0 instead of 0/0 = NaN and is a no-op for every real count (≥ 1).
    return torch.as_tensor(count, dtype=like.dtype, device=like.device).clamp_min(1.0)


def _scale_factor(loss_scale_factor: float | None, loss_mask: torch.Tensor) -> float:
    scale = loss_mask.shape[-1] if loss_scale_factor is None else loss_scale_factor
    if scale <= 0:
        raise ValueError(f"loss_scale_factor must be > 0, got {loss_scale_factor}")
    return scale


def check_agg_mode(loss_agg_mode: str, what: str = "loss_agg_mode") -> None:
    if loss_agg_mode not in LOSS_AGG_MODES:
        raise ValueError(f"invalid {what} {loss_agg_mode!r}; expected one of {LOSS_AGG_MODES}")


def aggregate_loss(
    loss_mat: torch.Tensor,
    loss_mask: torch.Tensor,
    loss_agg_mode: str,
    *,
    dp_size: int = 1,
    global_token_count: Count | None = None,
    global_seq_count: Count | None = None,
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
    check_agg_mode(loss_agg_mode)
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
