"""The reward's bounds: adversarial responses, many caller threads and a killed parent.

Wall-time checks here are upper bounds with generous slack (a hang, a quadratic scan or an unbounded queue
exceeds them many times over), never speed measurements: ``benchmarks/reward_throughput.py`` has the figures.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import psutil
import pytest

from exgrpo.reward import GraderPool, grade, grade_batch, last_boxed, reset_reward_stats, reward_stats
from recipe.exgrpo.reward import to_verl_dict

REPO = Path(__file__).resolve().parents[2]
TIMEOUT_S = 2.0
SLACK_S = 6.0  # killing an overrunning worker and thread scheduling on a loaded 2-core machine
POWER_TOWER = "<think>x</think> \\boxed{9^{9^{9^{9}}}}"  # sympy evaluates it exactly: never finishes, in C code


@pytest.fixture(scope="module")
def pool():
    p = GraderPool(max_workers=2)
    assert p.start(wait=True) == 2  # start-up is outside every deadline below
    yield p
    p.close()


ADVERSARIAL = {
    # about 140k characters of boxes that never close (an 8k-token response holds ~2,700 of them)
    "unclosed boxes": "<think>x</think> " + "\\boxed{" * 20_000,
    "unclosed boxes after an answer": "<think>x</think> \\boxed{7} " + "\\boxed{" * 20_000,
    "nested braces": "<think>x</think> \\boxed{" + "{" * 50_000 + "7" + "}" * 50_000 + "}",
    "unclosed nested braces": "<think>x</think> \\boxed{" + "{" * 100_000,
    "power tower": POWER_TOWER,
    "power tower, unboxed": "<think>x</think> so it is $9^{9^{9^{9}}}$",
    "many fboxes and braces": "<think>x</think> " + "\\fbox{{}" * 20_000 + "\\boxed{7}",
}


@pytest.mark.parametrize("name", list(ADVERSARIAL))
def test_adversarial_response_is_graded_within_the_timeout(pool, name):
    # the workers killed by the previous case's hang are replaced before the clock starts: a respawn on a loaded
    # machine can take longer than the timeout, and the case under test is the grading, not the respawn
    assert pool.start(wait=True) == 2
    start = time.monotonic()
    result = grade(ADVERSARIAL[name], "7", timeout_s=TIMEOUT_S, pool=pool, exact_shortcut=False)
    wall = time.monotonic() - start
    assert wall < TIMEOUT_S + SLACK_S, f"{name}: {wall:.1f} s for a {TIMEOUT_S} s timeout ({result})"
    assert result.outcome in ("correct", "wrong", "no_answer", "timeout", "error"), result
    if "after an answer" in name or "fboxes" in name:
        assert result.score == 1.0, result


def test_box_extraction_is_linear_in_the_number_of_unclosed_boxes():
    """The scan that took 167 s for 20,000 unclosed boxes: 200,000 now fit the bound of one timeout."""
    text = "\\boxed{1} " + "\\boxed{" * 200_000
    start = time.monotonic()
    assert last_boxed(text) == "1"
    assert time.monotonic() - start < TIMEOUT_S + SLACK_S


def test_many_threads_slowest_call_stays_within_the_bound(pool):
    """8 caller threads (verl's reward loop) on 2 grader processes, with hangs among the answers: every call,
    queueing included, returns within the timeout, and the queueing shows in the results and the stats."""
    reset_reward_stats()
    rows = [(f"<think>x</think> \\boxed{{{i}/4}}", f"\\frac{{{i}}}{{4}}") for i in range(88)]
    rows += [(POWER_TOWER, "1")] * 8
    rows = rows[::2] + rows[1::2]  # hangs spread over the run
    walls: list[float] = []

    def one(row):
        start = time.monotonic()
        result = grade(row[0], row[1], timeout_s=TIMEOUT_S, pool=pool, exact_shortcut=False)
        walls.append(time.monotonic() - start)
        return result

    with ThreadPoolExecutor(max_workers=8) as ex:
        results = list(ex.map(one, rows))
    assert max(walls) < TIMEOUT_S + SLACK_S, f"slowest call {max(walls):.1f} s, timeout {TIMEOUT_S} s"
    hangs = [r for r, row in zip(results, rows, strict=True) if row[0] == POWER_TOWER]
    assert all(r.outcome == "timeout" for r in hangs), hangs
    assert {r.outcome for r in results} <= {"correct", "timeout"}
    assert sum(r.outcome == "correct" for r in results) > 0
    stats = reward_stats()
    assert stats["calls"] == len(rows) and stats["queue_s_max"] > 0
    assert max(r.queue_s for r in results) == pytest.approx(stats["queue_s_max"])
    assert all(to_verl_dict(r)["reward_queue_s"] == r.queue_s for r in results)
    assert pool.queue_stats()["waited"] > 0


def test_workers_outlive_the_thread_that_started_them():
    """The parent-death signal follows the forking thread: workers must not die with a caller's thread."""
    p = GraderPool(max_workers=2)
    try:
        out = grade_batch(["<think>x</think> \\boxed{2/4}"] * 6, ["0.5"] * 6, pool=p, exact_shortcut=False)
        assert all(r.score == 1.0 for r in out)
        t = threading.Thread(target=lambda: grade("<think>x</think> \\boxed{3/4}", "0.75", pool=p))
        t.start()
        t.join()
        time.sleep(0.5)  # a parent-death signal would have landed by now
        workers = list(p._live)
        assert workers and all(w.process.poll() is None for w in workers)
        started = p.started
        assert grade("<think>x</think> \\boxed{1/4}", "0.25", pool=p, exact_shortcut=False).score == 1.0
        assert p.started == started and p.killed == 0
    finally:
        p.close()


PARENT = """
import sys, threading, time
from exgrpo.reward import GraderPool, grade
pool = GraderPool(max_workers=2)
pool.start(wait=True)
print(" ".join(str(w.process.pid) for w in pool._live), flush=True)
threading.Thread(target=grade, args=(sys.argv[1], "1"), kwargs={"timeout_s": 600, "pool": pool}, daemon=True).start()
time.sleep(1.0)  # one worker is now busy in C code, the other idle
print("busy", flush=True)
time.sleep(600)
"""


def _gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE  # an orphan's zombie if nothing reaps it
    except psutil.NoSuchProcess:
        return True


def test_a_killed_parent_leaves_no_grader_process():
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    parent = subprocess.Popen(
        [sys.executable, "-c", PARENT, POWER_TOWER], stdout=subprocess.PIPE, text=True, env=env, cwd=REPO
    )
    try:
        pids = [int(x) for x in parent.stdout.readline().split()]
        assert len(pids) == 2, pids
        assert parent.stdout.readline().strip() == "busy"
        busy = [pid for pid in pids if psutil.Process(pid).cpu_percent(interval=0.5) > 20]
        os.kill(parent.pid, signal.SIGKILL)
        parent.wait(timeout=30)
        deadline = time.monotonic() + 60  # generous: the kernel's signal lands at once, the watchdog within 1 s
        while time.monotonic() < deadline and not all(_gone(pid) for pid in pids):
            time.sleep(0.1)
        left = [pid for pid in pids if not _gone(pid)]
        assert left == [], f"grader processes {left} outlived their SIGKILLed parent (busy ones: {busy})"
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait()
