"""The evaluation benchmarks (docs/algorithm.md §12) -> verl parquet, in the format of the released files.

In-distribution: AIME24, AIME25, AMC, MATH-500, Minerva, OlympiadBench; out-of-distribution: ARC-c,
GPQA-Diamond, MMLU-Pro. Each comes from the Hugging Face Hub (``datasets.load_dataset``, when online) or from a
local parquet / jsonl / json file given as ``--input NAME=PATH`` (same columns as the Hub copy).

The rows match the released evaluation files: the released system instruction, the question as the user
message (ARC-c and MMLU-Pro with ``A) option`` lines, GPQA with its ``ANSWER: $LETTER`` instruction), the
released ``data_source`` names (``aime`` is AIME24, ``math`` is MATH-500, ``gpqa`` is GPQA-Diamond), and
``extra_info.index`` = the question's position in its benchmark, shared by its repeated rows.

avg@k: ``--repeat 32`` writes each AIME24 / AIME25 / AMC question 32 times in a row (the avg@32 protocol; the
others stay pass@1), ``--repeat aime24=8,aime25=8,amc=4`` sets k per benchmark (that is the released in-training
validation set), ``--repeat-benchmarks`` changes which benchmarks ``--repeat K`` applies to.

Rows whose ground truth is empty, or that the reward cannot match to itself (math) or that name no listed
option (multiple choice), are dropped and counted; a question occurring twice in one benchmark is an error
(``--drop-duplicates`` keeps its first copy). The files are written all or nothing: every benchmark is built
first, and a failure leaves no output (and no earlier benchmark's file) behind.

    python -m data_preprocess.benchmarks --output-dir data/benchmarks --repeat 32 --combined test_id.parquet \
        --benchmarks aime24,aime25,amc,math500,minerva,olympiad_bench
    python -m data_preprocess.benchmarks --output-dir data/benchmarks --benchmarks math500 \
        --input math500=MATH-500.jsonl

(scripts/prepare_data.sh writes every file the scripts read, at their default paths.)
"""

from __future__ import annotations

import argparse
import hashlib
import random
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tqdm.auto import tqdm

from data_preprocess import hub
from data_preprocess.common import (
    AGENT_NAME_HELP,
    PROMPT_STYLE_HELP,
    PROMPT_STYLES,
    PreprocessError,
    Report,
    agent_name_from_args,
    build_prompt,
    check_output_dir,
    clean_ground_truth,
    duplicate_ids,
    pick_column,
    question_id,
    raise_on_duplicates,
    read_rows,
    self_verifying,
    system_prompt_from_args,
    table_columns,
    verl_row,
    write_verl_parquets,
)

LETTERS = "ABCDEFGHIJ"
# GPQA's user message in the released files (the simple-evals multiple-choice template).
GPQA_INSTRUCTION = (
    "Answer the following multiple choice question. The last line of your response should be of the following "
    "format: 'ANSWER: $LETTER' (without quotes) where LETTER is one of ABCD. Think step by step before answering."
)


@dataclass(frozen=True)
class Benchmark:
    """Where one benchmark comes from and how its rows become (user message, ground truth)."""

    name: str  # command-line name
    data_source: str  # the released files' data_source
    kind: str  # "math" | "arc" | "gpqa" | "mmlu_pro"
    hub_id: str
    hub_config: str | None
    hub_split: str
    avg_at_k: bool  # repeated by --repeat K (docs/algorithm.md §12: AIME24, AIME25, AMC are avg@32)


BENCHMARKS: dict[str, Benchmark] = {
    b.name: b
    for b in (
        Benchmark("aime24", "aime", "math", "HuggingFaceH4/aime_2024", None, "train", True),
        Benchmark("aime25", "aime25", "math", "yentinglin/aime_2025", None, "train", True),
        Benchmark("amc", "amc", "math", "AI-MO/aimo-validation-amc", None, "train", True),
        Benchmark("math500", "math", "math", "HuggingFaceH4/MATH-500", None, "test", False),
        Benchmark("minerva", "minerva", "math", "math-ai/minervamath", None, "test", False),
        Benchmark(
            "olympiad_bench", "olympiad_bench", "math", "Hothan/OlympiadBench", "OE_TO_maths_en_COMP", "train", False
        ),
        Benchmark("arc_c", "arc_c", "arc", "allenai/ai2_arc", "ARC-Challenge", "test", False),
        Benchmark("gpqa_diamond", "gpqa", "gpqa", "Idavidrein/gpqa", "gpqa_diamond", "train", False),
        Benchmark("mmlu_pro", "mmlu_pro", "mmlu_pro", "TIGER-Lab/MMLU-Pro", None, "test", False),
    )
}
AVG_AT_K_DEFAULT = tuple(name for name, b in BENCHMARKS.items() if b.avg_at_k)


