"""Benchmark: how OpenMP's idle threads wait (``OMP_WAIT_POLICY``) changes a tiny model's small torch ops when the
cores are shared, side by side in one run.

The CPU runs (the demo, the e2e tests) are several processes that take turns (the rollout generates, the actor
computes) on a small machine, and the test command runs four pytest sessions at once. torch's OpenMP (libgomp)
spins by default at the end of each parallel region; a process that waits then holds a core that another one needs.
``PASSIVE`` makes the idle threads sleep: the same threads and the same split of the work (so the same numbers),
no core held by a waiting thread, but a wake-up per parallel region, which costs a process that has the cores to
itself. The test command (scripts/run_tests.sh), whose sessions always share the cores, sets it; a CPU run alone on
its machine (the demo) keeps libgomp's default.

For each policy (the default and ``PASSIVE``) and each number of processes at once (``--procs``, default 1 and 3),
every process runs the same loop of small matmuls, ``tanh`` and ``softmax`` (a 64 x 128 activation, 128 x 128
weights: the size of the tiny models' layers) with ``--threads`` OpenMP threads, and the table gives the wall time
of the whole set and of the slowest process. The machine's load average is printed: other work inflates every
figure, and more so the default policy's.

    python benchmarks/omp_wait_policy.py [--iters 20000] [--threads 2] [--procs 1,3]
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script: the repository first

from benchmarks.common import argument_parser, comma_list, cores, run_stoppable  # noqa: E402

WORKLOAD = """
import sys, time, torch
torch.manual_seed(0)
x, w = torch.randn(64, 128), torch.randn(128, 128)
start = time.perf_counter()
for _ in range(int(sys.argv[1])):
    y = torch.tanh(x @ w) @ w.T
    y = torch.softmax(y, -1).sum()
print(f"{time.perf_counter() - start:.3f} {float(y):.6f}")
"""


def run_set(policy: str | None, procs: int, iters: int, threads: int) -> tuple[float, float, set[str]]:
    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    env["OMP_NUM_THREADS"] = str(threads)
    if policy is not None:
        env["OMP_WAIT_POLICY"] = policy
    start = time.perf_counter()
    children = [
        subprocess.Popen([sys.executable, "-c", WORKLOAD, str(iters)], env=env, stdout=subprocess.PIPE, text=True)
        for _ in range(procs)
    ]
    outs = [c.communicate()[0].split() for c in children]
    wall = time.perf_counter() - start
    if any(c.returncode for c in children):
        raise SystemExit(f"a workload process failed (policy {policy}, {procs} at once)")
    return wall, max(float(o[0]) for o in outs), {o[1] for o in outs}


def main() -> None:
    ap = argument_parser(__doc__)
    ap.add_argument("--iters", type=int, default=20000)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--procs", default="1,3", help="comma-separated numbers of processes at once")
    args = ap.parse_args()
    print(f"cores visible: {cores()}, OMP_NUM_THREADS={args.threads}, iterations {args.iters}")
    print(f"load average before: {os.getloadavg()[0]:.2f}")
    print(f"{'processes':>9}  {'policy':>8}  {'wall s':>7}  {'slowest s':>9}  result")
    for procs in comma_list(args.procs, int):
        results = {}
        for policy in (None, "PASSIVE"):
            wall, slowest, values = run_set(policy, procs, args.iters, args.threads)
            results[policy] = values
            print(f"{procs:>9}  {policy or 'default':>8}  {wall:>7.2f}  {slowest:>9.2f}  {' '.join(sorted(values))}")
        same = "same" if results[None] == results["PASSIVE"] else "DIFFERENT"
        print(f"{'':>9}  the two policies' results: {same}")
    print(f"load average after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    sys.exit(run_stoppable(main, "omp_wait_policy"))
