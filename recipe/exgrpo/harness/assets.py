"""Offline assets for CPU tests and the demo: tiny Qwen2 model, byte-level tokenizer, toy data, SFT warm-up.

Nothing is downloaded. ``build_assets()`` writes, into one directory:

- ``tokenizer`` files inside each model directory: a byte-level BPE over the 256 byte symbols with **no merges**
  (token id == byte value), plus ``<|im_end|>`` (eos), ``<|endoftext|>`` (pad), ``<|im_start|>`` and a ChatML
  chat template. It is saved as a ``Qwen2Tokenizer`` so transformers 5 reloads it identically and verl's Qwen
  checks pass (``"\\n"`` is one token, docs/cpu_backend.md).
- ``model_init/``: a randomly initialised Qwen2-architecture causal LM (hidden 64, 2 layers, sdpa attention).
- ``model/``: the same model after a short supervised warm-up on toy arithmetic, so that at temperature 1.0 it
  solves part of the questions: the analogue of starting RL from a base model that already solves some problems.
  Without it every reward is 0, no question is partially solved and ExGRPO's experience pool never fills
  (docs/algorithm.md §3).
- ``data/train.parquet``, ``data/val.parquet``: the toy arithmetic splits (data_preprocess/toy_arithmetic.py).
  The warm-up trains on *other* questions of the same kind, so RL and validation questions are unseen.
- ``assets.json``: the settings, their hash, the build environment, the sha256 of every other file (the manifest),
  the measured pass rate and the warm-up time.

The build is deterministic: it runs on one intra-op thread (whatever the caller's thread count) with seeded
generators, so the same digest gives the same bytes. The digest covers the settings *and* what the bytes depend on
beyond them: the versions of torch, transformers, tokenizers, safetensors and pyarrow, and the CPU kernels'
instruction set torch dispatches to (float sums are computed in another order on AVX2 than on AVX-512).

``ensure_assets()`` caches the result under ``<repo>/.cache/exgrpo-assets/<digest>/`` (built once, atomically,
under a file lock), so a test session or the demo builds it once. Each use checks the files against the manifest:
a missing or changed file moves the directory aside (``<digest>.broken-<time>``, with a message naming the file)
and rebuilds it, so a partial asset is never used.

CLI: ``python -m recipe.exgrpo.harness.assets --out DIR`` (copies the cached build there) or without ``--out`` to
print where the cache is.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import fcntl
import hashlib
import json
import os
import random
import re
import shutil
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from data_preprocess.toy_arithmetic import (
    ToyArithmeticConfig,
    answer,
    generate_splits,
    held_out_questions,
    question_text,
    write_parquet,
)
from recipe.exgrpo.cpu import CPU_ROLLOUTS
from recipe.exgrpo.harness.procedure_task import (
    CAREFUL,
    PROCEDURE_DATA,
    QUICK,
    ProcedureSpec,
    criteria_problems,
    procedure_report,
    procedure_response,
)
from recipe.exgrpo.harness.tool_task import (
    ToolUseSpec,
    add_tool_tokens,
    encode_tool_exchange,
    expression_of,
    tool_data,
    tool_exchange_counts,
)

# Bump when the builder's behaviour changes in a way the settings below do not capture.
BUILDER_VERSION = 3
# the intra-op threads of the build: one, so that no reduction depends on the machine's core count
BUILD_THREADS = 1
MANIFEST_KEY = "files"
# the libraries whose versions decide the bytes (kernels, initialisation, serialisation); numpy is not among them
# (the build draws from torch's and Python's generators), so the vLLM stack's venv, with another numpy, shares them
BUILD_LIBRARIES = ("torch", "transformers", "tokenizers", "safetensors", "pyarrow")
# settings that force a kernel path: torch's own kernels (ATEN_CPU_CAPABILITY, which cpu_capability then reports)
# and the libraries it calls for matrix products, which pick theirs by processor, not by torch's capability. An
# AVX-512 machine forced to avx2 reports torch's AVX2 capability yet builds other bytes than an AVX2 machine
# (measured: the one-turn model passed 0.302 against 0.343), so a forced path is part of the digest.
DISPATCH_ENV = ("ATEN_CPU_CAPABILITY", "MKL_CBWR", "MKL_ENABLE_INSTRUCTIONS", "ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA")
REPO_ROOT = Path(__file__).resolve().parents[3]
DEFAULT_CACHE_ROOT = REPO_ROOT / ".cache" / "exgrpo-assets"
CACHE_ENV = "EXGRPO_ASSETS_CACHE"

EOS_TOKEN = "<|im_end|>"
PAD_TOKEN = "<|endoftext|>"
IM_START = "<|im_start|>"
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


@dataclass(frozen=True)
class TinyModelSpec:
    """Qwen2 architecture settings of the tiny model (about 0.1 M parameters at the defaults)."""

    hidden_size: int = 64
    num_hidden_layers: int = 2
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    intermediate_size: int = 256
    max_position_embeddings: int = 256
    rope_theta: float = 10000.0
    init_seed: int = 0


@dataclass(frozen=True)
class WarmupSpec:
    """Supervised warm-up: next-token loss on the response (``\\boxed{answer}<|im_end|>``) of toy questions."""

    steps: int = 780
    batch_size: int = 64
    lr: float = 3e-3
    warmup_steps: int = 50
    weight_decay: float = 0.0
    seed: int = 0
    # SFT questions drawn from each difficulty level, outside the RL and validation splits
    questions_per_level: int = 8000
    # SFT targets are "</think>\\boxed{<answer>}"; this share of them omits the "</think>" (a format slip the
    # warmed-up model then makes at about that rate, and that the recipe's think-gated reward trains away)
    unclosed_think_rate: float = 0.5
    # the report's spread: every validation question sampled this many times (K of the RL runs)
    eval_samples_per_question: int = 8
    eval_temperature: float = 1.0
    eval_max_new_tokens: int = 24


# vLLM's CPU attention takes head sizes 32, 64, 80, 96, ... only (not the default model's 16): the model verl's
# vLLM rollout serves on CPU has 2 query heads of 32 (1 key/value head) in the same hidden size, so every weight
# keeps its shape and the parameter count is the same.
VLLM_MODEL = TinyModelSpec(num_attention_heads=2, num_key_value_heads=1)


@dataclass(frozen=True)
class AssetSpec:
    model: TinyModelSpec = field(default_factory=TinyModelSpec)
    warmup: WarmupSpec = field(default_factory=WarmupSpec)
    data: ToyArithmeticConfig = field(default_factory=ToyArithmeticConfig)
    # the calculator task's assets (recipe/exgrpo/harness/tool_task.py): tool tokens, calculator exchanges in the
    # warm-up, every row served by verl's tool agent loop; None: the one-turn task
    tools: ToolUseSpec | None = None
    # the procedure-choice task's assets (recipe/exgrpo/harness/procedure_task.py): its levels and the two procedures
    # in the warm-up; None: the one-turn sums
    procedures: ProcedureSpec | None = None

    def __post_init__(self) -> None:
        if self.tools is not None and self.procedures is not None:
            raise ValueError("an asset is the calculator task (tools) or the procedure-choice task, not both")

    def to_dict(self) -> dict[str, Any]:
        out = {"builder_version": BUILDER_VERSION, **asdict(self)}
        for task in ("tools", "procedures"):  # so the other assets keep the digest (and the bytes) they had before
            if out[task] is None:
                del out[task]
        return out

    def digest(self) -> str:
        """The cache key: the settings and the build environment (``build_environment()``)."""
        blob = json.dumps({**self.to_dict(), "environment": build_environment()}, sort_keys=True, default=list)
        return hashlib.sha256(blob.encode()).hexdigest()[:16]


def build_environment() -> dict[str, Any]:
    """What the built bytes depend on besides the settings: library versions, the CPU kernels' instruction set, the
    build's thread count."""
    from importlib.metadata import PackageNotFoundError, version

    versions = {}
    for name in BUILD_LIBRARIES:
        try:
            versions[name] = version(name)
        except PackageNotFoundError:
            versions[name] = None
    env = {
        "libraries": versions,
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "threads": BUILD_THREADS,
    }
    forced = {name: os.environ[name] for name in DISPATCH_ENV if os.environ.get(name)}
    if forced:  # only when set, so that the usual build keeps its digest
        env["dispatch_env"] = forced
    return env


