"""Grading throughput of the verifiable reward (exgrpo.reward) on the real evaluation rows, and the cost of its
process-based timeout.

Prints rows/second for:
- ``default``: the production path (exact-match shortcut, math-verify in the worker pool), correct answers;
- ``math-verify``: every answer through math-verify (no shortcut), inline (no timeout) and in pools of 1 and W
  worker processes, for correct answers and for another row's (wrong) answer;
- ``default path, all rows``: every row of the files, repeats included, as an evaluation grades them;
- the per-call overhead of the pool (pipe round trip) on a trivial answer, and the cost of one timeout
  (the killed worker's replacement start-up);
- adversarial responses (``--adversarial``): thousands of unclosed ``\boxed{``, deeply nested braces, power
  towers: the wall time of one graded call (and of the box extraction alone) next to the timeout;
- many caller threads (``--threads``): rows graded from 8 threads as verl's reward loop does, with a few
  power towers among them, on a small pool: per-call latency (median, p99, max) next to the timeout, and the
  time calls queued for a grader process.

Rows: every distinct (answer, ground truth, data_source) of the evaluation files in --data DIR; repeated
AIME/AMC rows are counted once, so caching does not inflate the figures (ground-truth parses are still reused
across answers, as across the K rollouts of a question in training).

    python benchmarks/reward_throughput.py [--data data/benchmarks] [--workers 2] [--limit 0]
    python benchmarks/reward_throughput.py --only adversarial,threads      # the bound checks only
"""

from __future__ import annotations

import os
import random
import sys
import time
from pathlib import Path

import pyarrow.parquet as pq

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script: the repository first

from benchmarks.common import REPO, argument_parser, comma_list, cores, run_stoppable  # noqa: E402
from exgrpo.reward import (  # noqa: E402
    GraderPool,
    canonical_answer,
    choice_labels,
    grade,
    is_multiple_choice,
    last_boxed,
    math_verifier,
)

FILES = ("test_id", "valid_id", "arc_c", "gpqa_diamond")


def load_rows(data_dir: Path, distinct: bool = True) -> list[tuple[str, str]]:
    rows = []
    for name in FILES:
        path = data_dir / f"{name}.parquet"
        if not path.exists():
            raise SystemExit(f"{path} not found (pass --data DIR holding {', '.join(f + '.parquet' for f in FILES)})")
        table = pq.read_table(path, columns=["data_source", "reward_model"]).to_pylist()
        rows += [(r["reward_model"]["ground_truth"], r["data_source"]) for r in table]
    return list(dict.fromkeys(rows)) if distinct else rows  # distinct (ground truth, data_source)


def response(answer: str) -> str:
    return f"<think>\nreasoning\n</think>\nSo the final answer is $\\boxed{{{answer}}}$."


def wrong_answers(rows: list[tuple[str, str]], seed: int = 0) -> list[str]:
    """Another row's answer (different up to LaTeX spacing), from the same kind of benchmark."""
    rng = random.Random(seed)

    def kind(gt: str, ds: str) -> tuple:
        return (ds, choice_labels(gt)) if is_multiple_choice(ds) else ("math",)

    pools: dict[tuple, list[str]] = {}
    for gt, ds in rows:
        pools.setdefault(kind(gt, ds), []).append(gt)
    out = []
    for gt, ds in rows:
        pool = pools[kind(gt, ds)]
        while True:
            other = pool[rng.randrange(len(pool))]
            if canonical_answer(other) != canonical_answer(gt):
                out.append(other)
                break
    return out


def timed(label: str, responses: list[str], rows: list[tuple[str, str]], threads: int, **kw) -> dict:
    from concurrent.futures import ThreadPoolExecutor

    def one(i: int):
        return grade(responses[i], rows[i][0], data_source=rows[i][1], **kw)

    start = time.perf_counter()
    with ThreadPoolExecutor(max_workers=threads) as ex:
        results = list(ex.map(one, range(len(rows))))
    seconds = time.perf_counter() - start
    outcomes: dict[str, int] = {}
    for r in results:
        outcomes[r.outcome] = outcomes.get(r.outcome, 0) + 1
    line = {"mode": label, "rows": len(rows), "seconds": seconds, "rows_per_s": len(rows) / seconds, **outcomes}
    print(f"  {label:<44} {len(rows):>6} rows {seconds:8.2f} s {len(rows) / seconds:9.1f} rows/s  {outcomes}")
    return line


