"""Benchmark: verl's own main_ppo (legacy RayPPOTrainer, GRPO) on CPU with the tiny model, on the ``hf`` stand-in
and on verl's ``vllm`` rollout (the vLLM CPU stack), side by side in one run.

Prints, per rollout, seconds per training step (first step separately: it pays the agent-loop and reward-worker
warm-up), start-up seconds (launch to the start of step 1: Ray, workers, FSDP, the rollout server and its first
weight sync), total wall time, the CPU seconds of the whole process tree (driver, Ray, workers, rollout server
and engine: what a run costs a shared machine), its peak resident memory, and the mean time of each phase of a
step. ``--micro`` compares actor micro-batch sizes (rows per forward/backward; the loss is normalised by the
mini-batch's totals, so the maths is the same) and ``--threads`` the torch/OpenMP threads of every process of a run
(default: all cores), each variant run in turn; ``--concurrent 2`` starts that many copies of each variant at
once (what the test command's sessions do to each other on a small machine) and reports their mean. The machine's
load average is printed too: other processes on a small machine inflate every figure. The two rollouts serve
different tiny models (vLLM's CPU attention needs head size 32, recipe/exgrpo/harness/assets.py) with the same
parameter count and shapes.

    python benchmarks/verl_cpu_step.py [--rollouts hf,vllm] [--steps 5] [--batch 4] [--n 4] [--micro 16]
        [--threads 2] [--concurrent 1] [--timeout 900]

``vllm`` runs with the interpreter of ``bash scripts/setup_env.sh --vllm`` (``--vllm-python``, default
``.venv-vllm/bin/python``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script: the repository first

from benchmarks.common import REPO, VLLM_PYTHON, argument_parser, comma_list, cores, run_stoppable, vllm_python  # noqa: E402
from recipe.exgrpo.cpu import CPU_ROLLOUTS  # noqa: E402
from recipe.exgrpo.cpu.run_config import CpuRunSpec, cpu_env, cpu_overrides  # noqa: E402
from recipe.exgrpo.harness.assets import asset_spec, ensure_assets  # noqa: E402
from recipe.exgrpo.harness.procs import run_in_new_session  # noqa: E402

PHASES = ("gen", "reward", "old_log_prob", "adv", "update_actor", "update_weights")


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []


def _first_line_time(path: Path, stop: threading.Event, seen: dict) -> None:
    """Record when the metrics file gets its first line (the end of step 1)."""
    while not stop.is_set():
        if path.exists() and path.stat().st_size > 0:
            seen["t"] = time.time()
            return
        time.sleep(0.05)


def bench(rollout: str, python: str, micro: int, threads: int | None, copy: int, args: argparse.Namespace) -> dict:
    assets = ensure_assets(asset_spec(rollout))
    reward = REPO / "tests" / "e2e" / "toy_reward.py"
    with (
        tempfile.TemporaryDirectory(prefix="exg-bench-") as tmp,
        tempfile.TemporaryDirectory(prefix="exgray-", dir="/tmp") as ray_tmp,
    ):
        out = Path(args.keep) / f"{rollout}_micro{micro}_threads{threads or 'all'}_{copy}" if args.keep else Path(tmp)
        out.mkdir(parents=True, exist_ok=True)
        spec = CpuRunSpec(
            model_path=str(assets.model_path),
            train_files=str(assets.train_file),
            val_files=str(assets.val_file),
            output_dir=str(out),
            reward_fn_path=str(reward),
            total_training_steps=args.steps,
            train_batch_size=args.batch,
            rollout_n=args.n,
            micro_batch_size_per_device=micro,
            lr=1e-3,
            ray_temp_dir=ray_tmp,
            rollout=rollout,
        )
        env = {**os.environ, **cpu_env(output_dir=out, wall_limit_s=args.timeout, threads=threads)}
        metrics = out / "metrics.jsonl"
        stop, seen = threading.Event(), {}
        watcher = threading.Thread(target=_first_line_time, args=(metrics, stop, seen), daemon=True)
        launched = time.time()
        watcher.start()
        try:
            result = run_in_new_session(
                [python, "-m", "verl.trainer.main_ppo", *cpu_overrides(spec)],
                env=env,
                timeout_s=args.timeout + 30,
                log_path=out / "run.log",
                cwd=REPO,
            )
        finally:
            stop.set()
            watcher.join(1)
        if result.returncode != 0:
            print(result.log_tail())
            raise SystemExit(f"{rollout} run failed: rc={result.returncode} timed_out={result.timed_out}")
        records = sorted((r for r in read_jsonl(metrics) if "timing_s/step" in r["data"]), key=lambda r: r["step"])
        step_s = [r["data"]["timing_s/step"] for r in records]
        later = records[1:] or records
        return {
            "rollout": rollout,
            "micro": micro,
            "threads": threads or len(os.sched_getaffinity(0)),
            "steps": len(step_s),
            "responses_per_step": args.batch * args.n,
            "first_step_s": round(step_s[0], 2),
            "s_per_step_after_first": round(statistics.mean(r["data"]["timing_s/step"] for r in later), 2),
            "startup_s": round(seen["t"] - launched - step_s[0], 1) if "t" in seen else None,
            "wall_s": round(result.wall_seconds, 1),
            "cpu_s": round(result.cpu_seconds, 1),
            "peak_rss_gib": round(result.peak_rss_bytes / 2**30, 2),
            "phase_s_after_first": {
                name: round(statistics.mean(r["data"].get(f"timing_s/{name}", 0.0) for r in later), 3)
                for name in PHASES
            },
            "load_average_1m_at_end": round(os.getloadavg()[0], 2),
        }


def _mean_of(copies: list[dict]) -> dict:
    """One report of copies run at once: the mean of every figure (``copies``: how many)."""
    if len(copies) == 1:
        return {**copies[0], "copies": 1}
    out = dict(copies[0])
    for key, value in copies[0].items():
        if isinstance(value, (int, float)) and key not in ("micro", "threads", "responses_per_step"):
            values = [c[key] for c in copies if c[key] is not None]
            out[key] = round(statistics.mean(values), 2) if values else None
    out["phase_s_after_first"] = {
        p: round(statistics.mean(c["phase_s_after_first"][p] for c in copies), 3) for p in PHASES
    }
    out["copies"] = len(copies)
    return out


def main() -> None:
    parser = argument_parser(__doc__)
    parser.add_argument(
        "--rollouts", default=",".join(CPU_ROLLOUTS), help=f"comma-separated: {', '.join(CPU_ROLLOUTS)}"
    )
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--batch", type=int, default=4, help="prompts per step")
    parser.add_argument("--n", type=int, default=4, help="responses per prompt")
    parser.add_argument(
        "--micro", default="16", help="comma-separated actor micro-batch sizes, each run per rollout (default 16)"
    )
    parser.add_argument("--threads", default="", help="comma-separated thread counts per process (default: all cores)")
    parser.add_argument("--concurrent", type=int, default=1, help="copies of each variant run at once (default 1)")
    parser.add_argument("--timeout", type=float, default=900)
    parser.add_argument("--vllm-python", default=str(VLLM_PYTHON))
    parser.add_argument("--keep", help="keep the run directories under this folder instead of temp dirs")
    args = parser.parse_args()
    rollouts, micros = comma_list(args.rollouts), comma_list(args.micro, int)
    if not micros or min(micros) < 1:
        parser.error(f"--micro needs positive sizes, got {args.micro!r}")
    threads = comma_list(args.threads, int) or [None]
    if any(t is not None and t < 1 for t in threads) or args.concurrent < 1:
        parser.error(f"--threads and --concurrent need positive numbers, got {args.threads!r}, {args.concurrent}")
    reports = []
    for rollout in rollouts:
        python = vllm_python(args.vllm_python) if rollout == "vllm" else sys.executable
        for micro in micros:
            for n_threads in threads:
                with ThreadPoolExecutor(args.concurrent) as pool:
                    runs = [
                        pool.submit(bench, rollout, python, micro, n_threads, copy, args)
                        for copy in range(args.concurrent)
                    ]
                    copies = [run.result() for run in runs]
                reports.append(_mean_of(copies))
    print(
        f"\nverl main_ppo GRPO on CPU (legacy trainer, tiny model, {args.batch} prompts x {args.n} responses, "
        f"{args.steps} steps, {cores()} cores):"
    )
    header = (
        f"{'rollout':8} {'micro':>5} {'threads':>7} {'copies':>6} {'start-up s':>10} {'step 1 s':>9} "
        f"{'s/step after':>13} {'wall s':>7} "
        f"{'CPU s':>7} {'peak RSS GiB':>13}"
    )
    print(header + "  " + "  ".join(f"{p:>14}" for p in PHASES))
    for r in reports:
        print(
            f"{r['rollout']:8} {r['micro']:>5} {r['threads']:>7} {r['copies']:>6} {r['startup_s']!s:>10} "
            f"{r['first_step_s']:>9} "
            f"{r['s_per_step_after_first']:>13} {r['wall_s']:>7} {r['cpu_s']:>7} {r['peak_rss_gib']:>13}  "
            + "  ".join(f"{r['phase_s_after_first'][p]:>14}" for p in PHASES)
        )
    for r in reports:
        print(json.dumps(r))


if __name__ == "__main__":
    sys.exit(run_stoppable(main, "verl_cpu_step"))
