"""Answer generation for the evaluation protocol (docs/algorithm.md §12): data loading, prompt rendering, the
sample plan (avg@32 on AIME/AMC, one sample elsewhere), and a resumable JSONL writer. The vLLM and Hugging Face
backends are in ``exgrpo.eval.backends``.

Resumability: every generated sample is one JSONL line keyed by ``(row, sample)`` — the row's position in the
parquet and the sample's index within that row. Lines are written and flushed after every batch; a restart reads
the file, drops a torn last line, and generates only the ``(row, sample)`` pairs that are missing. A sidecar
``<file>.meta.json`` records the settings that shape a generation (model, backend, template, system prompt,
sampling, seed); resuming with different settings is refused so one file never mixes two configurations.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import pathlib
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from exgrpo.eval.backends import GenerationBackend, SamplingSettings
from exgrpo.eval.metrics import canonical_benchmark, protocol_samples_per_question
from exgrpo.prompts import llama_base_prompt

REQUIRED_COLUMNS = ("data_source", "prompt", "reward_model")
#: the keys of a generation record (one line of OUT/generations/<data>.jsonl) that a backend's extras may not take
RECORD_KEYS = frozenset(
    ("row", "sample", "data_source", "benchmark", "question_id", "ground_truth", "response", "num_tokens")
) | {"finish_reason"}

# --- data ----------------------------------------------------------------------------------------------------


@dataclass
class EvalRow:
    """One row of a verl benchmark parquet."""

    row: int  # position in the parquet file (stable key for resuming, independent of any filtering)
    data_source: str
    benchmark: str  # canonical key (see metrics.canonical_benchmark)
    question_id: str  # same for the repeated copies of one question (test_id.parquet repeats AIME/AMC 32x)
    messages: list[dict[str, str]]
    ground_truth: str | list[str]


def _question_id(messages: Sequence[Mapping[str, str]], ground_truth: str | list[str]) -> str:
    # The system prompt is excluded so that replacing it does not split a question into two.
    payload = json.dumps(
        [[m["role"], m["content"]] for m in messages if m["role"] != "system"] + [ground_truth],
        ensure_ascii=False,
    )
    return hashlib.sha1(payload.encode("utf-8")).hexdigest()[:16]


def load_benchmark_rows(
    path: str | os.PathLike,
    *,
    data_sources: Sequence[str] | None = None,
    max_questions_per_source: int | None = None,
    max_rows: int | None = None,
) -> list[EvalRow]:
    """Read a verl parquet (``data_source``, ``prompt`` [{role, content}], ``reward_model.ground_truth``).

    ``data_sources`` keeps only those benchmarks (canonical or raw names); ``max_questions_per_source`` keeps the
    first N distinct questions of each benchmark with all their repeated rows; ``max_rows`` keeps the first N rows
    left after the other filters. Row numbers stay the file positions.
    """
    import pyarrow.parquet as pq

    path = pathlib.Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"benchmark parquet not found: {path}")
    table = pq.read_table(path)
    missing = [c for c in REQUIRED_COLUMNS if c not in table.column_names]
    if missing:
        raise ValueError(f"{path}: missing column(s) {missing}; expected verl format with {list(REQUIRED_COLUMNS)}")
    wanted = None if not data_sources else {canonical_benchmark(s) for s in data_sources}
    sources = table.column("data_source").to_pylist()
    prompts = table.column("prompt").to_pylist()
    rewards = table.column("reward_model").to_pylist()
    rows: list[EvalRow] = []
    seen_questions: dict[str, set[str]] = {}
    for i, (src, prompt, reward) in enumerate(zip(sources, prompts, rewards)):
        bench = canonical_benchmark(src)
        if wanted is not None and bench not in wanted:
            continue
        if not isinstance(prompt, list) or not prompt or not all({"role", "content"} <= set(m) for m in prompt):
            raise ValueError(f"{path}: row {i}: column 'prompt' must be a non-empty list of {{role, content}}")
        if not isinstance(reward, Mapping) or "ground_truth" not in reward:
            raise ValueError(f"{path}: row {i}: column 'reward_model' must hold a 'ground_truth' field")
        messages = [{"role": str(m["role"]), "content": str(m["content"])} for m in prompt]
        gt = reward["ground_truth"]
        # A list is a set of acceptable answers: kept as a list, the reward's checker accepts any of them.
        gt = [str(x) for x in gt] if isinstance(gt, (list, tuple)) else str(gt)
        qid = _question_id(messages, gt)
        if max_questions_per_source is not None:
            seen = seen_questions.setdefault(bench, set())
            if qid not in seen and len(seen) >= max_questions_per_source:
                continue
            seen.add(qid)
        rows.append(EvalRow(i, str(src), bench, qid, messages, gt))
        if max_rows is not None and len(rows) >= max_rows:
            break
    if not rows:
        counts: dict[str, int] = {}
        for src in sources:
            counts[str(src)] = counts.get(str(src), 0) + 1
        present = ", ".join(f"{src} ({n} rows)" for src, n in sorted(counts.items())) or "none: the file has no rows"
        if wanted is not None:
            raise ValueError(
                f"{path}: no rows left: --data-sources {' '.join(data_sources)} matches none of its data sources "
                f"(present: {present})"
            )
        raise ValueError(f"{path}: no rows left (max_rows={max_rows}; data sources present: {present})")
    return rows


# --- prompts -------------------------------------------------------------------------------------------------


TEMPLATES = ("chat", "plain", "llama_base")


@dataclass
class PromptFormat:
    """How a row's messages become the model's input.

    template: "chat" applies the model's own chat template with the generation prompt (the paper's setting);
              "plain" joins the message contents with blank lines (base models without a chat template);
              "llama_base" is the paper's Llama-3.1-8B base prompt around the user message
              ("User: {question} Answer: Let's think step by step.\n", no system prompt; exgrpo.prompts).
    system_prompt: "" (default) drops the dataset's system message, as the paper's evaluation does, so the
              model's own template decides (Qwen's adds its default system message); None keeps the dataset's;
              any other text replaces it.
    Plain and llama_base prompts start with the tokenizer's BOS token when it has one (a chat template writes
    its own); prompts are tokenised without adding special tokens.
    """

    template: str = "chat"
    system_prompt: str | None = ""

    def __post_init__(self) -> None:
        if self.template not in TEMPLATES:
            raise ValueError(f"template must be one of {TEMPLATES}, got {self.template!r}")

    @property
    def system_prompt_mode(self) -> str:
        if self.template == "llama_base":
            return "none"
        return "dataset" if self.system_prompt is None else "none" if self.system_prompt == "" else "custom"

    def messages(self, messages: Sequence[Mapping[str, str]]) -> list[dict[str, str]]:
        out = [dict(m) for m in messages]
        if self.system_prompt is None:
            return out
        out = [m for m in out if m["role"] != "system"]
        if self.system_prompt:
            out.insert(0, {"role": "system", "content": self.system_prompt})
        return out

    def render(self, tokenizer: Any, messages: Sequence[Mapping[str, str]]) -> str:
        bos = getattr(tokenizer, "bos_token", None) or ""
        if self.template == "llama_base":
            users = [m["content"] for m in messages if m["role"] == "user"]
            if not users:
                raise ValueError("template='llama_base' needs a user message in every row")
            return bos + llama_base_prompt(users[-1])
        msgs = self.messages(messages)
        if self.template == "plain":
            return bos + "\n\n".join(m["content"] for m in msgs) + "\n"
        if getattr(tokenizer, "chat_template", None) is None:
            raise ValueError("template='chat' but the tokenizer has no chat_template; use template='plain'")
        return tokenizer.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)


def chat_template_sha(tokenizer: Any) -> str | None:
    """Short hash of the tokenizer's chat template, recorded with results (templates change scores)."""
    tpl = getattr(tokenizer, "chat_template", None)
    if tpl is None:
        return None
    text = tpl if isinstance(tpl, str) else json.dumps(tpl, sort_keys=True)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


