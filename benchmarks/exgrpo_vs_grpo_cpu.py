"""ExGRPO vs on-policy GRPO seconds per step on the same tiny CPU config, in one run, side by side.

    python benchmarks/exgrpo_vs_grpo_cpu.py [--steps 12] [--repeats 3] [--out outputs/bench_exgrpo_vs_grpo]
    python benchmarks/exgrpo_vs_grpo_cpu.py --rollout vllm [--vllm-python .venv-vllm/bin/python] [--repeats 2]
    python benchmarks/exgrpo_vs_grpo_cpu.py --trainer both [--rollout vllm]   # verl's legacy and v1 trainers
    python benchmarks/exgrpo_vs_grpo_cpu.py --trainer v1 --mode both --rollout vllm   # v1's sync and colocate_async
    python benchmarks/exgrpo_vs_grpo_cpu.py --trainer v1 --mode all --rollout vllm    # and separate_async

Both arms run the real verl trainer through ``recipe.exgrpo.main_exgrpo`` (on-policy = ``exgrpo.enable=false``)
with the same model, data, batch and seed. Replay starts at step 1 (delayed start off) so every measured ExGRPO
step after the first carries replayed questions. The arms alternate (GRPO, ExGRPO, GRPO, ...) ``--repeats`` times so
that a slow phase of a shared machine hits both. Steps after the first two of each run are measured (start-up and
compilation excluded). Per arm, over all its measured steps pooled: the MEDIAN seconds per step (the headline: on a
shared 2-core machine single steps spike 3-10x when other jobs run, and a median ignores the spikes) and the mean,
and the medians of generation, the old-log-prob pass (which, for ExGRPO, also scores the candidate trajectories),
the actor update and ExGRPO's own bookkeeping; the actor forward calls per step, start-up and peak RSS. Then the
ratio ExGRPO / GRPO of the median step times. The paper's release costs +19.0% per step at 7B on 8×H100 (Table 8).

``--rollout vllm`` runs both arms on verl's vLLM rollout (the vLLM CPU stack of ``scripts/setup_env.sh --vllm``, its
head-32 tiny model): the closer stand-in for a GPU step, where the generation that replay saves (K-1 instead of K
samples for a replayed question) goes through the real engine. ``--trainer v1`` runs both arms on verl's v1 trainer
(``trainer.use_v1=true``); ``--trainer both`` runs the four arms (GRPO and ExGRPO on each trainer) alternating, and
prints the table and the ratio per trainer. ``--mode colocate_async`` runs the v1 arms in verl's asynchronous
``colocate_async`` mode (docs/algorithm.md §15; verl's defaults: one warm-up batch ahead, staleness bound 8);
``--mode both`` runs each v1 arm in both modes, and prints the async / sync ratios too; ``--mode separate_async`` (or
``all``: the three modes) runs them in verl's ``separate_async`` mode, the rollout on a logical GPU of its own fed by
the CPU backend's checkpoint engine, ``--parameter-sync-step`` local updates a step (default 2). Every arm also
reports steps per minute (from the median step) and generated tokens per second (the model tokens of the generated
rows the update trained on, ``actor/exgrpo/fresh_tokens``, over the measured steps' seconds).
"""

from __future__ import annotations

import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script: the repository first

from benchmarks.common import REPO, VLLM_PYTHON, argument_parser, run_stoppable, vllm_python  # noqa: E402
from recipe.exgrpo.harness.demo import ExGRPOCpuRun, launch, read_metrics, separate_async_settings  # noqa: E402

#: ExGRPO's own timers besides the old-log-prob pass (sampling + candidate gathering, selection from the pass's
#: figures, the replayed members' reward, collection)
EXGRPO_TIMERS = ("exgrpo_sample", "exgrpo_select", "exgrpo_replay_reward", "exgrpo_collect")


PER_STEP = {
    "step_s": "timing_s/step",
    "gen_s": "timing_s/gen",
    "old_log_prob_s": "timing_s/old_log_prob",
    "update_s": "timing_s/update_actor",
    "actor_calls": "exgrpo/actor_log_prob_calls",
    "candidate_rows": "exgrpo/old_log_prob_candidate_rows",
    "replayed": "exgrpo/replayed_questions",
    "gen_tokens": "actor/exgrpo/fresh_tokens",
}