# The calculator task's warm-up: no answer omits its "</think>" (the one-turn demo's format slip is what its RL
# learns first; here the gain would mix it with the tool's), a quarter of the examples are calculator exchanges.
TOOLS_WARMUP = WarmupSpec(unclosed_think_rate=0.0)
# The procedure-choice task's warm-up: the think block always closed (the format is right at step 0), and answers up
# to "careful</think>\boxed{123}<|im_end|>" (27 tokens) sampled whole in the report.
PROCEDURES_WARMUP = WarmupSpec(unclosed_think_rate=0.0, eval_max_new_tokens=32)


def asset_spec(
    rollout: str = "hf", tools: bool = False, call_share: float | None = None, procedures: bool = False
) -> AssetSpec:
    """The assets a CPU run on ``rollout`` uses: the default model for ``hf``, the head-size-32 one for ``vllm``;
    with ``tools`` the calculator task's (the same model, taught the calculator in its warm-up; ``call_share``: the
    share of warm-up examples that call it, default :class:`ToolUseSpec`'s); with ``procedures`` the procedure-choice
    task's (recipe/exgrpo/harness/procedure_task.py)."""
    models = {"hf": AssetSpec().model, "vllm": VLLM_MODEL}
    if rollout not in CPU_ROLLOUTS:
        raise ValueError(f"rollout must be one of {list(CPU_ROLLOUTS)}, got {rollout!r}")
    if call_share is not None and not tools:
        raise ValueError("call_share is the calculator task's: it needs tools=True")
    if tools and procedures:
        raise ValueError("tools and procedures are two tasks: pick one")
    if procedures:
        return AssetSpec(
            model=models[rollout], warmup=PROCEDURES_WARMUP, data=PROCEDURE_DATA, procedures=ProcedureSpec()
        )
    if tools:
        tool_spec = ToolUseSpec() if call_share is None else ToolUseSpec(call_share=call_share)
        return AssetSpec(model=models[rollout], warmup=TOOLS_WARMUP, tools=tool_spec)
    return AssetSpec(model=models[rollout])


