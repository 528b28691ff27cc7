"""ExGRPO vs on-policy GRPO seconds per step on the same tiny CPU config, in one run, side by side.

    python benchmarks/exgrpo_vs_grpo_cpu.py [--steps 8] [--out outputs/bench_exgrpo_vs_grpo]

Both arms run the real verl trainer through ``recipe.exgrpo.main_exgrpo`` (on-policy = ``exgrpo.enable=false``)
with the same model, data, batch and seed. Replay starts at step 1 (delayed start off) so every measured ExGRPO
step after the first carries replayed questions. Reported per arm: mean seconds per step over the steps after
the first two (start-up and compilation excluded), the share of the entropy pass (``timing_s/exgrpo_select``)
and of the other ExGRPO bookkeeping, start-up seconds and peak RSS; then the ratio ExGRPO / GRPO.
The paper's release costs +19.0% per step at 7B on 8×H100 (Table 8).
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

EXGRPO_TIMERS = ("exgrpo_sample", "exgrpo_select", "exgrpo_replay_rows", "exgrpo_collect")


def run_arm(name: str, enable: bool, steps: int, out: Path, assets) -> dict:
    run = ExGRPOCpuRun(
        output_dir=out / name,
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
    rows = [r for r in read_metrics(out / name) if "timing_s/step" in r]
    measured = rows[2:] if len(rows) > 3 else rows[1:]
    step_s = [r["timing_s/step"] for r in measured]
    select_s = [r.get("timing_s/exgrpo_select", 0.0) for r in measured]
    other_s = [sum(r.get(f"timing_s/{t}", 0.0) for t in EXGRPO_TIMERS if t != "exgrpo_select") for r in measured]
    replayed = [r.get("exgrpo/replayed_questions", 0) for r in measured]
    total_step_time = sum(r["timing_s/step"] for r in rows)
    return {
        "arm": name,
        "steps_measured": len(measured),
        "s_per_step": statistics.mean(step_s),
        "s_per_step_stdev": statistics.stdev(step_s) if len(step_s) > 1 else 0.0,
        "entropy_pass_s": statistics.mean(select_s),
        "other_exgrpo_s": statistics.mean(other_s),
        "replayed_per_step": statistics.mean(replayed),
        "startup_s": result.wall_seconds - total_step_time,
        "peak_rss_gib": result.peak_rss_bytes / 2**30,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--out", default=str(REPO_ROOT / "outputs" / "bench_exgrpo_vs_grpo"))
    args = parser.parse_args(argv)
    from recipe.exgrpo.cpu.assets import ensure_assets

    assets = ensure_assets()
    out = Path(args.out)
    results = [run_arm("grpo", False, args.steps, out, assets), run_arm("exgrpo", True, args.steps, out, assets)]
    header = (
        f"{'arm':<8}{'s/step':>9}{'±':>7}{'entropy pass s':>16}{'other exgrpo s':>16}{'replayed/step':>15}"
        f"{'start-up s':>12}{'peak RSS GiB':>14}"
    )
    print(header)
    for r in results:
        print(
            f"{r['arm']:<8}{r['s_per_step']:>9.2f}{r['s_per_step_stdev']:>7.2f}{r['entropy_pass_s']:>16.3f}"
            f"{r['other_exgrpo_s']:>16.3f}{r['replayed_per_step']:>15.1f}{r['startup_s']:>12.1f}"
            f"{r['peak_rss_gib']:>14.2f}"
        )
    grpo, ex = results
    ratio = ex["s_per_step"] / grpo["s_per_step"]
    share = ex["entropy_pass_s"] / ex["s_per_step"]
    print(
        f"\nExGRPO / GRPO seconds per step: {ratio:.3f} ({(ratio - 1) * 100:+.1f}%); entropy pass = {share * 100:.1f}% "
        f"of an ExGRPO step (paper's release at 7B: +19.0%). {ex['steps_measured']} steps measured per arm."
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
