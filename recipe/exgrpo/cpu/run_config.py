"""Everything a CPU run of verl's trainer needs besides the plugin: hydra overrides, environment, checks, limits.

- ``cpu_overrides(spec)``: the hydra override list for a tiny CPU GRPO run of ``verl.trainer.main_ppo`` (and of
  the ExGRPO entry point, which extends verl's ``ppo_trainer`` config).
- ``cpu_env(...)``: the environment variables every process of the run needs (platform, plugin module, thread
  count, wall-clock limit, ...). Use ``{**os.environ, **cpu_env(...)}`` for a subprocess.
- ``validate_cpu_run_config(cfg)``: fail-fast check of a composed config; every problem names the key and the
  fix (GPU-only rollout or attention, FSDP1, Ray resources that would make placement groups wait forever).
- ``CpuConfigCheck``: a hydra callback (added by ``cpu_overrides``) that runs the check in the driver before
  Ray starts and arms the wall-clock watchdog (``EXGRPO_CPU_WALL_LIMIT_S``).

This module imports neither verl nor ray at import time.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from recipe.exgrpo import verl_compat
from recipe.exgrpo.cpu import CPU_ROLLOUTS

REPO_ROOT = Path(__file__).resolve().parents[3]
PLUGIN_MODULE = "recipe.exgrpo.cpu.plugin"
WALL_LIMIT_ENV = "EXGRPO_CPU_WALL_LIMIT_S"
# Ray's system setting (read from the environment by the raylet) for starting idle workers with the first driver
PRESTART_ENV = "RAY_prestart_worker_first_driver"
DEFAULT_WALL_LIMIT_S = 1800
CALLBACK_TARGET = "recipe.exgrpo.cpu.run_config.CpuConfigCheck"
# verl's ResourcePoolManager asks for this many logical CPUs per (logical) GPU bundle.
CPUS_PER_DEVICE_BUNDLE = 3
CPU_ATTENTION = ("sdpa", "eager")


class CpuBackendConfigError(ValueError):
    """The composed config cannot run on the CPU backend; the message lists each bad key and its fix."""


@dataclass
class CpuRunSpec:
    """Settings of a tiny CPU run; ``cpu_overrides`` turns them into hydra overrides.

    Batch sizes count prompts (verl's convention): each step generates ``train_batch_size * rollout_n``
    responses. ``extra_overrides`` are appended last, so they win.
    """

    model_path: str
    train_files: str
    val_files: str
    output_dir: str
    reward_fn_path: str | None = None
    reward_fn_name: str = "compute_score"
    total_training_steps: int = 3
    train_batch_size: int = 4
    rollout_n: int = 4
    ppo_mini_batch_size: int | None = None
    micro_batch_size_per_device: int = 16
    max_prompt_length: int = 64
    max_response_length: int = 24
    lr: float = 1e-4
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int = 0
    n_devices: int = 1
    agent_workers: int = 1
    reward_workers: int = 1
    ray_num_cpus: int | None = None
    ray_temp_dir: str | None = None
    project_name: str = "exgrpo_cpu"
    experiment_name: str = "tiny_grpo_cpu"
    loggers: tuple[str, ...] = ("console", "file")
    use_v1: bool = False
    val_before_train: bool = False
    test_freq: int = -1
    save_freq: int = -1
    resume_mode: str = "disable"
    adv_estimator: str = "grpo"
    config_check: bool = True
    # "hf" (the Hugging Face stand-in, in the plain CPU venv) or "vllm" (verl's vLLM rollout: needs the vLLM CPU
    # stack, scripts/setup_env.sh --vllm, and a model whose head size vLLM's CPU attention takes)
    rollout: str = "hf"
    extra_overrides: list[str] = field(default_factory=list)


def required_ray_cpus(n_devices: int, agent_workers: int, reward_workers: int, use_v1: bool = False) -> int:
    """Logical CPUs the run's actors reserve: device bundles, TaskRunner, agent-loop and reward workers, router.

    Ray's CPU count is logical (scheduling slots), so oversubscribing the real cores is fine; too few slots make
    verl's placement groups wait forever instead of failing (docs/cpu_backend.md, blocker 2).
    """
    needed = CPUS_PER_DEVICE_BUNDLE * n_devices + 1 + agent_workers + reward_workers + 1
    if use_v1:
        # TransferQueue storage units (2) plus its controller and samplers (docs/cpu_backend.md, blocker 10)
        needed += 2 + 4
    return needed


def default_ray_num_cpus(n_devices: int, agent_workers: int, reward_workers: int, use_v1: bool = False) -> int:
    return max(8, required_ray_cpus(n_devices, agent_workers, reward_workers, use_v1) + 2)


def separate_async_overrides(parameter_sync_step: int, warmup_batches: float = 0.5) -> list[str]:
    """What verl's ``separate_async`` mode adds to a CPU run (after :func:`cpu_overrides`; the run's
    ``ppo_mini_batch_size`` must be its batch / ``parameter_sync_step``): the standalone rollout on a logical GPU of
    its own (the trainer has the other), the weights sent once a step through the backend's ``cpu_zmq`` checkpoint
    engine (``recipe/exgrpo/cpu/checkpoint_engine.py``), no colocated rollout on the trainer's device (vLLM on CPU has
    no sleep mode to hand the device back with), and vLLM decoding 4 sequences at a time, so that a step's sampling
    meets requests still in flight."""
    return [
        "trainer.v1.trainer_mode=separate_async",
        f"trainer.v1.separate_async.parameter_sync_step={int(parameter_sync_step)}",
        f"trainer.v1.separate_async.num_warmup_batches={warmup_batches}",
        "actor_rollout_ref.rollout.max_num_seqs=4",
        "actor_rollout_ref.hybrid_engine=False",
        "actor_rollout_ref.rollout.nnodes=1",
        "actor_rollout_ref.rollout.n_gpus_per_node=1",
        "actor_rollout_ref.rollout.checkpoint_engine.backend=cpu_zmq",
        "ray_kwargs.ray_init.num_gpus=2",
    ]


def cpu_overrides(spec: CpuRunSpec) -> list[str]:
    """Hydra overrides for verl's ``ppo_trainer`` config: tiny GRPO on the CPU platform with the hf rollout."""
    out = Path(spec.output_dir)
    mini = spec.ppo_mini_batch_size or spec.train_batch_size
    num_cpus = spec.ray_num_cpus or default_ray_num_cpus(
        spec.n_devices, spec.agent_workers, spec.reward_workers, spec.use_v1
    )
    loggers = "[" + ",".join(spec.loggers) + "]"
    overrides = [
        # algorithm: GRPO, no KL (the ExGRPO setting, docs/algorithm.md §1)
        f"algorithm.adv_estimator={spec.adv_estimator}",
        "algorithm.use_kl_in_reward=False",
        # data
        f"data.train_files={spec.train_files}",
        f"data.val_files={spec.val_files}",
        f"data.train_batch_size={spec.train_batch_size}",
        f"data.max_prompt_length={spec.max_prompt_length}",
        f"data.max_response_length={spec.max_response_length}",
        "data.dataloader_num_workers=0",
        "data.filter_overlong_prompts=False",
        "data.truncation=error",
        f"data.seed={spec.seed}",
        # model: tiny local HF model, sdpa attention, padded inputs (remove-padding packs sequences for
        # flash-attn varlen; with sdpa packed sequences would attend across each other)
        f"actor_rollout_ref.model.path={spec.model_path}",
        "+actor_rollout_ref.model.override_config.attn_implementation=sdpa",
        "actor_rollout_ref.model.use_remove_padding=False",
        "actor_rollout_ref.model.enable_gradient_checkpointing=False",
        # actor: FSDP2 in float32 (FSDP1 cannot start from CPU parameters; bf16 autocast buys nothing on CPU)
        "actor_rollout_ref.actor.strategy=fsdp2",
        "actor_rollout_ref.ref.strategy=fsdp2",
        f"actor_rollout_ref.actor.optim.lr={spec.lr}",
        f"actor_rollout_ref.actor.ppo_mini_batch_size={mini}",
        f"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu={spec.micro_batch_size_per_device}",
        "actor_rollout_ref.actor.use_kl_loss=False",
        "actor_rollout_ref.actor.entropy_coeff=0",
        "actor_rollout_ref.actor.use_torch_compile=False",
        "actor_rollout_ref.actor.fsdp_config.use_torch_compile=False",
        "actor_rollout_ref.actor.fsdp_config.model_dtype=fp32",
        "+actor_rollout_ref.actor.fsdp_config.mixed_precision.param_dtype=fp32",
        "+actor_rollout_ref.actor.fsdp_config.mixed_precision.reduce_dtype=fp32",
        "+actor_rollout_ref.actor.fsdp_config.mixed_precision.buffer_dtype=fp32",
        f"actor_rollout_ref.actor.data_loader_seed={spec.seed}",
        # rollout: Hugging Face generate() on CPU (or verl's vLLM rollout, below), one replica per device
        f"actor_rollout_ref.rollout.name={spec.rollout}",
        f"actor_rollout_ref.rollout.n={spec.rollout_n}",
        f"actor_rollout_ref.rollout.temperature={spec.temperature}",
        f"actor_rollout_ref.rollout.top_p={spec.top_p}",
        "actor_rollout_ref.rollout.top_k=-1",
        "actor_rollout_ref.rollout.tensor_model_parallel_size=1",
        "actor_rollout_ref.rollout.data_parallel_size=1",
        "actor_rollout_ref.rollout.dtype=float32",
        "actor_rollout_ref.rollout.calculate_log_probs=True",
        f"actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu={spec.micro_batch_size_per_device}",
        f"actor_rollout_ref.rollout.agent.num_workers={spec.agent_workers}",
        f"actor_rollout_ref.rollout.seed={spec.seed}",
        "actor_rollout_ref.rollout.checkpoint_engine.backend=naive",
        # reward: verl's reward loop with the given function
        f"reward.num_workers={spec.reward_workers}",
        # trainer
        f"trainer.use_v1={spec.use_v1}",
        "trainer.device=cpu",
        f"trainer.n_gpus_per_node={spec.n_devices}",
        "trainer.nnodes=1",
        f"trainer.total_training_steps={spec.total_training_steps}",
        f"trainer.logger={loggers}",
        f"trainer.project_name={spec.project_name}",
        f"trainer.experiment_name={spec.experiment_name}",
        f"trainer.val_before_train={spec.val_before_train}",
        f"trainer.test_freq={spec.test_freq}",
        f"trainer.save_freq={spec.save_freq}",
        f"trainer.resume_mode={spec.resume_mode}",
        f"trainer.default_local_dir={out / 'checkpoints'}",
        # Ray: logical GPUs for verl's placement groups, enough logical CPUs for every actor, no dashboard
        f"ray_kwargs.ray_init.num_cpus={num_cpus}",
        f"+ray_kwargs.ray_init.num_gpus={spec.n_devices}",
        "+ray_kwargs.ray_init.include_dashboard=False",
        # hydra: outputs under output_dir
        f"hydra.run.dir={out / 'hydra'}",
        "hydra.output_subdir=null",
    ]
    if spec.reward_fn_path:
        overrides += [
            f"reward.custom_reward_function.path={spec.reward_fn_path}",
            f"reward.custom_reward_function.name={spec.reward_fn_name}",
        ]
    if spec.rollout == "vllm":
        overrides += [
            # vLLM's CPU platform has no sleep mode (it refuses the flag); its sleep()/wake_up() are then no-ops
            "+actor_rollout_ref.rollout.enable_sleep_mode=False",
            # no CUDA graphs on CPU; eager also skips torch.compile's start-up on a model this small
            "actor_rollout_ref.rollout.enforce_eager=True",
        ]
    if spec.ray_temp_dir:
        overrides.append(f"+ray_kwargs.ray_init.{verl_compat.RAY_TEMP_DIR_KEY}={spec.ray_temp_dir}")
    if spec.use_v1:
        overrides.append("transfer_queue.backend.SimpleStorage.num_data_storage_units=2")
    if spec.config_check:
        overrides.append(f"+hydra.callbacks.exgrpo_cpu_check._target_={CALLBACK_TARGET}")
    return overrides + list(spec.extra_overrides)


