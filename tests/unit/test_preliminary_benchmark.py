"""benchmarks/preliminary_cpu.py's bookkeeping: the buckets of the training questions by success count, and the
per-bucket asset folders (the bucket's questions only, the model and the validation split linked)."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.helpers.benchmarks import benchmark_module


@pytest.fixture(scope="module")
def bench():
    with benchmark_module("preliminary_cpu") as module:
        yield module


def test_the_buckets_follow_the_success_rate(bench):
    # K = 8: never solved is in no bucket; 1-2 hard, 3-6 medium, 7-8 easy
    assert [bench.bucket_of(k, 8) for k in range(9)] == [None] + ["hard"] * 2 + ["medium"] * 4 + ["easy"] * 2
    assert bench.bucket_of(1, 4) == "hard" and bench.bucket_of(2, 4) == "medium" and bench.bucket_of(4, 4) == "easy"


def test_each_bucket_trains_on_its_questions_and_validates_on_all(bench, tmp_path):
    src = tmp_path / "assets"
    (src / "data").mkdir(parents=True)
    (src / "model").mkdir()
    ids = ["q0", "q1", "q2", "q3", "q4"]
    table = pa.table({"extra_info": [{"question_id": q} for q in ids], "n": list(range(5))})
    pq.write_table(table, src / "data" / "train.parquet")
    pq.write_table(table, src / "data" / "val.parquet")
    from recipe.exgrpo.harness.assets import Assets

    made = bench.bucket_assets(Assets(src), tmp_path / "out", {"q0": 0, "q1": 1, "q2": 4, "q3": 8, "q4": 2}, 8)
    kept = {name: pq.read_table(a.train_file).column("n").to_pylist() for name, (a, _) in made.items()}
    assert kept == {"hard": [1, 4], "medium": [2], "easy": [3]}  # q0, never solved, in none
    assert {name: size for name, (_, size) in made.items()} == {"hard": 2, "medium": 1, "easy": 1}
    hard = made["hard"][0]
    assert hard.model_path.resolve() == (src / "model").resolve()
    assert hard.val_file.resolve() == (src / "data" / "val.parquet").resolve()
