"""The verifiable reward of ExGRPO (docs/algorithm.md §10): binary, math-verify based, with the ``</think>`` gate.

One response is graded in this order:

1. think gate (on for think-template models): grade only the text after the last ``</think>``; none -> 0.
2. multiple choice (ARC-c, GPQA, MMLU-Pro, chosen by ``data_source``): the chosen option label
   (``extract.extract_choice_label``) must equal the ground-truth label.
3. otherwise math: the last ``\\boxed{}`` is the answer (exact match after a LaTeX-blind normalisation
   shortcuts to 1); with no box, math-verify extracts the answer from the answer section itself. Equivalence
   is math-verify's, run in a worker process (``isolation.GraderPool``).

One deadline bounds the whole call: ``timeout_s`` after it starts, whatever is left after extraction (linear in
the response length) and after waiting for a free grader process is what the check gets; a call returns within
``timeout_s`` plus the time to kill an overrunning worker (the first calls of a process also wait, once, for the
first grader process to start).

Nothing raises: a bad response, a bad ground truth, a math-verify exception or a timeout scores 0 and is
counted in ``reward_stats()`` (per process) and flagged in the result (``reward_error`` / ``reward_timeout``).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from tqdm.auto import tqdm

from exgrpo.reward import math_verifier
from exgrpo.reward.extract import (
    THINK_CLOSE,
    canonical_answer,
    choice_labels,
    extract_choice_label,
    last_boxed,
    split_after_think,
)
from exgrpo.reward.isolation import GraderPool, GraderReply, GradingTimeout, get_default_pool

logger = logging.getLogger(__name__)

# math-verify's own per-operation default is 5 s; a whole call (parse both sides + compare) gets 10 s. The
# slowest honest comparison among the real benchmark answers took about 4.5 s on a 2-core machine.
DEFAULT_TIMEOUT_S = 10.0

# data_source names (lower case, "-" read as "_") graded as multiple choice; a name also matches with any
# "_suffix" (gpqa_diamond, mmlu_pro_physics).
MULTIPLE_CHOICE_SOURCES: tuple[str, ...] = ("arc_c", "arc_challenge", "gpqa", "mmlu_pro", "mmlupro")

OUTCOMES = ("correct", "wrong", "no_think", "no_answer", "timeout", "error")


@dataclass(frozen=True)
class RewardResult:
    """One graded response. ``score`` is 1.0 or 0.0; ``outcome`` says why (one of ``OUTCOMES``)."""

    score: float
    outcome: str
    pred: str = ""  # the extracted answer (boxed content, option label, or math-verify's match), <= 200 chars
    think_closed: bool = False  # whether the response contains "</think>" (recorded with the gate on or off)
    error: str | None = None  # "ExceptionType: message" for outcome "error"; what ran out for "timeout"
    queue_s: float = 0.0  # seconds the call waited for a free grader process (0 when it needed none)
    queue_timeout: bool = False  # outcome "timeout" struck before a grader process was free

    @property
    def correct(self) -> bool:
        return self.score > 0.5


_QUEUE_KEYS = ("queue_s_total", "queue_s_max", "queue_timeouts")


class RewardStats:
    """Per-process counters of graded calls by outcome, and the time they queued for a grader (thread-safe)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: dict[str, float] = dict.fromkeys(("calls", *OUTCOMES, *_QUEUE_KEYS), 0)

    def record(self, outcome: str, queue_s: float = 0.0, queue_timeout: bool = False) -> int:
        """Count one call; returns the running count of that outcome."""
        with self._lock:
            self._counts["calls"] += 1
            self._counts[outcome] += 1
            self._counts["queue_s_total"] += queue_s
            self._counts["queue_s_max"] = max(self._counts["queue_s_max"], queue_s)
            self._counts["queue_timeouts"] += int(queue_timeout)
            return int(self._counts[outcome])

    def snapshot(self) -> dict[str, float]:
        with self._lock:
            return dict(self._counts)

    def reset(self) -> None:
        with self._lock:
            for key in self._counts:
                self._counts[key] = 0


_STATS = RewardStats()
_LOG_FIRST = 20  # log the first failures of each kind in full, then one in _LOG_EVERY
_LOG_EVERY = 1000


def reward_stats() -> dict[str, float]:
    """Figures of the graded calls in this process: ``calls``, one count per outcome (``error``, ``timeout`` ...),
    and the waiting for a free grader process: ``queue_s_total``, ``queue_s_max`` (seconds) and
    ``queue_timeouts`` (timeouts that struck before the call got a grader)."""
    return _STATS.snapshot()


def reset_reward_stats() -> None:
    _STATS.reset()


