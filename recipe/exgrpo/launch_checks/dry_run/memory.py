"""Checker 8 of the dry run: the GPU memory of generation and of the update
(``recipe/exgrpo/launch_checks/memory_estimate.py``)."""

from __future__ import annotations

import os

from omegaconf import DictConfig

from recipe.exgrpo.launch_checks.dry_run.report import DryRunError


def generation_memory(config: DictConfig, card_gib: float | None = None, model_params: float | None = None):
    """The memory estimate of generation of a valid config, with the settings' environment defaults
    (``memory_estimate``)."""
    from recipe.exgrpo.launch_checks.memory_estimate import estimate_generation_memory

    return _estimate(estimate_generation_memory, config, card_gib, model_params)


def update_memory(config: DictConfig, card_gib: float | None = None, model_params: float | None = None):
    """The memory estimate of the actor's update, with the same defaults as :func:`generation_memory`."""
    from recipe.exgrpo.launch_checks.memory_estimate import estimate_update_memory

    return _estimate(estimate_update_memory, config, card_gib, model_params)


def _estimate(estimate, config: DictConfig, card_gib: float | None, model_params: float | None):
    from recipe.exgrpo.launch_checks.memory_estimate import (
        CARD_GIB_ENV,
        DEFAULT_CARD_GIB,
        MODEL_PARAMS_ENV,
        MemoryEstimateError,
        parse_count,
    )

    try:
        if card_gib is None:
            text = os.environ.get(CARD_GIB_ENV) or str(DEFAULT_CARD_GIB)
            try:
                card_gib = float(text)
            except ValueError:
                raise MemoryEstimateError(f"{CARD_GIB_ENV}={text!r}: give the GPU's memory in GiB, e.g. 80") from None
        if model_params is None and os.environ.get(MODEL_PARAMS_ENV):
            model_params = parse_count(os.environ[MODEL_PARAMS_ENV])
        return estimate(config, card_gib=card_gib, model_params=model_params)
    except MemoryEstimateError as e:
        raise DryRunError([str(e)]) from None
