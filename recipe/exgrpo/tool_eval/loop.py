"""The evaluation's multi-turn backend: verl's own tool agent loop (``ToolAgentLoop``, the class training's agent-loop
workers instantiate) around the evaluation's engine.

Every answer is one run of verl's loop, built as ``AgentLoopWorker._run_agent_loop`` builds it: the row's messages,
the chat template with the tools' schemas, the ``multi_turn.format`` parser, the tools loaded by verl's loader from
the same file, the turn limits, the tool answer's cut and the response length of the training run
(:class:`~recipe.exgrpo.tool_eval.settings.ToolLoopSettings`). Only the engine behind its ``server_manager`` is the
evaluation's: the hf rollout's batched ``generate`` (``recipe.exgrpo.cpu.hf_rollout``, what the CPU runs train with)
or vLLM's offline engine, each reading a turn's request as verl's vLLM server does (``hf_rollout.sampling_key``: the
new tokens a turn may take). So the token ids of an exchange are training's for the same model outputs
(tests/integration/test_tool_eval.py checks them against verl's ``AgentLoopWorker`` on the training config).

Each answer's randomness follows its row seed and sample index (and the turn), not the batching: a resumed run draws
what an uninterrupted one would have drawn. Per answer the backend reports, beside the decoded exchange: verl's turn
count, the tool calls the loop ran, those that failed, and whether the exchange ended on a call no tool answered.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import json
import os
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import numpy as np

from exgrpo.eval.backends import Completion, SamplingSettings, start_vllm
from recipe.exgrpo.cpu.hf_rollout import SamplingKey, sampling_key
from recipe.exgrpo.tool_eval.settings import ToolLoopSettings
from recipe.exgrpo.tool_turns import ToolCallDetector

__all__ = ["FACTORY", "ToolLoopBackend", "answer_failed", "build_backend", "request_seed"]

#: what ``EvalConfig.agent["factory"]`` names: the evaluation's core imports it by this name
FACTORY = "recipe.exgrpo.tool_eval.loop:build_backend"
#: how a tool's answer says it failed: verl's own messages (a call it could not run), the recipe tools' ``error:``
#: answers, and what the sandboxed interpreter prints for code that failed (a traceback, a timeout or a kill note)
_FAILURE_PREFIXES = ("error", "unknown function", "invalid json in arguments")
_FAILURE_MARKS = ("Traceback (most recent call last)", "[timed out", "[killed", "[memory limit")


def answer_failed(text: str) -> bool:
    """Whether a tool's answer reports a failed call (see ``_FAILURE_*``)."""
    head = text.lstrip().lower()
    return head.startswith(_FAILURE_PREFIXES) or any(mark in text for mark in _FAILURE_MARKS)


def request_seed(row_seed: int, sample: int, turn: int) -> int:
    """The seed of one turn of one answer: its row's seed, its sample index, the turn (0-based)."""
    text = json.dumps([int(row_seed), int(sample), int(turn)])
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "little") & ((1 << 63) - 1)


# ----------------------------------------------------------------------------------------------------- engines
class HFEngine:
    """The hf rollout's generation (``HFRolloutServer.generate_batch``: left-padded batches, one seeded generator
    per row, EOS kept) on the evaluation's model, in this process."""

    name = "hf"

    def __init__(self, model: str, sampling: SamplingSettings, settings: ToolLoopSettings, dtype: str = "auto"):
        from recipe.exgrpo.cpu.hf_rollout import HFRolloutServer

        rollout = {
            "name": "hf",
            "prompt_length": settings.prompt_length,
            "response_length": settings.response_length,
            "temperature": sampling.temperature,
            "top_p": sampling.top_p,
            "seed": sampling.seed,
            "dtype": "float32" if dtype == "auto" else dtype,
            "max_num_seqs": 1 << 16,
            "tensor_model_parallel_size": 1,
            "data_parallel_size": 1,
            "pipeline_model_parallel_size": 1,
        }
        self.model_path = model
        self.server = HFRolloutServer(rollout, {"path": model})
        self.server.init_engine()
        self.tokenizer = self.server.model_config.tokenizer
        self.eos_ids = set(self.server.eos_token_ids)
        self.max_model_len = self.server.max_model_len
        self.config = self.server.config

    def generate(
        self, prompts: list[list[int]], key: SamplingKey, seeds: list[int], stop: list[int]
    ) -> list[list[int]]:
        # the hf rollout honours no stop tokens besides EOS: nor does it in training
        return [out.token_ids for out in self.server.generate_batch(prompts, key, seeds)]


