"""What a Ray job of the recipe carries to every worker, and the start-up check that every node can import it.

The actor loss reaches the workers as ``functools.partial(recipe.exgrpo.actor_loss.exgrpo_actor_loss, ...)``,
pickled *by reference*, and the reward and dataset are loaded by module name (``pkg://recipe.exgrpo.reward``): every
Ray worker on every node must import ``recipe.exgrpo`` and ``exgrpo``. On a cluster started with
``scripts/train/common.sh ray-head/ray-worker`` the repository is on the workers' ``PYTHONPATH``; on one started by
the user (SLURM, KubeRay), it may not be, and the repository path may not even exist on the worker nodes.

So the job ships the code itself, through ``ray_kwargs.ray_init.runtime_env.py_modules``: the two package
directories, located from the recipe's own module files (:func:`package_dirs`; ~1 MB, ``__pycache__`` left out).
Ray uploads them once per content hash to the cluster's storage, unpacks them on each node and puts them first on
the workers' ``sys.path``; the workers' working directory is left alone. (Not ``working_dir``: it would upload the
whole checkout, data, caches and checkpoints included unless excluded, within Ray's 512 MiB package limit, and move
every worker's working directory into the unpacked copy, where relative paths of the config would resolve
differently. Not ``PYTHONPATH`` in ``env_vars``: it names a path that exists only where the repository is checked
out at the same place.)
``EXGRPO_SHIP_CODE=0`` turns the shipping off (the workers must then import the recipe by themselves).

Before the trainer starts, :func:`check_worker_imports` runs one tiny task on every alive node the job may use (one
with CPUs or GPUs, :func:`job_nodes`) that imports the packages and locates the modules the job loads by name; a
node that cannot, or does not answer within ``EXGRPO_WORKER_PROBE_TIMEOUT_S`` seconds (default 120), stops the run
with :class:`WorkerImportError` naming it and what of the job runs there. Nodes with neither are named and left
alone.
"""

from __future__ import annotations

import os
import socket
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SHIP_CODE_ENV = "EXGRPO_SHIP_CODE"
PROBE_TIMEOUT_ENV = "EXGRPO_WORKER_PROBE_TIMEOUT_S"
DEFAULT_PROBE_TIMEOUT_S = 120.0
#: the packages the job ships (top-level names; each is uploaded as its directory)
SHIPPED_PACKAGES: tuple[str, ...] = ("exgrpo", "recipe")
#: modules a worker imports by name: the loss (pickled by reference), the reward and dataset (``pkg://``), the
#: skip-grad engine hook (``VERL_USE_EXTERNAL_MODULES``). The probe imports the packages and locates these.
WORKER_MODULES: tuple[str, ...] = (
    "exgrpo",
    "recipe.exgrpo",
    "recipe.exgrpo.actor_loss",
    "recipe.exgrpo.reward",
    "recipe.exgrpo.dataset",
    "recipe.exgrpo.runtime.grad_norm_guard",
)
UPLOAD_EXCLUDES: tuple[str, ...] = ("__pycache__", "*.pyc")


class WorkerImportError(RuntimeError):
    """A node of the Ray cluster cannot import the recipe (or did not say within the time limit)."""


#: For a shipped package that holds no module of its own (``recipe`` only holds ``recipe.exgrpo``), the module whose
#: file locates it: Python's own ``recipe`` may be another distribution's namespace directory (below).
PACKAGE_ANCHORS: dict[str, str] = {"recipe": "recipe.exgrpo"}


def package_dirs(packages: Sequence[str] = SHIPPED_PACKAGES) -> list[str]:
    """The directory of each package, located from the files of the modules the job loads, not from the package's
    ``__path__``.

    Another distribution may install a namespace directory of the same top-level name (``site-packages/recipe/``:
    transferqueue, in the GPU lock, does). With the recipe installed editable and the driver started outside the
    checkout, ``import recipe`` finds that directory first (Python's path search runs before the editable install's
    finder), so ``recipe.__path__[0]`` is the other distribution's while ``recipe.exgrpo`` is still the checkout's.
    The file of ``recipe.exgrpo`` (:data:`PACKAGE_ANCHORS`) is where the shipped ``recipe/`` really is.
    """
    import importlib

    out = []
    for name in packages:
        anchor = PACKAGE_ANCHORS.get(name, name)
        module = importlib.import_module(anchor)
        file = getattr(module, "__file__", None)
        if not getattr(module, "__path__", None) or not file:
            raise ValueError(
                f"{anchor} is not a package with its own __init__.py (a module or a namespace package): cannot tell "
                "which directory to ship with py_modules"
            )
        directory = Path(file).resolve().parent
        for _ in range(anchor.count(".") - name.count(".")):
            directory = directory.parent
        out.append(str(directory))
    return out


