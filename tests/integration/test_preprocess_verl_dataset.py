"""Preprocessing round trip: local input -> our parquet -> verl 0.9.1's RLHFDataset, with a tiny offline tokenizer;
and the benchmark command reproducing the released evaluation rows (skipped without ../shared/data)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from data_preprocess import benchmarks, openr1_math
from data_preprocess.common import LUFFY_SYSTEM_PROMPT, load_tokenizer, prompt_token_lengths, question_id
from tests.helpers.tokenizers import build_tiny_tokenizer

EXPECTED_COLUMNS = ["data_source", "prompt", "ability", "reward_model", "extra_info"]


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory) -> Path:
    return build_tiny_tokenizer(tmp_path_factory.mktemp("tok"))


def rlhf_dataset(path: Path, tokenizer_dir: Path, max_prompt_length: int, cache: Path):
    from omegaconf import OmegaConf
    from verl.utils.dataset.rl_dataset import RLHFDataset

    config = OmegaConf.create(
        {"max_prompt_length": max_prompt_length, "filter_overlong_prompts": True, "cache_dir": str(cache)}
    )
    return RLHFDataset(str(path), load_tokenizer(str(tokenizer_dir)), config)


def openr1_rows(n: int) -> list[dict]:
    """Rows shaped like Elliott/Openr1-Math-46k-8192, questions of growing length."""
    return [
        {
            "data_source": "openr1",
            "prompt": [
                {"role": "system", "content": "x"},
                {"role": "user", "content": f"Q{i}: " + "add one. " * (8 * i)},
            ],
            "target": [{"role": "assistant", "content": "solution"}],
            "reward_model": {"ground_truth": str(i + 1), "style": "rule"},
            "extra_info": {"index": i, "split": "train"},
        }
        for i in range(n)
    ]


def test_openr1_output_loads_in_rlhf_dataset_with_verls_own_length_count(tmp_path, tokenizer_dir):
    src = tmp_path / "openr1.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in openr1_rows(12)), encoding="utf-8")
    unfiltered = tmp_path / "unfiltered.parquet"
    openr1_math.main(["--input", str(src), "--output", str(unfiltered), "--no-progress"])
    prompts = [r["prompt"] for r in pq.read_table(unfiltered).to_pylist()]
    lengths = prompt_token_lengths(prompts, load_tokenizer(str(tokenizer_dir)), progress=False)
    limit = sorted(lengths)[len(lengths) // 2]  # about half the prompts are longer
    n_long = sum(n > limit for n in lengths)
    assert 0 < n_long < len(lengths)

    filtered = tmp_path / "train.parquet"
    code = openr1_math.main(
        [
            "--input",
            str(src),
            "--output",
            str(filtered),
            "--tokenizer",
            str(tokenizer_dir),
            "--max-prompt-tokens",
            str(limit),
            "--no-progress",
        ]
    )
    assert code == 0
    assert pq.read_table(filtered).column_names == EXPECTED_COLUMNS

    # verl's own filter, at the same limit, keeps every row we kept and drops exactly the ones we dropped
    ours = rlhf_dataset(filtered, tokenizer_dir, limit, tmp_path / "cache1")
    theirs = rlhf_dataset(unfiltered, tokenizer_dir, limit, tmp_path / "cache2")
    assert len(ours) == len(lengths) - n_long == len(theirs)

    item = ours[0]
    for key in ("data_source", "reward_model", "extra_info", "raw_prompt", "index"):
        assert key in item, key
    assert item["raw_prompt"][0] == {"content": LUFFY_SYSTEM_PROMPT, "role": "system"}
    assert item["raw_prompt"][1]["content"].startswith("Q0:")
    assert item["reward_model"]["ground_truth"] == "1"
    assert item["extra_info"]["question_id"] == question_id(item["raw_prompt"][1]["content"])
    assert item["index"] == 0 and ours[len(ours) - 1]["index"] == len(ours) - 1


def test_benchmarks_reproduce_the_released_rows_and_load_in_rlhf_dataset(tmp_path, tokenizer_dir, shared_benchmarks):
    """Questions and answers taken out of the released files, run through the command, give the same rows back:
    system prompt, user message (with ARC options), data_source, ground truth, index and the avg@k layout."""
    released = pq.read_table(shared_benchmarks / "valid_id.parquet").to_pylist()
    released += pq.read_table(shared_benchmarks / "arc_c.parquet").to_pylist()
    names = {"aime": "aime24", "aime25": "aime25", "amc": "amc", "minerva": "minerva", "arc_c": "arc_c"}
    released = [r for r in released if r["data_source"] in names]
    inputs = []
    for ds, name in names.items():
        questions: dict[str, str] = {}
        for r in released:
            if r["data_source"] == ds:
                questions.setdefault(r["prompt"][1]["content"], r["reward_model"]["ground_truth"])
        lines = []
        for user, gt in questions.items():
            if ds == "arc_c":  # back to allenai/ai2_arc's shape
                question, _, block = user.rpartition("\n\n")
                options = [re.match(r"^(\S)\) (.*)$", line).groups() for line in block.splitlines()]
                lines.append(
                    {
                        "question": question,
                        "answerKey": gt,
                        "choices": {"label": [o[0] for o in options], "text": [o[1] for o in options]},
                    }
                )
            else:
                lines.append({"problem": user, "answer": gt})
        path = tmp_path / f"{name}.jsonl"
        path.write_text("".join(json.dumps(x) + "\n" for x in lines), encoding="utf-8")
        inputs += ["--input", f"{name}={path}"]

    out_dir = tmp_path / "eval"
    code = benchmarks.main(
        [
            "--output-dir",
            str(out_dir),
            "--benchmarks",
            ",".join(names.values()),
            *inputs,
            "--repeat",
            "aime24=8,aime25=8,amc=4",
            "--combined",
            "valid.parquet",
            "--no-progress",
        ]
    )
    assert code == 0
    ours = pq.read_table(out_dir / "valid.parquet").to_pylist()
    assert len(ours) == len(released) == 240 + 240 + 332 + 272 + 1172

    def key(r):
        return (r["data_source"], r["extra_info"]["index"])

    def view(r):
        return (r["data_source"], r["prompt"], r["reward_model"]["ground_truth"], r["extra_info"]["index"])

    by_source_ours = sorted(ours, key=key)
    by_source_released = sorted(released, key=key)
    assert [view(r) for r in by_source_ours] == [view(r) for r in by_source_released]

    dataset = rlhf_dataset(out_dir / "valid.parquet", tokenizer_dir, 100_000, tmp_path / "cache")
    assert len(dataset) == len(ours)
    assert dataset[0]["raw_prompt"] == ours[0]["prompt"]