class VLLMEngine:
    """vLLM's offline engine on token prompts, one request per turn with its own seed and the parser's stop tokens,
    as verl's vLLM server builds its ``SamplingParams``."""

    name = "vllm"

    def __init__(
        self,
        model: str,
        sampling: SamplingSettings,
        settings: ToolLoopSettings,
        *,
        tensor_parallel_size: int = 1,
        gpu_memory_utilization: float = 0.9,
        max_model_len: int | None = None,
        dtype: str = "auto",
    ):
        from transformers import AutoTokenizer

        self.model_path = model
        self.max_model_len = max_model_len or settings.prompt_length + settings.response_length
        self.llm, self._params = start_vllm(
            model,
            seed=sampling.seed,
            tensor_parallel_size=tensor_parallel_size,
            gpu_memory_utilization=gpu_memory_utilization,
            max_model_len=self.max_model_len,
            dtype=dtype,
        )
        self.tokenizer = AutoTokenizer.from_pretrained(model)
        self.eos_ids = _eos_ids(model, self.tokenizer)
        self.config = SimpleNamespace(
            prompt_length=settings.prompt_length,
            response_length=settings.response_length,
            temperature=sampling.temperature,
            top_p=sampling.top_p,
        )

    def generate(
        self, prompts: list[list[int]], key: SamplingKey, seeds: list[int], stop: list[int]
    ) -> list[list[int]]:
        params = [
            self._params(
                n=1,
                max_tokens=key.max_tokens,
                temperature=key.temperature,
                top_p=key.top_p,
                top_k=key.top_k if key.top_k > 0 else -1,
                seed=seed,
                stop_token_ids=stop or None,
                repetition_penalty=1.0,
            )
            for seed in seeds
        ]
        outs = self.llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
        return [list(o.outputs[0].token_ids) for o in outs]


# ------------------------------------------------------------------------------------------------------ server
@dataclass
class _Request:
    prompt: list[int]
    key: SamplingKey
    seed: int
    stop: tuple[int, ...]
    future: asyncio.Future = field(repr=False)


class _Batcher:
    """Gathers the turns the running answers ask for and generates them in one engine call per sampling key, as
    soon as every answer still running waits on one (the others are in a tool call or done): the batches are as
    large as they can be, and no timer decides them."""

    def __init__(self, engine: Any, running: int):
        self.engine = engine
        self.running = running
        self.pending: list[_Request] = []
        self.busy = False

    async def submit(self, request: _Request) -> list[int]:
        self.pending.append(request)
        await self._maybe_flush()
        return await request.future

    async def done(self) -> None:
        self.running -= 1
        await self._maybe_flush()

    async def _maybe_flush(self) -> None:
        if self.busy or not self.pending or len(self.pending) < self.running:
            return
        self.busy = True
        batch, self.pending = self.pending, []
        try:
            groups: dict[tuple, list[_Request]] = {}
            for r in batch:
                groups.setdefault((r.key, r.stop), []).append(r)
            for (key, stop), reqs in groups.items():
                try:
                    outs = await asyncio.to_thread(
                        self.engine.generate, [r.prompt for r in reqs], key, [r.seed for r in reqs], list(stop)
                    )
                except Exception as e:  # every waiting answer gets the error instead of hanging
                    for r in reqs:
                        r.future.set_exception(e)
                    continue
                for r, out in zip(reqs, outs, strict=True):
                    r.future.set_result(out)
        finally:
            self.busy = False
        await self._maybe_flush()  # requests that came while the engine ran


class _AnswerServer:
    """The ``server_manager`` of one answer's loop: each turn a request to the batcher, seeded by the answer's seed
    and the turn."""

    def __init__(self, batcher: _Batcher, engine: Any, row_seed: int, sample: int):
        self.batcher, self.engine = batcher, engine
        self.row_seed, self.sample, self.turn = row_seed, sample, 0

    async def generate(self, request_id: str, prompt_ids: list[int], sampling_params: dict[str, Any], **kwargs):
        from verl.workers.rollout.replica import TokenOutput

        if kwargs.get("image_data") is not None or kwargs.get("video_data") is not None:
            raise ValueError("the evaluation with tools serves text-only models")
        prompt = [int(t) for t in prompt_ids]
        key = sampling_key(self.engine.config, self.engine.max_model_len, len(prompt), sampling_params)
        stop = tuple(sorted(int(t) for t in sampling_params.get("stop_token_ids") or ()))
        loop = asyncio.get_running_loop()
        seed = request_seed(self.row_seed, self.sample, self.turn)
        self.turn += 1
        ids = await self.batcher.submit(_Request(prompt, key, seed, stop, loop.create_future()))
        return TokenOutput(token_ids=ids, log_probs=None, stop_reason="completed")


