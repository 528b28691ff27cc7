"""The stage deadlines without verl's workers (recipe/exgrpo/runtime/stage_deadlines.py,
recipe/exgrpo/runtime/stacks.py): the config block and its errors, the watchdog that fires from outside a stage
blocked in C, the stacks of the run's other processes dumped from their signal handler, the run's processes found by
its token and stopped, the partial checkpoint removed and the complete one kept, the error through Ray's exception
wrapper, and the driver's exit.
The same pieces in a real CPU run, with each fault injected: tests/e2e/test_stage_deadlines_cpu.py."""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from recipe.exgrpo.runtime import stacks
from recipe.exgrpo.runtime.stage_deadlines import (
    DEFAULT_DEADLINES_S,
    DEFAULT_FIRST_STEP_FACTOR,
    StageClock,
    StageDeadlineError,
    StageDeadlines,
    StageSupervisor,
    deadline_problems,
    deadlines_from_config,
    remove_partial_checkpoint,
)

REPO = Path(__file__).resolve().parents[2]


def test_the_defaults_come_from_the_yaml_and_fit_a_7b_step():
    from recipe.exgrpo.launch_checks.dry_run import compose_config

    config = compose_config(["actor_rollout_ref.model.path=/m", "data.train_files=/t", "data.val_files=/v"])
    deadlines = deadlines_from_config(config)
    assert deadlines.enable and dict(deadlines.seconds) == DEFAULT_DEADLINES_S
    assert OmegaConf.to_container(config.stage_deadlines) == {
        "enable": True,
        "first_step_factor": int(DEFAULT_FIRST_STEP_FACTOR),
        **{f"{k}_s": int(v) for k, v in DEFAULT_DEADLINES_S.items()},
    }
    assert deadlines.first_step_factor == DEFAULT_FIRST_STEP_FACTOR == 2
    # minutes-long 7B stages: nothing under half an hour, the ~91 GB save and validation get two hours
    assert min(DEFAULT_DEADLINES_S.values()) >= 1800 and DEFAULT_DEADLINES_S["save_checkpoint"] >= 7200
    assert deadlines.describe().startswith("stage_deadlines: generate=3600s reward=1800s")


def test_every_stage_of_a_step_runs_inside_the_clock():
    """Each stage with a deadline is entered through ``stage_clock.stage(<name>, step)`` in the trainer, and no
    entry names a stage without one (the e2e runs inject a hang at four of the seven stages: the wiring of the
    other three is checked here only)."""
    import ast

    from recipe.exgrpo.runtime.stage_deadlines import STAGES

    for adapter in ("legacy", "v1"):
        tree = ast.parse((REPO / "recipe" / "exgrpo" / adapter / "trainer.py").read_text())
        entered = []
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr == "stage"
                and isinstance(node.func.value, ast.Attribute)
                and node.func.value.attr == "stage_clock"
            ):
                first = node.args[0]
                assert isinstance(first, ast.Constant) and isinstance(first.value, str), ast.unparse(node)
                entered.append(first.value)
        assert set(entered) == set(STAGES), (
            f"{adapter}: stages entered {sorted(set(entered))}, deadlines {sorted(STAGES)}"
        )


def test_every_bad_key_is_named():
    problems = deadline_problems(
        {
            "generate_s": -1,
            "reward_s": "soon",
            "update": 60,
            "weight_sync_s": True,
            "enable": "yes",
            "validate_s": None,
            "first_step_factor": 0.5,
        }
    )
    text = "\n".join(problems)
    assert len(problems) == 6, problems
    assert "stage_deadlines.first_step_factor must be a number >= 1" in text and "got 0.5 (default 2)" in text
    assert "stage_deadlines.generate_s must be a number of seconds > 0, or null for no deadline, got -1" in text
    assert "stage_deadlines.reward_s must be a number" in text and "stage_deadlines.weight_sync_s must be" in text
    assert "stage_deadlines.update is not a key of stage_deadlines (did you mean stage_deadlines.update_s?)" in text
    assert "stage_deadlines.enable must be true or false" in text
    assert deadline_problems({"validate_s": None, "update_s": 30, "first_step_factor": 1}) == []
    for bad in (None, True, float("inf"), "2"):
        assert deadline_problems({"first_step_factor": bad}), bad