@dataclass(frozen=True)
class Assets:
    """Paths of one built asset directory."""

    root: Path

    @property
    def model_path(self) -> Path:
        """The warmed-up model (what RL starts from)."""
        return self.root / "model"

    @property
    def init_model_path(self) -> Path:
        return self.root / "model_init"

    @property
    def train_file(self) -> Path:
        return self.root / "data" / "train.parquet"

    @property
    def val_file(self) -> Path:
        return self.root / "data" / "val.parquet"

    @property
    def report(self) -> dict[str, Any]:
        return json.loads((self.root / "assets.json").read_text())


# ---------------------------------------------------------------------------------------------- tokenizer / model
def build_tokenizer():
    """Byte-level BPE over the 256 byte symbols, no merges, ChatML specials; token id == byte value."""
    from transformers.convert_slow_tokenizer import bytes_to_unicode
    from transformers.models.qwen2.tokenization_qwen2 import Qwen2Tokenizer

    byte_to_symbol = bytes_to_unicode()
    vocab = {byte_to_symbol[b]: b for b in range(256)}
    tokenizer = Qwen2Tokenizer(vocab=vocab, merges=[], eos_token=EOS_TOKEN, pad_token=PAD_TOKEN, unk_token=None)
    tokenizer.add_special_tokens({"additional_special_tokens": [IM_START, EOS_TOKEN]})
    tokenizer.chat_template = CHAT_TEMPLATE
    tokenizer.model_max_length = 4096
    return tokenizer


def build_model(spec: TinyModelSpec, tokenizer):
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=spec.hidden_size,
        intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.num_hidden_layers,
        num_attention_heads=spec.num_attention_heads,
        num_key_value_heads=spec.num_key_value_heads,
        max_position_embeddings=spec.max_position_embeddings,
        rope_theta=spec.rope_theta,
        tie_word_embeddings=False,
        bos_token_id=None,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        attn_implementation="sdpa",
        dtype="float32",
    )
    config.architectures = ["Qwen2ForCausalLM"]
    torch.manual_seed(spec.init_seed)
    model = Qwen2ForCausalLM(config)
    model.generation_config = GenerationConfig(
        eos_token_id=[tokenizer.eos_token_id, tokenizer.pad_token_id],
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=None,
        do_sample=True,
        temperature=1.0,
        top_p=1.0,
        top_k=0,
    )
    return model