@dataclass
class Item:
    """One benchmark question, ready to be written (before repetition)."""

    user: str
    ground_truth: str | None
    source_row: int
    labels: tuple[str, ...] = ()  # option labels shown, for multiple choice


# ------------------------------------------------------------------------------------------------- adapters

MATH_QUESTION_KEYS = ("problem", "question", "Question")
MATH_ANSWER_KEYS = ("answer", "final_answer", "Answer", "ground_truth")


def _math_answer(value: Any) -> str | None:
    # OlympiadBench stores final_answer as a list; several parts are one answer (an ordered tuple), as in the
    # released files ("$(1,8,19), (2,7,13), (4,5,7)$").
    if hasattr(value, "tolist") and not isinstance(value, str):
        value = value.tolist()
    if isinstance(value, list | tuple):
        parts = [p for p in (clean_ground_truth(v) for v in value) if p]
        return ", ".join(parts) if parts and len(parts) == len(value) else None
    return clean_ground_truth(value)


def _options_block(labels: Sequence[str], options: Sequence[Any], sep_after_each: bool) -> str:
    lines = [f"{label}) {option}" for label, option in zip(labels, options, strict=True)]
    # ARC-c / MMLU-Pro rows end every option line with "\n"; GPQA's lines are joined (no final newline).
    return "".join(line + "\n" for line in lines) if sep_after_each else "\n".join(lines)


def _as_list(value: Any) -> list[Any] | None:
    if hasattr(value, "tolist") and not isinstance(value, str):
        value = value.tolist()
    return list(value) if isinstance(value, list | tuple) else None


def adapt_math(rows: list[dict[str, Any]], columns: Sequence[str], source: str, _: int) -> list[Item]:
    qk = pick_column(columns, MATH_QUESTION_KEYS, source, "question")
    ak = pick_column(columns, MATH_ANSWER_KEYS, source, "answer")
    return [Item(r.get(qk) or "", _math_answer(r.get(ak)), i) for i, r in enumerate(rows)]


def adapt_arc(rows: list[dict[str, Any]], columns: Sequence[str], source: str, _: int) -> list[Item]:
    """allenai/ai2_arc rows: ``question``, ``choices`` {``text``, ``label``}, ``answerKey``. Labels are kept as
    given (a few ARC-Challenge questions number their options 1-4)."""
    qk = pick_column(columns, ("question",), source, "question")
    ck = pick_column(columns, ("choices",), source, "choices")
    ak = pick_column(columns, ("answerKey", "answer"), source, "answer")
    items = []
    for i, r in enumerate(rows):
        choices = r.get(ck)
        texts = _as_list(choices.get("text")) if isinstance(choices, Mapping) else None
        labels = _as_list(choices.get("label")) if isinstance(choices, Mapping) else None
        if not texts or not labels or len(texts) != len(labels):
            raise PreprocessError(f"{source}: row {i}: 'choices' must hold equal-length 'text' and 'label' lists")
        user = f"{r.get(qk) or ''}\n\n" + _options_block(labels, texts, sep_after_each=True)
        items.append(Item(user, clean_ground_truth(r.get(ak)), i, labels=tuple(str(x) for x in labels)))
    return items