# --- sampling and the sample plan ----------------------------------------------------------------------------


def plan_samples(rows: Sequence[EvalRow], n_samples: int | None = None) -> dict[int, int]:
    """Samples to draw per row, ``{row: n}``.

    With ``n_samples=None`` each question gets the protocol's sample count spread over its repeated rows
    (ceil(target / copies) per row), so both pre-repeated files and one-row-per-question files reach avg@32.
    """
    if n_samples is not None:
        return {r.row: n_samples for r in rows}
    copies: dict[str, int] = {}
    for r in rows:
        copies[r.question_id] = copies.get(r.question_id, 0) + 1
    return {r.row: math.ceil(protocol_samples_per_question(r.benchmark) / copies[r.question_id]) for r in rows}


def sample_seed(seed: int, row: int) -> int:
    """Per-row seed (vLLM seeds each request, so a row's samples do not depend on batching or resumption)."""
    return (seed * 1_000_003 + row) % (2**31 - 1)


# --- resumable JSONL store -----------------------------------------------------------------------------------


class ResumeMismatchError(RuntimeError):
    """An existing generation file was made with different settings."""


@dataclass
class GenerationStore:
    """Append-only JSONL of generations keyed by ``(row, sample)``, with a settings sidecar."""

    path: pathlib.Path
    records: dict[tuple[int, int], dict] = field(default_factory=dict)

    @property
    def meta_path(self) -> pathlib.Path:
        return self.path.with_name(self.path.name + ".meta.json")

    @classmethod
    def open(cls, path: str | os.PathLike, fingerprint: Mapping[str, Any], *, overwrite: bool = False):
        """Open (creating or resuming) a store; refuse to resume one written with a different ``fingerprint``."""
        path = pathlib.Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        store = cls(path)
        if overwrite:
            path.unlink(missing_ok=True)
            store.meta_path.unlink(missing_ok=True)
        store.records = read_generations(path, repair=True)
        if store.meta_path.exists() and store.records:
            old = json.loads(store.meta_path.read_text(encoding="utf-8"))
            diff = sorted(k for k in set(old) | set(fingerprint) if old.get(k) != fingerprint.get(k))
            if diff:
                details = ", ".join(f"{k}: {old.get(k)!r} -> {fingerprint.get(k)!r}" for k in diff)
                raise ResumeMismatchError(
                    f"{path} was generated with other settings ({details}); use another output directory or --overwrite"
                )
        else:  # new, or nothing generated yet: the settings of this run are the file's settings
            store.meta_path.write_text(json.dumps(dict(fingerprint), indent=2, sort_keys=True), encoding="utf-8")
        return store

    def append(self, records: Iterable[dict]) -> None:
        with self.path.open("a", encoding="utf-8") as f:
            for rec in records:
                f.write(json.dumps(rec, ensure_ascii=False) + "\n")
                self.records[(rec["row"], rec["sample"])] = rec
            f.flush()
            os.fsync(f.fileno())


