"""Tiny ExGRPO training on CPU through the real verl trainer: the README's main command.

``python -m recipe.exgrpo.cpu_demo [--steps N] [--seed S] [--onpolicy] [--out DIR] [--resume] [hydra overrides...]``
builds (or reuses) the tiny warmed-up Qwen2 model and the toy arithmetic data with its easy/medium/hard split
(recipe/exgrpo/harness/assets.py, no downloads), runs ``python -m recipe.exgrpo.main_exgrpo`` with the CPU backend
under a hard wall-clock limit, prints one short line per step (the full verl log goes to ``<out>/train.log``,
every metric to ``<out>/metrics.jsonl``) and when replay starts, and ends with a summary and a PNG learning curve
(validation accuracy per difficulty, batch pass rate, pool size, replayed share). One folder holds one run (an
earlier one is moved to ``<out>.old-N``; ``--resume`` continues it, its history kept); SIGTERM, SIGHUP or Ctrl-C
stop the training with one line.

The same functions drive the e2e tests and the CPU benchmarks (``benchmarks/learning_cpu.py``,
``benchmarks/exgrpo_vs_grpo_cpu.py``). The demo's settings are :data:`DEMO_SETTINGS`; how they were chosen and
what they give is in docs/learning.md.
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from exgrpo.modes import DEFAULT_REWARD_MODE, get_reward_mode
from recipe.exgrpo.cpu import CPU_ROLLOUTS
from recipe.exgrpo.cpu.run_config import CpuRunSpec, cpu_env, cpu_overrides, separate_async_overrides
from recipe.exgrpo.harness.procs import RunResult, run_ray_command_in_new_session

REPO_ROOT = Path(__file__).resolve().parents[3]


@dataclass
class ExGRPOCpuRun:
    """Settings of a tiny CPU ExGRPO run (prompt counts per step; K = rollout_n).

    The defaults are a small, fast configuration for tests and timing benchmarks; the demo's settings (chosen so
    that the validation accuracy rises clearly, docs/learning.md) are :data:`DEMO_SETTINGS` (:func:`demo_run`).
    """

    output_dir: Path
    steps: int = 30
    train_batch_size: int = 8
    rollout_n: int = 4
    ppo_mini_batch_size: int = 8
    # rows per forward/backward of the actor (per device); larger = fewer, bigger matmuls on CPU
    micro_batch_size: int = 16
    # the byte-level toy tokenizer spends ~70 tokens on the chat-templated question
    max_prompt_length: int = 128
    # the response "</think>\boxed{1044}<|im_end|>" is 21 tokens
    max_response_length: int = 24
    # Adam moves each weight by about lr per step, whatever the loss scale: at 1e-4 even a trivially learnable
    # reward rises slowly on this 157k-parameter model, at 1e-3 one step wrecks its arithmetic (docs/learning.md)
    lr: float = 2e-4
    delayed_start_threshold: float = 0.2
    replay_ratio: float = 0.5
    save_freq: int = -1
    test_freq: int = -1
    val_before_train: bool = False
    # validation: every question sampled val_n times at val_temperature (mean@val_n; 0 = greedy)
    val_temperature: float = 1.0
    val_n: int = 1
    resume_mode: str = "disable"
    resume_from_path: str | None = None
    exgrpo_enable: bool = True
    # a reward file with verl's compute_score signature (None: the recipe's math-verify reward, or in the
    # continuous reward mode the toy task's partial credit, recipe/exgrpo/harness/partial_credit.py)
    reward_fn_path: str | None = None
    # exgrpo.reward_mode: binary (0/1 rewards) or continuous (real-valued rewards, docs/algorithm.md §13)
    reward_mode: str = DEFAULT_REWARD_MODE
    wall_limit_s: float = 1500.0
    seed: int = 0
    ray_temp_dir: str | None = None
    # "hf" (the Hugging Face stand-in) or "vllm" (verl's vLLM rollout on the vLLM CPU stack, its own venv)
    rollout: str = "hf"
    # the interpreter that runs the trainer (default: this one); the vLLM stack lives in .venv-vllm
    python: str | None = None
    # verl's trainer: "legacy" (RayPPOTrainer, the recipe's default) or "v1" (its v1 trainer, sync mode)
    trainer: str = "legacy"
    # LoRA on the FSDP actor (actor_rollout_ref.model.lora_rank; 0: full fine-tuning), its alpha, and how the rollout
    # gets the weights: merged into the base weights (True) or as the adapter (False); None: the rollout's way
    # (hf: merged, the only way it takes; vllm: the adapter)
    lora_rank: int = 0
    lora_alpha: int = 16
    lora_merge: bool | None = None
    extra_overrides: list[str] = field(default_factory=list)


# The demo's settings (and those of benchmarks/learning_cpu.py): how they were chosen is in docs/learning.md.
DEMO_SETTINGS: dict = dict(
    steps=60,
    train_batch_size=16,
    rollout_n=8,
    ppo_mini_batch_size=16,
    micro_batch_size=64,
    lr=2e-4,
    # the paper's τ: replay starts once the batch pass rate exceeds 0.35 (the warmed-up model starts at ~0.2)
    delayed_start_threshold=0.35,
    test_freq=10,
    val_before_train=True,
    val_temperature=1.0,
    val_n=1,
)


# ``--lora``: what changes from DEMO_SETTINGS (docs/learning.md, "LoRA"). Rank 8 of the tiny model's width 64 on every
# linear layer of its blocks: 22,528 trainable parameters, 14% of the model's 156,608 (a 7B model's rank-64 adapter is
# ~2%; rank 1 would be that share here, too few to learn the format with); 8 is also a rank vLLM's LoRA takes as is.
# The learning rate: the best of a 3-point sweep on seed 1 by mean validation accuracy over the run's 7 evaluations
# (5e-4: 0.314, 2e-3: 0.342, 8e-3: 0.035, the format lost by step 10; both others end at 0.419).
LORA_DEMO_SETTINGS: dict = dict(lora_rank=8, lora_alpha=16, lr=2e-3)


def lora_merge(run: ExGRPOCpuRun) -> bool:
    """Whether the rollout gets the merged weights (``actor_rollout_ref.model.lora.merge``): the run's choice, else
    the rollout's way (the hf stand-in loads merged weights only; verl's vLLM rollout serves the adapter)."""
    return run.rollout == "hf" if run.lora_merge is None else run.lora_merge


def lora_overrides(run: ExGRPOCpuRun) -> list[str]:
    """The LoRA settings of the FSDP actor (none for full fine-tuning). verl's FSDP engine reads
    ``actor_rollout_ref.model.lora_rank``, ``lora_alpha`` and ``target_modules``; ``model.lora.merge`` says how the
    rollout gets the weights."""
    if run.lora_rank <= 0:
        return []
    return [
        f"actor_rollout_ref.model.lora_rank={run.lora_rank}",
        f"actor_rollout_ref.model.lora_alpha={run.lora_alpha}",
        "actor_rollout_ref.model.target_modules=all-linear",
        f"actor_rollout_ref.model.lora.merge={lora_merge(run)}",
    ]


# On the vLLM rollout the demo replays from step 2 (its model starts below the demo's τ, docs/cpu_backend.md).
VLLM_DEMO_DELAYED_START = -1.0

#: The calculator task's reward (``--tools``): the binary reward and the call figures (harness/tool_reward.py).
TOOL_REWARD = "pkg://recipe.exgrpo.harness.tool_reward"
# ``--tools``: what changes from DEMO_SETTINGS. An exchange with a call is ~105 tokens (the call ~60, the tool's turn
# ~20, the answer ~20, recipe/exgrpo/harness/tool_task.py), one without ~20.
TOOL_DEMO_SETTINGS: dict = dict(max_response_length=128)


def separate_async_settings(parameter_sync_step: int) -> dict:
    """The :class:`ExGRPOCpuRun` fields of a run in verl's ``separate_async`` mode with the default batch: each local
    update trains ``train_batch_size / parameter_sync_step`` questions (its mini-batch), with micro-batches no larger
    than its rows (verl's fixed micro-batches must divide them), and ``separate_async_overrides``."""
    mini = ExGRPOCpuRun.train_batch_size // int(parameter_sync_step)
    return {
        "ppo_mini_batch_size": mini,
        "micro_batch_size": min(ExGRPOCpuRun.micro_batch_size, mini * ExGRPOCpuRun.rollout_n),
        "extra_overrides": separate_async_overrides(parameter_sync_step),
    }


def tool_run(run: ExGRPOCpuRun) -> ExGRPOCpuRun:
    """``run`` on the calculator task: verl's tool agent loop with the calculator, the tool task's reward."""
    from recipe.exgrpo.harness.tool_task import multi_turn_overrides

    for key, value in TOOL_DEMO_SETTINGS.items():
        setattr(run, key, value)
    run.reward_fn_path = run.reward_fn_path or TOOL_REWARD
    run.extra_overrides = multi_turn_overrides() + list(run.extra_overrides)
    return run


def demo_run(output_dir: str | Path, **overrides) -> ExGRPOCpuRun:
    """An :class:`ExGRPOCpuRun` with the demo's settings; keyword arguments replace any of them."""
    return ExGRPOCpuRun(output_dir=Path(output_dir), **{**DEMO_SETTINGS, **overrides})


def build_overrides(run: ExGRPOCpuRun, model_path: str, train_file: str, val_file: str) -> list[str]:
    """Hydra overrides of ``recipe.exgrpo.main_exgrpo`` for a tiny CPU run."""
    spec = CpuRunSpec(
        model_path=model_path,
        train_files=train_file,
        val_files=val_file,
        output_dir=str(run.output_dir),
        total_training_steps=run.steps,
        train_batch_size=run.train_batch_size,
        rollout_n=run.rollout_n,
        ppo_mini_batch_size=run.ppo_mini_batch_size,
        micro_batch_size_per_device=run.micro_batch_size,
        max_prompt_length=run.max_prompt_length,
        max_response_length=run.max_response_length,
        lr=run.lr,
        seed=run.seed,
        ray_temp_dir=run.ray_temp_dir,
        save_freq=run.save_freq,
        test_freq=run.test_freq,
        val_before_train=run.val_before_train,
        resume_mode=run.resume_mode,
        project_name="exgrpo_cpu_demo",
        experiment_name="exgrpo" if run.exgrpo_enable else "onpolicy",
        rollout=run.rollout,
        use_v1=run.trainer == "v1",
    )
    overrides = cpu_overrides(spec) + [
        # the recipe's reward with its </think> gate on (as for the paper's Qwen-Math runs): the warmed-up model
        # closes the think block in about half its answers (recipe/exgrpo/harness/assets.py)
        "+reward.custom_reward_function.reward_kwargs.timeout_s=null",
        # Dr.GRPO constant normaliser L_max = the response budget of this tiny run (8192 in the 7B run)
        "actor_rollout_ref.actor.loss_agg_mode=seq-mean-token-sum-norm",
        f"actor_rollout_ref.actor.loss_scale_factor={run.max_response_length}",
        "actor_rollout_ref.actor.entropy_coeff=0.001",
        "algorithm.norm_adv_by_std_in_grpo=False",
        f"actor_rollout_ref.rollout.val_kwargs.temperature={run.val_temperature}",
        f"actor_rollout_ref.rollout.val_kwargs.do_sample={run.val_temperature > 0}",
        f"actor_rollout_ref.rollout.val_kwargs.n={run.val_n}",
        "actor_rollout_ref.rollout.val_kwargs.top_p=1.0",
        f"exgrpo.enable={run.exgrpo_enable}",
        *reward_mode_overrides(run),
        f"exgrpo.replay_ratio={run.replay_ratio}",
        f"exgrpo.seed={run.seed}",
        *lora_overrides(run),
    ]
    if run.resume_from_path:
        overrides.append(f"trainer.resume_from_path={run.resume_from_path}")
    if run.reward_fn_path:
        overrides.append(f"reward.custom_reward_function.path={run.reward_fn_path}")
    return overrides + list(run.extra_overrides)


#: The continuous mode's reward on the toy task: partial credit for the format and for each right digit.
PARTIAL_CREDIT_REWARD = "pkg://recipe.exgrpo.harness.partial_credit"
#: The toy task's reward for each reward mode the demo runs (``--reward``): the reward function (None: the recipe's
#: math-verify 0/1 reward, recipe/exgrpo/reward.py) and its name in the demo's lines.
TOY_REWARDS: dict[str, tuple[str | None, str]] = {
    "binary": (None, "the math-verify 0/1 reward"),
    "continuous": (PARTIAL_CREDIT_REWARD, "partial credit"),
}


def reward_mode_overrides(run: ExGRPOCpuRun) -> list[str]:
    """The reward mode's overrides: the mode, the delayed-start τ when the mode reads one (the binary pass rate's; the
    continuous mode's start is a step count, the recipe's default), and the mode's toy reward unless another is
    given."""
    mode = get_reward_mode(run.reward_mode)
    out = [f"exgrpo.reward_mode={run.reward_mode}"]
    if "delayed_start_threshold" in mode.options:
        out.append(f"exgrpo.delayed_start_threshold={run.delayed_start_threshold}")
    toy_reward = TOY_REWARDS.get(run.reward_mode, (None, ""))[0]
    if toy_reward and not run.reward_fn_path:
        out.append(f"reward.custom_reward_function.path={toy_reward}")
    return out


def launch(
    run: ExGRPOCpuRun,
    assets=None,
    echo: bool = True,
    on_step: Callable[[dict], None] | None = None,
) -> RunResult:
    """Run the trainer in its own process session under ``run.wall_limit_s``.

    Everything the trainer prints goes to ``<output_dir>/train.log``; its metrics to ``metrics.jsonl``. With
    ``echo`` the log is copied to stdout as it grows; ``on_step`` is called with each metrics row as verl's file
    logger writes it (the demo's short per-step line).

    One folder holds one run. A fresh run (``resume_mode`` disable) into a folder that holds another run's files
    moves them aside first (:func:`set_aside_previous_run`). A resume keeps the history: the metrics of the steps up
    to the checkpoint it resumes from stay, merged by step with the resumed steps' (:func:`merge_metrics`; verl's
    file logger itself starts its file empty).
    """
    if assets is None:
        from recipe.exgrpo.harness.assets import asset_spec, ensure_assets

        assets = ensure_assets(asset_spec(run.rollout))
    run.output_dir = Path(run.output_dir)
    run.output_dir.mkdir(parents=True, exist_ok=True)
    metrics_path = run.output_dir / "metrics.jsonl"
    resumed_from = resume_step(run)
    if run.resume_mode == "disable":
        set_aside_previous_run(run.output_dir, keep=(RUN_RECORD,))  # (the demo moved its own run aside already)
    elif resumed_from is not None:
        keep_history(run.output_dir, resumed_from)
    metrics_path.unlink(missing_ok=True)
    overrides = build_overrides(run, str(assets.model_path), str(assets.train_file), str(assets.val_file))
    env = {**os.environ, **cpu_env(output_dir=run.output_dir, wall_limit_s=run.wall_limit_s)}
    cmd = [run.python or sys.executable, "-m", "recipe.exgrpo.main_exgrpo", *overrides]
    log_path = run.output_dir / "train.log"
    if resumed_from is None or not log_path.exists():
        log_path.write_text("")
    else:  # the log of the steps before too
        with open(log_path, "a") as log:
            log.write(f"\n[demo] ===== resumed from the checkpoint of step {resumed_from} =====\n")
    stop = threading.Event()
    followers = []
    if echo:
        start = log_path.stat().st_size if resumed_from is not None else 0  # (not the log before the resume again)
        followers.append(threading.Thread(target=_follow_text, args=(log_path, stop, start), daemon=True))
    if on_step:
        followers.append(threading.Thread(target=_follow_metrics, args=(metrics_path, stop, on_step), daemon=True))
    for t in followers:
        t.start()
    try:
        return run_ray_command_in_new_session(
            cmd, env=env, cwd=str(REPO_ROOT), timeout_s=run.wall_limit_s + 60, log_path=log_path, append=True
        )
    finally:
        stop.set()
        for t in followers:
            t.join(timeout=5)
        if resumed_from is not None:
            merge_metrics(run.output_dir)


#: Where a resumed run keeps the metrics of the steps before its checkpoint while verl's file logger writes the
#: resumed steps into a new metrics.jsonl; merged back when the run ends (and by the next resume, if it never did).
METRICS_BEFORE_RESUME = "metrics.before-resume.jsonl"
#: What a run writes into its output folder (besides ``train.log`` and its ``train.log.ray-startup-N`` siblings).
RUN_FILES = ("metrics.jsonl", METRICS_BEFORE_RESUME, "checkpoints", "hydra", "learning_curve.png", "demo_run.json")
#: verl's record of the last complete checkpoint, in ``trainer.default_local_dir``
CHECKPOINT_TRACKER = "latest_checkpointed_iteration.txt"


def run_files(out: Path) -> list[Path]:
    """The files of a run in the folder ``out`` (none when it holds no run)."""
    if not Path(out).is_dir():
        return []
    return sorted(
        p for p in Path(out).iterdir() if p.name in RUN_FILES or p.name.split(".ray-startup")[0] == "train.log"
    )


def set_aside_previous_run(out: Path, keep: tuple[str, ...] = ()) -> Path | None:
    """Move the files of the run in ``out`` (:func:`run_files`, but those named in ``keep``) into a new sibling
    folder ``<out>.old-N`` and return it (None when ``out`` holds no run): a fresh run never mixes with another's
    metrics, trace or checkpoints. Files that are not a run's stay where they are."""
    found = [p for p in run_files(out) if p.name not in keep]
    if not found:
        return None
    n = 1
    while (aside := out.with_name(f"{out.name}.old-{n}")).exists():
        n += 1
    aside.mkdir(parents=True)
    for path in found:
        os.replace(path, aside / path.name)
    return aside


def latest_checkpoint(out: Path) -> int | None:
    """The step of the last complete checkpoint of the run in ``out`` (verl's tracker file), None when none."""
    tracker = Path(out) / "checkpoints" / CHECKPOINT_TRACKER
    try:
        return int(tracker.read_text().strip())
    except (OSError, ValueError):
        return None


def resume_step(run: ExGRPOCpuRun) -> int | None:
    """The step a run resumes from: the last checkpoint in its folder (``resume_mode`` auto), the step of
    ``resume_from_path`` (resume_path); None for a fresh run or when there is nothing to resume."""
    if run.resume_mode == "auto":
        return latest_checkpoint(run.output_dir)
    if run.resume_mode == "resume_path" and run.resume_from_path:
        name = Path(run.resume_from_path).name
        return int(name.rsplit("_", 1)[1]) if name.startswith("global_step_") and name[12:].isdigit() else None
    return None


def _records(path: Path) -> list[dict]:
    """The records of a metrics file as verl's file logger writes them (``{"step": n, "data": {...}}``); torn lines
    skipped."""
    import json

    out = []
    if not path.exists():
        return out
    for line in path.read_text(errors="replace").splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(record, dict) and isinstance(record.get("step"), int):
            out.append(record)
    return out


def _write_records(path: Path, records: list[dict]) -> None:
    import json

    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text("".join(json.dumps(r) + "\n" for r in records))
    os.replace(tmp, path)


def merge_by_step(*sources: list[dict]) -> list[dict]:
    """One record per step, in step order: the records of ``sources`` merged key by key (a later source's value of
    a key wins; verl logs a resumed run's validation at the step it resumes from, next to that step's own row)."""
    merged: dict[int, dict] = {}
    for records in sources:
        for record in records:
            merged.setdefault(record["step"], {}).update(record.get("data", {}))
    return [{"step": step, "data": data} for step, data in sorted(merged.items())]


def keep_history(out: Path, resumed_from: int) -> dict[str, list[int]]:
    """Before a resume from step ``resumed_from``: the metrics of the steps up to it (from ``metrics.jsonl`` and what
    an interrupted resume left in :data:`METRICS_BEFORE_RESUME`) go to :data:`METRICS_BEFORE_RESUME`; those of later
    steps, logged after that checkpoint, are dropped (the resumed run does them again). Returns the steps kept and
    dropped."""
    out = Path(out)
    side, current = out / METRICS_BEFORE_RESUME, out / "metrics.jsonl"
    rows = merge_by_step(_records(side), _records(current))
    kept = [r for r in rows if r["step"] <= resumed_from]
    _write_records(side, kept)
    current.unlink(missing_ok=True)
    return {"kept": [r["step"] for r in kept], "dropped": [r["step"] for r in rows if r["step"] > resumed_from]}


def merge_metrics(out: Path) -> None:
    """After a resumed run: ``metrics.jsonl`` = the kept history merged by step with the resumed steps' metrics."""
    out = Path(out)
    side, current = out / METRICS_BEFORE_RESUME, out / "metrics.jsonl"
    if not side.exists():
        return
    _write_records(current, merge_by_step(_records(side), _records(current)))
    side.unlink()


def _follow_text(path: Path, stop: threading.Event, start: int = 0) -> None:
    """Print the run's log as it grows (from byte ``start``)."""
    with open(path, errors="replace") as f:
        f.seek(start)
        while True:
            line = f.readline()
            if line:
                sys.stdout.write(line)
                sys.stdout.flush()
            elif stop.is_set():
                break
            else:
                time.sleep(0.2)


def _follow_metrics(path: Path, stop: threading.Event, on_step: Callable[[dict], None]) -> None:
    """Call ``on_step`` with each metrics row verl's file logger appends (it writes unbuffered, one line per step)."""
    from recipe.exgrpo.harness.learning_curves import parse_metrics_line

    while not path.exists():
        if stop.wait(0.2) and not path.exists():  # (a run may end before this thread saw its file)
            return
    with open(path, errors="replace") as f:
        pending = ""
        while True:
            chunk = f.readline()
            if chunk:
                pending += chunk
                if not pending.endswith("\n"):
                    continue
                data, pending = parse_metrics_line(pending), ""
                if data is None:
                    continue
                try:
                    on_step(data)
                except Exception as exc:  # a display problem must never stop the run
                    sys.stderr.write(f"[demo] could not print step {data.get('step')}: {exc}\n")
            elif stop.is_set():
                break
            else:
                time.sleep(0.2)


def finished_run(run: ExGRPOCpuRun, **recorded: Any) -> bool:
    """Whether ``run.output_dir`` holds a finished run that :func:`launch_or_reuse` would reuse (its ``done.json``
    records ``recorded``)."""
    import json

    done = Path(run.output_dir) / "done.json"
    if not done.exists():
        return False
    info = json.loads(done.read_text())
    return all(info.get(key) == value for key, value in recorded.items())


def launch_or_reuse(run: ExGRPOCpuRun, assets, label: str, fresh: bool = False, **recorded: Any) -> dict:
    """One seeded run of a benchmark: reuse the finished run in ``run.output_dir`` (its ``done.json``, written when
    a run ends, records the wall time and ``recorded``; a record that differs, e.g. another number of steps, is run
    again), else launch it in a private Ray temp dir removed afterwards. Returns ``{"rows", "wall_seconds"}``; a run
    that fails or hits its wall limit stops the benchmark (``SystemExit`` naming ``label`` and the log)."""
    import json
    import shutil
    import tempfile

    from recipe.exgrpo.harness.learning_curves import read_metrics_file

    out = Path(run.output_dir)
    done = out / "done.json"
    if not fresh and finished_run(run, **recorded):
        print(f"[{label}] reusing the finished run in {out}", flush=True)
        return {
            "rows": read_metrics_file(out / "metrics.jsonl"),
            "wall_seconds": json.loads(done.read_text())["wall_seconds"],
        }
    done.unlink(missing_ok=True)
    print(f"[{label}] running ({out / 'train.log'}) ...", flush=True)
    own_tmp = run.ray_temp_dir is None
    if own_tmp:  # short, private: Ray's socket paths must stay under ~107 characters
        run.ray_temp_dir = tempfile.mkdtemp(prefix="exgbr-", dir="/tmp")
    try:
        result = launch(run, assets, echo=False)
    finally:
        if own_tmp:
            shutil.rmtree(run.ray_temp_dir, ignore_errors=True)
            run.ray_temp_dir = None
    if result.timed_out or result.returncode != 0:
        print(result.log_tail(), file=sys.stderr)
        raise SystemExit(f"{label} failed (exit {result.returncode}); log: {result.log_path}")
    done.write_text(json.dumps({"wall_seconds": result.wall_seconds, "finished": time.time(), **recorded}) + "\n")
    print(f"[{label}] {result.wall_seconds:.0f} s", flush=True)
    return {"rows": read_metrics_file(out / "metrics.jsonl"), "wall_seconds": result.wall_seconds}


def read_metrics(output_dir: str | Path) -> list[dict]:
    """The per-step metric dicts verl's file logger wrote (one JSON line per step)."""
    from recipe.exgrpo.harness.learning_curves import read_metrics_file

    return read_metrics_file(Path(output_dir) / "metrics.jsonl")


def step_line(row: dict, total_steps: int) -> str | None:
    """The few figures a person watches, for one metrics row (None for rows without them)."""
    from recipe.exgrpo.harness.learning_curves import level_name, ordered_levels, validation_by_source

    parts = []
    step = int(row.get("step") or 0)
    val = validation_by_source(row)
    if "exgrpo/batch_pass_rate" in row:
        questions = row.get("exgrpo/fresh_questions", 0) + row.get("exgrpo/replayed_questions", 0)
        pass_rate = row.get("exgrpo/sampled_pass_rate", row["exgrpo/batch_pass_rate"])
        # the continuous mode shows the mean reward of the sampled responses instead
        shown = (
            f"reward {row['exgrpo/reward/mean']:.3f}" if "exgrpo/reward/mean" in row else f"pass rate {pass_rate:.3f}"
        )
        entries, pool_q = int(row.get("exgrpo/pool/entries", 0)), int(row.get("exgrpo/pool/questions", 0))
        tools = (
            f"  tool calls {row['exgrpo/multi_turn/tool_turn_share']:.2f}"
            if "exgrpo/multi_turn/tool_turn_share" in row
            else ""
        )
        parts.append(
            f"step {step:>3}/{total_steps}  {shown}{tools}  pool {entries:>4} traj / {pool_q:>3} q"
            f"  retired {int(row.get('exgrpo/pool/retired', 0)):>3}"
            f"  replayed {int(row.get('exgrpo/replayed_questions', 0)):>2}/{int(questions)}"
            f"  {row.get('timing_s/step', float('nan')):.1f} s"
        )
    if val:
        named = {level_name(s): v for s, v in val.items()}
        by_level = {lv: named[lv] for lv in ordered_levels(named)}
        mean = sum(by_level.values()) / len(by_level)
        levels = "  ".join(f"{lv} {v:.3f}" for lv, v in by_level.items())
        prefix = "" if parts else f"step {step:>3}/{total_steps}  "
        parts.append(f"{prefix}validation accuracy {mean:.3f}  ({levels})")
        calls = {level_name(s): v for s, v in validation_by_source(row, "tool_call").items()}
        if calls:
            rates = "  ".join(f"{lv} {calls[lv]:.3f}" for lv in ordered_levels(calls))
            parts.append(f"{' ' * len(prefix)}validation tool calls {sum(calls.values()) / len(calls):.3f}  ({rates})")
    return "\n".join(parts) if parts else None


#: Paths the override check composes the demo's config with (the dry run lists them as not checked; the assets
#: are built only after the check).
_PLACEHOLDERS = ("/dry-run-placeholder/MODEL_PATH", "/dry-run-placeholder/TRAIN_FILE", "/dry-run-placeholder/VAL_FILE")


def override_problems(run: ExGRPOCpuRun) -> list[str]:
    """The problems the launch scripts' dry run (``python -m recipe.exgrpo.dry_run``, in a subprocess with the CPU
    run's environment) finds in the demo's config with its extra overrides: a mistyped key with its did-you-mean, a
    value out of range. Empty when it validates. About 15 s (verl is imported), so only run for extra overrides."""
    from recipe.exgrpo.harness.procs import run_captured  # its own session: a stopped demo stops the check too

    overrides = build_overrides(run, *_PLACEHOLDERS)
    env = {**os.environ, **cpu_env(output_dir=run.output_dir, wall_limit_s=run.wall_limit_s)}
    proc = run_captured(
        [run.python or sys.executable, "-m", "recipe.exgrpo.dry_run", "--quiet", "--", *overrides],
        timeout_s=600,
        env=env,
        cwd=str(REPO_ROOT),
    )
    if proc.returncode == 0:
        return []
    lines = proc.stderr.splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith("[dry-run] FAILED")), None)
    if start is None:
        return [f"the config check failed (exit status {proc.returncode}): " + " ".join(lines[-3:])]
    return [line[4:] for line in lines[start + 1 :] if line.startswith("  - ")] or [lines[start]]