# ----------------------------------------------------------------------------------------------------- backend
class ToolLoopBackend:
    """``exgrpo.eval``'s backend for a run with tools: each answer a run of verl's ``ToolAgentLoop``."""

    takes_messages = True

    def __init__(self, engine: Any, settings: ToolLoopSettings, sampling: SamplingSettings):
        from verl.experimental.agent_loop.tool_parser import ToolParser
        from verl.tools.tool_registry import load_all_tools

        self.engine, self.settings, self.sampling = engine, settings, sampling
        self.name = engine.name
        os.environ.update(settings.tool_env)  # the tool's limits as training's workers have them
        self.tokenizer = engine.tokenizer
        if settings.custom_chat_template is not None:
            self.tokenizer.chat_template = settings.custom_chat_template
        self.tools = load_all_tools(tool_config_path=None, function_tool_path=settings.function_tool_path)
        if not self.tools:
            raise ValueError(f"{settings.function_tool_path}: no @function_tool in the file")
        self.config = settings.rollout_config()
        self.parser = ToolParser.get_tool_parser(settings.format, self.tokenizer)
        self.detector = ToolCallDetector(self.parser, self.tokenizer)
        # verl picks its continuous-token builder by the model's model_type, as its workers read it from the config
        self._model_type = _model_type(engine.model_path)

    # the loop's own sampling settings, as verl's AgentLoopWorker passes them (validation: val_kwargs)
    def _sampling_params(self) -> dict[str, Any]:
        return dict(temperature=self.sampling.temperature, top_p=self.sampling.top_p, top_k=-1, repetition_penalty=1.0)

    def generate(
        self,
        prompts: Sequence[list[dict[str, str]]],
        n: Sequence[int],
        seeds: Sequence[int],
        sample_ids: Sequence[Sequence[int]] | None = None,
    ) -> list[list[Completion]]:
        sample_ids = sample_ids or [range(k) for k in n]
        rows = [i for i, ids in enumerate(sample_ids) for _ in ids]
        jobs = [(m, seed, s) for m, seed, ids in zip(prompts, seeds, sample_ids) for s in ids]
        out: list[list[Completion]] = [[] for _ in prompts]
        for i, (_, completion) in zip(rows, self.exchanges(jobs), strict=True):
            out[i].append(completion)
        return out

    def exchanges(self, jobs: Sequence[tuple[list[dict[str, str]], int, int]]) -> list[tuple[Any, Completion]]:
        """``(verl's AgentLoopOutput, the answer)`` of each ``(messages, row seed, sample index)``, all run at once,
        their turns batched."""
        return _run(self._exchanges(list(jobs)))

    async def _exchanges(self, jobs: list[tuple]) -> list[tuple[Any, Completion]]:
        batcher = _Batcher(self.engine, running=len(jobs))

        async def one(messages, seed, sample):
            try:
                return await self.answer(messages, _AnswerServer(batcher, self.engine, seed, sample))
            finally:
                await batcher.done()

        return list(await asyncio.gather(*(one(m, seed, s) for m, seed, s in jobs)))

    async def answer(self, messages: list[dict[str, str]], server: Any) -> tuple[Any, Completion]:
        """One exchange through verl's loop with ``server`` as its engine: verl's output and the answer."""
        from verl.experimental.agent_loop.agent_loop import DictConfigWrap, ToolListWrap
        from verl.experimental.agent_loop.tool_agent_loop import ToolAgentLoop
        from verl.utils.dataset.rl_dataset import RLHFDataset

        answers: list[tuple[bool, str]] = []  # (raised, text) per call that reached a tool, in order
        loop = ToolAgentLoop(
            trainer_config=DictConfigWrap(self.config),
            server_manager=server,
            tokenizer=self.tokenizer,
            processor=None,
            dataset_cls=RLHFDataset,
            data_config=DictConfigWrap(self.config.data),
            hf_model_type=self._model_type,
            tools=ToolListWrap([_recording(tool, answers) for tool in self.tools]),
        )
        output = await loop.run(self._sampling_params(), raw_prompt=[dict(m) for m in messages])
        ids, mask = list(output.response_ids), list(output.response_mask)
        calls, errors = await self._calls(ids, mask, answers)
        text = self.tokenizer.decode(ids, skip_special_tokens=True)  # what verl's reward manager decodes
        cut = len(mask) >= self.settings.response_length or (bool(ids) and ids[-1] not in self.engine.eos_ids)
        return output, Completion(
            text=text,
            num_tokens=len(ids),
            finish_reason="length" if cut else "stop",
            extra={
                "num_turns": int(output.num_turns),
                "tool_calls": calls,
                "tool_errors": errors,
                "unanswered_call": self._ends_on_call(ids, mask),
            },
        )

    async def _calls(self, ids: list[int], mask: list[int], answers: list[tuple[bool, str]]) -> tuple[int, int]:
        """The calls the loop ran (those of each model turn a tool turn follows, at most ``max_parallel_calls``) and
        those that failed: verl refused them (an unknown tool, arguments that are not JSON) or the tool raised or
        answered a failure (:func:`answer_failed`)."""
        calls = errors = 0
        reached = iter(answers)
        schemas = [tool.tool_schema for tool in self.tools]
        names = {tool.name for tool in self.tools}
        for start, stop, followed in _model_turns(mask):
            if not followed:
                continue
            _, found = await self.parser.extract_tool_calls(ids[start:stop], schemas)
            for call in found[: self.settings.max_parallel_calls]:
                calls += 1
                try:
                    json.loads(call.arguments)
                    runs = call.name in names
                except (TypeError, ValueError):
                    runs = False
                if not runs:
                    errors += 1
                    continue
                raised, text = next(reached, (True, ""))
                errors += raised or answer_failed(text)
        return calls, errors

    def _ends_on_call(self, ids: list[int], mask: list[int]) -> bool:
        """The exchange's last model turn holds a call no tool answered (the turn limit stopped the loop first, or the
        length cut the call): training's check before it stores an exchange (``tool_turns.ToolCallDetector``)."""
        return bool(self.detector(np.asarray(ids), np.asarray(mask)))