def read_generations(path: str | os.PathLike, *, repair: bool = False) -> dict[tuple[int, int], dict]:
    """Records of a generation JSONL keyed by ``(row, sample)``.

    A torn last line (a crash while writing) is ignored, and with ``repair`` cut from the file so later appends
    start on a clean line; a bad line anywhere else is an error.
    """
    path = pathlib.Path(path)
    records: dict[tuple[int, int], dict] = {}
    if not path.exists():
        return records
    data = path.read_bytes()
    offset = 0
    for lineno, line in enumerate(data.splitlines(keepends=True), start=1):
        end = offset + len(line)
        if line.strip():
            try:
                rec = json.loads(line)
                key = (int(rec["row"]), int(rec["sample"]))
            except (json.JSONDecodeError, KeyError, TypeError, ValueError) as e:
                # Each record is written with its newline in one call: a last line without one is torn.
                if end == len(data) and not line.endswith(b"\n"):
                    if repair:
                        with path.open("r+b") as f:
                            f.truncate(offset)
                    break
                raise ValueError(f"{path}: line {lineno} is not a generation record ({e})") from e
            records[key] = rec
        offset = end
    else:
        if repair and data and not data.endswith(b"\n"):
            with path.open("ab") as f:
                f.write(b"\n")
    return records