def adapt_gpqa(rows: list[dict[str, Any]], columns: Sequence[str], source: str, seed: int) -> list[Item]:
    """Idavidrein/gpqa rows (``Question``, ``Correct Answer``, ``Incorrect Answer 1..3``): the four options are
    shuffled by a seed derived from the question and ``--seed`` (reproducible; the released files' own order
    cannot be recovered). Rows that already carry ``options`` (a list) and a letter ``answer`` keep their order."""
    qk = pick_column(columns, ("Question", "question"), source, "question")
    lettered = "options" in columns or "choices" in columns
    items = []
    for i, r in enumerate(rows):
        question = r.get(qk) or ""
        if lettered:
            ok = pick_column(columns, ("options", "choices"), source, "options")
            ak = pick_column(columns, ("answer", "answerKey"), source, "answer")
            options = _as_list(r.get(ok))
            if not options:
                raise PreprocessError(f"{source}: row {i}: '{ok}' must be a non-empty list")
            answer = clean_ground_truth(r.get(ak))
        else:
            ck = pick_column(columns, ("Correct Answer",), source, "correct answer")
            wrong_keys = [
                pick_column(columns, (f"Incorrect Answer {k}",), source, "incorrect answer") for k in (1, 2, 3)
            ]
            correct = r.get(ck)
            options = [correct] + [r.get(k) for k in wrong_keys]
            digest = hashlib.sha1(f"{seed}:{question}".encode()).hexdigest()
            random.Random(int(digest[:16], 16)).shuffle(options)
            answer = LETTERS[options.index(correct)] if correct is not None else None
        labels = LETTERS[: len(options)]
        user = f"{GPQA_INSTRUCTION}\n\n{question}\n\n" + _options_block(labels, options, sep_after_each=False)
        items.append(Item(user, answer, i, labels=tuple(labels)))
    return items


def adapt_mmlu_pro(rows: list[dict[str, Any]], columns: Sequence[str], source: str, _: int) -> list[Item]:
    """TIGER-Lab/MMLU-Pro rows: ``question``, ``options`` (up to ten), ``answer`` (letter) or ``answer_index``.
    Formatted like ARC-c (OUR CHOICE: the released files hold no MMLU-Pro rows to copy)."""
    qk = pick_column(columns, ("question",), source, "question")
    ok = pick_column(columns, ("options", "choices"), source, "options")
    ak = pick_column(columns, ("answer", "answer_index"), source, "answer")
    items = []
    for i, r in enumerate(rows):
        options = _as_list(r.get(ok))
        if not options or len(options) > len(LETTERS):
            raise PreprocessError(f"{source}: row {i}: '{ok}' must be a list of 1-{len(LETTERS)} options")
        labels = LETTERS[: len(options)]
        answer = r.get(ak)
        if ak == "answer_index" and isinstance(answer, int) and 0 <= answer < len(options):
            answer = labels[answer]
        user = f"{r.get(qk) or ''}\n\n" + _options_block(labels, options, sep_after_each=True)
        items.append(Item(user, clean_ground_truth(answer), i, labels=tuple(labels)))
    return items


ADAPTERS: dict[str, Callable[[list[dict[str, Any]], Sequence[str], str, int], list[Item]]] = {
    "math": adapt_math,
    "arc": adapt_arc,
    "gpqa": adapt_gpqa,
    "mmlu_pro": adapt_mmlu_pro,
}


# ---------------------------------------------------------------------------------------------------- command


def load_benchmark(bench: Benchmark, local_path: str | None) -> tuple[list[dict[str, Any]], list[str], str]:
    if local_path:
        path = Path(local_path)
        return read_rows(path), table_columns(path), str(path)
    hub.prepare("benchmarks")
    try:
        from datasets import load_dataset

        dataset = load_dataset(bench.hub_id, bench.hub_config, split=bench.hub_split)
    except Exception as e:
        raise PreprocessError(
            f"{bench.name}: could not load {bench.hub_id} ({bench.hub_config or 'default'}, {bench.hub_split}) "
            f"from the Hub ({type(e).__name__}: {e}); {hub.offline_hint(f'--input {bench.name}=PATH')}"
        ) from e
    return dataset.to_list(), list(dataset.column_names), f"{bench.hub_id} ({bench.hub_split})"


