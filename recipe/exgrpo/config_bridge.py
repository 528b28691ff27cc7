"""Hydra ``exgrpo:`` block → the core's validated ``ExGRPOConfig`` (K is taken from ``rollout.n``)."""

from __future__ import annotations

from omegaconf import OmegaConf

from exgrpo.config import ExGRPOConfig


def exgrpo_config_from_hydra(config) -> ExGRPOConfig:
    """Validate and return the ``exgrpo`` block; errors name the key as ``exgrpo.<key>`` with its allowed range."""
    block = config.get("exgrpo")
    if block is None:
        raise ValueError("the config has no `exgrpo:` block: use recipe/exgrpo/config/exgrpo_trainer.yaml")
    k = int(config.actor_rollout_ref.rollout.n)
    return ExGRPOConfig.from_dict(OmegaConf.to_container(block, resolve=True), k=k)
