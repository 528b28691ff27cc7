"""The settings of one evaluation run (``EvalConfig``): what the command line fills in and what each replica
process of ``exgrpo.eval.parallel`` rebuilds from its spec file."""

from __future__ import annotations

import importlib
import pathlib
from dataclasses import asdict, dataclass, field
from typing import Any

from exgrpo.eval.backends import BACKENDS, GenerationBackend, SamplingSettings, build_backend
from exgrpo.eval.generate import EvalRow, PromptFormat, load_benchmark_rows
from exgrpo.eval.grading import DEFAULT_GRADER, DEFAULT_GRADING, GRADING_MODES
from exgrpo.eval.report import REFERENCE_CHOICES

__all__ = ["DEFAULT_BATCH_SIZE", "DEFAULT_MAX_NEW_TOKENS", "EvalConfig"]

DEFAULT_BATCH_SIZE = {"hf": 8, "vllm": 2048}
#: --max-new-tokens when not given: the protocol's 8192 with vLLM; less with the hf backend (on CPU a sample of
#: 8192 tokens takes minutes), which the tables then mark as off the protocol
DEFAULT_MAX_NEW_TOKENS = {"hf": 1024, "vllm": 8192}


@dataclass
class EvalConfig:
    """Everything one evaluation run needs; the CLI fills it from flags, tests and scripts build it directly."""

    model: str
    data: list[str]
    out_dir: str
    backend: str = "vllm"
    label: str | None = None
    prompt_format: PromptFormat = field(default_factory=PromptFormat)
    sampling: SamplingSettings = field(default_factory=SamplingSettings)
    batch_size: int | None = None  # sequences per generation call; default per backend
    tensor_parallel_size: int = 1
    data_parallel_size: int = 1  # engine replicas, one process each on its own GPUs (exgrpo.eval.parallel)
    gpu_memory_utilization: float = 0.9
    max_model_len: int | None = None
    dtype: str = "auto"
    device: str | None = None
    data_sources: list[str] | None = None
    max_questions_per_source: int | None = None
    max_rows: int | None = None
    grader: str = DEFAULT_GRADER
    grading: str = DEFAULT_GRADING  # "paper" (final-evaluation rule) or "reward" (the training reward's rule)
    think_gate: bool = True  # only with grading="reward"
    grader_timeout_s: float = 10.0
    reference: str = "table1"
    reference_file: str | None = None
    plot: bool = True
    overwrite: bool = False
    progress: bool = True
    #: a multi-turn run (tools): ``{"factory": "module:function", ...settings}``. The factory builds the backend
    #: (``factory(cfg) -> GenerationBackend``, e.g. the recipe's tool loop around this backend's engine); the
    #: settings (tool file, parser, turn and length limits) are recorded with the results and guard resuming
    agent: dict[str, Any] | None = None
    #: grade without the tool's answers (``<tool_response>...</tool_response>`` spans), as the training reward does
    #: with ``strip_tool_responses``: a tool that prints ``\boxed{}`` is not the model's answer
    strip_tool_responses: bool = False

    def __post_init__(self) -> None:
        if self.backend not in BACKENDS:
            raise ValueError(f"backend must be one of {BACKENDS}, got {self.backend!r}")
        if self.tensor_parallel_size < 1 or self.data_parallel_size < 1:
            raise ValueError(
                f"tensor_parallel_size and data_parallel_size must be >= 1, got {self.tensor_parallel_size}, "
                f"{self.data_parallel_size}"
            )
        if self.grading not in GRADING_MODES:
            raise ValueError(f"grading must be one of {GRADING_MODES}, got {self.grading!r}")
        if self.reference not in REFERENCE_CHOICES:
            raise ValueError(f"reference must be one of {REFERENCE_CHOICES}, got {self.reference!r}")
        if not self.data:
            raise ValueError("no benchmark parquet given (data)")
        if self.agent is not None and ":" not in str(self.agent.get("factory", "")):
            raise ValueError(f"agent needs a 'factory' given as module:function, got {self.agent.get('factory')!r}")
        stems = [pathlib.Path(d).stem for d in self.data]
        dup = sorted({s for s in stems if stems.count(s) > 1})
        if dup:
            raise ValueError(f"data files must have distinct names (generations are stored per name): {dup}")

    @property
    def out(self) -> pathlib.Path:
        return pathlib.Path(self.out_dir)

    def resolved_label(self) -> str:
        """``label``, else from the model path: ``exp/global_step_500/merged_hf`` -> ``exp/global_step_500``."""
        if self.label:
            return self.label
        parts = [p for p in pathlib.Path(self.model.rstrip("/")).parts if p not in ("/", "")]
        while len(parts) > 1 and parts[-1] in ("huggingface", "hf", "merged_hf", "actor"):
            parts.pop()
        if not parts:
            return self.model
        step_like = parts[-1].startswith(("global_step_", "checkpoint-", "step_"))
        return "/".join(parts[-2:] if step_like and len(parts) > 1 else parts[-1:])

    def generation_path(self, data: str) -> pathlib.Path:
        return self.out / "generations" / f"{pathlib.Path(data).stem}.jsonl"

    def score_path(self, data: str) -> pathlib.Path:
        return self.out / "scores" / f"{pathlib.Path(data).stem}.jsonl"

    def load_rows(self, data: str) -> list[EvalRow]:
        return load_benchmark_rows(
            data,
            data_sources=self.data_sources,
            max_questions_per_source=self.max_questions_per_source,
            max_rows=self.max_rows,
        )

    def build_backend(self) -> GenerationBackend:
        """The generation backend this run asks for (on this process's devices); with ``agent``, what its factory
        builds (imported by name: the evaluation's core never imports the framework a multi-turn loop needs)."""
        if self.agent is not None:
            module, _, name = str(self.agent["factory"]).partition(":")
            return getattr(importlib.import_module(module), name)(self)
        return build_backend(
            self.backend,
            self.model,
            self.sampling,
            device=self.device,
            dtype=self.dtype,
            tensor_parallel_size=self.tensor_parallel_size,
            gpu_memory_utilization=self.gpu_memory_utilization,
            max_model_len=self.max_model_len,
        )

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["data"] = [str(pathlib.Path(p).resolve()) for p in self.data]
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> EvalConfig:
        d = dict(d)
        d["prompt_format"] = PromptFormat(**d.get("prompt_format", {}))
        d["sampling"] = SamplingSettings(**d.get("sampling", {}))
        known = set(cls.__dataclass_fields__)
        return cls(**{k: v for k, v in d.items() if k in known})