def parse_repeat(value: str, repeat_benchmarks: Sequence[str]) -> dict[str, int]:
    """``--repeat 32`` -> {aime24: 32, aime25: 32, amc: 32}; ``--repeat aime24=8,amc=4`` -> as written."""
    value = value.strip()
    if "=" not in value:
        try:
            k = int(value)
        except ValueError as e:
            raise PreprocessError(f"--repeat must be an integer K or NAME=K,...; got {value!r}") from e
        pairs = {name: k for name in repeat_benchmarks}
    else:
        pairs = {}
        for part in value.split(","):
            name, _, k = part.partition("=")
            name = name.strip()
            if name not in BENCHMARKS:
                raise PreprocessError(f"--repeat: unknown benchmark {name!r} (known: {', '.join(BENCHMARKS)})")
            try:
                pairs[name] = int(k)
            except ValueError as e:
                raise PreprocessError(f"--repeat: {part!r} is not NAME=K with an integer K") from e
    bad = {n: k for n, k in pairs.items() if k < 1}
    if bad:
        raise PreprocessError(f"--repeat: K must be >= 1, got {bad}")
    return pairs


def parse_inputs(values: Sequence[str]) -> dict[str, str]:
    inputs = {}
    for v in values:
        name, sep, path = v.partition("=")
        if not sep or not path:
            raise PreprocessError(f"--input must be NAME=PATH, got {v!r}")
        if name not in BENCHMARKS:
            raise PreprocessError(f"--input: unknown benchmark {name!r} (known: {', '.join(BENCHMARKS)})")
        inputs[name] = path
    return inputs


def _valid_items(items: list[Item], bench: Benchmark, report: Report, progress: bool) -> list[Item]:
    kept = []
    for item in items:
        if not item.user.strip():
            report.add("dropped: empty question", 1)
        elif item.ground_truth is None:
            report.add("dropped: empty or unusable ground truth", 1)
        elif bench.kind != "math" and item.ground_truth not in item.labels:
            report.add("dropped: answer is not a listed option", 1)
        else:
            kept.append(item)
    if bench.kind == "math" and kept:
        ok = self_verifying([it.ground_truth or "" for it in kept], [bench.data_source] * len(kept), progress)
        report.add("dropped: unparseable ground truth", sum(not x for x in ok))
        kept = [it for it, good in zip(kept, ok, strict=True) if good]
    return kept


def build_benchmark(
    bench: Benchmark,
    local_path: str | None,
    system_prompt: str | None,
    repeat: int,
    seed: int,
    check_gt: bool,
    progress: bool,
    prompt_style: str = "chat",
    drop_duplicates: bool = False,
    agent_name: str | None = None,
) -> tuple[list[dict[str, Any]], Report]:
    rows, columns, source = load_benchmark(bench, local_path)
    report = Report(f"{bench.name} <- {source}")
    report.add("input rows", len(rows))
    items = ADAPTERS[bench.kind](rows, columns, source, seed)
    if check_gt:
        items = _valid_items(items, bench, report, progress)
    else:
        items = [it for it in items if it.user.strip() and it.ground_truth is not None]
    ids = [question_id(it.user) for it in items]
    dups = duplicate_ids(ids)
    if dups and drop_duplicates:
        first: dict[str, int] = {}
        keep = [first.setdefault(qid, i) == i for i, qid in enumerate(ids)]
        report.add("dropped: duplicate question", keep.count(False))
        items = [it for it, k in zip(items, keep, strict=True) if k]
        ids = [qid for qid, k in zip(ids, keep, strict=True) if k]
    else:
        raise_on_duplicates(dups, source, [it.user for it in items])
    out = []
    for index, (item, qid) in enumerate(
        tqdm(list(zip(items, ids, strict=True)), desc=bench.name, disable=not progress)
    ):
        prompt = build_prompt(item.user, system_prompt, prompt_style)
        for sample in range(repeat):
            out.append(
                verl_row(
                    data_source=bench.data_source,
                    prompt=prompt,
                    ground_truth=item.ground_truth or "",
                    index=index,
                    split="test",
                    qid=qid,
                    source_row=item.source_row,
                    sample=sample,
                    agent_name=agent_name,
                )
            )
    report.add("questions kept", len(items))
    report.add(f"rows written (x{repeat})", len(out))
    return out, report


