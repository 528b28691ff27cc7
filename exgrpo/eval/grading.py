"""Grading generated answers, and turning grades into per-benchmark metrics.

Two answer rules (``Grader.grading``), both recorded with every result because they change scores:

``paper`` (the default): the paper's final evaluation. The answer is the last ``\\boxed{}`` in the text after
the *first* ``</think>`` when the response has one, else in the whole response: a missing ``</think>`` is not
penalised at test time. A response without a ``\\boxed{}`` there is wrong (outcome ``no_boxed``), so "The answer
is 42." scores 0. The boxed answer is then checked by the training reward's checker (``exgrpo.reward``:
math-verify equivalence; the boxed option letter for ARC-c / GPQA / MMLU-Pro).

``reward``: exactly the training reward (``exgrpo.reward.grade``): with the think gate the text after the last
``</think>`` and 0 without one; without the gate the whole response, where an unboxed final number still counts.

Any other checker can be plugged in as ``module:function``; under ``paper`` it receives ``\\boxed{answer}``.
"""

from __future__ import annotations

import importlib
import inspect
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from exgrpo.eval.backends import package_version
from exgrpo.eval.metrics import BenchmarkMetrics, compute_benchmark_metrics
from exgrpo.reward import THINK_CLOSE, grade_batch, last_boxed, strip_tool_responses

DEFAULT_GRADER = "exgrpo.reward:score"
#: what a multi-turn backend reports per answer (the generation record's extras): turns (verl's count: model turns +
#: tool turns + 1), tool calls run, those that failed, and whether the exchange ended on a call no tool answered
TOOL_KEYS = ("num_turns", "tool_calls", "tool_errors", "unanswered_call")
GRADING_MODES = ("paper", "reward")
DEFAULT_GRADING = "paper"
NO_BOXED = "no_boxed"  # outcome of the paper rule: no \boxed{} where the answer must be


def paper_answer(response: str) -> str | None:
    """The answer the paper's final evaluation grades: the content of the last ``\\boxed{}`` in the text after
    the first ``</think>`` (the whole response when it has none); None when there is no boxed answer there."""
    idx = response.find(THINK_CLOSE)
    region = response if idx < 0 else response[idx + len(THINK_CLOSE) :]
    return last_boxed(region)