def overhead(pool: GraderPool, n: int = 1000, repeats: int = 5) -> tuple[float, float]:
    """Microseconds per call of a trivial check, inline vs through the pool (caches warm on both sides); the
    best of ``repeats`` runs, since other load on the machine only ever adds time."""
    for i in range(50):
        math_verifier.math_equal(str(i), (str(i),), True)
        pool.math_equal(str(i), (str(i),), True, 30.0)

    def best(call) -> float:
        runs = []
        for _ in range(repeats):
            start = time.perf_counter()
            for i in range(n):
                call(i)
            runs.append((time.perf_counter() - start) / n * 1e6)
        return min(runs)

    inline = best(lambda i: math_verifier.math_equal(str(i % 50), (str(i % 50),), True))
    pooled = best(lambda i: pool.math_equal(str(i % 50), (str(i % 50),), True, 30.0))
    return inline, pooled


def timeout_cost(pool: GraderPool, timeout_s: float = 1.0) -> tuple[float, float]:
    """Seconds of a call that times out, and of the next call (which starts the replacement worker)."""
    start = time.perf_counter()
    hung = grade("<think></think>\\boxed{9^{9^{9^{9}}}}", "1", timeout_s=timeout_s, pool=pool, exact_shortcut=False)
    hung_s = time.perf_counter() - start
    assert hung.outcome == "timeout", hung
    start = time.perf_counter()
    grade("<think></think>\\boxed{2}", "2", timeout_s=30.0, pool=pool, exact_shortcut=False)
    return hung_s, time.perf_counter() - start


POWER_TOWER = "<think></think>\\boxed{9^{9^{9^{9}}}}"


def warm_pool(workers: int) -> GraderPool:
    """A pool with all its workers started (start-up is not what is measured)."""
    pool = GraderPool(workers)
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(workers) as ex:
        list(ex.map(lambda _: pool.math_equal("1", ("1",), True, 120.0), range(workers)))
    return pool


def adversarial(pool: GraderPool, timeout_s: float, boxes: list[int]) -> None:
    """Wall time of one graded call on adversarial responses (and of the box extraction alone)."""
    cases = [(f"{n:,} unclosed \\boxed{{", "<think></think>" + "\\boxed{" * n) for n in boxes]
    cases += [
        (f"\\boxed{{7}} then {boxes[-1]:,} unclosed", "<think></think>\\boxed{7}" + "\\boxed{" * boxes[-1]),
        ("50,000-deep nested braces", "<think></think>\\boxed{" + "{" * 50_000 + "7" + "}" * 50_000 + "}"),
        ("100,000 unclosed nested braces", "<think></think>\\boxed{" + "{" * 100_000),
        ("power tower 9^9^9^9 (boxed)", POWER_TOWER),
    ]
    print(f"  adversarial responses, timeout {timeout_s:g} s (wall time of one call; extraction alone):")
    for label, text in cases:
        start = time.perf_counter()
        last_boxed(text)
        extract_s = time.perf_counter() - start
        start = time.perf_counter()
        result = grade(text, "7", timeout_s=timeout_s, pool=pool, exact_shortcut=False)
        wall = time.perf_counter() - start
        print(
            f"    {label:<36} {len(text):>9,} chars  call {wall:7.2f} s  extraction {extract_s:7.3f} s  "
            f"{result.outcome}"
        )


def many_threads(rows: list[tuple[str, str]], n_rows: int, threads: int, workers: int, timeout_s: float) -> None:
    """Rows graded from ``threads`` threads on a pool of ``workers``: per-call latency and queueing."""
    rng = random.Random(1)
    wrong = wrong_answers(rows)
    picks = [rng.randrange(len(rows)) for _ in range(n_rows)]
    work = [(response(rows[i][0] if k % 2 else wrong[i]), rows[i][0], rows[i][1]) for k, i in enumerate(picks)]
    for k in range(0, n_rows, 200):  # one power tower in 200 rows
        work[k] = (POWER_TOWER, "1", "math")
    pool = warm_pool(workers)
    from concurrent.futures import ThreadPoolExecutor

    def one(item):
        start = time.perf_counter()
        result = grade(item[0], item[1], data_source=item[2], timeout_s=timeout_s, pool=pool, exact_shortcut=False)
        return time.perf_counter() - start, result

    start = time.perf_counter()
    with ThreadPoolExecutor(max_workers=threads) as ex:
        out = list(ex.map(one, work))
    total = time.perf_counter() - start
    pool.close()
    walls = sorted(w for w, _ in out)
    queued = [getattr(r, "queue_s", float("nan")) for _, r in out]
    outcomes: dict[str, int] = {}
    for _, r in out:
        outcomes[r.outcome] = outcomes.get(r.outcome, 0) + 1

    def q(p: float) -> float:
        return walls[min(len(walls) - 1, int(p * len(walls)))]

    print(
        f"  {n_rows} rows from {threads} threads, pool of {workers}, timeout {timeout_s:g} s: {total:.1f} s; "
        f"per call median {q(0.5):.2f} s, p99 {q(0.99):.2f} s, max {walls[-1]:.2f} s; "
        f"queued max {max(queued):.2f} s, mean {sum(queued) / len(queued):.3f} s; {outcomes}"
    )


