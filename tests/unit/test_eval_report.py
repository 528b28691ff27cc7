"""Paper-style reports: column order, macro averages, results round trip, reference rows, CSV and PNG."""

import csv
import json
import pathlib

import pytest

from exgrpo.eval.cli import main as cli_main
from exgrpo.eval.metrics import ID_BENCHMARKS, OOD_BENCHMARKS, compute_benchmark_metrics
from exgrpo.eval.report import (
    COLUMN_KEYS,
    HEADERS,
    PARTIAL_MARK,
    REFERENCE_TABLES,
    EvalResults,
    load_results,
    merge_by_label,
    parse_reference_markdown,
    plot_bar_chart,
    reference_panels,
    render_markdown,
    save_results,
    write_report,
    write_table_csv,
)

PAPER_RESULTS = pathlib.Path(__file__).resolve().parents[2] / "docs" / "paper_results.md"
#: the developers' copy of the paper's tables, outside the repository (absent in a user's clone)
SHARED_PAPER_RESULTS = pathlib.Path(__file__).resolve().parents[3] / "shared" / "docs" / "PAPER_RESULTS.md"


def _metrics(bench, correct_per_question, k):
    groups = {f"{bench}-{i}": [1.0] * c + [0.0] * (k - c) for i, c in enumerate(correct_per_question)}
    return compute_benchmark_metrics(bench, groups)


def _results(label="mine", benches=ID_BENCHMARKS + OOD_BENCHMARKS, meta=None):
    benchmarks = {}
    for j, b in enumerate(benches):
        k = 4 if b in ("aime", "aime25", "amc") else 1
        # distinct, non-round scores per column so a wrong column mapping or mean shows up
        benchmarks[b] = _metrics(b, [(i * (j + 1)) % (k + 1) for i in range(7 + j)], k)
    return EvalResults(label, benchmarks, meta or {"model": "/ckpt/" + label, "grader": {"think_gate": True}})


def _table_cells(markdown, row_name):
    for line in markdown.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if cells and cells[0] == row_name:
            return dict(zip(COLUMN_KEYS, cells[1:]))
    raise AssertionError(f"row {row_name!r} not in table")


def test_table_is_in_paper_column_order_and_averages_are_column_means():
    r = _results()
    md = render_markdown([r], "table1")
    header = md.splitlines()[0]
    assert header == (
        "| Model | AIME24 | AIME25 | AMC | MATH-500 | Minerva | Olympiad | ID Avg | "
        "ARC-c | GPQA* | MMLU-Pro | OOD Avg |"
    )
    row = r.table_row()
    for avg, members in (("id_avg", ID_BENCHMARKS), ("ood_avg", OOD_BENCHMARKS)):
        assert row.values[avg] == pytest.approx(sum(row.values[b] for b in members) / len(members))
        assert row.values[avg] == pytest.approx(sum(r.benchmarks[b].score for b in members) / len(members))
    cells = _table_cells(md, "**mine (ours)**")
    for key in COLUMN_KEYS:
        assert cells[key] == f"{row.values[key]:.1f}"
    # the printed averages are the means of the printed columns' values, not of something else
    assert float(cells["id_avg"]) == pytest.approx(
        sum(r.benchmarks[b].score for b in ID_BENCHMARKS) / len(ID_BENCHMARKS), abs=0.05
    )


def test_partial_averages_are_marked():
    r = _results(benches=("aime", "math", "arc_c", "gpqa"))
    md = render_markdown([r], "none")
    cells = _table_cells(md, "**mine (ours)**")
    assert cells["minerva"] == "—" and cells["mmlu_pro"] == "—"
    assert cells["ood_avg"].endswith(PARTIAL_MARK) and cells["id_avg"].endswith(PARTIAL_MARK)
    expected = (r.benchmarks["arc_c"].score + r.benchmarks["gpqa"].score) / 2
    assert float(cells["ood_avg"].rstrip(PARTIAL_MARK)) == pytest.approx(expected, abs=0.05)


def test_results_file_reads_back_to_the_same_table(tmp_path):
    r = _results(meta={"model": "/m", "sampling": {"temperature": 0.6, "seed": 3}, "grader": {"spec": "x"}})
    path = save_results(r, tmp_path / "results.json")
    back = load_results(path)
    assert back.to_dict() == r.to_dict()
    for ref in ("table1", "table5", "none"):
        assert render_markdown([back], ref) == render_markdown([r], ref)
    data = json.loads(path.read_text())
    assert data["averages"]["id_avg"]["complete"] is True
    assert data["metadata"]["sampling"]["seed"] == 3