def run_description(run: ExGRPOCpuRun, test_freq: int) -> str:
    """The demo's line about the run it starts: steps, batch, learning rate, validation (or none)."""
    validation = (
        f"validation every {test_freq} steps (sampled at T = {run.val_temperature:g})"
        if test_freq > 0
        else "no validation (--test-freq 0)"
    )
    return f"{run.steps} steps of {run.train_batch_size} questions x K = {run.rollout_n}, lr {run.lr:g}, {validation}"


# ---------------------------------------------------------------------------------------------- the command
def _int_at_least(low: int, meaning: str = "") -> Callable[[str], int]:
    """An argparse type: an integer >= ``low`` (argparse names the option in its error)."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"an integer is needed, got {text!r}") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"must be >= {low}{meaning}, got {value}")
        return value

    return parse


def _save_freq(text: str) -> int:
    value = _int_at_least(-1)(text)
    if value == 0:
        raise argparse.ArgumentTypeError("must be -1 (no checkpoints) or >= 1 (every N steps), got 0")
    return value


def _positive_seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"a number of seconds is needed, got {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be > 0 seconds, got {text}")
    return value


def build_parser() -> argparse.ArgumentParser:
    defaults = demo_run(".")
    parser = argparse.ArgumentParser(prog="python -m recipe.exgrpo.cpu_demo", description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--steps", type=_int_at_least(1), default=defaults.steps, help=f"training steps (default {defaults.steps})"
    )
    parser.add_argument(
        "--seed",
        type=int,
        default=defaults.seed,
        help=f"seed of data order, sampling and replay (default {defaults.seed})",
    )
    parser.add_argument(
        "--out",
        help="output folder (default: outputs/cpu_demo, outputs/cpu_demo_vllm for vllm; _v1 with --trainer v1, _lora "
        "with --lora); one run per folder: an earlier run in it is moved to <out>.old-N, unless --resume",
    )
    parser.add_argument(
        "--resume",
        action="store_true",
        help="continue the run in --out from its last checkpoint (it must have saved one: --save-freq), keeping its "
        "metrics; give the flags it was started with (--steps may be larger)",
    )
    parser.add_argument("--onpolicy", action="store_true", help="plain on-policy GRPO (exgrpo.enable=false)")
    parser.add_argument(
        "--reward",
        choices=sorted(TOY_REWARDS),
        default=DEFAULT_REWARD_MODE,
        help="the reward mode (exgrpo.reward_mode) and its toy reward: "
        + "; ".join(f"{mode}: {label}" for mode, (_, label) in TOY_REWARDS.items()),
    )
    parser.add_argument(
        "--rollout",
        choices=CPU_ROLLOUTS,
        default=CPU_ROLLOUTS[0],
        help="hf: the Hugging Face CPU stand-in; vllm: verl's vLLM rollout on the vLLM CPU stack "
        "(bash scripts/demo_cpu.sh --rollout vllm sets it up)",
    )
    parser.add_argument(
        "--tools",
        action="store_true",
        help="the calculator task: verl's tool agent loop with a calculator function tool, on a model whose warm-up "
        "taught it the call (docs/tools.md); prints and draws the tool-call rate per level",
    )
    parser.add_argument(
        "--test-freq",
        type=_int_at_least(0, " (0: no validation)"),
        default=10,
        help="validate every N steps and before training (default 10; 0: off)",
    )
    parser.add_argument(
        "--wall-limit", type=_positive_seconds, default=1500.0, help="hard wall-clock limit in seconds (default 1500)"
    )
    parser.add_argument(
        "--save-freq",
        type=_save_freq,
        default=-1,
        help="checkpoint (verl's state and the pool) every N steps (default -1: off)",
    )
    parser.add_argument(
        "--trainer",
        choices=("legacy", "v1"),
        default="legacy",
        help="verl's trainer: legacy (RayPPOTrainer, the default) or v1 (its v1 trainer, sync mode: "
        "trainer.use_v1=true; docs/trainer.md)",
    )
    parser.add_argument(
        "--lora",
        action="store_true",
        help=f"train a LoRA adapter instead of every weight (rank {LORA_DEMO_SETTINGS['lora_rank']}, alpha "
        f"{LORA_DEMO_SETTINGS['lora_alpha']}, lr {LORA_DEMO_SETTINGS['lr']:g}; the hf rollout gets the merged "
        "weights, vllm the adapter; docs/learning.md)",
    )
    parser.add_argument("--verbose", action="store_true", help="print verl's full log instead of one line per step")
    parser.add_argument(
        "overrides",
        nargs="*",
        help="extra hydra overrides, e.g. exgrpo.replay_ratio=0.25 (checked first by the launch scripts' dry run); "
        "one of a setting the demo shows (steps, batch, K, lr, validation, tau, rho) is shown as given",
    )
    return parser


#: Overrides of the settings the demo sets and shows itself, and the field of :class:`ExGRPOCpuRun` that holds each:
#: an extra override of one becomes the run's value (:func:`take_run_overrides`), so that the header, the step lines,
#: the summary and the curve show what the trainer runs.
RUN_FIELDS: dict[str, tuple[str, type]] = {
    "trainer.total_training_steps": ("steps", int),
    "data.train_batch_size": ("train_batch_size", int),
    "actor_rollout_ref.rollout.n": ("rollout_n", int),
    "actor_rollout_ref.actor.ppo_mini_batch_size": ("ppo_mini_batch_size", int),
    "actor_rollout_ref.actor.optim.lr": ("lr", float),
    "data.max_prompt_length": ("max_prompt_length", int),
    "data.max_response_length": ("max_response_length", int),
    "trainer.test_freq": ("test_freq", int),
    "trainer.save_freq": ("save_freq", int),
    "trainer.val_before_train": ("val_before_train", bool),
    "actor_rollout_ref.rollout.val_kwargs.temperature": ("val_temperature", float),
    "actor_rollout_ref.rollout.val_kwargs.n": ("val_n", int),
    "exgrpo.enable": ("exgrpo_enable", bool),
    "exgrpo.replay_ratio": ("replay_ratio", float),
    "exgrpo.delayed_start_threshold": ("delayed_start_threshold", float),
    "actor_rollout_ref.model.lora_rank": ("lora_rank", int),
    "actor_rollout_ref.model.lora_alpha": ("lora_alpha", int),
    "actor_rollout_ref.model.lora.merge": ("lora_merge", bool),
}


def _typed(text: str, kind: type) -> Any:
    """``text`` as hydra would read it, when it is a plain value of ``kind`` (else None: left to hydra)."""
    import yaml

    try:
        value = yaml.safe_load(text)
    except yaml.YAMLError:
        return None
    if kind is bool:
        return value if isinstance(value, bool) else None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    if kind is int:
        return value if isinstance(value, int) else None
    return float(value)


def take_run_overrides(run: ExGRPOCpuRun) -> list[str]:
    """Move the extra overrides of :data:`RUN_FIELDS` into ``run``'s fields (the last one of a key wins, as in
    hydra); returns the keys taken. A value hydra must read itself (an interpolation, a list) stays an override, and
    so does a key the run's reward mode does not read (the trainer names the mode that does)."""
    mode_keys = get_reward_mode(run.reward_mode).options
    rest, taken = [], []
    for override in run.extra_overrides:
        key, sep, text = override.partition("=")
        field_kind = RUN_FIELDS.get(key) if sep else None
        if field_kind and key.startswith("exgrpo.") and key == "exgrpo.delayed_start_threshold":
            field_kind = field_kind if "delayed_start_threshold" in mode_keys else None
        value = _typed(text, field_kind[1]) if field_kind else None
        if value is None:
            rest.append(override)
            continue
        setattr(run, field_kind[0], value)
        taken.append(key)
    run.extra_overrides = rest
    return taken


