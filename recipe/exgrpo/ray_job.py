"""What a Ray job of the recipe carries to every worker, and the start-up check that every node can import it.

The actor loss reaches the workers as ``functools.partial(recipe.exgrpo.actor_loss.exgrpo_actor_loss, ...)``,
pickled *by reference*, and the reward and dataset are loaded by module name (``pkg://recipe.exgrpo.reward``): every
Ray worker on every node must import ``recipe.exgrpo`` and ``exgrpo``. On a cluster started with
``scripts/train/common.sh ray-head/ray-worker`` the repository is on the workers' ``PYTHONPATH``; on one started by
the user (SLURM, KubeRay), it may not be, and the repository path may not even exist on the worker nodes.

So the job ships the code itself, through ``ray_kwargs.ray_init.runtime_env.py_modules``: the two package
directories as the driver imports them (~1 MB, ``__pycache__`` left out). Ray uploads them once per content hash to
the cluster's storage, unpacks them on each node and puts them first on the workers' ``sys.path``; the workers'
working directory is left alone. (Not ``working_dir``: it would upload the whole checkout, data, caches and
checkpoints included unless excluded, within Ray's 512 MiB package limit, and move every worker's working directory
into the unpacked copy, where relative paths of the config would resolve differently. Not ``PYTHONPATH`` in
``env_vars``: it names a path that exists only where the repository is checked out at the same place.)
``EXGRPO_SHIP_CODE=0`` turns the shipping off (the workers must then import the recipe by themselves).

Before the trainer starts, :func:`check_worker_imports` runs one tiny task on every alive node that imports the
packages and locates the modules the job loads by name; a node that cannot, or does not answer within
``EXGRPO_WORKER_PROBE_TIMEOUT_S`` seconds (default 120), stops the run with :class:`WorkerImportError` naming it.
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
    "recipe.exgrpo.engines",
)
UPLOAD_EXCLUDES: tuple[str, ...] = ("__pycache__", "*.pyc")


class WorkerImportError(RuntimeError):
    """A node of the Ray cluster cannot import the recipe (or did not say within the time limit)."""


def package_dirs(packages: Sequence[str] = SHIPPED_PACKAGES) -> list[str]:
    """The directory of each package as this process imports it."""
    import importlib

    out = []
    for name in packages:
        module = importlib.import_module(name)
        paths = list(getattr(module, "__path__", []))
        if not paths:
            raise ValueError(f"{name} is a module, not a package directory: cannot ship it with py_modules")
        out.append(str(Path(paths[0]).resolve()))
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


def _alive_nodes() -> list[dict[str, Any]]:
    import ray

    return [n for n in ray.nodes() if n.get("Alive")]


def probe_nodes(modules: Sequence[str] = WORKER_MODULES, timeout_s: float | None = None) -> list[NodeReport]:
    """One probe task per alive node of the connected Ray cluster (pinned to it, no CPU reserved), in the job's
    runtime_env; answers gathered for at most ``timeout_s`` seconds, then the rest are cancelled."""
    import ray
    from ray import cloudpickle
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    if timeout_s is None:
        timeout_s = float(os.environ.get(PROBE_TIMEOUT_ENV, DEFAULT_PROBE_TIMEOUT_S))
    # The probe must reach a worker that lacks this module: ship its code by value, not by reference.
    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    try:
        task = ray.remote(num_cpus=0, max_retries=0)(_probe)
        nodes = _alive_nodes()
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
    while pending:
        done, pending = ray.wait(pending, num_returns=len(pending), timeout=max(0.0, deadline - time.monotonic()))
        for ref in done:
            node = refs[ref]
            try:
                reports.append(NodeReport(node["NodeID"], node.get("NodeManagerAddress", "?"), ray.get(ref)))
            except Exception as e:  # the task failed on that node before or while probing
                text = str(e).strip().splitlines()
                reports.append(
                    NodeReport(node["NodeID"], node.get("NodeManagerAddress", "?"), None, text[-1] if text else repr(e))
                )
        if time.monotonic() >= deadline:
            break
    for ref in pending:
        node = refs[ref]
        ray.cancel(ref, force=True)
        reports.append(NodeReport(node["NodeID"], node.get("NodeManagerAddress", "?"), None))
    return reports


def import_problems(reports: Sequence[NodeReport], timeout_s: float) -> list[str]:
    """One line per node that cannot import the recipe, failed to run the probe, or did not answer."""
    problems = []
    for r in reports:
        where = f"node {r.address} ({r.node_id[:12]})"
        if r.error is not None:
            problems.append(f"{where}: the import probe failed: {r.error}")
        elif r.answer is None:
            problems.append(
                f"{where}: no answer within {timeout_s:g} s (its worker did not start: a runtime_env that could not "
                f"be set up, or a node too busy; {PROBE_TIMEOUT_ENV} raises the limit)"
            )
        elif r.answer["missing"]:
            missing = "; ".join(f"{m}: {why}" for m, why in r.answer["missing"].items())
            problems.append(f"{where}, host {r.answer['hostname']} ({r.answer['python']}): {missing}")
    return problems


def check_worker_imports(modules: Sequence[str] = WORKER_MODULES, timeout_s: float | None = None) -> None:
    """Raise :class:`WorkerImportError` unless every alive node of the Ray cluster imports ``modules``."""
    if timeout_s is None:
        timeout_s = float(os.environ.get(PROBE_TIMEOUT_ENV, DEFAULT_PROBE_TIMEOUT_S))
    reports = probe_nodes(modules, timeout_s)
    problems = import_problems(reports, timeout_s)
    if problems:
        raise WorkerImportError(
            f"{len(problems)} of {len(reports)} Ray node(s) cannot import the ExGRPO recipe, which every worker needs "
            "(the actor loss is pickled by reference; the reward and dataset load by module name):\n"
            + "\n".join(f"  - {p}" for p in problems)
            + "\nThe job ships recipe/ and exgrpo/ to the workers through ray_kwargs.ray_init.runtime_env.py_modules "
            f"unless {SHIP_CODE_ENV}=0; otherwise put the repository on every node's PYTHONPATH (bash "
            "scripts/train/common.sh ray-head / ray-worker do) or install it there (pip install -e .). See "
            'docs/launch_scripts.md, "Several nodes".'
        )
    print(f"[exgrpo] every Ray node ({len(reports)}) imports the recipe")


class CheckedTaskRunner:
    """The task runner class handed to verl's ``run_ppo``: the import check runs when ``run_ppo`` creates the
    runner, i.e. after its ``ray.init`` (with the job's runtime_env) and before anything of the trainer starts."""

    def __init__(self, runner_cls: Any, check: Callable[[], None] = check_worker_imports) -> None:
        self._runner_cls = runner_cls
        self._check = check

    def remote(self, *args: Any, **kwargs: Any) -> Any:
        self._check()
        return self._runner_cls.remote(*args, **kwargs)

    def options(self, **kwargs: Any) -> Any:
        self._check()
        return self._runner_cls.options(**kwargs)