def save_model(model, tokenizer, path: Path) -> None:
    path.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(path, safe_serialization=True)
    tokenizer.save_pretrained(path)


# ---------------------------------------------------------------------------------------------- warm-up
BOXED = re.compile(r"\\boxed\{([^{}]*)\}")


THINK_CLOSE = "</think>"


def response_text(ground_truth: str, close_think: bool = True) -> str:
    return f"{THINK_CLOSE if close_think else ''}\\boxed{{{ground_truth}}}"


def last_boxed(text: str) -> str | None:
    found = BOXED.findall(text)
    return found[-1].strip() if found else None


def _encode_example(tokenizer, question: str, ground_truth: str, close_think: bool = True) -> tuple[list[int], int]:
    """Prompt + response ids and the number of prompt tokens (the loss covers only the response)."""
    return _encode_response(tokenizer, question, response_text(ground_truth, close_think))


def _encode_response(tokenizer, question: str, response: str) -> tuple[list[int], int]:
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": question}], add_generation_prompt=True, tokenize=False
    )
    prompt_ids = tokenizer.encode(prompt, add_special_tokens=False)
    response_ids = tokenizer.encode(response, add_special_tokens=False) + [tokenizer.eos_token_id]
    return prompt_ids + response_ids, len(prompt_ids)


def warmup_questions(data: ToyArithmeticConfig, per_level: int, seed: int = 0) -> dict[str, list[tuple[int, str, int]]]:
    """Per level, questions of the toy splits' kind but in neither split (RL and validation stay unseen)."""
    out: dict[str, list[tuple[int, str, int]]] = {}
    for q, level in held_out_questions(data, per_level, seed=seed):
        out.setdefault(level, []).append(q)
    return out


def sft_warmup(
    model,
    tokenizer,
    questions: dict[str, list[tuple[int, str, int]]] | list[tuple[int, str, int]],
    spec: WarmupSpec,
    tools: ToolUseSpec | None = None,
    procedures: ProcedureSpec | None = None,
) -> dict[str, float]:
    """Plain next-token SFT on the response tokens (AdamW, linear warm-up then cosine decay).

    ``questions`` per level: every example draws a level uniformly, then a question of it, so each level gets the
    same share of the warm-up however many distinct questions it has (a plain list is one level). With ``tools``, a
    ``tools.call_share`` of the examples are calculator exchanges (``tool_task.encode_tool_exchange``: the loss on
    the model's two turns, not on the tool's); without it the random draws are those of the one-turn warm-up. With
    ``procedures``, a ``procedures.careful_share`` of the examples follow the careful procedure, the others the quick
    one (``procedure_task.procedure_response``), the think block always closed.
    """
    rng = random.Random(spec.seed)
    torch.manual_seed(spec.seed)
    by_level = questions if isinstance(questions, dict) else {"all": questions}

    def encode(q: tuple[int, str, int]) -> tuple:
        if procedures is not None:
            a, _, b = q
            return tuple(
                _encode_response(tokenizer, question_text(*q), procedure_response(p, a, b)) for p in (CAREFUL, QUICK)
            )
        closed = _encode_example(tokenizer, question_text(*q), str(answer(*q)), close_think=True)
        unclosed = _encode_example(tokenizer, question_text(*q), str(answer(*q)), close_think=False)
        if tools is None:
            return closed, unclosed
        exchanges = tuple(
            encode_tool_exchange(tokenizer, question_text(*q), expression_of(*q), response_text(str(answer(*q)), c))
            for c in (True, False)
        )
        return closed, unclosed, *exchanges

    pools = [[encode(q) for q in qs] for qs in by_level.values() if qs]
    if not pools:
        raise ValueError("the SFT warm-up got no questions")
    pad = tokenizer.pad_token_id
    optim = torch.optim.AdamW(model.parameters(), lr=spec.lr, weight_decay=spec.weight_decay)

    def lr_at(step: int) -> float:
        if step < spec.warmup_steps:
            return (step + 1) / spec.warmup_steps
        progress = (step - spec.warmup_steps) / max(1, spec.steps - spec.warmup_steps)
        return 0.5 * (1.0 + torch.cos(torch.tensor(progress * torch.pi)).item())

    sched = torch.optim.lr_scheduler.LambdaLR(optim, lr_at)
    model.train()
    losses = []
    from tqdm import tqdm

    for _ in tqdm(range(spec.steps), desc="SFT warm-up of the tiny model", unit="step", mininterval=2.0):
        picked = [pools[rng.randrange(len(pools))] for _ in range(spec.batch_size)]
        pairs = [pool[rng.randrange(len(pool))] for pool in picked]
        if procedures is not None:
            batch = [careful if rng.random() < procedures.careful_share else quick for careful, quick in pairs]
        elif tools is None:
            batch = [unclosed if rng.random() < spec.unclosed_think_rate else closed for closed, unclosed in pairs]
        else:
            batch = []
            for closed, unclosed, tool_closed, tool_unclosed in pairs:
                call = rng.random() < tools.call_share
                slip = rng.random() < spec.unclosed_think_rate
                batch.append((tool_unclosed if slip else tool_closed) if call else (unclosed if slip else closed))
        width = max(len(example[0]) for example in batch)
        input_ids = torch.full((len(batch), width), pad, dtype=torch.long)
        labels = torch.full((len(batch), width), -100, dtype=torch.long)
        attention_mask = torch.zeros((len(batch), width), dtype=torch.long)
        for i, example in enumerate(batch):
            ids = example[0]
            input_ids[i, : len(ids)] = torch.tensor(ids)
            if len(example) == 2:  # (ids, n_prompt): every response token
                labels[i, example[1] : len(ids)] = torch.tensor(ids[example[1] :])
            else:  # (ids, mask, n_prompt): the model's turns only
                keep = torch.tensor(example[1], dtype=torch.bool)
                labels[i, : len(ids)] = torch.where(keep, torch.tensor(ids), torch.tensor(-100))
            attention_mask[i, : len(ids)] = 1
        loss = model(input_ids=input_ids, attention_mask=attention_mask, labels=labels).loss
        optim.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optim.step()
        sched.step()
        losses.append(loss.item())
    model.eval()
    tail = losses[-50:]
    return {"final_loss": sum(tail) / len(tail), "first_loss": losses[0]}


