"""The mixed-policy objective of ExGRPO (docs/algorithm.md §8, paper Eq. 4). Pure torch, no verl import.

Per response token t of row i (mask m), with w = exp(log π_θ − ℓ_ref):

* ℓ_ref is the recomputed old log-prob for fresh rows; for replayed rows it is the stored behaviour log-prob
  (IS correction on, default) or the recomputed one (off).
* fresh tokens (:func:`~exgrpo.objective.terms.fresh_term`): PPO clip (ε_low/ε_high, optional dual clip for
  A < 0, as verl's ``vanilla`` loss) or the released code's unclipped −A·w, per ``exgrpo.fresh_clip``.
* replayed tokens (:func:`~exgrpo.objective.terms.replayed_term`): −A·f(w), f from the shaping registry
  (default w/(w+β), β = 0.1), never clipped.

Modules: ``settings`` (:class:`LossSettings`, the one settings object), ``shaping`` (the registry),
``terms`` (both terms and the Eq. 4 weights), ``aggregation`` (verl's ``agg_loss``), ``metrics``, ``loss``
(:func:`mixed_policy_loss`, which puts them together). The verl adapter (recipe/exgrpo/actor_loss.py) calls
:func:`mixed_policy_loss` from its actor loss and passes verl's global normalisers (docs/objective.md).
"""

from exgrpo.objective.aggregation import AGG_MODES, LOSS_AGG_MODES, RANK_SUM_NORM, Normalisers, aggregate_loss
from exgrpo.objective.loss import mixed_policy_loss
from exgrpo.objective.metrics import LOSS_METRIC_KINDS, loss_metrics
from exgrpo.objective.settings import FRESH_CLIP_CHOICES, LOSS_SCALE_CHOICES, LossSettings, fresh_clip_on
from exgrpo.objective.shaping import (
    SHAPING_REGISTRY,
    ShapingFn,
    get_shaping_fn,
    register_shaping,
    shaping_none,
    shaping_policy,
)
from exgrpo.objective.terms import (
    LOG_RATIO_CLAMP,
    FreshTerm,
    ReplayedTerm,
    TokenTerms,
    fresh_term,
    replayed_term,
    term_weights,
)

__all__ = [
    "AGG_MODES",
    "FRESH_CLIP_CHOICES",
    "LOG_RATIO_CLAMP",
    "LOSS_AGG_MODES",
    "LOSS_METRIC_KINDS",
    "LOSS_SCALE_CHOICES",
    "RANK_SUM_NORM",
    "SHAPING_REGISTRY",
    "FreshTerm",
    "LossSettings",
    "Normalisers",
    "ReplayedTerm",
    "ShapingFn",
    "TokenTerms",
    "aggregate_loss",
    "fresh_clip_on",
    "fresh_term",
    "get_shaping_fn",
    "loss_metrics",
    "mixed_policy_loss",
    "register_shaping",
    "replayed_term",
    "shaping_none",
    "shaping_policy",
    "term_weights",
]
