"""What the Ray job carries to its workers (``recipe/exgrpo/runtime/ray_job.py``) and the start-up check that every node
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
import subprocess
import sys
import tempfile
import textwrap
import types
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from recipe.exgrpo.runtime.ray_job import (
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


#: A driver started outside the checkout, where the recipe is installed editable (setuptools' finder maps the
#: package names to the checkout, after Python's own path search) and another distribution has installed a namespace
#: directory ``site-packages/recipe/`` (transferqueue does, in the GPU lock): ``import recipe`` then finds that
#: directory first.
OUTSIDE_THE_CHECKOUT = textwrap.dedent(
    """
    import json, sys
    from importlib.machinery import PathFinder
    from importlib.util import spec_from_file_location
    from pathlib import Path

    repo, site = Path(sys.argv[1]), sys.argv[2]
    MAPPING = {"exgrpo": repo / "exgrpo", "recipe": repo / "recipe"}

    class EditableFinder:  # what setuptools' editable install puts on sys.meta_path
        @classmethod
        def find_spec(cls, fullname, path=None, target=None):
            if fullname in MAPPING:
                return spec_from_file_location(fullname, MAPPING[fullname] / "__init__.py")
            parent = fullname.rpartition(".")[0]
            if parent in MAPPING:
                return PathFinder.find_spec(fullname, path=[str(MAPPING[parent])])
            return None

    sys.path[:] = [site] + [p for p in sys.path if p not in ("", str(repo))]
    sys.meta_path.insert(sys.meta_path.index(PathFinder) + 1, EditableFinder)
    from recipe.exgrpo.runtime.ray_job import package_dirs
    import recipe
    print("RESULT " + json.dumps({"dirs": package_dirs(), "recipe_path": list(recipe.__path__)}))
    """
)


def test_the_shipped_directories_are_the_recipes_own_from_another_working_directory(tmp_path):
    site = tmp_path / "site-packages"
    (site / "recipe" / "simple_use_case").mkdir(parents=True)  # a namespace directory of another distribution
    (site / "recipe" / "simple_use_case" / "demo.py").write_text("X = 1\n")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "driver.py").write_text(OUTSIDE_THE_CHECKOUT)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    proc = subprocess.run(
        [sys.executable, str(elsewhere / "driver.py"), str(REPO), str(site)],
        cwd=elsewhere,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(next(x for x in proc.stdout.splitlines() if x.startswith("RESULT "))[len("RESULT ") :])
    assert out["recipe_path"][0] == str(site / "recipe")  # the situation: Python's `recipe` is the other directory
    assert out["dirs"] == [str(REPO / "exgrpo"), str(REPO / "recipe")]


def test_shipping_can_be_turned_off(monkeypatch):
    monkeypatch.setenv(SHIP_CODE_ENV, "0")
    config = _config()
    assert ship_code(config) == [] and config.ray_kwargs.ray_init.get("runtime_env") is None


def test_the_recipe_loads_its_reward_and_dataset_by_module_name():
    """A file path of the driver's checkout may not exist on another node; a module name resolves in the code the
    job ships."""
    from recipe.exgrpo.launch_checks.dry_run import compose_config
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


def test_the_checked_runner_passes_what_only_the_driver_knows_to_run():
    """run_ppo calls runner.run.remote(config); the driver's node and the run's token travel with that call."""
    runs = []

    class Handle:
        class run:  # noqa: N801 (an actor method's shape)
            @staticmethod
            def remote(*args, **kwargs):
                runs.append((args, kwargs))
                return "ref"

        other = "attribute"

    class Runner:
        @staticmethod
        def remote():
            return Handle()

        @staticmethod
        def options(**kwargs):
            return Runner

    checked = CheckedTaskRunner(Runner, lambda: None, run_kwargs=lambda: {"driver": {"pid": 7}, "run_token": "t"})
    handle = checked.remote()
    assert handle.run.remote("config") == "ref" and handle.other == "attribute"
    assert checked.options(runtime_env={"nsight": {}}).remote().run.remote("c", run_token="mine") == "ref"
    assert runs == [
        (("config",), {"driver": {"pid": 7}, "run_token": "t"}),
        (("c",), {"driver": {"pid": 7}, "run_token": "mine"}),
    ]


DRIVER = textwrap.dedent(
    """
    import json, sys
    sys.path.insert(0, sys.argv[1])      # the stand-in package: importable by this driver only
    sys.path.insert(0, sys.argv[2])      # the repository (PYTHONPATH is cleared)
    import ray
    from omegaconf import OmegaConf
    from recipe.exgrpo.runtime.ray_job import WorkerImportError, check_worker_imports, ship_code

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
@pytest.mark.timeout(1200)
def test_a_worker_without_the_code_is_named_and_shipping_the_code_fixes_it(tmp_path):
    from recipe.exgrpo.harness.procs import run_ray_command_in_new_session

    package = tmp_path / "src" / "exgrpo_probe_standin"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("VALUE = 1\n")
    (package / "loss.py").write_text("def loss():\n    return 0.0\n")
    run_dir = tmp_path / "elsewhere"  # Ray puts the driver's working directory on the workers' path: not this one
    run_dir.mkdir()
    (run_dir / "driver.py").write_text(DRIVER)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "RAY_ADDRESS", SHIP_CODE_ENV)}
    with tempfile.TemporaryDirectory(prefix="exgray-", dir="/tmp") as ray_tmp:
        result = run_ray_command_in_new_session(  # a node start that missed Ray's 30 s under load is retried
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
    assert unshipped != "ok" and unshipped.startswith(
        "1 of the 1 Ray node(s) this job uses cannot import the ExGRPO recipe"
    ), unshipped
    assert unshipped.splitlines()[1].startswith("  - node "), unshipped  # the node, by address and id
    assert "exgrpo_probe_standin: ModuleNotFoundError" in unshipped, unshipped
    assert "docs/launch_scripts.md" in unshipped, unshipped
    assert out["True"] == "ok", out["True"]


def test_the_probe_covers_what_the_workers_load():
    assert {"exgrpo", "recipe.exgrpo.actor_loss", "recipe.exgrpo.reward", "recipe.exgrpo.dataset"} <= set(
        WORKER_MODULES
    )


# ------------------------------------------------------------------------- a job of `ray job submit`
def _ray_init_runtime_env(config) -> dict | None:
    """The runtime_env ``ray.init`` ends up with in a submitted job's driver: verl's ``run_ppo`` merges its defaults
    with ``ray_kwargs.ray_init.runtime_env``, then ``ray.init`` merges the job's with that, exactly as Ray does
    (None: Ray refuses, "Failed to merge the Job's runtime env")."""
    from ray._private.runtime_env.constants import RAY_JOB_CONFIG_JSON_ENV_VAR
    from ray.runtime_env.runtime_env import _merge_runtime_env
    from verl.trainer.constants_ppo import get_ppo_ray_runtime_env

    job = json.loads(os.environ[RAY_JOB_CONFIG_JSON_ENV_VAR])["runtime_env"]
    driver = OmegaConf.to_container(
        OmegaConf.merge(get_ppo_ray_runtime_env(config), config.ray_kwargs.ray_init.runtime_env), resolve=True
    )
    return _merge_runtime_env(job, driver, override=os.getenv("RAY_OVERRIDE_JOB_RUNTIME_ENV") == "1")


def _submitted_job(monkeypatch, runtime_env: dict) -> None:
    """The environment Ray's job supervisor gives the driver of ``ray job submit --runtime-env-json ...``."""
    from ray._private.runtime_env.constants import RAY_JOB_CONFIG_JSON_ENV_VAR

    monkeypatch.delenv(SHIP_CODE_ENV, raising=False)
    monkeypatch.delenv("RAY_OVERRIDE_JOB_RUNTIME_ENV", raising=False)
    monkeypatch.setenv(RAY_JOB_CONFIG_JSON_ENV_VAR, json.dumps({"runtime_env": runtime_env}))
    for var, value in (runtime_env.get("env_vars") or {}).items():
        monkeypatch.setenv(var, value)  # the job's variables are set in its driver too


def test_a_submitted_jobs_py_modules_and_excludes_are_merged_with_the_recipes(monkeypatch):
    from recipe.exgrpo.launch_checks.dry_run import compose_config
    from recipe.exgrpo.main_exgrpo import prepare_config

    job = {
        "py_modules": ["/shared/mylib"],
        "excludes": ["*.ckpt"],
        "env_vars": {"MY_FLAG": "1", "VERL_USE_EXTERNAL_MODULES": "mylib.hooks"},
    }
    _submitted_job(monkeypatch, job)
    config = compose_config(
        [
            "actor_rollout_ref.model.path=/m",
            "data.train_files=/t",
            "data.val_files=/v",
            "exgrpo.skip_grad_norm_above=500",  # the recipe adds its engine hook to VERL_USE_EXTERNAL_MODULES
            "+ray_kwargs.ray_init.runtime_env.env_vars.MY_FLAG=1",
        ]
    )
    prepare_config(config)
    merged = _ray_init_runtime_env(config)
    assert merged is not None, "ray.init would refuse the job's runtime_env"
    assert merged["py_modules"] == ["/shared/mylib", *package_dirs()]
    assert merged["excludes"] == ["*.ckpt", *UPLOAD_EXCLUDES]
    assert merged["env_vars"]["MY_FLAG"] == "1"
    assert merged["env_vars"]["VERL_USE_EXTERNAL_MODULES"].split(",") == [
        "mylib.hooks",
        "recipe.exgrpo.runtime.grad_norm_guard",
    ]


def test_a_key_both_set_differently_is_named_at_start_up(monkeypatch):
    from recipe.exgrpo.runtime.ray_job import JobRuntimeEnvError, merge_job_runtime_env

    _submitted_job(monkeypatch, {"working_dir": "/job/src", "env_vars": {"HF_HOME": "/job/hf"}})
    config = _config({"working_dir": "/mine", "env_vars": {"HF_HOME": "/mine/hf"}})
    with pytest.raises(JobRuntimeEnvError) as err:
        merge_job_runtime_env(config)
    text = str(err.value)
    assert "working_dir: the job's runtime_env" in text and "ray_kwargs.ray_init.runtime_env.working_dir" in text
    assert "env_vars.HF_HOME" in text and "keep one of the two" in text
    # a driver that was not submitted as a job: nothing to merge
    monkeypatch.delenv("RAY_JOB_CONFIG_JSON_ENV_VAR")
    assert merge_job_runtime_env(_config({"py_modules": ["/x"]})) == []


SUBMITTED_DRIVER = textwrap.dedent(
    """
    import json, sys
    sys.path.insert(0, sys.argv[1])      # the repository (PYTHONPATH is cleared)
    import ray
    from omegaconf import OmegaConf
    from verl.trainer.constants_ppo import get_ppo_ray_runtime_env
    from recipe.exgrpo.main_exgrpo import prepare_config
    from recipe.exgrpo.launch_checks.dry_run import compose_config

    config = compose_config(["actor_rollout_ref.model.path=/m", "data.train_files=/t", "data.val_files=/v"])
    prepare_config(config)
    # what verl's run_ppo hands to ray.init
    runtime_env = OmegaConf.to_container(
        OmegaConf.merge(get_ppo_ray_runtime_env(config), config.ray_kwargs.ray_init.runtime_env), resolve=True
    )
    ray.init(num_cpus=1, include_dashboard=False, _temp_dir=sys.argv[2], runtime_env=runtime_env,
             logging_level="ERROR", log_to_driver=False)

    @ray.remote(num_cpus=0)
    def where():
        import os, recipe.exgrpo.reward, exgrpo_job_lib
        return {"lib": exgrpo_job_lib.VALUE, "flag": os.environ.get("JOB_FLAG")}

    try:
        print("RESULT " + json.dumps(ray.get(where.remote(), timeout=240)))
    finally:
        ray.shutdown()
    """
)


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_ray_init_accepts_a_submitted_jobs_runtime_env_with_py_modules_and_excludes(tmp_path):
    """The real ``ray.init`` of a driver that ``ray job submit`` started (Ray's job supervisor passes the job's config
    in the environment): the job's own ``py_modules`` and ``excludes`` next to the recipe's."""
    from ray._private.runtime_env.constants import RAY_JOB_CONFIG_JSON_ENV_VAR

    from recipe.exgrpo.harness.procs import run_ray_command_in_new_session

    lib = tmp_path / "joblib" / "exgrpo_job_lib"
    lib.mkdir(parents=True)
    (lib / "__init__.py").write_text("VALUE = 7\n")
    run_dir = tmp_path / "elsewhere"
    run_dir.mkdir()
    (run_dir / "driver.py").write_text(SUBMITTED_DRIVER)
    job = {"py_modules": [str(lib)], "excludes": ["*.ckpt"], "env_vars": {"JOB_FLAG": "on"}}
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "RAY_ADDRESS", SHIP_CODE_ENV)}
    env.update({RAY_JOB_CONFIG_JSON_ENV_VAR: json.dumps({"runtime_env": job}), "JOB_FLAG": "on"})
    with tempfile.TemporaryDirectory(prefix="exgray-", dir="/tmp") as ray_tmp:
        result = run_ray_command_in_new_session(  # a node start that missed Ray's 30 s under load is retried
            [sys.executable, str(run_dir / "driver.py"), str(REPO), ray_tmp],
            env=env,
            timeout_s=360,
            log_path=tmp_path / "driver.log",
            cwd=run_dir,
        )
    log = result.log_tail(8000)
    assert result.returncode == 0, log
    line = next(x for x in log.splitlines() if x.startswith("RESULT "))
    assert json.loads(line[len("RESULT ") :]) == {"lib": 7, "flag": "on"}
    assert "merged (the job's entries first)" in log


