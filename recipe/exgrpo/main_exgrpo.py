"""Entry point of the ExGRPO recipe: ``python -m recipe.exgrpo.main_exgrpo [hydra overrides]``.

The config is verl's ``ppo_trainer`` plus one ``exgrpo:`` block (config/exgrpo_trainer.yaml). The block is
validated here, before Ray starts, so a wrong value stops the run at once with the key and allowed range; so are
the verl settings the recipe would otherwise accept and ignore (``algorithm.adv_estimator``, ``use_kl_loss``, ...:
``recipe/exgrpo/config_bridge.py``, docs/trainer.md). The Ray job carries the recipe's code to every worker and
checks, once Ray is up and before the trainer starts, that every node imports it (``recipe/exgrpo/ray_job.py``).
"""

from __future__ import annotations

import os
import socket
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


def prepare_config(config) -> None:
    """Fill the recipe's defaults (its reward and dataset), validate the ``exgrpo`` block, reject the verl settings
    the recipe would silently ignore (``config_bridge.UNSUPPORTED_VERL_SETTINGS``) and put what the workers need
    into the Ray job's ``runtime_env`` (the engine hook's variables, the recipe's code: ``ray_job.ship_code``)."""
    from recipe.exgrpo.config_bridge import check_startup_config
    from recipe.exgrpo.ray_job import ship_code

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
    from recipe.exgrpo.cpu_guard import check_device_config

    check_device_config(config)


def install_worker_env(config, skip_grad_norm_above: float | None) -> None:
    """Put the engine hook of ``exgrpo.skip_grad_norm_above`` into the Ray job's ``runtime_env`` (every worker).

    ``ray_kwargs.ray_init.runtime_env.env_vars`` reaches every Ray process of the job, on one node or many;
    values the user set there are kept, except that our module is appended to ``VERL_USE_EXTERNAL_MODULES``.
    """
    from recipe.exgrpo.engines import EXTERNAL_MODULES_ENV, worker_env

    env = worker_env(skip_grad_norm_above)
    if not env:
        return
    with open_dict(config):
        # (DictConfig.setdefault returns the detached default, so read and assign explicitly)
        if config.ray_kwargs.ray_init.get("runtime_env") is None:
            config.ray_kwargs.ray_init.runtime_env = {}
        runtime_env = config.ray_kwargs.ray_init.runtime_env
        if runtime_env.get("env_vars") is None:
            runtime_env.env_vars = {}
        user_modules = runtime_env.env_vars.get(EXTERNAL_MODULES_ENV)
        if user_modules:
            env.update(worker_env(skip_grad_norm_above, {EXTERNAL_MODULES_ENV: user_modules}))
        for key, value in env.items():
            runtime_env.env_vars[key] = value


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

    def run(self, config):
        from recipe.exgrpo.exgrpo_ray_trainer import RayExGRPOTrainer

        print(f"ExGRPOTaskRunner hostname: {socket.gethostname()}, PID: {os.getpid()}")
        pprint(OmegaConf.to_container(config, resolve=True))
        OmegaConf.resolve(config)
        trainer = build_trainer(self, config, RayExGRPOTrainer)
        trainer.init_workers()
        trainer.fit()


@hydra.main(config_path="config", config_name="exgrpo_trainer", version_base=None)
def main(config):
    auto_set_device(config)
    prepare_config(config)
    validate_config(config=config, use_reference_policy=need_reference_policy(config), use_critic=need_critic(config))
    from recipe.exgrpo.ray_job import CheckedTaskRunner

    # every node must import the recipe: checked once run_ppo has started Ray, before the task runner starts
    run_ppo(config, task_runner_class=CheckedTaskRunner(ExGRPOTaskRunner))


if __name__ == "__main__":
    main()
