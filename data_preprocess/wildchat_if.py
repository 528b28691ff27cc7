"""Instruction-following prompts (WildChat-IF, the paper's Table 2) -> verl parquet for a reward-model run.

Input: a local parquet / jsonl / json file (``--input``) or a Hugging Face dataset (``--hub-id``, with
``datasets.load_dataset``, on a machine that reaches the Hub), in any of these shapes, found by column name
(``--prompt-key`` picks the column):

- verl rows (the WildChat-IF file of the RLMT release, ``training/ppo_grpo/data/wildchat-if_train.parquet``):
  ``prompt`` = the conversation so far, a list of ``{role, content}`` messages;
- chat rows: ``messages`` or ``conversation``, the same list; trailing assistant turns are dropped (they would be
  the answer the policy is to write);
- plain rows: ``instruction`` (or ``--prompt-key``) holding one string, which becomes one user message.

Output: verl parquet rows (data_preprocess/common.py's schema) with ``ability`` "chat", ``reward_model`` =
``{"ground_truth": "", "style": "model"}`` (the reward model needs no reference) and ``extra_info.question_id``: the
SHA-1 of the conversation's roles and normalised texts, so it depends only on the conversation, never on the row
order, and exposes duplicates (an error unless ``--drop-duplicates``). ``--val-output`` splits off ``--val-size``
conversations (default 250): those whose question id sorts first, a split that is the same whatever the input's
order. Both files are written, or neither.

Rows are dropped, and counted, when the conversation has no message left, no user message, an empty last user
message, or (with ``--tokenizer``) a chat-templated prompt longer than ``--max-prompt-tokens`` (default 1024, the
launch script's ``data.max_prompt_length``). A message that is not a ``{role, content}`` object with a known role
and text content is bad input: exit 2, the file, row and column named, nothing written.

    python -m data_preprocess.wildchat_if --input wildchat-if_train.parquet --tokenizer /models/Qwen2.5-7B \\
        --output data/wildchat_if/train.parquet --val-output data/wildchat_if/val.parquet
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tqdm.auto import tqdm

from data_preprocess import hub
from data_preprocess.common import (
    PreprocessError,
    Report,
    check_output_file,
    command_main,
    duplicate_ids,
    load_tokenizer,
    normalize_question,
    pick_column,
    prompt_token_lengths,
    raise_on_duplicates,
    read_rows,
    table_columns,
    write_verl_parquets,
)

DEFAULT_DATA_SOURCE = "wildchat_if"
DEFAULT_MAX_PROMPT_TOKENS = 1024
DEFAULT_VAL_SIZE = 250
ABILITY = "chat"
REWARD_STYLE = "model"
#: Columns tried in order when --prompt-key is not given.
PROMPT_KEYS = ("prompt", "messages", "conversation", "instruction")
ROLES = ("system", "user", "assistant")


def conversation_of(value: Any, where: str, column: str) -> list[dict[str, str]]:
    """The row's messages up to the last user turn (trailing assistant turns dropped); ``[]`` when nothing usable
    is left. A string is one user message. Bad structure raises a PreprocessError naming ``where`` and ``column``."""
    if hasattr(value, "tolist") and not isinstance(value, str):
        value = value.tolist()
    if value is None:
        return []
    if isinstance(value, str):
        return [{"role": "user", "content": value}] if value.strip() else []
    if not isinstance(value, list):
        raise PreprocessError(
            f"{where}: column {column!r} must hold a list of {{role, content}} messages or a string, "
            f"got {type(value).__name__}"
        )
    messages = []
    for j, m in enumerate(value):
        if not isinstance(m, dict):
            raise PreprocessError(f"{where}: column {column!r}, message {j} is not a {{role, content}} object: {m!r}")
        role, content = m.get("role"), m.get("content")
        if role not in ROLES:
            raise PreprocessError(f"{where}: column {column!r}, message {j} has role {role!r}; expected one of {ROLES}")
        if content is None:
            content = ""
        if not isinstance(content, str):
            raise PreprocessError(
                f"{where}: column {column!r}, message {j} ({role}) has non-text content ({type(content).__name__})"
            )
        messages.append({"content": content, "role": role})
    while messages and messages[-1]["role"] == "assistant":
        messages.pop()
    return messages


def conversation_id(messages: Sequence[dict[str, str]]) -> str:
    """Stable id of a conversation: SHA-1 of its (role, normalised text) pairs."""
    canonical = json.dumps([[m["role"], normalize_question(m["content"])] for m in messages], ensure_ascii=False)
    return hashlib.sha1(canonical.encode("utf-8")).hexdigest()


def load_input(args: argparse.Namespace) -> tuple[list[Any], str, str]:
    """The raw prompt values, the source's name and the column read."""
    if args.input:
        path = Path(args.input)
        if not path.exists():
            raise PreprocessError(f"input file not found: {path}")
        source, columns = str(path), table_columns(path)
    else:
        if not args.hub_id:
            raise PreprocessError("give --input FILE or --hub-id NAME (a Hugging Face dataset)")
        hub.prepare("wildchat_if")
        from datasets import load_dataset

        source = f"{args.hub_id} ({args.split})"
        try:
            dataset = load_dataset(args.hub_id, split=args.split)
        except Exception as e:
            raise PreprocessError(
                f"could not load {source} from the Hub ({type(e).__name__}: {e}); {hub.offline_hint('--input PATH')}"
            ) from e
        columns = list(dataset.column_names)
    column = pick_column(columns, (args.prompt_key,) if args.prompt_key else PROMPT_KEYS, source, "prompt")
    if args.input:
        values = [r[column] for r in read_rows(args.input, [column])]
    else:
        values = dataset[column]
    return list(values), source, column


