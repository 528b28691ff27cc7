"""``python -m exgrpo.eval`` / ``exgrpo-eval``: generate, grade and report, following docs/algorithm.md §12.

Subcommands:
  run       generate (resumable) + grade + report, for one checkpoint and one or more benchmark parquets
  generate  generation only (resumable JSONL under OUT/generations/)
  score     grade the generations in OUT and write the report
  report    re-render tables/charts from one or more results JSON files (merges rows of the same label)

Output directory layout:
  OUT/run.json                         the run's settings (model, backend, template, sampling, seed, versions)
  OUT/generations/<data>.jsonl         one line per (row, sample); <data>.jsonl.meta.json guards resuming
  OUT/scores/<data>.jsonl              the grade of every sample
  OUT/results.json, OUT/results.csv    per-benchmark metrics + everything that determines them
  OUT/table.md, OUT/table.csv, OUT/table.png   paper-style table beside the paper's reference rows
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import sys
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from exgrpo.eval.backends import BACKENDS, GenerationBackend, library_versions, vllm_model_problem
from exgrpo.eval.config import DEFAULT_BATCH_SIZE, DEFAULT_MAX_NEW_TOKENS, EvalConfig
from exgrpo.eval.generate import (
    TEMPLATES,
    EvalRow,
    GenerationStore,
    PromptFormat,
    ResumeMismatchError,
    SamplingSettings,
    chat_template_sha,
    file_sha256,
    generate_to_jsonl,
    generation_fingerprint,
    plan_samples,
    read_generations,
)
from exgrpo.eval.grading import (
    DEFAULT_GRADER,
    DEFAULT_GRADING,
    GRADING_MODES,
    TOOL_KEYS,
    Grader,
    grade_records,
    summarize,
)
from exgrpo.eval.parallel import (
    REPLICA_DIR,
    ReplicaSpec,
    merge_shards,
    replica_devices,
    run_replicas,
    shard_path,
    shard_paths,
    shard_work,
)
from exgrpo.eval.report import (
    REFERENCE_CHOICES,
    EvalResults,
    TableRow,
    load_results,
    now_iso,
    parse_reference_markdown,
    render_markdown,
    write_report,
)
from exgrpo.stop_signals import describe_stopped, main_until_stopped, stop_descendants


def _run_file(cfg: EvalConfig) -> pathlib.Path:
    return cfg.out / "run.json"


def generate(cfg: EvalConfig, backend: GenerationBackend | None = None) -> dict[str, int]:
    """Generate every missing (row, sample) of every data file; returns new samples per file.

    With ``data_parallel_size`` > 1 (and no ``backend`` given) the work is split over that many engine replicas,
    one process each on its own GPUs (``exgrpo.eval.parallel``)."""
    rows = {data: cfg.load_rows(data) for data in cfg.data}  # bad files or filters stop here, before anything
    make_out_dir(cfg.out)
    stores, fingerprints = {}, {}
    for data in cfg.data:  # open every store before the model loads: a settings mismatch stops early
        fingerprints[data] = generation_fingerprint(
            model=cfg.model,
            backend=cfg.backend,
            data=data,
            prompt_format=cfg.prompt_format,
            sampling=cfg.sampling,
            agent=cfg.agent,
        )
        stores[data] = GenerationStore.open(cfg.generation_path(data), fingerprints[data], overwrite=cfg.overwrite)
        if cfg.overwrite:
            for shard in shard_paths(stores[data].path):
                shard.unlink()
        merge_shards(stores[data])  # what replicas of an interrupted run left behind
    before = {data: len(stores[data].records) for data in cfg.data}
    pending = {data: _missing(rows[data], stores[data], cfg.sampling) for data in cfg.data}
    meta = _run_metadata(cfg, backend=None)
    replicas = backend is None and cfg.data_parallel_size > 1
    if any(pending.values()):
        if backend is None:
            check_model_dir(cfg.model)
            problem = vllm_model_problem(cfg.model) if cfg.backend == "vllm" else None
            if problem:  # before the replicas start, each with its own engine
                raise ValueError(problem)
        if replicas:
            from transformers import AutoTokenizer  # the parent needs the template's hash only, not the model

            meta = _run_metadata(cfg, backend=_TokenizerOnly(AutoTokenizer.from_pretrained(cfg.model)))
        elif backend is None:
            backend = cfg.build_backend()
            meta = _run_metadata(cfg, backend=backend)
        else:
            meta = _run_metadata(cfg, backend=backend)
    _run_file(cfg).write_text(json.dumps({"config": cfg.to_dict(), "metadata": meta}, indent=2), encoding="utf-8")
    if replicas and any(pending.values()):
        _generate_with_replicas(cfg, pending, stores, fingerprints)
        return {data: len(stores[data].records) - before[data] for data in cfg.data}
    generated = {}
    for data in cfg.data:
        if not pending[data]:
            generated[data] = 0
            continue
        generated[data] = generate_to_jsonl(
            backend,
            rows[data],
            stores[data],
            prompt_format=cfg.prompt_format,
            sampling=cfg.sampling,
            batch_size=cfg.batch_size or DEFAULT_BATCH_SIZE[cfg.backend],
            progress=cfg.progress,
            desc=f"generate {pathlib.Path(data).stem}",
        )
    return generated


MERGE_COMMAND = (
    "python -m verl.model_merger merge --backend fsdp --local_dir {actor} --target_dir {actor_parent}/merged_hf"
)


def make_out_dir(out: pathlib.Path, option: str = "--out") -> None:
    """Create the output directory, or say in one line why it cannot be."""
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ValueError(f"{option} {out}: cannot create the directory ({e.strerror or e})") from e
    if not os.access(out, os.W_OK | os.X_OK):
        raise ValueError(f"{option} {out}: the directory is not writable")


def check_model_dir(model: str) -> None:
    """A local model directory must exist and hold weights. verl's ``global_step_N/actor/huggingface`` holds only the
    config and tokenizer with the default checkpoint contents: say how to merge the FSDP shards instead of failing
    deep in the engine. A Hub id (``org/name``) is left to the backend."""
    path = pathlib.Path(model).expanduser()
    local = model.startswith(("/", "./", "../", "~")) or model.count("/") > 1  # a Hub id is "org/name"
    if not path.exists() and local:
        raise FileNotFoundError(
            f"--model {model}: no such directory (a Hugging Face model directory with weights, or a Hub id)"
        )
    if path.exists() and not path.is_dir():
        raise FileNotFoundError(f"--model {model}: not a directory (give the model's Hugging Face directory)")
    if not path.is_dir():
        return  # a Hub id: the backend loads (or reports) it
    if any(path.glob("*.safetensors")) or any(path.glob("*.bin")):
        return
    message = f"{model} holds no model weights (*.safetensors / *.bin)"
    actor = path.parent if path.name == "huggingface" else path
    if actor.name == "actor":
        message += (
            ": it is a verl checkpoint folder, whose weights are FSDP shards; merge them first with\n  "
            + MERGE_COMMAND.format(actor=actor, actor_parent=actor.parent)
            + f"\nand evaluate {actor.parent / 'merged_hf'}"
        )
    raise FileNotFoundError(message)


@dataclass
class _TokenizerOnly:
    tokenizer: Any


def _missing(rows: list[EvalRow], store: GenerationStore, sampling: SamplingSettings) -> dict[int, list[int]]:
    """``{row: [sample, ...]}`` of the planned samples ``store`` does not hold."""
    plan = plan_samples(rows, sampling.n_samples)
    out = {r.row: [s for s in range(plan[r.row]) if (r.row, s) not in store.records] for r in rows}
    return {r: s for r, s in out.items() if s}


def _generate_with_replicas(
    cfg: EvalConfig,
    pending: dict[str, dict[int, list[int]]],
    stores: dict[str, GenerationStore],
    fingerprints: dict[str, dict[str, Any]],
) -> None:
    # One GPU per HF replica; a vLLM replica spans tensor_parallel_size GPUs.
    tp = cfg.tensor_parallel_size if cfg.backend == "vllm" else 1
    devices = replica_devices(cfg.data_parallel_size, tp, os.environ.get("CUDA_VISIBLE_DEVICES"))
    work_dir = cfg.out / REPLICA_DIR
    specs = [
        ReplicaSpec(
            index=i,
            config=cfg.to_dict(),
            work=shard,
            shards={d: str(shard_path(cfg.generation_path(d), i)) for d in shard},
            fingerprints={d: fingerprints[d] for d in shard},
            status_file=str(work_dir / f"replica{i}.status.json"),
        )
        for i, shard in enumerate(shard_work(pending, cfg.data_parallel_size))
        if shard
    ]
    total = sum(len(s) for rows in pending.values() for s in rows.values())
    try:
        run_replicas(specs, devices, work_dir, total=total, progress=cfg.progress)
    finally:
        for store in stores.values():  # what every replica finished, also after a failure or an interruption
            merge_shards(store)


def _run_metadata(cfg: EvalConfig, backend: GenerationBackend | None) -> dict[str, Any]:
    """What the results must carry (docs/algorithm.md §12: vLLM version, template and grader change scores)."""
    old = {}
    if _run_file(cfg).is_file():
        old = json.loads(_run_file(cfg).read_text(encoding="utf-8")).get("metadata", {})
    sha = (
        chat_template_sha(backend.tokenizer)
        if backend is not None
        else old.get("template", {}).get("chat_template_sha")
    )
    return {
        "model": cfg.model,
        "backend": cfg.backend,
        "tensor_parallel_size": cfg.tensor_parallel_size if cfg.backend == "vllm" else None,
        "data_parallel_size": cfg.data_parallel_size,
        "template": {
            "kind": cfg.prompt_format.template,
            "chat_template_sha": sha,
            "system_prompt_mode": cfg.prompt_format.system_prompt_mode,
            "system_prompt": cfg.prompt_format.system_prompt,
        },
        "sampling": asdict(cfg.sampling),
        "seed": cfg.sampling.seed,
        "agent": cfg.agent,
        "data": [{"path": str(pathlib.Path(d).resolve()), "sha256": file_sha256(d)} for d in cfg.data],
        "selection": {
            "data_sources": cfg.data_sources,
            "max_questions_per_source": cfg.max_questions_per_source,
            "max_rows": cfg.max_rows,
        },
        "versions": library_versions() if backend is not None or not old else old.get("versions", {}),
        "generated_at": now_iso() if backend is not None else old.get("generated_at"),
    }


def score(cfg: EvalConfig, grader: Grader | None = None, *, allow_partial: bool = False) -> EvalResults:
    """Grade the planned generations of every data file and summarise them per benchmark."""
    if grader is None:
        grader = Grader(
            cfg.grader,
            think_gate=cfg.think_gate,
            timeout_s=cfg.grader_timeout_s,
            grading=cfg.grading,
            strip_tool_responses=cfg.strip_tool_responses,
        )
    graded_all = []
    data_meta = []
    for data in cfg.data:
        rows = cfg.load_rows(data)
        plan = plan_samples(rows, cfg.sampling.n_samples)
        records = read_generations(cfg.generation_path(data))
        keys = [(r.row, s) for r in rows for s in range(plan[r.row])]
        missing = [k for k in keys if k not in records]
        if missing and not allow_partial:
            raise RuntimeError(
                f"{cfg.generation_path(data)}: {len(missing)} of {len(keys)} planned samples are not generated "
                f"yet (first: row {missing[0][0]}, sample {missing[0][1]}); run 'generate' again to finish them"
            )
        graded = grade_records(
            [records[k] for k in keys if k in records],
            grader,
            progress=cfg.progress,
            desc=f"grade {pathlib.Path(data).stem}",
        )
        path = cfg.score_path(data)
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("w", encoding="utf-8") as f:
            for g in graded:
                keep = ("row", "sample", "benchmark", "question_id", "score", "outcome", "num_tokens", "finish_reason")
                tools = {k: g[k] for k in TOOL_KEYS if k in g}  # a multi-turn run's per-answer figures
                f.write(json.dumps({**{k: g.get(k) for k in keep}, **tools}) + "\n")
        graded_all.extend(graded)
        data_meta.append(
            {
                "path": str(pathlib.Path(data).resolve()),
                "sha256": file_sha256(data),
                "rows": len(rows),
                "samples": len(graded),
            }
        )
    meta = _run_metadata(cfg, backend=None)
    meta["data"] = data_meta
    meta["grader"] = grader.describe()
    meta["scored_at"] = now_iso()
    return EvalResults(label=cfg.resolved_label(), benchmarks=summarize(graded_all), metadata=meta)


def _reference(cfg_reference: str, reference_file: str | None) -> str | list[TableRow]:
    if reference_file is None or cfg_reference == "none":
        return cfg_reference
    tables = parse_reference_markdown(pathlib.Path(reference_file).read_text(encoding="utf-8"))
    if cfg_reference not in tables:
        raise ValueError(f"{reference_file}: no {cfg_reference!r} with the paper's columns (found {sorted(tables)})")
    return tables[cfg_reference]


def evaluate(
    cfg: EvalConfig, backend: GenerationBackend | None = None, grader: Grader | None = None
) -> tuple[EvalResults, dict[str, pathlib.Path]]:
    """The whole pipeline: generate (resuming), grade, and write results JSON/CSV, table.md/csv and table.png."""
    generate(cfg, backend)
    results = score(cfg, grader)
    paths = write_report(results, cfg.out, _reference(cfg.reference, cfg.reference_file), plot=cfg.plot)
    return results, paths


# --- command line --------------------------------------------------------------------------------------------


def _add_common(p: argparse.ArgumentParser, *, generation: bool, grading: bool) -> None:
    p.add_argument("--out", required=True, help="output directory (generations, scores, results, table)")
    if generation:
        p.add_argument("--model", required=True, help="checkpoint: a Hugging Face model directory")
        p.add_argument("--data", nargs="+", required=True, help="benchmark parquet file(s) in verl format")
        p.add_argument("--backend", choices=BACKENDS, default="vllm", help="vllm on GPUs (the paper's), hf on CPU")
        p.add_argument("--label", help="row name in the table (default: from the model path)")
        p.add_argument(
            "--template",
            choices=TEMPLATES,
            default="chat",
            help="chat: the model's own chat template (default); plain: contents joined; llama_base: the paper's "
            "Llama-3.1-8B base prompt",
        )
        sys_group = p.add_mutually_exclusive_group()
        sys_group.add_argument("--system-prompt", help="replace the dataset's system message with this text")
        sys_group.add_argument(
            "--no-system-prompt", action="store_true", help="drop the dataset's system message (the default)"
        )
        sys_group.add_argument(
            "--keep-system-prompt", action="store_true", help="keep the dataset's system message (not the paper's)"
        )
        p.add_argument(
            "--temperature", type=float, default=0.6, help="sampling temperature (default 0.6, the protocol's)"
        )
        p.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling (default 1.0, the protocol's: off)")
        p.add_argument(
            "--max-new-tokens",
            type=int,
            default=None,
            help=f"tokens generated per answer at most (default: {DEFAULT_MAX_NEW_TOKENS['vllm']}, the protocol's, "
            f"with vllm; {DEFAULT_MAX_NEW_TOKENS['hf']} with hf, the CPU backend, whose tables then mark the run ‡)",
        )
        p.add_argument(
            "--n-samples",
            type=int,
            default=None,
            help="samples per row (default: protocol — 32 per AIME24/AIME25/AMC question split over its repeated "
            "rows, 1 elsewhere)",
        )
        p.add_argument(
            "--seed",
            type=int,
            default=0,
            help="sampling seed (default 0; vLLM seeds each row's request with it and the row, hf each batch)",
        )
        p.add_argument("--batch-size", type=int, help="sequences per generation call (default: hf 8, vllm 2048)")
        p.add_argument("--tensor-parallel-size", type=int, default=1, help="vLLM tensor parallel size (GPUs)")
        p.add_argument(
            "--data-parallel-size",
            type=int,
            default=1,
            help="engine replicas, one process each on tensor-parallel-size GPUs of CUDA_VISIBLE_DEVICES "
            "(all GPUs used: GPUs / tensor parallel size)",
        )
        p.add_argument("--gpu-memory-utilization", type=float, default=0.9, help="vLLM")
        p.add_argument("--max-model-len", type=int, help="vLLM context length (default: the model's)")
        p.add_argument("--dtype", default="auto", help="model dtype (auto: bf16 on GPU, fp32 on CPU for hf)")
        p.add_argument("--device", help="hf backend device (default: cuda if available else cpu)")
        p.add_argument("--data-sources", nargs="+", help="only these benchmarks (data_source values)")
        p.add_argument("--max-questions-per-source", type=int, help="first N distinct questions per benchmark")
        p.add_argument("--max-rows", type=int, help="first N rows (after the other filters)")
        p.add_argument("--overwrite", action="store_true", help="discard existing generations instead of resuming")
    if grading:
        p.add_argument("--grader", default=DEFAULT_GRADER, help="checker as module:function")
        p.add_argument(
            "--grading",
            choices=GRADING_MODES,
            default=DEFAULT_GRADING,
            help="paper (default): the last \\boxed{} after the first </think> (whole text without one), no box "
            "= wrong; reward: the training reward's rule (think gate, unboxed answers accepted)",
        )
        p.add_argument(
            "--think-gate",
            action=argparse.BooleanOptionalAction,
            default=True,
            help="with --grading reward: count an answer only after a closing </think>",
        )
        p.add_argument("--grader-timeout", type=float, default=10.0, help="seconds per answer")
        p.add_argument(
            "--strip-tool-responses",
            action=argparse.BooleanOptionalAction,
            default=None,
            help="grade without the tool's answers (<tool_response>...</tool_response>), as the training reward "
            "with strip_tool_responses (default: on for a run with tools, off otherwise)",
        )
        p.add_argument("--reference", choices=REFERENCE_CHOICES, default="table1", help="paper rows to print")
        p.add_argument("--reference-file", help="read the reference rows from a Markdown file (docs/paper_results.md)")
        p.add_argument("--no-plot", action="store_true", help="skip the PNG chart")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")


def build_parser(
    extend: Callable[[argparse.ArgumentParser], None] | None = None,
    prog: str = "exgrpo-eval",
    description: str = "ExGRPO evaluation (paper protocol: docs/algorithm.md §12).",
) -> argparse.ArgumentParser:
    """The command line's parser; ``extend(subparser)`` adds options to ``run`` and ``generate`` (another command
    that reuses this one, see :func:`main`)."""
    parser = argparse.ArgumentParser(prog=prog, description=description)
    sub = parser.add_subparsers(dest="command", required=True)
    for name, help_, grading in (
        ("run", "generate + grade + report", True),
        ("generate", "generate only (resumable)", False),
    ):
        p = sub.add_parser(name, help=help_)
        _add_common(p, generation=True, grading=grading)
        if extend is not None:
            extend(p)
    p = sub.add_parser("score", help="grade the generations in --out and write the report")
    _add_common(p, generation=False, grading=True)
    p.add_argument("--allow-partial", action="store_true", help="grade what exists even if generation is unfinished")
    p = sub.add_parser("report", help="render the table from results JSON file(s)")
    p.add_argument("results", nargs="+", help="results.json file(s); rows with the same label are merged")
    p.add_argument("--out", help="also write table.md, table.csv and table.png here")
    p.add_argument("--reference", choices=REFERENCE_CHOICES, default="table1")
    p.add_argument("--reference-file", help="read the reference rows from a Markdown file (docs/paper_results.md)")
    p.add_argument("--no-plot", action="store_true")
    return parser


def _config_from_args(a: argparse.Namespace) -> EvalConfig:
    system_prompt = None if a.keep_system_prompt else "" if a.system_prompt is None else a.system_prompt
    return EvalConfig(
        model=a.model,
        data=list(a.data),
        out_dir=a.out,
        backend=a.backend,
        label=a.label,
        prompt_format=PromptFormat(template=a.template, system_prompt=system_prompt),
        sampling=SamplingSettings(
            temperature=a.temperature,
            top_p=a.top_p,
            max_new_tokens=DEFAULT_MAX_NEW_TOKENS[a.backend] if a.max_new_tokens is None else a.max_new_tokens,
            seed=a.seed,
            n_samples=a.n_samples,
        ),
        batch_size=a.batch_size,
        tensor_parallel_size=a.tensor_parallel_size,
        data_parallel_size=a.data_parallel_size,
        gpu_memory_utilization=a.gpu_memory_utilization,
        max_model_len=a.max_model_len,
        dtype=a.dtype,
        device=a.device,
        data_sources=a.data_sources,
        max_questions_per_source=a.max_questions_per_source,
        max_rows=a.max_rows,
        grader=getattr(a, "grader", DEFAULT_GRADER),
        grading=getattr(a, "grading", DEFAULT_GRADING),
        think_gate=getattr(a, "think_gate", True),
        grader_timeout_s=getattr(a, "grader_timeout", 10.0),
        strip_tool_responses=bool(getattr(a, "strip_tool_responses", None)),
        reference=getattr(a, "reference", "table1"),
        reference_file=getattr(a, "reference_file", None),
        plot=not getattr(a, "no_plot", False),
        overwrite=a.overwrite,
        progress=not a.no_progress,
    )


def main(
    argv: Sequence[str] | None = None,
    *,
    parser: argparse.ArgumentParser | None = None,
    configure: Callable[[EvalConfig, argparse.Namespace], None] | None = None,
) -> int:
    """The command. SIGTERM, SIGHUP or Ctrl-C stop what it started (a vLLM engine, the data-parallel replicas, the
    grading workers) with one line and exit status 128 + the signal's number; the generations written so far stay
    (the same command goes on from them). ``parser`` (``build_parser()`` with more options) and
    ``configure(cfg, args)`` (applied to the config of ``run`` and ``generate`` before anything runs) let another
    command reuse it: the recipe's evaluation with tools (``python -m recipe.exgrpo.tool_eval``) adds its tool
    settings this way."""
    a = (parser or build_parser()).parse_args(argv)
    return main_until_stopped(
        lambda: _main_reporting(a, configure), lambda signum: describe_stopped(stop_descendants()), "eval"
    )


def _main_reporting(
    a: argparse.Namespace, configure: Callable[[EvalConfig, argparse.Namespace], None] | None = None
) -> int:
    try:
        return _main(a, configure)
    except (ValueError, OSError, ImportError, ResumeMismatchError, RuntimeError) as e:
        # configuration and data problems: one clear line instead of a traceback
        print(f"error: {e}", file=sys.stderr)
        return 2


def _main(a: argparse.Namespace, configure: Callable[[EvalConfig, argparse.Namespace], None] | None = None) -> int:
    if a.command in ("run", "generate"):
        cfg = _config_from_args(a)
        if configure is not None:
            configure(cfg, a)
        if a.command == "generate":
            done = generate(cfg)
            print(json.dumps({pathlib.Path(k).name: v for k, v in done.items()}))
            return 0
        results, paths = evaluate(cfg)
    elif a.command == "score":
        run_file = pathlib.Path(a.out) / "run.json"
        if not run_file.is_file():
            raise SystemExit(f"error: {run_file} not found; run 'generate' (or 'run') with --out {a.out} first")
        cfg = EvalConfig.from_dict(json.loads(run_file.read_text(encoding="utf-8"))["config"])
        # The generations are read from, and everything is written into, --out: a copied output directory can
        # be re-graded without touching the directory it was copied from (run.json still names that one).
        cfg.out_dir = a.out
        cfg.grader, cfg.grading = a.grader, a.grading
        cfg.think_gate, cfg.grader_timeout_s = a.think_gate, a.grader_timeout
        if a.strip_tool_responses is not None:
            cfg.strip_tool_responses = a.strip_tool_responses
        cfg.reference, cfg.reference_file, cfg.plot = a.reference, a.reference_file, not a.no_plot
        cfg.progress = not a.no_progress
        results = score(cfg, allow_partial=a.allow_partial)
        paths = write_report(results, cfg.out, _reference(cfg.reference, cfg.reference_file), plot=cfg.plot)
    else:
        loaded = [load_results(p) for p in a.results]
        reference = _reference(a.reference, a.reference_file)
        print(render_markdown(loaded, reference), end="")
        if a.out:
            make_out_dir(pathlib.Path(a.out))
            paths = write_report(loaded, a.out, reference, plot=not a.no_plot)
            print("\n".join(f"{k}: {v}" for k, v in paths.items()), file=sys.stderr)
        return 0
    print(render_markdown([results], _reference(cfg.reference, cfg.reference_file)), end="")
    print("\n".join(f"{k}: {v}" for k, v in paths.items()), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
