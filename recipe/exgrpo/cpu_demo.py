"""Tiny ExGRPO training on CPU through the real verl trainer: the README's main command.

``python -m recipe.exgrpo.cpu_demo [--steps N] [--out DIR] [hydra overrides...]`` builds (or reuses) the tiny
warmed-up Qwen2 model and the toy arithmetic data (recipe/exgrpo/cpu/assets.py, no downloads), runs
``python -m recipe.exgrpo.main_exgrpo`` with the CPU backend under a hard wall-clock limit, prints the per-step
metrics as they come, and ends with a summary: reward curve, pool growth, replay activity.

The same functions drive the e2e tests and ``benchmarks/exgrpo_vs_grpo_cpu.py``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from recipe.exgrpo.cpu.procs import RunResult, run_in_new_session
from recipe.exgrpo.cpu.run_config import CpuRunSpec, cpu_env, cpu_overrides

REPO_ROOT = Path(__file__).resolve().parents[2]


@dataclass
class ExGRPOCpuRun:
    """Settings of a tiny CPU ExGRPO run (prompt counts per step; K = rollout_n)."""

    output_dir: Path
    steps: int = 30
    train_batch_size: int = 8
    rollout_n: int = 4
    ppo_mini_batch_size: int = 8
    # the byte-level toy tokenizer spends ~70 tokens on the chat-templated question
    max_prompt_length: int = 128
    max_response_length: int = 16
    # 2e-4 and above drift the tiny model away from its warm-up (validation accuracy drops for GRPO and ExGRPO
    # alike); 3e-5..6e-5 keep it stable
    lr: float = 5e-5
    # the toy task reaches a batch pass rate of ~0.3-0.6 after the warm-up: start replay early enough to see it
    delayed_start_threshold: float = 0.2
    replay_ratio: float = 0.5
    save_freq: int = -1
    test_freq: int = -1
    val_before_train: bool = False
    resume_mode: str = "disable"
    resume_from_path: str | None = None
    exgrpo_enable: bool = True
    wall_limit_s: float = 1500.0
    seed: int = 0
    ray_temp_dir: str | None = None
    extra_overrides: list[str] = field(default_factory=list)


def build_overrides(run: ExGRPOCpuRun, model_path: str, train_file: str, val_file: str) -> list[str]:
    """Hydra overrides of ``recipe.exgrpo.main_exgrpo`` for a tiny CPU run."""
    spec = CpuRunSpec(
        model_path=model_path,
        train_files=train_file,
        val_files=val_file,
        output_dir=str(run.output_dir),
        total_training_steps=run.steps,
        train_batch_size=run.train_batch_size,
        rollout_n=run.rollout_n,
        ppo_mini_batch_size=run.ppo_mini_batch_size,
        max_prompt_length=run.max_prompt_length,
        max_response_length=run.max_response_length,
        lr=run.lr,
        seed=run.seed,
        ray_temp_dir=run.ray_temp_dir,
        save_freq=run.save_freq,
        test_freq=run.test_freq,
        val_before_train=run.val_before_train,
        resume_mode=run.resume_mode,
        project_name="exgrpo_cpu_demo",
        experiment_name="exgrpo" if run.exgrpo_enable else "onpolicy",
    )
    overrides = cpu_overrides(spec) + [
        # the toy task has no <think> template
        "+reward.custom_reward_function.reward_kwargs.think_gate=false",
        "+reward.custom_reward_function.reward_kwargs.timeout_s=null",
        # Dr.GRPO constant normaliser L_max = the response budget of this tiny run (8192 in the 7B run)
        "actor_rollout_ref.actor.loss_agg_mode=seq-mean-token-sum-norm",
        f"actor_rollout_ref.actor.loss_scale_factor={run.max_response_length}",
        "actor_rollout_ref.actor.entropy_coeff=0.001",
        "algorithm.norm_adv_by_std_in_grpo=False",
        f"exgrpo.enable={run.exgrpo_enable}",
        f"exgrpo.delayed_start_threshold={run.delayed_start_threshold}",
        f"exgrpo.replay_ratio={run.replay_ratio}",
        f"exgrpo.seed={run.seed}",
    ]
    if run.resume_from_path:
        overrides.append(f"trainer.resume_from_path={run.resume_from_path}")
    return overrides + list(run.extra_overrides)


def launch(run: ExGRPOCpuRun, assets=None, echo: bool = True) -> RunResult:
    """Run the trainer in its own process session under ``run.wall_limit_s``; metrics go to metrics.jsonl."""
    if assets is None:
        from recipe.exgrpo.cpu.assets import ensure_assets

        assets = ensure_assets()
    run.output_dir = Path(run.output_dir)
    run.output_dir.mkdir(parents=True, exist_ok=True)
    overrides = build_overrides(run, str(assets.model_path), str(assets.train_file), str(assets.val_file))
    env = {**os.environ, **cpu_env(output_dir=run.output_dir, wall_limit_s=run.wall_limit_s)}
    cmd = [sys.executable, "-m", "recipe.exgrpo.main_exgrpo", *overrides]
    log_path = run.output_dir / "train.log"
    log_path.write_text("")
    stop = threading.Event()
    follower = threading.Thread(target=_follow, args=(log_path, stop), daemon=True) if echo else None
    if follower:
        follower.start()
    try:
        return run_in_new_session(
            cmd, env=env, cwd=str(REPO_ROOT), timeout_s=run.wall_limit_s + 60, log_path=log_path
        )
    finally:
        stop.set()
        if follower:
            follower.join(timeout=5)


def _follow(path: Path, stop: threading.Event) -> None:
    """Print the run's log as it grows (the per-step metric lines of verl's console logger among it)."""
    with open(path, errors="replace") as f:
        while True:
            line = f.readline()
            if line:
                sys.stdout.write(line)
                sys.stdout.flush()
            elif stop.is_set():
                break
            else:
                time.sleep(0.2)


def read_metrics(output_dir: str | Path) -> list[dict]:
    """The per-step metric dicts verl's file logger wrote (one JSON line per step)."""
    path = Path(output_dir) / "metrics.jsonl"
    if not path.exists():
        return []
    rows = []
    for line in path.read_text().splitlines():
        line = line.strip()
        if not line:
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue
        data = row.get("data", row)
        data.setdefault("step", row.get("step"))
        rows.append(data)
    return rows


