"""The preprocessing commands check their paths before any work: a wrong ``--tokenizer``, an output that cannot be
written, an ``--input`` for a benchmark that is not built, an empty file: exit 2 and one line naming the path, never a
traceback, and never after the grading pass. Without a reachable Hub they say so once and read only the cache."""

from __future__ import annotations

import http.server
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from data_preprocess import benchmarks, hub, openr1_math
from data_preprocess.common import PreprocessError, table_columns
from tests.helpers.jsonl import write_jsonl
from tests.helpers.tokenizers import build_tiny_tokenizer

REPO = Path(__file__).resolve().parents[2]
#: a port nothing listens on: connections are refused at once
CLOSED_ENDPOINT = "http://127.0.0.1:9"


def _cli(module: str, *argv: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", f"data_preprocess.{module}", *argv, "--no-progress"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )


def _bad_tokenizers(tmp_path: Path) -> dict[str, tuple[str, str]]:
    (tmp_path / "empty_dir").mkdir()
    (tmp_path / "a_file").write_text("x")
    return {
        "missing": (str(tmp_path / "nonexistent"), "no such directory"),
        "no tokenizer files": (str(tmp_path / "empty_dir"), "no tokenizer in this directory"),
        "a file": (str(tmp_path / "a_file"), "not a directory"),
    }


@pytest.fixture
def grading_pass(monkeypatch) -> list[int]:
    """Records each call of the ground-truth grading pass (the minutes-long part on the real 46k rows)."""
    calls: list[int] = []

    def record(ground_truths, data_sources, progress):
        calls.append(len(ground_truths))
        return [True] * len(ground_truths)

    monkeypatch.setattr(openr1_math, "self_verifying", record)
    monkeypatch.setattr(benchmarks, "self_verifying", record)
    return calls


def test_a_wrong_tokenizer_stops_openr1_math_before_the_grading_pass(tmp_path, grading_pass):
    src = write_jsonl(tmp_path / "in.jsonl", [{"problem": "1+1?", "answer": "2"}])
    for name, (tok, expected) in _bad_tokenizers(tmp_path).items():
        args = openr1_math.build_parser().parse_args(
            ["--input", str(src), "--output", str(tmp_path / "o.parquet"), "--tokenizer", tok, "--no-progress"]
        )
        with pytest.raises(PreprocessError) as err:
            openr1_math.run(args)
        assert str(err.value).startswith(f"--tokenizer {tok}: {expected}"), name
    assert grading_pass == [] and not (tmp_path / "o.parquet").exists()
    # a good tokenizer goes through (and the pass runs)
    tok = build_tiny_tokenizer(tmp_path / "tok")
    args = openr1_math.build_parser().parse_args(
        ["--input", str(src), "--output", str(tmp_path / "o.parquet"), "--tokenizer", str(tok), "--no-progress"]
    )
    assert openr1_math.run(args).counts["kept"] == 1 and grading_pass == [1]


@pytest.mark.parametrize("module", ["openr1_math", "wildchat_if"])
def test_the_commands_name_a_wrong_tokenizer_without_a_traceback(tmp_path, module):
    row = {"problem": "1+1?", "answer": "2"} if module == "openr1_math" else {"instruction": "Say hi."}
    src = write_jsonl(tmp_path / "in.jsonl", [row])
    for name, (tok, expected) in _bad_tokenizers(tmp_path).items():
        proc = _cli(module, "--input", str(src), "--output", str(tmp_path / "o.parquet"), "--tokenizer", tok)
        assert proc.returncode == 2, (name, proc.stderr[-2000:])
        assert proc.stderr.startswith(f"error: --tokenizer {tok}: {expected}"), proc.stderr
        assert "Traceback" not in proc.stderr and len(proc.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("module", ["openr1_math", "wildchat_if"])
def test_an_output_that_cannot_be_written_is_named_before_any_work(tmp_path, module, grading_pass):
    row = {"problem": "1+1?", "answer": "2"} if module == "openr1_math" else {"instruction": "Say hi."}
    src = write_jsonl(tmp_path / "in.jsonl", [row])
    (tmp_path / "a_file").write_text("x")
    out = tmp_path / "a_file" / "sub" / "train.parquet"  # its directory cannot be made: a file is in the way
    proc = _cli(module, "--input", str(src), "--output", str(out))
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert proc.stderr.strip() == (
        f"error: --output {out}: cannot be written, {tmp_path / 'a_file'} is a file, not a directory"
    )
    if module == "wildchat_if":
        proc = _cli(module, "--input", str(src), "--output", str(tmp_path / "t.parquet"), "--val-output", str(out))
        assert proc.returncode == 2 and f"error: --val-output {out}: cannot be written" in proc.stderr
    else:  # in-process: the grading pass never started
        args = openr1_math.build_parser().parse_args(["--input", str(src), "--output", str(out), "--no-progress"])
        with pytest.raises(PreprocessError, match="cannot be written"):
            openr1_math.run(args)
        assert grading_pass == []


def test_benchmarks_check_the_output_dir_and_every_input_first(tmp_path, grading_pass):
    aime = write_jsonl(tmp_path / "aime.jsonl", [{"problem": "P0", "answer": "204"}])
    (tmp_path / "a_file").write_text("x")
    proc = _cli(
        "benchmarks", "--output-dir", str(tmp_path / "a_file"), "--benchmarks", "aime24", "--input", f"aime24={aime}"
    )
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert f"error: --output-dir {tmp_path / 'a_file'}: cannot be written" in proc.stderr
    # an --input for a benchmark that is not built would be silently ignored: it is an error
    proc = _cli(
        "benchmarks",
        "--output-dir",
        str(tmp_path / "out"),
        "--benchmarks",
        "aime24",
        "--input",
        f"aime24={aime}",
        "--input",
        f"math500={aime}",
    )
    assert proc.returncode == 2 and grading_pass == []
    assert proc.stderr.strip() == (
        f"error: --input math500={aime}: not among --benchmarks (aime24), so it would not be read: add the "
        "benchmark to --benchmarks, or drop the --input"
    )
    assert not (tmp_path / "out").exists()


def test_an_empty_file_is_reported_as_empty(tmp_path):
    empty = tmp_path / "empty.jsonl"
    empty.write_bytes(b"")
    blank = tmp_path / "blank.jsonl"
    blank.write_text("\n\n")
    none = tmp_path / "none.json"
    none.write_text("[]")
    with pytest.raises(PreprocessError, match=r"empty\.jsonl: the file is empty \(0 bytes\)$"):
        table_columns(empty)
    for path in (blank, none):
        with pytest.raises(PreprocessError, match=rf"{path.name}: the file holds no rows$"):
            table_columns(path)
    proc = _cli("openr1_math", "--input", str(empty), "--output", str(tmp_path / "o.parquet"))
    assert proc.returncode == 2 and proc.stderr.strip() == f"error: {empty}: the file is empty (0 bytes)"


def test_a_missing_system_prompt_file_is_named(tmp_path):
    src = write_jsonl(tmp_path / "in.jsonl", [{"problem": "1+1?", "answer": "2"}])
    missing = tmp_path / "no_prompt.txt"
    proc = _cli(
        "openr1_math",
        "--input",
        str(src),
        "--output",
        str(tmp_path / "o.parquet"),
        "--system-prompt-file",
        str(missing),
    )
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.startswith(f"error: --system-prompt-file {missing}: cannot be read (FileNotFoundError")


# ----------------------------------------------------------------------------------------------------- the Hub
@pytest.fixture
def fresh_hub_state(monkeypatch):
    for var in hub.OFFLINE_VARS:
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr(hub, "_checked", None)
    yield
    for var in hub.OFFLINE_VARS:
        monkeypatch.delenv(var, raising=False)


def test_a_hub_that_does_not_answer_switches_to_offline_mode_once(monkeypatch, capsys, fresh_hub_state):
    monkeypatch.setenv("HF_ENDPOINT", CLOSED_ENDPOINT)
    assert hub.probe() is not None
    assert hub.prepare("test") is False
    err = capsys.readouterr().err
    assert err.startswith(f"[test] the Hugging Face Hub ({CLOSED_ENDPOINT}) does not answer (")
    assert "reading only what the local cache holds (HF_HUB_OFFLINE=1 from here on" in err
    assert all(os.environ[v] == "1" for v in hub.OFFLINE_VARS)
    assert hub.prepare("test") is False and capsys.readouterr().err == ""  # said once
    assert "HF_HUB_OFFLINE=1" in hub.offline_hint("--input aime24=PATH")


def test_an_offline_request_is_honoured_without_asking(monkeypatch, fresh_hub_state):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(hub, "probe", lambda *a, **k: pytest.fail("the Hub was asked in offline mode"))
    assert hub.prepare("test") is False


def test_a_hub_that_answers_is_used(monkeypatch, fresh_hub_state):
    class Quiet(http.server.BaseHTTPRequestHandler):
        def do_HEAD(self):  # noqa: N802 (the stdlib's name)
            self.send_response(401)  # any answer counts (a gated repository answers 401)
            self.end_headers()

        def log_message(self, *args):
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Quiet)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{server.server_port}")
        assert hub.probe() is None and hub.prepare("test") is True
        assert not hub.offline_requested()
    finally:
        server.shutdown()


def test_benchmarks_without_the_hub_say_so_and_what_to_pass(tmp_path):
    env = {**os.environ, "HF_ENDPOINT": CLOSED_ENDPOINT, "HF_HOME": str(tmp_path / "hf")}
    for var in hub.OFFLINE_VARS:
        env.pop(var, None)
    proc = _cli("benchmarks", "--output-dir", str(tmp_path / "out"), "--benchmarks", "aime24", env=env)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert lines[0].startswith(f"[benchmarks] the Hugging Face Hub ({CLOSED_ENDPOINT}) does not answer")
    assert lines[-1].startswith("error: aime24: could not load HuggingFaceH4/aime_2024")
    assert "pass a local file with --input aime24=PATH" in lines[-1] and "offline mode (HF_HUB_OFFLINE=1)" in lines[-1]
