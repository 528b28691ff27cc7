"""Crash a pool save on purpose: the child side of ``tests/unit/test_persistence_faults.py``.

``python -m tests.unit.pool_fault_driver PLAN.json`` runs each trial of the plan in a forked process that saves
experience states to the trial's directory in a loop, and kills it with SIGKILL, either after a given delay
(``{"dir": D, "log": L, "kill_after_s": t}``) or at a chosen point inside its first save
(``{"dir": D, "log": L, "crash_at": "replace#2"}``; see ``CRASH_POINTS``). Before save ``i`` starts, the forked
process appends ``start i`` to the trial's log, and ``done i`` once it returned, with unbuffered writes, so the
test knows which states were committed when the kill landed. Save ``i`` writes ``STATES[(i + 1) % 3]``; the test
puts ``STATES[0]`` in place first.

The driver itself never touches Arrow before forking (only numpy), so the forked processes start clean.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import sys
import time
from typing import Any

import numpy as np

from exgrpo.config import ExGRPOConfig
from exgrpo.experience import BucketSampler, ExperiencePool, Group, GroupMember, TrajectorySelector
from exgrpo.schedule import ExperienceSchedule

K = 4
N_STATES = 3
# Where a forked save kills itself: "<function>#<n>" = just before the n-th call of that function in its first
# save, "<function>#<n>+" = just after it returned.
CRASH_POINTS = (
    "write_arrow#2",  # entries.arrow written, tokens.arrow not yet
    "write_bytes#1",  # both data files written, header not yet
    "fsync_path#1",  # header written, nothing flushed yet
    "replace#1",  # complete temporary copy, nothing renamed yet
    "replace#2",  # between the two renames: no target, old copy aside, new copy complete
    "replace#2+",  # committed, old copy not yet deleted
    "remove_leftovers#2",  # committed, leftovers of earlier saves not yet deleted
)


def components(seed: int = 5) -> tuple[ExperiencePool, BucketSampler, TrajectorySelector, ExperienceSchedule]:
    cfg = ExGRPOConfig.from_dict({"seed": seed, "trajectory_metric": "random", "delayed_start_threshold": -1.0}, k=K)
    return (
        ExperiencePool.from_config(cfg, chunk_tokens=512),
        BucketSampler.from_config(cfg),
        TrajectorySelector.from_config(cfg),
        ExperienceSchedule.from_config(cfg),
    )


def build_state(index: int) -> tuple[ExperiencePool, BucketSampler, TrajectorySelector, ExperienceSchedule]:
    """Experience state number ``index``: a pool of a few hundred trajectories and advanced RNGs, all different."""
    pool, sampler, selector, schedule = components()
    rng = np.random.default_rng([2024, index])
    for step in range(1, 6 + 2 * index):
        groups = []
        for q in rng.choice(200, size=24, replace=False).tolist():
            members = []
            for _ in range(K):
                n = int(rng.integers(5, 80))
                lps = -rng.random(n).astype(np.float32)
                members.append(GroupMember(rng.integers(0, 50_000, n), lps, float(rng.random() < 0.5)))
            groups.append(Group(f"q{q}", members))
        pool.collect(step, groups, mixed=True)
        draw = sampler.draw(pool, 8)
        selector.select(pool.candidates(draw.question_ids), None)
        schedule.update(step, float(rng.random()))
    return pool, sampler, selector, schedule


def state_digest(pool: ExperiencePool, sampler: Any, selector: Any, schedule: Any) -> str:
    """SHA-256 of everything the state holds: equal digests mean an equal state."""
    st = pool.state_dict()
    h = hashlib.sha256(json.dumps(st["meta"], sort_keys=True).encode())
    for name in sorted(st["entries"]):
        h.update(name.encode() + np.ascontiguousarray(st["entries"][name]).tobytes())
    h.update(st["token_ids"].tobytes() + st["behaviour_log_probs"].tobytes())
    for comp in (sampler, selector, schedule):
        h.update(json.dumps(comp.state_dict(), sort_keys=True).encode())
    return h.hexdigest()


def _install_crash_point(spec: str) -> None:
    from exgrpo.experience import persistence

    name, _, count = spec.partition("#")
    after = count.endswith("+")
    n = int(count.rstrip("+"))
    calls = [0]

    def crash() -> None:
        os.kill(os.getpid(), signal.SIGKILL)

    def wrap(fn: Any) -> Any:
        def wrapped(*args: Any, **kwargs: Any) -> Any:
            calls[0] += 1
            if calls[0] == n and not after:
                crash()
            out = fn(*args, **kwargs)
            if calls[0] == n and after:
                crash()
            return out

        return wrapped

    if name == "write_arrow":  # every data file of the pool is written through files.write_arrow
        from exgrpo.experience import files

        files.write_arrow = wrap(files.write_arrow)
    elif name == "replace":
        persistence.os.replace = wrap(os.replace)  # the os module itself: only this forked process uses it
    elif name == "write_bytes":
        import pathlib

        pathlib.Path.write_bytes = wrap(pathlib.Path.write_bytes)
    else:
        attr = "_" + name
        setattr(persistence, attr, wrap(getattr(persistence, attr)))


def _save_loop(trial: dict[str, Any], states: list[Any]) -> None:
    from exgrpo.experience import save_experience

    log = os.open(trial["log"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    if "crash_at" in trial:
        _install_crash_point(trial["crash_at"])
    os.write(log, b"ready\n")
    i = 0
    while True:
        pool, sampler, selector, schedule = states[(i + 1) % N_STATES]
        os.write(log, f"start {i}\n".encode())
        save_experience(trial["dir"], pool=pool, sampler=sampler, selector=selector, schedule=schedule)
        os.write(log, f"done {i}\n".encode())
        i += 1
        if "crash_at" in trial:
            os._exit(3)  # the crash point was never reached: the test reports it


def _wait_ready(pid: int, log_path: str, timeout_s: float) -> int | None:
    """Wait for the forked process's "ready"; returns its wait status if it exited before that."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            with open(log_path) as f:
                if "ready" in f.read():
                    return None
        except FileNotFoundError:
            pass
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return status
        time.sleep(0.01)
    return None


def main(plan_path: str) -> int:
    with open(plan_path) as f:
        plan = json.load(f)
    states = [build_state(i) for i in range(N_STATES)]  # numpy only; the forked processes inherit them
    for trial in plan:
        pid = os.fork()
        if pid == 0:
            try:
                _save_loop(trial, states)
            finally:
                os._exit(4)
        status = _wait_ready(pid, trial["log"], 120.0)
        if status is None:
            if "kill_after_s" in trial:
                time.sleep(trial["kill_after_s"])
                os.kill(pid, signal.SIGKILL)
            _, status = os.waitpid(pid, 0)
        with open(trial["log"], "a") as f:
            f.write(f"exit {status}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
