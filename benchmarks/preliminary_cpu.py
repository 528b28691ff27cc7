"""The paper's preliminary study (its §3) in miniature, on the procedure-choice task: what makes an experience useful.

    python benchmarks/preliminary_cpu.py [--out outputs/preliminary_cpu] [--parts entropy,buckets]
        [--seeds 1,2,3] [--samples 8]

Two parts, on the warmed-up model of the procedure-choice task (recipe/exgrpo/harness/procedure_task.py):

- ``entropy``: every validation question sampled ``--samples`` times at T = 1 in process; the mean token entropy of
  each response (the entropy of the full next-token distribution at each of its own tokens, averaged over them:
  the recipe's trajectory metric, docs/algorithm.md §5), compared between correct and incorrect responses, per level
  and per announced procedure. The paper finds correct responses lower in entropy, and the lower-entropy correct
  ones the better reasoning.
- ``buckets``: the training questions cut by the warmed-up model's success count over ``--samples`` samples (the
  paper's online rollout correctness): hard k/K in (0, 0.25], medium (0.25, 0.75], easy (0.75, 1]; on-policy GRPO
  trained on one bucket's questions only (the CPU demo's settings otherwise, ``--seeds`` each), validated on every
  level. The paper finds the medium bucket the best training material.

The third question of the study, whether low-entropy correct trajectories make better replay material than high-
entropy ones, is the Table 6 row "highest-entropy trajectory": ``python benchmarks/learning_cpu.py --task
procedures --arms exgrpo,exgrpo_highest_entropy``.

Outputs in ``--out``: ``entropy.md`` and ``entropy.csv`` (one row per response), ``buckets/<bucket>_seed<s>/`` (each
run), ``buckets.md``, ``buckets.png``. Finished runs are reused (``--fresh`` re-runs them). The figures and their
reading are in docs/learning.md ("Where replay helps").
"""

from __future__ import annotations

import csv
import json
import math
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script: the repository first

from benchmarks.common import (  # noqa: E402
    add_run_folder,
    argument_parser,
    comma_list,
    git_revision,
    host,
    run_stoppable,
)

PARTS = ("entropy", "buckets")
SEEDS = (1, 2, 3)
SAMPLES = 8
#: the buckets of the training questions by the warmed-up model's success rate k/K: (low, high] of each
BUCKETS = {"hard": (0.0, 0.25), "medium": (0.25, 0.75), "easy": (0.75, 1.0)}


def bucket_of(successes: int, samples: int) -> str | None:
    """The bucket of a question solved ``successes`` times of ``samples`` (None: never solved)."""
    rate = successes / samples
    return next((name for name, (low, high) in BUCKETS.items() if low < rate <= high), None)


def sample_with_entropy(model, tokenizer, rows: list[dict], samples: int, max_new_tokens: int, seed: int = 0):
    """``samples`` rounds of one response per row at T = 1: (text, mean token entropy) per row, round by round."""
    import torch
    from transformers import GenerationConfig

    from recipe.exgrpo.harness.assets import left_padded_prompts

    torch.manual_seed(seed)
    input_ids, attention_mask = left_padded_prompts(tokenizer, rows)
    width, pad, eos = input_ids.shape[1], tokenizer.pad_token_id, tokenizer.eos_token_id
    config = GenerationConfig(
        max_new_tokens=max_new_tokens,
        do_sample=True,
        temperature=1.0,
        top_p=1.0,
        top_k=0,
        eos_token_id=[eos, pad],
        pad_token_id=pad,
        bos_token_id=None,
    )
    rounds = []
    with torch.no_grad():
        for _ in range(samples):
            out = model.generate(
                input_ids=input_ids,
                attention_mask=attention_mask,
                generation_config=config,
                output_logits=True,
                return_dict_in_generate=True,
            )
            tokens = out.sequences[:, width:]
            logits = torch.stack(out.logits, dim=1).float()  # (rows, steps, vocab), the unprocessed logits
            logp = torch.log_softmax(logits, dim=-1)
            entropy = -(logp.exp() * logp).sum(-1)  # (rows, steps)
            # a response's own tokens: up to and including its first end-of-turn (or pad) token
            ended = (tokens == eos) | (tokens == pad)
            before_end = torch.cumsum(ended.int(), dim=1) - ended.int() == 0
            n = before_end.sum(1).clamp(min=1)
            mean_entropy = (entropy * before_end).sum(1) / n
            texts = tokenizer.batch_decode(tokens, skip_special_tokens=True)
            rounds.append(list(zip(texts, mean_entropy.tolist(), strict=True)))
    return rounds


