"""Entry point of the ExGRPO recipe: ``python -m recipe.exgrpo.main_exgrpo [hydra overrides]``.

The config is verl's ``ppo_trainer`` plus one ``exgrpo:`` block (config/exgrpo_trainer.yaml). The block is
validated here, before Ray starts, so a wrong value stops the run at once with the key and allowed range; so are
the verl settings the recipe would otherwise accept and ignore (``algorithm.adv_estimator``, ``use_kl_loss``, ...:
``recipe/exgrpo/config_bridge.py``, docs/trainer.md). The Ray job carries the recipe's code to every worker and
checks, once Ray is up and before the trainer starts, that every node imports it (``recipe/exgrpo/runtime/ray_job.py``).
SIGTERM, SIGHUP or Ctrl-C stop the run's processes, its Ray cluster included, with one line
(``recipe/exgrpo/runtime/driver_stop.py``).
"""

from __future__ import annotations

import os
import socket
import sys
from pprint import pprint

import hydra
import ray
from omegaconf import OmegaConf, open_dict
from verl.trainer.main_ppo import run_ppo
from verl.trainer.main_ppo_v0 import BaseTaskRunner
from verl.trainer.ppo.utils import create_rl_dataset, create_rl_sampler, need_critic, need_reference_policy
from verl.utils.config import validate_config
from verl.utils.device import auto_set_device

#: the recipe's reward and dataset, loaded by module name (``pkg://``), so that a worker on any node finds them
#: in the code the job ships (a file path of the driver's checkout may not exist there)
RECIPE_REWARD = "pkg://recipe.exgrpo.reward"
RECIPE_DATASET = "pkg://recipe.exgrpo.dataset"


def prepare_config(config, run_token: str | None = None) -> None:
    """Fill the recipe's defaults (its reward and dataset), validate the ``exgrpo`` block, reject the verl settings
    the recipe would silently ignore (``config_bridge.UNSUPPORTED_VERL_SETTINGS``) and put what the workers need
    into the Ray job's ``runtime_env`` (the engine hook's variables, the recipe's code: ``ray_job.ship_code``; with
    ``run_token``, the stage watchdog's: :func:`install_stage_watch`), merged with a submitted job's own
    (``ray_job.merge_job_runtime_env``)."""
    from recipe.exgrpo.config_bridge import check_startup_config
    from recipe.exgrpo.runtime.ray_job import merge_job_runtime_env, ship_code

    with open_dict(config):
        # with a reward model and no reward function, verl's reward loop scores with the model: leave it so
        uses_reward_model = bool(config.reward.reward_model.get("enable", False))
        if not config.reward.custom_reward_function.get("path") and not uses_reward_model:
            config.reward.custom_reward_function.path = RECIPE_REWARD
            config.reward.custom_reward_function.name = "compute_score"
        if not config.data.custom_cls.get("path"):
            config.data.custom_cls.path = RECIPE_DATASET
            config.data.custom_cls.name = "ExGRPODataset"
    exgrpo = check_startup_config(config)  # raises naming every bad key, verl's and exgrpo's
    install_worker_env(config, exgrpo.skip_grad_norm_above)
    ship_code(config)
    if run_token:
        install_stage_watch(config, run_token)
    merge_job_runtime_env(config)  # a driver of `ray job submit` whose runtime_env sets py_modules, excludes, ...
    from recipe.exgrpo.cpu.guard import check_device_config

    check_device_config(config)


def install_worker_env(config, skip_grad_norm_above: float | None) -> None:
    """Put the engine hook of ``exgrpo.skip_grad_norm_above`` into the Ray job's ``runtime_env`` (every worker).

    ``ray_kwargs.ray_init.runtime_env.env_vars`` reaches every Ray process of the job, on one node or many;
    values the user set there are kept, except that our module is appended to ``VERL_USE_EXTERNAL_MODULES``.
    """
    from recipe.exgrpo.runtime.grad_norm_guard import EXTERNAL_MODULES_ENV, worker_env

    env = worker_env(skip_grad_norm_above)
    if not env:
        return
    with open_dict(config):
        env_vars = _runtime_env_vars(config)
        user_modules = env_vars.get(EXTERNAL_MODULES_ENV)
        if user_modules:
            env.update(worker_env(skip_grad_norm_above, {EXTERNAL_MODULES_ENV: user_modules}))
        for key, value in env.items():
            env_vars[key] = value


def _runtime_env_vars(config):
    """``ray_kwargs.ray_init.runtime_env.env_vars``, created when missing (call inside ``open_dict``)."""
    # (DictConfig.setdefault returns the detached default, so read and assign explicitly)
    if config.ray_kwargs.ray_init.get("runtime_env") is None:
        config.ray_kwargs.ray_init.runtime_env = {}
    runtime_env = config.ray_kwargs.ray_init.runtime_env
    if runtime_env.get("env_vars") is None:
        runtime_env.env_vars = {}
    return runtime_env.env_vars


