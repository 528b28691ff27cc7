"""Shaping functions f(w) of the replayed term (docs/algorithm.md §8), behind one registry.

Adding a shaping is one decorated function; ``exgrpo.shaping=<name>`` selects it::

    @register_shaping("my_shaping")
    def my_shaping(log_ratio: torch.Tensor, *, beta: float) -> torch.Tensor: ...
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Protocol

import torch

from exgrpo.registry import Registry

__all__ = ["SHAPING_REGISTRY", "ShapingFn", "get_shaping_fn", "register_shaping", "shaping_none", "shaping_policy"]


class ShapingFn(Protocol):
    def __call__(self, log_ratio: torch.Tensor, *, beta: float) -> torch.Tensor:
        """Map the (clamped) token log-ratio log w to the shaped weight f(w) that multiplies −A."""
        ...


#: Every shaping by name (a read-only mapping; ``unregister`` removes a test's temporary entry).
SHAPING_REGISTRY: Registry[ShapingFn] = Registry("shaping", key="exgrpo.shaping")


def register_shaping(name: str) -> Callable[[ShapingFn], ShapingFn]:
    """Decorator registering a shaping function under ``name`` (like verl's ``register_policy_loss``)."""
    return SHAPING_REGISTRY.register(name)


def get_shaping_fn(name: str) -> ShapingFn:
    """The shaping registered as ``name``; an unknown name raises ``UnknownNameError`` (a ValueError and a KeyError)
    listing the registered ones."""
    return SHAPING_REGISTRY[name]


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