def run_problems(run: ExGRPOCpuRun) -> list[str]:
    """What makes the run pointless, with the flag or key to change (an override may have set it)."""
    problems = []
    if run.steps < 1:
        problems.append(f"{run.steps} training steps (--steps or trainer.total_training_steps): at least 1")
    if run.test_freq < 0:
        problems.append(f"validation every {run.test_freq} steps (--test-freq or trainer.test_freq): >= 0 (0: off)")
    return problems


# ------------------------------------------------------------------------------------------- the delayed start
def exgrpo_settings(run: ExGRPOCpuRun) -> dict[str, Any]:
    """The ``exgrpo.*`` values the trainer gets (the demo's and the extra overrides', the last one winning)."""
    import yaml

    out: dict[str, Any] = {}
    for override in build_overrides(run, *_PLACEHOLDERS):
        key, sep, text = override.lstrip("+").partition("=")
        if sep and key.startswith("exgrpo.") and key.count(".") == 1:
            try:
                out[key.split(".", 1)[1]] = yaml.safe_load(text)
            except yaml.YAMLError:
                continue
    return out


def replay_schedule(run: ExGRPOCpuRun):
    """The run's delayed start and replay ratio (``exgrpo.schedule.ExperienceSchedule``, from its ``exgrpo.*``
    settings); None for on-policy GRPO or settings the trainer will refuse anyway."""
    from exgrpo.config import ExGRPOConfig
    from exgrpo.schedule import ExperienceSchedule

    try:
        cfg = ExGRPOConfig.from_dict(exgrpo_settings(run), k=run.rollout_n)
    except Exception:  # the override check, or the trainer, names the problem
        return None
    return ExperienceSchedule.from_config(cfg) if cfg.enable else None


