"""The Python sandbox's cost per call (exgrpo/sandbox/), this checkout beside a baseline revision, in one run.

Each side runs in a worker process of its own (this checkout's ``exgrpo`` or the ``exgrpo`` package of ``--baseline
REV``, extracted with ``git archive``), and the calls alternate between the sides, one call at a time, so a load that
comes and goes on the machine falls on both alike. Every call is a real ``run_python`` with the default limits (the
TIR scripts' ``site_packages`` where a snippet needs it): a fresh interpreter, the confinement, the code, the
cleanup. Per snippet: the median and the mean wall-clock milliseconds per call, and the after/before ratio of the
medians. The snippets: a bare print (the fixed cost: the interpreter's start, the confinement, the cleanup), the
stdlib imports of a typical call, numpy with site-packages, 20,000 syscalls (what a longer seccomp filter adds per
syscall), and 200 files written and left in the temp dir (what the cleanup costs).

    python benchmarks/sandbox_cost.py                         # 30 calls per snippet and side
    python benchmarks/sandbox_cost.py --calls 100 --baseline HEAD~3
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script: the repository first

from benchmarks.common import REPO, argument_parser, extract_baseline, git_revision, host, run_stoppable  # noqa: E402

#: "before": the last commit before the sandbox confined reads, metadata, IPC and other processes
BASELINE_REV = "16cc451"
#: name -> (code, site_packages, what its stdout must be)
SNIPPETS = {
    "bare print": ("print(1)", False, "1\n"),
    "stdlib imports": ("import json, math, fractions, decimal, itertools, re\nprint(math.comb(10, 3))", False, "120\n"),
    "numpy (site-packages)": ("import numpy as np\nprint(int(np.arange(10).sum()))", True, "45\n"),
    "20,000 syscalls": ("import os\nfor _ in range(20000):\n    os.stat('.')\nprint('done')", False, "done\n"),
    "200 files left": ("for i in range(200):\n    open(f'f{i}', 'w').write('x' * 100)\nprint('done')", False, "done\n"),
}

WORKER = r"""
import json, sys, time
sys.path.insert(0, sys.argv[1])
from exgrpo.sandbox import SandboxLimits, run_python
assert __import__("exgrpo").__file__.startswith(sys.argv[1]), __import__("exgrpo").__file__
for line in sys.stdin:
    req = json.loads(line)
    limits = SandboxLimits(site_packages=req["site_packages"], memory_mb=1024, timeout_s=60, cpu_s=60)
    start = time.perf_counter()
    result = run_python(req["code"], limits)
    took = time.perf_counter() - start
    print(json.dumps({"s": took, "stdout": result.stdout, "error": result.error}), flush=True)
"""


class Side:
    """A worker process that runs ``run_python`` from the ``exgrpo`` package under ``root``."""

    def __init__(self, name: str, root: str):
        self.name = name
        self.proc = subprocess.Popen(
            [sys.executable, "-c", WORKER, root], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=root
        )

    def call(self, code: str, site_packages: bool) -> dict:
        self.proc.stdin.write(json.dumps({"code": code, "site_packages": site_packages}) + "\n")
        self.proc.stdin.flush()
        return json.loads(self.proc.stdout.readline())

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait()


def main() -> None:
    parser = argument_parser(__doc__)
    parser.add_argument("--baseline", default=BASELINE_REV, help="the revision measured as 'before'")
    parser.add_argument("--calls", type=int, default=30, help="calls per snippet and side")
    parser.add_argument("--warmup", type=int, default=3, help="calls per snippet and side not counted")
    parser.add_argument("--json", help="also write the figures here")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="sandbox-cost-") as work:
        before_root = extract_baseline(args.baseline, work)
        sides = [Side("before", before_root), Side("after", str(REPO))]
        times: dict[tuple[str, str], list[float]] = {}
        try:
            for name, (code, site_packages, expected) in SNIPPETS.items():
                for i in range(args.warmup + args.calls):
                    for side in sides if i % 2 == 0 else sides[::-1]:  # alternate who goes first
                        got = side.call(code, site_packages)
                        if got["stdout"] != expected or got["error"]:
                            raise SystemExit(f"{side.name} / {name}: {got}")
                        if i >= args.warmup:
                            times.setdefault((name, side.name), []).append(got["s"] * 1000)
        finally:
            for side in sides:
                side.close()

    started = time.strftime("%Y-%m-%d %H:%M")
    print(f"sandbox cost per call, {args.calls} calls per snippet and side, alternating ({started})")
    print(f"before: {args.baseline}   after: {git_revision()}   machine: {host()}")
    print(
        f"{'snippet':24s} {'before median':>14s} {'after median':>13s} {'ratio':>6s} {'before mean':>12s} "
        f"{'after mean':>11s}"
    )
    rows = []
    for name in SNIPPETS:
        b, a = times[(name, "before")], times[(name, "after")]
        row = {
            "snippet": name,
            "before_median_ms": statistics.median(b),
            "after_median_ms": statistics.median(a),
            "before_mean_ms": statistics.fmean(b),
            "after_mean_ms": statistics.fmean(a),
        }
        row["ratio"] = row["after_median_ms"] / row["before_median_ms"]
        rows.append(row)
        print(
            f"{name:24s} {row['before_median_ms']:12.1f} ms {row['after_median_ms']:10.1f} ms {row['ratio']:6.2f} "
            f"{row['before_mean_ms']:9.1f} ms {row['after_mean_ms']:8.1f} ms"
        )
    if args.json:
        Path(args.json).write_text(json.dumps({"baseline": args.baseline, "after": git_revision(), "rows": rows}))


if __name__ == "__main__":
    sys.exit(run_stoppable(main, "sandbox_cost"))