def run_once(
    name: str,
    enable: bool,
    steps: int,
    out: Path,
    assets,
    rollout: str = "hf",
    python: str | None = None,
    trainer: str = "legacy",
    mode: str = "sync",
    parameter_sync_step: int = 2,
) -> dict:
    """One training run; returns its measured steps' figures (lists, one value per step) and run totals."""
    if mode == "separate_async":
        shape = separate_async_settings(parameter_sync_step)
    else:
        shape = {"extra_overrides": [] if mode == "sync" else [f"trainer.v1.trainer_mode={mode}"]}
    run = ExGRPOCpuRun(
        output_dir=out,
        steps=steps,
        exgrpo_enable=enable,
        delayed_start_threshold=-1.0,
        wall_limit_s=1800 if rollout == "vllm" else 1200,
        ray_temp_dir=tempfile.mkdtemp(prefix="exgb-", dir="/tmp"),
        rollout=rollout,
        python=python,
        trainer=trainer,
        **shape,
    )
    result = launch(run, assets, echo=False)
    if result.returncode != 0:
        print(result.log_tail(), file=sys.stderr)
        raise SystemExit(f"{name} run failed (exit {result.returncode}); log: {result.log_path}")
    rows = [r for r in read_metrics(out) if "timing_s/step" in r]
    measured = rows[2:] if len(rows) > 3 else rows[1:]
    per_step = {key: [float(r.get(metric, 0.0)) for r in measured] for key, metric in PER_STEP.items()}
    per_step["exgrpo_s"] = [sum(float(r.get(f"timing_s/{t}", 0.0)) for t in EXGRPO_TIMERS) for r in measured]
    return {
        **per_step,
        "startup_s": result.wall_seconds - sum(r["timing_s/step"] for r in rows),
        "peak_rss_gib": result.peak_rss_bytes / 2**30,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argument_parser(__doc__)
    parser.add_argument("--steps", type=int, default=22, help="training steps per run (the first two not measured)")
    parser.add_argument("--repeats", type=int, default=3, help="runs per arm, alternating the arms")
    parser.add_argument("--out", default=None, help="default outputs/bench_exgrpo_vs_grpo[_vllm]")
    parser.add_argument("--rollout", choices=("hf", "vllm"), default="hf", help="the rollout both arms run on")
    parser.add_argument(
        "--trainer",
        choices=("legacy", "v1", "both"),
        default="legacy",
        help="verl's trainer the arms run on (both: GRPO and ExGRPO on each)",
    )
    parser.add_argument(
        "--mode",
        choices=("sync", "colocate_async", "separate_async", "both", "all"),
        default="sync",
        help="the v1 trainer's mode (--trainer v1; both: each arm in sync and colocate_async; all: and separate_async)",
    )
    parser.add_argument(
        "--parameter-sync-step", type=int, default=2, help="separate_async: local updates a step (divides the batch)"
    )
    parser.add_argument(
        "--vllm-python",
        default=str(VLLM_PYTHON),
        help="the interpreter of the vLLM CPU stack (--rollout vllm)",
    )
    args = parser.parse_args(argv)
    from recipe.exgrpo.harness.assets import asset_spec, ensure_assets

    python = vllm_python(args.vllm_python) if args.rollout == "vllm" else None
    assets = ensure_assets(asset_spec(args.rollout))
    suffix = "_vllm" if args.rollout == "vllm" else ""
    out = Path(args.out or REPO / "outputs" / f"bench_exgrpo_vs_grpo{suffix}")
    trainers = ("legacy", "v1") if args.trainer == "both" else (args.trainer,)
    modes = {"both": ("sync", "colocate_async"), "all": ("sync", "colocate_async", "separate_async")}.get(
        args.mode, (args.mode,)
    )
    if modes != ("sync",) and trainers != ("v1",):
        parser.error(f"--mode {args.mode} runs on verl's v1 trainer only: add --trainer v1")
    if "separate_async" in modes and (
        args.parameter_sync_step < 1 or ExGRPOCpuRun.train_batch_size % args.parameter_sync_step
    ):
        parser.error(
            f"--parameter-sync-step {args.parameter_sync_step} must divide the batch of {ExGRPOCpuRun.train_batch_size}"
        )
    variants = [(tr, m) for tr in trainers for m in modes]

    def suffix_of(tr: str, m: str) -> str:
        parts = ([tr] if len(trainers) > 1 else []) + ([m] if len(modes) > 1 else [])
        return "".join("_" + p for p in parts)

    arms = [
        (f"{name}{suffix_of(tr, m)}", enable, tr, m)
        for tr, m in variants
        for name, enable in (("grpo", False), ("exgrpo", True))
    ]
    runs: dict[str, list[dict]] = {arm: [] for arm, _, _, _ in arms}
    for rep in range(args.repeats):
        for name, enable, trainer, mode in arms:
            r = run_once(
                name, enable, args.steps, out / f"{name}_{rep}", assets, args.rollout, python, trainer, mode,
                args.parameter_sync_step,
            )  # fmt: skip
            runs[name].append(r)
            print(
                f"[bench] {name} run {rep + 1}/{args.repeats}: median {statistics.median(r['step_s']):.3f} s/step",
                flush=True,
            )

    def pooled(name: str, key: str) -> list[float]:
        return [v for r in runs[name] for v in r[key]]

    cols = [
        ("median s/step", lambda n: statistics.median(pooled(n, "step_s")), 15, 3),
        ("mean s/step", lambda n: statistics.mean(pooled(n, "step_s")), 13, 3),
        ("steps/min", lambda n: 60.0 / statistics.median(pooled(n, "step_s")), 11, 1),
        ("gen tok/s", lambda n: sum(pooled(n, "gen_tokens")) / sum(pooled(n, "step_s")), 11, 1),
        ("gen s", lambda n: statistics.median(pooled(n, "gen_s")), 8, 3),
        ("old-log-prob s", lambda n: statistics.median(pooled(n, "old_log_prob_s")), 16, 3),
        ("update s", lambda n: statistics.median(pooled(n, "update_s")), 10, 3),
        ("exgrpo s", lambda n: statistics.median(pooled(n, "exgrpo_s")), 10, 3),
        ("actor calls", lambda n: statistics.mean(pooled(n, "actor_calls")), 13, 2),
        ("cand. rows", lambda n: statistics.mean(pooled(n, "candidate_rows")), 12, 1),
        ("replayed", lambda n: statistics.mean(pooled(n, "replayed")), 10, 1),
        ("start-up s", lambda n: statistics.median(r["startup_s"] for r in runs[n]), 12, 1),
        ("peak RSS GiB", lambda n: max(r["peak_rss_gib"] for r in runs[n]), 14, 2),
    ]
    n_steps = len(next(iter(runs.values()))[0]["step_s"])
    print(
        f"\n{args.rollout} rollout: {args.repeats} runs per arm x {n_steps} measured steps, pooled "
        "(medians unless marked)"
    )
    width = max(8, max(len(n) for n in runs) + 1)
    print(f"{'arm':<{width}}" + "".join(f"{title:>{w}}" for title, _, w, _ in cols))
    for name in runs:
        print(f"{name:<{width}}" + "".join(f"{fn(name):>{w}.{dp}f}" for _, fn, w, dp in cols))
    print(
        "per-run median s/step: "
        + "; ".join(f"{n}: " + ", ".join(f"{statistics.median(r['step_s']):.3f}" for r in runs[n]) for n in runs)
    )
    print()
    for trainer, mode in variants:
        suffix = suffix_of(trainer, mode)
        grpo, exgrpo = f"grpo{suffix}", f"exgrpo{suffix}"
        ratio = statistics.median(pooled(exgrpo, "step_s")) / statistics.median(pooled(grpo, "step_s"))
        mean_ratio = statistics.mean(pooled(exgrpo, "step_s")) / statistics.mean(pooled(grpo, "step_s"))
        where = f"verl's {trainer} trainer" + ("" if mode == "sync" else f" ({mode})")
        print(
            f"ExGRPO / GRPO seconds per step on {where}: {ratio:.3f} (medians; "
            f"{(ratio - 1) * 100:+.1f}%), {mean_ratio:.3f} (means); paper's release at 7B: +19.0%."
        )
    if len(modes) > 1 and "sync" in modes:
        for name in ("grpo", "exgrpo"):
            for mode in modes[1:]:
                sync, async_ = f"{name}_sync", f"{name}_{mode}"
                ratio = statistics.median(pooled(async_, "step_s")) / statistics.median(pooled(sync, "step_s"))
                print(f"{name}: {mode} / sync seconds per step {ratio:.3f} (medians)")
    return 0


if __name__ == "__main__":
    sys.exit(run_stoppable(main, "exgrpo_vs_grpo_cpu"))
