"""Rollout backend ``hf``: Hugging Face ``generate()`` served from a Ray actor, for verl runs without a GPU.

verl 0.9.1 registers only vLLM, SGLang and TensorRT-LLM rollouts, none of which runs on CPU (docs/cpu_backend.md,
blocker 8). This module plugs a small replacement into verl's own extension points, mirroring the three pieces
of the vLLM backend:

- ``HFRolloutServer``: the inference server (one Ray actor per replica). Token-in/token-out ``generate`` with
  the signature verl's ``LLMServerClient`` calls; concurrent requests are gathered into one left-padded
  ``model.generate()`` batch. Returns the sampled ids with their log-probs under the *processed* distribution
  (logits / temperature, as verl's ``logprobs_mode=processed_logprobs`` and as the actor computes them).
- ``HFReplica``: the ``RolloutReplica`` that launches that actor next to the hybrid training worker
  (registered in ``RolloutReplicaRegistry`` as ``hf``).
- ``HFServerAdapter``: the worker-side ``BaseRollout`` living in the training worker (registered for
  ``rollout.name=hf``); its ``update_weights`` receives the trainer's full state dict after each actor update
  and loads it into the server (weight sync), ``resume``/``release`` forward sleep/wake-up.

Sleep and wake-up are tracked as vLLM's are (two parts resident or released: ``weights`` and ``kv_cache``), so a
step-order bug that would fail on a GPU fails here too: ``generate`` while either part is released raises
:class:`RolloutAsleepError`, and so does a weight load while the weights are released. verl 0.9.1's colocated
sequence (legacy trainer and checkpoint manager): ``init_workers`` ends with ``sleep_replicas()``; every
``checkpoint_manager.update_weights()`` (before validation and at the end of each step) resumes the weights, loads
them, then resumes the KV cache; generation follows, then ``sleep_replicas()`` before the actor runs. As with
vLLM, ``sleep`` does nothing when ``actor_rollout_ref.rollout.free_cache_engine`` is false.

Sampling is reproducible: each request draws its tokens from its own generator, seeded from the rollout's ``seed``,
the replica, the training step, the prompt's tokens, the sampling settings and how many requests with the same
prompt and settings came before it in this step. A request's sample therefore does not depend on which other
requests happen to share its ``generate()`` call (the batching follows arrival times) nor on the order in which
different prompts arrive; the tokens are chosen by the Gumbel-max trick (the argmax of the temperature-scaled,
top-k/top-p-filtered logits plus Gumbel noise from that generator, an exact draw from the same distribution).

Observation hook: when ``EXGRPO_CPU_ROLLOUT_DUMP`` names a directory, the server appends one JSON line per
weight load and per generation batch to ``<dir>/rollout_events.jsonl`` (weights version, global step,
parameter checksum). The e2e test uses it to show the rollout's weights change after every update.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import os
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Optional

import ray
import torch
from torch.distributed.device_mesh import DeviceMesh
from verl.workers.config import HFModelConfig, RolloutConfig
from verl.workers.rollout.base import BaseRollout
from verl.workers.rollout.replica import RolloutReplica, TokenOutput

from recipe.exgrpo import verl_compat

logger = logging.getLogger(__name__)

ROLLOUT_NAME = "hf"
SERVER_NAME_PREFIX = "exgrpo_hf_server_"
DUMP_ENV = "EXGRPO_CPU_ROLLOUT_DUMP"
THREADS_ENV = "EXGRPO_CPU_THREADS"
DUMP_FILE = "rollout_events.jsonl"
# The agent loop sends one request per sample, nearly at once: the server keeps gathering while requests keep
# arriving (each quiet gap of BATCH_QUIET_S ends the wait, BATCH_MAX_WAIT_S caps it), so a step's samples share
# one generate() call.
BATCH_QUIET_S = 0.005
BATCH_MAX_WAIT_S = 0.05


#: The parts of a replica that sleep releases and wake-up restores (vLLM's sleep-mode tags).
MEMORY_TAGS = ("weights", "kv_cache")


class HFRolloutConfigError(ValueError):
    """A rollout setting the Hugging Face CPU rollout cannot honour; the message names the key and the fix."""


class RolloutAsleepError(RuntimeError):
    """The rollout was asked to generate (or load weights) while asleep: a step-order bug that vLLM on a GPU would
    not survive (its weights or KV cache are released), raised here so that it cannot pass unnoticed on CPU."""


def server_actor_name(replica_rank: int, node_rank: int = 0, name_suffix: str = "") -> str:
    return f"{SERVER_NAME_PREFIX}{replica_rank}_{node_rank}{name_suffix}"


def validate_hf_rollout_config(config: RolloutConfig) -> None:
    """Reject rollout settings that need a GPU engine, naming the key and the value to use instead."""
    problems = []
    world = config.tensor_model_parallel_size * config.data_parallel_size * config.pipeline_model_parallel_size
    if world != 1:
        problems.append(
            "actor_rollout_ref.rollout.tensor_model_parallel_size / data_parallel_size / "
            f"pipeline_model_parallel_size give a rollout world size of {world}; the hf rollout runs one process "
            "per replica: set all three to 1"
        )
    if getattr(getattr(config, "disaggregation", None), "enabled", False):
        problems.append("actor_rollout_ref.rollout.disaggregation.enabled=True is not supported by the hf rollout")
    if getattr(config, "enable_rollout_routing_replay", False):
        problems.append("actor_rollout_ref.rollout.enable_rollout_routing_replay=True is not supported (no MoE)")
    if problems:
        raise HFRolloutConfigError("hf rollout: " + "; ".join(problems))


@dataclass(frozen=True)
class SamplingKey:
    """Requests with equal keys can share one generate() call."""

    temperature: float
    top_p: float
    top_k: int
    max_tokens: int
    logprobs: bool


def sampling_key(config: Any, max_model_len: int, prompt_len: int, sampling_params: dict[str, Any]) -> SamplingKey:
    """verl's vLLM server's reading of an agent loop's request (``vllm_async_server.generate``): the new tokens a
    turn may take, ``min(response_length, prompt_length + response_length - prompt_len)`` unless the request names
    them, within ``[1, max_model_len - prompt_len]``; the sampling settings, the rollout config's by default.
    ``config``: the rollout config (``prompt_length``, ``response_length``, ``temperature``, ``top_p``). The hf
    rollout and the evaluation with tools (``recipe.exgrpo.tool_eval``) read requests through it."""
    params = dict(sampling_params)
    max_possible = max_model_len - prompt_len
    if max_possible < 1:
        raise ValueError(
            f"prompt of {prompt_len} tokens leaves no room to generate within max_model_len={max_model_len}"
        )
    if "max_tokens" in params:
        max_tokens = int(params.pop("max_tokens"))
    elif "max_new_tokens" in params:
        max_tokens = int(params.pop("max_new_tokens"))
    else:
        max_tokens = min(config.response_length, config.prompt_length + config.response_length - prompt_len)
    max_tokens = max(1, min(max_tokens, max_possible))
    top_k = int(params.get("top_k", -1) or -1)
    return SamplingKey(
        temperature=float(params.get("temperature", config.temperature)),
        top_p=float(params.get("top_p", config.top_p)),
        top_k=top_k if top_k > 0 else 0,
        max_tokens=max_tokens,
        logprobs=bool(params.get("logprobs", False)),
    )


@dataclass
class _Request:
    prompt_ids: list[int]
    key: SamplingKey
    future: asyncio.Future = field(repr=False)
    seed: Optional[int] = None


def request_seed(base_seed: int, replica_rank: int, step: Any, prompt_ids: list[int], key: SamplingKey, n: int) -> int:
    """The seed of the ``n``-th request (0-based) with these prompt tokens and sampling settings in ``step``."""
    text = json.dumps([int(base_seed), int(replica_rank), step, prompt_ids, list(key.__dict__.values()), int(n)])
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "little") & ((1 << 63) - 1)


class GumbelSampler:
    """Logits processor that turns greedy decoding into sampling with one ``torch.Generator`` per row.

    Applied after the temperature/top-k/top-p warpers: ``argmax(scores + Gumbel noise)`` is a draw from
    ``softmax(scores)``. Each row's noise comes from its own generator, so a row's tokens depend on its seed and
    its own logits only, never on the rows it is batched with.
    """

    def __init__(self, seeds: list[int]) -> None:
        self.generators = [torch.Generator().manual_seed(int(seed)) for seed in seeds]

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        uniform = torch.stack(
            [torch.rand(scores.shape[-1], generator=g, dtype=torch.float64) for g in self.generators]
        ).clamp_(min=1e-300)
        gumbel = -torch.log(-torch.log(uniform))
        return scores.double() + gumbel


def _as_int_list(token_ids: Any) -> list[int]:
    if isinstance(token_ids, torch.Tensor):
        return [int(t) for t in token_ids.tolist()]
    return [int(t) for t in token_ids]


def state_checksum(named_tensors: dict[str, torch.Tensor]) -> float:
    """A cheap fingerprint of named weights (sum and sum of squares, in name order): changes when any weight does.

    Sender (training worker) and receiver (server) compute it the same way, so equal values show the rollout
    serves exactly the trainer's weights.
    """
    total = 0.0
    with torch.no_grad():
        for name in sorted(named_tensors):
            d = named_tensors[name].detach().double()
            total += float(d.sum()) + float(d.pow(2).sum())
    return total


def parameter_checksum(model: torch.nn.Module) -> float:
    return state_checksum(dict(model.state_dict()))


def append_dump(record: dict[str, Any]) -> None:
    """Append one JSON line to ``$EXGRPO_CPU_ROLLOUT_DUMP/rollout_events.jsonl`` (no-op when unset)."""
    dump_dir = os.environ.get(DUMP_ENV)
    if not dump_dir:
        return
    os.makedirs(dump_dir, exist_ok=True)
    with open(os.path.join(dump_dir, DUMP_FILE), "a", encoding="utf-8") as f:
        f.write(json.dumps({"time": time.time(), "pid": os.getpid(), **record}) + "\n")


class HFRolloutServer:
    """Token-in/token-out generation server around a Hugging Face causal LM (CPU, float32, sdpa).

    Usable as a plain object (tests) or as a Ray actor (``ray.remote(HFRolloutServer)``); every public coroutine
    matches the name and keywords verl's replica/adapter/client call on its vLLM server.
    """

    def __init__(
        self,
        config: RolloutConfig | dict,
        model_config: HFModelConfig | dict,
        replica_rank: int = 0,
        node_rank: int = 0,
    ) -> None:
        from verl.utils.config import omega_conf_to_dataclass

        self.config: RolloutConfig = omega_conf_to_dataclass(config, dataclass_type=RolloutConfig)
        self.model_config: HFModelConfig = omega_conf_to_dataclass(model_config, dataclass_type=HFModelConfig)
        validate_hf_rollout_config(self.config)
        self.replica_rank = replica_rank
        self.node_rank = node_rank
        self.global_steps: Optional[int] = None
        self.weights_version = 0
        self.resident: set[str] = set(MEMORY_TAGS)  # a launched engine is awake, as vLLM's is
        self.model: Optional[torch.nn.Module] = None
        self._pending: list[_Request] = []
        self._wakeup: Optional[asyncio.Event] = None
        self._batcher: Optional[asyncio.Task] = None
        self._model_lock = threading.Lock()
        # requests per (prompt, sampling settings) in the current step: the occurrence index in each request's seed
        self._occurrences: dict[tuple, int] = {}
        self._occurrence_step: Any = None
        threads = os.environ.get(THREADS_ENV)
        if threads:
            torch.set_num_threads(max(1, int(threads)))

    # ------------------------------------------------------------------ engine
    def init_engine(self) -> dict[str, Any]:
        """Load the model from ``model.path`` (float32 on CPU, ``sdpa`` attention) and seed sampling."""
        from transformers import AutoModelForCausalLM

        attn = self.model_config.override_config.get("attn_implementation", "sdpa")
        if attn not in ("sdpa", "eager"):
            raise HFRolloutConfigError(
                f"actor_rollout_ref.model.override_config.attn_implementation={attn!r} cannot run on CPU; "
                "set +actor_rollout_ref.model.override_config.attn_implementation=sdpa"
            )
        dtype = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16}
        torch_dtype = dtype.get(str(self.config.dtype), torch.float32)
        model = AutoModelForCausalLM.from_pretrained(
            self.model_config.local_path,
            dtype=torch_dtype,
            attn_implementation=attn,
            trust_remote_code=self.model_config.trust_remote_code,
        )
        model.eval()
        self.model = model
        tokenizer = self.model_config.tokenizer
        eos = set()
        gen_cfg = self.model_config.generation_config
        for source in (getattr(gen_cfg, "eos_token_id", None), getattr(tokenizer, "eos_token_id", None)):
            if source is None:
                continue
            eos.update([source] if isinstance(source, int) else list(source))
        if not eos:
            raise HFRolloutConfigError(f"model at {self.model_config.local_path} defines no eos_token_id")
        self.eos_token_ids = sorted(int(e) for e in eos)
        pad = getattr(tokenizer, "pad_token_id", None)
        self.pad_token_id = int(pad) if pad is not None else self.eos_token_ids[0]
        torch.manual_seed(int(self.config.seed) + 1000 * self.replica_rank)
        self._dump({"event": "init", "checksum": parameter_checksum(model)})
        return {"eos_token_ids": self.eos_token_ids, "pad_token_id": self.pad_token_id}

    @property
    def awake(self) -> bool:
        """Weights and KV cache both resident: the only state in which the replica may generate."""
        return self.resident >= set(MEMORY_TAGS)

    def _require_awake(self, what: str, needs: tuple[str, ...] = MEMORY_TAGS) -> None:
        released = [tag for tag in needs if tag not in self.resident]
        if released:
            raise RolloutAsleepError(
                f"hf rollout replica {self.replica_rank}: {what} while asleep ({' and '.join(released)} released). "
                "The step asks the rollout for work after checkpoint_manager.sleep_replicas() and before the next "
                "checkpoint_manager.update_weights() (which resumes the weights, loads them and resumes the KV "
                "cache); on a GPU vLLM would fail here"
            )

    @property
    def max_model_len(self) -> int:
        return int(self.config.max_model_len or (self.config.prompt_length + self.config.response_length))

    # ------------------------------------------------------------------ generation
    def sampling_key(self, prompt_len: int, sampling_params: dict[str, Any]) -> SamplingKey:
        """Translate verl's vLLM-style sampling params into one key (same defaults as verl's vLLM server)."""
        return sampling_key(self.config, self.max_model_len, prompt_len, sampling_params)

    async def generate(
        self,
        prompt_ids: list[int],
        sampling_params: dict[str, Any],
        request_id: str,
        image_data: Optional[list[Any]] = None,
        video_data: Optional[list[Any]] = None,
        audio_data: Optional[list[Any]] = None,
        mm_processor_kwargs: Optional[dict[str, Any]] = None,
        priority: int = 0,
        **kwargs: Any,
    ) -> TokenOutput:
        """One sample for one prompt (verl's agent loop sends one request per sample)."""
        if image_data is not None or video_data is not None or audio_data is not None:
            raise ValueError("the hf CPU rollout serves text-only models; got image/video/audio data")
        self._require_awake("asked to generate")
        if self.model is None:
            self.init_engine()
        prompt = _as_int_list(prompt_ids)
        key = self.sampling_key(len(prompt), sampling_params)
        loop = asyncio.get_running_loop()
        request = _Request(prompt_ids=prompt, key=key, future=loop.create_future(), seed=self.next_seed(prompt, key))
        self._pending.append(request)
        if self._wakeup is None:
            self._wakeup = asyncio.Event()
        if self._batcher is None or self._batcher.done():
            self._batcher = asyncio.create_task(self._batch_loop())
        self._wakeup.set()
        return await request.future

    def next_seed(self, prompt: list[int], key: SamplingKey) -> int:
        """The sampling seed of the next request for ``prompt`` under ``key`` (see the module's docstring).

        The step is the trainer's global step the last weight load named (restored on resume), else the count of
        weight loads; the occurrence counters restart with each step.
        """
        step = self.global_steps if self.global_steps is not None else f"w{self.weights_version}"
        if step != self._occurrence_step:
            self._occurrences, self._occurrence_step = {}, step
        slot = (tuple(prompt), key)
        n = self._occurrences.get(slot, 0)
        self._occurrences[slot] = n + 1
        return request_seed(self.config.seed, self.replica_rank, step, prompt, key, n)

    async def _batch_loop(self) -> None:
        while True:
            await self._wakeup.wait()
            self._wakeup.clear()
            waited, seen = 0.0, -1
            while len(self._pending) != seen and waited < BATCH_MAX_WAIT_S:
                seen = len(self._pending)
                await asyncio.sleep(BATCH_QUIET_S)
                waited += BATCH_QUIET_S
            batch, self._pending = self._pending, []
            if not batch:
                continue
            groups: dict[SamplingKey, list[_Request]] = {}
            for req in batch:
                groups.setdefault(req.key, []).append(req)
            for key, reqs in groups.items():
                cap = max(1, int(self.config.max_num_seqs))
                for start in range(0, len(reqs), cap):
                    chunk = reqs[start : start + cap]
                    try:
                        outputs = await asyncio.to_thread(
                            self.generate_batch, [r.prompt_ids for r in chunk], key, [r.seed for r in chunk]
                        )
                    except Exception as exc:  # hand the error to every waiting request instead of hanging them
                        for r in chunk:
                            if not r.future.done():
                                r.future.set_exception(exc)
                        continue
                    for r, out in zip(chunk, outputs, strict=True):
                        if not r.future.done():
                            r.future.set_result(out)

    @torch.no_grad()
    def generate_batch(
        self, prompts: list[list[int]], key: SamplingKey, seeds: Optional[list[Optional[int]]] = None
    ) -> list[TokenOutput]:
        """Sample one response per prompt with ``model.generate`` (left padding) and score it.

        With ``seeds`` (one per prompt), each row samples from its own generator (:class:`GumbelSampler`); without,
        from torch's global generator (``model.generate``'s own sampling).
        Log-probs are ``log_softmax(logits / T)`` of the sampled ids (T = 1 for greedy), computed from the raw
        logits ``generate`` returns, i.e. before top-p/top-k truncation, the same quantity the actor recomputes.
        """
        from transformers import GenerationConfig

        assert self.model is not None, "init_engine() was not called"
        self._require_awake("asked to generate")  # also requests queued before a sleep
        bsz = len(prompts)
        width = max(len(p) for p in prompts)
        input_ids = torch.full((bsz, width), self.pad_token_id, dtype=torch.long)
        attention_mask = torch.zeros((bsz, width), dtype=torch.long)
        for i, p in enumerate(prompts):
            input_ids[i, width - len(p) :] = torch.tensor(p, dtype=torch.long)
            attention_mask[i, width - len(p) :] = 1
        do_sample = key.temperature > 0
        seeded = do_sample and seeds is not None and all(seed is not None for seed in seeds)
        processors = None
        if seeded:
            from transformers import LogitsProcessorList, TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

            processors = LogitsProcessorList()
            if key.temperature != 1.0:
                processors.append(TemperatureLogitsWarper(key.temperature))
            if key.top_k > 0:
                processors.append(TopKLogitsWarper(key.top_k))
            if key.top_p < 1.0:
                processors.append(TopPLogitsWarper(key.top_p))
            processors.append(GumbelSampler([int(seed) for seed in seeds]))
        gen_cfg = GenerationConfig(
            max_new_tokens=key.max_tokens,
            # seeded rows sample through GumbelSampler on top of greedy decoding
            do_sample=do_sample and not seeded,
            temperature=key.temperature if do_sample and not seeded else 1.0,
            top_p=key.top_p if do_sample and not seeded else 1.0,
            # top_k=0 disables truncation; for greedy leave it unset (transformers warns on any value)
            top_k=key.top_k if do_sample and not seeded else None,
            eos_token_id=self.eos_token_ids,
            pad_token_id=self.pad_token_id,
            bos_token_id=None,
            return_dict_in_generate=True,
            output_logits=True,
        )
        with self._model_lock:
            out = self.model.generate(
                input_ids=input_ids,
                attention_mask=attention_mask,
                generation_config=gen_cfg,
                logits_processor=processors,
            )
        new_tokens = out.sequences[:, width:]
        results: list[TokenOutput] = []
        log_probs_all = None
        if key.logprobs and new_tokens.shape[1] > 0:
            logits = torch.stack(out.logits, dim=1).float()
            if do_sample and key.temperature != 1.0:
                logits = logits / key.temperature
            log_probs_all = torch.log_softmax(logits, dim=-1).gather(-1, new_tokens.unsqueeze(-1)).squeeze(-1)
        eos = set(self.eos_token_ids)
        for i in range(bsz):
            row = new_tokens[i].tolist()
            length = len(row)
            for t, tok in enumerate(row):
                if tok in eos:
                    length = t + 1  # keep the EOS token, as vLLM does
                    break
            token_ids = [int(t) for t in row[:length]]
            log_probs = [float(x) for x in log_probs_all[i, :length].tolist()] if log_probs_all is not None else None
            results.append(
                TokenOutput(
                    token_ids=token_ids,
                    log_probs=log_probs,
                    stop_reason="completed",
                    extra_fields={"global_steps": self.global_steps, "weights_version": self.weights_version},
                )
            )
        self._dump(
            {
                "event": "generate",
                "num_requests": bsz,
                "num_tokens": int(sum(len(r.token_ids) for r in results)),
                "temperature": key.temperature,
            }
        )
        return results

    # ------------------------------------------------------------------ weights
    def update_weights(self, named_tensors: dict[str, torch.Tensor], global_steps: Optional[int] = None) -> dict:
        """Load the trainer's weights (HF parameter names) into the served model (the weights must be resumed)."""
        self._require_awake("sent weights", needs=("weights",))
        if self.model is None:
            self.init_engine()
        own = self.model.state_dict()
        unexpected = sorted(set(named_tensors) - set(own))
        if unexpected:
            raise KeyError(f"hf rollout: weights not in the served model: {unexpected[:5]}")
        state = {}
        for name, tensor in named_tensors.items():
            if tuple(tensor.shape) != tuple(own[name].shape):
                raise ValueError(
                    f"hf rollout: weight {name} has shape {tuple(tensor.shape)}, served model expects "
                    f"{tuple(own[name].shape)}"
                )
            state[name] = tensor.to(dtype=own[name].dtype)
        with self._model_lock:
            missing = self.model.load_state_dict(state, strict=False).missing_keys
        tied = {"lm_head.weight"} if getattr(self.model.config, "tie_word_embeddings", False) else set()
        missing = [m for m in missing if m not in tied]
        if missing:
            raise KeyError(f"hf rollout: the trainer sent no weights for {missing[:5]}")
        self.weights_version += 1
        if global_steps is not None:
            self.global_steps = global_steps
        own = self.model.state_dict()
        checksum = state_checksum({name: own[name] for name in state})
        self._dump({"event": "update_weights", "num_tensors": len(state), "checksum": checksum})
        return {"weights_version": self.weights_version, "checksum": checksum}

    def get_state(self) -> dict[str, Any]:
        return {
            "weights_version": self.weights_version,
            "global_steps": self.global_steps,
            "checksum": parameter_checksum(self.model) if self.model is not None else None,
            "awake": self.awake,
        }

    # ------------------------------------------------------------------ lifecycle (state only: no device memory)
    async def wake_up(self, tags: list[str] | None = None) -> None:
        """Resume ``tags`` (default: weights and KV cache), as vLLM's ``wake_up(tags)``."""
        tags = list(MEMORY_TAGS) if not tags else list(tags)
        unknown = sorted(set(tags) - set(MEMORY_TAGS))
        if unknown:
            raise ValueError(f"hf rollout: wake_up tags {unknown} are not among {list(MEMORY_TAGS)}")
        self.resident.update(tags)

    async def sleep(self) -> None:
        """Release weights and KV cache; a no-op without ``free_cache_engine``, like verl's vLLM server."""
        if self.config.free_cache_engine:
            self.resident.clear()

    async def clear_kv_cache(self) -> None:
        return None

    async def release_kv_cache(self) -> None:
        if self.config.free_cache_engine:
            self.resident.discard("kv_cache")

    async def resume_kv_cache(self) -> None:
        if self.config.free_cache_engine:
            self.resident.add("kv_cache")

    async def set_global_steps(self, global_steps: int) -> None:
        self.global_steps = global_steps

    async def wait_for_requests_to_drain(self) -> None:
        while self._pending:
            await asyncio.sleep(BATCH_QUIET_S)

    async def abort_all_requests(self, reset_prefix_cache: bool = True, reject_request: bool = False) -> dict:
        return {"aborted_count": 0, "request_ids": []}

    async def abort_request(self, request_id: str, reset_prefix_cache: bool = True) -> dict:
        return {"aborted": False, "request_id": request_id}

    async def resume_generation(self) -> None:
        return None

    async def start_profile(self, **kwargs: Any) -> None:
        return None

    async def stop_profile(self) -> None:
        return None

    # ------------------------------------------------------------------ observation
    def _dump(self, record: dict[str, Any]) -> None:
        append_dump(
            {
                "side": "server",
                "replica_rank": self.replica_rank,
                "weights_version": self.weights_version,
                "global_steps": self.global_steps,
                **record,
            }
        )


class HFReplica(RolloutReplica):
    """Launches one ``HFRolloutServer`` actor per replica, on the node of its hybrid training worker."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        validate_hf_rollout_config(self.config)

    def rollout_worker_use_gpu(self) -> bool:
        return False

    async def init_standalone(self) -> None:
        raise HFRolloutConfigError(
            "the hf rollout only runs colocated with the trainer (actor_rollout_ref.hybrid_engine=True, "
            "trainer.use_v1=False or the v1 sync trainer); standalone rollout pools are not supported"
        )

    async def init_colocated(self, resource_pool: Any) -> None:
        raise HFRolloutConfigError("the hf rollout does not serve reward or teacher models (colocated mode)")

    async def launch_servers(self) -> None:
        from verl.plugin.platform import get_platform

        assert len(self.workers) == self.world_size, (
            f"hf rollout: {len(self.workers)} workers for a replica of world size {self.world_size}"
        )
        node_id = await self.workers[0].__ray_call__.remote(lambda self: ray.get_runtime_context().get_node_id())
        server_cls = ray.remote(HFRolloutServer)
        server = server_cls.options(
            scheduling_strategy=ray.util.scheduling_strategies.NodeAffinitySchedulingStrategy(
                node_id=node_id, soft=False
            ),
            # No logical CPU: the server only runs while the trainer waits for it, and a CPU request here would
            # be one more slot the user has to reserve in ray_init.num_cpus.
            num_cpus=0,
            runtime_env={"env_vars": get_platform().rollout_env_vars()},
            name=server_actor_name(self.replica_rank, 0, self.name_suffix),
            max_concurrency=self.max_concurrency,
        ).remote(config=self.config, model_config=self.model_config, replica_rank=self.replica_rank, node_rank=0)
        await server.init_engine.remote()
        self.servers = [server]
        verl_compat.set_replica_server(self, server, f"hf-replica-{self.replica_rank}{self.name_suffix}")


class HFServerAdapter(BaseRollout):
    """Worker-side handle on the replica's ``HFRolloutServer``: sleep/wake-up forwarding and weight sync."""

    def __init__(
        self,
        config: RolloutConfig,
        model_config: HFModelConfig,
        device_mesh: DeviceMesh,
        replica_rank: int = -1,
    ) -> None:
        super().__init__(config, model_config, device_mesh)
        validate_hf_rollout_config(self.config)
        rank = int(os.environ.get("RANK", 0))
        rollout_world_size = 1
        self.replica_rank = rank // rollout_world_size if replica_rank == -1 else replica_rank
        self.rollout_rank = rank % rollout_world_size
        self._owns_server = self.rollout_rank == 0
        self.server_handle: Optional[ray.actor.ActorHandle] = None
        self.sleep_level = 1

    def _server(self) -> Optional[ray.actor.ActorHandle]:
        if not self._owns_server:
            return None
        if self.server_handle is None:
            # The replica launches the server after the hybrid worker is built, so look it up lazily.
            self.server_handle = ray.get_actor(server_actor_name(self.replica_rank))
        return self.server_handle

    async def resume(self, tags: list[str]) -> None:
        server = self._server()
        if server is not None:
            await server.wake_up.remote(tags=tags)

    async def release(self) -> None:
        server = self._server()
        if server is not None:
            await server.sleep.remote()

    async def update_weights(self, weights: Iterable, wire_format: str = "named_tensors", **kwargs: Any) -> None:
        if wire_format != "named_tensors":
            raise HFRolloutConfigError(
                f"hf rollout supports wire_format='named_tensors' only, got {wire_format!r}: "
                "keep actor_rollout_ref.rollout.checkpoint_engine.backend=naive"
            )
        if kwargs.get("peft_config") is not None:
            raise HFRolloutConfigError(
                "hf rollout cannot load LoRA adapters; set actor_rollout_ref.model.lora.merge=True"
            )
        from verl.workers.rollout.utils import ensure_async_iterator

        # Every rank must drain the generator: FSDP gathers each full tensor collectively.
        state: dict[str, torch.Tensor] = {}
        async for name, tensor in ensure_async_iterator(weights):
            state[name] = tensor.detach().to("cpu", copy=True)
        server = self._server()
        if server is not None:
            global_steps = kwargs.get("global_steps")
            append_dump(
                {
                    "side": "trainer",
                    "event": "send_weights",
                    "replica_rank": self.replica_rank,
                    "global_steps": global_steps,
                    "num_tensors": len(state),
                    "checksum": state_checksum(state),
                }
            )
            await server.update_weights.remote(state, global_steps=global_steps)