def test_start_up_and_the_dry_run_refuse_a_bad_deadline():
    from recipe.exgrpo.config_bridge import StartupConfigError, check_startup_config
    from recipe.exgrpo.launch_checks.dry_run import DryRunError, compose_config, dry_run
    from tests.helpers.launch_scripts import TRAIN_DIR, printed_launches

    base = ["actor_rollout_ref.model.path=/m", "data.train_files=/t", "data.val_files=/v"]
    config = compose_config(base + ["stage_deadlines.update_s=0"])
    with pytest.raises(StartupConfigError, match="stage_deadlines.update_s must be a number of seconds > 0"):
        check_startup_config(config)
    (launch,) = printed_launches(TRAIN_DIR / "exgrpo_qwen2.5_math_7b.sh")
    with pytest.raises(DryRunError, match="stage_deadlines.update_s"):
        dry_run(launch + ["stage_deadlines.update_s=0"])
    report = dry_run(launch + ["stage_deadlines.save_checkpoint_s=null"])
    assert "stage_deadlines: generate=3600s" in report.summary() and "save_checkpoint=none" in report.summary()


def test_the_clock_knows_what_runs_and_what_is_late():
    clock = StageClock(StageDeadlines(seconds={**DEFAULT_DEADLINES_S, "update": 0.2, "validate": None}))
    with clock.stage("weight_sync", 0):  # the process starts at step 0: steps 0 and 1 are its first step's
        pass
    with clock.stage("update", 3) as entry:
        assert clock.overdue(entry.started + 0.1) is None
        assert clock.overdue(entry.started + 0.3) == entry and entry.limit_s == 0.2
        with clock.stage("validate", 3) as no_limit:
            assert clock.overdue(no_limit.started + 1e6).name == "update"
    assert clock.running() == [] and clock.overdue() is None
    assert not entry.first_step and entry.basis() == "stage_deadlines.update_s"
    off = StageClock(StageDeadlines(enable=False))
    with off.stage("update", 1) as entry:
        assert entry.limit_s is None and off.overdue(entry.started + 1e9) is None


@pytest.mark.parametrize("start", [0, 7])
def test_the_first_step_runs_under_the_factor(start):
    """The steps up to the process's first training step (the start step, a fresh 0 or the resumed one, then the
    next) get ``first_step_factor`` times each deadline; the step after them the deadline itself."""
    deadlines = StageDeadlines(
        seconds={**DEFAULT_DEADLINES_S, "generate": 30.0, "weight_sync": 10.0}, first_step_factor=6
    )
    clock = StageClock(deadlines)
    with clock.stage("weight_sync", start) as sync:
        assert sync.first_step and sync.limit_s == 60.0
        assert sync.basis() == "stage_deadlines.weight_sync_s x stage_deadlines.first_step_factor"
    with clock.stage("generate", start + 1) as first:
        assert first.first_step and first.limit_s == 180.0
        assert clock.overdue(first.started + 31) is None and clock.overdue(first.started + 181) == first
    with clock.stage("generate", start + 2) as second:
        assert not second.first_step and second.limit_s == 30.0 and clock.overdue(second.started + 31) == second
    assert deadlines.limit("validate", first_step=True) == 6 * DEFAULT_DEADLINES_S["validate"]
    assert StageDeadlines(seconds={**DEFAULT_DEADLINES_S, "update": None}).limit("update", first_step=True) is None
    assert "(first step x6)" in deadlines.describe()
    error = StageDeadlineError("generate", 1, 180.0, 181.0, None, "/ckpt", None, None, first.basis())
    assert "deadline of 180 s (stage_deadlines.generate_s x stage_deadlines.first_step_factor;" in str(error)
    assert pickle.loads(pickle.dumps(error)).basis == error.basis


def test_the_factor_comes_from_the_config():
    from recipe.exgrpo.launch_checks.dry_run import compose_config

    base = ["actor_rollout_ref.model.path=/m", "data.train_files=/t", "data.val_files=/v"]
    assert deadlines_from_config(compose_config(base + ["stage_deadlines.first_step_factor=5"])).first_step_factor == 5
    with pytest.raises(ValueError, match="stage_deadlines.first_step_factor must be a number >= 1"):
        deadlines_from_config(compose_config(base + ["stage_deadlines.first_step_factor=0"]))


def _checkpoints(root: Path) -> Path:
    """A run directory with a complete checkpoint at step 1 and the incomplete one of step 2 (pool, no tracker)."""
    (root / "global_step_1" / "actor").mkdir(parents=True)
    (root / "global_step_1" / "exgrpo").mkdir()
    (root / "global_step_2" / "exgrpo").mkdir(parents=True)
    (root / "latest_checkpointed_iteration.txt").write_text("1")
    return root


