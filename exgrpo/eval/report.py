"""Results files and paper-style reports: JSON, CSV, a Markdown table in the paper's column order with the paper's
reference rows beside ours, and a PNG bar chart.

Everything a table shows is derived from the per-benchmark metrics stored in the results JSON (the macro averages
are recomputed from them), so a results file read back renders the same table, and results of separate ID and
OOD runs of one model can be merged into one row (``merge_by_label``).
"""

from __future__ import annotations

import csv
import dataclasses
import datetime as _dt
import json
import math
import os
import pathlib
import re
import textwrap
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from exgrpo.eval.metrics import (
    AVERAGES,
    PAPER_COLUMNS,
    BenchmarkMetrics,
    MacroAverage,
    macro_averages,
)

SCHEMA_VERSION = 1
COLUMN_KEYS = tuple(c.key for c in PAPER_COLUMNS)
HEADERS = {c.key: c.header for c in PAPER_COLUMNS}
PARTIAL_MARK = "†"
CAVEAT_MARK = "‡"
PARTIAL_NOTE = f"{PARTIAL_MARK} average over the evaluated benchmarks only (the paper averages all of them)."
# The paper's protocol, to name what a run did differently (the caveats of a row).
PROTOCOL_SAMPLING = {"temperature": 0.6, "top_p": 1.0, "max_new_tokens": 8192}

# --- the paper's reference rows (docs/paper_results.md, arXiv 2510.02245 v2), in PAPER_COLUMNS order ---------

_TABLE1 = [
    ("Qwen2.5-Math-7B base", [11.5, 4.9, 31.3, 43.6, 7.4, 15.6, 19.0, 18.2, 11.1, 16.9, 15.4]),
    ("Qwen2.5-Math-7B-Instruct", [12.5, 10.2, 48.5, 80.4, 32.7, 41.0, 37.6, 70.3, 24.7, 34.1, 43.0]),
    ("On-policy (Dr.GRPO)", [24.9, 15.5, 59.2, 84.8, 38.2, 49.3, 45.3, 82.6, 37.4, 49.2, 56.4]),
    ("ExGRPO", [31.6, 18.7, 66.3, 87.4, 36.0, 50.1, 48.3, 84.7, 37.4, 52.9, 58.3]),
    ("LUFFY", [29.4, 23.1, 65.6, 87.6, 37.5, 57.2, 50.1, 80.5, 39.9, 53.0, 57.8]),
    ("LUFFY → continual on-policy", [24.8, 17.8, 67.5, 88.4, 38.6, 55.3, 48.7, 81.9, 47.0, 53.3, 60.7]),
    ("LUFFY → continual ExGRPO", [32.3, 25.7, 65.6, 87.6, 40.1, 57.0, 51.4, 83.6, 42.4, 54.5, 60.2]),
]
_TABLE5 = [
    ("Qwen2.5-Math-1.5B base", [7.2, 3.6, 26.4, 28.0, 9.6, 21.2, 16.0, 3.1, 3.0, 2.3, 2.8]),
    ("— on-policy", [11.8, 7.7, 40.2, 61.8, 26.8, 32.0, 30.0, 57.5, 28.3, 30.7, 38.9]),
    ("— ExGRPO", [13.3, 8.6, 46.6, 74.0, 30.5, 39.0, 35.3, 59.3, 30.8, 30.4, 40.2]),
    ("Qwen2.5-7B-Instruct", [11.7, 7.5, 43.8, 71.8, 30.9, 40.4, 34.4, 84.7, 24.7, 54.7, 54.7]),
    ("— on-policy", [14.1, 8.3, 43.5, 74.0, 33.8, 37.6, 35.2, 91.4, 19.2, 57.6, 56.0]),
    ("— ExGRPO", [15.2, 12.4, 47.8, 80.0, 36.0, 44.4, 39.3, 91.1, 36.9, 58.6, 62.2]),
    ("Llama3.1-8B base", [0.0, 0.0, 4.7, 11.0, 4.4, 1.9, 3.7, 0.2, 0.0, 3.6, 1.3]),
    ("— on-policy (collapses)", [0.4, 0.4, 2.9, 9.2, 5.1, 2.8, 3.4, 0.6, 0.0, 3.0, 1.2]),
    ("— ExGRPO (no delayed start)", [0.7, 0.1, 6.6, 12.0, 10.7, 6.5, 6.1, 59.0, 7.1, 26.2, 30.8]),
    ("Llama3.1-8B-Instruct", [4.0, 0.3, 15.7, 39.8, 18.0, 13.3, 15.2, 42.4, 0.0, 40.5, 27.6]),
    ("— on-policy", [3.8, 0.8, 21.4, 49.8, 24.3, 19.6, 19.9, 86.7, 0.0, 48.1, 44.9]),
    ("— ExGRPO", [6.1, 0.6, 27.1, 55.2, 25.7, 23.1, 23.0, 88.9, 15.2, 52.1, 52.0]),
]