def ship_code(config, packages: Sequence[str] = SHIPPED_PACKAGES) -> list[str]:
    """Add the package directories of ``packages`` to ``ray_kwargs.ray_init.runtime_env.py_modules`` (after the
    user's entries, without duplicates) and ``__pycache__`` to its ``excludes``. Returns the directories added;
    nothing with ``EXGRPO_SHIP_CODE=0``."""
    from omegaconf import open_dict

    if os.environ.get(SHIP_CODE_ENV, "1").strip().lower() in ("0", "false", "no", "off"):
        return []
    dirs = package_dirs(packages)
    with open_dict(config):
        if config.ray_kwargs.ray_init.get("runtime_env") is None:
            config.ray_kwargs.ray_init.runtime_env = {}
        runtime_env = config.ray_kwargs.ray_init.runtime_env
        existing = _as_list(runtime_env.get("py_modules"))
        added = [d for d in dirs if d not in existing]
        runtime_env.py_modules = existing + added
        excludes = _as_list(runtime_env.get("excludes"))
        runtime_env.excludes = excludes + [e for e in UPLOAD_EXCLUDES if e not in excludes]
    return added


def _as_list(value: Any) -> list:
    from omegaconf import OmegaConf

    if value is None:
        return []
    if OmegaConf.is_config(value):
        return list(OmegaConf.to_container(value, resolve=True))
    return [value] if isinstance(value, str) else list(value)


# ----------------------------------------------------------------------------------- a job of `ray job submit`
#: Ray's switch that lets ``ray.init``'s runtime_env win over a submitted job's on keys both set (Ray names it in its
#: refusal); set by :func:`merge_job_runtime_env` once the recipe's entries hold the job's too.
OVERRIDE_JOB_RUNTIME_ENV = "RAY_OVERRIDE_JOB_RUNTIME_ENV"
#: runtime_env keys whose values are lists the recipe extends: merged as a union, the job's entries first
UNION_KEYS: tuple[str, ...] = ("py_modules", "excludes")


class JobRuntimeEnvError(ValueError):
    """The submitted job's runtime_env and the recipe's set the same key to values that cannot be merged."""