def summarize(rows: Sequence[dict]) -> str:
    """Reward curve, pool growth and replay activity of a finished run, as text."""
    steps = [r for r in rows if "exgrpo/batch_pass_rate" in r]
    if not steps:
        return "no training steps were logged"
    lines = ["step  pass_rate  pool_traj  pool_q  retired  replayed  mixed  replayed_tokens"]
    for r in steps:
        lines.append(
            f"{int(r.get('step') or r.get('training/global_step', 0)):>4}  {r['exgrpo/batch_pass_rate']:>9.3f}  "
            f"{int(r.get('exgrpo/pool/entries', 0)):>9}  {int(r.get('exgrpo/pool/questions', 0)):>6}  "
            f"{int(r.get('exgrpo/pool/retired', 0)):>7}  {int(r.get('exgrpo/replayed_questions', 0)):>8}  "
            f"{int(r.get('exgrpo/mixed', 0)):>5}  {int(r.get('actor/exgrpo/replayed_tokens', 0)):>15}"
        )
    val_key = next((k for r in rows for k in r if k.startswith("val-core/") and "/acc/mean@" in k), None)
    validation = [(int(r.get("step") or 0), r[val_key]) for r in rows if val_key and val_key in r]
    first, last = steps[0], steps[-1]
    n = max(1, len(steps) // 4)
    early = sum(r["exgrpo/batch_pass_rate"] for r in steps[:n]) / n
    late = sum(r["exgrpo/batch_pass_rate"] for r in steps[-n:]) / n
    replayed = sum(int(r.get("exgrpo/replayed_questions", 0)) for r in steps)
    switch = next((r.get("step") for r in steps if r.get("exgrpo/mixed")), None)
    lines += [
        "",
        f"reward: batch pass rate {early:.3f} (first {n} steps) -> {late:.3f} (last {n} steps)",
        f"pool: {int(last.get('exgrpo/pool/entries', 0))} trajectories of "
        f"{int(last.get('exgrpo/pool/questions', 0))} questions, {int(last.get('exgrpo/pool/retired', 0))} retired "
        f"(started at {int(first.get('exgrpo/pool/entries', 0))})",
        f"replay: mixed mode from step {switch}; {replayed} replayed questions in total",
        "(the batch pass rate counts the replayed members, and it drifts down as solved questions retire and stop "
        "being drawn: validation accuracy is the learning curve)",
    ]
    if validation:
        lines.append("validation accuracy (" + val_key + "): " + ", ".join(f"step {s}: {v:.3f}" for s, v in validation))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--out", default=str(REPO_ROOT / "outputs" / "cpu_demo"))
    parser.add_argument("--onpolicy", action="store_true", help="plain on-policy GRPO (exgrpo.enable=false)")
    parser.add_argument("--test-freq", type=int, default=10, help="validate every N steps and before training (0: off)")
    parser.add_argument("--wall-limit", type=float, default=1500.0, help="hard wall-clock limit in seconds")
    parser.add_argument("overrides", nargs="*", help="extra hydra overrides, e.g. exgrpo.replay_ratio=0.25")
    args = parser.parse_args(argv)
    out = Path(args.out)
    if (out / "metrics.jsonl").exists():
        (out / "metrics.jsonl").unlink()
    from recipe.exgrpo.cpu.assets import ensure_assets

    t0 = time.time()
    print("[demo] building/reusing the tiny model and toy data (cached after the first run) ...", flush=True)
    assets = ensure_assets()
    print(f"[demo] assets ready in {time.time() - t0:.0f} s: {assets.root} (warm-up pass rate "
          f"{assets.report.get('pass_rate', float('nan')):.2f})", flush=True)
    run = ExGRPOCpuRun(
        output_dir=out, steps=args.steps, exgrpo_enable=not args.onpolicy, wall_limit_s=args.wall_limit,
        test_freq=args.test_freq, val_before_train=args.test_freq > 0, extra_overrides=list(args.overrides),
    )
    result = launch(run, assets)
    print("\n" + "=" * 100)
    print(summarize(read_metrics(out)))
    print(f"\nwall time {result.wall_seconds:.0f} s, peak RSS {result.peak_rss_bytes / 2**30:.2f} GiB, "
          f"log: {result.log_path}, metrics: {out / 'metrics.jsonl'}")
    if result.timed_out:
        print(f"[demo] the run hit its wall-clock limit ({args.wall_limit:.0f} s)", file=sys.stderr)
        return 124
    return int(result.returncode or 0)


if __name__ == "__main__":
    sys.exit(main())