@dataclass(frozen=True)
class TableRow:
    """One row of a paper-style table: values keyed by PAPER_COLUMNS key (None: not evaluated)."""

    name: str
    values: dict[str, float | None]
    reference: bool = False
    partial: frozenset[str] = frozenset()  # averages taken over fewer benchmarks than the paper's
    caveats: tuple[str, ...] = ()  # how the run departs from the full protocol (a slice, fewer samples, ...)
    # "(ours)" tells a measured row from the paper's: not marked on other data (an untrained model is not "ours")
    mark_ours: bool = True

    @property
    def display_name(self) -> str:
        """The row's name as tables and charts print it: ours marked "(ours)" once (not on other data than the
        paper's), and ‡ when it has caveats."""
        if self.reference:
            return self.name
        mark = self.mark_ours and "(ours)" not in self.name.lower()
        return (f"{self.name} (ours)" if mark else self.name) + (f" {CAVEAT_MARK}" if self.caveats else "")


REFERENCE_TABLES: dict[str, list[TableRow]] = {
    name: [TableRow(label, dict(zip(COLUMN_KEYS, vals)), reference=True) for label, vals in rows]
    for name, rows in (("table1", _TABLE1), ("table5", _TABLE5))
}
REFERENCE_CHOICES = ("table1", "table5", "none")


def reference_rows(reference: str | Sequence[TableRow] | None) -> list[TableRow]:
    """Reference rows by table name ("table1", "table5", "none"/None) or as given."""
    if reference is None or reference == "none":
        return []
    if isinstance(reference, str):
        if reference not in REFERENCE_TABLES:
            raise ValueError(f"reference must be one of {REFERENCE_CHOICES}, got {reference!r}")
        return list(REFERENCE_TABLES[reference])
    return list(reference)


def parse_reference_markdown(text: str) -> dict[str, list[TableRow]]:
    """Tables of docs/paper_results.md whose header is the paper's columns, keyed "table1", "table5", ..."""
    tables: dict[str, list[TableRow]] = {}
    current: str | None = None
    header_ok = False
    expected = ["Model", *HEADERS.values()]
    for line in text.splitlines():
        m = re.match(r"^##\s+Table\s+(\d+)", line)
        if m:
            current, header_ok = f"table{m.group(1)}", False
            continue
        if current is None or not line.startswith("|"):
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if not header_ok:
            header_ok = cells == expected
            continue
        if set("".join(cells)) <= set("-: "):
            continue
        try:
            values = [float(c) for c in cells[1:]]
        except ValueError:
            continue
        tables.setdefault(current, []).append(TableRow(cells[0], dict(zip(COLUMN_KEYS, values)), reference=True))
    return tables


# --- results -------------------------------------------------------------------------------------------------