@torch.no_grad()
def success_counts(
    model,
    tokenizer,
    rows: list[dict],
    samples_per_question: int,
    temperature: float,
    max_new_tokens: int,
    seed: int = 0,
    think_gate: bool = True,
) -> list[int]:
    """For each row, how many of ``samples_per_question`` sampled responses have the right last ``\\boxed{}``.

    With ``think_gate`` (the recipe's reward default) only the text after ``</think>`` counts and a response
    without it scores 0; without it, any response whose last ``\\boxed{}`` is right counts (the arithmetic).
    """
    correct = [0] * len(rows)
    for texts in sampled_responses(model, tokenizer, rows, samples_per_question, temperature, max_new_tokens, seed):
        for i, (row, text) in enumerate(zip(rows, texts, strict=True)):
            if think_gate:
                if THINK_CLOSE not in text:
                    continue
                text = text.rsplit(THINK_CLOSE, 1)[1]
            correct[i] += int(last_boxed(text) == row["reward_model"]["ground_truth"])
    return correct


def left_padded_prompts(tokenizer, rows: list[dict]) -> tuple[torch.Tensor, torch.Tensor]:
    """The rows' chat-templated prompts as one left-padded batch: ``input_ids`` and ``attention_mask``."""
    prompts = [tokenizer.apply_chat_template(row["prompt"], add_generation_prompt=True, tokenize=False) for row in rows]
    encoded = [tokenizer.encode(p, add_special_tokens=False) for p in prompts]
    width = max(len(e) for e in encoded)
    input_ids = torch.full((len(encoded), width), tokenizer.pad_token_id, dtype=torch.long)
    attention_mask = torch.zeros_like(input_ids)
    for i, ids in enumerate(encoded):
        input_ids[i, width - len(ids) :] = torch.tensor(ids)
        attention_mask[i, width - len(ids) :] = 1
    return input_ids, attention_mask