_SIGNAL_WORDS = {
    "pass_rate": ("batch pass rate", "exgrpo.delayed_start_threshold"),
    "mean_reward": ("batch mean reward", "exgrpo.continuous_start_reward"),
}


def delayed_start_line(schedule, warm_pass_rate: float | None = None) -> str:
    """The delayed start at start-up: when replay starts and why (the warmed-up model's pass rate beside tau)."""
    share = f"replay then fills {schedule.target_ratio:g} of each batch (exgrpo.replay_ratio)"
    if schedule.mixed:
        return f"no delayed start: replay from step 2 (step 1 fills the pool); {share}"
    if schedule.signal == "steps":
        return f"delayed start: replay after step {schedule.start_steps} (exgrpo.continuous_start_steps); {share}"
    what, key = _SIGNAL_WORDS[schedule.signal]
    line = f"delayed start: no replay until a step's {what} is above {schedule.threshold:g} ({key}); {share}"
    if schedule.signal == "pass_rate" and warm_pass_rate is not None:
        where = "above it" if warm_pass_rate > schedule.threshold else "below it: replay waits until training lifts it"
        line += f". The warmed-up model passes {warm_pass_rate:.2f}, {where}"
    return line


class StepPrinter:
    """The demo's console line for each metrics row, and a line at the step replay starts (the delayed start)."""

    def __init__(self, total_steps: int, schedule=None, write: Callable[[str], None] = print) -> None:
        self.total_steps, self.schedule, self.write = total_steps, schedule, write
        self.previous: dict | None = None

    def switch_line(self, row: dict) -> str | None:
        if "exgrpo/mixed" not in row or self.schedule is None:
            return None
        previous, self.previous = self.previous, row
        if previous is None or previous.get("exgrpo/mixed", 1.0) >= 0.5 or row["exgrpo/mixed"] < 0.5:
            return None
        step, before = int(row.get("step") or 0), int(previous.get("step") or 0)
        why = "the delayed start passed"
        if self.schedule.signal in _SIGNAL_WORDS and "exgrpo/batch_pass_rate" in previous:
            what = _SIGNAL_WORDS[self.schedule.signal][0]
            value = previous.get(
                "exgrpo/reward/mean" if self.schedule.signal == "mean_reward" else "exgrpo/batch_pass_rate"
            )
            if value is not None:
                why = f"step {before}'s {what} {value:.3f} > {self.schedule.threshold:g}"
        return f"step {step}: replay starts ({why})"

    def __call__(self, row: dict) -> None:
        lines = [x for x in (self.switch_line(row), step_line(row, self.total_steps)) if x]
        if lines:
            self.write("[demo] " + "\n".join(lines).replace("\n", "\n[demo] "))