def main() -> None:
    p = argument_parser(__doc__)
    p.add_argument("--data", default=str(REPO / "data" / "benchmarks"), help="written by scripts/prepare_data.sh")
    p.add_argument("--workers", type=int, default=max(1, min(4, cores())))
    p.add_argument("--limit", type=int, default=0, help="first N distinct rows only (0: all)")
    p.add_argument("--only", default="throughput,adversarial,threads", help="sections to run (comma list)")
    p.add_argument(
        "--boxes", default="2730,5000,20000", help="unclosed-box counts of the adversarial section (comma list)"
    )
    p.add_argument("--timeout", type=float, default=10.0, help="per-call timeout of the adversarial/thread sections")
    p.add_argument("--thread-rows", type=int, default=2000)
    p.add_argument("--threads", type=int, default=8)
    p.add_argument("--thread-workers", type=int, default=2)
    args = p.parse_args()
    sections = set(comma_list(args.only))

    rows = load_rows(Path(args.data))
    if args.limit:
        rows = rows[: args.limit]
    right = [response(gt) for gt, _ in rows]
    wrong = [response(a) for a in wrong_answers(rows)]
    n_mc = sum(is_multiple_choice(ds) for _, ds in rows)
    print(
        f"reward throughput: {len(rows)} distinct rows ({n_mc} multiple choice), {cores()} cores, "
        f"load average {os.getloadavg()[0]:.1f}, pool of {args.workers} workers"
    )

    if "adversarial" in sections:
        apool = warm_pool(args.workers)
        adversarial(apool, args.timeout, comma_list(args.boxes, int))
        apool.close()
    if "threads" in sections:
        many_threads(rows, args.thread_rows, args.threads, args.thread_workers, args.timeout)
    if "throughput" not in sections:
        return

    # inline first, on cold caches in this process; each pool below starts with cold caches in its workers
    timed("math-verify inline (no timeout), 1 thread", right, rows, 1, timeout_s=None, exact_shortcut=False)
    pool1 = GraderPool(1)
    pool1.math_equal("1", ("1",), True, 120.0)  # start-up is not counted
    timed("math-verify pool (1 worker)", right, rows, 1, pool=pool1, exact_shortcut=False)
    pool1.close()
    pool = GraderPool(args.workers)
    warm = [pool.math_equal] * args.workers
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(args.workers) as ex:  # start all workers before timing
        list(ex.map(lambda f: f("1", ("1",), True, 120.0), warm))
    timed(f"math-verify pool ({args.workers} workers)", right, rows, args.workers, pool=pool, exact_shortcut=False)
    timed(f"default path, correct answers ({args.workers} workers)", right, rows, args.workers, pool=pool)
    timed(f"default path, wrong answers ({args.workers} workers)", wrong, rows, args.workers, pool=pool)

    every = load_rows(Path(args.data), distinct=False)
    timed(
        f"default path, all {len(every)} rows as evaluated ({args.workers} workers)",
        [response(gt) for gt, _ in every],
        every,
        args.workers,
        pool=pool,
    )
    inline_us, pooled_us = overhead(pool)
    print(
        f"  per-call cost of a trivial check: inline {inline_us:.0f} us, through the pool {pooled_us:.0f} us "
        f"(timeout mechanism overhead {pooled_us - inline_us:.0f} us per call)"
    )
    hung_s, restart_s = timeout_cost(pool)
    print(
        f"  a 1 s timeout: the call returns after {hung_s:.2f} s; the next call, starting the replacement "
        f"worker, takes {restart_s:.2f} s"
    )
    pool.close()


if __name__ == "__main__":
    sys.exit(run_stoppable(main, "reward_throughput"))
