"""Mathematical equivalence with math-verify (docs/algorithm.md §10), without math-verify's own timeouts.

math-verify guards parsing and comparison with ``signal.alarm``, which only works in the main thread of the
main interpreter; verl calls the reward from executor threads inside Ray actors, where it raises. So both
``parsing_timeout`` and ``timeout_seconds`` are switched off here, and the whole check runs under the deadline
of ``exgrpo.reward.isolation`` (a worker process that is killed when it overruns) instead.

math-verify is imported lazily: importing it pulls in sympy (about a second), which only the grading worker
processes and inline grading need.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Sequence
from typing import Any

# A parsed expression is cached per (text, role); ground truths repeat across rollouts of one question and
# short predictions ("12", "\frac{1}{2}") repeat across questions. Long texts are not cached.
_CACHE_SIZE = 8192
_CACHEABLE_CHARS = 512
_PRED_REPR_CHARS = 200

_quiet = False


def _silence_math_verify_warnings() -> None:
    """math-verify warns once that its timeout is off; that is intended here (the isolation layer times out)."""
    global _quiet
    if not _quiet:
        for name in ("math_verify", "math_verify.parser", "math_verify.grader", "latex2sympy2_extended"):
            logging.getLogger(name).setLevel(logging.ERROR)
        _quiet = True


@functools.lru_cache(maxsize=_CACHE_SIZE)
def _parse_gold(ground_truth: str) -> tuple[Any, ...]:
    from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse

    # A ground truth is a bare answer ("\frac{1}{2}", "$2n$", "np.arcsin(10/13)"); boxing it makes math-verify
    # read the whole string as one answer (on the 1,054 distinct answers of the released evaluation files every
    # boxed ground truth verifies against itself; wrapping in "$...$" failed on one).
    parsed = parse("\\boxed{" + ground_truth + "}", [LatexExtractionConfig()], parsing_timeout=None)
    if not parsed:
        parsed = parse(ground_truth, [LatexExtractionConfig(), ExprExtractionConfig()], parsing_timeout=None)
    return tuple(parsed)


def _parse_pred_uncached(text: str, from_boxed: bool) -> tuple[Any, ...]:
    from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse

    if from_boxed:
        # The last \boxed{} was already chosen by extract.last_boxed; re-box it so math-verify parses exactly it.
        target = "\\boxed{" + text + "}"
        configs = [LatexExtractionConfig(boxed_match_priority=0), ExprExtractionConfig()]
    else:
        # No box: math-verify's own extraction over the answer section (its default targets).
        target = text
        configs = [LatexExtractionConfig(), ExprExtractionConfig()]
    return tuple(parse(target, configs, parsing_timeout=None))


@functools.lru_cache(maxsize=_CACHE_SIZE)
def _parse_pred_cached(text: str, from_boxed: bool) -> tuple[Any, ...]:
    return _parse_pred_uncached(text, from_boxed)


def _parse_pred(text: str, from_boxed: bool) -> tuple[Any, ...]:
    if len(text) <= _CACHEABLE_CHARS:
        return _parse_pred_cached(text, from_boxed)
    return _parse_pred_uncached(text, from_boxed)


def _describe(parsed: tuple[Any, ...], fallback: str) -> str:
    """A short string for the prediction (math-verify returns [sympy expr, matched text]); never raises."""
    for item in reversed(parsed):
        if isinstance(item, str):
            return item[:_PRED_REPR_CHARS]
    return fallback[:_PRED_REPR_CHARS]


def math_equal(pred_text: str, ground_truths: Sequence[str], from_boxed: bool) -> tuple[bool, str]:
    """Whether ``pred_text`` is mathematically equal to any of ``ground_truths``, and the prediction as text.

    ``from_boxed``: ``pred_text`` is the content of the response's last ``\\boxed{}``; otherwise it is the
    whole answer section and math-verify extracts the answer itself. No timeout here: callers that need one
    run this through ``exgrpo.reward.isolation.GraderPool``.
    """
    from math_verify import verify

    _silence_math_verify_warnings()
    pred = _parse_pred(pred_text, from_boxed)
    shown = _describe(pred, pred_text if from_boxed else "")
    if not pred:
        return False, shown
    for gt in ground_truths:
        gold = _parse_gold(gt)
        if gold and verify(list(gold), list(pred), timeout_seconds=None):
            return True, shown
    return False, shown


def warm_up() -> None:
    """Import math-verify and sympy and exercise the parser once, so the first graded answer is not slow."""
    math_equal("1", ["1"], from_boxed=True)