def _model_turns(mask: Sequence[int]) -> list[tuple[int, int, bool]]:
    """``(start, stop, a tool turn follows)`` of each run of model tokens (mask 1)."""
    turns, i = [], 0
    while i < len(mask):
        if mask[i]:
            j = i
            while j < len(mask) and mask[j]:
                j += 1
            turns.append((i, j, j < len(mask)))
            i = j
        else:
            i += 1
    return turns


def _recording(tool: Any, answers: list[tuple[bool, str]]) -> Any:
    """``tool`` (a verl ``FunctionTool``) whose every call appends ``(raised, answer text)`` to ``answers``."""
    from verl.tools.function_tool import normalize_function_tool_return

    fn = tool.fn

    def record(raised: bool, value: Any) -> None:
        if not raised:
            try:
                value = normalize_function_tool_return(value)[0].text
            except Exception as e:  # verl's own call fails on it the same way: an error answer
                raised, value = True, str(e)
        answers.append((raised, str(value or "")))

    if tool.is_async:

        async def call(**kwargs):
            try:
                value = await fn(**kwargs)
            except Exception as e:
                record(True, str(e))
                raise
            record(False, value)
            return value
    else:

        def call(**kwargs):
            try:
                value = fn(**kwargs)
            except Exception as e:
                record(True, str(e))
                raise
            record(False, value)
            return value

    return dataclasses.replace(tool, fn=call)


def _eos_ids(model: str, tokenizer: Any) -> set[int]:
    """The ids that end a turn: the model's generation config's ``eos_token_id`` and the tokenizer's."""
    from transformers import GenerationConfig

    eos: set[int] = set()
    try:
        found = GenerationConfig.from_pretrained(model).eos_token_id
    except OSError:  # no generation_config.json
        found = None
    for source in (found, tokenizer.eos_token_id):
        if source is not None:
            eos.update([source] if isinstance(source, int) else list(source))
    return eos


def _model_type(model_path: str) -> str | None:
    """The model's ``model_type`` (``config.json``), by which verl's agent loop picks its continuous-token builder."""
    from transformers import AutoConfig

    model_type = getattr(AutoConfig.from_pretrained(model_path), "model_type", None)
    return model_type if isinstance(model_type, str) else None


def _run(coro):
    """Run ``coro`` to its end from synchronous code, also when this thread already runs an event loop."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro)
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["value"] = asyncio.run(coro)
        except BaseException as e:  # handed to the caller
            box["error"] = e

    thread = threading.Thread(target=target)
    thread.start()
    thread.join()
    if "error" in box:
        raise box["error"]
    return box["value"]


def build_backend(cfg: Any) -> ToolLoopBackend:
    """The factory ``EvalConfig.agent`` names: the engine of ``cfg.backend`` on ``cfg.model``, inside verl's loop
    with the run's settings (``cfg.agent``)."""
    settings = ToolLoopSettings.from_dict(cfg.agent)
    if cfg.backend == "hf":
        engine = HFEngine(cfg.model, cfg.sampling, settings, dtype=cfg.dtype)
    elif cfg.backend == "vllm":
        engine = VLLMEngine(
            cfg.model,
            cfg.sampling,
            settings,
            tensor_parallel_size=cfg.tensor_parallel_size,
            gpu_memory_utilization=cfg.gpu_memory_utilization,
            max_model_len=cfg.max_model_len,
            dtype=cfg.dtype,
        )
    else:
        raise ValueError(f"backend must be hf or vllm, got {cfg.backend!r}")
    return ToolLoopBackend(engine, settings, cfg.sampling)