def replay_summary(rows: list[dict], schedule) -> str:
    """The summary's line on replay: from which step, or why never (the delayed start's threshold)."""
    steps = sorted((r for r in rows if "exgrpo/batch_pass_rate" in r), key=lambda r: int(r.get("step") or 0))
    if not steps or schedule is None:
        return ""
    replayed = [r for r in steps if r.get("exgrpo/replayed_questions", 0) > 0]
    mixed = [int(r["step"]) for r in steps if r.get("exgrpo/mixed", 0) >= 0.5]
    first, last = int(steps[0]["step"]), int(steps[-1]["step"])
    if mixed:
        text = f"replay: on from step {mixed[0]} to {last}, questions replayed at {len(replayed)} of {len(steps)} steps"
        if mixed[0] > first and schedule.signal in _SIGNAL_WORDS:
            what, key = _SIGNAL_WORDS[schedule.signal]
            text += f" (the delayed start waited for a {what} above {schedule.threshold:g}, {key})"
        return text
    if schedule.signal == "pass_rate":
        best = max(steps, key=lambda r: r["exgrpo/batch_pass_rate"])
        return (
            f"replay: none: no step's batch pass rate passed tau = {schedule.threshold:g} (the highest "
            f"{best['exgrpo/batch_pass_rate']:.3f}, step {best['step']}); a lower exgrpo.delayed_start_threshold "
            "starts it sooner (a negative one from step 2)"
        )
    return "replay: none: the delayed start did not pass in these steps"


