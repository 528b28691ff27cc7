"""The evaluation with tools on CPU: the calculator task's model, evaluated with its tool and without it, side by side
(``CPU=1 bash scripts/eval/eval_tir.sh``, or ``python -m recipe.exgrpo.harness.tool_eval_cpu``).

The model is the one ``python -m recipe.exgrpo.harness.assets --tools`` builds (built here when the cache lacks it,
minutes); the questions its validation set's (easy, medium, hard sums, 128 each). "With the tool" is
``python -m recipe.exgrpo.tool_eval run`` on the tool settings of the calculator task's training run (the ``--tools``
demo's overrides: verl's tool agent loop with the calculator, one call and one answer turn, 128 response tokens);
"without" is ``python -m exgrpo.eval run`` on the same model, the same questions, sampling and response length, one
turn, no tool. Both graded by the training reward's rule (``--grading reward``, the think gate on), at the demo's
validation temperature (1.0). Prints one line per level and writes ``OUT/comparison.json``.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from recipe.exgrpo.harness.assets import asset_spec, ensure_assets
from recipe.exgrpo.harness.demo import build_overrides, demo_run, tool_run

REPO = Path(__file__).resolve().parents[3]


def training_overrides(rollout: str, model: Path, train: Path, val: Path, out: Path) -> list[str]:
    """The calculator task's training run (the ``--tools`` demo on ``rollout``), as hydra overrides."""
    return build_overrides(tool_run(demo_run(out / "training", rollout=rollout)), str(model), str(train), str(val))


def run_both(args: argparse.Namespace) -> dict[str, Any]:
    assets = ensure_assets(asset_spec(args.backend, tools=True))
    out = Path(args.out)
    overrides = training_overrides(args.backend, assets.model_path, assets.train_file, assets.val_file, out)
    common = [
        "--model", str(assets.model_path), "--data", str(assets.val_file), "--backend", args.backend,
        "--temperature", str(args.temperature), "--top-p", "1.0", "--seed", str(args.seed),
        "--n-samples", str(args.n_samples), "--grading", "reward", "--think-gate", "--reference", "none",
        "--keep-system-prompt", "--no-plot", "--no-progress", "--batch-size", str(args.batch_size),
    ]  # fmt: skip
    if args.max_questions_per_source:
        common += ["--max-questions-per-source", str(args.max_questions_per_source)]
    with_tool = [sys.executable, "-m", "recipe.exgrpo.tool_eval", "run", *common, "--out", str(out / "with_tool")]
    with_tool += ["--label", "with the calculator", "--training-overrides", *overrides]
    results = {}
    for name, cmd in (("with_tool", with_tool), ("without_tool", None)):
        if cmd is None:
            from recipe.exgrpo.tool_eval.settings import settings_from_training

            length = settings_from_training(overrides).response_length  # the exchange's length, for one turn
            cmd = [sys.executable, "-m", "exgrpo.eval", "run", *common, "--out", str(out / name)]
            cmd += ["--label", "without a tool", "--max-new-tokens", str(length)]
        print(f"[tool_eval_cpu] {name}: {' '.join(cmd[:4])} ...", file=sys.stderr, flush=True)
        subprocess.run(cmd, cwd=REPO, check=True, stdout=subprocess.DEVNULL)
        results[name] = json.loads((out / name / "results.json").read_text())
    return results


def comparison(results: dict[str, Any]) -> list[dict[str, Any]]:
    rows = []
    with_tool, without = results["with_tool"]["benchmarks"], results["without_tool"]["benchmarks"]
    for bench in sorted(with_tool):
        w, o = with_tool[bench], without[bench]
        t = w.get("tools") or {}
        rows.append(
            {
                "benchmark": bench,
                "questions": w["num_questions"],
                "samples": w["num_samples"],
                "accuracy_with_tool": w["score"],
                "accuracy_without_tool": o["score"],
                "answers_with_call": t.get("answers_with_call"),
                "calls_per_answer": t.get("calls_per_answer"),
                "tool_errors": t.get("tool_errors"),
                "turns_per_answer": t.get("turns_per_answer"),
                "accuracy_with_call": t.get("accuracy_with_call"),
                "accuracy_without_call": t.get("accuracy_without_call"),
            }
        )
    return rows


def _pct(value: float | None) -> str:
    return "—" if value is None else f"{value:.1f}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backend", choices=("hf", "vllm"), default="hf", help="vllm: the vLLM CPU stack's python")
    parser.add_argument("--out", default=str(REPO / "outputs" / "eval_tir_cpu"))
    parser.add_argument("--n-samples", type=int, default=1, help="samples per question")
    parser.add_argument("--max-questions-per-source", type=int, help="the first N questions of each level")
    parser.add_argument("--temperature", type=float, default=1.0, help="the demo's validation temperature")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--batch-size", type=int, default=128, help="answers generated at once (the tiny model's are cheap)"
    )
    args = parser.parse_args(argv)
    out = Path(args.out) / args.backend
    args.out = str(out)
    rows = comparison(run_both(args))
    (out / "comparison.json").write_text(json.dumps(rows, indent=2))
    print(f"calculator task, {args.backend} backend, T = {args.temperature:g}, {args.n_samples} sample(s) per question")
    print(f"{'level':24s} {'with tool':>9s} {'without':>8s} {'calls':>6s} {'errors':>6s} {'turns':>5s}  calling / not")
    for r in rows:
        share = r["answers_with_call"] or 0.0
        calling, not_calling = (_pct(r["accuracy_with_call"]), _pct(r["accuracy_without_call"]))
        with_tool, without = r["accuracy_with_tool"], r["accuracy_without_tool"]
        print(
            f"{r['benchmark']:24s} {with_tool:9.1f} {without:8.1f} {100 * share:5.1f}% {int(r['tool_errors'] or 0):6d} "
            f"{r['turns_per_answer'] or 0:5.2f}  {calling} / {not_calling}"
        )
    print(f"details: {out}/with_tool/table.md, {out}/without_tool/table.md, {out}/comparison.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
