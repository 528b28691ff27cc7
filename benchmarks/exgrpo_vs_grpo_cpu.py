"""ExGRPO vs on-policy GRPO seconds per step on the same tiny CPU config, in one run, side by side.

    python benchmarks/exgrpo_vs_grpo_cpu.py [--steps 12] [--repeats 3] [--out outputs/bench_exgrpo_vs_grpo]

Both arms run the real verl trainer through ``recipe.exgrpo.main_exgrpo`` (on-policy = ``exgrpo.enable=false``)
with the same model, data, batch and seed. Replay starts at step 1 (delayed start off) so every measured ExGRPO
step after the first carries replayed questions. The arms alternate (GRPO, ExGRPO, GRPO, ...) ``--repeats`` times so
that a slow phase of a shared machine hits both. Per run: the mean seconds per step over the steps after the first
two (start-up and compilation excluded); per arm: the median over its runs of that mean, and of the old-log-prob
pass (which, for ExGRPO, also scores the candidate trajectories), generation, the other ExGRPO bookkeeping, the
actor forward calls per step, start-up and peak RSS; then the ratio ExGRPO / GRPO of the medians. The paper's
release costs +19.0% per step at 7B on 8×H100 (Table 8).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

from recipe.exgrpo.cpu_demo import ExGRPOCpuRun, launch, read_metrics  # noqa: E402

#: ExGRPO's own timers besides the old-log-prob pass (sampling + candidate gathering, selection from the pass's
#: figures, the replayed members' reward, collection)
EXGRPO_TIMERS = ("exgrpo_sample", "exgrpo_select", "exgrpo_replay_reward", "exgrpo_collect")


def run_once(name: str, enable: bool, steps: int, out: Path, assets) -> dict:
    run = ExGRPOCpuRun(
        output_dir=out,
        steps=steps,
        exgrpo_enable=enable,
        delayed_start_threshold=-1.0,
        wall_limit_s=1200,
        ray_temp_dir=tempfile.mkdtemp(prefix="exgb-", dir="/tmp"),
    )
    result = launch(run, assets, echo=False)
    if result.returncode != 0:
        print(result.log_tail(), file=sys.stderr)
        raise SystemExit(f"{name} run failed (exit {result.returncode}); log: {result.log_path}")
    rows = [r for r in read_metrics(out) if "timing_s/step" in r]
    measured = rows[2:] if len(rows) > 3 else rows[1:]

    def mean(key: str) -> float:
        return statistics.mean(float(r.get(key, 0.0)) for r in measured)

    return {
        "s_per_step": mean("timing_s/step"),
        "gen_s": mean("timing_s/gen"),
        "old_log_prob_s": mean("timing_s/old_log_prob"),
        "other_exgrpo_s": statistics.mean(
            sum(float(r.get(f"timing_s/{t}", 0.0)) for t in EXGRPO_TIMERS) for r in measured
        ),
        "actor_calls": mean("exgrpo/actor_log_prob_calls"),
        "candidate_rows": mean("exgrpo/old_log_prob_candidate_rows"),
        "replayed_per_step": mean("exgrpo/replayed_questions"),
        "startup_s": result.wall_seconds - sum(r["timing_s/step"] for r in rows),
        "peak_rss_gib": result.peak_rss_bytes / 2**30,
        "steps_measured": len(measured),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=12, help="training steps per run (the first two not measured)")
    parser.add_argument("--repeats", type=int, default=3, help="runs per arm, alternating the arms")
    parser.add_argument("--out", default=str(REPO_ROOT / "outputs" / "bench_exgrpo_vs_grpo"))
    args = parser.parse_args(argv)
    from recipe.exgrpo.cpu.assets import ensure_assets

    assets = ensure_assets()
    out = Path(args.out)
    runs: dict[str, list[dict]] = {"grpo": [], "exgrpo": []}
    for rep in range(args.repeats):
        for name, enable in (("grpo", False), ("exgrpo", True)):
            r = run_once(name, enable, args.steps, out / f"{name}_{rep}", assets)
            runs[name].append(r)
            print(f"[bench] {name} run {rep + 1}/{args.repeats}: {r['s_per_step']:.3f} s/step", flush=True)

    def med(name: str, key: str) -> float:
        return statistics.median(r[key] for r in runs[name])

    cols = [
        ("s/step", "s_per_step", 9, 3),
        ("gen s", "gen_s", 8, 3),
        ("old-log-prob s", "old_log_prob_s", 16, 3),
        ("other exgrpo s", "other_exgrpo_s", 16, 3),
        ("actor calls", "actor_calls", 13, 1),
        ("cand. rows", "candidate_rows", 12, 1),
        ("replayed", "replayed_per_step", 10, 1),
        ("start-up s", "startup_s", 12, 1),
        ("peak RSS GiB", "peak_rss_gib", 14, 2),
    ]
    print(f"\nmedians over {args.repeats} runs per arm, {runs['grpo'][0]['steps_measured']} steps measured per run")
    print(f"{'arm':<8}" + "".join(f"{title:>{width}}" for title, _, width, _ in cols))
    for name in runs:
        print(f"{name:<8}" + "".join(f"{med(name, key):>{width}.{dp}f}" for _, key, width, dp in cols))
    print("per-run s/step: " + "; ".join(f"{n}: " + ", ".join(f"{r['s_per_step']:.3f}" for r in runs[n]) for n in runs))
    ratio = med("exgrpo", "s_per_step") / med("grpo", "s_per_step")
    print(
        f"\nExGRPO / GRPO seconds per step (medians): {ratio:.3f} ({(ratio - 1) * 100:+.1f}%); "
        f"paper's release at 7B: +19.0%."
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