def is_multiple_choice(data_source: str | None, sources: Iterable[str] = MULTIPLE_CHOICE_SOURCES) -> bool:
    """Whether ``data_source`` names a multiple-choice benchmark (``arc_c``, ``gpqa``, ``gpqa_diamond``, ...)."""
    if not data_source:
        return False
    name = str(data_source).strip().lower().replace("-", "_")
    return any(name == s or name.startswith(s + "_") for s in (str(x).lower().replace("-", "_") for x in sources))


def normalize_ground_truths(ground_truth: Any) -> tuple[str, ...]:
    """A ground truth as a tuple of non-empty answers (verl may hand a str, a list, or a numpy array)."""
    if isinstance(ground_truth, bytes):
        ground_truth = ground_truth.decode("utf-8")
    if isinstance(ground_truth, str):
        items: list[Any] = [ground_truth]
    elif isinstance(ground_truth, bool):
        raise TypeError("ground truth must be a string, a number or a list of them, got bool")
    elif isinstance(ground_truth, int | float):
        items = [ground_truth]
    elif hasattr(ground_truth, "tolist") or isinstance(ground_truth, list | tuple):
        items = list(ground_truth.tolist() if hasattr(ground_truth, "tolist") else ground_truth)
        if any(isinstance(x, list | tuple | dict) for x in items):
            raise TypeError("ground truth list must hold strings or numbers, not nested containers")
    else:
        raise TypeError(f"ground truth must be a string, a number or a list of them, got {type(ground_truth).__name__}")
    answers = tuple(s for s in (str(x).strip() for x in items if x is not None) if s)
    if not answers:
        raise ValueError("empty ground truth")
    return answers


def _math_equal(
    pred_text: str,
    ground_truths: tuple[str, ...],
    from_boxed: bool,
    deadline: float | None,
    pool: GraderPool | None,
    max_workers: int | None,
) -> GraderReply:
    if deadline is None:
        return GraderReply(*math_verifier.math_equal(pred_text, ground_truths, from_boxed), queue_s=0.0)
    pool = pool or get_default_pool(max_workers)
    return pool.check(pred_text, ground_truths, from_boxed, deadline)


def _grade(
    response: str,
    ground_truth: Any,
    data_source: str | None,
    think_gate: bool,
    timeout_s: float | None,
    multiple_choice: bool | None,
    multiple_choice_sources: Iterable[str],
    pool: GraderPool | None,
    max_workers: int | None,
    exact_shortcut: bool,
) -> RewardResult:
    # The deadline starts now: extraction and queueing for a grader count against it.
    deadline = None if timeout_s is None or timeout_s <= 0 else time.monotonic() + timeout_s
    if not isinstance(response, str):
        raise TypeError(f"response must be str, got {type(response).__name__}")
    answers = normalize_ground_truths(ground_truth)
    think_closed = THINK_CLOSE in response
    if think_gate:
        region = split_after_think(response)
        if region is None:
            return RewardResult(0.0, "no_think", think_closed=False)
    else:
        region = response

    mc = is_multiple_choice(data_source, multiple_choice_sources) if multiple_choice is None else multiple_choice
    label_sets = {choice_labels(a) for a in answers} if mc else set()
    if mc and len(label_sets) == 1 and None not in label_sets:
        labels = label_sets.pop()
        choice = extract_choice_label(region, labels)
        if choice is None:
            return RewardResult(0.0, "no_answer", think_closed=think_closed)
        gold = {a.strip().strip("()").strip().upper() for a in answers}
        ok = choice in gold
        return RewardResult(float(ok), "correct" if ok else "wrong", pred=choice, think_closed=think_closed)
    # A multiple-choice source whose ground truth is not an option label is graded as math.

    boxed = last_boxed(region)
    if boxed is not None:
        if not boxed.strip():
            return RewardResult(0.0, "no_answer", think_closed=think_closed)
        canon = canonical_answer(boxed)
        if exact_shortcut and canon and any(canon == canonical_answer(a) for a in answers):
            return RewardResult(1.0, "correct", pred=boxed[:200], think_closed=think_closed)
        pred_text, from_boxed = boxed, True
    else:
        if not region.strip():
            return RewardResult(0.0, "no_answer", think_closed=think_closed)
        pred_text, from_boxed = region, False
    try:
        reply = _math_equal(pred_text, answers, from_boxed, deadline, pool, max_workers)
    except GradingTimeout as e:
        pred = pred_text[:200] if from_boxed else ""
        return RewardResult(0.0, "timeout", pred, think_closed, error=str(e), queue_s=e.queue_s, queue_timeout=e.queued)
    ok, shown, queue_s = reply.equal, reply.shown, reply.queue_s
    if not ok and not shown:
        return RewardResult(0.0, "no_answer", think_closed=think_closed, queue_s=queue_s)
    return RewardResult(float(ok), "correct" if ok else "wrong", pred=shown, think_closed=think_closed, queue_s=queue_s)