def test_only_an_incomplete_checkpoint_is_removed(tmp_path):
    root = _checkpoints(tmp_path)
    assert remove_partial_checkpoint(str(root), 1) is None and (root / "global_step_1").is_dir()
    assert remove_partial_checkpoint(str(root), 2) == str(root / "global_step_2")
    assert not (root / "global_step_2").exists() and remove_partial_checkpoint(str(root), 3) is None


REGISTERED = textwrap.dedent(
    """
    import subprocess, sys, time
    sys.path.insert(0, sys.argv[1])
    import recipe.exgrpo.runtime.stacks  # registers this process (the token is in its environment)
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])  # imports nothing
    print("READY", child.pid, flush=True)

    def stuck_in_a_c_call():
        time.sleep(600)

    stuck_in_a_c_call()
    """
)


def _registered_process(tmp_path: Path, token: str) -> tuple[subprocess.Popen, int]:
    script = tmp_path / "worker.py"
    script.write_text(REGISTERED)
    env = {**os.environ, stacks.TOKEN_ENV: token}
    proc = subprocess.Popen(
        [sys.executable, str(script), str(REPO)], env=env, stdout=subprocess.PIPE, text=True, start_new_session=True
    )
    line = proc.stdout.readline().split()
    assert line[0] == "READY", line
    return proc, int(line[1])


def test_a_stage_blocked_in_c_is_stopped_from_outside_with_the_stacks_of_the_run(tmp_path):
    token = f"test-{os.getpid()}-{time.time_ns()}"
    worker, child = _registered_process(tmp_path, token)
    root = _checkpoints(tmp_path / "ckpt")
    deadlines = StageDeadlines(seconds={**DEFAULT_DEADLINES_S, "save_checkpoint": 1.0})
    supervisor = StageSupervisor(deadlines, str(root), run_token=token, poll_s=0.2)

    def train():
        with supervisor.clock.stage("weight_sync", 0):  # the start, then steps 1 and 2
            pass
        with supervisor.clock.stage("save_checkpoint", 2):
            time.sleep(600)  # blocked in C, as a Ray get or a collective would be

    start = time.monotonic()
    try:
        with pytest.raises(StageDeadlineError) as err:
            supervisor.run(train)
        assert time.monotonic() - start < 60
        e = err.value
        assert (e.stage, e.step, e.limit_s) == ("save_checkpoint", 2, 1.0)
        assert str(e).startswith("stage 'save_checkpoint' of step 2 ran past its deadline of 1 s")
        assert "stage_deadlines.save_checkpoint_s" in str(e) and "trainer.resume_mode=auto" in str(e)
        # the incomplete checkpoint of the step is gone, the complete one before it stays
        assert e.removed == str(root / "global_step_2") and not (root / "global_step_2").exists()
        assert (root / "global_step_1").is_dir()
        # the stacks: the stage's own (the trainer's thread of this process) and the other process of the run's,
        # dumped by its signal handler while it sat in a C call
        text = Path(e.stacks_file).read_text()
        assert e.stacks_file == str(root / "stage_deadline_step2_save_checkpoint.txt")
        own = text[: text.find("=== process pid")]  # the header and this process's threads
        assert "Thread exgrpo-trainer" in own and "in train" in own and "time.sleep(600)" in own, own[-6000:]
        assert f"=== process pid {worker.pid}" in text and "stuck_in_a_c_call" in text
        # every process of the run (the registered one and the child that imported nothing) was stopped
        assert worker.wait(timeout=30) is not None
        assert stacks.run_pids(token) == []
        assert _zombie(child)  # gone (or only waiting to be reaped)
    finally:
        for pid in (worker.pid, child):
            try:
                os.kill(pid, 9)
            except OSError:
                pass
        stacks.forget(token)


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[-1].split()[0] == "Z"
    except OSError:
        return True


def test_without_deadlines_the_trainer_runs_in_the_callers_thread(tmp_path):
    import threading

    supervisor = StageSupervisor(StageDeadlines(enable=False), str(tmp_path))
    assert supervisor.run(lambda: threading.current_thread().name) == threading.current_thread().name
    on = StageSupervisor(StageDeadlines(), str(tmp_path), poll_s=0.05)
    assert on.run(lambda: threading.current_thread().name) == "exgrpo-trainer"
    with pytest.raises(KeyError, match="boom"):  # the trainer's own error comes through unchanged
        on.run(lambda: {}["boom"])