def _row(data_source: str, messages: list[dict[str, str]], index: int, split: str, qid: str, src: int) -> dict:
    return {
        "data_source": data_source,
        "prompt": messages,
        "ability": ABILITY,
        "reward_model": {"ground_truth": "", "style": REWARD_STYLE},
        "extra_info": {"index": index, "split": split, "question_id": qid, "source_row": src, "sample": 0},
    }


def run(args: argparse.Namespace) -> Report:
    progress = not args.no_progress
    if args.val_output and args.val_size < 1:
        raise PreprocessError(f"--val-size must be >= 1 with --val-output, got {args.val_size}")
    # the paths first: a wrong --tokenizer or an output that cannot be written must not wait for the reading
    check_output_file(args.output, "--output")
    if args.val_output:
        check_output_file(args.val_output, "--val-output")
    tokenizer = load_tokenizer(args.tokenizer, tag="wildchat_if") if args.tokenizer else None
    values, source, column = load_input(args)
    if args.limit:
        values = values[: args.limit]
    report = Report(source)
    report.add("input rows", len(values))
    report.notes.append(f"prompt column: {column}")

    kept = []
    for i, value in enumerate(tqdm(values, desc="reading", unit="row", disable=not progress)):
        messages = conversation_of(value, f"{source}: row {i}", column)
        users = [m for m in messages if m["role"] == "user"]
        if not messages or not users:
            report.add("dropped: no user message", 1)
            continue
        if messages[-1]["role"] != "user" or not messages[-1]["content"].strip():
            report.add("dropped: empty last user message", 1)
            continue
        kept.append((i, messages, conversation_id(messages)))

    dups = duplicate_ids([qid for _, _, qid in kept])
    if dups and not args.drop_duplicates:
        raise_on_duplicates(dups, source, [m[-1]["content"] for _, m, _ in kept])
    seen: set[str] = set()
    unique = []
    for row in kept:
        if row[2] in seen:
            report.add("dropped: duplicate conversation", 1)
            continue
        seen.add(row[2])
        unique.append(row)

    if tokenizer is not None and unique:
        lengths = prompt_token_lengths([m for _, m, _ in unique], tokenizer, progress)
        too_long = [n > args.max_prompt_tokens for n in lengths]
        report.add(f"dropped: prompt > {args.max_prompt_tokens} tokens", sum(too_long))
        unique = [r for r, long in zip(unique, too_long, strict=True) if not long]
    elif not args.tokenizer:
        report.notes.append("no --tokenizer: prompt-length filter not applied")
    if not unique:
        raise PreprocessError(f"{source}: no rows left after filtering\n{report.format()}")

    val_ids: set[str] = set()
    if args.val_output:
        if args.val_size >= len(unique):
            raise PreprocessError(
                f"{source}: --val-size {args.val_size} leaves no training row ({len(unique)} conversations kept)"
            )
        val_ids = set(sorted(qid for _, _, qid in unique)[: args.val_size])
    splits: dict[str, list[dict]] = {"train": [], "val": []}
    for src, messages, qid in unique:
        split = "val" if qid in val_ids else "train"
        name = args.split_name if split == "train" else "val"
        splits[split].append(_row(args.data_source, messages, len(splits[split]), name, qid, src))
    outputs = [(splits["train"], args.output)] + ([(splits["val"], args.val_output)] if args.val_output else [])
    write_verl_parquets(outputs)
    report.add("kept (train)", len(splits["train"]))
    report.notes.append(f"written: {args.output}")
    if args.val_output:
        report.add("kept (val)", len(splits["val"]))
        report.notes.append(f"written: {args.val_output}")
    return report


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m data_preprocess.wildchat_if",
        description="Instruction-following prompts (WildChat-IF; local file or Hub dataset) -> verl parquet.",
    )
    p.add_argument("--input", help="local .parquet/.jsonl/.json")
    p.add_argument("--hub-id", help="a Hugging Face dataset name, read with `datasets` when there is no --input")
    p.add_argument("--split", default="train", help="Hub split (default train)")
    p.add_argument("--output", required=True, help="training .parquet")
    p.add_argument("--val-output", help="also write a validation .parquet, split off the input")
    p.add_argument("--val-size", type=int, default=DEFAULT_VAL_SIZE, help=f"its rows (default {DEFAULT_VAL_SIZE})")
    p.add_argument("--split-name", default="train", help="extra_info.split of the training rows (default train)")
    p.add_argument("--prompt-key", help=f"column holding the conversation (default: the first of {PROMPT_KEYS})")
    p.add_argument("--tokenizer", help="tokenizer directory for the prompt-length filter (none: no filter)")
    p.add_argument("--max-prompt-tokens", type=int, default=DEFAULT_MAX_PROMPT_TOKENS)
    p.add_argument("--data-source", default=DEFAULT_DATA_SOURCE, help=f"data_source (default {DEFAULT_DATA_SOURCE})")
    p.add_argument("--drop-duplicates", action="store_true", help="keep the first copy of a repeated conversation")
    p.add_argument("--limit", type=int, default=0, help="only the first N input rows (0: all)")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    return command_main(build_parser(), run, argv)


if __name__ == "__main__":
    sys.exit(main())