# ------------------------------------------------------------------------------------------ one run per folder
#: the demo's record of how a run in its folder was started (``--resume`` compares it)
RUN_RECORD = "demo_run.json"
#: the flags a resume must repeat (``--steps`` may grow, the rest may change freely)
RESUME_SAME = ("seed", "onpolicy", "reward", "rollout", "tools", "lora", "overrides")


def resume_problems(out: Path, args: argparse.Namespace) -> list[str]:
    """Why ``--resume`` cannot continue the run in ``out`` (empty: it can)."""
    import json

    if latest_checkpoint(out) is None:
        if not run_files(out):
            return [f"--resume: {out} holds no run to continue"]
        return [
            f"--resume: the run in {out} saved no checkpoint to continue from (--save-freq N saves one every N steps)"
        ]
    try:
        started = json.loads((out / RUN_RECORD).read_text())
    except (OSError, ValueError):
        return []  # a run started before the record existed: nothing to compare
    now = _run_record(args)
    differ = [k for k in RESUME_SAME if k in started and started[k] != now[k]]
    return [
        f"--resume: the run in {out} was started with {_flag(k, started[k])}, this command gives {_flag(k, now[k])}"
        for k in differ
    ]


def _run_record(args: argparse.Namespace) -> dict[str, Any]:
    return {k: (list(v) if isinstance(v, list) else v) for k, v in vars(args).items() if k in (*RESUME_SAME, "steps")}