def run(args: argparse.Namespace) -> list[Report]:
    progress = not args.no_progress
    names = list(BENCHMARKS) if args.benchmarks == "all" else [n.strip() for n in args.benchmarks.split(",")]
    unknown = [n for n in names if n not in BENCHMARKS]
    if unknown:
        raise PreprocessError(f"--benchmarks: unknown {unknown} (known: {', '.join(BENCHMARKS)})")
    repeat_set = [n.strip() for n in args.repeat_benchmarks.split(",")] if args.repeat_benchmarks else []
    repeats = parse_repeat(args.repeat, repeat_set)
    inputs = parse_inputs(args.input)
    unused = [f"{name}={path}" for name, path in inputs.items() if name not in names]
    if unused:
        raise PreprocessError(
            f"--input {', '.join(unused)}: not among --benchmarks ({','.join(names)}), so it would not be read: add "
            "the benchmark to --benchmarks, or drop the --input"
        )
    system_prompt = system_prompt_from_args(args.system_prompt, args.system_prompt_file, args.prompt_style)
    agent_name = agent_name_from_args(args.agent_name, args.prompt_style)
    out_dir = Path(args.output_dir)
    if args.combined and not args.combined.endswith(".parquet"):
        raise PreprocessError(f"--combined must name a .parquet file, got {args.combined!r}")
    check_output_dir(out_dir, "--output-dir")  # before anything is built
    # Build every benchmark before writing any: a later failure must not leave earlier outputs behind.
    reports, outputs, combined = [], [], []
    for name in names:
        rows, report = build_benchmark(
            BENCHMARKS[name],
            inputs.get(name),
            system_prompt,
            repeats.get(name, 1),
            args.seed,
            not args.skip_gt_check,
            progress,
            prompt_style=args.prompt_style,
            drop_duplicates=args.drop_duplicates,
            agent_name=agent_name,
        )
        if not rows:
            raise PreprocessError(f"{name}: no rows left (nothing was written)\n{report.format()}")
        outputs.append((rows, out_dir / f"{name}.parquet"))
        reports.append(report)
        combined.extend(rows)
    if args.combined:
        outputs.append((combined, out_dir / args.combined))
    paths = write_verl_parquets(outputs)
    for report, path in zip(reports, paths, strict=False):
        report.notes.append(f"written: {path}")
    if args.combined:
        reports.append(Report(f"combined -> {paths[-1]}", {"rows": len(combined)}))
    return reports


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m data_preprocess.benchmarks",
        description="Evaluation benchmarks (Hub or local files) -> verl parquet, one file per benchmark.",
    )
    p.add_argument("--output-dir", required=True, help="directory for <benchmark>.parquet files")
    p.add_argument("--benchmarks", default="all", help=f"comma list or 'all' ({', '.join(BENCHMARKS)})")
    p.add_argument("--input", action="append", default=[], metavar="NAME=PATH", help="local file for a benchmark")
    p.add_argument("--repeat", default="1", help="avg@k repetition: K for --repeat-benchmarks, or NAME=K,... ")
    p.add_argument(
        "--repeat-benchmarks",
        default=",".join(AVG_AT_K_DEFAULT),
        help=f"benchmarks that --repeat K applies to (default {','.join(AVG_AT_K_DEFAULT)})",
    )
    p.add_argument("--combined", help="also write all selected benchmarks into this file (name in --output-dir)")
    p.add_argument("--prompt-style", choices=PROMPT_STYLES, default="chat", help=PROMPT_STYLE_HELP)
    p.add_argument(
        "--system-prompt", help="luffy (released instruction, default), tir (default of --prompt-style tir) or none"
    )
    p.add_argument("--system-prompt-file", help="use this file's text as the system instruction instead")
    p.add_argument("--agent-name", help=AGENT_NAME_HELP)
    p.add_argument("--seed", type=int, default=0, help="GPQA option shuffle seed (raw GPQA rows only)")
    p.add_argument("--skip-gt-check", action="store_true", help="keep ground truths the reward cannot match")
    p.add_argument(
        "--drop-duplicates", action="store_true", help="keep the first copy of a question repeated in a benchmark"
    )
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        reports = run(args)
    except PreprocessError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    for report in reports:
        print(report.format())
    return 0


if __name__ == "__main__":
    sys.exit(main())