def grade(
    response: str,
    ground_truth: str | Sequence[str],
    *,
    data_source: str | None = None,
    think_gate: bool = True,
    timeout_s: float | None = DEFAULT_TIMEOUT_S,
    multiple_choice: bool | None = None,
    multiple_choice_sources: Iterable[str] = MULTIPLE_CHOICE_SOURCES,
    pool: GraderPool | None = None,
    max_workers: int | None = None,
    exact_shortcut: bool = True,
) -> RewardResult:
    """Grade one response against its ground truth (a string, or a list of acceptable answers); never raises.

    Args:
        data_source: the row's ``data_source``; multiple-choice sources (``MULTIPLE_CHOICE_SOURCES``) compare
            option labels.
        think_gate: grade only the text after the last ``</think>`` and give 0 without one (think-template
            models); False grades the whole response (Llama base, the toy arithmetic task).
        timeout_s: hard deadline for the whole call, in seconds from its start: answer extraction, waiting for a
            free grader process (``RewardResult.queue_s``) and the math-verify check in that worker process all
            count against it. None or <= 0 grades in the calling thread with no timeout (trusted inputs, or a
            process that may not start children).
        multiple_choice: force (True) or forbid (False) the option-label check regardless of ``data_source``.
        pool: the worker pool to use; default: the process-wide pool with ``max_workers`` workers.
        exact_shortcut: score a boxed answer equal to a ground truth up to LaTeX spacing as 1 without calling
            math-verify (it agrees with math-verify on every such pair we tried, and skips the worker round trip);
            False sends every math answer through math-verify (tests, benchmarks).
    """
    try:
        result = _grade(
            response,
            ground_truth,
            data_source,
            think_gate,
            timeout_s,
            multiple_choice,
            multiple_choice_sources,
            pool,
            max_workers,
            exact_shortcut,
        )
    except Exception as e:
        result = RewardResult(0.0, "error", error=f"{type(e).__name__}: {str(e)[:200]}")
    count = _STATS.record(result.outcome, result.queue_s, result.queue_timeout)
    if result.outcome in ("error", "timeout") and (count <= _LOG_FIRST or count % _LOG_EVERY == 0):
        logger.warning(
            "reward %s #%d (scored 0; data_source=%s): %s",
            result.outcome,
            count,
            data_source,
            result.error or f"the call exceeded {timeout_s} s",
        )
    return result


def score(
    response: str,
    ground_truth: str | Sequence[str],
    *,
    data_source: str | None = None,
    think_gate: bool = True,
    timeout_s: float | None = DEFAULT_TIMEOUT_S,
    **kwargs: Any,
) -> float:
    """1.0 if ``response`` answers ``ground_truth`` correctly, else 0.0 (see ``grade`` for the arguments)."""
    return grade(
        response, ground_truth, data_source=data_source, think_gate=think_gate, timeout_s=timeout_s, **kwargs
    ).score


def grade_batch(
    responses: Sequence[str],
    ground_truths: Sequence[Any],
    data_sources: Sequence[str | None] | None = None,
    *,
    think_gate: bool = True,
    timeout_s: float | None = DEFAULT_TIMEOUT_S,
    max_workers: int | None = None,
    progress: bool = False,
    **kwargs: Any,
) -> list[RewardResult]:
    """Grade many responses, one thread per grading worker process (the order of the inputs is kept)."""
    if len(responses) != len(ground_truths):
        raise ValueError(f"{len(responses)} responses but {len(ground_truths)} ground truths")
    if data_sources is not None and len(data_sources) != len(responses):
        raise ValueError(f"{len(responses)} responses but {len(data_sources)} data sources")
    sources = data_sources if data_sources is not None else [None] * len(responses)
    inline = timeout_s is None or timeout_s <= 0
    threads = 1 if inline else (kwargs.get("pool") or get_default_pool(max_workers)).max_workers

    def one(i: int) -> RewardResult:
        return grade(
            responses[i],
            ground_truths[i],
            data_source=sources[i],
            think_gate=think_gate,
            timeout_s=timeout_s,
            max_workers=max_workers,
            **kwargs,
        )

    with ThreadPoolExecutor(max_workers=threads) as executor:
        return list(
            tqdm(
                executor.map(one, range(len(responses))),
                total=len(responses),
                disable=not progress,
                unit="row",
                desc="grading",
            )
        )