def _flag(key: str, value: Any) -> str:
    if key == "overrides":
        return "the overrides " + (" ".join(value) if value else "(none)")
    if isinstance(value, bool):
        return f"--{key}" if value else f"no --{key}"
    return f"--{key} {value}"


def describe_checkpoint(out: Path, step: int) -> str:
    """What a resume from the checkpoint of ``step`` in ``out`` restores (its pool's figures read from the pool)."""
    restored = "the model, its optimizer, the data order"
    pool = Path(out) / "checkpoints" / f"global_step_{step}" / "exgrpo" / "pool"
    try:
        from exgrpo.experience.persistence import open_experience
        from exgrpo.pool.summary import across_row

        saved = open_experience(pool)
        row = across_row(step, saved)
        schedule = saved.header.get("schedule") or {}
        if schedule.get("mixed"):
            replay = f"replay on since step {schedule.get('switch_step', 0) + 1}"
        else:
            replay = "the delayed start still waiting"
        restored += (
            f" and the experience pool ({row['trajectories']} trajectories of {row['questions']} questions, "
            f"{row['retired']} retired; {replay})"
        )
    except Exception:  # on-policy GRPO saves no pool; a damaged one is the trainer's to name
        pass
    return f"the checkpoint of step {step} ({Path(out) / 'checkpoints' / f'global_step_{step}'}): {restored}"


def main(argv: list[str] | None = None) -> int:
    """The demo's command. SIGTERM, SIGHUP or Ctrl-C stop the training (the trainer's driver first, which stops its
    Ray cluster, then whatever is left of its session) with one line and exit status 128 + the signal's number."""
    from recipe.exgrpo.harness.procs import main_until_stopped

    return main_until_stopped(lambda: _demo(argv), label="demo")


