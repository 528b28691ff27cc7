"""Instruction-following results beside the paper's Table 2 (the reward-model run, docs/algorithm.md §13).

IFEval's instruction checks are lm-evaluation-harness's ``ifeval`` task (the reference implementation of the
benchmark's checkers); ``scripts/eval/eval_ifeval.sh`` runs it on a merged checkpoint. This module reads the results
file that lm-eval writes and prints the paper's Table 2 rows with this run's IFEval score beside them (ArenaHardV2
and IFBench need their own harnesses and judges: docs/evaluation.md, "Instruction following").

    python -m exgrpo.eval.instruction_following OUT_DIR_OR_RESULTS_JSON [--label NAME] [--metric KEY]

The paper does not say which of IFEval's four accuracies its column is; the default here is the prompt-level
strict accuracy (lm-eval's first metric: a prompt counts when every one of its instructions is followed, checked
strictly), and all four are printed.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "IFEVAL_METRICS",
    "TABLE2",
    "Table2Row",
    "parse_table2_markdown",
    "read_ifeval_results",
    "render_table2",
]

TABLE2_COLUMNS = ("ArenaHardV2", "IFEval", "IFBench", "Avg")
#: lm-eval's ifeval metrics, the default (the column printed beside the paper's) first.
IFEVAL_METRICS = ("prompt_level_strict_acc", "inst_level_strict_acc", "prompt_level_loose_acc", "inst_level_loose_acc")


@dataclass(frozen=True)
class Table2Row:
    method: str
    values: dict[str, float | None]


#: The paper's Table 2 (arXiv 2510.02245): Qwen2.5-7B base, ~7k WildChat-IF prompts, Skywork-Reward-Llama-3.1-8B-v0.2,
#: 2 epochs. docs/paper_results.md holds the same rows (a test checks that they agree).
TABLE2 = (
    Table2Row("GRPO", {"ArenaHardV2": 15.1, "IFEval": 26.1, "IFBench": 18.7, "Avg": 20.0}),
    Table2Row("ExGRPO", {"ArenaHardV2": 16.4, "IFEval": 27.9, "IFBench": 20.7, "Avg": 21.7}),
)


def parse_table2_markdown(text: str) -> list[Table2Row]:
    """The rows of the "## Table 2" section of docs/paper_results.md (header: Method and :data:`TABLE2_COLUMNS`)."""
    rows: list[Table2Row] = []
    inside = header = False
    for line in text.splitlines():
        if line.startswith("## "):
            inside, header = bool(re.match(r"^##\s+Table\s+2\b", line)), False
            continue
        if not inside or not line.startswith("|"):
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if not header:
            header = cells == ["Method", *TABLE2_COLUMNS]
            continue
        if set("".join(cells)) <= set("-: "):
            continue
        rows.append(Table2Row(cells[0], {c: float(v) for c, v in zip(TABLE2_COLUMNS, cells[1:], strict=True)}))
    return rows


def _results_file(path: Path) -> Path:
    """``path`` itself, or the newest ``results_*.json`` lm-eval wrote under the directory ``path``."""
    if path.is_file():
        return path
    if not path.is_dir():
        raise FileNotFoundError(f"{path}: neither an lm-eval results file nor a directory holding one")
    found = sorted(path.rglob("results_*.json"), key=lambda p: p.stat().st_mtime)
    if not found:
        raise FileNotFoundError(f"{path}: no results_*.json (lm-eval's --output_path) under it")
    return found[-1]


def read_ifeval_results(path: str | Path) -> dict[str, float]:
    """IFEval's four accuracies (in %) from lm-eval's results file (or the newest one under a directory).

    lm-eval names them ``<metric>,<filter>`` (``prompt_level_strict_acc,none``); a file without the ifeval task is
    a ValueError naming the file.
    """
    file = _results_file(Path(path))
    try:
        data = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise ValueError(f"{file}: not a readable lm-eval results file ({e})") from e
    task = (data.get("results") or {}).get("ifeval") if isinstance(data, dict) else None
    if not isinstance(task, dict):
        raise ValueError(f"{file}: holds no 'ifeval' results (tasks: {sorted((data or {}).get('results') or {})})")
    out = {}
    for metric in IFEVAL_METRICS:
        value = next((v for k, v in task.items() if k.split(",")[0] == metric), None)
        if isinstance(value, (int, float)):
            out[metric] = 100.0 * float(value)
    if IFEVAL_METRICS[0] not in out:
        raise ValueError(f"{file}: the ifeval results lack {IFEVAL_METRICS[0]}")
    return out


def render_table2(scores: dict[str, float], label: str, metric: str = IFEVAL_METRICS[0]) -> str:
    """Markdown: the paper's Table 2 rows, then this run's row (its IFEval column = ``metric``; the columns it
    did not measure are "—"), then all four IFEval accuracies."""
    if metric not in scores:
        raise ValueError(f"metric {metric!r} is not in the results; have {sorted(scores)}")

    def cell(v: float | None) -> str:
        return "—" if v is None else f"{v:.1f}"

    lines = ["| Method | " + " | ".join(TABLE2_COLUMNS) + " |", "|---" * (len(TABLE2_COLUMNS) + 1) + "|"]
    for row in TABLE2:
        lines.append(f"| {row.method} (paper) | " + " | ".join(cell(row.values[c]) for c in TABLE2_COLUMNS) + " |")
    ours = {"ArenaHardV2": None, "IFEval": scores[metric], "IFBench": None, "Avg": None}
    lines.append(f"| **{label}** | " + " | ".join(cell(ours[c]) for c in TABLE2_COLUMNS) + " |")
    lines.append("")
    lines.append(f"IFEval ({metric} in the table): " + ", ".join(f"{k} {v:.1f}" for k, v in scores.items()))
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m exgrpo.eval.instruction_following", description=__doc__.split("\n\n")[0]
    )
    p.add_argument("results", help="lm-eval's results_*.json, or the --output_path directory holding it")
    p.add_argument("--label", default="mine (ours)", help="name of this run's row")
    p.add_argument("--metric", default=IFEVAL_METRICS[0], choices=IFEVAL_METRICS, help="IFEval column of the row")
    args = p.parse_args(argv)
    try:
        scores = read_ifeval_results(args.results)
    except (FileNotFoundError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    sys.stdout.write(render_table2(scores, args.label, args.metric))
    return 0


if __name__ == "__main__":
    sys.exit(main())