def test_load_results_errors_name_the_problem(tmp_path):
    p = tmp_path / "r.json"
    p.write_text(json.dumps({"schema_version": 99, "label": "x", "benchmarks": {}}))
    with pytest.raises(ValueError, match="schema_version"):
        load_results(p)
    with pytest.raises(FileNotFoundError, match="nope.json"):
        load_results(tmp_path / "nope.json")


def test_reference_rows_are_consistent_and_match_paper_results_md():
    for name, rows in REFERENCE_TABLES.items():
        assert len(rows) == {"table1": 7, "table5": 12}[name]
        for row in rows:
            # the transcribed averages agree with the transcribed columns (paper values are rounded to 0.1)
            for avg, members in (("id_avg", ID_BENCHMARKS), ("ood_avg", OOD_BENCHMARKS)):
                mean = sum(row.values[b] for b in members) / len(members)
                assert abs(mean - row.values[avg]) <= 0.1, (name, row.name, avg)
    assert REFERENCE_TABLES["table1"][3].name == "ExGRPO" and REFERENCE_TABLES["table1"][3].values["id_avg"] == 48.3
    # the page in the repository holds the same rows, and so does the developers' copy when it is there
    for path in (PAPER_RESULTS, SHARED_PAPER_RESULTS):
        if path is SHARED_PAPER_RESULTS and not path.is_file():
            continue
        parsed = parse_reference_markdown(path.read_text(encoding="utf-8"))
        assert set(parsed) == {"table1", "table5"}, path
        for name in parsed:
            assert [(r.name, r.values) for r in parsed[name]] == [(r.name, r.values) for r in REFERENCE_TABLES[name]]


def test_reference_rows_are_printed_before_ours():
    md = render_markdown([_results()], "table1")
    lines = [ln for ln in md.splitlines() if ln.startswith("| ")][1:]
    names = [ln.split("|")[1].strip() for ln in lines[: len(REFERENCE_TABLES["table1"]) + 1]]
    assert names == [r.name for r in REFERENCE_TABLES["table1"]] + ["**mine (ours)**"]
    assert _table_cells(md, "ExGRPO")["ood_avg"] == "58.3"
    with pytest.raises(ValueError, match="table9"):
        render_markdown([_results()], "table9")


def test_id_and_ood_runs_of_one_model_merge_into_one_row():
    id_part = _results("ckpt", ID_BENCHMARKS, {"data": [{"path": "test_id.parquet"}]})
    ood_part = _results("ckpt", OOD_BENCHMARKS, {"data": [{"path": "arc_c.parquet"}]})
    merged = merge_by_label([id_part, ood_part, _results("other", ("math",))])
    assert [m.label for m in merged] == ["ckpt", "other"]
    assert set(merged[0].benchmarks) == set(ID_BENCHMARKS + OOD_BENCHMARKS)
    assert len(merged[0].metadata["merged_from"]) == 2
    assert not merged[0].table_row().partial
    with pytest.raises(ValueError, match="appear twice"):
        merge_by_label([id_part, id_part])


def test_csv_png_and_report_files(tmp_path):
    r = _results()
    paths = write_report(r, tmp_path, "table1")
    assert set(paths) == {"json", "csv", "markdown", "table_csv", "png"}
    assert paths["png"].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with paths["csv"].open() as f:
        rows = list(csv.DictReader(f))
    by_bench = {row["benchmark"]: row for row in rows}
    assert float(by_bench["aime"]["score"]) == pytest.approx(r.benchmarks["aime"].score)
    assert by_bench["aime"]["metric"] == "avg@4" and by_bench["math"]["metric"] == "pass@1"
    assert float(by_bench["id_avg"]["score"]) == pytest.approx(r.table_row().values["id_avg"])
    with paths["table_csv"].open() as f:
        table = list(csv.DictReader(f))
    assert [t["source"] for t in table] == ["paper"] * 7 + ["ours"]
    assert float(table[-1][HEADERS["ood_avg"]]) == pytest.approx(r.table_row().values["ood_avg"])
    assert paths["markdown"].read_text() == render_markdown([r], "table1")
    # a chart of several of our rows and no reference also renders
    out = plot_bar_chart([r, _results("second")], tmp_path / "two.png", reference="none")
    assert out.stat().st_size > 1000
    write_table_csv([r], tmp_path / "t.csv", "none")
    assert len((tmp_path / "t.csv").read_text().splitlines()) == 2