def _demo(argv: list[str] | None) -> int:
    import json

    parser = build_parser()
    args = parser.parse_args(argv)
    if args.tools and args.reward != DEFAULT_REWARD_MODE:
        parser.error(
            f"--tools runs the {DEFAULT_REWARD_MODE} reward (the calculator task's); drop --reward {args.reward}"
        )
    name = "cpu_demo" + ("_tools" if args.tools else "") + ("" if args.rollout == "hf" else f"_{args.rollout}")
    name += "" if args.trainer == "legacy" else f"_{args.trainer}"
    name += "_lora" if args.lora else ""
    out = Path(args.out or REPO_ROOT / "outputs" / name)
    from recipe.exgrpo.harness.assets import asset_spec, ensure_assets
    from recipe.exgrpo.harness.learning_curves import describe_run, plot_run, run_curve

    if args.rollout == "vllm":
        from recipe.exgrpo.cpu.vllm_stack import stack_problems

        problems = stack_problems()
        if problems:
            print("[demo] --rollout vllm: " + "; ".join(problems), file=sys.stderr)
            return 2
    run = demo_run(
        out,
        steps=args.steps,
        seed=args.seed,
        wall_limit_s=args.wall_limit,
        test_freq=args.test_freq,
        save_freq=args.save_freq,
        reward_mode=args.reward,
        rollout=args.rollout,
        exgrpo_enable=not args.onpolicy,
        trainer=args.trainer,
        extra_overrides=list(args.overrides),
        resume_mode="auto" if args.resume else "disable",
        **(LORA_DEMO_SETTINGS if args.lora else {}),
    )
    if args.tools:
        tool_run(run)
    take_run_overrides(run)
    run.val_before_train = run.val_before_train and run.test_freq > 0
    problems = run_problems(run) + (resume_problems(out, args) if args.resume else [])
    if problems:
        for p in problems:
            print(f"[demo] {p}", file=sys.stderr)
        return 2
    if args.overrides:  # a typo must not wait for the assets and Ray, nor reach the trainer's hydra message
        print(f"[demo] checking the {len(args.overrides)} extra override(s) (the launch scripts' dry run) ...")
        problems = override_problems(run)
        if problems:
            print("[demo] the extra overrides do not validate:", file=sys.stderr)
            for p in problems:
                print(f"[demo]   - {p}", file=sys.stderr)
            return 2
    t0 = time.time()
    print("[demo] tiny model and toy data: building them if needed (once; cached under .cache/exgrpo-assets) ...")
    assets = ensure_assets(asset_spec(args.rollout, tools=args.tools))
    report = assets.report
    spread = "  ".join(f"{lv} {r['pass_rate']:.2f}" for lv, r in report.get("per_level", {}).items())
    print(f"[demo] assets ready in {time.time() - t0:.0f} s: {assets.root}")
    print(f"[demo] warmed-up model: pass rate at temperature 1 on the validation questions: {spread}")
    if args.tools:
        calls = "  ".join(f"{lv} {r['call_rate']:.2f}" for lv, r in report.get("per_level", {}).items())
        print(f"[demo] warmed-up model: share of answers that call the calculator: {calls}")
    if (
        args.rollout == "vllm"
        and "delayed_start_threshold" in get_reward_mode(args.reward).options
        and not any(o.startswith("exgrpo.delayed_start_threshold=") for o in args.overrides)
    ):
        # the vLLM model (head size 32) leaves its warm-up below the demo's τ: replay from step 2 shows the whole
        # ExGRPO step on vLLM in a short run
        run.delayed_start_threshold = VLLM_DEMO_DELAYED_START
        print(
            f"[demo] vllm: no delayed start (exgrpo.delayed_start_threshold={VLLM_DEMO_DELAYED_START:g}, replay from "
            f"step 2); exgrpo.delayed_start_threshold={DEMO_SETTINGS['delayed_start_threshold']} restores the demo's"
        )
    arm = (
        ("ExGRPO" if run.exgrpo_enable else "on-policy GRPO")
        + (", calculator tool" if args.tools else "")
        + (f", {TOY_REWARDS[args.reward][1]}" if TOY_REWARDS[args.reward][0] else "")
        + (" on vLLM" if run.rollout == "vllm" else "")
        + (f", verl's {run.trainer} trainer" if run.trainer != "legacy" else "")
        + (
            f", LoRA rank {run.lora_rank} (alpha {run.lora_alpha}; the rollout gets "
            + ("the merged weights)" if lora_merge(run) else "the adapter)")
            if run.lora_rank > 0
            else ""
        )
    )
    print(f"[demo] {arm}: {run_description(run, run.test_freq)}")
    schedule = replay_schedule(run)
    if schedule is not None:
        print(f"[demo] {delayed_start_line(schedule, report.get('pass_rate'))}")
    if args.resume:
        resumed_from = latest_checkpoint(out)
        assert resumed_from is not None  # resume_problems said so otherwise
        print(f"[demo] resuming from {describe_checkpoint(out, resumed_from)}")
        history = keep_history(out, resumed_from)
        if history["kept"]:
            kept = history["kept"]
            print(f"[demo] its metrics of steps {kept[0]}-{kept[-1]} are kept; the resumed steps are added to them")
        if history["dropped"]:
            print(
                f"[demo] steps {history['dropped'][0]}-{history['dropped'][-1]} ran after that checkpoint: they run "
                "again (their earlier metrics dropped)"
            )
    else:
        aside = set_aside_previous_run(out)
        if aside is not None:
            print(f"[demo] {out} held an earlier run: moved to {aside} (--resume continues a run instead)")
        out.mkdir(parents=True, exist_ok=True)
        (out / RUN_RECORD).write_text(json.dumps(_run_record(args), indent=2) + "\n")
    print(f"[demo] starting Ray and verl's workers (about a minute); full log: {out / 'train.log'}", flush=True)

    result = launch(run, assets, echo=args.verbose, on_step=None if args.verbose else StepPrinter(run.steps, schedule))
    rows = read_metrics(out)
    curve = run_curve(
        rows,
        label=f"{arm}, seed {run.seed}",
        wall_seconds=result.wall_seconds,
        group_size=run.rollout_n,
        reward_mode=run.reward_mode,
    )
    print("\n" + "=" * 100)
    print(describe_run(curve) or "no training steps were logged")
    replay = replay_summary(rows, schedule)
    if replay:
        print(replay)
    part = " (the resumed part)" if args.resume else ""
    print(
        f"\nwall time{part} {result.wall_seconds:.0f} s, CPU {result.cpu_seconds:.0f} s, "
        f"peak RSS {result.peak_rss_bytes / 2**30:.2f} GiB, "
        f"log: {result.log_path}, metrics: {out / 'metrics.jsonl'}"
    )
    if curve.steps:
        png = plot_run(curve, out / "learning_curve.png", title=f"{arm} on the toy arithmetic task (CPU demo)")
        print(f"learning curve: {png}")
    if result.timed_out:
        print(f"[demo] the run hit its wall-clock limit ({args.wall_limit:.0f} s)", file=sys.stderr)
        return 124
    if result.returncode:
        print(f"[demo] the trainer failed (exit status {result.returncode}); the end of its log:", file=sys.stderr)
        print(result.log_tail(4000), file=sys.stderr)
    return int(result.returncode or 0)


if __name__ == "__main__":
    sys.exit(main())
