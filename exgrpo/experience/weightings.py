"""Bucket weightings (docs/algorithm.md §4): the registry ``exgrpo.weighting`` selects from, and p_k.

A weighting maps the non-empty sampleable buckets k (1 <= k <= K-1) to non-negative weights; the bucket
probability is p_k = w_k / sum_j w_j, *per bucket*. A weighting registered with ``per_question=True`` (``uniform``,
the "w/o question selection" ablation) makes the sampler draw uniformly over all valid questions instead.

Adding one is one decorated function, and the config accepts its name::

    @register_bucket_weighting("cubic")
    def cubic(buckets, k, mu, sigma):
        return (buckets / k) ** 3

``exgrpo.config`` checks ``exgrpo.weighting`` against this registry; the module needs nothing of the config or the
pool (no import cycle).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from exgrpo.registry import Registry

__all__ = [
    "BUCKET_WEIGHTINGS",
    "BucketWeighting",
    "bucket_probabilities",
    "get_bucket_weighting",
    "is_per_question",
    "register_bucket_weighting",
]

#: (buckets k as floats, K, mu, sigma) -> non-negative weights, one per bucket. mu/sigma in accuracy units.
BucketWeighting = Callable[[np.ndarray, int, float, float], np.ndarray]

BUCKET_WEIGHTINGS: Registry[BucketWeighting] = Registry("bucket weighting", key="exgrpo.weighting")


def register_bucket_weighting(name: str, *, per_question: bool = False) -> Callable[[BucketWeighting], BucketWeighting]:
    """Register a bucket weighting under ``name`` (``exgrpo.weighting``); ``per_question``: uniform over questions."""
    return BUCKET_WEIGHTINGS.register(name, per_question=per_question)


def get_bucket_weighting(name: str) -> BucketWeighting:
    """The weighting registered as ``name``; an unknown name raises ``UnknownNameError`` (a ValueError and a
    KeyError) with the registered names and a did-you-mean."""
    return BUCKET_WEIGHTINGS[name]


def is_per_question(name: str) -> bool:
    """Whether the sampler draws uniformly over questions under this weighting (not over buckets)."""
    return bool(BUCKET_WEIGHTINGS.tag(name, "per_question", False))


@register_bucket_weighting("normal")
def normal_weighting(buckets: np.ndarray, k: int, mu: float, sigma: float) -> np.ndarray:
    """Gaussian on accuracy k/K: exp(-(k/K - mu)^2 / (2 sigma^2)) (the released default with sigma = 1/K)."""
    log_w = -((buckets / k - mu) ** 2) / (2.0 * sigma**2)
    return np.exp(log_w - log_w.max())  # shifted: only ratios matter, and a tiny sigma must not underflow to 0/0


@register_bucket_weighting("linear")
def linear_weighting(buckets: np.ndarray, k: int, mu: float, sigma: float) -> np.ndarray:
    return buckets / k


@register_bucket_weighting("sqrt")
def sqrt_weighting(buckets: np.ndarray, k: int, mu: float, sigma: float) -> np.ndarray:
    return np.sqrt(buckets / k)


@register_bucket_weighting("linear_clip")
def linear_clip_weighting(buckets: np.ndarray, k: int, mu: float, sigma: float) -> np.ndarray:
    """k/K up to K/2, then 0.5."""
    return np.minimum(buckets / k, 0.5)


@register_bucket_weighting("uniform", per_question=True)
def uniform_weighting(buckets: np.ndarray, k: int, mu: float, sigma: float) -> np.ndarray:
    """Uniform over valid questions (the draw treats it per question; these bucket weights are for display)."""
    return np.ones_like(buckets, dtype=np.float64)


def bucket_probabilities(
    buckets: Sequence[int], k: int, weighting: str = "normal", mu: float = 0.5, sigma: float | None = None
) -> np.ndarray:
    """p_k = w_k / sum_j w_j over the given (non-empty, sampleable) buckets; sigma None means 1/K."""
    b = np.asarray(buckets, dtype=np.float64)
    if b.size == 0:
        return np.zeros(0)
    w = np.asarray(get_bucket_weighting(weighting)(b, k, mu, 1.0 / k if sigma is None else sigma), dtype=np.float64)
    if w.shape != b.shape or np.any(w < 0) or not np.all(np.isfinite(w)):
        raise ValueError(f"bucket weighting {weighting!r} returned invalid weights {w} for buckets {list(buckets)}")
    total = w.sum()
    if total <= 0:  # every weight zero: fall back to uniform over the buckets rather than fail the step
        return np.full(b.shape, 1.0 / b.size)
    return w / total
