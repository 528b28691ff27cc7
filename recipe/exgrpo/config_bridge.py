"""Hydra ``exgrpo:`` block → the core's validated ``ExGRPOConfig`` (K is taken from ``rollout.n``)."""

from __future__ import annotations

from omegaconf import OmegaConf

from exgrpo.config import ConfigError, ExGRPOConfig


def exgrpo_config_from_hydra(config) -> ExGRPOConfig:
    """Validate and return the ``exgrpo`` block; errors name the key as ``exgrpo.<key>`` with its allowed range."""
    block = config.get("exgrpo")
    if block is None:
        raise ValueError("the config has no `exgrpo:` block: use recipe/exgrpo/config/exgrpo_trainer.yaml")
    k = int(config.actor_rollout_ref.rollout.n)
    cfg = ExGRPOConfig.from_dict(OmegaConf.to_container(block, resolve=True), k=k)
    check_against_actor_config(cfg, config.actor_rollout_ref.actor)
    return cfg


def check_against_actor_config(cfg: ExGRPOConfig, actor) -> None:
    """Checks of ``exgrpo`` keys that depend on verl's actor settings (``actor_rollout_ref.actor``)."""
    if cfg.loss_scale == "per_rank":
        mode = actor.get("loss_agg_mode")
        if mode != "seq-mean-token-sum-norm":
            raise ConfigError(
                "exgrpo.loss_scale=per_rank is the released code's form of seq-mean-token-sum-norm (token sums / "
                f"L_max); set actor_rollout_ref.actor.loss_agg_mode=seq-mean-token-sum-norm (got {mode!r}) or "
                "exgrpo.loss_scale=global"
            )
        scale = actor.get("loss_scale_factor")
        if scale is None or not float(scale) > 0:
            raise ConfigError(
                "exgrpo.loss_scale=per_rank divides by the constant L_max: set actor_rollout_ref.actor."
                f"loss_scale_factor to the maximum response length, e.g. 8192 (got {scale!r})"
            )
