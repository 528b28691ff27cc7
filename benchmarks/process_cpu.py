"""Benchmark: where a command's CPU time goes, by kind of process (a census of every process it starts).

Runs a command (for example the test command) and samples every process on the machine twice a second: its CPU
seconds (user + system) and its command line (the last one seen: a Ray worker renames itself ``ray::<Actor>``
once it hosts an actor). At the end it prints, per kind of process (the run's Ray workers by actor, Ray's own
daemons, the verl drivers, the tiny models' builds, pytest, the venv builds, ...), how many there were and the CPU
seconds they used, against the wall time times the cores (how busy the machine was). Processes that were already
running when the command started are left out; a process that lived less than a sampling period is missed, and so is
the last period of every process. Run it on an otherwise quiet machine: it counts every new process, not only the
command's descendants (Ray's daemons and a run's sessions leave the command's process tree).

    python benchmarks/process_cpu.py [--every 0.5] [--json out.json] -- bash scripts/run_tests.sh
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import threading
import time
from collections import defaultdict
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script: the repository first

from benchmarks.common import argument_parser, cores, run_stoppable  # noqa: E402

#: (kind, pattern on the command line), first match wins; a Ray worker is classified by its actor's name
KINDS: tuple[tuple[str, str], ...] = (
    ("Ray: idle worker", r"^ray::IDLE"),
    ("Ray: dashboard and agents", r"ray/dashboard/|ray-dashboard|runtime_env/agent|^ray::(Dashboard|RuntimeEnv)Agent"),
    ("Ray: log monitor", r"ray/_private/log_monitor\.py"),
    ("Ray: autoscaler monitor", r"ray/autoscaler/_private/monitor\.py"),
    ("Ray: raylet", r"/raylet(\s|$)"),
    ("Ray: GCS", r"/gcs_server(\s|$)"),
    ("Ray: worker not yet an actor", r"default_worker\.py|setup_worker\.py"),
    ("vLLM engine core (spawned)", r"multiprocessing\.spawn"),
    ("verl driver (main_exgrpo, main_ppo)", r"-m (recipe\.exgrpo\.main_exgrpo|verl\.trainer\.main_ppo)\b"),
    ("tiny model builds (harness.assets)", r"-m recipe\.exgrpo\.harness\.assets\b"),
    ("dry runs (recipe.exgrpo.dry_run)", r"-m recipe\.exgrpo\.(tools\.)?dry_run\b"),
    ("pytest", r"-m pytest\b|/pytest(\s|$)"),
    ("venv builds: bytecode", r"-m compileall\b"),
    ("venv builds: uv, pip", r"(^|/)uv(\s|$)|-m pip\b|(^|/)pip3?(\s|$)"),
    ("shell", r"^(/usr)?(/bin/)?(ba)?sh(\s|$)"),
)


def kind_of(cmdline: str) -> str:
    for kind, pattern in KINDS:
        if re.search(pattern, cmdline):
            return kind
    if cmdline.startswith("ray::"):
        return "Ray actor " + cmdline.split()[0].split(".")[0][len("ray::") :]
    module = re.search(r"-m ([\w.]+)", cmdline)
    if module:
        return f"python -m {module.group(1)}"
    exe = cmdline.split()[0] if cmdline.split() else "?"
    return f"other: {os.path.basename(exe)}"


#: a process: (pid, creation time), so that a reused pid is another process
ProcessKey = tuple[int, float]


def sample(seen: dict[ProcessKey, dict], before: set[ProcessKey], stop: threading.Event, every_s: float) -> None:
    while not stop.is_set():
        for proc in psutil.process_iter(["pid", "cmdline", "cpu_times", "create_time"]):
            info = proc.info
            key = (info["pid"], info["create_time"])
            if key in before or info["cpu_times"] is None:
                continue
            entry = seen.setdefault(key, {"cmdline": ""})
            entry["cpu_s"] = info["cpu_times"].user + info["cpu_times"].system
            cmdline = " ".join(info["cmdline"] or [])
            if cmdline:
                entry["cmdline"] = cmdline[:300]
        stop.wait(every_s)


def main() -> None:
    parser = argument_parser(__doc__)
    parser.add_argument("--every", type=float, default=0.5, help="seconds between samples (default 0.5)")
    parser.add_argument("--json", help="also write every process's figures here")
    parser.add_argument("--top", type=int, default=30, help="kinds printed (default 30)")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="the command, after --")
    args = parser.parse_args()
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("no command given (put it after --)")
    if args.every <= 0:
        parser.error(f"--every must be positive, got {args.every}")

    # everything already running (this process and its sampler included) is left out
    before = {(p.info["pid"], p.info["create_time"]) for p in psutil.process_iter(["pid", "create_time"])}
    seen: dict[ProcessKey, dict] = {}
    stop = threading.Event()
    sampler = threading.Thread(target=sample, args=(seen, before, stop, args.every), daemon=True)
    started = time.perf_counter()
    sampler.start()
    try:
        returncode = subprocess.call(command)
    finally:
        wall = time.perf_counter() - started
        stop.set()
        sampler.join(timeout=30)

    by_kind: dict[str, list[float]] = defaultdict(list)
    for entry in seen.values():
        by_kind[kind_of(entry["cmdline"])].append(entry["cpu_s"])
    total = sum(sum(v) for v in by_kind.values())
    n_cores = cores()
    print(
        f"\n{' '.join(command)}: exit {returncode}, wall {wall:.0f} s on {n_cores} cores; the processes it started "
        f"used {total:.0f} CPU s ({total / (wall * n_cores):.0%} of wall x cores), {len(seen)} processes"
    )
    print(f"{'kind of process':48} {'processes':>9} {'CPU s':>8} {'share':>6} {'CPU s each (median)':>20}")
    for kind, values in sorted(by_kind.items(), key=lambda kv: -sum(kv[1]))[: args.top]:
        values.sort()
        print(
            f"{kind[:48]:48} {len(values):>9} {sum(values):>8.1f} {sum(values) / max(total, 1e-9):>6.1%} "
            f"{values[len(values) // 2]:>20.1f}"
        )
    if args.json:
        with open(args.json, "w") as f:
            json.dump([{"pid": pid, "created": created, **e} for (pid, created), e in seen.items()], f)
    sys.exit(returncode)


if __name__ == "__main__":
    sys.exit(run_stoppable(main, "process_cpu"))
