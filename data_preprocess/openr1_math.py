"""OpenR1-Math 46k (the ExGRPO training set, docs/algorithm.md §11) -> verl parquet.

Input: the Hub dataset ``Elliott/Openr1-Math-46k-8192`` (via ``datasets.load_dataset``, when online) or a local
parquet / jsonl / json file, in either shape:
- verl rows, like the Hub set: ``prompt`` (messages; the last user message is the question) and
  ``reward_model.ground_truth`` (``data_source`` kept when present). The reference solutions (``target``)
  are not read: ExGRPO uses only the question and the answer.
- plain rows: a question column (``--question-key``, default: ``problem`` or ``question``) and an answer
  column (``--answer-key``, default: ``answer``, ``ground_truth`` or ``final_answer``).

Output: one verl parquet (see data_preprocess/common.py) with the released system instruction
(``--system-prompt luffy``; ``none`` for no system message; ``--system-prompt-file`` for your own) or, with
``--prompt-style llama_base``, the paper's Llama-3.1-8B base prompt as the only message (exgrpo/prompts.py), the stable
``extra_info.question_id`` and a contiguous ``extra_info.index``. ``--prompt-style tir`` (tool-integrated
reasoning, scripts/train/*_tir.sh) writes the tir system instruction (a Python tool, the answer in ``\\boxed{}``)
and ``agent_name`` = ``tool_agent`` on every row, so verl serves them with its tool agent loop (``--agent-name``
names another loop).

Rows are dropped, and counted, when the question is empty, the ground truth is empty or unusable, the
ground truth cannot be matched by the reward to itself ("unparseable"; ``--skip-gt-check`` skips this
check), or the prompt is longer than ``--max-prompt-tokens`` (1024, as the released run's max prompt length)
under ``--tokenizer``'s chat template (no tokenizer: no length filter). A question occurring twice is an
error unless ``--drop-duplicates``.

    python -m data_preprocess.openr1_math --output data/openr1/train.parquet --tokenizer /models/Qwen2.5-Math-7B
    python -m data_preprocess.openr1_math --input openr1.parquet --output data/openr1/train.parquet
    python -m data_preprocess.openr1_math --output data/openr1_tir/train.parquet --prompt-style tir \\
        --tokenizer /models/Qwen2.5-7B-Instruct
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
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
    check_output_file,
    clean_ground_truth,
    command_main,
    duplicate_ids,
    load_tokenizer,
    pick_column,
    prompt_token_lengths,
    question_id,
    raise_on_duplicates,
    read_rows,
    self_verifying,
    system_prompt_from_args,
    table_columns,
    verl_row,
    write_verl_parquet,
)
from exgrpo.prompts import RAW_CHAT_TEMPLATE

HUB_ID = "Elliott/Openr1-Math-46k-8192"
DEFAULT_DATA_SOURCE = "openr1_math"
DEFAULT_MAX_PROMPT_TOKENS = 1024
QUESTION_KEYS = ("problem", "question")
ANSWER_KEYS = ("answer", "ground_truth", "final_answer")


def _user_message(prompt: Any, where: str) -> str | None:
    """The last user message of a verl ``prompt`` (list of {role, content}); None when there is none."""
    if hasattr(prompt, "tolist") and not isinstance(prompt, str):
        prompt = prompt.tolist()
    if isinstance(prompt, str):
        return prompt
    if not isinstance(prompt, list):
        raise PreprocessError(f"{where}: 'prompt' must be a list of messages, got {type(prompt).__name__}")
    for message in reversed(prompt):
        if isinstance(message, dict) and message.get("role") == "user":
            content = message.get("content")
            return content if isinstance(content, str) else None
    return None


def load_input(
    input_path: str | None, hub_id: str, split: str, question_key: str | None, answer_key: str | None
) -> tuple[list[dict[str, Any]], str, str]:
    """Rows with ``question`` / ``ground_truth`` / ``data_source`` / ``source_row``; also the source name and
    the input shape ("verl" or "plain")."""
    if input_path:
        source = str(input_path)
        if not Path(input_path).exists():
            raise PreprocessError(f"input file not found: {input_path}")
        columns = table_columns(Path(input_path))
    else:
        hub.prepare("openr1_math")
        from datasets import load_dataset

        source = f"{hub_id} ({split})"
        try:
            dataset = load_dataset(hub_id, split=split)
        except Exception as e:
            raise PreprocessError(
                f"could not load {source} from the Hub ({type(e).__name__}: {e}); {hub.offline_hint('--input PATH')}"
            ) from e
        columns = list(dataset.column_names)

    verl_shape = question_key is None and answer_key is None and "prompt" in columns and "reward_model" in columns
    if verl_shape:
        wanted = ["prompt", "reward_model"] + (["data_source"] if "data_source" in columns else [])
    else:
        qk = question_key or pick_column(columns, QUESTION_KEYS, source, "question")
        ak = answer_key or pick_column(columns, ANSWER_KEYS, source, "answer")
        pick_column(columns, (qk,), source, "question")
        pick_column(columns, (ak,), source, "answer")
        wanted = [qk, ak]

    if input_path:
        raw = read_rows(input_path, wanted)
    else:
        raw = dataset.select_columns(wanted).to_list()

    rows = []
    for i, r in enumerate(raw):
        where = f"{source}: row {i}"
        if verl_shape:
            reward = r.get("reward_model")
            if not isinstance(reward, dict):
                raise PreprocessError(f"{where}: 'reward_model' must be a struct with 'ground_truth'")
            question = _user_message(r.get("prompt"), where)
            gt = reward.get("ground_truth")
            ds = r.get("data_source")
        else:
            question, gt, ds = r.get(qk), r.get(ak), None
        rows.append({"question": question, "ground_truth": gt, "data_source": ds, "source_row": i})
    return rows, source, "verl" if verl_shape else "plain"


def run(args: argparse.Namespace) -> Report:
    progress = not args.no_progress
    system_prompt = system_prompt_from_args(args.system_prompt, args.system_prompt_file, args.prompt_style)
    agent_name = agent_name_from_args(args.agent_name, args.prompt_style)
    # the paths first: a wrong --tokenizer or an --output that cannot be written must not wait for the grading pass
    check_output_file(args.output, "--output")
    tokenizer = load_tokenizer(args.tokenizer, tag="openr1_math") if args.tokenizer else None
    rows, source, shape = load_input(args.input, args.hub_id, args.split, args.question_key, args.answer_key)
    if args.limit:
        rows = rows[: args.limit]
    report = Report(source)
    report.add("input rows", len(rows))
    report.notes.append(f"input shape: {shape}")

    kept = []
    for r in tqdm(rows, desc="reading", unit="row", disable=not progress):
        question = r["question"]
        if not isinstance(question, str) or not question.strip():
            report.add("dropped: empty question", 1)
            continue
        gt = clean_ground_truth(r["ground_truth"])
        if gt is None:
            report.add("dropped: empty or unusable ground truth", 1)
            continue
        r["ground_truth"] = gt
        r["data_source"] = args.data_source or r["data_source"] or DEFAULT_DATA_SOURCE
        kept.append(r)
    rows = kept

    if not args.skip_gt_check and rows:
        ok = self_verifying([r["ground_truth"] for r in rows], [r["data_source"] for r in rows], progress)
        report.add("dropped: unparseable ground truth", sum(not x for x in ok))
        rows = [r for r, good in zip(rows, ok, strict=True) if good]

    ids = [question_id(r["question"]) for r in rows]
    dups = duplicate_ids(ids)
    if dups and not args.drop_duplicates:
        raise_on_duplicates(dups, source, [r["question"] for r in rows])
    seen: set[str] = set()
    unique = []
    for r, qid in zip(rows, ids, strict=True):
        if qid in seen:
            report.add("dropped: duplicate question", 1)
            continue
        seen.add(qid)
        prompt = build_prompt(r["question"], system_prompt, args.prompt_style)
        unique.append({**r, "question_id": qid, "prompt": prompt})
    rows = unique

    if tokenizer is not None:
        template = RAW_CHAT_TEMPLATE if args.prompt_style == "llama_base" else None  # as the launch script
        lengths = prompt_token_lengths([r["prompt"] for r in rows], tokenizer, progress, chat_template=template)
        too_long = [n > args.max_prompt_tokens for n in lengths]
        report.add(f"dropped: prompt > {args.max_prompt_tokens} tokens", sum(too_long))
        rows = [r for r, long in zip(rows, too_long, strict=True) if not long]
    else:
        report.notes.append("no --tokenizer: prompt-length filter not applied")

    out = [
        verl_row(
            data_source=r["data_source"],
            prompt=r["prompt"],
            ground_truth=r["ground_truth"],
            index=i,
            split=args.split_name,
            qid=r["question_id"],
            source_row=r["source_row"],
            agent_name=agent_name,
        )
        for i, r in enumerate(rows)
    ]
    if not out:
        raise PreprocessError(f"{source}: no rows left after filtering\n{report.format()}")
    write_verl_parquet(out, args.output)
    report.add("kept", len(out))
    report.notes.append(f"written: {args.output}")
    return report


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m data_preprocess.openr1_math",
        description="OpenR1-Math 46k (Hub or local parquet/jsonl) -> verl parquet for ExGRPO training.",
    )
    p.add_argument("--input", help="local .parquet/.jsonl/.json; default: download --hub-id with `datasets`")
    p.add_argument("--output", required=True, help="output .parquet path")
    p.add_argument("--hub-id", default=HUB_ID, help=f"Hub dataset when no --input (default {HUB_ID})")
    p.add_argument("--split", default="train", help="Hub split (default train)")
    p.add_argument("--split-name", default="train", help="value of extra_info.split (default train)")
    p.add_argument("--tokenizer", help="tokenizer directory for the prompt-length filter (none: no filter)")
    p.add_argument("--max-prompt-tokens", type=int, default=DEFAULT_MAX_PROMPT_TOKENS)
    p.add_argument("--prompt-style", choices=PROMPT_STYLES, default="chat", help=PROMPT_STYLE_HELP)
    p.add_argument(
        "--system-prompt", help="luffy (released instruction, default), tir (default of --prompt-style tir) or none"
    )
    p.add_argument("--system-prompt-file", help="use this file's text as the system instruction instead")
    p.add_argument("--agent-name", help=AGENT_NAME_HELP)
    p.add_argument("--data-source", help=f"data_source of every row (default: the input's, else {DEFAULT_DATA_SOURCE})")
    p.add_argument("--question-key", help="question column of plain input (default: problem or question)")
    p.add_argument("--answer-key", help="answer column of plain input (default: answer, ground_truth, final_answer)")
    p.add_argument("--drop-duplicates", action="store_true", help="keep the first copy of a repeated question")
    p.add_argument("--skip-gt-check", action="store_true", help="do not drop ground truths the reward cannot match")
    p.add_argument("--limit", type=int, default=0, help="only the first N input rows (0: all)")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    return command_main(build_parser(), run, argv)


if __name__ == "__main__":
    sys.exit(main())
