"""Benchmark: verl's own main_ppo (legacy RayPPOTrainer, GRPO) on CPU with the hf rollout and the tiny model.

Prints seconds per training step (first step separately: it pays the agent-loop and reward-worker warm-up),
start-up seconds (launch to the top of ``fit()``, i.e. the first weight sync: Ray, workers, FSDP, rollout server),
total wall time, the peak resident memory of the whole process tree (driver, Ray, workers, rollout server), and
the mean time of each phase of a step. The machine's load average is printed too: other processes on a small
machine inflate every figure.

    python benchmarks/verl_cpu_step.py [--steps 5] [--batch 4] [--n 4] [--timeout 600]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

from recipe.exgrpo.cpu.assets import ensure_assets  # noqa: E402
from recipe.exgrpo.cpu.hf_rollout import DUMP_FILE  # noqa: E402
from recipe.exgrpo.cpu.procs import run_in_new_session  # noqa: E402
from recipe.exgrpo.cpu.run_config import CpuRunSpec, cpu_env, cpu_overrides  # noqa: E402


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--batch", type=int, default=4, help="prompts per step")
    parser.add_argument("--n", type=int, default=4, help="responses per prompt")
    parser.add_argument("--timeout", type=float, default=600)
    parser.add_argument("--keep", help="keep the run directory here instead of a temp dir")
    args = parser.parse_args()

    assets = ensure_assets()
    reward = REPO_ROOT / "tests" / "e2e" / "toy_reward.py"
    with (
        tempfile.TemporaryDirectory(prefix="exg-bench-") as tmp,
        tempfile.TemporaryDirectory(prefix="exgray-", dir="/tmp") as ray_tmp,
    ):
        out = Path(args.keep) if args.keep else Path(tmp)
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
            lr=1e-3,
            ray_temp_dir=ray_tmp,
        )
        dump = out / "rollout_dump"
        env = {**os.environ, **cpu_env(output_dir=out, wall_limit_s=args.timeout, rollout_dump_dir=dump)}
        launched = time.time()
        result = run_in_new_session(
            [sys.executable, "-m", "verl.trainer.main_ppo", *cpu_overrides(spec)],
            env=env,
            timeout_s=args.timeout + 30,
            log_path=out / "run.log",
            cwd=REPO_ROOT,
        )
        if result.returncode != 0:
            print(result.log_tail())
            raise SystemExit(f"run failed: rc={result.returncode} timed_out={result.timed_out}")
        records = [r for r in read_jsonl(out / "metrics.jsonl") if "timing_s/step" in r["data"]]
        step_s = [r["data"]["timing_s/step"] for r in sorted(records, key=lambda r: r["step"])]
        # the first weight sync happens at the top of fit(), right before step 1: everything before it is start-up
        syncs = [e for e in read_jsonl(dump / DUMP_FILE) if e["event"] == "send_weights" and e["global_steps"] == 0]
        startup_s = min(e["time"] for e in syncs) - launched
        later = step_s[1:] or step_s
        later_records = sorted(records, key=lambda r: r["step"])[1:] or records
        phases = {
            name: round(statistics.mean(r["data"].get(f"timing_s/{name}", 0.0) for r in later_records), 3)
            for name in ("gen", "reward", "old_log_prob", "adv", "update_actor", "update_weights")
        }
        report = {
            "steps": len(step_s),
            "prompts_per_step": args.batch,
            "responses_per_step": args.batch * args.n,
            "first_step_s": round(step_s[0], 2),
            "s_per_step_after_first": round(statistics.mean(later), 2),
            "startup_s": round(startup_s, 1),
            "wall_s": round(result.wall_seconds, 1),
            "peak_rss_gib": round(result.peak_rss_bytes / 2**30, 2),
            "cpu_cores": len(os.sched_getaffinity(0)),
            "load_average_1m": round(os.getloadavg()[0], 2),
            "phase_s_after_first": phases,
        }
        print(
            f"verl main_ppo GRPO on CPU (legacy trainer, hf rollout, {assets.report['num_parameters']} params, "
            f"{args.batch} prompts x {args.n} responses):"
        )
        print(
            f"  s/step: first {report['first_step_s']}, then {report['s_per_step_after_first']} | "
            f"start-up {report['startup_s']} s | wall {report['wall_s']} s for {report['steps']} steps | "
            f"peak RSS {report['peak_rss_gib']} GiB (process tree) | {report['cpu_cores']} cores"
        )
        print(json.dumps(report))


if __name__ == "__main__":
    main()