@torch.no_grad()
def sampled_responses(
    model,
    tokenizer,
    rows: list[dict],
    samples_per_question: int,
    temperature: float,
    max_new_tokens: int,
    seed: int = 0,
) -> list[list[str]]:
    """``samples_per_question`` rounds of one sampled response per row (special tokens dropped), round by round."""
    from transformers import GenerationConfig

    torch.manual_seed(seed)
    input_ids, attention_mask = left_padded_prompts(tokenizer, rows)
    width, pad = input_ids.shape[1], tokenizer.pad_token_id
    gen_cfg = GenerationConfig(
        max_new_tokens=max_new_tokens,
        do_sample=temperature > 0,
        temperature=temperature if temperature > 0 else 1.0,
        top_p=1.0,
        top_k=0 if temperature > 0 else None,
        eos_token_id=[tokenizer.eos_token_id, pad],
        pad_token_id=pad,
        bos_token_id=None,
    )
    rounds = []
    for _ in range(samples_per_question):
        out = model.generate(input_ids=input_ids, attention_mask=attention_mask, generation_config=gen_cfg)
        rounds.append(tokenizer.batch_decode(out[:, width:], skip_special_tokens=True))
    return rounds


def spread_report(rows: list[dict], counts: list[int], samples_per_question: int) -> dict[str, Any]:
    """Pass rate and per-question success-count histogram (k = 0..K), overall and per difficulty level.

    The histogram is what ExGRPO's buckets feed on: questions with 0 < k < K are partially solved and enter the
    experience pool; k = K questions retire; k = 0 ones give no learning signal.
    """

    def summary(ks: list[int]) -> dict[str, Any]:
        n = max(1, len(ks))
        return {
            "questions": len(ks),
            "pass_rate": sum(ks) / (n * samples_per_question),
            "all_solved_fraction": sum(k == samples_per_question for k in ks) / n,
            "none_solved_fraction": sum(k == 0 for k in ks) / n,
            "success_count_histogram": [sum(k == j for k in ks) for j in range(samples_per_question + 1)],
        }

    by_level: dict[str, list[int]] = {}
    for row, k in zip(rows, counts, strict=True):
        by_level.setdefault(row["extra_info"].get("difficulty", "all"), []).append(k)
    return {**summary(list(counts)), "per_level": {level: summary(ks) for level, ks in by_level.items()}}


def tool_use_report(model, tokenizer, rows: list[dict], spec: AssetSpec, k: int) -> dict[str, Any]:
    """The calculator task's figures, overall and per level: ``spread_report`` of whole exchanges (the reward RL
    sees), plus the share of exchanges that call the calculator (``call_rate``), that get a number back
    (``answered_rate``), and the pass rate of the exchanges with a call and without one."""
    counts = tool_exchange_counts(
        model,
        tokenizer,
        rows,
        samples_per_question=k,
        temperature=spec.warmup.eval_temperature,
        max_turn_tokens=spec.tools.eval_max_turn_tokens,
        seed=spec.warmup.seed,
    )

    def rates(idx: list[int]) -> dict[str, float]:
        n = max(1, len(idx) * k)
        called = sum(counts["called"][i] for i in idx)
        right_called = sum(counts["correct_called"][i] for i in idx)
        right = sum(counts["correct"][i] for i in idx)
        return {
            "call_rate": called / n,
            "answered_rate": sum(counts["answered"][i] for i in idx) / n,
            # the pass rate of the exchanges that called, and of those that did not (NaN when there are none)
            "pass_rate_with_call": right_called / called if called else float("nan"),
            "pass_rate_without_call": (right - right_called) / (n - called) if n > called else float("nan"),
        }

    report = spread_report(rows, counts["correct"], k)
    report.update(rates(list(range(len(rows)))))
    by_level: dict[str, list[int]] = {}
    for i, row in enumerate(rows):
        by_level.setdefault(row["extra_info"].get("difficulty", "all"), []).append(i)
    for level, idx in by_level.items():
        report["per_level"][level].update(rates(idx))
    return report


# ---------------------------------------------------------------------------------------------- build + cache
def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def file_manifest(root: Path) -> dict[str, str]:
    """sha256 of every file under ``root`` but ``assets.json``, by path relative to ``root`` (sorted)."""
    files = sorted(p for p in root.rglob("*") if p.is_file() and p.relative_to(root).as_posix() != "assets.json")
    return {p.relative_to(root).as_posix(): file_sha256(p) for p in files}