# ------------------------------------------------------------------------- which nodes the probe asks
def _node(node_id: str, address: str, cpus: float, gpus: float, alive: bool = True) -> dict:
    resources = {"CPU": cpus, "memory": 1e9} if cpus else {"memory": 1e9}
    if gpus:
        resources["GPU"] = gpus
    return {"NodeID": node_id, "NodeManagerAddress": address, "Alive": alive, "Resources": resources}


#: A cluster the user started: a head that takes no work (ray start --head --num-cpus=0 --num-gpus=0) from an image
#: without the recipe's dependencies, two GPU nodes, a CPU-only node, and a node that died.
FAKE_CLUSTER = [
    _node("head" + "0" * 16, "10.0.0.1", cpus=0, gpus=0),
    _node("gpu1" + "1" * 16, "10.0.0.2", cpus=64, gpus=8),
    _node("gpu2" + "2" * 16, "10.0.0.3", cpus=64, gpus=8),
    _node("cpu3" + "3" * 16, "10.0.0.4", cpus=16, gpus=0),
    _node("dead" + "4" * 16, "10.0.0.5", cpus=64, gpus=8, alive=False),
]


class FakeRay:
    """Ray's calls the probe makes, over a fake cluster description: every task pinned to a node answers with that
    node's entry of ``answers`` (a missing node raises, as a node that cannot set up the job's runtime_env does)."""

    def __init__(self, nodes, answers):
        self._nodes, self.answers, self.pinned = nodes, answers, []
        util = types.ModuleType("ray.util")
        strategies = types.ModuleType("ray.util.scheduling_strategies")
        strategies.NodeAffinitySchedulingStrategy = lambda node_id, soft: (node_id, soft)
        util.scheduling_strategies = strategies
        self.modules = {"ray": self, "ray.util": util, "ray.util.scheduling_strategies": strategies}
        self.cloudpickle = types.SimpleNamespace(register_pickle_by_value=id, unregister_pickle_by_value=id)

    def nodes(self):
        return self._nodes

    def remote(self, **_):
        fake = self

        class Task:
            def __init__(self, fn):
                self.fn = fn

            def options(self, scheduling_strategy):
                node_id, soft = scheduling_strategy
                assert soft is False
                fake.pinned.append(node_id)
                return types.SimpleNamespace(remote=lambda modules: node_id)

        return Task

    def wait(self, refs, num_returns, timeout):
        return list(refs), []

    def get(self, ref):
        if ref not in self.answers:
            raise RuntimeError("RuntimeEnvSetupError: No module named 'verl'")
        return self.answers[ref]

    def cancel(self, ref, force):
        pass