def merge_job_runtime_env(config, job_env: dict | None = None, environ=None) -> list[str]:
    """Make the Ray job's runtime_env and ``ray_kwargs.ray_init.runtime_env`` agree, for a driver started by ``ray
    job submit --runtime-env-json ...``. Returns the keys it merged.

    ``ray.init`` merges the job's runtime_env with its own argument and refuses any key both set (and any variable
    of ``env_vars`` both set), unless ``RAY_OVERRIDE_JOB_RUNTIME_ENV=1``, when its argument wins key by key. The
    recipe always sets ``py_modules`` and ``excludes`` (``ship_code``), so a job that sets either would stop at
    ``ray.init``. Here ``py_modules`` and ``excludes`` become the union (the job's entries first, then the recipe's);
    a key or an environment variable set to the same value in both is kept; ``VERL_USE_EXTERNAL_MODULES`` in both is
    the job's modules followed by the recipe's. Any other key or variable both set differently raises
    :class:`JobRuntimeEnvError` naming it and where to remove it. When something was merged,
    ``RAY_OVERRIDE_JOB_RUNTIME_ENV=1`` is set in ``environ`` (default ``os.environ``, read by ``ray.init`` in this
    process), so Ray takes the merged values, which hold the job's own.
    """
    from omegaconf import OmegaConf, open_dict

    from recipe.exgrpo import verl_compat
    from recipe.exgrpo.runtime.grad_norm_guard import EXTERNAL_MODULES_ENV

    environ = os.environ if environ is None else environ
    job = verl_compat.job_runtime_env(environ) if job_env is None else dict(job_env)
    if not job or config.ray_kwargs.ray_init.get("runtime_env") is None:
        return []
    ours = OmegaConf.to_container(config.ray_kwargs.ray_init.runtime_env, resolve=True)
    where = "ray_kwargs.ray_init.runtime_env"
    merged: dict = {}
    problems: list[str] = []
    for key in sorted(set(ours) & set(job)):
        if key == "env_vars" or ours[key] is None:
            continue
        if key in UNION_KEYS:
            mine, theirs = _as_list(ours[key]), _as_list(job[key])
            merged[key] = theirs + [x for x in mine if x not in theirs]
        elif ours[key] == job[key]:
            merged[key] = ours[key]
        else:
            problems.append(
                f"{key}: the job's runtime_env (ray job submit --runtime-env/--runtime-env-json) sets {job[key]!r}, "
                f"{where}.{key} sets {ours[key]!r}; Ray cannot merge them: keep one of the two"
            )
    our_vars, job_vars = dict(ours.get("env_vars") or {}), dict(job.get("env_vars") or {})
    merged_vars = {}
    for var in sorted(set(our_vars) & set(job_vars)):
        if str(our_vars[var]) == str(job_vars[var]):
            merged_vars[var] = job_vars[var]
        elif var == EXTERNAL_MODULES_ENV:
            theirs = [m for m in str(job_vars[var]).split(",") if m]
            mine = [m for m in str(our_vars[var]).split(",") if m]
            merged_vars[var] = ",".join(theirs + [m for m in mine if m not in theirs])
        else:
            problems.append(
                f"env_vars.{var}: the job's runtime_env sets {job_vars[var]!r}, {where}.env_vars.{var} sets "
                f"{our_vars[var]!r}; Ray cannot merge them: keep one of the two"
            )
    if problems:
        raise JobRuntimeEnvError(
            "the Ray job's runtime_env and the recipe's conflict (ray.init would refuse them):\n"
            + "\n".join(f"  - {p}" for p in problems)
        )
    if not merged and not merged_vars:
        return []
    with open_dict(config):
        runtime_env = config.ray_kwargs.ray_init.runtime_env
        for key, value in merged.items():
            runtime_env[key] = value
        for var, value in merged_vars.items():
            runtime_env.env_vars[var] = value
    environ[OVERRIDE_JOB_RUNTIME_ENV] = "1"
    keys = sorted(merged) + [f"env_vars.{v}" for v in sorted(merged_vars)]
    print(
        f"[exgrpo] the submitted Ray job's runtime_env and the recipe's both set {', '.join(keys)}: merged (the job's "
        f"entries first) and {OVERRIDE_JOB_RUNTIME_ENV}=1 set, so ray.init takes the merged values"
    )
    return keys


# --------------------------------------------------------------------------------------------------- the probe
def _probe(modules: Sequence[str]) -> dict[str, Any]:
    """Run on a worker: import ``modules``' packages and locate the modules themselves (without executing them)."""
    import importlib
    import importlib.util

    report: dict[str, Any] = {"hostname": socket.gethostname(), "python": sys.executable, "missing": {}}
    for name in modules:
        try:
            parent = name.rpartition(".")[0]
            if parent:
                importlib.import_module(parent)
            if importlib.util.find_spec(name) is None:
                raise ModuleNotFoundError(f"No module named {name!r}")
        except Exception as e:  # the node's answer, whatever went wrong there
            report["missing"][name] = f"{type(e).__name__}: {e}"
    try:
        report["exgrpo_file"] = importlib.import_module("exgrpo").__file__
    except Exception:
        report["exgrpo_file"] = None
    return report


@dataclass(frozen=True)
class NodeReport:
    node_id: str
    address: str
    answer: dict[str, Any] | None  # None: no answer within the time limit
    error: str | None = None  # the task itself failed (e.g. its runtime_env could not be set up)
    #: what of the job can run on the node (:func:`node_roles`), for the message of a node that fails
    roles: tuple[str, ...] = ()


def _alive_nodes() -> list[dict[str, Any]]:
    import ray

    return [n for n in ray.nodes() if n.get("Alive")]


#: What of a job runs on a node with CPUs: verl 0.9.1 places its agent-loop and reward-loop workers round-robin over
#: every alive node whose resources include CPUs (``AgentLoopManager``, ``RewardLoopManager``), and the task runner
#: goes to any node with a free CPU.
CPU_ROLE = (
    "verl places its agent-loop and reward-loop workers on the nodes with CPUs (round-robin) and the task runner on "
    "any of them; start a node that must stay out of the job with ray start --num-cpus=0"
)
#: What of a job runs on a node with the resource pools' device: the actor/rollout (and reward-model) workers.
DEVICE_ROLE = "the resource pools' placement groups may take its {device}s (actor, rollout, reward-model workers)"


