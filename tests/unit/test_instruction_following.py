"""exgrpo/eval/instruction_following.py: the paper's Table 2 rows (code and docs/paper_results.md agree), reading
lm-eval's ifeval results, the table beside the paper's, and the error for a file without IFEval."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from exgrpo.eval.instruction_following import (
    IFEVAL_METRICS,
    TABLE2,
    main,
    parse_table2_markdown,
    read_ifeval_results,
    render_table2,
)
from exgrpo.eval.report import parse_reference_markdown

PAPER_RESULTS = Path(__file__).resolve().parents[2] / "docs" / "paper_results.md"


def test_table2_rows_are_consistent_and_match_paper_results_md():
    for row in TABLE2:
        mean = sum(row.values[c] for c in ("ArenaHardV2", "IFEval", "IFBench")) / 3
        assert abs(mean - row.values["Avg"]) <= 0.05 + 1e-9, row
    parsed = parse_table2_markdown(PAPER_RESULTS.read_text(encoding="utf-8"))
    assert [(r.method, r.values) for r in parsed] == [(r.method, r.values) for r in TABLE2]
    # the math tables' parser leaves the Table 2 section alone (its columns are not the math benchmarks')
    assert set(parse_reference_markdown(PAPER_RESULTS.read_text(encoding="utf-8"))) == {"table1", "table5"}


def _lm_eval_results(directory: Path, **metrics: float) -> Path:
    sub = directory / "merged_hf"
    sub.mkdir(parents=True)
    task = {"alias": "ifeval"}
    for name, value in metrics.items():
        task[f"{name},none"] = value
        task[f"{name}_stderr,none"] = "N/A"
    path = sub / "results_2026-01-01T00-00-00.json"
    path.write_text(json.dumps({"results": {"ifeval": task}, "versions": {"ifeval": 4.0}, "lm_eval_version": "0.4.13"}))
    return path


def test_reads_lm_evals_results_and_prints_the_table(tmp_path, capsys):
    values = dict(zip(IFEVAL_METRICS, (0.281, 0.395, 0.301, 0.412), strict=True))
    path = _lm_eval_results(tmp_path, **values)
    scores = read_ifeval_results(tmp_path)  # the directory: the newest results file under it
    assert scores == pytest.approx({k: 100 * v for k, v in values.items()}) and read_ifeval_results(path) == scores
    table = render_table2(scores, "exgrpo step 116")
    lines = [ln for ln in table.splitlines() if ln.startswith("| ")]
    assert lines[1] == "| GRPO (paper) | 15.1 | 26.1 | 18.7 | 20.0 |"
    assert lines[3] == "| **exgrpo step 116** | — | 28.1 | — | — |"
    assert "inst_level_loose_acc 41.2" in table
    assert "| **x** | — | 39.5 | — | — |" in render_table2(scores, "x", "inst_level_strict_acc")
    assert main([str(tmp_path), "--label", "x"]) == 0 and "| **x** | — | 28.1" in capsys.readouterr().out


def test_a_file_without_ifeval_is_an_error_naming_it(tmp_path, capsys):
    bad = tmp_path / "results_x.json"
    bad.write_text(json.dumps({"results": {"gsm8k": {"exact_match,none": 0.5}}}))
    with pytest.raises(ValueError, match=r"results_x.json: holds no 'ifeval' results \(tasks: \['gsm8k'\]\)"):
        read_ifeval_results(bad)
    assert main([str(tmp_path / "missing")]) == 2 and "neither an lm-eval results file" in capsys.readouterr().err
