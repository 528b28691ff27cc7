"""The dry run runs a launch's pre-flight checks on the files it can read, and lists each one it cannot run here.

What a launch refuses (a model whose context is shorter than prompt + response, a missing data file, chat rows given
to the Llama-3.1-8B base script) must not pass a ``DRY_RUN=1`` silently: either the dry run refuses it too, or it
says which check it could not run on this machine and why."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from recipe.exgrpo.launch_checks.dry_run import DryRunError, dry_run
from recipe.exgrpo.launch_checks.dry_run import main as dry_run_main
from tests.helpers.launch_scripts import (
    TRAIN_DIR,
    printed_launches,
    prompt_file,
    run_script,
    script_env,
)

pytestmark = pytest.mark.usefixtures("gpu_dry_run_env")

QWEN = TRAIN_DIR / "exgrpo_qwen2.5_math_7b.sh"
LLAMA = TRAIN_DIR / "exgrpo_llama3.1_8b.sh"


def _model(tmp_path: Path, positions: int | None) -> Path:
    model = tmp_path / f"model_{positions}"
    model.mkdir()
    config = {"model_type": "qwen2"} if positions is None else {"max_position_embeddings": positions}
    (model / "config.json").write_text(json.dumps(config), encoding="utf-8")
    return model


def test_a_short_context_model_fails_the_dry_run_as_it_fails_the_launch(tmp_path, monkeypatch):
    short, long = _model(tmp_path, 4096), _model(tmp_path, 16384)
    (overrides,) = printed_launches(QWEN, MODEL_PATH=str(short))  # data unset: placeholders
    with pytest.raises(DryRunError) as err:
        dry_run(overrides)
    assert err.value.problems == [
        f"actor_rollout_ref.model.path={short} has max_position_embeddings=4096 < 9216 (data.max_prompt_length "
        "1024 + data.max_response_length 8192 tokens): vLLM would cut responses short. Use a long-context variant "
        "(the released run used a 16k-context 'think' variant of the backbone) or set CHECK_CONTEXT=0."
    ]
    (overrides,) = printed_launches(QWEN, MODEL_PATH=str(long))
    assert not any("context" in n for n in dry_run(overrides).not_checked)  # checked, and it fits
    (overrides,) = printed_launches(QWEN, MODEL_PATH=str(_model(tmp_path, None)))
    assert any("its config.json has no max_position_embeddings" in n for n in dry_run(overrides).not_checked)
    monkeypatch.setenv("CHECK_CONTEXT", "0")
    (overrides,) = printed_launches(QWEN, MODEL_PATH=str(short))
    assert f"the context length of {short} (CHECK_CONTEXT=0)" in dry_run(overrides).not_checked


def test_paths_missing_here_are_listed_as_not_checked(tmp_path):
    (overrides,) = printed_launches(QWEN, TRAIN_FILE="/no/such.parquet")
    report = dry_run(overrides)
    assert report.not_checked == [
        "the model: MODEL_PATH is not set (a placeholder stands in): its directory and its context length "
        "(max_position_embeddings >= prompt + response tokens)",
        "data.train_files: /no/such.parquet does not exist on this machine: the file, its prompts",
        "data.val_files: VAL_FILE is not set (a placeholder stands in): the file, its prompts",
    ]
    (overrides,) = printed_launches(QWEN, MODEL_PATH="Qwen/Qwen2.5-Math-7B")
    assert any(
        "the context length of Qwen/Qwen2.5-Math-7B: not a directory here" in n for n in dry_run(overrides).not_checked
    )
    # every path given: they must exist, as in the launch's pre-flight
    model = _model(tmp_path, 16384)
    val = prompt_file(tmp_path / "val.parquet", [{"role": "user", "content": "Q"}])
    (overrides,) = printed_launches(QWEN, MODEL_PATH=str(model), TRAIN_FILE="/no/such.parquet", VAL_FILE=str(val))
    with pytest.raises(DryRunError) as err:
        dry_run(overrides, check_files=True)
    assert err.value.problems == ["data.train_files: /no/such.parquet is not a file"]


def test_chat_rows_for_the_llama_base_script_fail_without_the_other_paths(tmp_path):
    chat = prompt_file(
        tmp_path / "chat.parquet", [{"role": "system", "content": "S"}, {"role": "user", "content": "Q"}]
    )
    (overrides,) = printed_launches(LLAMA, TRAIN_FILE=str(chat))  # MODEL_PATH and VAL_FILE unset
    with pytest.raises(DryRunError, match=f"data.train_files: {chat} holds chat prompts"):
        dry_run(overrides)


def test_the_command_line_prints_each_check_not_run(tmp_path, capsys):
    (overrides,) = printed_launches(QWEN, TRAIN_FILE="/no/such.parquet")
    assert dry_run_main(["--quiet", "--", *overrides]) == 0
    err = capsys.readouterr().err.splitlines()
    assert (
        "[dry-run] not checked: data.train_files: /no/such.parquet does not exist on this machine: the file, "
        "its prompts" in err
    )
    (ok,) = [line for line in err if line.startswith("[dry-run] OK")]
    assert ok.startswith("[dry-run] OK (3 checks could not run here: 'not checked' above)  experiment=")


def test_the_real_dry_run_path_runs_the_launch_checks(tmp_path):
    """bash -> python: the context check fails it, a missing file is listed, the Ray cluster and the think template
    are mentioned as a launch would."""
    short = _model(tmp_path, 4096)
    proc = run_script(QWEN, env=script_env(tmp_path, DRY_RUN="1", DRY_RUN_QUIET="1", MODEL_PATH=str(short)))
    assert proc.returncode == 1 and "max_position_embeddings=4096 < 9216" in proc.stderr
    (short / "tokenizer_config.json").write_text('{"chat_template": "<|im_start|>assistant\\n"}', encoding="utf-8")
    env = script_env(tmp_path, DRY_RUN="1", DRY_RUN_QUIET="1", MODEL_PATH=str(short), CHECK_CONTEXT="0")
    env.update(TRAIN_FILE="/no/such.parquet", NNODES="2", RAY_ADDRESS="10.0.0.1:6379")
    proc = run_script(QWEN, env=env)
    assert proc.returncode == 0, proc.stderr
    assert "does not open a <think> block" in proc.stderr  # the launch's warning, in the dry run too
    assert "dry run, not checked: the GPUs of the Ray cluster at RAY_ADDRESS=10.0.0.1:6379" in proc.stderr
    assert "[dry-run] not checked: data.train_files: /no/such.parquet does not exist on this machine" in proc.stderr
    assert f"[dry-run] not checked: the context length of {short} (CHECK_CONTEXT=0)" in proc.stderr
