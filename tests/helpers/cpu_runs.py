"""The CPU backend's pieces as the tests build them: an asset spec small enough to build in seconds, and verl's
trainer config composed from a CPU run's overrides (no Ray, no model), the hf rollout server on the tiny model."""

from __future__ import annotations

from pathlib import Path

from data_preprocess.toy_arithmetic import Difficulty, QuestionFamily, ToyArithmeticConfig
from recipe.exgrpo.harness.assets import AssetSpec, WarmupSpec


def tiny_asset_spec() -> AssetSpec:
    """Assets of one difficulty level (two-digit sums), 4 training and 2 validation questions, a 6-step warm-up."""
    tiny = ToyArithmeticConfig(
        train_per_level=4, val_per_level=2, levels=(Difficulty("tiny", (QuestionFamily("+", 10, 99, 10, 99),)),)
    )
    return AssetSpec(
        warmup=WarmupSpec(steps=6, batch_size=16, warmup_steps=2, questions_per_level=40, eval_samples_per_question=2),
        data=tiny,
    )


def compose_ppo_trainer(overrides: list[str]):
    """verl's ``ppo_trainer`` config with ``overrides`` (a CPU run's, ``cpu_overrides``), as ``main_ppo`` composes
    it; the ``hydra.*`` settings (the run's own directories) are left out: they are not keys of the config."""
    import verl.trainer.main_ppo as main_ppo
    from hydra import compose, initialize_config_dir

    config_dir = str(Path(main_ppo.__file__).parent / "config")
    task_overrides = [o for o in overrides if not o.lstrip("+").startswith("hydra.")]
    with initialize_config_dir(config_dir=config_dir, version_base=None):
        return compose(config_name="ppo_trainer", overrides=task_overrides)


def hf_rollout_server(assets, prompt_length: int, response_length: int, **config):
    """The ``hf`` rollout server on the tiny model of ``assets``, its engine loaded (no Ray); ``config``: more
    fields of verl's ``RolloutConfig``."""
    from verl.workers.config import RolloutConfig

    from recipe.exgrpo.cpu.hf_rollout import HFRolloutServer

    rollout = RolloutConfig(
        name="hf",
        prompt_length=prompt_length,
        response_length=response_length,
        tensor_model_parallel_size=1,
        dtype="float32",
        **config,
    )
    model_config = {"path": str(assets.model_path), "override_config": {"attn_implementation": "sdpa"}}
    server = HFRolloutServer(config=rollout, model_config=model_config)
    server.init_engine()
    return server
