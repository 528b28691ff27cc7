"""Bad input to the preprocessing commands: exit status 2 and a message naming the file, never a traceback;
``data_preprocess.benchmarks`` writes all of its files or none."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from data_preprocess import benchmarks, openr1_math
from data_preprocess.common import DuplicateQuestionError, PreprocessError, read_rows, table_columns
from tests.helpers.jsonl import write_jsonl

REPO = Path(__file__).resolve().parents[2]


def _bad_inputs(tmp_path: Path) -> dict[str, Path]:
    good = tmp_path / "good.parquet"
    pq.write_table(pa.table({"problem": ["P"] * 50, "answer": ["1"] * 50}), good)
    data = good.read_bytes()
    cases = {
        "empty parquet": b"",
        "text named .parquet": b"problem,answer\nP,1\n",
        "truncated parquet": data[: len(data) // 2],
        "parquet without its footer": data[:-8],
    }
    out = {}
    for i, (name, content) in enumerate(cases.items()):
        out[name] = tmp_path / f"bad{i}.parquet"
        out[name].write_bytes(content)
    out["empty json"] = tmp_path / "empty.json"
    out["empty json"].write_bytes(b"")
    out["broken json"] = tmp_path / "broken.json"
    out["broken json"].write_text('[{"problem": "P", ')
    out["latin-1 jsonl"] = tmp_path / "latin.jsonl"
    out["latin-1 jsonl"].write_bytes(b'{"problem": "caf\xe9", "answer": "1"}\n')
    out["directory named .parquet"] = tmp_path / "dir.parquet"
    out["directory named .parquet"].mkdir()
    return out


def test_unreadable_inputs_raise_preprocess_error_naming_the_file(tmp_path):
    for name, path in _bad_inputs(tmp_path).items():
        with pytest.raises(PreprocessError) as info:
            table_columns(path)
            read_rows(path)
        assert str(path) in str(info.value), f"{name}: {info.value}"
    with pytest.raises(PreprocessError, match=r"bad0\.parquet: the file is empty \(0 bytes\)"):
        table_columns(tmp_path / "bad0.parquet")


@pytest.mark.parametrize("command", ["openr1_math", "benchmarks"])
def test_cli_exit_status_2_and_a_message_naming_the_file(tmp_path, command):
    """The commands as users run them: ``python -m data_preprocess.<command>``, in a fresh interpreter."""
    bad = tmp_path / "zero.parquet"
    bad.write_bytes(b"")
    if command == "openr1_math":
        argv = ["--input", str(bad), "--output", str(tmp_path / "o.parquet")]
    else:
        argv = ["--output-dir", str(tmp_path / "out"), "--benchmarks", "amc", "--input", f"amc={bad}"]
    proc = subprocess.run(
        [sys.executable, "-m", f"data_preprocess.{command}", *argv, "--no-progress"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert f"error: {bad}: the file is empty (0 bytes)" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "o.parquet").exists() and not (tmp_path / "out").exists()


def run_benchmarks(tmp_path: Path, *argv: str) -> list:
    args = benchmarks.build_parser().parse_args(["--output-dir", str(tmp_path / "out"), *argv, "--no-progress"])
    return benchmarks.run(args)


def test_benchmarks_write_all_or_nothing(tmp_path):
    aime = write_jsonl(tmp_path / "aime.jsonl", [{"problem": "P0", "answer": "204"}])
    bad_amc = write_jsonl(tmp_path / "amc.jsonl", [{"problem": "A0", "solution": "no answer column"}])
    argv = ["--benchmarks", "aime24,amc", "--input", f"aime24={aime}", "--combined", "all.parquet"]
    with pytest.raises(PreprocessError, match="amc.jsonl"):
        run_benchmarks(tmp_path, *argv, "--input", f"amc={bad_amc}")
    out = tmp_path / "out"
    assert not out.exists() or list(out.iterdir()) == [], "a failed run left files behind"
    # earlier outputs of a successful run are not replaced by a failed one either
    good_amc = write_jsonl(tmp_path / "amc_ok.jsonl", [{"problem": "A0", "answer": "7"}])
    run_benchmarks(tmp_path, *argv, "--input", f"amc={good_amc}")
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    assert sorted(before) == ["aime24.parquet", "all.parquet", "amc.parquet"]
    with pytest.raises(PreprocessError):
        run_benchmarks(tmp_path, *argv, "--input", f"amc={bad_amc}", "--repeat", "aime24=2")
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before


def test_benchmarks_output_name_clash_is_an_error_before_writing(tmp_path):
    aime = write_jsonl(tmp_path / "aime.jsonl", [{"problem": "P0", "answer": "204"}])
    with pytest.raises(PreprocessError, match="same file"):
        run_benchmarks(tmp_path, "--benchmarks", "aime24", "--input", f"aime24={aime}", "--combined", "aime24.parquet")
    with pytest.raises(PreprocessError, match="--combined must name a .parquet file"):
        run_benchmarks(tmp_path, "--benchmarks", "aime24", "--input", f"aime24={aime}", "--combined", "all.csv")
    assert not (tmp_path / "out").exists() or list((tmp_path / "out").iterdir()) == []


@pytest.mark.parametrize("command", ["openr1_math", "benchmarks"])
def test_duplicate_error_suggests_a_flag_the_command_accepts(tmp_path, command):
    rows = [{"problem": "P", "answer": "1"}, {"problem": " P ", "answer": "1"}, {"problem": "Q", "answer": "2"}]
    src = write_jsonl(tmp_path / "d.jsonl", rows)
    if command == "openr1_math":
        base = ["--input", str(src), "--output", str(tmp_path / "o.parquet"), "--no-progress"]
        parser, run = openr1_math.build_parser(), openr1_math.run
    else:
        base = ["--output-dir", str(tmp_path / "out"), "--benchmarks", "amc", "--input", f"amc={src}", "--no-progress"]
        parser, run = benchmarks.build_parser(), benchmarks.run
    with pytest.raises(DuplicateQuestionError) as info:
        run(parser.parse_args(base))
    flags = [word.rstrip(".,") for word in str(info.value).split() if word.startswith("--")]
    assert flags, str(info.value)
    result = run(parser.parse_args([*base, *flags]))  # the suggested flag exists and does what it says
    reports = result if isinstance(result, list) else [result]
    assert reports[0].counts["dropped: duplicate question"] == 1
    if command == "benchmarks":
        got = pq.read_table(tmp_path / "out" / "amc.parquet").to_pylist()
        assert [r["prompt"][-1]["content"] for r in got] == ["P", "Q"]
        assert [r["extra_info"]["index"] for r in got] == [0, 1]
