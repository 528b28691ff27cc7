"""Shared pieces of the dataset -> verl parquet commands (``openr1_math``, ``benchmarks``).

Output rows follow verl's RL dataset convention, the same as the released evaluation files:
``data_source`` (str), ``prompt`` ([{content, role}]: the system instruction, then the user question),
``ability`` ("math"), ``reward_model`` {``ground_truth`` (str), ``style`` ("rule")}, ``extra_info``
{``index``, ``split``, ``question_id``, ``source_row``, ``sample``}; with an agent loop (``--prompt-style tir``,
``--agent-name``) one more column, ``agent_name`` (str), which verl reads to pick the loop that serves the row.

``question_id`` is the SHA-1 of the question text after Unicode NFKC normalisation and whitespace collapsing:
it depends only on the question, never on row order or seed, so the experience pool can key questions by it
across runs (docs/algorithm.md §2), and it exposes duplicate questions (an error unless asked to drop them).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import sys
import tempfile
import unicodedata
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from exgrpo.prompts import PROMPT_STYLES, STYLE_AGENT_NAMES, llama_base_prompt

# The system instruction of the released LUFFY / ExGRPO setup (docs/algorithm.md §10: the think template): the
# exact text of every row of the released evaluation files (AIME, AMC, MATH-500, ... in verl parquet), and of the
# system message of the released training set Elliott/Openr1-Math-46k-8192 (LUFFY's prompt, which ExGRPO
# reuses). The model must close "</think>" and box its answer, which is what the reward's gate checks.
LUFFY_SYSTEM_PROMPT = (
    "Your task is to follow a systematic, thorough reasoning process before providing the final solution. "
    "This involves analyzing, summarizing, exploring, reassessing, and refining your thought process through "
    "multiple iterations. Structure your response into two sections: Thought and Solution. In the Thought "
    'section, present your reasoning using the format: "<think>\n {thoughts} </think>\n". Each thought should '
    'include detailed analysis, brainstorming, verification, and refinement of ideas. After "</think>\n," in '
    "the Solution section, provide the final, logical, and accurate answer, clearly derived from the exploration "
    "in the Thought section. If applicable, include the answer in \\boxed{} for closed-form results like "
    "multiple choices or mathematical solutions."
)
# Tool-integrated reasoning (--prompt-style tir, scripts/train/*_tir.sh): the rows are served by verl's tool agent
# loop with the recipe's sandboxed Python tool (recipe/exgrpo/agent_tools/python_tool.py, named "python"). How to
# call it is not said here: verl hands the tool's schema to the chat template, which writes it and the
# <tool_call> format into the system prompt (Qwen2.5's does). What the model cannot learn from the schema is said:
# each call is a fresh process that keeps nothing, and what it prints is what comes back. No think block is asked
# for: the TIR runs grade with the think gate off.
TIR_SYSTEM_PROMPT = (
    "Solve the math problem step by step. You can run Python code with the python tool to compute, explore and "
    "check your work: each call runs the code in a fresh Python process that keeps no variables from earlier "
    "calls, and returns what the code prints (or the error it raised), so print every result you need. Put the "
    "final answer in \\boxed{}."
)
SYSTEM_PROMPTS: dict[str, str | None] = {"luffy": LUFFY_SYSTEM_PROMPT, "tir": TIR_SYSTEM_PROMPT, "none": None}
#: the system prompt a style uses when --system-prompt is not given (chat: the released instruction)
DEFAULT_SYSTEM_PROMPT: dict[str, str] = {"chat": "luffy", "tir": "tir"}
PROMPT_STYLE_HELP = (
    "chat (default): system instruction + question, rendered by the model's chat template; llama_base: the paper's "
    "Llama-3.1-8B base prompt 'User: {question} Answer: Let's think step by step.\\n', no system prompt; tir: "
    "tool-integrated reasoning, chat with the tir system instruction (a Python tool, the answer in \\boxed{}) and "
    "every row served by verl's tool agent loop (agent_name tool_agent)"
)
AGENT_NAME_HELP = (
    "verl agent loop of every row (the agent_name column): default tool_agent with --prompt-style tir, none (no "
    "column: verl's default single-turn loop) otherwise"
)
# A verl agent-loop name as its registry keys them (tool_agent, single_turn_agent, ...): a typo or a stray space
# would fail only inside the rollout workers, once the cluster is up.
_AGENT_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.\-]*")

ABILITY = "math"
REWARD_STYLE = "rule"

VERL_SCHEMA = pa.schema(
    [
        ("data_source", pa.string()),
        ("prompt", pa.list_(pa.struct([("content", pa.string()), ("role", pa.string())]))),
        ("ability", pa.string()),
        ("reward_model", pa.struct([("ground_truth", pa.string()), ("style", pa.string())])),
        (
            "extra_info",
            pa.struct(
                [
                    ("index", pa.int64()),
                    ("split", pa.string()),
                    ("question_id", pa.string()),
                    ("source_row", pa.int64()),
                    ("sample", pa.int64()),
                ]
            ),
        ),
    ]
)


class PreprocessError(ValueError):
    """Bad input to a preprocessing command; the message names the file, column or value."""


class MissingColumnError(PreprocessError):
    pass


class DuplicateQuestionError(PreprocessError):
    pass


_WS = re.compile(r"\s+")


def normalize_question(text: str) -> str:
    """NFKC, whitespace runs collapsed to one space, stripped: what two copies of one question share."""
    return _WS.sub(" ", unicodedata.normalize("NFKC", text)).strip()


def question_id(text: str) -> str:
    """Stable id of a question: SHA-1 (hex) of ``normalize_question(text)``."""
    return hashlib.sha1(normalize_question(text).encode("utf-8")).hexdigest()


def system_prompt_from_args(name: str | None, path: str | None, style: str = "chat") -> str | None:
    """``--system-prompt NAME`` (default: the style's, luffy for chat and tir for tir) or ``--system-prompt-file
    PATH`` (the file wins); none under ``--prompt-style llama_base``, whose setting has no system prompt."""
    if style not in PROMPT_STYLES:
        raise PreprocessError(f"--prompt-style must be one of {list(PROMPT_STYLES)}, got {style!r}")
    if style == "llama_base":
        if path or name not in (None, "none"):
            raise PreprocessError(
                "--prompt-style llama_base has no system prompt (the paper's Llama-3.1-8B base setting): drop "
                "--system-prompt / --system-prompt-file"
            )
        return None
    name = DEFAULT_SYSTEM_PROMPT[style] if name is None else name
    if path:
        try:
            text = Path(path).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as e:
            raise PreprocessError(f"--system-prompt-file {path}: cannot be read ({_reason(e)})") from e
        if not text.strip():
            raise PreprocessError(f"--system-prompt-file {path} is empty")
        return text
    if name not in SYSTEM_PROMPTS:
        raise PreprocessError(f"--system-prompt must be one of {sorted(SYSTEM_PROMPTS)}, got {name!r}")
    return SYSTEM_PROMPTS[name]


def agent_name_from_args(name: str | None, style: str = "chat") -> str | None:
    """``--agent-name NAME``: the verl agent loop written to every row's ``agent_name`` (None: no column). Default:
    the style's (``tool_agent`` for ``tir``, none otherwise); ``none`` writes no column, which ``tir`` refuses (its
    prompt promises a tool that only an agent loop with tools provides)."""
    if style not in PROMPT_STYLES:
        raise PreprocessError(f"--prompt-style must be one of {list(PROMPT_STYLES)}, got {style!r}")
    if name is None:
        return STYLE_AGENT_NAMES.get(style)
    if name == "none":
        if style in STYLE_AGENT_NAMES:
            raise PreprocessError(
                f"--agent-name none: --prompt-style {style} rows must be served by an agent loop that runs the "
                f"tool its system prompt offers (default {STYLE_AGENT_NAMES[style]})"
            )
        return None
    if not _AGENT_NAME.fullmatch(name):
        raise PreprocessError(
            f"--agent-name must name a verl agent loop (tool_agent, single_turn_agent, ...) or be none, got {name!r}"
        )
    return name


def build_prompt(user_content: str, system_prompt: str | None, style: str = "chat") -> list[dict[str, str]]:
    """The row's messages: system instruction (if any) and the question (``chat``), or the one user message holding
    the complete Llama-3.1-8B base prompt (``llama_base``, rendered verbatim by the launch script)."""
    if style == "llama_base":
        return [{"content": llama_base_prompt(user_content), "role": "user"}]
    messages = [] if system_prompt is None else [{"content": system_prompt, "role": "system"}]
    messages.append({"content": user_content, "role": "user"})
    return messages


# ---------------------------------------------------------------------------------------------- reading input


def _unreadable(path: Path, what: str, e: Exception) -> PreprocessError:
    try:
        if path.is_file() and path.stat().st_size == 0:
            return PreprocessError(f"{path}: the file is empty (0 bytes), not a {what} file")
    except OSError:
        pass
    return PreprocessError(f"{path}: not a readable {what} file ({type(e).__name__}: {e})")


def table_columns(path: Path) -> list[str]:
    """Column names of a parquet / jsonl / json file (for jsonl: the union over all rows)."""
    suffix = _suffix(path)
    if suffix == ".parquet":
        try:
            return list(pq.read_schema(path).names)
        except (pa.ArrowException, OSError) as e:  # 0 bytes, not parquet, truncated, a directory ...
            raise _unreadable(path, "parquet", e) from e
    names: dict[str, None] = {}
    rows = 0
    for row in _iter_json_rows(path):
        names.update(dict.fromkeys(row))
        rows += 1
    if rows == 0:  # (a 0-byte .json fails to parse and says so above)
        if path.stat().st_size == 0:
            raise PreprocessError(f"{path}: the file is empty (0 bytes)")
        raise PreprocessError(f"{path}: the file holds no rows")
    return list(names)


def read_rows(path: str | Path, columns: Sequence[str] | None = None) -> list[dict[str, Any]]:
    """Rows of a local parquet / jsonl / json file as dicts, only ``columns`` when given (they must exist)."""
    path = Path(path)
    if not path.exists():
        raise PreprocessError(f"input file not found: {path}")
    if columns is not None:
        require_columns(table_columns(path), columns, path)
    if _suffix(path) == ".parquet":
        # Reading only the needed columns keeps e.g. OpenR1's long reference solutions out of memory.
        try:
            return pq.read_table(path, columns=list(columns) if columns is not None else None).to_pylist()
        except (pa.ArrowException, OSError) as e:  # a corrupt column chunk shows only when it is read
            raise _unreadable(path, "parquet", e) from e
    rows = list(_iter_json_rows(path))
    if columns is not None:
        rows = [{c: r.get(c) for c in columns} for r in rows]
    return rows


def _suffix(path: Path) -> str:
    suffix = path.suffix.lower()
    if suffix not in (".parquet", ".jsonl", ".json"):
        raise PreprocessError(f"{path}: unsupported input format {suffix!r} (use .parquet, .jsonl or .json)")
    return suffix


def _iter_json_rows(path: Path) -> Iterable[dict[str, Any]]:
    if _suffix(path) == ".json":
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
            raise _unreadable(path, "JSON", e) from e
        if isinstance(data, Mapping):  # {"data": [...]} or a column-oriented dict
            data = data.get("data", data.get("rows", [data]))
        if not isinstance(data, list):
            raise PreprocessError(f"{path}: expected a JSON list of row objects")
        for i, row in enumerate(data):
            if not isinstance(row, Mapping):
                raise PreprocessError(f"{path}: row {i} is not a JSON object")
            yield dict(row)
        return
    lineno = 0
    try:
        with path.open(encoding="utf-8") as f:
            for lineno, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
                except json.JSONDecodeError as e:
                    raise PreprocessError(f"{path}:{lineno}: not valid JSON ({e.msg})") from e
                if not isinstance(row, Mapping):
                    raise PreprocessError(f"{path}:{lineno}: a JSON object per line is expected")
                yield dict(row)
    except UnicodeDecodeError as e:
        raise PreprocessError(f"{path}:{lineno + 1}: not UTF-8 text ({e.reason})") from e
    except OSError as e:
        raise _unreadable(path, "JSON lines", e) from e


def require_columns(columns: Iterable[str], required: Sequence[str], source: str | Path) -> None:
    present = set(columns)
    missing = [c for c in required if c not in present]
    if missing:
        raise MissingColumnError(
            f"{source}: missing column(s) {', '.join(repr(c) for c in missing)} "
            f"(found: {', '.join(sorted(present)) or 'none'})"
        )


def pick_column(columns: Iterable[str], candidates: Sequence[str], source: str | Path, what: str) -> str:
    """The first of ``candidates`` present in ``columns``; else an error naming the column(s) and the file."""
    present = set(columns)
    for c in candidates:
        if c in present:
            return c
    wanted = " or ".join(repr(c) for c in candidates)
    raise MissingColumnError(
        f"{source}: missing {what} column {wanted} (found: {', '.join(sorted(present)) or 'none'})"
    )


# ------------------------------------------------------------------------------------------- ground truths


def clean_ground_truth(value: Any) -> str | None:
    """A ground truth as one non-empty string, or None when it is empty or unusable.

    Numbers become their Python string (AMC's ``142.0`` stays ``"142.0"``, as in the released files); a list
    with exactly one answer becomes that answer; nested structures and several-answer lists are unusable here
    (the reward would read a list as alternatives, which is not what a tuple-valued answer means).
    """
    if value is None or isinstance(value, bool):
        return None
    if hasattr(value, "tolist") and not isinstance(value, str):
        value = value.tolist()
    if isinstance(value, float) and math.isnan(value):
        return None
    if isinstance(value, int | float):
        return str(value)
    if isinstance(value, list | tuple):
        items = [v for v in (clean_ground_truth(x) for x in value) if v is not None]
        return items[0] if len(items) == 1 and len(value) == 1 else None
    if isinstance(value, str):
        return value.strip() or None
    return None


def self_verifying(ground_truths: Sequence[str], data_sources: Sequence[str], progress: bool) -> list[bool]:
    """Whether each ground truth can be matched at all: the reward must award 1 to ``\\boxed{gt}`` against it.

    This is the meaning of "unparseable" here: a ground truth the verifier cannot match to itself can never
    give reward 1, so its question is dead weight in training and a guaranteed 0 in evaluation. It runs the
    real reward (math-verify, under its timeout), without the exact-match shortcut.
    """
    from exgrpo.reward import grade_batch, last_boxed

    responses = [f"\\boxed{{{gt}}}" for gt in ground_truths]
    # Unbalanced braces ("\frac{") cannot be boxed, so no response could ever state this answer.
    well_formed = [last_boxed(r) == gt for r, gt in zip(responses, ground_truths, strict=True)]
    results = grade_batch(
        responses, list(ground_truths), list(data_sources), think_gate=False, exact_shortcut=False, progress=progress
    )
    return [ok and r.correct for ok, r in zip(well_formed, results, strict=True)]


# ------------------------------------------------------------------------------------------ duplicates / ids


def duplicate_ids(ids: Sequence[str]) -> dict[str, list[int]]:
    """question_id -> the row positions holding it, for ids seen more than once."""
    counts = Counter(ids)
    dups: dict[str, list[int]] = {}
    for i, qid in enumerate(ids):
        if counts[qid] > 1:
            dups.setdefault(qid, []).append(i)
    return dups


def raise_on_duplicates(dups: Mapping[str, list[int]], source: str, questions: Sequence[str]) -> None:
    """An error naming the repeated ids and rows; both commands accept ``--drop-duplicates``, which it suggests."""
    if not dups:
        return
    examples = []
    for qid, rows in list(dups.items())[:5]:
        text = normalize_question(questions[rows[0]])
        examples.append(f"{qid[:12]} (rows {rows[:4]}): {text[:60]!r}")
    raise DuplicateQuestionError(
        f"{source}: {len(dups)} question id(s) occur more than once, e.g. "
        + "; ".join(examples)
        + ". Pass --drop-duplicates to keep the first copy of each."
    )


# ------------------------------------------------------------------------------------------- prompt length


def _reason(e: BaseException) -> str:
    """An exception in one short line (transformers' messages run over several)."""
    text = " ".join((getattr(e, "strerror", None) or str(e) or type(e).__name__).split())
    return f"{type(e).__name__}: {text[:300]}{'...' if len(text) > 300 else ''}"


def looks_local(path: str) -> bool:
    """A filesystem path rather than a Hub id (``org/name``): absolute, ``./``, ``../``, ``~``, more than one ``/``,
    or present here."""
    return path.startswith(("/", "./", "../", "~")) or path.count("/") > 1 or os.path.exists(path)


def check_tokenizer_path(path: str | None, option: str = "--tokenizer") -> None:
    """Before any work: a local tokenizer path must be a directory holding a tokenizer (a Hub id is tried when the
    tokenizer is loaded, which ``load_tokenizer`` then reports)."""
    if not path or not looks_local(path):
        return
    p = Path(path).expanduser()
    if not p.exists():
        raise PreprocessError(f"{option} {path}: no such directory (give a tokenizer or model directory, or a Hub id)")
    if not p.is_dir():
        raise PreprocessError(f"{option} {path}: not a directory (give the tokenizer's or model's directory)")
    if not any((p / f).is_file() for f in ("tokenizer_config.json", "tokenizer.json", "tokenizer.model")):
        raise PreprocessError(
            f"{option} {path}: no tokenizer in this directory (tokenizer_config.json / tokenizer.json not found)"
        )


def load_tokenizer(path: str, option: str = "--tokenizer", tag: str = "preprocess") -> Any:
    """A Hugging Face tokenizer from a local directory (or a Hub id when online); a PreprocessError naming the path
    when it cannot be loaded."""
    check_tokenizer_path(path, option)
    if not looks_local(path):
        from data_preprocess.hub import prepare

        prepare(tag)
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(os.path.expanduser(path))
    except Exception as e:  # OSError (no such repo, offline), ValueError (no tokenizer class), ...
        raise PreprocessError(f"{option} {path}: could not load a tokenizer ({_reason(e)})") from e


def prompt_token_lengths(
    prompts: Sequence[list[dict[str, str]]], tokenizer: Any, progress: bool, chat_template: str | None = None
) -> list[int]:
    """Tokens of each prompt as verl counts them (``RLHFDataset`` filter): the chat template (``chat_template``
    when given, as the launch script's ``custom_chat_template``; else the tokenizer's) with the generation prompt,
    no extra special tokens. Tokenised in batches."""
    from tqdm.auto import tqdm

    if chat_template is None and getattr(tokenizer, "chat_template", None) is None:
        raise PreprocessError("the tokenizer has no chat template; verl applies one to every prompt")
    lengths: list[int] = []
    batch = 512
    for start in tqdm(range(0, len(prompts), batch), desc="prompt lengths", unit="batch", disable=not progress):
        texts = [
            tokenizer.apply_chat_template(
                list(p), add_generation_prompt=True, tokenize=False, chat_template=chat_template
            )
            for p in prompts[start : start + batch]
        ]
        encoded = tokenizer(texts, add_special_tokens=False)["input_ids"]
        lengths.extend(len(ids) for ids in encoded)
    return lengths


# --------------------------------------------------------------------------------------------- output rows


def verl_row(
    *,
    data_source: str,
    prompt: list[dict[str, str]],
    ground_truth: str,
    index: int,
    split: str,
    qid: str,
    source_row: int,
    sample: int = 0,
    agent_name: str | None = None,
) -> dict[str, Any]:
    row = {
        "data_source": data_source,
        "prompt": prompt,
        "ability": ABILITY,
        "reward_model": {"ground_truth": ground_truth, "style": REWARD_STYLE},
        "extra_info": {
            "index": index,
            "split": split,
            "question_id": qid,
            "source_row": source_row,
            "sample": sample,
        },
    }
    if agent_name is not None:
        row["agent_name"] = agent_name
    return row


def verl_schema(rows: Sequence[Mapping[str, Any]]) -> pa.Schema:
    """``VERL_SCHEMA``, plus the ``agent_name`` column when the rows carry one (files without it stay as they were)."""
    if any("agent_name" in r for r in rows):
        return VERL_SCHEMA.append(pa.field("agent_name", pa.string()))
    return VERL_SCHEMA


def _existing_ancestor(path: Path) -> Path:
    path = path.absolute()
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def check_output_dir(directory: str | Path, option: str, shown: str | Path | None = None) -> None:
    """Before any work: ``directory`` exists as a directory we can write in, or can be made (its nearest existing
    ancestor is a writable directory). Nothing is created. The message names ``shown`` (default: the directory)."""
    d = Path(directory).expanduser()
    shown = directory if shown is None else shown
    base = _existing_ancestor(d)
    if not base.is_dir():
        raise PreprocessError(f"{option} {shown}: cannot be written, {base} is a file, not a directory")
    try:
        with tempfile.TemporaryFile(dir=base):
            pass
    except OSError as e:
        raise PreprocessError(
            f"{option} {shown}: cannot be written, nothing can be created in {base} ({_reason(e)})"
        ) from e


def check_output_file(path: str | Path, option: str) -> None:
    """Before any work: ``path`` is a .parquet file name whose directory can be written (``check_output_dir``)."""
    p = Path(path).expanduser()
    if p.suffix != ".parquet":
        raise PreprocessError(f"{option} must be a .parquet file, got {path}")
    if p.is_dir():
        raise PreprocessError(f"{option} {path}: is a directory")
    check_output_dir(p.parent, option, shown=path)


def write_verl_parquet(rows: Sequence[Mapping[str, Any]], path: str | Path) -> Path:
    """Write rows with ``verl_schema(rows)`` to ``path`` (temporary name, then rename: no half-written file)."""
    return write_verl_parquets([(rows, path)])[0]


def write_verl_parquets(outputs: Sequence[tuple[Sequence[Mapping[str, Any]], str | Path]]) -> list[Path]:
    """Write several files all or nothing: each to a temporary name first; only when every one is written are
    they renamed into place, so a failure leaves none of them (and no temporary) behind."""
    paths = [Path(p) for _, p in outputs]
    for path in paths:
        if path.suffix != ".parquet":
            raise PreprocessError(f"output must be a .parquet file, got {path}")
    seen: dict[Path, int] = {}
    for path in paths:
        seen[path.resolve()] = seen.get(path.resolve(), 0) + 1
    clashes = sorted(str(p) for p, n in seen.items() if n > 1)
    if clashes:
        raise PreprocessError(f"two outputs would be written to the same file: {', '.join(clashes)}")
    temps: list[Path] = []
    current = paths[0] if paths else None
    try:
        for rows, path in zip((r for r, _ in outputs), paths, strict=True):
            current = path
            path.parent.mkdir(parents=True, exist_ok=True)
            table = pa.Table.from_pylist(list(rows), schema=verl_schema(rows))
            tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
            temps.append(tmp)
            pq.write_table(table, tmp)
        for tmp, path in zip(temps, paths, strict=True):
            current = path
            os.replace(tmp, path)
    except BaseException as e:
        for tmp in temps:
            tmp.unlink(missing_ok=True)
        if isinstance(e, (OSError, pa.ArrowException)):  # a full disk, a directory that went away, ...
            raise PreprocessError(f"cannot write {current} ({_reason(e)})") from e
        raise
    return paths


@dataclass
class Report:
    """Row counts of one command run, printed at the end and returned by ``run``."""

    source: str
    counts: dict[str, int] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    def add(self, key: str, n: int) -> None:
        self.counts[key] = self.counts.get(key, 0) + n

    def format(self) -> str:
        width = max((len(k) for k in self.counts), default=0)
        lines = [f"[{self.source}]"] + [f"  {k:<{width}}  {v:>8,}" for k, v in self.counts.items()]
        lines += [f"  note: {n}" for n in self.notes]
        return "\n".join(lines)


def command_main(parser: Any, run: Any, argv: Sequence[str] | None = None) -> int:
    """The main of a one-output preprocessing command: parse, check ``--max-prompt-tokens``, run, print the report;
    a PreprocessError prints ``error: ...`` and exits 2 (nothing is written: the commands write only at the end)."""
    args = parser.parse_args(argv)
    if args.max_prompt_tokens < 1:
        raise SystemExit(f"--max-prompt-tokens must be >= 1, got {args.max_prompt_tokens}")
    try:
        report = run(args)
    except PreprocessError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(report.format())
    return 0
