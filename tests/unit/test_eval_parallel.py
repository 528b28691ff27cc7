"""Data-parallel evaluation without an engine: GPU slices per replica, the work split, merging the shards, and
a replica's explicit sample plan (exgrpo.eval.parallel). The replica processes themselves run in
tests/integration/test_eval_pipeline_cpu.py (HF backend on CPU)."""

from __future__ import annotations

import json

import pytest

from exgrpo.eval.backends import Completion
from exgrpo.eval.generate import (
    EvalRow,
    GenerationStore,
    PromptFormat,
    SamplingSettings,
    generate_to_jsonl,
    plan_samples,
    read_generations,
)
from exgrpo.eval.parallel import ReplicaSpec, merge_shards, replica_devices, shard_path, shard_paths, shard_work


def test_replica_devices_are_consecutive_slices_of_the_visible_gpus():
    assert replica_devices(4, 2) == ["0,1", "2,3", "4,5", "6,7"]  # 8 GPUs, TP 2: four replicas
    assert replica_devices(8, 1) == [str(i) for i in range(8)]
    assert replica_devices(2, 1, "3, 5,7") == ["3", "5"]  # the parent's CUDA_VISIBLE_DEVICES, in its order
    assert replica_devices(1, 2, "6,7") == ["6,7"]
    with pytest.raises(ValueError, match="= 8 GPUs.*lists 6"):
        replica_devices(4, 2, "0,1,2,3,4,5")
    with pytest.raises(ValueError, match=">= 1"):
        replica_devices(0, 1)


def test_work_is_split_by_sample_count_largest_rows_first():
    work = {
        "id.parquet": {0: list(range(8)), 1: list(range(8)), 2: [0], 3: [0]},
        "ood.parquet": {0: [0], 1: [0]},
    }
    shards = shard_work(work, 2)
    # by hand: rows of 8 first (id 0 -> shard 0, id 1 -> shard 1), then the single samples alternate
    assert shards == [
        {"id.parquet": {0: list(range(8)), 2: [0]}, "ood.parquet": {0: [0]}},
        {"id.parquet": {1: list(range(8)), 3: [0]}, "ood.parquet": {1: [0]}},
    ]
    assert [sum(len(s) for rows in sh.values() for s in rows.values()) for sh in shards] == [10, 10]
    # every (file, row) exactly once, whatever the number of replicas; more replicas than rows leaves some empty
    for n in (1, 3, 4, 7, 9):
        split = shard_work(work, n)
        pairs = [(d, r) for sh in split for d, rows in sh.items() for r in rows]
        assert sorted(pairs) == sorted((d, r) for d, rows in work.items() for r in rows)
        assert len(split) == n
    assert sum(1 for sh in shard_work(work, 9) if not sh) == 3
    assert shard_work(work, 2) == shards  # deterministic


def test_a_partly_generated_row_keeps_its_missing_samples_only():
    shards = shard_work({"f": {5: [4, 5, 6, 7]}}, 2)
    assert shards == [{"f": {5: [4, 5, 6, 7]}}, {}]


def _rec(row: int, sample: int, text: str) -> dict:
    return {"row": row, "sample": sample, "response": text}


def test_merge_shards_keeps_what_the_main_file_has_and_removes_the_shards(tmp_path):
    main = tmp_path / "gen" / "test_id.jsonl"
    store = GenerationStore.open(main, {"seed": 0})
    store.append([_rec(0, 0, "main")])
    s0, s1 = shard_path(main, 0), shard_path(main, 1)
    assert s0.name == "test_id.shard0.jsonl"
    s0.write_text(json.dumps(_rec(0, 0, "dup")) + "\n" + json.dumps(_rec(1, 0, "r1")) + "\n")
    s0.with_name(s0.name + ".meta.json").write_text("{}")
    s1.write_text(json.dumps(_rec(2, 0, "r2")) + "\n" + '{"row": 3, "sam')  # a replica killed mid-write
    assert shard_paths(main) == [s0, s1]
    assert merge_shards(store) == 2
    assert shard_paths(main) == [] and not s0.with_name(s0.name + ".meta.json").exists()
    records = read_generations(main)
    assert {k: v["response"] for k, v in records.items()} == {(0, 0): "main", (1, 0): "r1", (2, 0): "r2"}
    assert merge_shards(store) == 0  # nothing left to merge


def test_replica_spec_round_trip():
    spec = ReplicaSpec(1, {"model": "m"}, {"a.parquet": {3: [0, 1]}}, {"a.parquet": "s"}, {"a.parquet": {}}, "st")
    back = ReplicaSpec.from_json(spec.to_json())
    assert back == spec and isinstance(next(iter(back.work["a.parquet"])), int)


class CountingBackend:
    name = "hf"

    class tokenizer:  # noqa: N801 - a stand-in attribute, used as PromptFormat's tokenizer
        chat_template = None
        bos_token = None

    def __init__(self):
        self.requests: list[tuple[str, int, int]] = []

    def generate(self, prompts, n, seeds):
        self.requests += list(zip(prompts, n, seeds))
        return [[Completion(f"s{i}", 1, "stop") for i in range(k)] for k in n]


def test_a_replica_draws_exactly_the_samples_it_was_given(tmp_path):
    # one AIME question in 4 rows: the file's plan is 8 samples per row (avg@32); a replica holding only row 0
    # must still draw 8 for it, not the 32 a one-row file would get
    msgs = [{"role": "user", "content": "Q"}]
    rows = [EvalRow(i, "aime", "aime", "q", msgs, "4") for i in range(4)]
    assert plan_samples(rows)[0] == 8 and plan_samples(rows[:1])[0] == 32
    store = GenerationStore.open(tmp_path / "shard.jsonl", {})
    backend = CountingBackend()
    n = generate_to_jsonl(
        backend,
        rows[:1],
        store,
        prompt_format=PromptFormat(template="plain"),
        sampling=SamplingSettings(seed=3),
        progress=False,
        samples={0: list(range(8))},
    )
    assert n == 8 and sorted(store.records) == [(0, s) for s in range(8)]
    # one request with the row's own seed (seed x 1,000,003 + row), as the one-engine path would send it
    assert [(k, seed) for _, k, seed in backend.requests] == [(8, 3_000_009)]
