"""Seeded numpy generators as JSON: what the sampler's and the selector's ``state_dict`` hold.

A resumed run draws exactly what the uninterrupted run would have drawn only if the bit generator's state is
restored, so it is saved as plain JSON values (no pickle) and checked for its generator type on load.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

__all__ = ["plain", "rng_state", "set_rng_state"]


def rng_state(rng: np.random.Generator) -> dict[str, Any]:
    """The bit generator's state as plain JSON-serialisable Python values."""
    return plain(rng.bit_generator.state)


def set_rng_state(rng: np.random.Generator, state: dict[str, Any]) -> None:
    """Restore a state from :func:`rng_state`; ValueError when it is for another bit generator."""
    name = type(rng.bit_generator).__name__
    if not isinstance(state, dict) or state.get("bit_generator") != name:
        got = state.get("bit_generator") if isinstance(state, dict) else state
        raise ValueError(f"RNG state is for {got!r}, expected {name!r}")
    rng.bit_generator.state = state


def plain(x: Any) -> Any:
    """``x`` with numpy arrays and scalars turned into lists, ints and floats (non-finite floats as strings)."""
    if isinstance(x, dict):
        return {str(k): plain(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [plain(v) for v in x]
    if isinstance(x, np.ndarray):
        return x.tolist()
    if isinstance(x, np.integer):
        return int(x)
    if isinstance(x, np.floating):
        f = float(x)
        return f if math.isfinite(f) else str(f)
    return x