def as_boxed(answer: str) -> str:
    """``answer`` as the one boxed expression the reward's checker then reads (its braces are balanced: it came
    out of a matched ``\\boxed{...}``)."""
    return "\\boxed{" + answer + "}"


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
    """A correctness checker with the evaluation's settings; ``grader(response, ground_truth, data_source)``.

    ``grading``: "paper" (the paper's final-evaluation rule, see the module doc) or "reward" (the training
    reward's rule, with ``think_gate``). ``think_gate`` only applies to "reward". ``strip_tool_responses``: the
    tool's answers are cut out of a multi-turn response first (``exgrpo.reward.strip_tool_responses``, as the
    training reward's option of that name), under either rule.
    """

    spec: str = DEFAULT_GRADER
    think_gate: bool = True
    timeout_s: float = 10.0
    fn: Callable[..., Any] | None = field(default=None, repr=False)
    grading: str = DEFAULT_GRADING
    strip_tool_responses: bool = False

    def __post_init__(self) -> None:
        if self.grading not in GRADING_MODES:
            raise ValueError(f"grading must be one of {GRADING_MODES}, got {self.grading!r}")
        # The reward's own checker is graded in bulk through its batch API; any other checker one by one.
        self._batch = self.fn is None and self.spec == DEFAULT_GRADER
        if self.fn is None:
            self.fn = _resolve(self.spec)
        params = inspect.signature(self.fn).parameters
        takes_kwargs = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
        # Under the paper rule the checker gets the boxed answer alone: no think gate there.
        gate = self.think_gate and self.grading == "reward"
        self._kw = {
            name: value
            for name, value in (("think_gate", gate), ("timeout_s", self.timeout_s))
            if takes_kwargs or name in params
        }
        self._pass_source = takes_kwargs or "data_source" in params
        # A checker without its own think gate gets it applied here, with the same meaning.
        self._gate_here = gate and "think_gate" not in self._kw

    def _checked_text(self, response: str) -> str | None:
        """What the checker sees: the boxed answer under the paper rule (None: no boxed answer, wrong)."""
        if self.strip_tool_responses:
            response = strip_tool_responses(response)
        if self.grading == "paper":
            answer = paper_answer(response)
            return None if answer is None else as_boxed(answer)
        return response

    def __call__(self, response: str, ground_truth: str, data_source: str | None = None) -> float:
        text = self._checked_text(response)
        if text is None:
            return 0.0
        if self._gate_here:
            if THINK_CLOSE not in text:
                return 0.0
            text = text.rsplit(THINK_CLOSE, 1)[1]
        kw = dict(self._kw)
        if self._pass_source:
            kw["data_source"] = data_source
        return _as_score(self.fn(text, ground_truth, **kw), self.spec)

    def grade_many(
        self, records: list[Mapping[str, Any]], *, progress: bool = False, desc: str = "grading"
    ) -> list[tuple[float, str | None]]:
        """``(score, outcome)`` per record (``outcome`` is None for checkers that do not report one)."""
        from tqdm.auto import tqdm

        texts = [self._checked_text(r["response"]) for r in records]
        out: list[tuple[float, str | None]] = [(0.0, NO_BOXED)] * len(records)
        todo = [i for i, t in enumerate(texts) if t is not None]
        if self._batch:
            results = grade_batch(
                [texts[i] for i in todo],
                [records[i]["ground_truth"] for i in todo],
                [records[i].get("data_source") for i in todo],
                think_gate=self.think_gate and self.grading == "reward",
                timeout_s=self.timeout_s,
                progress=progress,
            )
            for i, res in zip(todo, results):
                out[i] = (float(res.score), res.outcome)
            return out
        for i in tqdm(todo, desc=desc, unit="sample", disable=not progress):
            r = records[i]
            out[i] = (self(r["response"], r["ground_truth"], r.get("data_source")), None)
        return out

    def describe(self) -> dict[str, Any]:
        """What to record with results: the grader, its answer rule and settings, math-verify's version."""
        return {
            "spec": self.spec,
            "grading": self.grading,
            "think_gate": self.think_gate if self.grading == "reward" else None,
            "timeout_s": self.timeout_s,
            "math_verify": package_version("math-verify"),
            # only when on: the results of a single-turn run stay what they were
            **({"strip_tool_responses": True} if self.strip_tool_responses else {}),
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
        m.tools = tool_figures([r for r in graded if r["benchmark"] == b])
        out[b] = m
    return out


def tool_figures(graded: Iterable[Mapping[str, Any]]) -> dict[str, float] | None:
    """How a multi-turn run's answers used the tool (None for a single-turn run): calls per answer, the share of
    answers with a call, the tool errors (count, and share of the calls), turns per answer, the share that ended on a
    call no tool answered, and the accuracy (percent) of the answers with a call and of those without."""
    rows = [r for r in graded if "tool_calls" in r]
    if not rows:
        return None
    calls = [int(r["tool_calls"]) for r in rows]
    errors = sum(int(r.get("tool_errors", 0)) for r in rows)
    with_call = [float(r["score"]) for r, c in zip(rows, calls) if c > 0]
    without = [float(r["score"]) for r, c in zip(rows, calls) if c == 0]
    out = {
        "answers": float(len(rows)),
        "calls_per_answer": sum(calls) / len(rows),
        "answers_with_call": len(with_call) / len(rows),
        "tool_errors": float(errors),
        "error_share_of_calls": errors / sum(calls) if sum(calls) else 0.0,
        "turns_per_answer": sum(int(r.get("num_turns", 0)) for r in rows) / len(rows),
        "ended_on_unanswered_call": sum(bool(r.get("unanswered_call")) for r in rows) / len(rows),
    }
    if with_call:
        out["accuracy_with_call"] = 100.0 * sum(with_call) / len(with_call)
    if without:
        out["accuracy_without_call"] = 100.0 * sum(without) / len(without)
    return out