def node_roles(node: dict[str, Any], device_resource: str = "GPU") -> tuple[str, ...]:
    """Why the job may run something on ``node`` (an entry of ``ray.nodes()``): empty when nothing of it can."""
    resources = node.get("Resources") or {}
    roles = []
    if float(resources.get("CPU", 0) or 0) > 0:
        roles.append(CPU_ROLE)
    if float(resources.get(device_resource, 0) or 0) > 0:
        roles.append(DEVICE_ROLE.format(device=device_resource))
    return tuple(roles)


def job_nodes(
    nodes: Sequence[dict[str, Any]], device_resource: str = "GPU"
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The alive nodes of a cluster description (``ray.nodes()``) that the job may use, and the alive ones it cannot.

    A node is used when it has CPUs (verl's agent-loop and reward-loop workers and the task runner are placed over
    every node with CPUs) or the device of the resource pools' bundles (``GPU``: verl's placement groups ask for one
    per bundle). A node with neither (a head started with ``--num-cpus=0 --num-gpus=0``, a node that offers only
    custom resources) runs nothing of the job, whatever image it runs: the probe leaves it alone.
    """
    alive = [n for n in nodes if n.get("Alive")]
    used = [n for n in alive if node_roles(n, device_resource)]
    return used, [n for n in alive if not node_roles(n, device_resource)]


def probe_nodes(
    modules: Sequence[str] = WORKER_MODULES,
    timeout_s: float | None = None,
    nodes: Sequence[dict[str, Any]] | None = None,
    device_resource: str = "GPU",
) -> list[NodeReport]:
    """One probe task per node of ``nodes`` (default: the nodes of the connected cluster the job may use,
    :func:`job_nodes`), pinned to it, no CPU reserved, in the job's runtime_env; answers gathered for at most
    ``timeout_s`` seconds, then the rest are cancelled."""
    import ray
    from ray import cloudpickle
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    if timeout_s is None:
        timeout_s = float(os.environ.get(PROBE_TIMEOUT_ENV, DEFAULT_PROBE_TIMEOUT_S))
    if nodes is None:
        nodes = job_nodes(_alive_nodes(), device_resource)[0]
    # The probe must reach a worker that lacks this module: ship its code by value, not by reference.
    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    try:
        task = ray.remote(num_cpus=0, max_retries=0)(_probe)
        refs = {
            task.options(scheduling_strategy=NodeAffinitySchedulingStrategy(node_id=n["NodeID"], soft=False)).remote(
                list(modules)
            ): n
            for n in nodes
        }
    finally:
        cloudpickle.unregister_pickle_by_value(sys.modules[__name__])
    deadline = time.monotonic() + timeout_s
    pending = list(refs)
    reports: list[NodeReport] = []

    def report(node: dict[str, Any], answer: dict | None, error: str | None = None) -> NodeReport:
        address = node.get("NodeManagerAddress", "?")
        return NodeReport(node["NodeID"], address, answer, error, node_roles(node, device_resource))

    while pending:
        done, pending = ray.wait(pending, num_returns=len(pending), timeout=max(0.0, deadline - time.monotonic()))
        for ref in done:
            node = refs[ref]
            try:
                reports.append(report(node, ray.get(ref)))
            except Exception as e:  # the task failed on that node before or while probing
                text = str(e).strip().splitlines()
                reports.append(report(node, None, text[-1] if text else repr(e)))
        if time.monotonic() >= deadline:
            break
    for ref in pending:
        ray.cancel(ref, force=True)
        reports.append(report(refs[ref], None))
    return reports


def import_problems(reports: Sequence[NodeReport], timeout_s: float) -> list[str]:
    """One line per node that cannot import the recipe, failed to run the probe, or did not answer."""
    problems = []
    for r in reports:
        where = f"node {r.address} ({r.node_id[:12]})"
        if r.error is not None:
            problem = f"{where}: the import probe failed: {r.error}"
        elif r.answer is None:
            problem = (
                f"{where}: no answer within {timeout_s:g} s (its worker did not start: a runtime_env that could not "
                f"be set up, or a node too busy; {PROBE_TIMEOUT_ENV} raises the limit)"
            )
        elif r.answer["missing"]:
            missing = "; ".join(f"{m}: {why}" for m, why in r.answer["missing"].items())
            problem = f"{where}, host {r.answer['hostname']} ({r.answer['python']}): {missing}"
        else:
            continue
        if r.roles:
            problem += f" [the job uses this node: {'; '.join(r.roles)}]"
        problems.append(problem)
    return problems


def check_worker_imports(
    modules: Sequence[str] = WORKER_MODULES, timeout_s: float | None = None, device_resource: str = "GPU"
) -> None:
    """Raise :class:`WorkerImportError` unless every node the job may use (:func:`job_nodes`) imports ``modules``;
    the alive nodes it cannot use are left alone and named."""
    if timeout_s is None:
        timeout_s = float(os.environ.get(PROBE_TIMEOUT_ENV, DEFAULT_PROBE_TIMEOUT_S))
    used, outside = job_nodes(_alive_nodes(), device_resource)
    reports = probe_nodes(modules, timeout_s, nodes=used, device_resource=device_resource)
    problems = import_problems(reports, timeout_s)
    if problems:
        raise WorkerImportError(
            f"{len(problems)} of the {len(reports)} Ray node(s) this job uses cannot import the ExGRPO recipe, which "
            "every worker needs (the actor loss is pickled by reference; the reward and dataset load by module "
            "name):\n"
            + "\n".join(f"  - {p}" for p in problems)
            + "\nThe job ships recipe/ and exgrpo/ to the workers through ray_kwargs.ray_init.runtime_env.py_modules "
            f"unless {SHIP_CODE_ENV}=0; otherwise put the repository on every node's PYTHONPATH (bash "
            "scripts/train/common.sh ray-head / ray-worker do) or install it there (pip install -e .). See "
            'docs/launch_scripts.md, "Several nodes", and docs/troubleshooting.md#workerimporterror.'
        )
    print(f"[exgrpo] every Ray node of this job ({len(reports)}) imports the recipe")
    if outside:
        names = ", ".join(f"{n.get('NodeManagerAddress', '?')} ({n['NodeID'][:12]})" for n in outside)
        print(
            f"[exgrpo] {len(outside)} alive node(s) not used by this job (neither CPUs nor {device_resource}s in "
            f"their resources), not probed: {names}"
        )


class CheckedTaskRunner:
    """The task runner class handed to verl's ``run_ppo``: the import check runs when ``run_ppo`` creates the
    runner, i.e. after its ``ray.init`` (with the job's runtime_env) and before anything of the trainer starts.

    ``run_kwargs`` (called then, once Ray is up in the driver) gives extra keyword arguments for the runner's
    ``run`` call (``run_ppo`` calls ``runner.run.remote(config)``): what only the driver knows, e.g. its node.
    """

    def __init__(
        self,
        runner_cls: Any,
        check: Callable[[], None] = check_worker_imports,
        run_kwargs: Callable[[], dict[str, Any]] | None = None,
    ) -> None:
        self._runner_cls = runner_cls
        self._check = check
        self._run_kwargs = run_kwargs

    def remote(self, *args: Any, **kwargs: Any) -> Any:
        self._check()
        return self._handle(self._runner_cls.remote(*args, **kwargs))

    def options(self, **kwargs: Any) -> Any:
        self._check()
        options = self._runner_cls.options(**kwargs)
        if self._run_kwargs is None:
            return options
        outer = self

        class _Options:
            def remote(self, *args: Any, **kw: Any) -> Any:
                return outer._handle(options.remote(*args, **kw))

        return _Options()

    def _handle(self, handle: Any) -> Any:
        return handle if self._run_kwargs is None else _RunnerHandle(handle, self._run_kwargs())


class _RunnerHandle:
    """An actor handle whose ``run.remote(...)`` also passes ``extra`` keyword arguments."""

    def __init__(self, handle: Any, extra: dict[str, Any]) -> None:
        self._handle, self._extra = handle, extra

    @property
    def run(self) -> Any:
        method, extra = self._handle.run, self._extra

        class _Run:
            def remote(self, *args: Any, **kwargs: Any) -> Any:
                return method.remote(*args, **{**extra, **kwargs})

        return _Run()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._handle, name)


def driver_info() -> dict[str, Any]:
    """This driver's Ray node and pid (call once Ray is up): its stacks are dumped with the workers' at a deadline."""
    import ray

    return {"node_id": ray.get_runtime_context().get_node_id(), "pid": os.getpid()}