def test_the_error_crosses_ray_and_the_driver_exits_with_it(tmp_path, monkeypatch, capsys):
    from ray.exceptions import RayTaskError

    import recipe.exgrpo.main_exgrpo as main_exgrpo

    root = _checkpoints(tmp_path / "ckpt")
    error = StageDeadlineError("generate", 2, 60.0, 61.0, "/run/stacks.txt", str(root), None, "tok")
    copy = pickle.loads(pickle.dumps(error))
    assert (copy.stage, copy.step, str(copy)) == ("generate", 2, str(error))
    # what ray.get raises in the driver: Ray's error, also an instance of the task runner's
    raised = RayTaskError("ExGRPOTaskRunner.run", "Traceback ...", copy).as_instanceof_cause()
    assert isinstance(raised, StageDeadlineError) and raised.cause is copy

    def run_ppo(config, task_runner_class):
        raise raised

    monkeypatch.setattr(main_exgrpo, "run_ppo", run_ppo)
    config = OmegaConf.create({"stage_deadlines": {"enable": True}})
    with pytest.raises(SystemExit) as exit_:
        main_exgrpo.run_stage_watched(config, f"test-{time.time_ns()}")
    assert exit_.value.code == 1
    err = capsys.readouterr().err
    assert "StageDeadlineError: stage 'generate' of step 2 ran past its deadline of 60 s" in err
    assert "Traceback" not in err
    assert not (root / "global_step_2").exists() and (root / "global_step_1").is_dir()  # removed by the driver too
    # any other error of the run is the run's, unchanged
    monkeypatch.setattr(main_exgrpo, "run_ppo", lambda config, task_runner_class: {}["other"])
    with pytest.raises(KeyError):
        main_exgrpo.run_stage_watched(config, f"test-{time.time_ns()}")


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_the_node_tasks_dump_and_stop_the_runs_processes_on_a_node(tmp_path):
    """What the watchdog runs on each other node of a job (on CPU every run has one node, the watchdog's own, so
    these tasks run only here): one task pinned to the node dumps the stacks of the run's processes there, another
    stops them."""
    import ray

    from recipe.exgrpo.harness.procs import ray_init_in_process
    from recipe.exgrpo.runtime.stage_deadlines import _node_stacks, _node_terminate, _on_nodes

    token = f"test-{os.getpid()}-{time.time_ns()}"
    worker, child = _registered_process(tmp_path, token)
    ray_init_in_process(num_cpus=1, include_dashboard=False, logging_level="ERROR", log_to_driver=False)
    try:
        node = ray.get_runtime_context().get_node_id()
        (result,), silent = _on_nodes(_node_stacks, [node], (token, [], 5.0), 240)
        assert silent == []
        (dump,) = [d for d in result["dumps"] if d["pid"] == worker.pid]
        assert "stuck_in_a_c_call" in dump["text"]
        (result,), silent = _on_nodes(_node_terminate, [node], (token, [], 5.0), 240)
        assert silent == [] and {worker.pid, child} <= set(result["stopped"])
        assert worker.wait(timeout=30) is not None and _zombie(child)
        # a node that is not there is named (not "f" * 56: all ones is Ray's nil id, refused before the task runs)
        assert _on_nodes(_node_stacks, ["ab" * 28], (token, [], 1.0), 5)[1]
    finally:
        ray.shutdown()
        for pid in (worker.pid, child):
            try:
                os.kill(pid, 9)
            except OSError:
                pass
        stacks.forget(token)


def test_the_launch_puts_the_token_and_the_dump_module_in_every_workers_environment(monkeypatch):
    from recipe.exgrpo.launch_checks.dry_run import compose_config
    from recipe.exgrpo.main_exgrpo import prepare_config

    monkeypatch.setenv("VERL_USE_EXTERNAL_MODULES", "recipe.exgrpo.cpu.plugin")
    base = ["actor_rollout_ref.model.path=/m", "data.train_files=/t", "data.val_files=/v"]
    config = compose_config(base)
    prepare_config(config, run_token="run-1")
    env_vars = config.ray_kwargs.ray_init.runtime_env.env_vars
    assert env_vars[stacks.TOKEN_ENV] == "run-1"
    assert env_vars["VERL_USE_EXTERNAL_MODULES"] == "recipe.exgrpo.cpu.plugin,recipe.exgrpo.runtime.stacks"
    # the dry run passes no token: its config stays the same from one run to the next
    dry = compose_config(base)
    prepare_config(dry)
    assert stacks.TOKEN_ENV not in (dry.ray_kwargs.ray_init.get("runtime_env") or {}).get("env_vars", {})
    # deadlines off: nothing is installed, the trainer runs as it always did
    off = compose_config(base + ["stage_deadlines.enable=false"])
    prepare_config(off, run_token="run-2")
    assert stacks.TOKEN_ENV not in (off.ray_kwargs.ray_init.get("runtime_env") or {}).get("env_vars", {})