def install_stage_watch(config, run_token: str) -> None:
    """With the stage deadlines on (``stage_deadlines.enable``): the run's token and the stack-dump module
    (``recipe/exgrpo/runtime/stacks.py``, appended to ``VERL_USE_EXTERNAL_MODULES``) in every Ray worker's
    environment, so the watchdog can dump the stacks of every process of the run and find them all
    (recipe/exgrpo/runtime/stage_deadlines.py)."""
    from recipe.exgrpo.runtime import stacks
    from recipe.exgrpo.runtime.grad_norm_guard import EXTERNAL_MODULES_ENV
    from recipe.exgrpo.runtime.stage_deadlines import deadlines_from_config

    if not deadlines_from_config(config).enable:
        return
    with open_dict(config):
        env_vars = _runtime_env_vars(config)
        current = env_vars.get(EXTERNAL_MODULES_ENV) or os.environ.get(EXTERNAL_MODULES_ENV, "")
        modules = [m for m in str(current).split(",") if m and m != stacks.MODULE]
        env_vars[EXTERNAL_MODULES_ENV] = ",".join([*modules, stacks.MODULE])
        env_vars[stacks.TOKEN_ENV] = run_token


def new_run_token() -> str:
    """A token unique to this run (its processes carry it in their environment)."""
    import uuid

    return f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:12]}"


def build_trainer(runner: BaseTaskRunner, config, trainer_cls):
    """``trainer_cls`` built as verl's task runner builds its trainer: worker roles and resource pools on
    ``runner``, verl's config check, tokenizer, datasets and sampler. ``config`` must be resolved; the workers are
    not started (``trainer.init_workers()``)."""
    from verl.utils.config import omega_conf_to_dataclass
    from verl.utils.dataset.rl_dataset import collate_fn
    from verl.workers.config import HFModelConfig

    _, ray_worker_group_cls = runner.add_actor_rollout_worker(config)
    runner.add_critic_worker(config)
    runner.add_reward_model_resource_pool(config)
    runner.add_teacher_model_resource_pool(config)
    validate_config(config=config, use_reference_policy=need_reference_policy(config), use_critic=need_critic(config))

    model_config: HFModelConfig = omega_conf_to_dataclass(config.actor_rollout_ref.model)
    tokenizer, processor = model_config.tokenizer, model_config.processor
    resource_pool_manager = runner.init_resource_pool_mgr(config)

    def dataset(split: str):
        return create_rl_dataset(
            config.data[f"{split}_files"],
            config.data,
            tokenizer,
            processor,
            is_train=split == "train",
            max_samples=config.data.get(f"{split}_max_samples", -1),
        )

    train_dataset = dataset("train")
    return trainer_cls(
        config=config,
        tokenizer=tokenizer,
        processor=processor,
        role_worker_mapping=runner.role_worker_mapping,
        resource_pool_manager=resource_pool_manager,
        ray_worker_group_cls=ray_worker_group_cls,
        train_dataset=train_dataset,
        val_dataset=dataset("val"),
        collate_fn=collate_fn,
        train_sampler=create_rl_sampler(config.data, train_dataset),
    )


@ray.remote
class ExGRPOTaskRunner(BaseTaskRunner):
    """verl's legacy task runner, building a ``RayExGRPOTrainer`` on ``ExGRPODataset``."""

    def run(self, config, driver: dict | None = None, run_token: str | None = None):
        """Build and train the trainer under the stage watchdog (``stage_deadlines.StageSupervisor``): a stage
        that passes its deadline stops the run with ``StageDeadlineError``. ``driver``, ``run_token``: from the
        driver (its node and pid; the token its processes carry), for the stacks and the stop."""
        from recipe.exgrpo.legacy.trainer import RayExGRPOTrainer
        from recipe.exgrpo.runtime.stage_deadlines import StageSupervisor, deadlines_from_config

        print(f"ExGRPOTaskRunner hostname: {socket.gethostname()}, PID: {os.getpid()}")
        pprint(OmegaConf.to_container(config, resolve=True))
        OmegaConf.resolve(config)
        supervisor = StageSupervisor(
            deadlines_from_config(config), config.trainer.default_local_dir, run_token=run_token, driver=driver
        )

        def train():
            trainer = build_trainer(self, config, RayExGRPOTrainer)
            trainer.stage_clock = supervisor.clock
            trainer.init_workers()
            trainer.fit()

        supervisor.run(train)