def test_report_command_prints_the_same_table(tmp_path, capsys):
    r = _results()
    path = save_results(r, tmp_path / "results.json")
    assert cli_main(["report", str(path), "--reference", "table5", "--out", str(tmp_path / "rep"), "--no-plot"]) == 0
    assert capsys.readouterr().out == render_markdown([r], "table5")
    assert (tmp_path / "rep" / "table.md").read_text() == render_markdown([r], "table5")


# --- labels, partial and caveat marks, chart size ------------------------------------------------------------


def test_a_label_that_already_says_ours_is_not_marked_twice(tmp_path):
    md = render_markdown([_results("ExGRPO (ours)"), _results("On-policy")], "none")
    assert "(ours) (ours)" not in md
    assert "| **ExGRPO (ours)** |" in md and "| **On-policy (ours)** |" in md


def test_table_csv_flags_partial_averages_and_caveats(tmp_path):
    sliced = _results(
        "sliced",
        benches=("aime", "math", "arc_c", "gpqa"),
        meta={"selection": {"max_questions_per_source": 2, "max_rows": None}, "sampling": {"n_samples": 4}},
    )
    full = _results("full")
    path = write_table_csv([sliced, full], tmp_path / "table.csv", "table1")
    with path.open() as f:
        rows = {r["model"]: r for r in csv.DictReader(f)}
    assert rows["sliced"]["partial_averages"] == "ID Avg;OOD Avg"
    assert rows["full"]["partial_averages"] == "" and rows["full"]["caveats"] == ""
    assert rows["ExGRPO"]["partial_averages"] == ""  # the paper's rows are complete
    assert rows["sliced"]["caveats"] == (
        "sliced: the first 2 question(s) of each benchmark; "
        "4 sample(s) per row for every benchmark (protocol: avg@32 on AIME/AMC)"
    )


def test_a_run_off_the_protocol_says_so():
    meta = {
        "selection": {"max_rows": 10},
        "sampling": {"temperature": 1.0, "top_p": 1.0, "max_new_tokens": 8192, "n_samples": None},
        "grader": {"grading": "reward"},
    }
    md = render_markdown([_results("cut", meta=meta), _results("whole")], "none", details=False)
    assert "| **cut (ours) ‡** |" in md and "| **whole (ours)** |" in md
    note = md.split("‡ not the full protocol:")[1]
    assert "- cut: sliced: the first 10 row(s); temperature=1.0 (protocol: 0.6)" in note
    assert "'reward' rule" in note and "whole" not in note
    # the ID and OOD parts of one model: the caveats of both parts
    id_part = _results("m", ID_BENCHMARKS, {"selection": {"max_rows": 5}})
    ood_part = _results("m", OOD_BENCHMARKS, {"sampling": {"max_new_tokens": 512}})
    row = merge_by_label([id_part, ood_part])[0].table_row()
    assert row.caveats == ("sliced: the first 5 row(s)", "max_new_tokens=512 (protocol: 8192)")


def test_reference_rows_are_split_into_panels_by_backbone():
    panels = reference_panels(REFERENCE_TABLES["table5"])
    assert [len(p) for p in panels] == [3, 3, 3, 3]
    assert [p[0].name for p in panels] == [
        "Qwen2.5-Math-1.5B base",
        "Qwen2.5-7B-Instruct",
        "Llama3.1-8B base",
        "Llama3.1-8B-Instruct",
    ]
    assert [len(p) for p in reference_panels(REFERENCE_TABLES["table1"])] == [4, 3]
    assert [len(p) for p in reference_panels(REFERENCE_TABLES["table1"], max_rows=2)] == [2, 2, 2, 1]


def test_the_chart_stays_readable_with_many_reference_rows(tmp_path):
    from PIL import Image

    one_at_100 = _results("ExGRPO (ours)", meta={"selection": {"max_questions_per_source": 2}})
    one_at_100.benchmarks["math"] = compute_benchmark_metrics("math", {"q": [1.0]})
    partial = _results("On-policy", benches=ID_BENCHMARKS + ("arc_c",))
    wide = Image.open(plot_bar_chart([one_at_100, partial], tmp_path / "t5.png", "table5"))
    # 12 reference rows + 2 of ours used to make one 3,192 px wide chart with 14 bars per column
    assert wide.width <= 1800 and wide.height > wide.width / 2  # four stacked panels instead
    alone = Image.open(plot_bar_chart([partial], tmp_path / "none.png", "none"))
    assert alone.width <= 1500