def manifest_problems(root: str | Path) -> list[str]:
    """What is wrong with the asset directory ``root`` against its manifest (empty: every recorded file is there
    with its recorded hash). Files the manifest does not name are allowed."""
    root = Path(root)
    report_path = root / "assets.json"
    if not report_path.is_file():
        return [f"{report_path} is missing"]
    try:
        manifest = json.loads(report_path.read_text())[MANIFEST_KEY]
    except (ValueError, KeyError, TypeError) as exc:
        return [f"{report_path} has no readable manifest ({type(exc).__name__}: {exc})"]
    problems = []
    for rel, expected in manifest.items():
        path = root / rel
        if not path.is_file():
            problems.append(f"{path} is missing")
        elif file_sha256(path) != expected:
            problems.append(f"{path} does not have the sha256 the manifest records ({expected[:12]}...)")
    if not any(rel.startswith("data/") for rel in manifest) or not any(rel.startswith("model/") for rel in manifest):
        problems.append(f"{report_path}'s manifest names no data/ or no model/ file")
    return problems


@contextlib.contextmanager
def _single_threaded():
    """Run the build on ``BUILD_THREADS`` intra-op threads, then give the caller its thread count back."""
    threads = torch.get_num_threads()
    torch.set_num_threads(BUILD_THREADS)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def build_assets(out_dir: str | Path, spec: AssetSpec | None = None) -> Assets:
    """Build everything into ``out_dir`` (overwriting) on one thread, measure the warm-up, write the manifest, and
    return the paths."""
    with _single_threaded():
        return _build_assets(out_dir, spec or AssetSpec())


def _build_assets(out_dir: str | Path, spec: AssetSpec) -> Assets:
    root = Path(out_dir)
    root.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer()
    if spec.tools is not None:
        add_tool_tokens(tokenizer)
    model = build_model(spec.model, tokenizer)
    save_model(model, tokenizer, root / "model_init")
    write_parquet(root / "data", spec.data)
    if spec.tools is not None:  # every row through verl's tool agent loop
        for split in ("train", "val"):
            tool_data(root / "data" / f"{split}.parquet", root / "data" / f"{split}.parquet")

    questions = warmup_questions(spec.data, spec.warmup.questions_per_level, seed=spec.warmup.seed)
    t0 = time.perf_counter()
    losses = sft_warmup(model, tokenizer, questions, spec.warmup, tools=spec.tools, procedures=spec.procedures)
    warmup_seconds = time.perf_counter() - t0
    save_model(model, tokenizer, root / "model")

    val_rows = generate_splits(spec.data)["val"]
    t1 = time.perf_counter()
    k = spec.warmup.eval_samples_per_question
    sampling = dict(
        samples_per_question=k,
        temperature=spec.warmup.eval_temperature,
        max_new_tokens=spec.warmup.eval_max_new_tokens,
        seed=spec.warmup.seed,
    )
    if spec.procedures is not None:
        # the task's criteria figures (docs/learning.md): pass@1 and pass@K per level, the groups without variance
        evaluation = procedure_report(val_rows, sampled_responses(model, tokenizer, val_rows, **sampling))
        evaluation["pass_rate"] = evaluation["pass_at_1"]
        evaluation["criteria_problems"] = criteria_problems(evaluation)
    elif spec.tools is None:
        # what the think-gated reward gives (the spread RL sees), and the arithmetic alone (any last \boxed{})
        evaluation = spread_report(val_rows, success_counts(model, tokenizer, val_rows, **sampling), k)
        arithmetic = spread_report(
            val_rows, success_counts(model, tokenizer, val_rows, think_gate=False, **sampling), k
        )
        evaluation["answer_pass_rate"] = arithmetic["pass_rate"]
        for level, figures in arithmetic["per_level"].items():
            evaluation["per_level"][level]["answer_pass_rate"] = figures["pass_rate"]
    else:  # whole exchanges, the calculator called where the model calls it
        evaluation = tool_use_report(model, tokenizer, val_rows, spec, k)
    report = {
        "spec": spec.to_dict(),
        "digest": spec.digest(),
        "num_parameters": sum(p.numel() for p in model.parameters()),
        "vocab_size": len(tokenizer),
        "warmup_questions": sum(len(qs) for qs in questions.values()),
        "warmup_seconds": round(warmup_seconds, 2),
        "eval_seconds": round(time.perf_counter() - t1, 2),
        "torch_threads": torch.get_num_threads(),
        "environment": build_environment(),
        **losses,
        **evaluation,
        MANIFEST_KEY: file_manifest(root),
    }
    (root / "assets.json").write_text(json.dumps(report, indent=2, default=list) + "\n")
    return Assets(root)


