"""What the Ray job carries to its workers (``recipe/exgrpo/ray_job.py``) and the start-up check that every node
imports the recipe.

The real check starts a local Ray cluster whose workers lack a package the driver imports: the driver runs from
another directory with ``PYTHONPATH`` cleared and finds the package through its own ``sys.path`` only. The probe
must name the node and the module; with the package shipped through ``runtime_env.py_modules`` (``ship_code``) the
same workers import it. (The recipe itself is installed editable in the test environment, so every local worker
imports it anyway: the check is shown on a stand-in package that exists only in the driver's ``sys.path``.)
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import textwrap
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from recipe.exgrpo.ray_job import (
    SHIP_CODE_ENV,
    UPLOAD_EXCLUDES,
    WORKER_MODULES,
    CheckedTaskRunner,
    NodeReport,
    WorkerImportError,
    import_problems,
    package_dirs,
    ship_code,
)

REPO = Path(__file__).resolve().parents[2]


def _config(runtime_env=None):
    ray_init = {"num_cpus": None} if runtime_env is None else {"runtime_env": runtime_env}
    return OmegaConf.create({"ray_kwargs": {"ray_init": ray_init}})


def test_the_job_ships_both_packages_through_py_modules(monkeypatch):
    monkeypatch.delenv(SHIP_CODE_ENV, raising=False)
    config = _config()
    added = ship_code(config)
    runtime_env = OmegaConf.to_container(config.ray_kwargs.ray_init.runtime_env)
    assert added == [str(REPO / "exgrpo"), str(REPO / "recipe")] == runtime_env["py_modules"]
    assert runtime_env["excludes"] == list(UPLOAD_EXCLUDES)
    assert "working_dir" not in runtime_env  # the workers' working directory is left alone
    assert ship_code(config) == [] and len(config.ray_kwargs.ray_init.runtime_env.py_modules) == 2  # idempotent


def test_the_users_runtime_env_is_kept(monkeypatch):
    monkeypatch.delenv(SHIP_CODE_ENV, raising=False)
    config = _config({"py_executable": None, "py_modules": ["/shared/mylib"], "excludes": ["*.ckpt"]})
    ship_code(config)
    runtime_env = OmegaConf.to_container(config.ray_kwargs.ray_init.runtime_env)
    assert runtime_env["py_modules"] == ["/shared/mylib", *package_dirs()]
    assert runtime_env["excludes"] == ["*.ckpt", *UPLOAD_EXCLUDES] and runtime_env["py_executable"] is None


def test_shipping_can_be_turned_off(monkeypatch):
    monkeypatch.setenv(SHIP_CODE_ENV, "0")
    config = _config()
    assert ship_code(config) == [] and config.ray_kwargs.ray_init.get("runtime_env") is None


def test_the_recipe_loads_its_reward_and_dataset_by_module_name():
    """A file path of the driver's checkout may not exist on another node; a module name resolves in the code the
    job ships."""
    from recipe.exgrpo.dry_run import compose_config
    from recipe.exgrpo.main_exgrpo import prepare_config

    config = compose_config(["actor_rollout_ref.model.path=/m", "data.train_files=/t", "data.val_files=/v"])
    prepare_config(config)
    assert config.reward.custom_reward_function.path == "pkg://recipe.exgrpo.reward"
    assert config.data.custom_cls.path == "pkg://recipe.exgrpo.dataset"
    assert package_dirs() == list(config.ray_kwargs.ray_init.runtime_env.py_modules)[-2:]


def test_problems_name_the_node_the_module_and_the_timeout():
    ok = NodeReport("a" * 20, "10.0.0.1", {"hostname": "h1", "python": "/py", "missing": {}})
    missing = NodeReport("b" * 20, "10.0.0.2", {"hostname": "h2", "python": "/py", "missing": {"exgrpo": "No module"}})
    silent = NodeReport("c" * 20, "10.0.0.3", None)
    failed = NodeReport("d" * 20, "10.0.0.4", None, "RuntimeEnvSetupError: upload failed")
    problems = import_problems([ok, missing, silent, failed], timeout_s=7)
    assert len(problems) == 3
    assert problems[0].startswith("node 10.0.0.2 (bbbbbbbbbbbb), host h2 (/py): exgrpo: No module")
    assert "no answer within 7 s" in problems[1] and "EXGRPO_WORKER_PROBE_TIMEOUT_S" in problems[1]
    assert "RuntimeEnvSetupError" in problems[2]


def test_the_checked_runner_checks_before_it_starts_anything():
    calls = []

    class Runner:
        @staticmethod
        def remote(*args):
            calls.append(("remote", args))
            return "handle"

        @staticmethod
        def options(**kwargs):
            calls.append(("options", kwargs))
            return Runner

    def failing_check():
        calls.append("check")
        raise WorkerImportError("node x cannot import the recipe")

    with pytest.raises(WorkerImportError):
        CheckedTaskRunner(Runner, failing_check).remote()
    with pytest.raises(WorkerImportError):
        CheckedTaskRunner(Runner, failing_check).options(runtime_env={"nsight": {}})
    assert calls == ["check", "check"]  # the runner was never created
    assert CheckedTaskRunner(Runner, lambda: calls.append("ok")).remote(1) == "handle"
    assert calls[-2:] == ["ok", ("remote", (1,))]


DRIVER = textwrap.dedent(
    """
    import json, sys
    sys.path.insert(0, sys.argv[1])      # the stand-in package: importable by this driver only
    sys.path.insert(0, sys.argv[2])      # the repository (PYTHONPATH is cleared)
    import ray
    from omegaconf import OmegaConf
    from recipe.exgrpo.ray_job import WorkerImportError, check_worker_imports, ship_code

    modules = ("exgrpo_probe_standin", "exgrpo_probe_standin.loss")
    out = {}
    for shipped in (False, True):
        config = OmegaConf.create({"ray_kwargs": {"ray_init": {"runtime_env": {}}}})
        if shipped:
            ship_code(config, packages=("exgrpo_probe_standin",))
        runtime_env = OmegaConf.to_container(config.ray_kwargs.ray_init.runtime_env)
        ray.init(num_cpus=1, include_dashboard=False, _temp_dir=sys.argv[3], runtime_env=runtime_env,
                 logging_level="ERROR", log_to_driver=False)
        try:
            check_worker_imports(modules, timeout_s=240)
            out[str(shipped)] = "ok"
        except WorkerImportError as e:
            out[str(shipped)] = str(e)
        finally:
            ray.shutdown()
    print("RESULT " + json.dumps(out))
    """
)


@pytest.mark.slow
@pytest.mark.timeout(720)
def test_a_worker_without_the_code_is_named_and_shipping_the_code_fixes_it(tmp_path):
    from recipe.exgrpo.cpu.procs import run_in_new_session

    package = tmp_path / "src" / "exgrpo_probe_standin"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("VALUE = 1\n")
    (package / "loss.py").write_text("def loss():\n    return 0.0\n")
    run_dir = tmp_path / "elsewhere"  # Ray puts the driver's working directory on the workers' path: not this one
    run_dir.mkdir()
    (run_dir / "driver.py").write_text(DRIVER)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "RAY_ADDRESS", SHIP_CODE_ENV)}
    with tempfile.TemporaryDirectory(prefix="exgray-", dir="/tmp") as ray_tmp:
        result = run_in_new_session(
            [sys.executable, str(run_dir / "driver.py"), str(package.parent), str(REPO), ray_tmp],
            env=env,
            timeout_s=660,
            log_path=tmp_path / "driver.log",
            cwd=run_dir,
        )
    log = result.log_tail(8000)
    assert result.returncode == 0, log
    line = next(x for x in log.splitlines() if x.startswith("RESULT "))
    out = json.loads(line[len("RESULT ") :])
    unshipped = out["False"]
    assert unshipped != "ok" and unshipped.startswith("1 of 1 Ray node(s) cannot import the ExGRPO recipe"), unshipped
    assert unshipped.splitlines()[1].startswith("  - node "), unshipped  # the node, by address and id
    assert "exgrpo_probe_standin: ModuleNotFoundError" in unshipped, unshipped
    assert "docs/launch_scripts.md" in unshipped, unshipped
    assert out["True"] == "ok", out["True"]


def test_the_probe_covers_what_the_workers_load():
    assert {"exgrpo", "recipe.exgrpo.actor_loss", "recipe.exgrpo.reward", "recipe.exgrpo.dataset"} <= set(
        WORKER_MODULES
    )