def cpu_env(
    output_dir: str | Path | None = None,
    wall_limit_s: float = DEFAULT_WALL_LIMIT_S,
    threads: int | None = None,
    rollout_dump_dir: str | Path | None = None,
    base: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """Environment variables (only the ones to add) for every process of a CPU run.

    ``base`` (default ``os.environ``) is read to extend ``VERL_USE_EXTERNAL_MODULES`` and ``PYTHONPATH`` rather
    than replace them. ``threads`` defaults to all visible cores (Ray would otherwise pin each actor to 1).
    """
    base = os.environ if base is None else base
    modules = [m for m in base.get("VERL_USE_EXTERNAL_MODULES", "").split(",") if m]
    if PLUGIN_MODULE not in modules:
        modules.insert(0, PLUGIN_MODULE)
    pythonpath = [p for p in base.get("PYTHONPATH", "").split(os.pathsep) if p]
    if str(REPO_ROOT) not in pythonpath:
        pythonpath.insert(0, str(REPO_ROOT))
    n_threads = str(threads or max(1, len(os.sched_getaffinity(0))))
    env = {
        "VERL_PLATFORM": "cpu",
        "VERL_USE_EXTERNAL_MODULES": ",".join(modules),
        "PYTHONPATH": os.pathsep.join(pythonpath),
        "OMP_NUM_THREADS": n_threads,
        "MKL_NUM_THREADS": n_threads,
        "EXGRPO_CPU_THREADS": n_threads,
        "TOKENIZERS_PARALLELISM": "false",
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "RAY_USAGE_STATS_ENABLED": "0",
        "RAY_DEDUP_LOGS": "0",
        WALL_LIMIT_ENV: str(int(wall_limit_s)),
    }
    # Ray's raylet starts one idle Python worker per logical CPU when the driver connects (9 on the CPU runs'
    # logical count, for 2 real cores); verl's actors mostly cannot use them (their runtime_env differs), so they
    # only compete for the cores at start-up. Set RAY_prestart_worker_first_driver=1 to get them back.
    if PRESTART_ENV not in base:
        env[PRESTART_ENV] = "0"
    if output_dir is not None:
        env["VERL_FILE_LOGGER_PATH"] = str(Path(output_dir) / "metrics.jsonl")
    if rollout_dump_dir is not None:
        env["EXGRPO_CPU_ROLLOUT_DUMP"] = str(rollout_dump_dir)
    return env


# ------------------------------------------------------------------------------------------------ checks
def _get(cfg: Any, dotted: str, default: Any = None) -> Any:
    node = cfg
    for part in dotted.split("."):
        if node is None:
            return default
        try:
            node = node.get(part) if hasattr(node, "get") else getattr(node, part)
        except Exception:
            return default
    return default if node is None else node


def cpu_config_problems(cfg: Any, env: Mapping[str, str] | None = None) -> list[str]:
    """Every reason the composed config (an OmegaConf DictConfig or nested dicts) cannot run on CPU."""
    env = os.environ if env is None else env
    problems: list[str] = []
    rollout = "actor_rollout_ref.rollout"
    name = _get(cfg, f"{rollout}.name")
    if name not in CPU_ROLLOUTS:
        problems.append(
            f"{rollout}.name={name}: on CPU only the Hugging Face rollout (hf) and verl's vLLM rollout with the vLLM "
            f"CPU stack (vllm) run; set {rollout}.name=hf"
        )
    if name == "vllm":
        problems += vllm_rollout_problems(cfg)
    lora_rank = _get(cfg, "actor_rollout_ref.model.lora_rank", 0) or 0
    if name == "hf" and int(lora_rank) > 0 and not _get(cfg, "actor_rollout_ref.model.lora.merge", False):
        problems.append(
            f"actor_rollout_ref.model.lora.merge=False with actor_rollout_ref.model.lora_rank={lora_rank}: the hf "
            "rollout loads merged weights only (it has no LoRA adapter path); set actor_rollout_ref.model.lora.merge="
            "True, or rollout.name=vllm, which serves the adapter"
        )
    for key in ("tensor_model_parallel_size", "data_parallel_size", "pipeline_model_parallel_size"):
        value = _get(cfg, f"{rollout}.{key}", 1)
        if value != 1:
            problems.append(f"{rollout}.{key}={value}: a CPU rollout runs one engine per replica; set it to 1")
    roles = ["actor_rollout_ref.actor"]
    if _get(cfg, "actor_rollout_ref.actor.use_kl_loss", False) or _get(cfg, "algorithm.use_kl_in_reward", False):
        roles.append("actor_rollout_ref.ref")
    if _get(cfg, "algorithm.adv_estimator") == "gae":
        roles.append("critic")
    for role in roles:
        strategy = _get(cfg, f"{role}.strategy")
        if strategy != "fsdp2":
            problems.append(f"{role}.strategy={strategy}: only FSDP2 starts from CPU parameters; set it to fsdp2")
    attn = _get(cfg, "actor_rollout_ref.model.override_config.attn_implementation")
    if attn not in CPU_ATTENTION:
        problems.append(
            f"actor_rollout_ref.model.override_config.attn_implementation={attn or 'unset (verl: flash_attention_2)'}"
            ": flash attention needs a GPU; set +actor_rollout_ref.model.override_config.attn_implementation=sdpa"
        )
    if _get(cfg, "actor_rollout_ref.model.use_remove_padding", True):
        problems.append(
            "actor_rollout_ref.model.use_remove_padding=True packs sequences for flash-attn varlen; with sdpa they "
            "would attend across each other: set actor_rollout_ref.model.use_remove_padding=False"
        )
    if _get(cfg, "reward.reward_model.enable", False):
        problems.append("reward.reward_model.enable=True: model-based rewards are not supported on CPU")
    devices = int(_get(cfg, "trainer.n_gpus_per_node", 1)) * int(_get(cfg, "trainer.nnodes", 1))
    ray_init = _get(cfg, "ray_kwargs.ray_init", {}) or {}
    num_gpus = _get(ray_init, "num_gpus")
    use_v1 = bool(_get(cfg, "trainer.use_v1", False))
    separate = use_v1 and _get(cfg, "trainer.v1.trainer_mode") == "separate_async"
    rollout_devices = (
        int(_get(cfg, f"{rollout}.n_gpus_per_node", 0) or 0) * int(_get(cfg, f"{rollout}.nnodes", 0) or 0)
        if separate
        else 0
    )
    if num_gpus is None or float(num_gpus) < devices + rollout_devices:
        what = f"trainer.n_gpus_per_node * trainer.nnodes = {devices}"
        if separate:
            what += f", and the standalone rollout's {rollout}.n_gpus_per_node * nnodes = {rollout_devices}"
        problems.append(
            f"ray_kwargs.ray_init.num_gpus={num_gpus}: verl places one logical GPU per device ({what}); with fewer "
            f"its placement groups wait forever. Set ray_kwargs.ray_init.num_gpus={devices + rollout_devices}"
        )
    needed = required_ray_cpus(
        devices, int(_get(cfg, f"{rollout}.agent.num_workers", 8)), int(_get(cfg, "reward.num_workers", 8)), use_v1
    )
    num_cpus = _get(ray_init, "num_cpus")
    if num_cpus is None or int(num_cpus) < needed:
        problems.append(
            f"ray_kwargs.ray_init.num_cpus={num_cpus}: the run's actors reserve {needed} logical CPUs "
            f"({CPUS_PER_DEVICE_BUNDLE} per device bundle + TaskRunner + agent-loop workers + reward workers + "
            f"router); with fewer, Ray's placement groups wait forever. Set ray_kwargs.ray_init.num_cpus={needed} "
            "or more (logical CPUs, oversubscribing real cores is fine)"
        )
    if use_v1:
        units = _get(cfg, "transfer_queue.backend.SimpleStorage.num_data_storage_units", 8)
        if int(units) > 2:
            problems.append(
                f"transfer_queue.backend.SimpleStorage.num_data_storage_units={units}: each unit is a Ray actor "
                "that needs a CPU slot; set it to 2 on CPU"
            )
    plugin_modules = env.get("VERL_USE_EXTERNAL_MODULES", "").split(",")
    if PLUGIN_MODULE not in plugin_modules:
        problems.append(
            f"environment: VERL_USE_EXTERNAL_MODULES does not name {PLUGIN_MODULE}, so Ray workers would not load the "
            "CPU platform; run with the variables of recipe.exgrpo.cpu.run_config.cpu_env()"
        )
    if env.get("VERL_PLATFORM", "").strip().lower() not in ("", "cpu"):
        problems.append(f"environment: VERL_PLATFORM={env.get('VERL_PLATFORM')} conflicts with the CPU backend")
    return problems


def vllm_rollout_problems(cfg: Any) -> list[str]:
    """Why verl's vLLM rollout cannot run on this CPU machine with this config (the stack, then the settings)."""
    from recipe.exgrpo.cpu import vllm_stack

    problems = [f"actor_rollout_ref.rollout.name=vllm: {p}" for p in vllm_stack.stack_problems()]
    if _get(cfg, "actor_rollout_ref.rollout.enable_sleep_mode", True):
        problems.append(
            "actor_rollout_ref.rollout.enable_sleep_mode=True (verl's default): vLLM's CPU platform has no sleep "
            "mode; set +actor_rollout_ref.rollout.enable_sleep_mode=False"
        )
    return problems


def validate_cpu_run_config(cfg: Any, env: Mapping[str, str] | None = None) -> None:
    problems = cpu_config_problems(cfg, env)
    if problems:
        lines = "\n".join(f"  - {p}" for p in problems)
        raise CpuBackendConfigError(f"this config cannot run on the CPU backend:\n{lines}")


# ------------------------------------------------------------------------------------------------ wall-clock limit
def _kill_descendants_and_exit(limit_s: float) -> None:
    import psutil

    sys.stderr.write(
        f"\n[exgrpo-cpu] wall-clock limit of {limit_s:.0f} s reached ({WALL_LIMIT_ENV}); stopping the run and "
        "its Ray processes. Raise the limit or shrink the run (fewer steps, smaller batches).\n"
    )
    sys.stderr.flush()
    me = psutil.Process()
    children = me.children(recursive=True)
    for child in children:
        try:
            child.send_signal(signal.SIGKILL)
        except psutil.Error:
            pass
    psutil.wait_procs(children, timeout=5)
    os._exit(124)


_watchdog_started = False


def start_wall_clock_watchdog(limit_s: float | None = None) -> threading.Thread | None:
    """Kill this process and all its descendants (Ray included) after ``limit_s`` seconds (default: env)."""
    global _watchdog_started
    if limit_s is None:
        raw = os.environ.get(WALL_LIMIT_ENV)
        if not raw:
            return None
        limit_s = float(raw)
    if limit_s <= 0 or _watchdog_started:
        return None
    _watchdog_started = True
    deadline = time.monotonic() + limit_s

    def watch() -> None:
        while time.monotonic() < deadline:
            time.sleep(min(1.0, max(0.0, deadline - time.monotonic())))
        _kill_descendants_and_exit(limit_s)

    thread = threading.Thread(target=watch, name="exgrpo-cpu-wall-clock", daemon=True)
    thread.start()
    return thread


try:  # hydra is a dependency of verl; keep this module importable without it
    from hydra.experimental.callback import Callback as _HydraCallback
except ImportError:  # pragma: no cover
    _HydraCallback = object  # type: ignore[assignment,misc]


class CpuConfigCheck(_HydraCallback):
    """Hydra callback: validate the composed config for the CPU backend, then arm the wall-clock watchdog.

    Hydra turns exceptions raised by callbacks into warnings, so a failed check leaves through ``SystemExit``
    (not an ``Exception``): the driver stops with the message before Ray is started.
    """

    def on_job_start(self, config: Any, **kwargs: Any) -> None:
        from omegaconf import OmegaConf, open_dict

        task_cfg = OmegaConf.create(OmegaConf.to_container(config, resolve=False))
        with open_dict(task_cfg):
            task_cfg.pop("hydra", None)
        try:
            validate_cpu_run_config(task_cfg)
        except CpuBackendConfigError as err:
            raise SystemExit(f"[exgrpo-cpu] {err}") from err
        start_wall_clock_watchdog()