def cache_root() -> Path:
    return Path(os.environ.get(CACHE_ENV, DEFAULT_CACHE_ROOT))


def ensure_assets(spec: AssetSpec | None = None, root: str | Path | None = None) -> Assets:
    """Return the cached assets for ``spec``, building them once (atomic rename, file lock for concurrency)."""
    spec = spec or AssetSpec()
    base = Path(root) if root is not None else cache_root()
    base.mkdir(parents=True, exist_ok=True)
    final = base / spec.digest()
    if final.exists() and not manifest_problems(final):
        return Assets(final)
    with open(base / f".{spec.digest()}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if final.exists():
            problems = manifest_problems(final)
            if not problems:
                return Assets(final)
            aside = base / f"{final.name}.broken-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"
            os.replace(final, aside)
            print(
                f"[exgrpo assets] {final} does not match its manifest ({'; '.join(problems[:3])}"
                f"{'; ...' if len(problems) > 3 else ''}): moved aside to {aside}, rebuilding",
                file=sys.stderr,
                flush=True,
            )
        staging = Path(tempfile.mkdtemp(prefix=f".{spec.digest()}-", dir=base))
        try:
            build_assets(staging, spec)
            if final.exists():
                shutil.rmtree(final)
            os.replace(staging, final)
        finally:
            if staging.exists():
                shutil.rmtree(staging, ignore_errors=True)
    return Assets(final)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Build (or fetch from cache) the tiny CPU model and toy data.")
    parser.add_argument("--out", help="copy the assets into this directory (default: only print the cache path)")
    parser.add_argument("--rebuild", action="store_true", help="build into --out from scratch, ignoring the cache")
    parser.add_argument(
        "--rollout",
        choices=CPU_ROLLOUTS,
        default=CPU_ROLLOUTS[0],
        help="the model for this rollout (vllm: head size 32)",
    )
    parser.add_argument(
        "--tools",
        action="store_true",
        help="the calculator task's assets (tool tokens, calculator exchanges in the warm-up, tool-agent rows)",
    )
    parser.add_argument(
        "--call-share",
        type=float,
        help=f"with --tools: the share of warm-up examples that call the calculator (default "
        f"{ToolUseSpec().call_share}; another value is another asset)",
    )
    parser.add_argument(
        "--procedures",
        action="store_true",
        help="the procedure-choice task's assets (two procedures in the warm-up, levels cut by the carries; "
        "docs/learning.md)",
    )
    parser.add_argument(
        "--random",
        action="store_true",
        help="write only a randomly initialised tiny model with an 8192-position context into --out (no warm-up, no "
        "data, a second): for pipeline checks such as docs/evaluation.md's example",
    )
    args = parser.parse_args(argv)
    if args.call_share is not None and not (args.tools and 0.0 <= args.call_share <= 1.0):
        parser.error(f"--call-share needs --tools and a value in [0, 1], got {args.call_share}")
    if args.random:
        if not args.out:
            parser.error("--random needs --out")
        tokenizer = build_tokenizer()
        spec = dataclasses.replace(asset_spec(args.rollout).model, max_position_embeddings=8192)
        save_model(build_model(spec, tokenizer), tokenizer, Path(args.out))
        print(json.dumps({"model_path": str(Path(args.out)), "max_position_embeddings": 8192}, indent=2))
        return
    if args.tools and args.procedures:
        parser.error("--tools and --procedures are two tasks: pick one")
    spec = asset_spec(args.rollout, tools=args.tools, call_share=args.call_share, procedures=args.procedures)
    if args.rebuild:
        if not args.out:
            parser.error("--rebuild needs --out")
        assets = build_assets(args.out, spec)
    else:
        assets = ensure_assets(spec)
        if args.out:
            shutil.copytree(assets.root, args.out, dirs_exist_ok=True)
            assets = Assets(Path(args.out))
    report = assets.report
    summary = {
        "root": str(assets.root),
        "model_path": str(assets.model_path),
        "train_file": str(assets.train_file),
        "val_file": str(assets.val_file),
        **{k: report[k] for k in ("pass_rate", "warmup_seconds", "num_parameters", "digest")},
    }
    print(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