@dataclass
class EvalResults:
    """Per-benchmark metrics of one model plus everything that determines them (``metadata``)."""

    label: str
    benchmarks: dict[str, BenchmarkMetrics]
    metadata: dict[str, Any] = field(default_factory=dict)

    def scores(self) -> dict[str, float]:
        return {b: m.score for b, m in self.benchmarks.items()}

    def averages(self) -> dict[str, MacroAverage]:
        return macro_averages(self.scores())

    def table_row(self) -> TableRow:
        values: dict[str, float | None] = {k: None for k in COLUMN_KEYS}
        values.update(self.scores())  # benchmarks outside the paper's columns too (shown after them)
        partial = set()
        for name, avg in self.averages().items():
            values[name] = avg.value
            if avg.value is not None and not avg.complete:
                partial.add(name)
        return TableRow(self.label, values, reference=False, partial=frozenset(partial), caveats=self.caveats())

    def caveats(self) -> tuple[str, ...]:
        """How the run departs from the paper's full protocol, from its recorded settings (merged runs: all
        parts): a slice of the questions, a sample count, sampling settings or an answer rule of its own."""
        out: list[str] = []
        for meta in self.metadata.get("merged_from") or [self.metadata]:
            for c in _caveats_of(meta):
                if c not in out:
                    out.append(c)
        return tuple(out)

    def to_dict(self) -> dict[str, Any]:
        avgs = {
            name: {"value": a.value, "columns": list(a.columns), "complete": a.complete}
            for name, a in self.averages().items()
        }
        return {
            "schema_version": SCHEMA_VERSION,
            "label": self.label,
            "metadata": self.metadata,
            "benchmarks": {b: m.to_dict() for b, m in sorted(self.benchmarks.items(), key=_column_order)},
            "averages": avgs,  # derived; kept for readers of the JSON, recomputed on load
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> EvalResults:
        version = d.get("schema_version")
        if version != SCHEMA_VERSION:
            raise ValueError(f"results schema_version {version!r} is not supported (expected {SCHEMA_VERSION})")
        for key in ("label", "benchmarks"):
            if key not in d:
                raise ValueError(f"results are missing the {key!r} field")
        benchmarks = {b: BenchmarkMetrics.from_dict(m) for b, m in d["benchmarks"].items()}
        return cls(label=d["label"], benchmarks=benchmarks, metadata=dict(d.get("metadata", {})))


def _caveats_of(meta: Mapping[str, Any]) -> list[str]:
    out = []
    sel = meta.get("selection") or {}
    if sel.get("max_questions_per_source") is not None:
        out.append(f"sliced: the first {sel['max_questions_per_source']} question(s) of each benchmark")
    if sel.get("max_rows") is not None:
        out.append(f"sliced: the first {sel['max_rows']} row(s)")
    sampling = meta.get("sampling") or {}
    if sampling.get("n_samples") is not None:
        out.append(f"{sampling['n_samples']} sample(s) per row for every benchmark (protocol: avg@32 on AIME/AMC)")
    for key, want in PROTOCOL_SAMPLING.items():
        have = sampling.get(key)
        if have is not None and have != want:
            out.append(f"{key}={have} (protocol: {want})")
    grading = (meta.get("grader") or {}).get("grading")
    if grading not in (None, "paper"):
        out.append(f"graded with the {grading!r} rule (protocol: the paper's last-\\boxed{{}} rule)")
    return out


def _column_order(item: tuple[str, Any]) -> tuple[int, str]:
    key = item[0]
    return (COLUMN_KEYS.index(key) if key in COLUMN_KEYS else len(COLUMN_KEYS), key)


def save_results(results: EvalResults, path: str | os.PathLike) -> pathlib.Path:
    """Write results JSON (atomically: temporary name, then rename)."""
    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(results.to_dict(), indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    os.replace(tmp, path)
    return path


def load_results(path: str | os.PathLike) -> EvalResults:
    path = pathlib.Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"results file not found: {path}")
    try:
        return EvalResults.from_dict(json.loads(path.read_text(encoding="utf-8")))
    except (ValueError, KeyError, TypeError) as e:
        raise ValueError(f"{path}: not a results file ({e})") from e


def merge_by_label(results: Sequence[EvalResults]) -> list[EvalResults]:
    """Merge results of the same label (e.g. the ID and OOD runs of one checkpoint) into one row each."""
    merged: dict[str, EvalResults] = {}
    for r in results:
        if r.label not in merged:
            merged[r.label] = EvalResults(r.label, dict(r.benchmarks), dict(r.metadata))
            continue
        m = merged[r.label]
        dup = sorted(set(m.benchmarks) & set(r.benchmarks))
        if dup:
            raise ValueError(f"cannot merge results labelled {r.label!r}: benchmark(s) {dup} appear twice")
        m.benchmarks.update(r.benchmarks)
        parts = m.metadata.get("merged_from") or [m.metadata]
        m.metadata = {"merged_from": [*parts, r.metadata]}
    return list(merged.values())


# --- tables --------------------------------------------------------------------------------------------------


def _measures_paper_columns(row: TableRow) -> bool:
    return any(row.values.get(k) is not None for k in COLUMN_KEYS)


def _measured_only_other_benchmarks(ours: Sequence[TableRow]) -> bool:
    """Our rows measured something, and nothing of it is a column of the paper's table (another data set)."""
    measured = any(v is not None for row in ours for v in row.values.values())
    return measured and not any(_measures_paper_columns(row) for row in ours)


def table_rows(results: Sequence[EvalResults], reference: str | Sequence[TableRow] | None = "table1") -> list[TableRow]:
    """The paper's reference rows followed by ours (one per label). When ours measured none of the paper's
    benchmarks, the paper's rows are left out (they would share no column with ours), and ours are not marked
    "(ours)": there is nothing to tell them from, and the model may be anyone's (an untrained base model)."""
    ours = [r.table_row() for r in merge_by_label(results)]
    if _measured_only_other_benchmarks(ours):  # another data set: no paper row to tell ours from, no "(ours)"
        return [dataclasses.replace(row, mark_ours=False) for row in ours]
    return reference_rows(reference) + ours


def extra_columns(rows: Sequence[TableRow]) -> list[str]:
    """Benchmarks our rows measured that are not columns of the paper's table (e.g. ``data_source`` values of
    another data set), in name order: tables and charts show them after the paper's columns."""
    return sorted({k for row in rows if not row.reference for k in row.values if k not in HEADERS})


def table_columns(rows: Sequence[TableRow]) -> list[str]:
    """The paper's columns, then the benchmarks outside them that our rows measured; only the latter when no row
    has a value in the paper's columns."""
    extras = extra_columns(rows)
    if extras and not any(_measures_paper_columns(row) for row in rows):
        return extras
    return [*COLUMN_KEYS, *extras]


def _header(key: str) -> str:
    return HEADERS.get(key, key)


def columns_note(rows: Sequence[TableRow], reference: str | Sequence[TableRow] | None = None) -> list[str]:
    """Lines under a table whose rows measured benchmarks outside the paper's columns."""
    extras = extra_columns(rows)
    if not extras:
        return []
    ours = [row for row in rows if not row.reference]
    if _measured_only_other_benchmarks(ours):
        left_out = ""
        if reference_rows(reference):
            name = reference.replace("table", "Table ") if isinstance(reference, str) else "reference"
            left_out = f", without the paper's {name} rows"
        return [
            f"None of the evaluated benchmarks ({', '.join(extras)}) is a column of the paper's table: the table "
            f"shows what was measured{left_out}."
        ]
    return [f"Not columns of the paper's table (no reference values, not in the averages): {', '.join(extras)}."]


def _fmt(value: float | None, digits: int) -> str:
    return "—" if value is None or (isinstance(value, float) and math.isnan(value)) else f"{value:.{digits}f}"


def render_markdown(
    results: Sequence[EvalResults],
    reference: str | Sequence[TableRow] | None = "table1",
    *,
    digits: int = 1,
    details: bool = True,
) -> str:
    """A Markdown table in the paper's column order: reference rows, then ours in bold; plus details."""
    rows = table_rows(results, reference)
    columns = table_columns(rows)
    lines = [
        "| Model | " + " | ".join(_header(k) for k in columns) + " |",
        "|---" * (len(columns) + 1) + "|",
    ]
    for row in rows:
        cells = []
        for k in columns:
            cell = _fmt(row.values.get(k), digits)
            if k in row.partial:
                cell += PARTIAL_MARK
            cells.append(cell)
        name = row.name if row.reference else f"**{row.display_name}**"
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    note = columns_note(rows, reference)
    if note:
        lines += ["", *note]
    if any(row.partial for row in rows):
        lines += ["", PARTIAL_NOTE]
    caveated = [row for row in rows if row.caveats]
    if caveated:
        lines += ["", f"{CAVEAT_MARK} not the full protocol:"]
        lines += [f"- {row.name}: " + "; ".join(row.caveats) for row in caveated]
    if isinstance(reference, str) and reference != "none" and any(row.reference for row in rows):
        lines += ["", f"Reference rows: paper {reference.replace('table', 'Table ')} (arXiv 2510.02245 v2)."]
    if details:
        for r in merge_by_label(results):
            lines += ["", *_details_markdown(r, digits)]
    return "\n".join(lines) + "\n"


def _details_markdown(r: EvalResults, digits: int) -> list[str]:
    ks = sorted({k for m in r.benchmarks.values() for k in m.pass_at_k})
    lines = [
        f"### {r.label}: per-benchmark details",
        "",
        "| Benchmark | metric | questions | samples | score | "
        + " | ".join(f"pass@{k}" for k in ks)
        + " | truncated | grader outcomes |",
        "|---" * (5 + len(ks) + 2) + "|",
    ]
    for b, m in sorted(r.benchmarks.items(), key=_column_order):
        pak = [_fmt(m.pass_at_k.get(k), digits) for k in ks]
        trunc = "—" if m.truncated_fraction is None else f"{100 * m.truncated_fraction:.1f}%"
        lines.append(
            f"| {HEADERS.get(b, b)} | {m.metric_name} | {m.num_questions} | {m.num_samples} | "
            f"{_fmt(m.score, digits)} | " + " | ".join(pak) + f" | {trunc} | {_outcomes(m) or '—'} |"
        )
    with_tools = [(b, m) for b, m in sorted(r.benchmarks.items(), key=_column_order) if m.tools]
    if with_tools:
        lines += [
            "",
            "| Benchmark (with the tool) | calls per answer | answers with a call | tool errors | turns per answer | "
            "ended on an unanswered call | accuracy with a call | without |",
            "|---" * 8 + "|",
        ]
        for b, m in with_tools:
            t = m.tools
            errors = f"{int(t['tool_errors'])} ({100 * t['error_share_of_calls']:.1f}% of calls)"
            lines.append(
                f"| {HEADERS.get(b, b)} | {t['calls_per_answer']:.2f} | {100 * t['answers_with_call']:.1f}% | "
                f"{errors} | {t['turns_per_answer']:.2f} | {100 * t['ended_on_unanswered_call']:.1f}% | "
                f"{_fmt(t.get('accuracy_with_call'), digits)} | {_fmt(t.get('accuracy_without_call'), digits)} |"
            )
    for meta in r.metadata.get("merged_from", [r.metadata]):
        lines += ["", *_metadata_lines(meta)]
    return lines


def _outcomes(m: BenchmarkMetrics) -> str:
    # e.g. "correct 12 · wrong 40 · no_think 3": a large no_think share means the think gate does not fit the model
    return " · ".join(f"{k} {v}" for k, v in (m.outcomes or {}).items())


def _metadata_lines(meta: Mapping[str, Any]) -> list[str]:
    if not meta:
        return []
    tpl = meta.get("template", {})
    grader = meta.get("grader", {})
    sampling = meta.get("sampling", {})
    versions = meta.get("versions", {})
    data = ", ".join(pathlib.Path(d.get("path", "?")).name for d in meta.get("data", []))
    engines = ""
    if meta.get("data_parallel_size", 1) and meta.get("data_parallel_size", 1) > 1:
        engines = f" · {meta['data_parallel_size']} replicas"
    if meta.get("tensor_parallel_size"):
        engines += f" · tensor parallel {meta['tensor_parallel_size']}"
    rule = grader.get("grading") or "reward"  # results written before the paper rule existed used the reward's
    gate = f" (think gate: {grader.get('think_gate')})" if rule == "reward" else ""
    return [
        f"- model: `{meta.get('model')}` · backend: {meta.get('backend')}{engines} · data: {data or '—'}",
        f"- template: {tpl.get('kind')} (chat template sha {tpl.get('chat_template_sha')}) · system prompt: "
        f"{tpl.get('system_prompt_mode')}",
        f"- grader: `{grader.get('spec')}` · grading: {rule}{gate} · math-verify {grader.get('math_verify')}",
        f"- sampling: T={sampling.get('temperature')} · top-p={sampling.get('top_p')} · max new tokens "
        f"{sampling.get('max_new_tokens')} · samples/row {sampling.get('n_samples') or 'protocol'} · seed "
        f"{sampling.get('seed')}",
        "- versions: " + " · ".join(f"{k} {v}" for k, v in versions.items()),
    ] + _agent_lines(meta.get("agent"))


def _agent_lines(agent: Mapping[str, Any] | None) -> list[str]:
    """A multi-turn run's settings: the tool file, the parser, the turn and length limits."""
    if not agent:
        return []
    shown = " · ".join(f"{k} {v}" for k, v in agent.items() if k != "factory")
    return [f"- with tools (`{agent.get('factory')}`): {shown}"]


def write_table_csv(
    results: Sequence[EvalResults], path: str | os.PathLike, reference: str | Sequence[TableRow] | None = "table1"
) -> pathlib.Path:
    """The Markdown table's rows as CSV (one row per model, the paper's columns)."""
    path = pathlib.Path(path)
    rows = table_rows(results, reference)
    columns = table_columns(rows)
    with path.open("w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(["model", "source", *(_header(k) for k in columns), "partial_averages", "caveats"])
        for row in rows:
            w.writerow(
                [row.name, "paper" if row.reference else "ours"]
                + ["" if row.values.get(k) is None else row.values[k] for k in columns]
                # the averages taken over fewer benchmarks than the paper's ("OOD Avg"), and the run's caveats
                + [";".join(HEADERS[k] for k in COLUMN_KEYS if k in row.partial), "; ".join(row.caveats)]
            )
    return path


def write_results_csv(results: EvalResults, path: str | os.PathLike) -> pathlib.Path:
    """Long-form CSV: one line per benchmark (all metrics) and one per macro average."""
    path = pathlib.Path(path)
    ks = sorted({k for m in results.benchmarks.values() for k in m.pass_at_k})
    with path.open("w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(
            ["label", "benchmark", "column", "metric", "num_questions", "num_samples", "samples_per_question", "score"]
            + ["pass@1" if k == 1 else f"pass@{k}" for k in ks]
            + ["truncated_fraction", "outcomes"]
        )
        for b, m in sorted(results.benchmarks.items(), key=_column_order):
            w.writerow(
                [results.label, b, HEADERS.get(b, b), m.metric_name, m.num_questions, m.num_samples]
                + [m.samples_per_question, m.score]
                + [m.pass_at_k.get(k, "") for k in ks]
                + ["" if m.truncated_fraction is None else m.truncated_fraction, _outcomes(m)]
            )
        for name, avg in results.averages().items():
            metric = "macro avg" + ("" if avg.complete else f" ({len(avg.columns)}/{len(AVERAGES[name])})")
            w.writerow(
                [results.label, name, HEADERS[name], metric, "", "", "", "" if avg.value is None else avg.value]
                + [""] * (len(ks) + 2)
            )
    return path


# --- chart ---------------------------------------------------------------------------------------------------


MAX_REFERENCE_ROWS_PER_PANEL = 4


def chart_title(results: Sequence[EvalResults]) -> str:
    """The chart's title: the metric each measured benchmark was scored with (avg@k: the mean over k samples per
    question; pass@1: one sample), as the runs measured it, e.g. "Evaluation (avg@32 on AIME24, AIME25, AMC; pass@1
    on the others)"."""
    by_metric: dict[str, list[str]] = {}
    for r in merge_by_label(results):
        for name, m in r.benchmarks.items():
            names = by_metric.setdefault(m.metric_name, [])
            if _header(name) not in names:
                names.append(_header(name))
    if not by_metric:
        return "Evaluation"
    groups = sorted(by_metric.items(), key=lambda kv: -len(kv[1]))
    if len(groups) == 1:
        metric, names = groups[0]
        return f"Evaluation ({metric} on {', '.join(names)})" if len(names) <= 6 else f"Evaluation ({metric})"
    (most, _), rest = groups[0], groups[1:]
    parts = [f"{metric} on {', '.join(names)}" for metric, names in rest]
    return f"Evaluation ({'; '.join(parts)}; {most} on the others)"


def reference_panels(rows: Sequence[TableRow], max_rows: int = MAX_REFERENCE_ROWS_PER_PANEL) -> list[list[TableRow]]:
    """The reference rows in chart panels of at most ``max_rows`` rows: a backbone's rows stay together (Table 5
    lists "— on-policy" and "— ExGRPO" under their backbone's row), consecutive single rows are packed."""
    groups: list[list[TableRow]] = []
    for row in rows:
        if row.name.startswith("—") and groups:
            groups[-1].append(row)
        else:
            groups.append([row])
    panels: list[list[TableRow]] = []
    packing = False  # whether the last panel holds single rows packed together
    for group in groups:
        if len(group) == 1 and packing and len(panels[-1]) < max_rows:
            panels[-1].extend(group)
            continue
        chunks = [group[i : i + max_rows] for i in range(0, len(group), max_rows)]
        panels.extend(chunks)
        packing = len(group) == 1
    return panels


def _legend_names(rows: Sequence[TableRow]) -> list[str]:
    # Table 5 names runs "— on-policy" under their backbone's row; the legend needs the backbone.
    names, backbone = [], ""
    for row in rows:
        if row.reference and row.name.startswith("—"):
            names.append(f"{backbone} {row.name}")
        else:
            backbone = row.name if row.reference else backbone
            names.append(row.display_name)
    return names


def plot_bar_chart(
    results: Sequence[EvalResults],
    path: str | os.PathLike,
    reference: str | Sequence[TableRow] | None = "table1",
    *,
    title: str | None = None,
    max_reference_rows: int = MAX_REFERENCE_ROWS_PER_PANEL,
) -> pathlib.Path:
    """Grouped bars per paper column (benchmarks and averages): our rows hatched and labelled with their values,
    reference rows plain. The reference rows are split over stacked panels of at most ``max_reference_rows``
    each (our rows repeat in every panel), so a group never holds more than ``max_reference_rows`` + ours bars
    and the chart keeps a readable width. A partial average is labelled †, a run off the protocol ‡ (both
    explained under the chart)."""
    import matplotlib

    matplotlib.use("Agg")  # no display on clusters or CI
    import matplotlib.pyplot as plt

    all_rows = table_rows(results, reference)
    ours = [r for r in all_rows if not r.reference]
    refs = [r for r in all_rows if r.reference]
    # what our rows measured (benchmarks outside the paper's columns included); all the paper's columns without ours
    measured = [k for k in table_columns(all_rows) if any(r.values.get(k) is not None for r in ours)]
    cols = measured or list(COLUMN_KEYS)
    panels = reference_panels(refs, max_reference_rows) if refs else [[]]
    bars = max(len(p) for p in panels) + len(ours)
    width = 0.8 / max(bars, 1)
    plot_w = min(11.0, max(6.0, len(cols) * (0.45 + 0.16 * bars)))
    notes = []
    if any(k not in HEADERS for k in cols):
        notes += columns_note(all_rows, reference)
    if any(r.partial for r in ours):
        notes.append(PARTIAL_NOTE)
    notes += [f"{CAVEAT_MARK} {r.name}: " + "; ".join(r.caveats) for r in ours if r.caveats]
    # one line per note as long as it fits the figure's width (about 15 characters per inch at font size 7)
    notes = [line for note in notes for line in textwrap.wrap(note, width=int((plot_w + 3.6) * 15))]
    fig_h = 2.9 * len(panels) + 0.7 + 0.22 * len(notes)
    fig, axes = plt.subplots(len(panels), 1, figsize=(plot_w + 3.6, fig_h), squeeze=False)
    ref_cmap, ours_cmap = plt.get_cmap("tab10"), plt.get_cmap("Dark2")
    for ax, panel in zip(axes[:, 0], panels):
        rows = [*panel, *ours]
        names = _legend_names(rows)
        for i, (row, name) in enumerate(zip(rows, names)):
            xs = [j + (i - (len(rows) - 1) / 2) * width for j in range(len(cols))]
            pts = [(x, k, row.values.get(k)) for x, k in zip(xs, cols) if row.values.get(k) is not None]
            if not pts:
                continue
            if row.reference:
                style = dict(color=ref_cmap(i % 10), alpha=0.55, edgecolor="grey", linewidth=0.4, label=name)
            else:
                # Ours: strong colours, hatched, with the value on the bar (even a 0.0 must be visible).
                n = ours.index(row)
                style = dict(color=ours_cmap(n % 8), edgecolor="black", linewidth=0.6, hatch="//", label=name)
            drawn = ax.bar([p[0] for p in pts], [p[2] for p in pts], width=width, **style)
            if not row.reference:
                labels = [f"{v:.1f}" + (PARTIAL_MARK if k in row.partial else "") for _, k, v in pts]
                ax.bar_label(drawn, labels=labels, fontsize=6, rotation=90, padding=2)
        ax.set_xticks(range(len(cols)))
        ax.set_xticklabels([_header(k) for k in cols], rotation=30, ha="right", fontsize=8)
        for j, k in enumerate(cols):
            if k in AVERAGES:
                ax.axvline(j - 0.5, color="grey", linewidth=0.6, linestyle=":")
        ax.set_ylabel("accuracy (%)", fontsize=8)
        # Head room above 100 for the value labels, so a bar at 100% never reaches the panel above or the title.
        ax.set_ylim(0, 118)
        ax.set_yticks(range(0, 101, 20))
        ax.tick_params(axis="y", labelsize=7)
        if ax.get_legend_handles_labels()[0]:  # a panel with nothing measured in its columns draws no legend
            ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    fig.suptitle(title or chart_title(results), fontsize=10, y=1 - 0.1 / fig_h, va="top")
    bottom = (0.12 + 0.22 * len(notes)) / fig_h
    for i, note in enumerate(notes):
        fig.text(0.01, bottom - (0.1 + 0.22 * (i + 1)) / fig_h, note, fontsize=7, ha="left")
    fig.tight_layout(rect=(0, bottom, 1, 1 - 0.4 / fig_h))
    path = pathlib.Path(path)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def write_report(
    results: EvalResults | Sequence[EvalResults],
    out_dir: str | os.PathLike,
    reference: str | Sequence[TableRow] | None = "table1",
    *,
    stem: str = "results",
    plot: bool = True,
) -> dict[str, pathlib.Path]:
    """Write ``<stem>.json`` (single result only), ``<stem>.csv``, ``table.md``, ``table.csv`` and ``table.png``."""
    out = pathlib.Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    many = [results] if isinstance(results, EvalResults) else list(results)
    paths: dict[str, pathlib.Path] = {}
    if isinstance(results, EvalResults):
        paths["json"] = save_results(results, out / f"{stem}.json")
        paths["csv"] = write_results_csv(results, out / f"{stem}.csv")
    paths["markdown"] = out / "table.md"
    paths["markdown"].write_text(render_markdown(many, reference), encoding="utf-8")
    paths["table_csv"] = write_table_csv(many, out / "table.csv", reference)
    if plot:
        paths["png"] = plot_bar_chart(many, out / "table.png", reference)
    return paths


def now_iso() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