def test_the_probe_asks_only_the_nodes_the_job_can_use_and_names_the_role_of_a_failing_one(monkeypatch, capsys):
    from recipe.exgrpo.runtime import ray_job

    ok = {"hostname": "h", "python": "/py", "missing": {}}
    answers = {FAKE_CLUSTER[1]["NodeID"]: ok, FAKE_CLUSTER[2]["NodeID"]: ok, FAKE_CLUSTER[3]["NodeID"]: ok}
    fake = FakeRay(FAKE_CLUSTER, answers)
    for name, module in fake.modules.items():
        monkeypatch.setitem(sys.modules, name, module)
    # the head takes no work (no CPU, no GPU), so nothing of the job runs there: not probed, said so
    ray_job.check_worker_imports(timeout_s=5)
    assert sorted(fake.pinned) == sorted(n["NodeID"] for n in FAKE_CLUSTER[1:4])
    out = capsys.readouterr().out
    assert "every Ray node of this job (3) imports the recipe" in out
    assert "10.0.0.1" in out and "not used by this job" in out
    # a CPU-only node that cannot import the recipe is part of the job (verl's workers run on every node with
    # CPUs): the error names it and why the job uses it
    del fake.answers[FAKE_CLUSTER[3]["NodeID"]]
    with pytest.raises(WorkerImportError) as err:
        ray_job.check_worker_imports(timeout_s=5)
    (line,) = [x for x in str(err.value).splitlines() if x.startswith("  - ")]
    assert "node 10.0.0.4" in line and "RuntimeEnvSetupError" in line
    assert "agent-loop and reward-loop workers" in line and "--num-cpus=0" in line


def test_the_nodes_of_a_job_are_those_with_cpus_or_the_pools_device():
    from recipe.exgrpo.runtime.ray_job import job_nodes

    used, outside = job_nodes(FAKE_CLUSTER)
    assert [n["NodeManagerAddress"] for n in used] == ["10.0.0.2", "10.0.0.3", "10.0.0.4"]
    assert [n["NodeManagerAddress"] for n in outside] == ["10.0.0.1"]  # the dead node is no node at all
