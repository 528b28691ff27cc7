"""The one settings object of the mixed objective: :class:`LossSettings`.

It carries the ``exgrpo:`` block's loss keys exactly as the config spells them (``fresh_clip="released"``, not a
bool) and verl's actor settings the loss reads (clip ε, dual-clip c, aggregation, L_max, entropy coefficient);
the objective resolves the string choices per step (:meth:`LossSettings.fresh_clip_on`,
:meth:`LossSettings.aggregation_modes`). Frozen, a few scalars: small and picklable, it travels to every worker.

    settings = LossSettings.from_config(exgrpo_cfg)                # the exgrpo: keys (docs/objective.md)
    settings = settings.with_actor(clip_ratio_low=0.2, ...)        # verl's actor values (the adapter does this)
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, ClassVar

from exgrpo.config import FRESH_CLIP_CHOICES, LOSS_SCALE_CHOICES, ExGRPOConfig
from exgrpo.objective.aggregation import RANK_SUM_NORM, check_agg_mode

__all__ = ["FRESH_CLIP_CHOICES", "LOSS_SCALE_CHOICES", "LossSettings", "fresh_clip_on"]

# The exgrpo keys' defaults are ExGRPOConfig's: one source of defaults (the yaml repeats them, tested).
_CONFIG_DEFAULTS = ExGRPOConfig()


def fresh_clip_on(fresh_clip: str, mixed: bool) -> bool:
    """Whether fresh tokens get the PPO clip this step: ``released`` clips until mixed mode (the on-policy
    baseline never enters it, so it keeps the clip), ``always`` clips, ``never`` does not. ``fresh_clip`` is a
    validated config's; the error at the end only keeps the dispatch from answering for a name it does not know."""
    if fresh_clip == "always":
        return True
    if fresh_clip == "never":
        return False
    if fresh_clip == "released":
        return not mixed
    raise ValueError(f"exgrpo.fresh_clip must be released, always or never, got {fresh_clip!r}")


@dataclass(frozen=True)
class LossSettings:
    """Everything the mixed objective reads that is fixed for a run (docs/objective.md has the table).

    Defaults: ``ExGRPOConfig``'s for the ``exgrpo:`` keys (taken from it, not repeated), verl's actor defaults for
    the rest. The ``exgrpo:`` keys are a validated config's (:meth:`from_config`; ``ExGRPOConfig.validate`` checks
    them once, at start-up) and are not checked again here; bad values of verl's actor settings raise a ValueError
    naming the key when the object is built.
    """

    # ---- the exgrpo: block (ExGRPOConfig): same names, types, values and defaults
    shaping: str = _CONFIG_DEFAULTS.shaping
    shaping_beta: float = _CONFIG_DEFAULTS.shaping_beta
    is_correction: bool = _CONFIG_DEFAULTS.is_correction
    fresh_clip: str = _CONFIG_DEFAULTS.fresh_clip
    dual_clip: bool = _CONFIG_DEFAULTS.dual_clip
    weight_terms_by_ratio: bool = _CONFIG_DEFAULTS.weight_terms_by_ratio
    loss_scale: str = _CONFIG_DEFAULTS.loss_scale
    #: applied by the engine hook (recipe/exgrpo/runtime/grad_norm_guard.py), not by the loss; carried so the loss
    #: can check it
    skip_grad_norm_above: float | None = _CONFIG_DEFAULTS.skip_grad_norm_above
    # ---- verl's actor config (actor_rollout_ref.actor.*), filled by the adapter at each call (with_actor)
    loss_agg_mode: str = "token-mean"
    loss_scale_factor: float | None = None
    clip_ratio_low: float = 0.2
    clip_ratio_high: float = 0.2
    #: the dual clip's c, used only with ``dual_clip=True``
    clip_ratio_c: float = 3.0
    entropy_coeff: float = 0.0

    EXGRPO_KEYS: ClassVar[tuple[str, ...]] = (
        "shaping",
        "shaping_beta",
        "is_correction",
        "fresh_clip",
        "dual_clip",
        "weight_terms_by_ratio",
        "loss_scale",
        "skip_grad_norm_above",
    )
    ACTOR_KEYS: ClassVar[tuple[str, ...]] = (
        "loss_agg_mode",
        "loss_scale_factor",
        "clip_ratio_low",
        "clip_ratio_high",
        "clip_ratio_c",
        "entropy_coeff",
    )

    def __post_init__(self) -> None:
        check_agg_mode(self.loss_agg_mode)
        if self.clip_ratio_low < 0 or self.clip_ratio_high < 0:
            raise ValueError(f"clip_ratio_low/high must be >= 0, got {self.clip_ratio_low}/{self.clip_ratio_high}")
        if self.dual_clip and not self.clip_ratio_c > 1.0:
            raise ValueError(f"clip_ratio_c (dual clip) must be > 1, got {self.clip_ratio_c}")

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_config(cls, cfg: ExGRPOConfig, **actor: Any) -> LossSettings:
        """The loss keys of a validated ``exgrpo:`` block; ``actor``: any of :attr:`ACTOR_KEYS`."""
        values: dict[str, Any] = {key: getattr(cfg, key) for key in cls.EXGRPO_KEYS}
        values["shaping_beta"] = float(values["shaping_beta"])
        if values["skip_grad_norm_above"] is not None:
            values["skip_grad_norm_above"] = float(values["skip_grad_norm_above"])
        return cls(**values).with_actor(**actor)

    def with_actor(self, **actor: Any) -> LossSettings:
        """A copy with verl's actor settings replaced (names of :attr:`ACTOR_KEYS`)."""
        unknown = sorted(set(actor) - set(self.ACTOR_KEYS))
        if unknown:
            raise TypeError(f"not verl actor settings of the loss: {unknown}; expected {list(self.ACTOR_KEYS)}")
        return dataclasses.replace(self, **actor) if actor else self

    # ------------------------------------------------------------------ resolution of the string choices
    def fresh_clip_on(self, mixed: bool) -> bool:
        """PPO clip on this step's fresh tokens (``exgrpo.fresh_clip`` and whether mixed mode is on)."""
        return fresh_clip_on(self.fresh_clip, mixed)

    @property
    def dual_clip_c(self) -> float | None:
        """The dual clip's c on PPO-clipped fresh tokens, or None (off: the released code has none)."""
        return self.clip_ratio_c if self.dual_clip else None

    def aggregation_modes(self) -> tuple[str, str]:
        """(policy loss mode, entropy bonus mode): verl's ``loss_agg_mode`` for both under ``loss_scale=global``;
        the released code's rank token sum / L_max and a token-mean entropy bonus under ``per_rank``."""
        if self.loss_scale == "per_rank":
            if not self.loss_scale_factor:
                raise ValueError("exgrpo.loss_scale=per_rank needs actor_rollout_ref.actor.loss_scale_factor (L_max)")
            return RANK_SUM_NORM, "token-mean"
        return self.loss_agg_mode, self.loss_agg_mode