def file_sha256(path: str | os.PathLike) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def generation_fingerprint(
    *,
    model: str,
    backend: str,
    data: str,
    prompt_format: PromptFormat,
    sampling: SamplingSettings,
    agent: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Settings a generation depends on. ``n_samples`` is left out: raising it only adds samples. ``agent``: the
    multi-turn settings (tools, turn and length limits; ``EvalConfig.agent``), absent for a single-turn run (so a
    single-turn file written before they existed still resumes)."""
    s = asdict(sampling)
    s.pop("n_samples")
    extra = {"agent": dict(agent)} if agent else {}
    return {
        **extra,
        "model": str(model),
        "backend": backend,
        # the data file's content, not its path: an output directory stays resumable when the data moves
        "data": pathlib.Path(data).name,
        "data_sha256": file_sha256(data),
        "template": prompt_format.template,
        "system_prompt": prompt_format.system_prompt,
        **s,
    }


def generate_to_jsonl(
    backend: GenerationBackend,
    rows: Sequence[EvalRow],
    store: GenerationStore,
    *,
    prompt_format: PromptFormat,
    sampling: SamplingSettings,
    batch_size: int = 8,
    progress: bool = True,
    desc: str | None = None,
    on_batch: Callable[[int], None] | None = None,
    samples: Mapping[int, Sequence[int]] | None = None,
) -> int:
    """Generate every planned ``(row, sample)`` missing from ``store``; return how many samples were generated.

    ``batch_size`` counts sequences (a row with n samples counts n). Each batch is appended and flushed before
    the next starts, so an interruption loses at most one batch. ``samples`` (``{row: [sample, ...]}``) gives
    the samples to draw instead of the plan of ``rows``: a data-parallel replica gets its share this way, since
    the plan of a subset of a question's repeated rows is not the plan of the whole file.
    """
    from tqdm.auto import tqdm

    if samples is None:
        plan = plan_samples(rows, sampling.n_samples)
        samples = {r.row: range(plan[r.row]) for r in rows}
    todo: OrderedDict[int, list[int]] = OrderedDict()
    for r in rows:
        missing = [s for s in samples.get(r.row, ()) if (r.row, s) not in store.records]
        if missing:
            todo[r.row] = missing
    total = sum(len(v) for v in todo.values())
    by_row = {r.row: r for r in rows}
    batches: list[list[int]] = []
    cur: list[int] = []
    cur_n = 0
    for row, missing in todo.items():
        if cur and cur_n + len(missing) > batch_size:
            batches.append(cur)
            cur, cur_n = [], 0
        cur.append(row)
        cur_n += len(missing)
    if cur:
        batches.append(cur)
    done = 0
    bar = tqdm(total=total, desc=desc or store.path.stem, unit="sample", disable=not progress)
    try:
        for batch in batches:
            ns = [len(todo[r]) for r in batch]
            seeds = [sample_seed(sampling.seed, r) for r in batch]
            if getattr(backend, "takes_messages", False):  # a multi-turn backend renders the template itself
                messages = [prompt_format.messages(by_row[r].messages) for r in batch]
                outs = backend.generate(messages, ns, seeds, sample_ids=[todo[r] for r in batch])
            else:
                prompts = [prompt_format.render(backend.tokenizer, by_row[r].messages) for r in batch]
                outs = backend.generate(prompts, ns, seeds)
            if len(outs) != len(batch) or any(len(o) != k for o, k in zip(outs, ns)):
                raise RuntimeError(f"backend {backend.name!r} returned a wrong number of completions")
            records = []
            for r, comps in zip(batch, outs):
                row = by_row[r]
                for s, c in zip(todo[r], comps):
                    if set(c.extra) & RECORD_KEYS:
                        raise RuntimeError(f"backend {backend.name!r} reports {sorted(set(c.extra) & RECORD_KEYS)}")
                    records.append(
                        {
                            "row": r,
                            "sample": s,
                            "data_source": row.data_source,
                            "benchmark": row.benchmark,
                            "question_id": row.question_id,
                            "ground_truth": row.ground_truth,
                            "response": c.text,
                            "num_tokens": c.num_tokens,
                            "finish_reason": c.finish_reason,
                            **c.extra,
                        }
                    )
            store.append(records)
            done += len(records)
            bar.update(len(records))
            if on_batch is not None:
                on_batch(done)
    finally:
        bar.close()
    return done