@ray.remote
class ExGRPOTaskRunnerV1:
    """verl's v1 task runner (``TaskRunnerV1``: TransferQueue, the trainer, the agent loop over TransferQueue),
    building an ``ExGRPOTrainerV1`` (``trainer.use_v1=true``, the sync mode), an ``ExGRPOTrainerV1ColocateAsync``
    (``trainer.v1.trainer_mode=colocate_async``) or an ``ExGRPOTrainerV1SeparateAsync`` (``separate_async``) under the
    stage watchdog."""

    def run(self, config, driver: dict | None = None, run_token: str | None = None):
        import transfer_queue as tq
        from verl.trainer.ppo.v1 import AgentLoopManagerTQ

        from recipe.exgrpo.runtime.stage_deadlines import StageSupervisor, deadlines_from_config
        from recipe.exgrpo.v1.async_trainer import ExGRPOTrainerV1ColocateAsync, ExGRPOTrainerV1SeparateAsync
        from recipe.exgrpo.v1.trainer import ExGRPOTrainerV1

        print(f"ExGRPOTaskRunnerV1 hostname: {socket.gethostname()}, PID: {os.getpid()}")
        with open_dict(config):
            config.transfer_queue.enable = True
        pprint(OmegaConf.to_container(config, resolve=True))
        OmegaConf.resolve(config)
        supervisor = StageSupervisor(
            deadlines_from_config(config), config.trainer.default_local_dir, run_token=run_token, driver=driver
        )
        tq.init(config.transfer_queue)

        def train():
            trainer_cls = {
                "sync": ExGRPOTrainerV1,
                "colocate_async": ExGRPOTrainerV1ColocateAsync,
                "separate_async": ExGRPOTrainerV1SeparateAsync,
            }[str(config.trainer.v1.trainer_mode)]
            trainer = trainer_cls(config=config)
            trainer.stage_clock = supervisor.clock
            trainer.init()
            manager = AgentLoopManagerTQ.create(
                config=config,
                llm_client=trainer.get_llm_client(),
                teacher_client=trainer.get_teacher_client(),
                reward_loop_worker_handles=trainer.get_reward_handles(),
            )
            try:
                trainer.fit(manager)
            finally:
                tracking = getattr(trainer, "logger", None)
                if tracking is not None:
                    tracking.finish()  # flush the file/TensorBoard/W&B backends

        try:
            supervisor.run(train)
        finally:
            tq.close()


def run_stage_watched(config, run_token: str) -> None:
    """verl's ``run_ppo`` with the recipe's task runner; a ``StageDeadlineError`` of the task runner ends the run:
    Ray is shut down, what is left of the run on this node is stopped, the step's incomplete checkpoint removed
    (again, now that nothing writes to it), and the driver exits 1 with the error's message."""
    from recipe.exgrpo.runtime import driver_stop, stacks
    from recipe.exgrpo.runtime.ray_job import CheckedTaskRunner, check_worker_imports, driver_info
    from recipe.exgrpo.runtime.stage_deadlines import (
        StageDeadlineError,
        deadlines_from_config,
        remove_partial_checkpoint,
    )

    watched = deadlines_from_config(config).enable
    if watched:
        stacks.register(run_token)  # the driver's own stacks, dumped with the workers' at a deadline

    # every node must import the recipe: checked once run_ppo has started Ray, before the task runner starts
    def once_ray_is_up() -> None:
        driver_stop.install(run_token)  # again: ray.init replaced the SIGTERM handler with its own
        check_worker_imports()

    runner_cls = ExGRPOTaskRunnerV1 if OmegaConf.select(config, "trainer.use_v1", default=False) else ExGRPOTaskRunner
    runner = CheckedTaskRunner(
        runner_cls,
        check=once_ray_is_up,
        run_kwargs=lambda: {"driver": driver_info(), "run_token": run_token if watched else None},
    )
    try:
        run_ppo(config, task_runner_class=runner)
    except Exception as e:
        cause = getattr(e, "cause", e)  # Ray's RayTaskError carries the task runner's exception as its cause
        if not isinstance(cause, StageDeadlineError):
            raise
        ray.shutdown()
        stopped = stacks.terminate_local(run_token, [os.getpid()])
        remove_partial_checkpoint(cause.checkpoint_dir, cause.step)
        if stopped:
            print(f"[exgrpo] stopped {len(stopped)} leftover process(es) of the run on the driver's node", flush=True)
        print(f"StageDeadlineError: {cause}", file=sys.stderr, flush=True)
        raise SystemExit(1) from None
    finally:
        stacks.forget(run_token)


@hydra.main(config_path="config", config_name="exgrpo_trainer", version_base=None)
def main(config):
    from recipe.exgrpo.runtime import driver_stop

    run_token = new_run_token()
    driver_stop.install(run_token)  # SIGTERM, SIGHUP, Ctrl-C: the whole run stops, with one line
    auto_set_device(config)
    prepare_config(config, run_token)
    validate_config(config=config, use_reference_policy=need_reference_policy(config), use_critic=need_critic(config))
    run_stage_watched(config, run_token)


if __name__ == "__main__":
    main()