def entropy_part(assets, out: Path, samples: int) -> str:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from data_preprocess.toy_arithmetic import generate_splits
    from recipe.exgrpo.harness.procedure_task import PROCEDURE_DATA, procedure_of, score_sample

    tokenizer = AutoTokenizer.from_pretrained(assets.model_path)
    model = AutoModelForCausalLM.from_pretrained(assets.model_path).eval()
    rows = generate_splits(PROCEDURE_DATA)["val"]
    rounds = sample_with_entropy(model, tokenizer, rows, samples, max_new_tokens=32)
    records = []
    for j, responses in enumerate(rounds):
        for row, (text, h) in zip(rows, responses, strict=True):
            scored = score_sample(text, row["reward_model"]["ground_truth"])
            level = row["extra_info"]["difficulty"]
            records.append(
                {
                    "level": level,
                    "question_id": row["extra_info"]["question_id"],
                    "sample": j,
                    "procedure": procedure_of(text) or "other",
                    "correct": int(scored["correct"]),
                    "entropy": h,
                    "response": text,
                }
            )
    with open(out / "entropy.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(records[0]))
        writer.writeheader()
        writer.writerows(records)

    def cell(items: list[dict]) -> str:
        values = [r["entropy"] for r in items]
        if not values:
            return "—"
        std = statistics.stdev(values) if len(values) > 1 else 0.0
        return f"{statistics.fmean(values):.3f} ± {std:.3f} (n={len(values)})"

    lines = [
        "| level | procedure | correct | incorrect |",
        "|---|---|---|---|",
    ]
    for level in ("easy", "medium", "hard", "all"):
        at = [r for r in records if level in ("all", r["level"])]
        for procedure in ("any", "careful", "quick"):
            mine = [r for r in at if procedure in ("any", r["procedure"])]
            right = [r for r in mine if r["correct"]]
            wrong = [r for r in mine if not r["correct"]]
            lines.append(f"| {level} | {procedure} | {cell(right)} | {cell(wrong)} |")
    # within a question: do its correct responses differ at all (what the trajectory selection chooses between)?
    by_question: dict[str, list[dict]] = {}
    for r in records:
        if r["correct"]:
            by_question.setdefault(r["question_id"], []).append(r)
    several = [rs for rs in by_question.values() if len(rs) > 1]
    distinct = [rs for rs in several if len({r["response"] for r in rs}) > 1]
    spread = [max(r["entropy"] for r in rs) - min(r["entropy"] for r in rs) for rs in distinct]
    text = (
        f"Mean token entropy of {samples} samples per validation question of the warmed-up model (T = 1), assets "
        f"{assets.root.name}; commit {git_revision()}; {host()}\n\n" + "\n".join(lines) + "\n\n"
        f"questions with more than one correct response: {len(several)}; of them with two different correct "
        f"responses (something for the trajectory selection to choose between): {len(distinct)}; the spread of "
        f"their correct responses' entropies: median {statistics.median(spread) if spread else math.nan:.3f}\n"
    )
    (out / "entropy.md").write_text(text)
    return text


def success_counts_of_training_questions(assets, samples: int) -> dict[str, int]:
    import pyarrow.parquet as pq
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from recipe.exgrpo.harness.assets import sampled_responses
    from recipe.exgrpo.harness.procedure_task import score_sample

    tokenizer = AutoTokenizer.from_pretrained(assets.model_path)
    model = AutoModelForCausalLM.from_pretrained(assets.model_path).eval()
    rows = pq.read_table(assets.train_file).to_pylist()
    rounds = sampled_responses(model, tokenizer, rows, samples, temperature=1.0, max_new_tokens=32)
    counts = {}
    for i, row in enumerate(rows):
        truth = row["reward_model"]["ground_truth"]
        counts[row["extra_info"]["question_id"]] = sum(score_sample(r[i], truth)["correct"] for r in rounds)
    return counts


def bucket_assets(assets, out: Path, counts: dict[str, int], samples: int):
    """Per bucket, an asset folder whose training split holds that bucket's questions only (links to the rest)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from recipe.exgrpo.harness.assets import Assets

    table = pq.read_table(assets.train_file)
    ids = [e["question_id"] for e in table.column("extra_info").to_pylist()]
    made = {}
    for name in BUCKETS:
        keep = [i for i, q in enumerate(ids) if bucket_of(counts[q], samples) == name]
        root = out / "assets" / name
        (root / "data").mkdir(parents=True, exist_ok=True)
        pq.write_table(table.take(pa.array(keep)), root / "data" / "train.parquet")
        for link, target in ((root / "model", assets.model_path), (root / "data" / "val.parquet", assets.val_file)):
            if not link.exists():
                link.symlink_to(target)
        made[name] = (Assets(root), len(keep))
    return made


def buckets_part(assets, out: Path, samples: int, seeds: list[int], fresh: bool) -> str:
    from recipe.exgrpo.harness.demo import DEMO_SETTINGS, demo_run, launch_or_reuse
    from recipe.exgrpo.harness.learning_curves import (
        level_table,
        markdown_table,
        plot_levels,
        run_curve,
        summarize_arms,
    )
    from recipe.exgrpo.harness.procedure_task import PROCEDURE_RUN_SETTINGS

    counts_file = out / "train_success_counts.json"
    if counts_file.exists():
        counts = json.loads(counts_file.read_text())
    else:
        counts = success_counts_of_training_questions(assets, samples)
        counts_file.write_text(json.dumps(counts, indent=0) + "\n")
    made = bucket_assets(assets, out, counts, samples)
    curves: dict[str, list] = {}
    for seed in seeds:
        for name, (bucket, size) in made.items():
            run = demo_run(
                out / "buckets" / f"{name}_seed{seed}",
                seed=seed,
                exgrpo_enable=False,
                **PROCEDURE_RUN_SETTINGS,
            )
            res = launch_or_reuse(run, bucket, f"preliminary {name} seed {seed}", fresh, bucket=name, questions=size)
            label = f"GRPO on {name} ({size} q)"
            curves.setdefault(label, []).append(
                run_curve(res["rows"], f"{label} seed {seed}", wall_seconds=res["wall_seconds"], group_size=8)
            )
    sizes = {name: size for name, (_, size) in made.items()}
    never = sum(c == 0 for c in counts.values())
    cuts = ", ".join(f"{n} {lo} < k/K <= {hi}" for n, (lo, hi) in BUCKETS.items())
    header = (
        f"On-policy GRPO trained on one bucket of the procedure task's training questions, cut by the warmed-up "
        f"model's success count over {samples} samples ({cuts}; questions per bucket {sizes}, never solved "
        f"{never}); the demo's settings ({DEMO_SETTINGS['steps']} "
        f"steps, an epoch is the bucket's questions), seeds {seeds}; validated on all 384 questions; assets "
        f"{assets.root.name}; commit {git_revision()}; {host()}\n\n"
    )
    table = markdown_table(summarize_arms(curves, target=0.6), target=0.6)
    table += "\nper level:\n\n" + level_table(curves)
    (out / "buckets.md").write_text(header + table)
    plot_levels(curves, out / "buckets.png", title="GRPO on one bucket of questions (procedure task)")
    return header + table


def main(argv: list[str] | None = None) -> int:
    parser = argument_parser(__doc__)
    add_run_folder(parser, "preliminary_cpu")
    parser.add_argument("--parts", default=",".join(PARTS), help=f"comma-separated subset of {', '.join(PARTS)}")
    parser.add_argument("--seeds", default=",".join(map(str, SEEDS)), help="seeds of the bucket runs (default 1,2,3)")
    parser.add_argument("--samples", type=int, default=SAMPLES, help="samples per question (K; default 8)")
    args = parser.parse_args(argv)
    parts = comma_list(args.parts)
    if bad := [p for p in parts if p not in PARTS]:
        parser.error(f"--parts: unknown {bad}; choose from {list(PARTS)}")
    if args.samples < 2:
        parser.error(f"--samples must be at least 2, got {args.samples}")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    from recipe.exgrpo.harness.assets import asset_spec, ensure_assets

    assets = ensure_assets(asset_spec(procedures=True))
    if "entropy" in parts:
        print(entropy_part(assets, out, args.samples), flush=True)
    if "buckets" in parts:
        print(buckets_part(assets, out, args.samples, comma_list(args.seeds, int), args.fresh), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(run_stoppable(main, "preliminary_cpu"))
