"""Grading generated answers with the reward's checker, and turning grades into per-benchmark metrics.

The grader is the same verifiable checker as the training reward (``exgrpo.reward``: last ``\\boxed{}``,
math-verify equivalence; option letters for ARC-c / GPQA / MMLU-Pro), so evaluation and training agree on what
"correct" means (ALGORITHM.md §10, §12). Any other checker can be plugged in as ``module:function``.

The think gate: for models trained with the think template the answer only counts when the response closes its
``</think>`` block (the answer is read after it); base and instruct models do not write think blocks, so the gate
must be off for them. It changes scores, so it is recorded with every result.
"""

from __future__ import annotations

import importlib
import inspect
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from exgrpo.eval.generate import package_version
from exgrpo.eval.metrics import BenchmarkMetrics, compute_benchmark_metrics

DEFAULT_GRADER = "exgrpo.reward:score"
THINK_CLOSE = "</think>"


def _reward_batch() -> Callable[..., Any] | None:
    """``exgrpo.reward.grade_batch``: parallel grading in the reward's worker processes, with an outcome per
    answer (correct / wrong / no_think / no_answer / timeout / error)."""
    try:
        from exgrpo.reward import grade_batch
    except ImportError:
        return None
    return grade_batch


def _resolve(spec: str) -> Callable[..., Any]:
    module_name, _, attr = spec.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise ImportError(f"grader {spec!r}: cannot import module {module_name!r} ({e})") from e
    attr = attr or "score"
    fn = getattr(module, attr, None)
    if not callable(fn):
        raise AttributeError(f"grader {spec!r}: module {module_name!r} has no callable {attr!r}")
    return fn


def _as_score(value: Any, spec: str) -> float:
    """Reduce a checker's return value (bool, number, or dict with acc/correct/score) to 1.0 / 0.0."""
    if isinstance(value, Mapping):
        for key in ("acc", "correct", "score"):
            if key in value:
                value = value[key]
                break
        else:
            raise TypeError(f"grader {spec!r} returned a dict without 'acc', 'correct' or 'score': {sorted(value)}")
    if isinstance(value, (bool, int, float)):
        return 1.0 if float(value) > 0.5 else 0.0
    raise TypeError(f"grader {spec!r} returned {type(value).__name__}, expected bool, number or dict")


@dataclass
class Grader:
    """A correctness checker with the evaluation's settings; ``grader(response, ground_truth, data_source)``."""

    spec: str = DEFAULT_GRADER
    think_gate: bool = True
    timeout_s: float = 10.0
    fn: Callable[..., Any] | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        # The reward's own checker is graded in bulk through its batch API; any other checker one by one.
        self._batch = _reward_batch() if self.fn is None and self.spec == DEFAULT_GRADER else None
        if self.fn is None:
            self.fn = _resolve(self.spec)
        params = inspect.signature(self.fn).parameters
        takes_kwargs = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
        self._kw = {
            name: value
            for name, value in (("think_gate", self.think_gate), ("timeout_s", self.timeout_s))
            if takes_kwargs or name in params
        }
        self._pass_source = takes_kwargs or "data_source" in params
        # A checker without its own think gate gets it applied here, with the same meaning.
        self._gate_here = self.think_gate and "think_gate" not in self._kw

    def __call__(self, response: str, ground_truth: str, data_source: str | None = None) -> float:
        if self._gate_here:
            if THINK_CLOSE not in response:
                return 0.0
            response = response.rsplit(THINK_CLOSE, 1)[1]
        kw = dict(self._kw)
        if self._pass_source:
            kw["data_source"] = data_source
        return _as_score(self.fn(response, ground_truth, **kw), self.spec)

    def grade_many(
        self, records: list[Mapping[str, Any]], *, progress: bool = False, desc: str = "grading"
    ) -> list[tuple[float, str | None]]:
        """``(score, outcome)`` per record (``outcome`` is None for checkers that do not report one)."""
        from tqdm.auto import tqdm

        if self._batch is not None:
            results = self._batch(
                [r["response"] for r in records],
                [r["ground_truth"] for r in records],
                [r.get("data_source") for r in records],
                think_gate=self.think_gate,
                timeout_s=self.timeout_s,
                progress=progress,
            )
            return [(float(res.score), res.outcome) for res in results]
        return [
            (self(r["response"], r["ground_truth"], r.get("data_source")), None)
            for r in tqdm(records, desc=desc, unit="sample", disable=not progress)
        ]

    def describe(self) -> dict[str, Any]:
        """What to record with results (ALGORITHM.md §12: record the grader)."""
        return {
            "spec": self.spec,
            "think_gate": self.think_gate,
            "timeout_s": self.timeout_s,
            "math_verify": package_version("math-verify"),
        }


def grade_records(
    records: Iterable[Mapping[str, Any]], grader: Grader, *, progress: bool = True, desc: str = "grading"
) -> list[dict[str, Any]]:
    """Grade generation records (see generate.generate_to_jsonl); returns copies with ``score`` and ``outcome``."""
    records = list(records)
    graded = grader.grade_many(records, progress=progress, desc=desc)
    return [{**rec, "score": sc, "outcome": outcome} for rec, (sc, outcome) in zip(records, graded)]


def summarize(graded: Iterable[Mapping[str, Any]]) -> dict[str, BenchmarkMetrics]:
    """Per-benchmark metrics from graded records; samples are grouped by question across repeated rows."""
    groups: dict[str, dict[str, list[float]]] = {}
    truncated: dict[str, int] = {}
    outcomes: dict[str, Counter[str]] = {}
    for rec in sorted(graded, key=lambda r: (r["benchmark"], r["row"], r["sample"])):
        b = rec["benchmark"]
        groups.setdefault(b, {}).setdefault(rec["question_id"], []).append(float(rec["score"]))
        truncated[b] = truncated.get(b, 0) + (rec.get("finish_reason") == "length")
        if rec.get("outcome"):
            outcomes.setdefault(b, Counter())[rec["outcome"]] += 1
    out = {}
    for b, g in groups.items():
        m = compute_benchmark_metrics(b, g, truncated=truncated[b])
        m.outcomes = dict(sorted(outcomes[b].items())) if b in outcomes else None
        out[b] = m
    return out
